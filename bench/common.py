"""What the cluster benchmarks share: a cluster to run against, pacing, percentiles, output.

Every benchmark either starts its own cluster on loopback (three node processes, three
groups of three replicas, `fsync=always`, leaders spread one per node) and stops every
process it started, or uses a running one named by `--namesrv`. The figures of a run are
only comparable with the conditions they were measured under, so each result carries the
cluster layout and the machine's CPU count and load average at the start.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

if TYPE_CHECKING:
    from rich.table import Table

    from raftmq.client import Admin, Producer
    from raftmq.localcluster import LocalCluster

__all__ = [
    "APIS",
    "READY_TIMEOUT",
    "Acks",
    "Pacer",
    "Target",
    "add_api_arg",
    "add_batching_args",
    "add_cluster_args",
    "add_producer_args",
    "batch_producer_options",
    "batch_tasks",
    "cpu_seconds",
    "create_topics",
    "emit",
    "freeze_gc",
    "latency_ms",
    "machine",
    "percentile",
    "positive_int",
    "progress",
    "progress_delta",
    "raft_progress",
    "run_id",
    "run_on_target",
    "send_batches",
    "send_singles",
    "single_producer_options",
    "target_cluster",
]

READY_TIMEOUT = 60.0  # generous: the machine may be shared with other runs


# ---------------------------------------------------------------- statistics


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The nearest-rank `p`th percentile of already sorted values (0.0 for none)."""
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))
    return sorted_values[k]


_POINTS = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9, "max": 100.0}


def latency_ms(
    seconds: Sequence[float], points: Sequence[str] = ("p50", "p99", "p999")
) -> dict[str, float]:
    """Percentiles of latencies given in seconds, in milliseconds rounded to 0.01."""
    ordered = sorted(seconds)
    return {name: round(percentile(ordered, _POINTS[name]) * 1000, 2) for name in points}


