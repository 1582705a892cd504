"""Consume throughput from hot and cold data, and catch-up reads under a produce load.

Default mode: fill a topic with `--messages` of `--size` bytes, read every queue from
offset 0 to its end with `--consumers` `PullConsumer`s (each reading its share of the
queues, one FETCH in flight per queue) while the data is still in the page cache (hot),
then evict it and read it again (cold). Eviction writes 1 to /proc/sys/vm/drop_caches
when that is allowed (root; it empties the whole machine's page cache), else, or with
`--cold-method fadvise`, calls `posix_fadvise(POSIX_FADV_DONTNEED)` on every CommitLog
file of every node's data directory; the result names the method and how much
of those files was resident before and after (from `mincore`). Each node keeps the last
32 MiB it served in memory, so the data per node must be well above that for a cold read
to reach the disk: the defaults write 256 MiB.

`--catch-up`: build a backlog of `--backlog-gb` (the issue asks for at least 5 GB; 1 by
default, for quick runs), start producers in a separate process that keep producing to
the same topic, measure their rate alone, evict the cache, then read the whole backlog
(everything up to the end at that moment) from offset 0 while they keep producing, and
measure them alone once more. Reported: catch-up read MB/s, and the producers' rate during
the catch-up as a fraction of their rate without readers, the mean of the windows before
and after, since a shared machine drifts (the targets: reads of at least 100 MB/s while
producers keep at least 80 % of their rate).

MB/s counts message bodies (1 MB = 10^6 bytes).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import subprocess
import sys
import threading
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

from .common import (
    Pacer,
    Target,
    add_cluster_args,
    emit,
    freeze_gc,
    progress,
    run_id,
    run_on_target,
)

__all__ = ["build_parser", "commitlog_files", "evict", "main", "resident_bytes", "run_consume"]

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
READ_MB_TARGET = 100.0
PRODUCER_FRACTION_TARGET = 0.8
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- page cache


def commitlog_files(data_dirs: list[Path]) -> list[Path]:
    """Every file under a `<data>/<group>/commitlog/` directory (segments and index)."""
    out: list[Path] = []
    for d in data_dirs:
        out += sorted(p for p in Path(d).glob("*/commitlog/*") if p.is_file())
    return out


def _libc() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_bytes(paths: list[Path]) -> tuple[int, int] | None:
    """(bytes in the page cache, total bytes) of `paths`, from mincore(2); None where
    that cannot be asked (not Linux, no libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = _libc()
    except (OSError, AttributeError):
        return None
    page = mmap.PAGESIZE
    resident = total = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # deleted meanwhile (retention, a rolled index)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                pages = (size + page - 1) // page
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(addr, size, vec) != 0:
                    return None
                resident += sum(b & 1 for b in vec) * page
                total += size
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return min(resident, total), total


def evict(method: str, data_dirs: list[Path]) -> dict[str, Any]:
    """Push the cluster's data out of the page cache with `method` ("auto",
    "drop_caches", "fadvise" or "none"); says which method ran and what was resident."""
    files = commitlog_files(data_dirs)
    before = resident_bytes(files) if files else None
    note = None
    if method == "auto":
        if os.geteuid() == 0 and DROP_CACHES.exists():
            method = "drop_caches"
        else:
            method = "fadvise" if files else "none"
    if method == "drop_caches":
        os.sync()
        try:
            DROP_CACHES.write_text("1\n")
        except OSError as exc:
            note = f"drop_caches refused ({exc}); used fadvise"
            method = "fadvise" if files else "none"
    if method == "fadvise":
        if not files:
            note = "no data directories known (--node-data): nothing evicted"
            method = "none"
        for path in files:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    after = resident_bytes(files) if files else None
    mb = 1e6
    return {
        "method": method,
        "note": note,
        "files": len(files),
        "file_mb": round(before[1] / mb, 1) if before else None,
        "resident_mb_before": round(before[0] / mb, 1) if before else None,
        "resident_mb_after": round(after[0] / mb, 1) if after else None,
    }


# ---------------------------------------------------------------- reading


async def read_queues(
    namesrv: str, topic: str, ranges: dict[int, tuple[int, int]], args: argparse.Namespace,
    group: str,
) -> dict[str, Any]:
    """Read [start, end) of every queue in `ranges` with `args.consumers` fresh pull
    consumers (one FETCH in flight per queue); messages, body bytes, seconds, rates."""
    from raftmq.client import PullConsumer, RequestError

    totals = {"messages": 0, "bytes": 0}

    async def read(consumer: PullConsumer, q: int, start: int, end: int) -> None:
        offset = start
        failures = 0
        while offset < end:
            try:
                res = await consumer.pull(topic, q, offset, max=args.pull_batch, wait_ms=0)
            except RequestError as exc:
                failures += 1
                if not exc.retriable or failures > 20:
                    raise
                await anyio.sleep(0.1)
                continue
            failures = 0
            msgs = [m for m in res.messages if m.offset < end]
            totals["messages"] += len(msgs)
            totals["bytes"] += sum(len(m.body) for m in msgs)
            offset = res.next_offset

    async with AsyncExitStack() as stack:
        consumers = [
            await stack.enter_async_context(
                PullConsumer(namesrv, f"{group}-{i}", wait_ms=0, max_bytes=args.max_bytes))
            for i in range(max(1, args.consumers))
        ]
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i, q in enumerate(sorted(ranges)):
                tg.start_soon(read, consumers[i % len(consumers)], q, *ranges[q])
        elapsed = time.perf_counter() - t0
    return {
        "messages": totals["messages"],
        "mb": round(totals["bytes"] / 1e6, 1),
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(totals["messages"] / elapsed, 1) if elapsed else 0.0,
        "mb_per_s": round(totals["bytes"] / 1e6 / elapsed, 1) if elapsed else 0.0,
    }


async def queue_ends(namesrv: str, topic: str, queues: int) -> dict[int, tuple[int, int]]:
    """[min, end) of every queue of `topic` now."""
    from raftmq.client import Admin

    async with Admin(namesrv) as admin:
        info = await admin.describe_topic(topic)
    out = {}
    for qi in info.queues:
        if qi.min_offset is None or qi.end_offset is None:
            raise RuntimeError(f"{topic}: queue {qi.queue} has no reachable leader")
        out[qi.queue] = (qi.min_offset, qi.end_offset)
    if len(out) != queues:
        raise RuntimeError(f"{topic}: {len(out)} of {queues} queues described")
    return out


# ---------------------------------------------------------------- producing


async def fill(namesrv: str, topic: str, *, messages: int | None, bytes_: int | None,
               size: int, in_flight: int) -> dict[str, Any]:
    """Send as fast as the bounds let until `messages` or `bytes_` are acknowledged."""
    from raftmq.client import Producer, SendFuture, SendResult

    want = messages if messages is not None else -(-(bytes_ or 0) // size)
    payload = os.urandom(size)
    errors: list[str] = []

    def done(fut: SendFuture[SendResult]) -> None:
        if fut.exception() is not None:
            errors.append(repr(fut.exception()))

    async with Producer(namesrv, batch_max_messages=512, max_in_flight=4,
                        max_pending=in_flight) as producer:
        await producer.send(topic, payload)
        t0 = time.perf_counter()
        for i in range(1, want):
            await producer.send_async(topic, payload, callback=done)
            if i % 256 == 0:
                await anyio.sleep(0)
        await producer.flush()
        elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"filling {topic}: {len(errors)} sends failed, first: {errors[0]}")
    return {"messages": want, "mb": round(want * size / 1e6, 1), "seconds": round(elapsed, 2),
            "mb_per_s": round(want * size / 1e6 / elapsed, 1)}


def _worker(spec: dict[str, Any]) -> None:
    """The producer process of `--catch-up`: sends until a line arrives on stdin (or it
    closes), printing `{"t", "msgs", "bytes", "errors"}` JSON lines every 0.25 s, where
    `t` is `time.monotonic()` (one clock for every process of the machine)."""
    from raftmq.client import Producer, SendFuture, SendResult

    counts = {"msgs": 0, "bytes": 0, "errors": 0}
    size = int(spec["size"])
    payload = os.urandom(size)

    def done(fut: SendFuture[SendResult]) -> None:
        if fut.exception() is not None:
            counts["errors"] += 1
        else:
            counts["msgs"] += 1
            counts["bytes"] += size

    def report() -> None:
        print(json.dumps({"t": time.monotonic(), **counts}), flush=True)

    async def run() -> None:
        async with Producer(spec["namesrv"], batch_max_messages=512,
                            max_in_flight=4, max_pending=int(spec["in_flight"])) as producer:
            async with anyio.create_task_group() as tg:

                async def stop_on_input() -> None:
                    await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                    tg.cancel_scope.cancel()

                async def reporter() -> None:
                    while True:
                        report()
                        await anyio.sleep(0.25)

                tg.start_soon(stop_on_input)
                tg.start_soon(reporter)
                freeze_gc()
                pacer = Pacer(float(spec["rate"]))
                while True:
                    for _ in range(await pacer.due()):
                        await producer.send_async(spec["topic"], payload, callback=done)
        report()

    anyio.run(run)


class ProducerProcess:
    """A `_worker` child and the samples it reports, read by a thread as they come."""

    def __init__(self, namesrv: str, topic: str, size: int, rate: float, in_flight: int) -> None:
        spec = {"namesrv": namesrv, "topic": topic, "size": size, "rate": rate,
                "in_flight": in_flight}
        env = dict(os.environ)
        env["PYTHONPATH"] = str(_PROJECT_ROOT) + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        code = "import json, sys; from bench.consume import _worker; _worker(json.loads(sys.argv[1]))"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(spec)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env,
        )
        self.samples: list[dict[str, float]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.samples.append(json.loads(line))
            except ValueError:
                continue

    def wait_samples(self, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.samples) < n:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the producer process reported {len(self.samples)} samples "
                                   f"(exit code {self.proc.poll()})")
            time.sleep(0.05)

    def rate(self, t0: float, t1: float) -> dict[str, float | None]:
        """Acknowledged msgs/s and MB/s between the first and last sample inside [t0, t1]
        (None when the window holds fewer than two reports)."""
        inside = [s for s in self.samples if t0 <= s["t"] <= t1]
        if len(inside) < 2:
            return {"msgs_per_s": None, "mb_per_s": None, "errors": None, "seconds": 0.0}
        a, b = inside[0], inside[-1]
        dt = b["t"] - a["t"]
        return {"msgs_per_s": round((b["msgs"] - a["msgs"]) / dt, 1),
                "mb_per_s": round((b["bytes"] - a["bytes"]) / 1e6 / dt, 1),
                "errors": b["errors"] - a["errors"], "seconds": round(dt, 2)}

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the child to stop, wait for its last report; kill it if it does not exit."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._thread.join(5.0)


