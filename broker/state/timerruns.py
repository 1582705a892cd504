"""Spilled runs of pending delayed messages: the files that keep a node's memory flat.

`broker.state.parts.timers` holds messages due soon in memory and, once it holds more than
it should, writes those due far ahead to a *run*: one immutable file of their 40-byte
records in the order of their buckets (by due time to the bucket: within one bucket in
the order they were stored), followed by the keys of the keyed ones. Writing buckets as
they are makes a spill a concatenation, no record unpacked or sorted. The part keeps only a
`Run` (a few numbers) per file and reads a run's next stretch back, by due time, a while
before it falls due. Every replica spills and loads at the same log positions (pure
functions of the applied state), so runs are named by a sequence number the state keeps
and hold the same bytes on every replica, as ConsumeQueue chunks do (`cqchunks`, whose
store they share: `is_run_name` tells them apart).

Durability follows the chunks' rules: a run is written (fsynced) when it is made, its
directory entry made durable before any snapshot that references it is written
(`ChunkStore.sync`), and it is deleted only once a durable snapshot no longer references
it (the part's `Detached.saved`).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import crc32c
import msgpack

from broker.state.cqchunks import ChunkRef, ChunkStore, load_chunk

__all__ = ["RECORD", "Run", "encode_run", "is_run_name", "read_run", "run_name", "run_seq"]

RECORD = struct.Struct(">QQIIIIQ")  # due_ms, index, start, size, tag hash, destination, store_ms

_NAME = re.compile(r"timers-(\d{12})")


def run_name(seq: int) -> str:
    return f"timers-{seq:012d}"


def is_run_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def run_seq(name: str) -> int:
    m = _NAME.fullmatch(name)
    if m is None:
        raise ValueError(f"not a timer run's name: {name!r}")
    return int(m.group(1))


@dataclass(slots=True)
class Run:
    """One spilled run: `count` records in its file, of which the first `skip` were read
    back already; the rest are due within `min_due`..`max_due` and stored at Raft
    indexes from `min_index` on (lower and upper bounds)."""

    name: str
    crc: int
    length: int
    count: int
    skip: int
    min_due: int
    max_due: int
    min_index: int

    @property
    def ref(self) -> ChunkRef:
        return (self.name, self.crc, self.length)

    @property
    def left(self) -> int:
        return self.count - self.skip

    def to_list(self) -> list[object]:
        return [self.name, self.crc, self.length, self.count, self.skip, self.min_due,
                self.max_due, self.min_index]

    @classmethod
    def from_list(cls, item: object) -> Run:
        if not (isinstance(item, list) and len(item) == 8 and isinstance(item[0], str)
                and is_run_name(item[0])
                and all(type(x) is int and x >= 0 for x in item[1:])):  # noqa: E721
            raise ValueError(f"bad timer run {item!r}")
        run = cls(*item)  # type: ignore[arg-type]
        if not run.skip < run.count or run.length < run.count * RECORD.size:
            raise ValueError(f"timer run {run.name}: {run.skip} of {run.count} read, "
                             f"{run.length} bytes")
        return run


def encode_run(name: str, records: bytes, keys: list[list[object]], min_due: int,
               max_due: int) -> tuple[bytes, Run]:
    """The file of `records` (packed, in bucket order, at least one), due within
    `min_due`..`max_due`, and the keys of the keyed ones ([index, start, key] each), and
    its `Run`."""
    n = len(records) // RECORD.size
    assert n and len(records) == n * RECORD.size
    data = records + msgpack.packb(keys, use_bin_type=True)
    min_index = min(r[1] for r in RECORD.iter_unpack(records))
    return data, Run(name, crc32c.crc32c(data), len(data), n, 0, min_due, max_due, min_index)


def read_run(store: ChunkStore, run: Run) -> tuple[memoryview, dict[tuple[int, int], str]]:
    """The run's records (all of them: `run.skip` says where the unread ones start) and
    its keys; `CorruptChunk` if its file is missing or damaged."""
    data = load_chunk(store, run.ref)
    end = run.count * RECORD.size
    keys = msgpack.unpackb(data[end:], raw=False) if len(data) > end else []
    return memoryview(data)[:end], {(i, s): k for i, s, k in keys}
