"""Produce throughput of H hosts x S shards on one machine, driven by producer processes.

`raftmq bench scale` (or `python -m bench.scale`) starts a local cluster of `--hosts` hosts
of `--shards` shard processes each (`LocalCluster(hosts=H, shards=S)`: no two replicas of
a group on one host, leaders spread over every shard), or today's layout of plain node
processes (`--nodes N`), with `--groups` groups (default: one per process, so every shard
leads one) and a topic of `--queues` queues spread over all of them (default: four per
group). `--producers` producer *processes* (not tasks: one Python process uses one core)
drive it for `--seconds` after `--warmup` seconds of the same load, each with

- `--api batch` (default): `Producer.send_batch` of `--batch` messages (256) of `--size`
  bytes (100), `--in-flight // --batch` calls in flight per producer, the calls going
  round-robin over every queue; latency is per call (send_batch to its return), or
- `--api async`: `Producer.send_async`, one message per call, `--in-flight` messages
  pending per producer, the producer batching them; latency is per message.

`--rate` caps the load (messages/s, all producers together), so "p99 at half the maximum
rate" is one more run; `--half-load` makes that run itself: after each full-speed run it
drives the same cluster again at half the rate just measured and reports it beside.

Reported per run (one JSON object with `--json`): acknowledged msgs/s (acks that arrived
inside the measured window), p50/p99/p999 latency, the CPU busy (cores, from /proc
utime+stime) of every shard process with the groups it leads and of every producer
process, the node CPU per message (µs, every replica of the whole cluster), Raft entries
committed and messages per entry, and the machine's CPU count and load average before
and after. `--compare LAYOUT` runs a second layout in the same invocation (`nodes=3`, the
default when given bare, or `hosts=3,shards=2`, optionally `,groups=G`), both `--repeat`
times interleaved (A B A B ...), and reports the median of each and the ratios
this/other: on one machine `--hosts 3 --shards 1 --compare` says what one shard per host
costs against today's node (the issue asks for within 5 %).

Running it on a many-core machine (the target of issue 32): on a quiet 16-core machine,

    python -m bench.scale --hosts 3 --shards 5 --producers 8 --api batch --seconds 20 --json
    python -m bench.scale --hosts 3 --shards 5 --producers 8 --api batch --seconds 20 \\
        --compare nodes=3 --half-load --json

15 shard processes and 8 producers oversubscribe 16 cores a little; watch each
producer's `cpu_cores` (near 1.0 means the producers are the limit: add some, or use
fewer shards) and each shard's. The target there: at least 1,100,000 acknowledged
msgs/s with `send_batch` of 256 (twice today's three-process ceiling of about 540,000),
node CPU per message no higher than with one shard per host, and p99 below 50 ms at half
that rate (`--half-load`, or `--rate 550000`). On a 2-core machine the shards and
producers share two cores, so only the comparison of layouts means anything there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from .common import (
    READY_TIMEOUT,
    Pacer,
    batch_producer_options,
    batch_tasks,
    cpu_seconds,
    emit,
    freeze_gc,
    machine,
    positive_int,
    progress,
    progress_delta,
    raft_progress,
    run_id,
)

if TYPE_CHECKING:
    from rich.table import Table

    from raftmq.localcluster import LocalCluster

__all__ = ["Layout", "build_parser", "main", "merge_latency", "parse_layout", "run_scale"]

_PROJECT_ROOT = Path(__file__).resolve().parents[1]
_BUCKET = 1e-5  # latencies travel between processes in 10 µs buckets
APIS = ("batch", "async")


# ---------------------------------------------------------------- layouts


class Layout:
    """A cluster shape: `hosts` x `shards` shard processes, or `nodes` plain nodes (today's
    layout, `hosts` None), with `groups` groups (None: one per process)."""

    def __init__(self, *, hosts: int | None = None, shards: int = 1, nodes: int | None = None,
                 groups: int | None = None) -> None:
        if (hosts is None) == (nodes is None):
            raise ValueError("a layout has either hosts (and shards) or nodes")
        self.hosts, self.shards, self.nodes = hosts, shards, nodes
        self.processes = hosts * shards if hosts is not None else int(nodes or 0)
        self.groups = groups or self.processes

    @property
    def label(self) -> str:
        shape = (f"hosts={self.hosts},shards={self.shards}" if self.hosts is not None
                 else f"nodes={self.nodes}")
        return f"{shape},groups={self.groups}"

    def cluster(self, base: Path, fsync: str) -> LocalCluster:
        from raftmq.localcluster import LocalCluster

        if self.hosts is not None:
            return LocalCluster(base, hosts=self.hosts, shards=self.shards, groups=self.groups,
                                fsync=fsync)
        return LocalCluster(base, nodes=self.nodes, groups=self.groups, fsync=fsync)


def parse_layout(text: str) -> Layout:
    """`nodes=3`, `hosts=3,shards=2` or either with `,groups=G`."""
    keys: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or name not in ("nodes", "hosts", "shards", "groups"):
            raise argparse.ArgumentTypeError(
                f"{text!r}: a layout is nodes=N or hosts=H,shards=S (optionally ,groups=G)")
        try:
            keys[name] = positive_int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {name} must be a whole number") from None
    if "nodes" in keys and ("hosts" in keys or "shards" in keys):
        raise argparse.ArgumentTypeError(f"{text!r}: give nodes, or hosts and shards")
    if "nodes" not in keys and "hosts" not in keys:
        raise argparse.ArgumentTypeError(f"{text!r}: name nodes=N or hosts=H")
    try:
        return Layout(hosts=keys.get("hosts"), shards=keys.get("shards", 1),
                      nodes=keys.get("nodes"), groups=keys.get("groups"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ---------------------------------------------------------------- latencies


def merge_latency(histograms: list[dict[str, int]],
                  points: tuple[str, ...] = ("p50", "p99", "p999")) -> dict[str, float]:
    """Nearest-rank percentiles (ms, 0.01) of latencies given as `{bucket: count}` with
    10 µs buckets, merged over every producer process."""
    total: Counter[int] = Counter()
    for h in histograms:
        for k, n in h.items():
            total[int(k)] += n
    n = sum(total.values())
    ps = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p999": 99.9, "max": 100.0}
    out: dict[str, float] = {}
    ordered = sorted(total.items())
    for name in points:
        rank = min(n - 1, int(ps[name] / 100 * n)) if n else -1
        value = 0.0
        seen = 0
        for bucket, count in ordered:
            seen += count
            if seen > rank:
                value = bucket * _BUCKET
                break
        out[name] = round(value * 1000, 2)
    return out


# ---------------------------------------------------------------- producer processes


def _worker(spec: dict[str, Any]) -> None:
    """A producer process: connect, say `{"ready": true}`, read `{"start", "end"}`
    (`time.monotonic()`, one clock for every process of the machine) from stdin, send
    from then until `end`, and print what was acknowledged inside [start, end]."""
    print(json.dumps(anyio.run(_drive, spec)), flush=True)


async def _drive(spec: dict[str, Any]) -> dict[str, Any]:
    from raftmq.client import Producer

    size, batch, api = int(spec["size"]), int(spec["batch"]), spec["api"]
    topic, queues, rate = spec["topic"], int(spec["queues"]), float(spec["rate"])
    in_flight = int(spec["in_flight"])
    payload = b"x" * size
    hist: Counter[int] = Counter()
    counts = {"acked": 0, "errors": 0, "sent_calls": 0}
    first_error: list[str] = []
    window = [0.0, 0.0]

    def record(t0: float, t1: float, messages: int) -> None:
        if window[0] <= t1 <= window[1]:
            counts["acked"] += messages
            hist[int((t1 - t0) / _BUCKET)] += 1

    def failed(exc: BaseException, messages: int) -> None:
        counts["errors"] += messages
        if not first_error:
            first_error.append(repr(exc))

    if api == "batch":
        tasks = batch_tasks(in_flight, batch)
        options = batch_producer_options(batch, tasks)
    else:
        tasks = 0
        options = {"linger_ms": 0.0, "batch_max_messages": batch, "max_in_flight": 4,
                   "max_pending": in_flight}
    async with Producer(spec["namesrv"], **options) as producer:
        for _ in range(10):  # learn routes, open connections
            await producer.send(topic, payload)
        print(json.dumps({"ready": True}), flush=True)
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        go = json.loads(line)
        window[:] = [float(go["start"]), float(go["end"])]
        end = window[1]
        freeze_gc()
        if api == "batch":
            bodies = [payload] * batch
            targets = [(topic, q) for q in range(queues)]
            first = int(spec["index"]) * max(1, queues // max(1, int(spec["producers"])))
            t_go = time.monotonic()
            slot = [0]
            call_rate = rate / batch

            async def task() -> None:
                while True:
                    i = slot[0]
                    slot[0] += 1
                    if call_rate:  # a shared schedule: call i is due at t_go + i / rate
                        wait = t_go + i / call_rate - time.monotonic()
                        if wait > 0:
                            await anyio.sleep(wait)
                    t0 = time.monotonic()
                    if t0 >= end:
                        return
                    topic_, q = targets[(first + i) % len(targets)]
                    counts["sent_calls"] += 1
                    try:
                        await producer.send_batch(topic_, bodies, queue=q)
                    except Exception as exc:  # counted, reported; the run goes on
                        failed(exc, batch)
                    else:
                        record(t0, time.monotonic(), batch)

            async with anyio.create_task_group() as tg:
                for _ in range(tasks):
                    tg.start_soon(task)
        else:
            def timed(t0: float) -> Any:
                def done(fut: Any) -> None:
                    exc = fut.exception()
                    if exc is not None:
                        failed(exc, 1)
                    else:
                        record(t0, time.monotonic(), 1)
                return done

            pacer = Pacer(rate)
            while time.monotonic() < end:
                for _ in range(await pacer.due()):
                    t0 = time.monotonic()
                    fut = await producer.send_async(topic, payload)
                    fut.add_done_callback(timed(t0))
                    counts["sent_calls"] += 1
        with anyio.move_on_after(30):
            await producer.flush()
    return {"acked": counts["acked"], "errors": counts["errors"],
            "first_error": first_error[0] if first_error else None,
            "calls": counts["sent_calls"], "concurrent_batches": tasks or None,
            "latency_hist": {str(k): v for k, v in hist.items()}}


class _Producers:
    """`n` `_worker` processes; `start()` waits for every one to be connected."""

    def __init__(self, n: int, spec: dict[str, Any]) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(_PROJECT_ROOT) + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        code = "import json, sys; from bench.scale import _worker; _worker(json.loads(sys.argv[1]))"
        self.procs = [
            subprocess.Popen([sys.executable, "-c", code,
                              json.dumps({**spec, "index": i, "producers": n})],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for i in range(n)
        ]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def wait_ready(self) -> None:
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if '"ready"' not in line:
                raise RuntimeError(f"a producer process did not start (exit code {p.poll()})")

    def go(self, start: float, end: float) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps({"start": start, "end": end}) + "\n")
            p.stdin.flush()

    def results(self, timeout: float) -> list[dict[str, Any]]:
        out = []
        for p in self.procs:
            try:
                stdout, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, _ = p.communicate()
            lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"a producer process failed (exit code {p.returncode})")
            out.append(json.loads(lines[-1]))
        return out

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# ---------------------------------------------------------------- one run


def _phase(cluster: LocalCluster, topic: str, queues: int, args: argparse.Namespace,
           rate: float) -> dict[str, Any]:
    """Drive `cluster` with `--producers` processes at `rate` (0: as fast as they go)."""
    spec = {"namesrv": cluster.namesrv_addr, "topic": topic, "queues": queues,
            "size": args.size, "batch": args.batch, "api": args.api,
            "in_flight": args.in_flight, "rate": rate / args.producers}
    leaders = cluster.leaders()
    shard_pids = {i: cluster.pid(i) for i in cluster.node_ids}
    producers = _Producers(args.producers, spec)
    try:
        producers.wait_ready()
        start = time.monotonic() + args.warmup
        end = start + args.seconds
        producers.go(start, end)
        time.sleep(max(0.0, start - time.monotonic()))
        t0 = time.monotonic()
        node_cpu0 = {i: cpu_seconds([p]) for i, p in shard_pids.items() if p}
        prod_cpu0 = [cpu_seconds([p]) for p in producers.pids]
        before = anyio.run(_progress, cluster.namesrv_addr)
        time.sleep(max(0.0, end - time.monotonic()))
        t1 = time.monotonic()
        node_cpu1 = {i: cpu_seconds([p]) for i, p in shard_pids.items() if p}
        prod_cpu1 = [cpu_seconds([p]) for p in producers.pids]
        after = anyio.run(_progress, cluster.namesrv_addr)
        results = producers.results(timeout=60.0)
    finally:
        producers.kill()
    wall = t1 - t0
    acked = sum(r["acked"] for r in results)
    node_cpu = {i: node_cpu1[i] - node_cpu0[i] for i in node_cpu0}
    total_cpu = sum(node_cpu.values())
    entries = progress_delta(before, after)["entries"]
    leads: dict[int, list[str]] = {}
    for gid, n in leaders.items():
        if n is not None:
            leads.setdefault(n, []).append(gid)
    hosted = Counter(n for g in cluster.groups for n in g.replicas)
    per_shard: list[dict[str, Any]] = [
        {"node": i, "host": cluster.host_of(i), "leads": sorted(leads.get(i, [])),
         "replicas": hosted[i], "cpu_cores": round(node_cpu.get(i, 0.0) / wall, 3)}
        for i in cluster.node_ids]
    return {
        "rate_cap_msgs_per_s": rate or None,
        "seconds": round(wall, 3),
        "acknowledged": acked,
        "errors": sum(r["errors"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), None),
        "msgs_per_s": round(acked / args.seconds, 1),
        "latency_of": "send_batch call" if args.api == "batch" else "message",
        "latency_ms": merge_latency([r["latency_hist"] for r in results]),
        "node_cpu_cores": round(total_cpu / wall, 3),
        "node_cpu_us_per_msg": round(total_cpu / acked * 1e6, 2) if acked else None,
        "raft_entries": entries,
        "msgs_per_entry": round(acked / entries, 1) if entries else None,
        "per_shard": per_shard,
        "idle_shards": [s["node"] for s in per_shard if s["cpu_cores"] < 0.02],
        "producer_cpu_cores": [round((b - a) / wall, 3)
                               for a, b in zip(prod_cpu0, prod_cpu1, strict=True)],
        "concurrent_batches_per_producer": results[0]["concurrent_batches"],
        "leaders_after": {g: n for g, n in sorted(cluster.leaders().items())},
    }


async def _progress(namesrv: str) -> dict[str, Any]:
    from raftmq.client import Admin

    async with Admin(namesrv) as admin:
        return await raft_progress(admin)


async def _create_topic(namesrv: str, topic: str, queues: int) -> None:
    from raftmq.client import Admin

    async with Admin(namesrv) as admin:  # queues spread over the groups; waits for routes
        await admin.create_topic(topic, queues)


def run_layout(layout: Layout, args: argparse.Namespace) -> dict[str, Any]:
    """Start `layout`, drive it (and again at half the rate with `--half-load`), stop it."""
    queues = args.queues or 4 * layout.groups
    before = machine()
    parent = args.data_dir
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    progress("scale", f"{layout.label}: starting {layout.processes} node processes")
    with tempfile.TemporaryDirectory(prefix="raftmq-bench-", dir=parent) as tmp:
        with layout.cluster(Path(tmp), args.fsync) as cluster:
            cluster.wait_ready(timeout=READY_TIMEOUT)
            cluster.wait_preferred_leaders(READY_TIMEOUT)
            topic = f"scale-{run_id()}"
            anyio.run(_create_topic, cluster.namesrv_addr, topic, queues)
            progress("scale", f"{layout.label}: {args.producers} producers, {args.api} api, "
                              f"{args.seconds:g} s")
            full = _phase(cluster, topic, queues, args, args.rate)
            half = None
            if args.half_load and full["msgs_per_s"]:
                progress("scale", f"{layout.label}: again at half, "
                                  f"{full['msgs_per_s'] / 2:,.0f} msgs/s")
                half = _phase(cluster, topic, queues, args, full["msgs_per_s"] / 2)
            exits = cluster.unexpected_exits()
    return {
        "layout": layout.label,
        "hosts": layout.hosts, "shards": layout.shards, "nodes": layout.processes,
        "groups": layout.groups, "queues": queues, "replicas": 3, "fsync": args.fsync,
        **full,
        "half_load": half,
        "unexpected_exits": exits or None,
        "machine": before,
        "loadavg_1m_after": machine()["loadavg_1m"],
    }


_SUMMARY_KEYS = ("msgs_per_s", "node_cpu_us_per_msg")


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of one layout."""
    out: dict[str, Any] = {"runs": len(runs)}
    for key in _SUMMARY_KEYS:
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = round(statistics.median(values), 2) if values else None
    for point in ("p50", "p99"):
        out[f"{point}_ms"] = round(statistics.median(r["latency_ms"][point] for r in runs), 2)
    halves = [r["half_load"] for r in runs if r["half_load"]]
    if halves:
        out["half_load_p99_ms"] = round(
            statistics.median(h["latency_ms"]["p99"] for h in halves), 2)
    out["loadavg_1m"] = [r["machine"]["loadavg_1m"] for r in runs]
    return out


