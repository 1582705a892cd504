"""Transactions against plain sends, side by side in one run on one cluster.

Kafka's model: transactions of `--messages` messages each (100 B by default) spanning 1
or 3 groups (`--spans`; the messages split evenly over one queue of each group, one
`tx.send_batch` per group, then `commit`), run back to back by each of `--producers`
transactional producers at once. Reported per case: committed transactions/s,
messages/s, and commit latency (the `commit()` call: every send acknowledged already,
then the coordinator's decision and the markers, or only the decision with
`--no-wait-visible`) p50/p99, with the whole transaction's
latency beside it; then (`--half-load`, on by default) the same case again with the
transactions started at half the rate it reached, for the commit latency at half load. Next to each, the same rounds made of plain `send_batch` calls (the
same messages to the same queues, the calls of a round concurrent): rounds/s, messages/s
and round latency. `vs_batch` is the transactional message rate over the plain one.

RocketMQ's model: `--halves` messages sent with `send_in_transaction` (the producer
commits each right after storing it: two requests per message) and the same number of
plain `send`s, `--concurrency` in flight each; then as many half messages whose local
transaction says "unknown", decided by the broker's check-back (the local cluster's
nodes check after `--check-ms`), timed until a consumer has read every one.
`added_us_per_msg` is what a half message costs beyond a plain send, per message at
that concurrency; `one_at_a_time_ms` times the steps alone (prepare, commit, and a plain
send beside them) for up to 50 messages sent one after the other.

By default the benchmark starts its own cluster on loopback (three node processes, three
groups of three replicas, `fsync=always`); `--namesrv` points it at a running one
(whose check-back timing is its own). Output: one JSON object (`--json`) or tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio

from .common import (
    add_cluster_args,
    emit,
    freeze_gc,
    latency_ms,
    positive_int,
    progress,
    run_id,
    target_cluster,
)

__all__ = ["build_parser", "drive", "main", "run_txn"]

NAME = "txn"
SEQUENTIAL = 50  # half messages timed one at a time, step by step


class Rounds:
    """`count` rounds shared by any number of tasks, each running `take` until none is
    left: every round is taken once, timed (`latencies`, successes only), and one that
    fails is counted (`errors`) and reported while the run goes on."""

    def __init__(self, count: int, what: str) -> None:
        self.count = count
        self.left = count
        self.what = what
        self.errors = 0
        self.latencies: list[float] = []

    async def take(self, step: Callable[[int], Awaitable[object]],
                   pace: Callable[[int], Awaitable[None]] | None = None) -> None:
        """Run `step(k)` for the next round k until none is left; `pace(k)`, if given,
        is awaited first, outside the timing (a paced run's wait for its start)."""
        while self.left > 0:
            self.left -= 1
            k = self.count - self.left - 1
            if pace is not None:
                await pace(k)
            t0 = time.perf_counter()
            try:
                await step(k)
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                self.errors += 1
                progress(NAME, f"{self.what} failed: {exc!r}")
                continue
            self.latencies.append(time.perf_counter() - t0)

    async def run(self, workers: int, step: Callable[[int], Awaitable[object]]) -> float:
        """`workers` tasks taking the rounds side by side; the seconds they took."""
        t_start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(workers):
                tg.start_soon(self.take, step)
        return time.perf_counter() - t_start


def _split(messages: int, span: int) -> list[int]:
    """`messages` over `span` queues as evenly as can be (10 over 3: 4, 3, 3)."""
    return [messages // span + (1 if i < messages % span else 0) for i in range(span)]


async def _txn_case(namesrv: str, topic: str, messages: int, span: int, rounds: int,
                    producers: int, payload: bytes, tag: str,
                    rate: float = 0.0, wait_visible: bool = True) -> dict[str, Any]:
    """`rounds` transactions in all, shared by `producers` transactional producers: as
    fast as they go, or started at `rate` transactions/s (all producers together)."""
    from raftmq.client import Producer

    sizes = _split(messages, span)
    commit_s: list[float] = []
    rounds_ = Rounds(rounds, "transaction")
    ready = anyio.Event()
    warm = [0]
    t_start = 0.0

    async def start(k: int) -> None:  # transaction k starts at t_start + k / rate
        if rate:
            await anyio.sleep(max(0.0, t_start + k / rate - time.perf_counter()))

    async def one(i: int) -> None:
        nonlocal t_start
        async with Producer(namesrv, transactional_id=f"bench-{tag}-{messages}-{span}-{i}"
                            f"-{int(rate)}", send_timeout=10.0) as p:
            async with p.transaction() as tx:  # warm-up: registers the id, learns routes
                for q, n in enumerate(sizes):
                    await tx.send_batch(topic, [payload] * n, queue=q)
            warm[0] += 1
            if warm[0] == producers:  # the timed section starts once all are warm
                t_start = time.perf_counter()
                ready.set()
            await ready.wait()

            async def transaction(_k: int) -> None:
                tx = await p.begin()
                async with anyio.create_task_group() as tg:
                    for q, n in enumerate(sizes):
                        tg.start_soon(partial(tx.send_batch, topic, [payload] * n, queue=q))
                t1 = time.perf_counter()
                await tx.commit(wait_visible=wait_visible)
                commit_s.append(time.perf_counter() - t1)

            await rounds_.take(transaction, pace=start)

    async with anyio.create_task_group() as tg:
        for i in range(producers):
            tg.start_soon(one, i)
    elapsed = time.perf_counter() - t_start
    done = len(rounds_.latencies)
    return {
        **({"rate_txn_per_s": rate} if rate else {}),
        "transactions": done,
        "errors": rounds_.errors,
        "txn_per_s": round(done / elapsed, 1) if elapsed else None,
        "msgs_per_s": round(done * messages / elapsed, 1) if elapsed else None,
        "commit_latency_ms": latency_ms(commit_s, ("p50", "p99", "max")),
        "txn_latency_ms": latency_ms(rounds_.latencies, ("p50", "p99", "max")),
    }


async def _batch_case(namesrv: str, topic: str, messages: int, span: int, rounds: int,
                      producers: int, payload: bytes) -> dict[str, Any]:
    """The same rounds as plain `send_batch` calls, `producers` rounds at a time."""
    from raftmq.client import Producer

    sizes = _split(messages, span)
    rounds_ = Rounds(rounds, "send_batch")

    async with Producer(namesrv, idempotent=True, send_timeout=10.0,
                        max_pending=100_000) as p:
        for q, n in enumerate(sizes):  # warm-up: routes and connections
            await p.send_batch(topic, [payload] * n, queue=q)

        async def one(_k: int) -> None:
            async with anyio.create_task_group() as tg:
                for q, n in enumerate(sizes):
                    tg.start_soon(partial(p.send_batch, topic, [payload] * n, queue=q))

        elapsed = await rounds_.run(producers, one)
    done = len(rounds_.latencies)
    return {
        "rounds": done,
        "errors": rounds_.errors,
        "rounds_per_s": round(done / elapsed, 1) if elapsed else None,
        "msgs_per_s": round(done * messages / elapsed, 1) if elapsed else None,
        "round_latency_ms": latency_ms(rounds_.latencies, ("p50", "p99", "max")),
    }


async def _halves(namesrv: str, topic: str, count: int, concurrency: int,
                  payload: bytes, tag: str) -> dict[str, Any]:
    """Half messages the producer commits, plain sends, and halves check-back decides."""
    from raftmq.client import Producer, PullConsumer

    async def local_commit(_msg: Any) -> str:
        return "commit"

    async def local_unknown(_msg: Any) -> str:
        return "unknown"

    async def listener(_req: Any) -> str:
        return "commit"

    async def timed(fn: Any) -> tuple[float, list[float], int]:
        rounds_ = Rounds(count, "send")
        elapsed = await rounds_.run(concurrency, lambda _k: fn())
        return elapsed, rounds_.latencies, rounds_.errors

    out: dict[str, Any] = {"messages": count, "concurrency": concurrency}
    async with Producer(namesrv, producer_group=f"bench-{tag}", check_listener=listener,
                        send_timeout=10.0) as p:
        await p.send_in_transaction(topic, payload, local_transaction=local_commit)  # warm-up
        await p.send(topic, payload)
        half_s, half_lat, half_err = await timed(
            lambda: p.send_in_transaction(topic, payload, local_transaction=local_commit))
        plain_s, plain_lat, plain_err = await timed(lambda: p.send(topic, payload))
        out["half_commit"] = {"msgs_per_s": round(len(half_lat) / half_s, 1),
                              "latency_ms": latency_ms(half_lat, ("p50", "p99")),
                              "errors": half_err}
        out["plain_send"] = {"msgs_per_s": round(len(plain_lat) / plain_s, 1),
                             "latency_ms": latency_ms(plain_lat, ("p50", "p99")),
                             "errors": plain_err}
        if half_lat and plain_lat:
            out["added_us_per_msg"] = round(
                (half_s / len(half_lat) - plain_s / len(plain_lat)) * 1e6, 1)

        # one at a time: what each step of a half message costs on its own
        steps: dict[str, list[float]] = {"prepare": [], "commit": [], "plain_send": []}
        for _ in range(min(count, SEQUENTIAL)):
            t0 = time.perf_counter()
            handle = await p.prepare(topic, payload)
            t1 = time.perf_counter()
            await handle.commit()
            t2 = time.perf_counter()
            await p.send(topic, payload)
            t3 = time.perf_counter()
            steps["prepare"].append(t1 - t0)
            steps["commit"].append(t2 - t1)
            steps["plain_send"].append(t3 - t2)
        out["one_at_a_time_ms"] = {k: latency_ms(v, ("p50", "p99"))
                                   for k, v in steps.items()}

        # check-back: the producer leaves every half undecided; the broker asks it
        check_topic = f"{topic}-check"
        from raftmq.client import Admin

        async with Admin(namesrv) as admin:
            await admin.create_topic(check_topic, 3, exist_ok=True)
        t0 = time.perf_counter()
        _s, stored, check_err = await timed(
            lambda: p.send_in_transaction(check_topic, payload, local_transaction=local_unknown))
        seen = 0
        async with PullConsumer(namesrv, f"bench-{tag}-check", wait_ms=500) as c:
            c.assign(check_topic)
            with anyio.move_on_after(120):
                while seen < len(stored):
                    seen += len(await c.poll(timeout=1.0, max_messages=1000))
        t1 = time.perf_counter()
        out["half_checkback"] = {"stored": len(stored), "delivered": seen,
                                 "errors": check_err,
                                 "until_all_delivered_s": round(t1 - t0, 3),
                                 "checks_answered": p._halves.checks_answered
                                 if p._halves is not None else None}
    return out


async def drive(namesrv: str, args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import Admin

    tag = run_id()
    topic = f"{args.topic}-{tag}"
    spans = sorted(set(args.spans))
    async with Admin(namesrv) as admin:
        cluster = await admin.describe_cluster(topics=False)
        groups = len(cluster.get("groups") or {})
        if max(spans) > groups:
            raise SystemExit(f"{NAME}: a span of {max(spans)} groups needs that many; the "
                             f"cluster has {groups}")
        # queue q in sorted(groups)[q]: queues 0..span-1 are in `span` different groups
        await admin.create_topic(topic, groups)
    payload = b"x" * args.size
    freeze_gc()
    cases: list[dict[str, Any]] = []
    for messages in sorted(set(args.messages)):
        for span in spans:
            progress(NAME, f"{messages} messages over {span} group(s): transactions")
            txn = await _txn_case(namesrv, topic, messages, span, args.txns, args.producers,
                                  payload, tag, wait_visible=args.wait_visible)
            progress(NAME, f"{messages} messages over {span} group(s): send_batch")
            plain = await _batch_case(namesrv, topic, messages, span, args.txns,
                                      args.producers, payload)
            ratio = (round(txn["msgs_per_s"] / plain["msgs_per_s"], 3)
                     if txn["msgs_per_s"] and plain["msgs_per_s"] else None)
            case = {"messages": messages, "groups": span, "txn": txn,
                    "send_batch": plain, "vs_batch": ratio}
            if args.half_load and txn["txn_per_s"]:
                half = round(txn["txn_per_s"] / 2, 1)
                progress(NAME, f"{messages} messages over {span} group(s): transactions at "
                               f"half load ({half}/s)")
                case["txn_half_load"] = await _txn_case(
                    namesrv, topic, messages, span, args.txns, args.producers, payload, tag,
                    rate=half, wait_visible=args.wait_visible)
            cases.append(case)
    result: dict[str, Any] = {"benchmark": NAME, "size_bytes": args.size,
                              "producers": args.producers, "wait_visible": args.wait_visible,
                              "cases": cases}
    if args.halves:
        progress(NAME, f"{args.halves} half messages")
        result["halves"] = await _halves(namesrv, topic, args.halves, args.concurrency,
                                         payload, tag)
    return result


def run_txn(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str | int, Any] = {"tx_check_first_ms": args.check_ms,
                                       "tx_check_interval_ms": args.check_ms}
    with target_cluster(args, node_overrides=overrides) as target:
        result = anyio.run(drive, target.namesrv, args)
        result.update(target.info)
        result["machine"] = target.machine
        if target.local is not None:
            result["check_ms"] = args.check_ms
        return result


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: integers of at least 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench txn", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=_ints, default=[10, 100],
                   help="messages per transaction, a list (default 10,100)")
    p.add_argument("--spans", type=_ints, default=[1, 3],
                   help="groups a transaction spans, a list (default 1,3)")
    p.add_argument("--txns", type=positive_int, default=200,
                   help="transactions per case (and send_batch rounds beside them)")
    p.add_argument("--producers", type=positive_int, default=8,
                   help="transactional producers running at once, and send_batch rounds "
                        "in flight beside them (default 8)")
    p.add_argument("--size", type=positive_int, default=100, help="message bytes (100)")
    p.add_argument("--halves", type=int, default=500,
                   help="half messages (and plain sends) to time; 0 skips them")
    p.add_argument("--concurrency", type=positive_int, default=16,
                   help="half messages / plain sends in flight (default 16)")
    p.add_argument("--check-ms", type=positive_int, default=500,
                   help="local cluster: first check-back after, and between, (ms)")
    p.add_argument("--half-load", action=argparse.BooleanOptionalAction, default=True,
                   help="run each transaction case again at half the rate it reached, for "
                        "the commit latency at half load (default: on)")
    p.add_argument("--wait-visible", action=argparse.BooleanOptionalAction, default=True,
                   help="commit() returns once consumers see the messages (default); "
                        "--no-wait-visible: once the commit is decided, the markers "
                        "following (`commit(wait_visible=False)`)")
    p.add_argument("--topic", default="bench-txn")
    add_cluster_args(p)
    return p


def _table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"transactions vs send_batch ({result['size_bytes']} B messages, "
                    f"{result['producers']} producers)")
    t.caption = ("commit latency in ms; 'half p99': at half the rate reached; 'batch': "
                 "send_batch of the same messages; 'vs': txn msgs/s over batch msgs/s")
    for col in ("msgs", "groups", "txn/s", "msgs/s", "p50", "p99", "half p99",
                "batch/s", "vs", "errors"):
        t.add_column(col, justify="right")
    for c in result["cases"]:
        txn, plain = c["txn"], c["send_batch"]
        half = c.get("txn_half_load")
        t.add_row(str(c["messages"]), str(c["groups"]), f"{txn['txn_per_s']}",
                  f"{txn['msgs_per_s']}", str(txn["commit_latency_ms"]["p50"]),
                  str(txn["commit_latency_ms"]["p99"]),
                  "-" if half is None else str(half["commit_latency_ms"]["p99"]),
                  f"{plain['msgs_per_s']}", str(c["vs_batch"]),
                  str(txn["errors"] + plain["errors"]))
    return t


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_txn(args)
    emit(result, args.json, _table)
    if not args.json and "halves" in result:
        h = result["halves"]
        print(f"half messages: {h['half_commit']['msgs_per_s']} msgs/s vs plain sends "
              f"{h['plain_send']['msgs_per_s']} msgs/s at {h['concurrency']} in flight "
              f"(+{h.get('added_us_per_msg')} us per message); check-back decided "
              f"{h['half_checkback']['delivered']}/{h['half_checkback']['stored']} in "
              f"{h['half_checkback']['until_all_delivered_s']} s; one at a time, p50 ms: "
              + ", ".join(f"{k} {v['p50']}" for k, v in h["one_at_a_time_ms"].items()))
    errors = sum(c["txn"]["errors"] + c["send_batch"]["errors"]
                 + c.get("txn_half_load", {}).get("errors", 0) for c in result["cases"])
    if "halves" in result:
        h = result["halves"]
        errors += h["half_commit"]["errors"] + h["plain_send"]["errors"]
        errors += h["half_checkback"]["errors"]
        errors += h["half_checkback"]["stored"] - h["half_checkback"]["delivered"]
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