def machine() -> dict[str, Any]:
    """What the figures depend on besides the code: CPUs and how busy they already were."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {"cpus": os.cpu_count(), "loadavg_1m": round(load[0], 2),
            "python": platform.python_version()}


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU seconds the processes `pids` (all their threads) have used,
    from /proc; a process that is gone counts 0."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def run_id() -> str:
    """A short random suffix, so names of one run never meet those of an earlier one on
    a shared cluster."""
    return uuid.uuid4().hex[:8]


GC_THRESHOLDS = (50_000, 20, 100)
"""The load generator's collector thresholds. Every message allocates a few objects that
live for the few milliseconds until its acknowledgement; with the default (700, 10, 10)
nearly all of them survived into generation 1, whose collections took 2-3 ms each and
lined up with the acknowledgement-latency spikes. Allocation-heavy Python services raise
them the same way; the nodes keep the defaults."""


def freeze_gc() -> None:
    """Everything alive now (interpreter, modules, clients) is long-lived: keep the
    collector from rescanning it while many sends are in flight, and collect the young
    generation less often (`GC_THRESHOLDS`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


# ---------------------------------------------------------------- the cluster


@dataclass
class Target:
    """The cluster a benchmark drives: its name server, how it was set up (merged into
    the result) and, when the benchmark started it, the `LocalCluster` itself."""

    namesrv: str
    info: dict[str, Any]
    local: LocalCluster | None = None
    data_dirs: list[Path] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)  # as found before the run


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """The options every cluster benchmark has: where the cluster is, its shape, output."""
    p.add_argument("--namesrv", help="use a running cluster instead of starting one")
    p.add_argument("--groups", type=int, default=3, help="groups of the local cluster")
    p.add_argument("--fsync", choices=["always", "interval"], default="always")
    p.add_argument("--data-dir", type=Path,
                   help="parent of the local cluster's temporary directory (default: $TMPDIR)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_producer_args(p: argparse.ArgumentParser) -> None:
    """The producer's window and batching options, shared by the load-driving benchmarks.

    With `--api batch` the window is whole `send_batch` calls (`--in-flight // --batch` of
    them, at least one) and the producer runs with `batch_producer_options`, so
    `--batches-in-flight` and `--linger-ms` apply to the single api only."""
    p.add_argument("--in-flight", type=int, default=8192,
                   help="messages awaiting their ack (batch api: in-flight // batch calls)")
    add_batching_args(p)


def add_batching_args(p: argparse.ArgumentParser) -> None:
    """How the producer forms batches (`--batch` is also the batch api's call size)."""
    p.add_argument("--batches-in-flight", type=int, default=4,
                   help="batches per queue in flight (single api)")
    p.add_argument("--batch", type=positive_int, default=512,
                   help="max messages per batch (batch api: messages per send_batch call)")
    p.add_argument("--linger-ms", type=float, default=0.0,
                   help="producer linger (single api; the batch api uses 0)")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return value


APIS = ("single", "batch")


def add_api_arg(p: argparse.ArgumentParser) -> None:
    """`--api`: how the load is handed to the producer. Both are real application patterns,
    so a result always says which one it measured."""
    p.add_argument("--api", choices=APIS, default="single",
                   help="single: Producer.send_async, one message per call, the producer "
                        "batches them (default); batch: Producer.send_batch of --batch "
                        "messages per call, all to one queue (one PRODUCE request)")


# ---------------------------------------------------------------- the batch api


def batch_tasks(in_flight: int, batch: int, batches: int | None = None) -> int:
    """Concurrent `send_batch` calls holding an in-flight window of `in_flight` messages:
    whole batches of `batch`, at least one, and no more than there are `batches`."""
    tasks = max(1, in_flight // batch)
    return tasks if batches is None else max(1, min(tasks, batches))


def batch_producer_options(batch: int, tasks: int) -> dict[str, Any]:
    """`Producer` options for `tasks` concurrent `send_batch` calls of `batch` messages: no
    linger (a batch arrives whole), one call's messages form one batch, and neither the
    per-queue batches in flight nor the pending sends ever hold back a call (every call
    may land on the same queue), so the calls themselves are the window."""
    return {"linger_ms": 0.0, "batch_max_messages": batch, "max_in_flight": tasks,
            "max_pending": tasks * batch}


@dataclass
class Acks:
    """The outcome of every message sent: ack latencies (seconds) and failures.

    `latencies` run from the send call to the ack, so they include any wait for room in
    the window; `in_flight` run from the moment the message held its place in the window
    (the call returned) to its ack: the round trip alone, what a peer's one-publish-at-a-
    time client measures. With one message in flight the first is about twice the second
    (each call waits for the previous message's ack)."""

    latencies: list[float] = field(default_factory=list)
    in_flight: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None

    def ok(self, seconds: float, messages: int = 1, in_flight: float | None = None) -> None:
        self.latencies.extend(repeat(seconds, messages))
        self.in_flight.extend(repeat(seconds if in_flight is None else in_flight, messages))

    def failed(self, exc: BaseException, messages: int = 1) -> None:
        self.errors += messages
        if self.first_error is None:
            self.first_error = repr(exc)

    @property
    def acknowledged(self) -> int:
        return len(self.latencies)

    def summary(self, seconds: float, size: int) -> dict[str, Any]:
        """The figures every load reports: counts, rate over `seconds`, ack latency."""
        acked = self.acknowledged
        return {
            "acknowledged": acked,
            "errors": self.errors,
            "first_error": self.first_error,
            "seconds": round(seconds, 3),
            "msgs_per_s": round(acked / seconds, 1),
            "mb_per_s": round(acked * size / seconds / 1e6, 2),
            "latency_ms": latency_ms(self.latencies),
            "in_flight_latency_ms": latency_ms(self.in_flight),
        }


def single_producer_options(args: argparse.Namespace, max_pending: int) -> dict[str, Any]:
    """`Producer` options of the single api from `add_batching_args`' options."""
    return {"linger_ms": args.linger_ms, "batch_max_messages": args.batch,
            "max_in_flight": args.batches_in_flight, "max_pending": max_pending}


async def send_singles(
    producer: Producer, topics: Sequence[str], payload: bytes, messages: int, acks: Acks,
) -> None:
    """Hand `messages` to `producer.send_async` one per call as fast as its window lets,
    message `i` to `topics[i % len(topics)]`, and record each one's latency (from its call,
    and from its place in the window, to its acknowledgement: see `Acks`) or failure. Call
    `producer.flush()` to wait for the last."""
    n = len(topics)

    def timed(t0: float, t_in: float) -> Callable[[Any], None]:
        def done(fut: Any) -> None:
            exc = fut.exception()
            if exc is not None:
                acks.failed(exc)
            else:
                t = time.perf_counter()
                acks.ok(t - t0, in_flight=t - t_in)
        return done

    for i in range(messages):
        t0 = time.perf_counter()
        fut = await producer.send_async(topics[i % n], payload)
        fut.add_done_callback(timed(t0, time.perf_counter()))  # runs at once if already done
        if i % 256 == 255:
            await anyio.sleep(0)  # a send that finds room never yields: let acks in


async def send_batches(
    producer: Producer, targets: Sequence[tuple[str, int]], batch: Sequence[bytes],
    batches: int, tasks: int, acks: Acks, **send_options: Any,
) -> None:
    """Make `batches` calls of `producer.send_batch(topic, batch, queue=q)` with `tasks`
    of them in flight, and record every message of a call with the call's latency (from
    the call to its return) or failure. `send_options` go to every call (a delay).

    Call `b` (0, 1, ...) goes to `targets[b % len(targets)]` and task `i` makes calls
    `i, i + tasks, i + 2 * tasks, ...`: every target gets its share of the calls, whether
    there are more tasks than targets or fewer.
    """
    n = len(targets)
    messages = len(batch)

    async def task(first: int) -> None:
        for b in range(first, batches, tasks):
            topic, queue = targets[b % n]
            t0 = time.perf_counter()
            try:
                await producer.send_batch(topic, batch, queue=queue, **send_options)
            except Exception as exc:  # counted, reported; the run goes on
                acks.failed(exc, messages)
            else:
                acks.ok(time.perf_counter() - t0, messages)

    async with anyio.create_task_group() as tg:
        for i in range(min(tasks, batches)):
            tg.start_soon(task, i)


def run_on_target(
    args: argparse.Namespace, drive: Callable[[Target, argparse.Namespace], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """Run `drive` against `--namesrv` or a local cluster started (and stopped) here, and
    add how the cluster was set up and the machine's state to its result."""
    with target_cluster(args) as target:
        result = anyio.run(drive, target, args)
        result.update(target.info, machine=target.machine)
        return result


@contextmanager
def target_cluster(
    args: argparse.Namespace,
    *,
    tick_ms: int | None = None,
    node_overrides: dict[str | int, Any] | None = None,
    settle: bool = True,
    tls: bool = False,
) -> Iterator[Target]:
    """The running cluster of `--namesrv`, or a local one started here and stopped (with
    its data removed) on the way out, whatever happens in between. With `settle`, a local
    cluster is handed over only once its preferred leaders lead (one group per node)."""
    conditions = machine()
    if args.namesrv:
        yield Target(args.namesrv, {"cluster": "external", "namesrv": args.namesrv},
                     machine=conditions)
        return
    from raftmq.localcluster import LocalCluster

    parent = getattr(args, "data_dir", None)
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    extra: dict[str, Any] = {} if tick_ms is None else {"tick_ms": tick_ms}
    with tempfile.TemporaryDirectory(prefix="raftmq-bench-", dir=parent) as tmp:
        with LocalCluster(Path(tmp), nodes=3, groups=args.groups, fsync=args.fsync,
                          node_overrides=node_overrides, tls=tls, **extra) as cluster:
            cluster.wait_ready(timeout=READY_TIMEOUT)
            if settle:
                cluster.wait_preferred_leaders(READY_TIMEOUT)
            info = {"cluster": "local", "nodes": 3, "groups": args.groups, "replicas": 3,
                    "fsync": args.fsync, "tls": tls}
            yield Target(cluster.namesrv_addr, info, cluster, [c.data for c in cluster.configs],
                         conditions)


async def create_topics(
    admin: Admin, names: Sequence[str], queues: int, *, concurrency: int = 64,
    wait: float = 120.0,
) -> dict[str, Any]:
    """Create `names` (`queues` queues each, spread over every group as `Admin` does) with
    at most `concurrency` creations in flight, then wait until the name servers route all.

    Each creation is one CREATE_TOPIC per hosting group, sent straight to the group's
    leader, so the figure is the cluster's own cost of committing the creations rather
    than that of the name-server round trips `Admin.create_topic` adds. Returns seconds to commit
    every creation (`create_s`), then to see every route (`route_s`), and how many of
    the topics the name servers route (`routed`) when `wait` ran out before all were.
    """
    from raftmq.client.admin import place_queues
    from wire.protocol import Code, RequestError
    from wire.requests import CreateTopicRequest

    cluster = await admin.describe_cluster(topics=False)
    groups = sorted(str(g) for g in (cluster.get("groups") or {}))
    if not groups:
        raise RequestError(Code.UNKNOWN_GROUP, "the name servers know no live group")
    placement = place_queues(queues, groups)
    limiter = anyio.CapacityLimiter(concurrency)
    routes = admin.routes

    async def create(topic: str) -> None:
        async with limiter:
            for group, hosted in placement.items():
                req = CreateTopicRequest(g=group, topic=topic, queues=queues,
                                         hosted=tuple(hosted))
                try:
                    await routes.call_group(group, req.OP, req.header(), attempts=6)
                except RequestError as exc:  # a retried creation that had been applied
                    if exc.code != Code.TOPIC_EXISTS or not exc.extra.get("same"):
                        raise

    seen: set[str] = set()

    async def routed(topic: str) -> None:
        async with limiter:
            while True:
                try:
                    route = await routes.route(topic, refresh=True)
                    if route.total == queues and len(route.queues) == queues:
                        seen.add(topic)
                        return
                except RequestError as exc:
                    if exc.code != Code.UNKNOWN_TOPIC and not exc.retriable:
                        raise
                await anyio.sleep(0.1)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(create, name)
    t1 = time.perf_counter()
    with anyio.move_on_after(wait):
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(routed, name)
    t2 = time.perf_counter()
    return {"create_s": round(t1 - t0, 3), "route_s": round(t2 - t1, 3), "routed": len(seen)}


async def raft_progress(admin: Admin) -> dict[str, Any]:
    """Each group's highest term and commit index and the fsyncs of every replica, from
    every node's STATUS: two of these around a run say how many Raft entries (hence
    messages per entry), elections and fsyncs the run cost."""
    from raftmq.client.routes import node_addresses
    from wire.protocol import RequestError

    terms: dict[str, int] = {}
    commits: dict[str, int] = {}
    fsyncs = 0
    for addr in node_addresses(await admin.describe_cluster(topics=False)):
        try:
            status = await admin.node_status(addr)
        except RequestError:
            continue
        for gid, g in (status.get("groups") or {}).items():
            terms[gid] = max(terms.get(gid, 0), int(g.get("term") or 0))
            commits[gid] = max(commits.get(gid, 0), int(g.get("commit") or 0))
            fsyncs += int(g.get("fsyncs") or 0)
    return {"term": terms, "commit": commits, "fsyncs": fsyncs}


def progress_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """Raft entries committed, elections held and fsyncs made between two `raft_progress`
    snapshots (a restarted node's fsync count starts again, so that one is a floor)."""
    def grew(key: str) -> int:
        return sum(max(0, v - before[key].get(g, v)) for g, v in after[key].items())

    return {"entries": grew("commit"), "elections": grew("term"),
            "fsyncs": max(0, after["fsyncs"] - before["fsyncs"])}


# ---------------------------------------------------------------- pacing


class Pacer:
    """Releases sends at a fixed rate (or as fast as asked, for rate 0).

    `await due()` returns how many sends are due now, sleeping until at least one is.
    Sleeping at most once per `tick` (1 ms) keeps the event loop from waking for every
    message at high rates; each send's scheduled time is `scheduled(i)`, so how far the
    sender fell behind its schedule can be reported next to the latencies.
    """

    def __init__(self, rate: float, *, tick: float = 0.001, burst: int = 64) -> None:
        if rate < 0:
            raise ValueError("rate must not be negative")
        self.rate = rate
        self.tick = tick
        self.burst = burst
        self.released = 0
        self.start = time.perf_counter()

    def scheduled(self, i: int) -> float:
        return self.start + i / self.rate if self.rate else self.start

    async def due(self) -> int:
        if not self.rate:
            await anyio.sleep(0)  # a checkpoint, so other tasks run between bursts
            self.released += self.burst
            return self.burst
        while True:
            now = time.perf_counter()
            n = int((now - self.start) * self.rate) + 1 - self.released
            if n > 0:
                self.released += n
                return n
            await anyio.sleep(max(self.tick, self.scheduled(self.released) - now))


# ---------------------------------------------------------------- output


def progress(benchmark: str, message: str) -> None:
    """A line on stderr, so a long run shows where it is without touching the JSON."""
    print(f"[{benchmark}] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def emit(result: dict[str, Any], as_json: bool, table: Callable[[dict[str, Any]], Table]) -> None:
    """Print the result: one JSON object on stdout, or the benchmark's rich table."""
    if as_json:
        print(json.dumps(result))
        sys.stdout.flush()
        return
    from rich.console import Console

    Console().print(table(result))