def run_scale(args: argparse.Namespace) -> dict[str, Any]:
    """Every run of the invocation: the main layout `--repeat` times, interleaved with the
    `--compare` layout's runs when there is one, and the medians and ratios."""
    main = (Layout(nodes=args.nodes, groups=args.groups) if args.nodes
            else Layout(hosts=args.hosts, shards=args.shards, groups=args.groups))
    other: Layout | None = None
    if args.compare is not None:
        other = parse_layout(args.compare)
        if args.groups and "groups=" not in args.compare:
            other.groups = args.groups
    runs: list[dict[str, Any]] = []
    compared: list[dict[str, Any]] = []
    for _ in range(args.repeat):
        runs.append(run_layout(main, args))
        if other is not None:
            compared.append(run_layout(other, args))
    result: dict[str, Any] = {
        "benchmark": "scale", "api": args.api, "producers": args.producers,
        "batch": args.batch, "size_bytes": args.size, "in_flight_per_producer": args.in_flight,
        "rate": args.rate or None, "layout": main.label, "runs": runs,
        "summary": _summary(runs),
    }
    if other is not None:
        result["compare"] = {"layout": other.label, "runs": compared,
                             "summary": _summary(compared)}
        a, b = result["summary"], result["compare"]["summary"]
        result["ratio"] = {  # this layout / the compared one
            key: round(a[key] / b[key], 3) if a.get(key) and b.get(key) else None
            for key in ("msgs_per_s", "node_cpu_us_per_msg", "p50_ms", "p99_ms")}
    every = runs + compared
    result["errors"] = sum(r["errors"] + (r["half_load"] or {}).get("errors", 0) for r in every)
    result["acknowledged"] = sum(r["acknowledged"] for r in every)
    return result


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench scale",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--hosts", type=positive_int, default=3, help="hosts (default 3)")
    p.add_argument("--shards", type=positive_int, default=1,
                   help="shard processes per host (default 1)")
    p.add_argument("--nodes", type=positive_int,
                   help="today's layout instead: this many plain node processes, no hosts")
    p.add_argument("--groups", type=positive_int,
                   help="groups (default: one per node process)")
    p.add_argument("--queues", type=positive_int, help="queues of the topic (default 4 per group)")
    p.add_argument("--producers", type=positive_int, default=2, help="producer processes")
    p.add_argument("--api", choices=APIS, default="batch",
                   help="batch: send_batch of --batch messages (default); async: send_async")
    p.add_argument("--batch", type=positive_int, default=256,
                   help="messages per send_batch call (async: the producer's batch limit)")
    p.add_argument("--size", type=positive_int, default=100, help="message bytes (default 100)")
    p.add_argument("--in-flight", type=positive_int, default=8192,
                   help="messages in flight per producer (batch: in-flight // batch calls)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="cap, messages/s of all producers together (default: none)")
    p.add_argument("--half-load", action="store_true",
                   help="after each run, drive the same cluster at half the rate measured")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=2.0,
                   help="seconds of load before the measured window")
    p.add_argument("--compare", nargs="?", const="nodes=3", metavar="LAYOUT",
                   help="also run LAYOUT (nodes=N or hosts=H,shards=S[,groups=G]; bare: "
                        "nodes=3) and report the ratios this/LAYOUT")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="runs of each layout, interleaved with --compare's (medians reported)")
    p.add_argument("--fsync", choices=["always", "interval"], default="always")
    p.add_argument("--data-dir", type=Path,
                   help="parent of the clusters' temporary directories (default: $TMPDIR)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _table(result: dict[str, Any]) -> Table:
    from rich.table import Table

    t = Table(title=f"scale: {result['producers']} producers, {result['api']} api, "
                    f"batch {result['batch']}, {result['size_bytes']} B")
    for col in ("layout", "msgs/s", "p50 ms", "p99 ms", "node cores", "node µs/msg",
                "producer cores", "load 1m"):
        t.add_column(col, justify="right")
    every = list(result["runs"]) + list((result.get("compare") or {}).get("runs", []))
    for r in every:
        t.add_row(r["layout"], f"{r['msgs_per_s']:,.0f}", str(r["latency_ms"]["p50"]),
                  str(r["latency_ms"]["p99"]), str(r["node_cpu_cores"]),
                  str(r["node_cpu_us_per_msg"]), str(sum(r["producer_cpu_cores"])),
                  str(r["machine"]["loadavg_1m"]))
    if result.get("ratio"):
        t.caption = f"this/compared (medians): {result['ratio']}"
    return t


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rate < 0:
        raise SystemExit("raftmq bench scale: --rate must not be negative")
    result = run_scale(args)
    emit(result, args.json, _table)
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
