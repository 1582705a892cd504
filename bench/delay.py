"""Delayed messages: what pending costs, how fast delayed sends go, how late a crowd arrives.

One run against one cluster (a local one by default, started and stopped here), each
figure beside the plain path it compares with:

1. **sends**: `--messages` plain messages with `send_batch` (`--batch` per call, a window
   of `--in-flight`), then as many delayed by an hour, the same way; rates and the ratio
   (the target is delayed >= 0.8 x plain).
2. **pending**: `--pending` messages delayed by a day, then every node's resident memory
   (VmRSS) against what it was before they were sent (the issue's target: within 100 MB
   of a node with none, for 10 million). Pending messages stay pending (the cluster is
   stopped after the run).
3. **lateness**: `--spread` messages sent one by one at `--spread-rate` a second, each
   delayed by `--spread-delay`, read by long-polling pull consumers as they fall due;
   each one's lateness is when it was first read minus its due time (its store time
   plus the delay): p50/p99/max, the target p99 <= 100 ms; `early` counts any read
   before it was due.
4. **due at once**: `--due` messages sent with one `deliver_at` a few seconds ahead of
   the end of their sending, read by long-polling pull consumers on every queue; each
   message's lateness is the time it was first read minus its due time (p50/p99/max;
   nothing may be read early: `early` counts any), and two delivery rates: into the
   queues (the broker's side: the crowd over the time from due until every node's
   STATUS shows none of it pending, polled every 10 ms; local cluster only) and to the
   readers (the crowd over the time from due to the last one read), beside the same
   readers' rate over the plain messages of step 1 read from offset 0 (the plain
   consume rate).

Lateness here is end to end: the leader's wake-up, the commit of the move, and the
consumer's long poll returning. Same machine, one clock.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anyio

from .common import (
    Acks,
    Target,
    add_cluster_args,
    batch_producer_options,
    batch_tasks,
    freeze_gc,
    latency_ms,
    positive_int,
    progress,
    run_on_target,
    send_batches,
)

__all__ = ["build_parser", "main", "run_delay"]

QUEUES = 12
_POINTS = ("p50", "p99", "p999", "max")


def resident_mb(pids: list[int]) -> list[float]:
    """VmRSS of each process, MB (0 for one that is gone)."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                kb = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        except OSError:
            kb = 0
        out.append(round(kb / 1024, 1))
    return out


