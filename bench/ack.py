"""Per-message acknowledgement: the simple consumer against pull + offset commit, the
redelivery of what was not acked in time, and the broker's retry path.

One run against one cluster (a local one by default, started and stopped here):

1. **receive + ack**: `--messages` are sent, then read by a `PullConsumer` that commits
   its offsets after every pull (the plain path), then by `--consumers` `SimpleConsumer`s
   of another group receiving `--batch` at a time and acking each message (the acks go
   out while the next batch is received, as an application's handlers would; the run
   ends when every ack is answered); both rates, and their ratio (the target: receive +
   ack >= 0.5 x pull + commit).
2. **redelivery**: `--expire` messages are received and left unacked with an invisible
   time of `--invisible` seconds; each one's lateness is when it was received again
   minus when its invisible time ran out (p50/p99/max; the target p99 <= 100 ms).
3. **retry path**: `--retries` messages are received and nacked with a delay of
   `--retry-delay` seconds: the nack rate (send-back rate), and each retry's lateness
   beyond its delay.

Same machine, one clock; an invisible time (a nack's delay) runs from the leader's clock
at the receive (the nack), which is later than the client's clock when it made the call:
lateness is counted from the call, so it is an upper bound, and `early` counts what came
before even that.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anyio

from .common import (
    Target,
    add_cluster_args,
    freeze_gc,
    latency_ms,
    positive_int,
    progress,
    run_on_target,
)

__all__ = ["build_parser", "main", "run_ack"]

QUEUES = 4
_POINTS = ("p50", "p99", "p999", "max")


async def _fill(namesrv: str, topic: str, n: int, size: int) -> None:
    from raftmq.client import Admin, Producer

    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, QUEUES, exist_ok=True)
    async with Producer(namesrv, linger_ms=1.0) as p:
        body = b"x" * size
        for i in range(0, n, 256):
            await p.send_batch(topic, [body] * min(256, n - i), queue=(i // 256) % QUEUES)


async def _pull_commit(namesrv: str, topic: str, n: int, batch: int) -> dict[str, Any]:
    """Read `n` messages with pulls of `batch`, committing after each pull."""
    from raftmq.client import PullConsumer

    got = 0
    async with PullConsumer(namesrv, "bench-ack-pull", start_from="first") as c:
        t0 = time.perf_counter()
        offsets = dict.fromkeys(range(QUEUES), 0)
        while got < n:
            for q in range(QUEUES):
                res = await c.pull(topic, q, offsets[q], max=batch, wait_ms=0)
                if res.messages:
                    got += len(res.messages)
                    offsets[q] = res.next_offset
                    await c.commit(topic, q, res.next_offset)
        seconds = time.perf_counter() - t0
    return {"messages": got, "seconds": round(seconds, 3), "msgs_per_s": round(got / seconds, 1)}


async def _receive_ack(namesrv: str, topic: str, n: int, batch: int,
                       consumers: int) -> dict[str, Any]:
    """Read `n` messages with `consumers` simple consumers, acking each one."""
    from raftmq.client import SimpleConsumer

    done = 0

    async def one(i: int) -> None:
        nonlocal done
        async with SimpleConsumer(namesrv, "bench-ack-simple", client_id=f"bench-{i}") as c, \
                anyio.create_task_group() as acks:
            await ready.wait()
            while done < n:  # the acks go on while the next batch is received
                msgs = await c.receive(topic, batch, wait=0.5)
                for m in msgs:
                    acks.start_soon(c.ack, m)
                done += len(msgs)

    ready = anyio.Event()
    async with anyio.create_task_group() as tg:
        for i in range(consumers):
            tg.start_soon(one, i)
        await anyio.sleep(0.2)  # connected, before the clock starts
        t0 = time.perf_counter()
        ready.set()
    seconds = time.perf_counter() - t0
    return {"messages": done, "consumers": consumers, "batch": batch,
            "seconds": round(seconds, 3), "msgs_per_s": round(done / seconds, 1)}


async def _redelivery(namesrv: str, topic: str, n: int, invisible: float) -> dict[str, Any]:
    """Receive `n` messages, leave them unacked, and time their redelivery."""
    from raftmq.client import SimpleConsumer

    expires: dict[tuple[int, int], float] = {}
    late: list[float] = []
    async with SimpleConsumer(namesrv, "bench-ack-expire", invisible=invisible) as c:
        while len(expires) < n:
            asked = time.time()  # the leader's clock at the receive is later: never early
            for m in await c.receive(topic, min(256, n - len(expires)), wait=1.0):
                expires[(m.queue, m.offset)] = asked + invisible
        again: set[tuple[int, int]] = set()
        while len(again) < n:
            msgs = await c.receive(topic, 256, wait=invisible + 5)
            t = time.time()
            for m in msgs:
                key = (m.queue, m.offset)
                if key in expires and key not in again and m.deliveries == 2:
                    again.add(key)
                    late.append(t - expires[key])
            async with anyio.create_task_group() as tg:
                for m in msgs:
                    tg.start_soon(c.ack, m)
    return {"messages": n, "invisible_s": invisible, "early": sum(1 for x in late if x < 0),
            "lateness_ms": latency_ms([max(0.0, x) for x in late], _POINTS)}


async def _retries(namesrv: str, topic: str, n: int, delay: float) -> dict[str, Any]:
    """Receive `n` messages, nack each with `delay`: the nack rate and the retries'
    lateness beyond their delay."""
    from raftmq.client import SimpleConsumer

    due: dict[tuple[int, int], float] = {}
    late: list[float] = []
    async with SimpleConsumer(namesrv, "bench-ack-retry") as c:
        received: list[Any] = []
        while len(received) < n:
            received += await c.receive(topic, min(256, n - len(received)), wait=1.0)
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for m in received:
                async def nack(m: Any = m) -> None:
                    asked = time.time()  # the leader's clock at the nack is later
                    await c.nack(m, delay=delay)
                    due[(m.queue, m.offset)] = asked + delay
                tg.start_soon(nack)
        nack_s = time.perf_counter() - t0
        again: set[tuple[int, int]] = set()
        while len(again) < n:
            msgs = await c.receive(topic, 256, wait=delay + 5)
            t = time.time()
            for m in msgs:
                key = (m.queue, m.offset)
                if key in due and key not in again:
                    again.add(key)
                    late.append(t - due[key])
            async with anyio.create_task_group() as tg:
                for m in msgs:
                    tg.start_soon(c.ack, m)
    return {"messages": n, "delay_s": delay, "nack_seconds": round(nack_s, 3),
            "nacks_per_s": round(n / nack_s, 1), "early": sum(1 for x in late if x < 0),
            "lateness_beyond_delay_ms": latency_ms([max(0.0, x) for x in late], _POINTS)}


async def _drive(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    namesrv = target.namesrv
    progress("ack", f"filling {args.messages:,} messages")
    await _fill(namesrv, "ack-bench", args.messages, args.size)
    freeze_gc()
    progress("ack", "pull + commit")
    pull = await _pull_commit(namesrv, "ack-bench", args.messages, args.batch)
    progress("ack", f"receive + ack with {args.consumers} simple consumers")
    simple = await _receive_ack(namesrv, "ack-bench", args.messages, args.batch,
                                args.consumers)
    await _fill(namesrv, "ack-expire", args.expire, args.size)
    progress("ack", f"{args.expire:,} left unacked for {args.invisible} s")
    redelivery = await _redelivery(namesrv, "ack-expire", args.expire, args.invisible)
    await _fill(namesrv, "ack-retry", args.retries, args.size)
    progress("ack", f"{args.retries:,} nacked with a delay of {args.retry_delay} s")
    retries = await _retries(namesrv, "ack-retry", args.retries, args.retry_delay)
    return {
        "benchmark": "ack",
        "size_bytes": args.size,
        "pull_commit": pull,
        "receive_ack": simple,
        "receive_ack_vs_pull_commit": round(simple["msgs_per_s"] / pull["msgs_per_s"], 3)
        if pull["msgs_per_s"] else None,
        "redelivery": redelivery,
        "retries": retries,
        "early": redelivery["early"] + retries["early"],
    }


def run_ack(args: argparse.Namespace) -> dict[str, Any]:
    return run_on_target(args, _drive)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench ack", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=positive_int, default=50_000)
    p.add_argument("--batch", type=positive_int, default=64,
                   help="messages per pull, and per receive")
    p.add_argument("--consumers", type=positive_int, default=2)
    p.add_argument("--expire", type=positive_int, default=2_000)
    p.add_argument("--invisible", type=float, default=2.0)
    p.add_argument("--retries", type=positive_int, default=2_000)
    p.add_argument("--retry-delay", type=float, default=2.0)
    p.add_argument("--size", type=int, default=100)
    add_cluster_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_ack(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if result["early"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
