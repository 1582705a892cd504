"""Message trace's cost: produce and consume throughput with tracing off and on, in one
run against one cluster (a local one by default, started and stopped here).

Each case gets a topic of its own. `--messages` messages of `--size` bytes go to its
queues with `send_batch` from one producer (`trace=False`, then `trace=True`); the time
runs until the producer has closed, so the traced case pays for reporting every message
(one TRACE request per group and batch of up to 512 events, and the last ones on close).
Then one pull consumer per case (`trace` likewise) reads every queue from 0 to its end,
up to `--pull` messages a FETCH, committing each queue's position every `--commit-every`
pulls and at the end, until it has closed: the traced case reports a delivered step per
message and an acked one per commit. Each case's trace records are counted from the
reports' answers (`written`), so the JSON also says what tracing wrote: a record holds
the steps one report brought for one message, so `records_per_message` is 3 when the
delivered and acked steps left in different reports (sent + stored, delivered, acked), 2
when they left together.

`vs_off` is the traced case's rate over the untraced one's.
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
    positive_int,
    progress,
    run_id,
    run_on_target,
    send_batches,
)

__all__ = ["build_parser", "main", "run_trace"]

QUEUES = 6


async def _produce(namesrv: str, topic: str, trace: bool,
                   args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import Producer

    batches = -(-args.messages // args.batch)
    tasks = batch_tasks(args.in_flight, args.batch, batches)
    acks = Acks()
    payload = [b"x" * args.size] * args.batch
    producer = Producer(namesrv, trace=trace, **batch_producer_options(args.batch, tasks))
    freeze_gc()
    t0 = time.perf_counter()
    async with producer:
        await send_batches(producer, [(topic, q) for q in range(QUEUES)], payload,
                           batches, tasks, acks)
    elapsed = time.perf_counter() - t0  # the producer closed: its last reports are in
    out = acks.summary(elapsed, args.size)
    out["trace_records"] = producer.tracer.written if producer.tracer else 0
    out["trace_dropped"] = producer.tracer.dropped if producer.tracer else 0
    return out


async def _consume(namesrv: str, topic: str, trace: bool,
                   args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import PullConsumer

    received = 0
    consumer = PullConsumer(namesrv, f"bench-trace-{run_id()}", trace=trace)
    t0 = time.perf_counter()
    async with consumer:
        async def read(q: int) -> None:
            nonlocal received
            offset = pulls = 0
            while True:
                res = await consumer.pull(topic, q, offset, max=args.pull, wait_ms=0)
                received += len(res.messages)
                offset = res.next_offset
                pulls += 1
                done = offset >= res.end_offset
                if done or pulls % args.commit_every == 0:
                    await consumer.commit(topic, q, offset)
                if done:
                    return

        async with anyio.create_task_group() as tg:
            for q in range(QUEUES):
                tg.start_soon(read, q)
    elapsed = time.perf_counter() - t0
    return {
        "received": received,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(received / elapsed, 1) if elapsed else None,
        "trace_records": consumer.tracer.written if consumer.tracer else 0,
        "trace_dropped": consumer.tracer.dropped if consumer.tracer else 0,
    }


async def _drive(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import Admin

    cases: dict[str, Any] = {}
    for name, trace in (("off", False), ("on", True)):
        topic = f"trace-bench-{name}-{run_id()}"
        async with Admin(target.namesrv) as admin:
            await admin.create_topic(topic, QUEUES)
        progress("trace", f"tracing {name}: sending {args.messages:,} messages of "
                 f"{args.size} bytes")
        produced = await _produce(target.namesrv, topic, trace, args)
        progress("trace", f"tracing {name}: reading them")
        consumed = await _consume(target.namesrv, topic, trace, args)
        records = produced["trace_records"] + consumed["trace_records"]
        cases[name] = {
            "produce": produced,
            "consume": consumed,
            "trace_records": records,
            "records_per_message": round(records / produced["acknowledged"], 3)
            if produced["acknowledged"] else None,
        }
    off, on = cases["off"], cases["on"]
    for side in ("produce", "consume"):
        base, rate = off[side]["msgs_per_s"], on[side]["msgs_per_s"]
        on[side]["vs_off"] = round(rate / base, 3) if base and rate else None
    return {
        "benchmark": "trace",
        "messages": args.messages,
        "size_bytes": args.size,
        "batch": args.batch,
        "queues": QUEUES,
        "pull": args.pull,
        "commit_every": args.commit_every,
        "cases": cases,
        "errors": off["produce"]["errors"] + on["produce"]["errors"],
    }


def run_trace(args: argparse.Namespace) -> dict[str, Any]:
    return run_on_target(args, _drive)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench trace",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=positive_int, default=100_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=positive_int, default=100, help="messages per send_batch")
    p.add_argument("--in-flight", type=positive_int, default=4096)
    p.add_argument("--pull", type=positive_int, default=256,
                   help="messages one FETCH asks for (the node caps it at 1,024)")
    p.add_argument("--commit-every", type=positive_int, default=16,
                   help="a queue's position is committed every N pulls (and at its end)")
    add_cluster_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_trace(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    cases = result["cases"]
    ok = (result["errors"] == 0
          and all(c["consume"]["received"] >= args.messages for c in cases.values())
          and cases["off"]["trace_records"] == 0
          and cases["on"]["produce"]["trace_dropped"] == 0
          and cases["on"]["consume"]["trace_dropped"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
