"""Topic scaling: produce throughput with the same load spread over 1 ... 10,000 topics.

For each count in `--topics` (increasing), the benchmark creates the topics still missing
(`--queues` each, spread over every group) with at most `--create-concurrency` creations
in flight, and reports the creation time separately: the seconds until every creation is
committed and then until the name servers route every new topic. It then sends
`--messages` messages round-robin over all the topics, as fast as `--in-flight` lets (the
`bench.produce` load), and reports msgs/s and its ratio to the single-topic figure (the
issue's target: 10,000 topics at least 90 % of one). Phases build on each other, so the
1,000-topic phase runs on a cluster holding exactly 1,000 topics of this run.

Each phase starts a fresh producer and first sends one message to every topic, so routes
are learnt and connections open before the clock starts. `cluster_view_ms` is how long
the name server takes to answer a CLUSTER request, which lists every topic of every group.
A phase whose new topics the name servers do not route within `--route-timeout` ends
the run; it is reported with an `error` instead of figures.
`raft_entries` (and `msgs_per_entry`), `elections` and `fsyncs` say what the sending cost
the cluster: the producer sends the batches it has ready for a group (one per queue) in
one request, stored as one Raft entry, so spreading the same messages over more queues
makes more, smaller batches but not more entries. The in-flight window is shared by all
queues; one so large that requests wait longer than the send timeout (3 s) makes the
producer retry, and the retries crowd out the rest: compare with a smaller `--in-flight`
before reading a collapse as the cluster's limit.

`--api batch` hands the same load over as `send_batch` calls of `--batch` messages, each
to one queue of one topic, `--in-flight // --batch` of them at a time; call `k` goes to
topic `k mod topics` and, every time the topics come round again, the next queue, so
the calls cycle over every topic and then every queue. The message count rounds up to
whole batches; `queues_sent_to` says how many queues a phase reached (at most one per
call: a phase touches every queue only with `--messages` of at least `--batch` x topics
x `--queues`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
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
    create_topics,
    emit,
    freeze_gc,
    progress,
    progress_delta,
    raft_progress,
    run_id,
    run_on_target,
    send_batches,
    send_singles,
    single_producer_options,
)

__all__ = ["build_parser", "main", "run_topics"]

RATIO_TARGET = 0.9


def phase_messages(args: argparse.Namespace) -> int:
    """Messages each phase sends: `--messages`, rounded up to whole batches for the batch api."""
    if args.api == "batch":
        return -(-args.messages // args.batch) * args.batch
    return int(args.messages)


def batch_targets(names: list[str], queues: int) -> list[tuple[str, int]]:
    """(topic, queue) of the batch api's calls in turn: every topic on queue 0, then every
    topic on queue 1, and so on."""
    n = len(names)
    return [(names[k % n], k // n) for k in range(n * queues)]


async def _phase(
    admin: Any, namesrv: str, names: list[str], args: argparse.Namespace,
    node_cpu: Callable[[], float] | None,
) -> dict[str, Any]:
    """Send `args.messages` round-robin over `names`; throughput, ack latency, and the
    Raft entries, elections, fsyncs and CPU (the client's, and every node's when local)
    the sending cost."""
    from raftmq.client import Producer

    payload = b"x" * args.size
    acks = Acks()
    batched = args.api == "batch"
    messages = phase_messages(args)
    batches = messages // args.batch
    tasks = batch_tasks(args.in_flight, args.batch, batches)
    if batched:
        options = batch_producer_options(args.batch, tasks)
    else:
        options = single_producer_options(args, args.in_flight)
    targets = batch_targets(names, args.queues) if batched else []
    async with Producer(namesrv, **options) as producer:
        limiter = anyio.CapacityLimiter(args.create_concurrency)

        async def warm(topic: str) -> None:
            async with limiter:
                await producer.send(topic, payload)

        t_warm = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for topic in names:
                tg.start_soon(warm, topic)
        warm_s = time.perf_counter() - t_warm
        freeze_gc()

        before = await raft_progress(admin)
        nodes_before = node_cpu() if node_cpu is not None else 0.0
        client_before = time.process_time()
        t_start = time.perf_counter()
        if batched:
            await send_batches(producer, targets, [payload] * args.batch, batches, tasks, acks)
        else:
            await send_singles(producer, names, payload, messages, acks)
        await producer.flush()
        elapsed = time.perf_counter() - t_start
        client_s = time.process_time() - client_before
        nodes_s = node_cpu() - nodes_before if node_cpu is not None else None
        cost = progress_delta(before, await raft_progress(admin))
    acked = acks.acknowledged
    return {
        **acks.summary(elapsed, args.size),
        "queues_sent_to": min(batches, len(targets)) if batched else None,
        "warm_s": round(warm_s, 2),
        "raft_entries": cost["entries"],
        "msgs_per_entry": round(acked / cost["entries"], 1) if cost["entries"] else None,
        "entries_per_s": round(cost["entries"] / elapsed, 1),
        "elections": cost["elections"],
        "fsyncs": cost["fsyncs"],
        # what one message cost: the client (this process) and the cluster (every node)
        "client_cpu_us_per_msg": round(client_s * 1e6 / acked, 1) if acked else None,
        "node_cpu_us_per_msg": (round(nodes_s * 1e6 / acked, 1)
                                if acked and nodes_s is not None else None),
    }


def topic_counts(spec: str) -> list[int]:
    """The increasing topic counts of a `--topics` list such as "1,100,1000"."""
    try:
        counts = sorted({int(c) for c in spec.split(",") if c.strip()})
    except ValueError:
        counts = []
    if not counts or counts[0] < 1:
        raise ValueError(f"--topics {spec!r}: list positive topic counts, e.g. 1,100,1000")
    return counts


async def _cluster_view_ms(admin: Any) -> float:
    """Milliseconds the name server takes to answer CLUSTER (it lists every topic)."""
    t0 = time.perf_counter()
    await admin.describe_cluster()
    return round((time.perf_counter() - t0) * 1000, 1)


async def _drive(namesrv: str, args: argparse.Namespace,
                 node_cpu: Callable[[], float] | None = None) -> dict[str, Any]:
    from raftmq.client import Admin

    counts = topic_counts(args.topics)
    prefix = f"{args.topic}-{run_id()}"
    names: list[str] = []
    phases: list[dict[str, Any]] = []
    async with Admin(namesrv, timeout=30.0) as admin:
        for count in counts:
            new = [f"{prefix}-{i}" for i in range(len(names), count)]
            progress("topics", f"creating {len(new):,} topics ({count:,} in all)")
            created = await create_topics(admin, new, args.queues,
                                          concurrency=args.create_concurrency,
                                          wait=args.route_timeout)
            names += new
            total_create = created["create_s"] + created["route_s"]
            phase: dict[str, Any] = {
                "topics": count,
                "queues_total": count * args.queues,
                "created": len(new),
                "create_s": created["create_s"],
                "route_s": created["route_s"],
                "topics_created_per_s": round(len(new) / total_create, 1) if total_create else None,
            }
            phases.append(phase)
            if created["routed"] < len(new):
                # unroutable topics cannot be sent to: the phase (and the run) ends here
                phase["error"] = (f"{len(new) - created['routed']:,} of {len(new):,} new "
                                  f"topics not routed after {args.route_timeout:g} s")
                progress("topics", phase["error"])
                break
            progress("topics", f"sending {phase_messages(args):,} messages over {count:,} "
                               f"topics ({args.api} api)")
            phase.update(await _phase(admin, namesrv, names, args, node_cpu))
            phase["cluster_view_ms"] = await _cluster_view_ms(admin)
    sent = [ph for ph in phases if "msgs_per_s" in ph]
    base = sent[0]["msgs_per_s"] if sent and sent[0]["topics"] == 1 else None
    for ph in sent:
        ph["ratio_to_one_topic"] = round(ph["msgs_per_s"] / base, 3) if base else None
    met: bool | None = None
    if base and counts[-1] >= 10_000:  # judged only where the issue sets the target
        last = phases[-1]
        met = "error" not in last and last["ratio_to_one_topic"] >= RATIO_TARGET
    return {
        "benchmark": "topics",
        "api": args.api,
        "batch_messages": args.batch if args.api == "batch" else None,
        "concurrent_batches": (batch_tasks(args.in_flight, args.batch,
                                           phase_messages(args) // args.batch)
                               if args.api == "batch" else None),
        "messages_per_phase": phase_messages(args),
        "size_bytes": args.size,
        "queues_per_topic": args.queues,
        "create_concurrency": args.create_concurrency,
        "in_flight": args.in_flight,
        "phases": phases,
        "errors": sum(ph.get("errors", 0) for ph in phases),
        "failed_phase": next((ph["topics"] for ph in phases if "error" in ph), None),
        "target": {"ratio_at_10000_topics": RATIO_TARGET, "met": met},
    }


def run_topics(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark against `--namesrv` or a local cluster started (and stopped) here."""
    def drive(target: Any, a: argparse.Namespace) -> Awaitable[dict[str, Any]]:
        local = target.local
        node_cpu = None if local is None else (lambda: cpu_seconds(local.node_pids()))
        return _drive(target.namesrv, a, node_cpu)

    return run_on_target(args, drive)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench topics", description=__doc__.split("\n\n")[0])
    p.add_argument("--topics", default="1,100,1000",
                   help="comma-separated topic counts (the issue's: 1,100,1000,10000)")
    p.add_argument("--queues", type=int, default=4, help="queues per topic")
    p.add_argument("--messages", type=int, default=20_000, help="messages per topic count")
    p.add_argument("--size", type=int, default=100, help="message body bytes")
    p.add_argument("--topic", default="scale", help="prefix of the topic names")
    p.add_argument("--create-concurrency", type=int, default=64,
                   help="topic creations (and warm-up sends) in flight")
    p.add_argument("--route-timeout", type=float, default=120.0,
                   help="seconds to wait for the name servers to route new topics")
    add_api_arg(p)
    add_producer_args(p)
    add_cluster_args(p)
    return p


