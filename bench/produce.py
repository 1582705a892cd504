"""Produce throughput and acknowledgement latency against a real cluster.

By default the benchmark starts its own cluster on loopback (three node processes, three
groups of three replicas, `fsync=always`, the leaders spread one per node), creates a topic
whose queues are spread over the groups, drives it with the SDK's `Producer` from this
process, and stops every process it started. `--namesrv` points it at a running cluster
instead. An acknowledgement means the message's batch is fsynced on a majority of its
group. Output: one JSON object (`--json`) or a short table.

`--tls` runs the benchmark twice in one invocation, on a plain local cluster and then on
one with TLS on every link (`raftmq dev --tls`'s certificates), and reports both and their
ratios (`tls_vs_plain`).

`--api` says how the messages are handed to the producer, and the result says which:
`single` (default) calls `send_async` once per message with at most `--in-flight`
unacknowledged and lets the producer form batches (`--batch` messages at most, after
`--linger-ms`); `batch` makes `--in-flight // --batch` concurrent `send_batch` calls of
`--batch` messages each, every call one PRODUCE request to one queue, the queues taken
round robin. Each message of a call gets the call's latency. The message count rounds up
to whole batches; `messages` in the result is the count sent.

Two latencies are reported: `latency_ms` from the send call to the ack (with the single
api a call made while the window is full first waits for room), and
`in_flight_latency_ms` from the moment the message held its place in the window to its
ack. With `--in-flight 1` the second is the round trip of one message (what a peer's
publish-and-wait client measures) and the first about twice it.

What the timed section cost the cluster is reported beside the rates: `raft_entries`
committed (every group), `msgs_per_entry`, `fsyncs` (every replica) and, for a local
cluster, `node_cpu_s` (user + system CPU of every node process, from /proc) with
`node_cpu_us_per_entry` and `node_cpu_us_per_msg` (whole cluster, leader and followers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio

from .common import (
    Acks,
    add_api_arg,
    add_cluster_args,
    add_producer_args,
    batch_producer_options,
    batch_tasks,
    cpu_seconds,
    freeze_gc,
    progress_delta,
    raft_progress,
    send_batches,
    send_singles,
    single_producer_options,
    target_cluster,
)

__all__ = ["build_parser", "drive", "main", "run_produce"]


async def drive(
    namesrv: str, topic: str, args: argparse.Namespace,
    node_cpu: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Create `topic` if needed, send `args.messages` as fast as the in-flight bounds let,
    and return the produce result (without the cluster description).

    With `node_cpu` (CPU seconds used so far by every node process), the result also
    says what the sending cost the whole cluster per Raft entry committed."""
    from raftmq.client import Admin, Producer

    async with Admin(namesrv) as admin:  # queues spread over the groups; waits for routes
        await admin.create_topic(topic, args.queues, exist_ok=True)

    payload = b"x" * args.size
    acks = Acks()
    batched = args.api == "batch"
    messages = args.messages
    tasks: int | None = None
    if batched:  # whole batches: the count rounds up to a multiple of --batch
        batches = -(-args.messages // args.batch)
        messages = batches * args.batch
        tasks = batch_tasks(args.in_flight, args.batch, batches)
        options = batch_producer_options(args.batch, tasks)
    else:
        options = single_producer_options(args, args.in_flight)
    async with Producer(namesrv, **options) as producer:
        # warm-up: learn routes, open connections
        for _ in range(10):
            await producer.send(topic, payload)
        freeze_gc()
        cost = await _Cost.start(namesrv, node_cpu)
        t_start = time.perf_counter()

        if batched:
            assert tasks is not None
            await send_batches(producer, [(topic, q) for q in range(args.queues)],
                               [payload] * args.batch, batches, tasks, acks)
        else:
            await send_singles(producer, [topic], payload, messages, acks)
        await producer.flush()
        elapsed = time.perf_counter() - t_start
        spent = await cost.stop(messages)
    return {
        "benchmark": "produce",
        "api": args.api,
        "messages": messages,
        **acks.summary(elapsed, args.size),
        "size_bytes": args.size,
        "in_flight": args.in_flight,
        # batch api: messages per send_batch call, and how many calls were in flight
        "batch_messages": args.batch if batched else None,
        "concurrent_batches": tasks,
        "batch_max_messages": options["batch_max_messages"],
        "linger_ms": options["linger_ms"],
        "queues": args.queues,
        **spent,
    }


class _Cost:
    """What a timed section cost the cluster: Raft entries committed (every group), and
    the CPU every node process used for them (`node_cpu`, when the nodes are local)."""

    def __init__(self, namesrv: str, node_cpu: Callable[[], float] | None,
                 progress: dict[str, Any], cpu: float | None) -> None:
        self.namesrv = namesrv
        self.node_cpu = node_cpu
        self.progress = progress
        self.cpu = cpu

    @classmethod
    async def start(cls, namesrv: str, node_cpu: Callable[[], float] | None) -> _Cost:
        from raftmq.client import Admin

        async with Admin(namesrv) as admin:
            progress = await raft_progress(admin)
        return cls(namesrv, node_cpu, progress, None if node_cpu is None else node_cpu())

    async def stop(self, messages: int) -> dict[str, Any]:
        from raftmq.client import Admin

        cpu = None if self.node_cpu is None or self.cpu is None else self.node_cpu() - self.cpu
        async with Admin(self.namesrv) as admin:
            delta = progress_delta(self.progress, await raft_progress(admin))
        entries = delta["entries"]
        return {
            "raft_entries": entries,
            "msgs_per_entry": round(messages / entries, 1) if entries else None,
            "fsyncs": delta["fsyncs"],
            "node_cpu_s": None if cpu is None else round(cpu, 3),
            # whole cluster: every replica's CPU for the section, per entry committed
            "node_cpu_us_per_entry": round(cpu / entries * 1e6, 1) if cpu and entries else None,
            "node_cpu_us_per_msg": round(cpu / messages * 1e6, 2) if cpu and messages else None,
        }


def run_produce(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark against `--namesrv` or a local cluster started (and stopped) here;
    with `--tls`, twice in one run: a plain local cluster, then one with TLS on every
    link (clients, peers, name server), and the ratios between them."""
    if not getattr(args, "tls", False):
        return _run_once(args, tls=False)
    if args.namesrv:
        raise SystemExit("raftmq bench produce: --tls compares two local clusters it starts; "
                         "drop --namesrv")
    plain = _run_once(args, tls=False)
    secured = _run_once(args, tls=True)
    lat = "latency_ms"
    return {
        "plain": plain, "tls": secured,
        "tls_vs_plain": {
            "msgs_per_s": round(secured["msgs_per_s"] / plain["msgs_per_s"], 3),
            "p99_ms": round(secured[lat]["p99"] / plain[lat]["p99"], 3)
            if plain[lat]["p99"] else None,
        },
        "messages": plain["messages"] + secured["messages"],
        "errors": plain["errors"] + secured["errors"],
    }


def _run_once(args: argparse.Namespace, *, tls: bool) -> dict[str, Any]:
    import os

    from transport.tls import CA_ENV

    with target_cluster(args, settle=False, tls=tls) as target:
        local = target.local
        node_cpu = None if local is None else (lambda: cpu_seconds(local.node_pids()))
        saved = os.environ.get(CA_ENV)
        if tls and local is not None and local.tls_ca is not None:
            os.environ[CA_ENV] = str(local.tls_ca)  # the SDK's pools dial with TLS
        try:
            result = anyio.run(drive, target.namesrv, args.topic, args, node_cpu)
        finally:
            if saved is None:
                os.environ.pop(CA_ENV, None)
            else:
                os.environ[CA_ENV] = saved
        result.update(target.info)
        return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench produce", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100, help="message body bytes (default 100)")
    p.add_argument("--topic", default="bench")
    p.add_argument("--queues", type=int, default=12)
    p.add_argument("--tls", action="store_true",
                   help="run twice, without and with TLS on every link, and compare")
    add_api_arg(p)
    add_producer_args(p)
    add_cluster_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_produce(args)
    if args.json:
        print(json.dumps(result))
    elif args.tls:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"produce, TLS against plain: {result['plain']['messages']:,} x "
                        f"{args.size} B each, fsync={args.fsync}")
        for col in ("links", "msgs/s", "p50 ms", "p99 ms", "errors"):
            t.add_column(col, justify="right")
        for name in ("plain", "tls"):
            r = result[name]
            t.add_row(name, f"{r['msgs_per_s']:,.0f}", str(r["latency_ms"]["p50"]),
                      str(r["latency_ms"]["p99"]), str(r["errors"]))
        Console().print(t)
        print(f"TLS/plain: throughput x{result['tls_vs_plain']['msgs_per_s']}, "
              f"p99 x{result['tls_vs_plain']['p99_ms']}")
    else:
        from rich.console import Console
        from rich.table import Table

        how = ("send_async" if args.api == "single"
               else f"send_batch of {args.batch}, {result['concurrent_batches']} in flight")
        t = Table(title=f"produce: {result['messages']:,} x {args.size} B, {how}, "
                        f"fsync={args.fsync}")
        for col in ("msgs/s", "MB/s", "p50 ms", "p99 ms", "p999 ms", "errors"):
            t.add_column(col, justify="right")
        lat = result["latency_ms"]
        t.add_row(f"{result['msgs_per_s']:,.0f}", f"{result['mb_per_s']:.1f}", str(lat["p50"]),
                  str(lat["p99"]), str(lat["p999"]), str(result["errors"]))
        Console().print(t)
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