# ---------------------------------------------------------------- the two modes


def _data_dirs(target: Target, args: argparse.Namespace) -> list[Path]:
    return list(target.data_dirs) + [Path(d) for d in (args.node_data or [])]


async def _hot_cold(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import Admin

    ns = target.namesrv
    topic = f"{args.topic}-{run_id()}"
    async with Admin(ns) as admin:
        await admin.create_topic(topic, args.queues)
    filled = await fill(ns, topic, messages=args.messages, bytes_=None, size=args.size,
                        in_flight=args.in_flight)
    ranges = await queue_ends(ns, topic, args.queues)
    freeze_gc()
    hot = await read_queues(ns, topic, ranges, args, f"hot-{run_id()}")
    cold: dict[str, Any] | None = None
    eviction = None
    if args.cold_method != "skip":
        eviction = await anyio.to_thread.run_sync(evict, args.cold_method, _data_dirs(target, args))
        cold = await read_queues(ns, topic, ranges, args, f"cold-{run_id()}")
    stored = sum(end - lo for lo, end in ranges.values())
    return {
        "benchmark": "consume",
        "mode": "hot_cold",
        "messages": stored,
        "size_bytes": args.size,
        "queues": args.queues,
        "consumers": args.consumers,
        "pull_batch": args.pull_batch,
        "fill": filled,
        "hot": hot,
        "cold": cold,
        "eviction": eviction,
    }


async def _catch_up(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import Admin

    ns = target.namesrv
    topic = f"{args.topic}-catchup-{run_id()}"
    async with Admin(ns) as admin:
        await admin.create_topic(topic, args.queues)
    progress("consume", f"building a backlog of {args.backlog_gb:g} GB")
    backlog = await fill(ns, topic, messages=None, bytes_=int(args.backlog_gb * 1e9),
                         size=args.size, in_flight=args.in_flight)
    freeze_gc()
    producers = ProducerProcess(ns, topic, args.size, args.producer_rate, args.in_flight)
    try:
        await anyio.to_thread.run_sync(producers.wait_samples, 2)
        await anyio.sleep(args.producer_warmup)
        progress("consume", "measuring the producers alone")
        tb0 = time.monotonic()
        await anyio.sleep(args.baseline_seconds)
        tb1 = time.monotonic()
        eviction = None
        if args.cold_method != "skip":
            eviction = await anyio.to_thread.run_sync(
                evict, args.cold_method, _data_dirs(target, args))
        ranges = await queue_ends(ns, topic, args.queues)
        progress("consume", "catching up from offset 0 while the producers produce")
        tc0 = time.monotonic()
        read = await read_queues(ns, topic, ranges, args, f"catchup-{run_id()}")
        tc1 = time.monotonic()
        # alone again: on a shared machine the rate drifts, so the reference brackets
        # the catch-up instead of only preceding it
        await anyio.sleep(args.baseline_seconds)
        ta1 = time.monotonic()
        await anyio.sleep(0.3)  # one more report after the window
    finally:
        await anyio.to_thread.run_sync(producers.stop)
    alone_before = producers.rate(tb0, tb1)
    during = producers.rate(tc0 + 0.3, tc1)  # the readers' first requests are not the load
    alone_after = producers.rate(tc1 + 0.3, ta1)
    refs = [r["msgs_per_s"] for r in (alone_before, alone_after) if r["msgs_per_s"]]
    alone = sum(refs) / len(refs) if refs else None
    fraction = (round(during["msgs_per_s"] / alone, 3)
                if alone and during["msgs_per_s"] is not None else None)
    return {
        "benchmark": "consume",
        "mode": "catch_up",
        "backlog_gb": round(sum(e - lo for lo, e in ranges.values()) * args.size / 1e9, 3),
        "size_bytes": args.size,
        "queues": args.queues,
        "consumers": args.consumers,
        "pull_batch": args.pull_batch,
        "backlog_build": backlog,
        "catch_up_read": read,
        "producer_rate": args.producer_rate or "max",
        "producers_alone_before": alone_before,
        "producers_during_catch_up": during,
        "producers_alone_after": alone_after,
        "producer_fraction": fraction,
        "eviction": eviction,
        "target": {
            "read_mb_per_s": READ_MB_TARGET,
            "producer_fraction": PRODUCER_FRACTION_TARGET,
            "met": (read["mb_per_s"] >= READ_MB_TARGET and fraction is not None
                    and fraction >= PRODUCER_FRACTION_TARGET),
        },
    }


def run_consume(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark against `--namesrv` or a local cluster started (and stopped) here."""
    if args.size is None:
        args.size = 16384 if args.catch_up else 4096
    return run_on_target(args, _catch_up if args.catch_up else _hot_cold)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench consume",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=65_536, help="messages to fill (hot/cold)")
    p.add_argument("--size", type=int, default=None,
                   help="message body bytes (default 4096; 16384 with --catch-up)")
    p.add_argument("--topic", default="consume")
    p.add_argument("--queues", type=int, default=12)
    p.add_argument("--consumers", type=int, default=3, help="pull consumers sharing the queues")
    p.add_argument("--pull-batch", type=int, default=1024, help="max messages per FETCH")
    p.add_argument("--max-bytes", type=int, default=8 << 20, help="max bytes per FETCH")
    p.add_argument("--in-flight", type=int, default=4096, help="unacknowledged sends (fill)")
    p.add_argument("--cold-method", default="auto",
                   choices=["auto", "drop_caches", "fadvise", "none", "skip"],
                   help="how to evict before the cold read (auto: drop_caches as root, "
                        "else fadvise; none: read without evicting; skip: no cold read)")
    p.add_argument("--node-data", action="append", metavar="DIR",
                   help="a node's data directory of a --namesrv cluster (for fadvise)")
    p.add_argument("--catch-up", action="store_true", help="backlog catch-up mode")
    p.add_argument("--backlog-gb", type=float, default=1.0)
    p.add_argument("--producer-rate", type=float, default=0.0,
                   help="msgs/s of the producer process in --catch-up (0: as fast as it can)")
    p.add_argument("--producer-warmup", type=float, default=2.0)
    p.add_argument("--baseline-seconds", type=float, default=8.0,
                   help="seconds the producers are measured alone")
    add_cluster_args(p)
    return p


def _table(r: dict[str, Any]) -> Any:
    from rich.table import Table

    if r["mode"] == "catch_up":
        t = Table(title=f"catch-up: {r['backlog_gb']} GB backlog of {r['size_bytes']} B, "
                        f"{r['consumers']} consumers")
        for col in ("read MB/s", "producers alone msgs/s (before / after)", "during msgs/s",
                    "fraction", "evicted by"):
            t.add_column(col, justify="right")
        ev = r["eviction"]["method"] if r["eviction"] else "-"
        t.add_row(str(r["catch_up_read"]["mb_per_s"]),
                  f"{r['producers_alone_before']['msgs_per_s']} / "
                  f"{r['producers_alone_after']['msgs_per_s']}",
                  str(r["producers_during_catch_up"]["msgs_per_s"]),
                  str(r["producer_fraction"]), ev)
        return t
    t = Table(title=f"consume: {r['messages']:,} x {r['size_bytes']} B, {r['queues']} queues, "
                    f"{r['consumers']} consumers")
    for col in ("data", "msgs/s", "MB/s", "seconds"):
        t.add_column(col, justify="right")
    t.add_row("hot", f"{r['hot']['msgs_per_s']:,.0f}", str(r["hot"]["mb_per_s"]),
              str(r["hot"]["seconds"]))
    if r["cold"]:
        t.add_row(f"cold ({r['eviction']['method']})", f"{r['cold']['msgs_per_s']:,.0f}",
                  str(r["cold"]["mb_per_s"]), str(r["cold"]["seconds"]))
    return t


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_consume(args)
    emit(result, args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
