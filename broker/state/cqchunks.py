"""Sealed ConsumeQueue chunks: the files a group's snapshots reference instead of copying.

A ConsumeQueue's records are a pure function of the applied log, so its records
``[k * n, (k + 1) * n)`` (chunk `k`, `n` records of 28 bytes, followed by the keys of its
keyed records: see `broker.state.parts.queues`) are the same bytes on every replica once the
queue has grown past them. A snapshot names each such sealed chunk (by its first
record's Raft index and start, which no other chunk of the group shares, and `n`) with
its length and CRC32C, and carries only the queue's open ends inline (under two chunks'
worth): its size and the time to take it stop growing with the messages retained.

The state machine reaches the chunks through a `ChunkStore`, injected, so it does no I/O
itself: `FileChunkStore` (``<group dir>/consumequeue/``, used by nodes) and
`MemoryChunkStore` (unit tests, benchmarks, states that are never written to disk).

Order of durability: every chunk a snapshot references is written (temp file, fsync,
rename) and its directory fsynced (`ChunkStore.sync`) *before* the snapshot is
serialised, hence before the snapshot file exists; chunks no snapshot references any
more are deleted only once a snapshot without them is durable (`ChunkStore.keep_only`).

A missing chunk, or one whose length or CRC disagrees with the snapshot, raises
`CorruptChunk` (a `raftlog.fsutil.CorruptFile`, as a damaged snapshot file raises
`CorruptSnapshot`): the snapshot is unusable and the node refuses to start on it.

InstallSnapshot: a follower has none of the leader's chunks, so the leader ships
`ship(snapshot, refs, store)` (the snapshot bytes with the data of every chunk they
reference, each checked first: a damaged chunk is never shipped). The receiver checks
what it got (`unship`), hands the snapshot bytes, the very bytes the leader took, to its
Raft core and keeps the chunks aside until the install restores the snapshot, which
first stores them durably (`provide`), so the snapshot file it then writes references
chunks already on disk.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

import crc32c
import msgpack

from raftlog.fsutil import CorruptFile, atomic_write, fsync_dir
from raftlog.snapshot import SnapshotSkipped

__all__ = [
    "CHUNK_RECORDS",
    "ChunkGone",
    "ChunkRef",
    "ChunkStore",
    "CorruptChunk",
    "FileChunkStore",
    "MemoryChunkStore",
    "chunk_name",
    "is_chunk_name",
    "is_shipped",
    "load_chunk",
    "provide",
    "ship",
    "unship",
]

CHUNK_RECORDS = 65_536  # records per sealed ConsumeQueue chunk (1.75 MiB): the default
_SHIP_MAGIC = b"RMCQSHIP"  # never the start of a msgpack map (a snapshot)


class CorruptChunk(CorruptFile):
    """A chunk a snapshot references is missing or does not match its reference."""

    what = "consume queue chunk"


class ChunkGone(SnapshotSkipped):
    """A chunk a snapshot being written references left the store after the state was
    detached (a snapshot of a state an install replaced was saved meanwhile): this
    snapshot is not written; the next one copies the chunk again."""


ChunkRef = tuple[str, int, int]  # name, crc32c, length in bytes


_CHUNK_NAME = re.compile(r"\d{20}-\d{10}-\d+")


def is_chunk_name(name: str) -> bool:
    """Whether `name` is a ConsumeQueue chunk's (`chunk_name`), not another part's file."""
    return _CHUNK_NAME.fullmatch(name) is not None


def chunk_name(index: int, start: int, records: int) -> str:
    """The name of the chunk of `records` records whose first record is the one at `start`
    in the entry at Raft `index` (one queue's records never share an entry with another's,
    so no two chunks of a group have the same name)."""
    return f"{index:020d}-{start:010d}-{records}"


class ChunkStore(Protocol):
    """Where sealed chunks live. `put` and `keep_only` may block (worker threads call
    them); `has` is a cheap lookup the event loop may call."""

    def has(self, name: str) -> bool: ...

    def get(self, name: str) -> bytes | None:
        """The chunk's bytes, None if there is none by that name."""

    def put(self, name: str, data: bytes, *, overwrite: bool = False) -> None:
        """Store a chunk (a name is written once: an existing one is left alone unless
        `overwrite`, for replacing a damaged copy)."""

    def sync(self) -> None:
        """Make every `put` so far durable, names included."""

    def keep_only(self, names: Iterable[str],
                  only: Callable[[str], bool] | None = None) -> None:
        """Delete every chunk not in `names` (of those `only` accepts, when given: the
        store also holds other parts' files, `broker.state.parts.timers`)."""

    def discard(self, names: Iterable[str]) -> None:
        """Delete the chunks named (those missing are no error)."""

    def names(self) -> set[str]: ...


def load_chunk(store: ChunkStore, ref: ChunkRef) -> bytes:
    """The referenced chunk's bytes, checked; CorruptChunk if missing or not matching."""
    name, crc, length = ref
    data = store.get(name)
    where = os.path.join(getattr(store, "path", "<memory>"), name)
    if data is None:
        raise CorruptChunk(where, "missing")
    if len(data) != length:
        raise CorruptChunk(where, f"{len(data)} bytes, the snapshot says {length}")
    if crc32c.crc32c(data) != crc:
        raise CorruptChunk(where, "CRC mismatch")
    return data