async def _send(namesrv: str, topic: str, n: int, args: argparse.Namespace,
                **delay: Any) -> dict[str, Any]:
    """`n` messages (rounded up to whole batches) to every queue of `topic` in turn."""
    from raftmq.client import Producer

    batches = -(-n // args.batch)
    tasks = batch_tasks(args.in_flight, args.batch, batches)
    acks = Acks()
    payload = [b"x" * args.size] * args.batch
    async with Producer(namesrv, **batch_producer_options(args.batch, tasks)) as producer:
        await producer.send(topic, b"warm-up", queue=0, **delay)
        freeze_gc()
        t0 = time.perf_counter()
        await send_batches(producer, [(topic, q) for q in range(QUEUES)], payload, batches,
                           tasks, acks, **delay)
        elapsed = time.perf_counter() - t0
    return acks.summary(elapsed, args.size)


async def _read(namesrv: str, topic: str, want: int, timeout: float,
                ) -> tuple[list[float], list[int]]:
    """Read every queue of `topic` from offset 0 with long polls until `want` messages
    came (or `timeout`): the wall time (s) each was first read at, and its store time."""
    from raftmq.client import PullConsumer

    seen: list[float] = []
    stored: list[int] = []
    with anyio.move_on_after(timeout):
        async with PullConsumer(namesrv, f"bench-{topic}", start_from="first") as c:
            async def read(q: int) -> None:
                offset = 0
                while len(seen) < want:
                    res = await c.pull(topic, q, offset, max=1024, wait_ms=500)
                    t = time.time()
                    seen.extend([t] * len(res.messages))
                    stored.extend(m.store_ms for m in res.messages)
                    offset = res.next_offset
            async with anyio.create_task_group() as tg:
                for q in range(QUEUES):
                    tg.start_soon(read, q)
                while len(seen) < want:
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
    return seen, stored


async def _spread(namesrv: str, args: argparse.Namespace) -> dict[str, Any]:
    """Send `args.spread` messages paced at `args.spread_rate`, each delayed by
    `args.spread_delay`, while reading them; the lateness of each (see the docstring)."""
    from raftmq.client import Producer

    delay_ms = round(args.spread_delay * 1000)
    found: dict[str, Any] = {}

    async def read() -> None:
        seen, stored = await _read(namesrv, "delay-spread", args.spread + 1,
                                   args.spread / args.spread_rate + args.spread_delay
                                   + args.timeout)
        found["late"] = [t * 1000 - (sms + delay_ms) for t, sms in zip(seen, stored,
                                                                        strict=True)]

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        async with Producer(namesrv, linger_ms=0.0) as producer:
            await producer.send("delay-spread", b"warm-up", delay=args.spread_delay)
            start = time.perf_counter()
            for i in range(args.spread):
                wait = start + i / args.spread_rate - time.perf_counter()
                if wait > 0:
                    await anyio.sleep(wait)
                await producer.send_async("delay-spread", b"s%d" % i, delay=args.spread_delay)
            await producer.flush()
    late = found.get("late", [])
    return {
        "messages": args.spread,
        "rate_per_s": args.spread_rate,
        "delay_s": args.spread_delay,
        "read": len(late),
        "early": sum(1 for x in late if x < 0),
        "lateness_ms": latency_ms([max(x, 0.0) / 1000 for x in late], _POINTS),
    }


async def _pending(target: Target) -> list[int]:
    """Delayed messages pending on each node of a local cluster (every node here holds a
    replica of every group), from STATUS."""
    from raftmq.client import Admin

    assert target.local is not None
    totals = []
    async with Admin(target.namesrv) as admin:
        for i in target.local.node_ids:
            st = await admin.node_status(target.local.client_addr(i))
            totals.append(sum(int(g.get("delayed_pending", 0)) for g in st["groups"].values()))
    return totals


async def _moved_at(target: Target, due_at: float, before: list[int], timeout: float,
                    out: dict[str, float]) -> None:
    """When every node's STATUS first shows no more pending than `before` the crowd was
    sent: the crowd moved into its queues on every replica (gives up after `timeout`)."""
    while time.time() < due_at:
        await anyio.sleep(0.005)
    with anyio.move_on_after(timeout):
        while True:
            now = await _pending(target)
            if all(n <= b for n, b in zip(now, before, strict=True)):
                out["at"] = time.time()
                return
            await anyio.sleep(0.01)


async def _drive(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import Admin

    namesrv = target.namesrv
    pids = target.local.node_pids() if target.local is not None else []
    async with Admin(namesrv) as admin:
        for topic in ("delay-plain", "delay-later", "delay-spread", "delay-pending",
                      "delay-due"):
            await admin.create_topic(topic, QUEUES, exist_ok=True)

    progress("delay", f"sending {args.messages:,} plain, then {args.messages:,} delayed")
    plain = await _send(namesrv, "delay-plain", args.messages, args)
    delayed = await _send(namesrv, "delay-later", args.messages, args, delay=3600)
    progress("delay", f"{args.spread:,} messages delayed {args.spread_delay} s, read as due")
    spread = await _spread(namesrv, args)

    rss_before = resident_mb(pids)
    progress("delay", f"sending {args.pending:,} pending a day")
    pending = await _send(namesrv, "delay-pending", args.pending, args, delay=86_400)
    await anyio.sleep(2)  # followers apply the last entries
    rss_after = resident_mb(pids)

    progress("delay", "reading the plain messages from offset 0 (the plain consume rate)")
    t0 = time.time()
    seen, _ = await _read(namesrv, "delay-plain", plain["acknowledged"], args.timeout)
    plain_read_s = (max(seen) - t0) if seen else None

    # the crowd: due together, a little after they can all be sent
    send_s = args.due / max(plain["msgs_per_s"], 1.0)
    due_at = time.time() + send_s * 1.5 + args.lead
    progress("delay", f"sending {args.due:,} due together in {due_at - time.time():.1f} s")
    before = await _pending(target) if target.local is not None else []
    crowd = await _send(namesrv, "delay-due", args.due, args, deliver_at=due_at)
    sent_by = time.time()
    moved: dict[str, float] = {}
    async with anyio.create_task_group() as tg:
        if target.local is not None:
            tg.start_soon(_moved_at, target, due_at, before, args.timeout, moved)
        seen_due, _ = await _read(namesrv, "delay-due", crowd["acknowledged"],
                                  max(args.timeout, due_at - time.time() + args.timeout))
    late = sorted(t - due_at for t in seen_due)
    delivered_s = (max(seen_due) - due_at) if seen_due else None
    return {
        "benchmark": "delay",
        "size_bytes": args.size,
        "batch": args.batch,
        "sends": {
            "plain": plain,
            "delayed": delayed,
            "delayed_vs_plain": round(delayed["msgs_per_s"] / plain["msgs_per_s"], 3)
            if plain["msgs_per_s"] else None,
        },
        "lateness": spread,
        "pending": {
            "messages": pending["acknowledged"],
            "msgs_per_s": pending["msgs_per_s"],
            "node_rss_mb_before": rss_before,
            "node_rss_mb_after": rss_after,
            "node_rss_mb_delta": [round(a - b, 1) for a, b in zip(rss_after, rss_before,
                                                                   strict=True)],
            "bytes_per_pending_msg": [
                round((a - b) * 2**20 / pending["acknowledged"], 1)
                for a, b in zip(rss_after, rss_before, strict=True)]
            if pending["acknowledged"] else None,
        },
        "due_at_once": {
            "messages": crowd["acknowledged"],
            "sent_before_due_s": round(due_at - sent_by, 3),
            "read": len(seen_due),
            "early": sum(1 for x in late if x < 0),
            "lateness_ms": latency_ms([max(x, 0.0) for x in late], _POINTS),
            "moved_into_queues_s": round(moved["at"] - due_at, 3) if moved else None,
            "moved_msgs_per_s": round(crowd["acknowledged"] / (moved["at"] - due_at), 1)
            if moved and moved["at"] > due_at else None,
            "delivered_msgs_per_s": round(len(seen_due) / delivered_s, 1)
            if delivered_s else None,
            "plain_consume_msgs_per_s": round(len(seen) / plain_read_s, 1)
            if plain_read_s else None,
        },
        "errors": plain["errors"] + delayed["errors"] + pending["errors"] + crowd["errors"],
    }


def run_delay(args: argparse.Namespace) -> dict[str, Any]:
    return run_on_target(args, _drive)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench delay", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=positive_int, default=200_000,
                   help="plain and delayed messages sent for the send rates")
    p.add_argument("--pending", type=int, default=1_000_000,
                   help="messages left pending (a day) for the memory figure")
    p.add_argument("--spread", type=positive_int, default=5_000,
                   help="messages sent one by one for the lateness figure")
    p.add_argument("--spread-rate", type=float, default=1000.0,
                   help="their sends per second")
    p.add_argument("--spread-delay", type=float, default=2.0,
                   help="their delay, seconds")
    p.add_argument("--due", type=positive_int, default=200_000,
                   help="messages falling due at once")
    p.add_argument("--lead", type=float, default=3.0,
                   help="seconds between the end of the crowd's sending and its due time")
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=positive_int, default=256)
    p.add_argument("--in-flight", type=positive_int, default=8192)
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a read waits for its messages")
    add_cluster_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_delay(args)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    early = result["due_at_once"]["early"] + result["lateness"]["early"]
    return 0 if result["errors"] == 0 and early == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
