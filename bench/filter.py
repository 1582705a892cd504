"""SQL92 filters on the fetch path: consume throughput with a filter matching 1%, 50% and
100% of the messages, against no filter, in one run against one cluster (a local one by
default, started and stopped here).

`--messages` messages of `--size` bytes go to the queues of one topic with `send_batch`,
each with a property `p` = its place in its batch modulo 100 (the batch is a multiple of
100, so each value is as common as the next). The whole topic is read once first, not
measured, so every case then reads entries the nodes have read before. Then each case
reads every queue from offset 0 to its end with pull consumers (one long-poll-free pull
loop per queue, up to `--pull` messages a FETCH):

* `none`: no filter, every message sent to the client;
* `all`: `p >= 0`, true of every message, decided on the broker;
* `half`: `p < 50`;
* `one_percent`: `p < 1`.

For each: the messages received, the FETCH requests, the time, and two rates:
`msgs_per_s` (messages received a second) and `scanned_per_s` (messages of the queues
passed over a second, received or filtered out). The filtered cases' `vs_none` is their
`scanned_per_s` over the unfiltered one's.
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

__all__ = ["CASES", "build_parser", "main", "run_filter"]

QUEUES = 6
CASES: dict[str, tuple[str | None, float]] = {  # name -> (filter, share of messages)
    "none": (None, 1.0),
    "all": ("p >= 0", 1.0),
    "half": ("p < 50", 0.5),
    "one_percent": ("p < 1", 0.01),
}


async def _send(namesrv: str, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import OutgoingMessage, Producer

    batches = -(-args.messages // args.batch)
    tasks = batch_tasks(args.in_flight, args.batch, batches)
    acks = Acks()
    body = b"x" * args.size
    payload = [OutgoingMessage(body, properties={"p": str(i % 100)})
               for i in range(args.batch)]
    async with Producer(namesrv, **batch_producer_options(args.batch, tasks)) as producer:
        freeze_gc()
        t0 = time.perf_counter()
        await send_batches(producer, [(topic, q) for q in range(QUEUES)], payload,  # type: ignore[arg-type]
                           batches, tasks, acks)
        elapsed = time.perf_counter() - t0
    return acks.summary(elapsed, args.size)


async def _consume(namesrv: str, topic: str, sql: str | None, pull: int) -> dict[str, Any]:
    """Every queue of the topic read from 0 to its end with `sql`."""
    from raftmq.client import PullConsumer

    received = fetches = scanned = 0

    async with PullConsumer(namesrv, "bench-filter") as consumer:
        async def read(q: int) -> None:
            nonlocal received, fetches, scanned
            offset = 0
            while True:
                res = await consumer.pull(topic, q, offset, max=pull, wait_ms=0, sql=sql)
                fetches += 1
                received += len(res.messages)
                scanned += res.next_offset - offset
                offset = res.next_offset
                if offset >= res.end_offset:
                    return

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for q in range(QUEUES):
                tg.start_soon(read, q)
        elapsed = time.perf_counter() - t0
    return {
        "filter": sql,
        "received": received,
        "scanned": scanned,
        "fetches": fetches,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(received / elapsed, 1) if elapsed else None,
        "scanned_per_s": round(scanned / elapsed, 1) if elapsed else None,
    }


async def _drive(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import Admin

    topic = f"filter-bench-{run_id()}"
    async with Admin(target.namesrv) as admin:
        await admin.create_topic(topic, QUEUES)
    progress("filter", f"sending {args.messages:,} messages of {args.size} bytes")
    sent = await _send(target.namesrv, topic, args)
    progress("filter", "reading the topic once (not measured)")
    await _consume(target.namesrv, topic, None, args.pull)
    cases: dict[str, Any] = {}
    for name, (sql, _share) in CASES.items():
        progress("filter", f"reading with {sql or 'no filter'}")
        cases[name] = await _consume(target.namesrv, topic, sql, args.pull)
    base = cases["none"]["scanned_per_s"]
    for name in CASES:
        if name != "none":
            rate = cases[name]["scanned_per_s"]
            cases[name]["vs_none"] = round(rate / base, 3) if base and rate else None
    return {
        "benchmark": "filter",
        "messages": sent["acknowledged"],
        "size_bytes": args.size,
        "batch": args.batch,
        "queues": QUEUES,
        "pull": args.pull,
        "send": sent,
        "cases": cases,
        "errors": sent["errors"],
    }


def run_filter(args: argparse.Namespace) -> dict[str, Any]:
    return run_on_target(args, _drive)


def _batch(text: str) -> int:
    n = positive_int(text)
    if n % 100:
        raise argparse.ArgumentTypeError("--batch is a multiple of 100 (the shares of `p`)")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench filter",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=positive_int, default=200_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=_batch, default=200, help="messages per send_batch "
                   "(a multiple of 100)")
    p.add_argument("--in-flight", type=positive_int, default=8192)
    p.add_argument("--pull", type=positive_int, default=1024,
                   help="messages one FETCH asks for (the node caps it at 1,024)")
    add_cluster_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_filter(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    want = result["messages"]
    ok = result["errors"] == 0 and all(
        c["scanned"] == want and c["received"] == round(want * CASES[n][1])
        for n, c in result["cases"].items())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