class MemoryChunkStore:
    """Chunks in a dict: for unit tests, benchmarks and states never saved to disk."""

    def __init__(self) -> None:
        self.chunks: dict[str, bytes] = {}

    def has(self, name: str) -> bool:
        return name in self.chunks

    def get(self, name: str) -> bytes | None:
        return self.chunks.get(name)

    def put(self, name: str, data: bytes, *, overwrite: bool = False) -> None:
        if overwrite or name not in self.chunks:
            self.chunks[name] = bytes(data)

    def sync(self) -> None:
        pass

    def keep_only(self, names: Iterable[str],
                  only: Callable[[str], bool] | None = None) -> None:
        keep = set(names)
        self.discard([n for n in self.chunks
                      if n not in keep and (only is None or only(n))])

    def discard(self, names: Iterable[str]) -> None:
        for name in list(names):
            self.chunks.pop(name, None)

    def names(self) -> set[str]:
        return set(self.chunks)


class FileChunkStore:
    """One file per chunk in `path` (created when the first chunk is written)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._names: set[str] | None = None  # listed on first use
        self._unsynced = False
        self._lock = threading.Lock()

    def _listed(self) -> set[str]:
        with self._lock:
            if self._names is None:
                try:
                    entries = os.listdir(self.path)
                except FileNotFoundError:
                    entries = []
                for tmp in (e for e in entries if e.endswith(".tmp")):
                    try:  # a write a crash cut short
                        os.unlink(os.path.join(self.path, tmp))
                    except FileNotFoundError:
                        # a write finishing meanwhile (renamed): the store of a replica
                        # this one replaced may still be saving its last snapshot here
                        pass
                self._names = {e for e in entries if not e.endswith(".tmp")}
            return self._names

    def has(self, name: str) -> bool:
        return name in self._listed()

    def names(self) -> set[str]:
        return set(self._listed())

    def get(self, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.path, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def put(self, name: str, data: bytes, *, overwrite: bool = False) -> None:
        names = self._listed()
        if name in names and not overwrite:
            return
        if not os.path.isdir(self.path):
            os.makedirs(self.path, exist_ok=True)
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))  # the directory's own name
        # the directory is fsynced once for every chunk written, by `sync`
        atomic_write(os.path.join(self.path, name), data, sync_dir=False)
        self._unsynced = True
        names.add(name)

    def sync(self) -> None:
        if self._unsynced:
            fsync_dir(self.path)
            self._unsynced = False

    def keep_only(self, names: Iterable[str],
                  only: Callable[[str], bool] | None = None) -> None:
        keep = set(names)
        self.discard([n for n in list(self._listed())
                      if n not in keep and (only is None or only(n))])

    def discard(self, names: Iterable[str]) -> None:
        listed = self._listed()
        gone = [n for n in names if n in listed]
        for name in gone:
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass
            listed.discard(name)
        if gone:
            fsync_dir(self.path)


# ---------------------------------------------------------------------- InstallSnapshot


def is_shipped(data: bytes) -> bool:
    """Whether `data` is `ship` output rather than a plain snapshot."""
    return data[: len(_SHIP_MAGIC)] == _SHIP_MAGIC


def ship(snapshot: bytes, refs: Iterable[ChunkRef], store: ChunkStore) -> bytes:
    """The snapshot with the data of every chunk it references, for a follower that has
    none of them; CorruptChunk if one of ours is missing or damaged (never shipped)."""
    chunks = [[ref[0], ref[1], load_chunk(store, ref)] for ref in refs]
    body: bytes = msgpack.packb([snapshot, chunks], use_bin_type=True)
    return _SHIP_MAGIC + body


def unship(data: bytes, refs_of: Callable[[bytes], list[ChunkRef]]) -> tuple[bytes, dict[str, bytes]]:
    """The snapshot bytes `ship` output carries and the chunks it references, each
    checked against its reference; ValueError if one is missing or does not match."""
    if not is_shipped(data):
        raise ValueError("not a shipped snapshot")
    try:
        snapshot, chunks = msgpack.unpackb(data[len(_SHIP_MAGIC):], raw=False)
        carried = {name: body for name, _crc, body in chunks}
    except Exception as exc:  # msgpack raises several unrelated types
        raise ValueError(f"malformed shipped snapshot: {exc}") from exc
    out = {}
    for name, crc, length in refs_of(snapshot):
        body = carried.get(name)
        if body is None or len(body) != length or crc32c.crc32c(body) != crc:
            raise ValueError(f"shipped snapshot lacks chunk {name} or carries a bad copy")
        out[name] = body
    return bytes(snapshot), out


def provide(store: ChunkStore, refs: Iterable[ChunkRef], shipped: dict[str, bytes]) -> None:
    """Make every referenced chunk durable in `store`, from `shipped` (`unship` output)
    where the store has no good copy of its own; a chunk in neither is left for restore
    to report."""
    for ref in refs:
        name = ref[0]
        if name not in shipped:
            continue
        if store.has(name):
            try:
                load_chunk(store, ref)
                continue  # ours already, and good
            except CorruptChunk:
                pass
        store.put(name, shipped[name], overwrite=True)
    store.sync()
