"""CommitLog append throughput with fsync=always, next to the raw disk in the same run.

    python -m bench.storage --json [--dir DIR] [--seconds 3] [--sizes 4096,65536,1048576]

For each entry body size the CommitLog appends a batch (about `--batch-bytes`, at least
one entry) and calls `sync()`, repeatedly. The raw baseline writes the same bytes per
iteration to a plain file with one ``write`` followed by a sync call, once with
``os.fsync`` and once with ``os.fdatasync`` (the call the CommitLog makes). ``ratio``
compares the log with the raw run that uses the same call; ``ratio_vs_fsync`` with the
``os.fsync`` run.

The three take turns in short slices (`--slice`, in a shuffled order each round), and
each rate is the median of its per-slice rates: on a shared disk whose speed drifts or
bursts, that compares like with like. Each of them runs for `--seconds` per size. All files are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from raftlog.commitlog import CommitLog
from raftlog.types import Entry, EntryType

_DEFAULT_SIZES = (4 << 10, 64 << 10, 1 << 20)
_fdatasync = getattr(os, "fdatasync", os.fsync)


class _Contender:
    """Something that runs iterations of (write `chunk` bytes, sync) for a while."""

    chunk = 0

    def __init__(self) -> None:
        self.bytes = 0
        self.iterations = 0
        self.elapsed = 0.0
        self.rates: list[float] = []  # bytes/s of each slice

    def step(self) -> None:
        raise NotImplementedError

    def run(self, seconds: float) -> None:
        """Iterate for `seconds`; record the slice's rate."""
        t0 = time.perf_counter()
        deadline = t0 + seconds
        n = 0
        while True:
            self.step()
            n += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        self.iterations += n
        self.bytes += n * self.chunk
        self.elapsed += now - t0
        self.rates.append(n * self.chunk / (now - t0))

    def mbps(self) -> float:
        return statistics.median(self.rates) / 1e6 if self.rates else 0.0


class _Raw(_Contender):
    """A plain file written sequentially: one write of the batch, then a sync call."""

    def __init__(self, path: str, buf: bytes, sync: Callable[[int], None]) -> None:
        super().__init__()
        self.path = path
        self.buf = buf
        self.chunk = len(buf)
        self.sync = sync
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def step(self) -> None:
        view = memoryview(self.buf)
        while view:
            view = view[os.write(self.fd, view) :]
        self.sync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


class _Log(_Contender):
    """The CommitLog under test: append a batch of entries, then sync()."""

    def __init__(self, path: str, data: bytes, batch: int, segment_size: int) -> None:
        super().__init__()
        self.path = path
        size = len(data) // batch
        self.bodies = [data[k * size : (k + 1) * size] for k in range(batch)]
        self.batch = batch
        self.chunk = batch * size
        self.log = CommitLog.open(path, segment_size=segment_size, fsync="always")
        self.index = self.log.last_index() + 1

    def step(self) -> None:
        index = self.index
        self.log.append(
            [Entry(index + k, 1, EntryType.MESSAGES, b) for k, b in enumerate(self.bodies)]
        )
        self.index = index + self.batch
        self.log.sync()

    def close(self) -> None:
        self.log.close()
        shutil.rmtree(self.path, ignore_errors=True)


def run(
    base: str,
    sizes: tuple[int, ...],
    seconds: float,
    batch_bytes: int,
    slice_seconds: float,
    segment_size: int,
) -> dict[str, Any]:
    """Measure every size; returns the JSON-ready result."""
    results: dict[str, Any] = {}
    grand_total = 0
    for size in sizes:
        batch = max(1, batch_bytes // size)
        data = os.urandom(size * batch)  # the same bytes for everyone, no repeated blocks
        raw_fsync = _Raw(os.path.join(base, f"raw-fsync-{size}"), data, os.fsync)
        raw_fdatasync = _Raw(os.path.join(base, f"raw-fdatasync-{size}"), data, _fdatasync)
        log = _Log(os.path.join(base, f"log-{size}"), data, batch, segment_size)
        contenders: list[_Contender] = [raw_fsync, raw_fdatasync, log]
        order = random.Random(size)
        try:
            while log.elapsed < seconds:
                order.shuffle(contenders)
                for who in contenders:
                    who.run(slice_seconds)
        finally:
            raw_fsync.close()
            raw_fdatasync.close()
            log.close()
        same = raw_fdatasync.mbps()
        results[str(size)] = {
            "commitlog_MBps": round(log.mbps(), 1),
            "raw_MBps": round(same, 1),
            "ratio": round(log.mbps() / same, 3),
            "appends_per_s": round(log.iterations / log.elapsed, 1),
            "entries_per_s": round(log.iterations * batch / log.elapsed, 1),
            "entries_per_append": batch,
            "raw_fsync_MBps": round(raw_fsync.mbps(), 1),
            "ratio_vs_fsync": round(log.mbps() / raw_fsync.mbps(), 3),
            "slices": len(log.rates),
        }
        grand_total += sum(c.bytes for c in contenders)
    return {
        "benchmark": "commitlog append+sync vs raw sequential write+sync",
        "fsync_policy": "always",
        "log_sync_call": _fdatasync.__name__,
        "raw_MBps_sync_call": _fdatasync.__name__,
        "rate": "median of per-slice rates",
        "dir": base,
        "seconds_per_size": seconds,
        "slice_seconds": slice_seconds,
        "batch_bytes": batch_bytes,
        "segment_size": segment_size,
        "sizes": results,
        "total_bytes": grand_total,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse options, run in a fresh temp directory, print results, clean up."""
    p = argparse.ArgumentParser(prog="python -m bench.storage", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--dir", help="parent directory for temp files (default: ./bench-out)")
    p.add_argument(
        "--seconds", type=float, default=3.0, help="measured time per contender and size"
    )
    p.add_argument(
        "--sizes", default=",".join(map(str, _DEFAULT_SIZES)), help="body sizes in bytes"
    )
    p.add_argument("--batch-bytes", type=int, default=1 << 20, help="bytes appended per sync")
    p.add_argument("--slice", type=float, default=0.2, help="seconds per turn")
    p.add_argument("--segment-size", type=int, default=1 << 30)
    args = p.parse_args(argv)

    parent = args.dir or os.path.join(os.getcwd(), "bench-out")
    made_parent = not os.path.exists(parent)
    os.makedirs(parent, exist_ok=True)
    base = tempfile.mkdtemp(prefix="storage-", dir=parent)
    try:
        sizes = tuple(int(s) for s in args.sizes.split(",") if s)
        result = run(base, sizes, args.seconds, args.batch_bytes, args.slice, args.segment_size)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if made_parent:
            try:
                os.rmdir(parent)
            except OSError:
                pass
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"dir {result['dir']}  batch {args.batch_bytes} B/sync  fsync=always")
        print(f"{'size':>9} {'log MB/s':>9} {'raw MB/s':>9} {'ratio':>6} {'appends/s':>10}")
        for size, r in result["sizes"].items():
            print(
                f"{size:>9} {r['commitlog_MBps']:>9} {r['raw_MBps']:>9} {r['ratio']:>6} "
                f"{r['appends_per_s']:>10}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