def _table(r: dict[str, Any]) -> Any:
    from rich.table import Table

    how = ("send_async" if r["api"] == "single"
           else f"send_batch of {r['batch_messages']}, {r['concurrent_batches']} in flight")
    t = Table(title=f"topics: {r['messages_per_phase']:,} x {r['size_bytes']} B per count, "
                    f"{r['queues_per_topic']} queues per topic, {how}")
    for col in ("topics", "msgs/s", "ratio", "p99 ms", "create s", "route s", "CLUSTER ms",
                "errors"):
        t.add_column(col, justify="right")
    for ph in r["phases"]:
        if "error" in ph:
            t.add_row(f"{ph['topics']:,}", "-", "-", "-", str(ph["create_s"]), str(ph["route_s"]),
                      "-", ph["error"])
            continue
        t.add_row(f"{ph['topics']:,}", f"{ph['msgs_per_s']:,.0f}", str(ph["ratio_to_one_topic"]),
                  str(ph["latency_ms"]["p99"]), str(ph["create_s"]), str(ph["route_s"]),
                  str(ph["cluster_view_ms"]), str(ph["errors"]))
    return t


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        topic_counts(args.topics)
    except ValueError as exc:
        parser.error(str(exc))
    result = run_topics(args)
    emit(result, args.json, _table)
    return 0 if result["errors"] == 0 and result["failed_phase"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
