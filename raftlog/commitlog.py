"""The on-disk CommitLog: the Raft log of one group, stored the way consumers read it.

Layout of a group directory ``<dir>``::

    <dir>/commitlog/00000000000000000000   segment starting at position 0
    <dir>/commitlog/00000000001073741801   next segment (starts where the previous ends)
    <dir>/commitlog/index                  Raft index -> (position, term, size, type)
    <dir>/commitlog/base                   (index, term) of the entry before the first kept
                                           (and, after `reset_to`, where the log restarts)

Positions
    A *position* is a global byte offset into the concatenation of all segments. It
    addresses an entry for its whole life (message ids are group + position). Segments
    are named by the position of their first byte and hold a contiguous run of entries;
    a segment's data ends at its file size. An entry never spans segments: when the next
    entry does not fit in what is left of ``segment_size``, a new segment is started at
    the current end position, so no padding and no end-of-segment marker are needed and
    the byte stream stays contiguous across files. An entry larger than ``segment_size``
    gets a segment of its own. Position -> segment is a ``bisect`` over start positions.

Entry format (little-endian, 33-byte header then the body)::

    magic u32 | total size u32 | term u64 | index u64 | type u8 | body crc32c u32 |
    header crc32c u32 (over the 29 bytes before it)

    The body is stored byte-for-byte. Peers exchange entries in exactly this format
    (`encode_entry` on the leader, `decode_entries` checking both CRCs on the follower,
    see `raftlog.wire`); `read_raw`/`append_raw` copy stored bytes without decoding, for
    repairing a replica from a peer.

Index file: fixed 32-byte records; record ``i`` lives at ``(i - first_index) * 32``::

    position u64 | term u64 | size u32 | type u8 | 7 zero bytes | crc32c u32

    The record CRC covers the 28 bytes before it and is seeded with the Raft index, so a
    garbled or misplaced record is detected. `term()` reads only the index (an in-memory
    tail of recent records, else one ``pread``), never an entry body.

Durability protocol
    * `append` writes entries to the OS (page cache) with one ``pwritev`` per segment and
      keeps their index records in memory.
    * `sync` ``fdatasync``s the segments written since the last sync (one fsync covers
      everything appended since: group commit). Only fsynced entries get their index
      records written, so the index on disk never vouches for data that was not fsynced
      first. Those writes are batched (every 4096 records or 64 MiB of data) and the
      index is fsynced lazily (every 65536 records, on truncation and on close): the
      data fsync stays the only fsync on the commit path, and recovery rebuilds any
      suffix the index misses from the data. Records not yet in the file are served
      from memory.
    * `truncate_from` makes the truncation durable (index, then data, then directory)
      before returning, so stale entries can never reappear under newer ones.
    * ``fsync="interval"`` is page-cache durability (DLedger's and NATS's default): `sync`
      reports everything written as persisted and fsyncs at most every
      ``fsync_interval`` seconds, so a machine crash can lose acknowledged entries.
      Deployments using it must say so.

Recovery (`open`)
    1. Validate the index: the longest prefix of records whose CRCs verify and whose
       positions chain contiguously (``pos[i+1] == pos[i] + size[i]``). A short, garbled
       or missing index simply yields a shorter prefix; the rest is rebuilt from data.
    2. Verify the entry of the last vouched record (both CRCs, and that it matches the
       record). If it is bad and no valid entry follows it, it is a torn tail: drop the
       record and try the one before.
    3. Walk forward from there through the remaining data, verifying header and body
       CRCs of every entry, index contiguity (i+1 after i), non-decreasing terms, and
       that each segment starts where the previous one ends. The first entry that fails
       ends the log (torn tail) and everything after it is truncated -- unless the entry
       has an intact header and the entry after it verifies: that is a corrupt entry in
       the middle; it is kept, reported in `RecoveryReport.corrupt`, and reads of it
       raise `CorruptEntry` so the Raft layer refetches it from a peer (`repair`).
       When the whole index had to be rebuilt, segments before the last two are walked
       by headers only (header CRCs and contiguity); their bodies are still checked on
       every read.
    4. Truncate data, fsync the segments from the last vouched entry on (earlier ones
       were fsynced before that entry's index record was written) and the directory,
       then rewrite the index suffix and fsync it. Everything present after `open` is
       durable.

    Limits: an entry whose *header* is corrupt cannot be stepped over without its index
    record, so when the index is lost as well it ends the log there. A torn entry whose
    successor did reach the disk (out-of-order writeback in a machine crash) looks like
    middle corruption and is kept as such; the Raft layer may drop it with
    `truncate_from` when it lies above its commit index. `first_index` is taken from
    the first entry of the first segment (else from the base file, else 1).

Repair (`repair`)
    A corrupt entry is kept rather than truncated: its index record (and usually its
    header) still says which index and term it holds, so the log's length and last
    term -- what votes are decided on -- stay right, and truncating it could let this
    replica vote for a candidate lacking a committed entry. Reads of it raise
    `CorruptEntry` until `repair` overwrites it in place with the stored bytes of the
    same entry from a peer (`read_raw` there). By Raft's Log Matching property every
    replica's entry with that index and term is the same entry, so the bytes must match
    the local index record exactly (index, term, type, size) and pass both CRCs. The
    overwrite is fsynced before `repair` returns; a crash in between leaves a mix of
    old and new bytes: the intact entry, or one that still fails its CRCs and is
    repaired again. Only entries that
    recovery scanned are checked at `open` (`RecoveryReport.corrupt`); the ones the
    index vouches for are checked on every read, and `verify` checks a range.

Retention (`delete_before`)
    Whole segments below a Raft index are deleted, never the active one and never past
    `durable_index`. Three durable steps, each of which a reopen can finish:

    1. write the base file (index and term of the entry just before the new first one;
       temp, fsync, rename, fsync dir). From here the entries up to it are gone
       logically, and `term(first_index() - 1)` is answered from it.
    2. write a new index whose records start at the new first index (temp, fsync,
       rename, fsync dir).
    3. unlink the old segments, fsync dir.

    `open` rolls an interrupted deletion forward: it unlinks leading segments wholly
    below the base (step 3) and, if the index still starts at the old first entry, drops
    its leading records (step 2). Positions are never reused: the first segment simply
    no longer starts at position 0.

Reset (`reset_to`, for installing a snapshot)
    Every entry goes and the log restarts after a given (index, term), in a fresh empty
    segment at the current end position (positions are still never reused):

    1. create that segment;
    2. write the base file, in its reset form that also names the segment's position
       (temp, fsync, rename, fsync dir: this also makes step 1 durable). This is the
       commit point: from here the old entries are gone;
    3. empty the index file, fsync it; unlink the old segments, fsync dir.

    `open` rolls an interrupted reset forward: segments below the position the base
    names are unlinked, and an index whose records point below it is rebuilt (as empty).
    A failure at or after step 2 closes the log (reopen to recover).

Threading: a CommitLog is not thread-safe. The caller serializes all calls; `sync` may
run in a worker thread (``trio.to_thread.run_sync``) provided nothing else runs on the
log meanwhile.
"""

from __future__ import annotations

import bisect
import os
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import crc32c

from raftlog.fsutil import atomic_write, fdatasync_fd, fsync_dir, fsync_fd
from raftlog.types import Entry, EntryType

__all__ = [
    "HEADER_SIZE",
    "INDEX_RECORD_SIZE",
    "MAGIC",
    "CommitLog",
    "CommitLogError",
    "CorruptEntry",
    "CorruptIndex",
    "OutOfRange",
    "RecoveryReport",
    "SegmentInfo",
    "SyncPlan",
    "decode_entries",
    "encode_entry",
]

MAGIC = 0x31514D52  # b"RMQ1" read as a little-endian u32
_HEAD = struct.Struct("<IIQQBI")  # the part the header CRC covers (29 bytes)
_HEADER = struct.Struct("<IIQQBII")
HEADER_SIZE = _HEADER.size  # 33
_U32 = struct.Struct("<I")
_MAX_TOTAL = 0xFFFFFFFF

_IREC_HEAD = struct.Struct("<QQIB7x")  # the part the record CRC covers (28 bytes)
_IREC_TAIL = struct.Struct("<I")
_IREC = struct.Struct("<QQIB7xI")
_IREC_CRC_AT = _IREC_HEAD.size
INDEX_RECORD_SIZE = _IREC.size  # 32

_MAX_TYPE = max(EntryType)
_TYPES = tuple(EntryType(t) for t in range(_MAX_TYPE + 1))  # indexing beats EntryType(t)
_SEGMENT_NAME_LEN = 20
_INDEX_NAME = "index"
_BASE_NAME = "base"
_TMP = ".tmp"
_BASE_MAGIC = 0x42514D52  # b"RMQB" read as a little-endian u32
_BASE_HEAD = struct.Struct("<IQQ")  # magic, index, term; then a crc32c of these
_BASE = struct.Struct("<IQQI")
_RESET_MAGIC = 0x52514D52  # b"RMQR": a base written by reset_to
_RESET_HEAD = struct.Struct("<IQQQ")  # magic, index, term, start position; then a crc32c
_RESET = struct.Struct("<IQQQI")
_COPY_CHUNK = 8 << 20
_TAIL_CACHE = 1 << 16  # index records of the newest entries kept in memory (2 MiB)
_TAIL_WARM = 1024  # records loaded into the tail cache at open
# Index records of fsynced entries are written in batches: each write dirties a second
# file, which the next data fsync would also have to flush (ext4 data=ordered). Recovery
# rescans whatever the index does not cover, so these bound the rescan after a crash.
_INDEX_WRITE_RECORDS = 4096
_INDEX_WRITE_BYTES = 64 << 20  # data covered by the pending records
_INDEX_FSYNC_EVERY = 1 << 16  # records written since the index file's last fsync
_SCAN_CHUNK = 4 << 20
_INDEX_CHUNK = 1 << 15  # records per read while validating the index
_MAX_OPEN_FDS = 32
_M32 = 0xFFFFFFFF

try:
    _IOV_MAX = os.sysconf("SC_IOV_MAX")
except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
    _IOV_MAX = 1024
if _IOV_MAX <= 0:  # pragma: no cover
    _IOV_MAX = 1024

# Every fsync goes through `raftlog.fsutil` (which records sync marks when a test asks).
_datasync = fdatasync_fd
_fsync = fsync_fd


class CommitLogError(Exception):
    """Any CommitLog failure that is not the caller's fault (I/O, broken files)."""


class CorruptEntry(CommitLogError):
    """A stored entry failed verification; it must be refetched, never served."""

    def __init__(self, path: str, position: int, reason: str, index: int | None = None) -> None:
        self.path = path
        self.position = position
        self.reason = reason
        self.index = index
        where = f"{path} at position {position}"
        what = f"entry {index}" if index is not None else "entry"
        super().__init__(f"corrupt {what} in {where}: {reason}")


class CorruptIndex(CommitLogError):
    """An index record failed its CRC after open; reopening rebuilds the index."""


class OutOfRange(CommitLogError, IndexError):
    """A Raft index or position outside what the log holds (an IndexError too)."""


@dataclass(slots=True)
class RecoveryReport:
    """What `CommitLog.open` found and repaired, for logs and metrics."""

    index_records_valid: int = 0  # records the existing index vouched for
    index_rebuilt: int = 0  # records (re)written from a data scan
    truncated_from_index: int | None = None  # first Raft index dropped as torn tail
    truncated_bytes: int = 0
    segments_removed: list[str] = field(default_factory=list)
    corrupt: list[int] = field(default_factory=list)  # kept, but unreadable: refetch
    deletion_finished: list[str] = field(default_factory=list)  # segments an interrupted
    # `delete_before` had left behind, unlinked now
    reason: str = ""  # why the scan stopped


class SegmentInfo(NamedTuple):
    """One segment as a retention policy sees it (`last_index < first_index` if empty)."""

    first_index: int
    last_index: int
    size: int  # bytes
    start: int  # position of its first byte
    path: str


# --------------------------------------------------------------------------- encoding


def _header(index: int, term: int, etype: int, body: bytes | memoryview) -> bytes:
    size = HEADER_SIZE + len(body)
    if size > _MAX_TOTAL:
        raise ValueError(f"entry {index} is too large ({size} bytes)")
    head = _HEAD.pack(MAGIC, size, term, index, etype, crc32c.crc32c(body))
    return head + _U32.pack(crc32c.crc32c(head))


def encode_entry(entry: Entry) -> bytes:
    """The exact stored bytes of `entry` (header + body): what `read_raw` returns."""
    return _header(entry.index, entry.term, int(entry.type), entry.data) + entry.data


def _check_header(
    buf: memoryview, off: int
) -> tuple[str | None, tuple[int, int, int, int, int, int]]:
    """Parse a header; (error or None, (magic, size, term, index, type, body_crc))."""
    magic, size, term, index, etype, bcrc, hcrc = _HEADER.unpack_from(buf, off)
    fields = (magic, size, term, index, etype, bcrc)
    if magic != MAGIC:
        return f"bad magic {magic:#010x}", fields
    if crc32c.crc32c(buf[off : off + _HEAD.size]) != hcrc:
        return "header CRC mismatch", fields
    if size < HEADER_SIZE:
        return f"total size {size} smaller than a header", fields
    if etype > _MAX_TYPE:
        return f"unknown entry type {etype}", fields
    return None, fields


def decode_entries(data: bytes | memoryview, *, source: str = "<buffer>") -> list[Entry]:
    """Entries from stored bytes (e.g. `read_raw` output), verifying both CRCs of each.

    Raises CorruptEntry (position relative to `data`) on the first bad entry.
    """
    mv = memoryview(data).cast("B")
    out: list[Entry] = []
    off = 0
    n = len(mv)
    while off < n:
        if n - off < HEADER_SIZE:
            raise CorruptEntry(source, off, "truncated header")
        err, (_m, size, term, index, etype, bcrc) = _check_header(mv, off)
        if err:
            raise CorruptEntry(source, off, err)
        if off + size > n:
            raise CorruptEntry(source, off, "truncated body", index)
        body = mv[off + HEADER_SIZE : off + size]
        if crc32c.crc32c(body) != bcrc:
            raise CorruptEntry(source, off, "body CRC mismatch", index)
        out.append(Entry(index, term, _TYPES[etype], bytes(body)))
        off += size
    return out


def _index_record(index: int, pos: int, term: int, size: int, etype: int) -> bytes:
    head = _IREC_HEAD.pack(pos, term, size, etype)
    return head + _IREC_TAIL.pack(crc32c.crc32c(head, index & _M32))


def _segment_name(start: int) -> str:
    return f"{start:0{_SEGMENT_NAME_LEN}d}"


def _pwritev_all(fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int) -> None:
    """Write all `buffers` at `offset` with as few syscalls as possible (no joining copy)."""
    parts = list(buffers)
    while parts:
        chunk = parts[:_IOV_MAX]
        n = os.pwritev(fd, chunk, offset)
        if n <= 0:
            raise CommitLogError(f"pwritev wrote {n} bytes")
        offset += n
        i = 0
        while i < len(chunk) and n >= len(chunk[i]):
            n -= len(chunk[i])
            i += 1
        parts = parts[i:]
        if n:
            parts[0] = memoryview(parts[0])[n:]


def _pread_exact(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) == n or n == 0:
        return data
    chunks = [data]
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, offset + got)
        if not more:
            break
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


def _copy_range(src: int, dst: int, offset: int, n: int) -> None:
    """Copy `n` bytes of `src` from `offset` to the start of `dst` (in-kernel if possible)."""
    copy = getattr(os, "copy_file_range", None)
    out = 0
    while out < n:
        want = min(_COPY_CHUNK, n - out)
        if copy is not None:
            try:
                got = copy(src, dst, want, offset + out, out)
            except OSError:
                copy = None  # e.g. not supported by this file system: copy by hand
            else:
                if got <= 0:
                    raise CommitLogError(f"index file ended {n - out} bytes early")
                out += got
                continue
        data = _pread_exact(src, want, offset + out)
        if len(data) != want:
            raise CommitLogError(f"index file ended {n - out - len(data)} bytes early")
        _pwritev_all(dst, [data], out)
        out += want


# --------------------------------------------------------------------------- scanning


class _Window:
    """Sequential reads over one segment with few syscalls (used by recovery)."""

    __slots__ = ("fd", "start", "end", "ws", "buf")

    def __init__(self, fd: int, start: int, size: int) -> None:
        self.fd = fd
        self.start = start
        self.end = start + size
        self.ws = start
        self.buf = memoryview(b"")

    def get(self, pos: int, n: int, readahead: int) -> memoryview | None:
        if pos + n > self.end:
            return None
        rel = pos - self.ws
        if rel >= 0 and rel + n <= len(self.buf):
            return self.buf[rel : rel + n]
        want = min(max(n, readahead), self.end - pos)
        self.buf = memoryview(_pread_exact(self.fd, want, pos - self.start))
        self.ws = pos
        if len(self.buf) < n:
            return None
        return self.buf[:n]


# --------------------------------------------------------------------------- the log


@dataclass(eq=False)
class SyncPlan:
    """The fsyncs one group commit needs, on duplicated descriptors so the log may go on
    appending, rolling segments or evicting descriptors while they run elsewhere."""

    fds: list[int]
    sync_dir: str | None
    last: int  # every entry up to here was written before the plan was made
    generation: int
    started: float
    fsynced: bool = True
    error: OSError | None = None

    def run(self) -> None:
        """The blocking part; safe in a worker thread. Errors are kept for `finish_sync`."""
        try:
            for fd in self.fds:
                _datasync(fd)
            if self.sync_dir is not None:
                fsync_dir(self.sync_dir)
        except OSError as exc:
            self.error = exc

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


class CommitLog:
    """Segmented, CRC-checked, append-only Raft log; implements `raftlog.types.LogStore`.

    Create with `CommitLog.open`. Not thread-safe: the caller serializes calls (see the
    module docstring).
    """

    def __init__(
        self,
        path: str,
        *,
        segment_size: int,
        fsync: Literal["always", "interval"],
        fsync_interval: float,
    ) -> None:
        if fsync not in ("always", "interval"):
            raise ValueError(f"fsync must be 'always' or 'interval', not {fsync!r}")
        if segment_size <= HEADER_SIZE:
            raise ValueError(f"segment_size must exceed {HEADER_SIZE} bytes")
        self.path = os.fspath(path)
        self.dir = os.path.join(self.path, "commitlog")
        self.segment_size = segment_size
        self.fsync_mode = fsync
        self.fsync_interval = fsync_interval
        self.recovery = RecoveryReport()
        self._closed = False
        # segments
        self._starts: list[int] = []
        self._sizes: list[int] = []
        self._fds: dict[int, int] = {}  # segment start -> fd (insertion order ~ LRU)
        self._dirty: set[int] = set()  # segment starts written since the last fsync
        self._dir_dirty = False
        # log bounds
        self._first = 1
        self._base = (0, 0)  # (index, term) from the base file: the last deleted entry
        self._last = 0
        self._last_term = 0
        self._end = 0  # position after the last entry
        # index
        self._ifd = -1
        self._written = 0  # records present in the index file: [first, first + written)
        self._index_unsynced = 0  # records written to the index file since its fsync
        self._tail = bytearray()  # records [tail_first, last] in memory
        self._tail_first = 1
        # durability
        self._durable = 0
        self._last_fsync = float("-inf")
        self._generation = 0  # bumped by truncate_from: an fsync begun before it covers nothing after

    # ------------------------------------------------------------------ open / close

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        segment_size: int = 1 << 30,
        fsync: Literal["always", "interval"] = "always",
        fsync_interval: float = 1.0,
        check_index: bool = True,
    ) -> CommitLog:
        """Open (creating if needed) the log of the group at `path`, running recovery.

        `fsync="interval"` gives page-cache durability: `sync()` reports appended
        entries as persisted but fsyncs at most every `fsync_interval` seconds, so a
        machine crash can lose acknowledged entries. Label such deployments so.
        `check_index=False` skips the O(index size) CRC pass and trusts all records but
        the last; only for very large logs where open latency matters more.
        """
        log = cls(
            os.fspath(path),
            segment_size=segment_size,
            fsync=fsync,
            fsync_interval=fsync_interval,
        )
        try:
            log._recover(check_index)
        except BaseException:
            log._close_fds()
            raise
        return log

    def close(self) -> None:
        """Fsync everything and release files; the index is left complete and durable."""
        if self._closed:
            return
        try:
            self._fsync_data()
            self._flush_index(force_fsync=True)
        finally:
            self._close_fds()

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_fds(self) -> None:
        self._closed = True
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        if self._ifd >= 0:
            try:
                os.close(self._ifd)
            except OSError:
                pass
            self._ifd = -1

    @property
    def closed(self) -> bool:
        """Whether the log was closed (by `close` or by a failure that needs a reopen)."""
        return self._closed

    # ------------------------------------------------------------------ LogStore

    def first_index(self) -> int:
        """Oldest Raft index held (1 until retention removes old segments)."""
        return self._first

    def last_index(self) -> int:
        """Newest Raft index written (not necessarily durable: see `durable_index`)."""
        return self._last

    def durable_index(self) -> int:
        """Newest Raft index covered by an fsync."""
        return self._durable

    def end_position(self) -> int:
        """Position where the next entry will be written."""
        return self._end

    def term(self, index: int) -> int:
        """Term of entry `index` from the index alone (0 for the sentinel index 0).

        `first_index() - 1` is answered too (from the base file after a deletion), as
        Raft needs the term of the entry before the first one it sends or holds.
        """
        if index == 0:
            return 0
        if index == self._last and index >= self._first:
            return self._last_term
        if index == self._first - 1:
            return self._term_before_first()
        return self._record(index)[1]

    def _term_before_first(self) -> int:
        prev = self._first - 1
        if prev == 0:
            return 0
        if self._base[0] == prev:
            return self._base[1]
        raise OutOfRange(f"term of entry {prev} is unknown: it was deleted without a base record")

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries [lo, hi): at least one if lo < hi, then as many as fit in `max_bytes`.

        Sizes count stored bytes (header + body). Every entry is CRC-checked; if a corrupt
        entry is met after some good ones, the good prefix is returned (the next call
        starting at the corrupt index raises CorruptEntry).
        """
        self._check_span(lo, hi)
        if lo >= hi:
            return []
        out: list[Entry] = []
        self._walk(lo, hi, max_bytes, True, out)
        return out

    # ------------------------------------------------------------------ writing

    def append(self, entries: Sequence[Entry]) -> list[int]:
        """Write `entries` (contiguous, after `last_index()`); returns their positions.

        The data reaches the OS only; call `sync` for durability. One ``pwritev`` per
        segment touched, bodies are not copied. Everything is validated before the first
        byte is written.
        """
        self._check_open()
        if not entries:
            return []
        index = self._last + 1
        prev_term = self._last_term
        seg_size = self.segment_size
        used = self._sizes[-1]
        pos = self._end
        parts: list[bytes | memoryview] = []
        groups: list[tuple[int | None, list[bytes | memoryview]]] = [(None, parts)]
        positions: list[int] = []
        records: list[bytes] = []
        head_pack, u32, crc, rec_pack = _HEAD.pack, _U32.pack, crc32c.crc32c, _IREC_HEAD.pack
        for e in entries:
            term = e.term
            if e.index != index:
                raise ValueError(
                    f"append of entry {e.index} but entry {index} expected "
                    f"(last_index={self._last}); truncate_from() a conflicting suffix first"
                )
            if term < prev_term:
                raise ValueError(f"entry {index} has term {term} below previous {prev_term}")
            etype = int(e.type)
            if not 0 <= etype <= _MAX_TYPE:
                raise ValueError(f"entry {index} has unknown type {etype}")
            body = e.data
            size = HEADER_SIZE + len(body)
            if size > _MAX_TOTAL:
                raise ValueError(f"entry {index} is too large ({size} bytes)")
            if used and used + size > seg_size:
                parts = []
                groups.append((pos, parts))
                used = 0
            head = head_pack(MAGIC, size, term, index, etype, crc(body))
            parts.append(head + u32(crc(head)))
            if body:
                parts.append(body)
            positions.append(pos)
            rec = rec_pack(pos, term, size, etype)
            records.append(rec)
            records.append(u32(crc(rec, index & _M32)))
            pos += size
            used += size
            index += 1
            prev_term = term
        self._write_appended(groups, records, index - 1, prev_term)
        return positions

    def append_raw(self, data: bytes | memoryview) -> list[int]:
        """Append stored-format bytes (a peer's `read_raw` output) unchanged.

        Both CRCs and contiguity are verified first; nothing is written if any entry is
        bad (raises CorruptEntry, positions relative to `data`, or ValueError).
        """
        self._check_open()
        mv = memoryview(data).cast("B")
        n = len(mv)
        off = 0
        index = self._last + 1
        prev_term = self._last_term
        seg_size = self.segment_size
        used = self._sizes[-1]
        pos = self._end
        parts: list[bytes | memoryview] = []
        groups: list[tuple[int | None, list[bytes | memoryview]]] = [(None, parts)]
        positions: list[int] = []
        records: list[bytes] = []
        run_start = 0  # start in `mv` of the bytes not yet added to `parts`
        while off < n:
            if n - off < HEADER_SIZE:
                raise CorruptEntry("<append_raw>", off, "truncated header")
            err, (_m, size, term, hindex, etype, bcrc) = _check_header(mv, off)
            if err:
                raise CorruptEntry("<append_raw>", off, err)
            if off + size > n:
                raise CorruptEntry("<append_raw>", off, "truncated body", hindex)
            if crc32c.crc32c(mv[off + HEADER_SIZE : off + size]) != bcrc:
                raise CorruptEntry("<append_raw>", off, "body CRC mismatch", hindex)
            if hindex != index:
                raise ValueError(f"append_raw of entry {hindex} but entry {index} expected")
            if term < prev_term:
                raise ValueError(f"entry {index} has term {term} below previous {prev_term}")
            if used and used + size > seg_size:
                if off > run_start:
                    parts.append(mv[run_start:off])
                run_start = off
                parts = []
                groups.append((pos, parts))
                used = 0
            positions.append(pos)
            records.append(_index_record(index, pos, term, size, etype))
            pos += size
            used += size
            off += size
            index += 1
            prev_term = term
        if n > run_start:
            parts.append(mv[run_start:n])
        if not positions:
            return []
        self._write_appended(groups, records, index - 1, prev_term)
        return positions

    def store(self, entries: Sequence[Entry]) -> None:
        """Write what a Raft `Ready` hands out: entries that start at or below the last
        index replace the (uncommitted, conflicting) suffix from that index first."""
        if not entries:
            return
        if entries[0].index <= self._last:
            self.truncate_from(entries[0].index)
        self.append(entries)

    def _write_appended(
        self,
        groups: list[tuple[int | None, list[bytes | memoryview]]],
        records: list[bytes],
        last: int,
        last_term: int,
    ) -> None:
        """Write validated entries and make them part of the log (not yet durable)."""
        self._write_groups(groups)
        self._tail += b"".join(records)
        self._last = last
        self._last_term = last_term

    def _write_groups(self, groups: list[tuple[int | None, list[bytes | memoryview]]]) -> None:
        """Write planned runs of bytes: the first continues the active segment, each later
        one starts a new segment at its position. Undone on failure."""
        old_end, old_nseg = self._end, len(self._starts)
        try:
            for start, parts in groups:
                if start is not None:
                    self._roll(start)
                if parts:
                    self._write_segment(self._starts[-1], parts, self._end)
        except BaseException:
            self._undo_write(old_end, old_nseg)
            raise

    def _write_segment(self, seg: int, parts: list[bytes | memoryview], pos: int) -> None:
        fd = self._fd(len(self._starts) - 1)
        _pwritev_all(fd, parts, pos - seg)
        written = sum(len(p) for p in parts)
        self._sizes[-1] = pos - seg + written
        self._end = pos + written
        self._dirty.add(seg)

    def _roll(self, pos: int) -> None:
        """Start a new segment at `pos` (the current end); the old one stays dirty."""
        name = os.path.join(self.dir, _segment_name(pos))
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._starts.append(pos)
        self._sizes.append(0)
        self._fds[pos] = fd
        self._dirty.add(pos)
        self._dir_dirty = True
        self._evict_fds()

    def _undo_write(self, old_end: int, old_nseg: int) -> None:
        """Best-effort rollback of a failed append so memory and files agree again."""
        try:
            while len(self._starts) > old_nseg:
                start = self._starts.pop()
                self._sizes.pop()
                self._drop_fd(start)
                self._dirty.discard(start)
                try:
                    os.unlink(os.path.join(self.dir, _segment_name(start)))
                except FileNotFoundError:
                    pass
            k = len(self._starts) - 1
            os.ftruncate(self._fd(k), old_end - self._starts[k])
            self._sizes[k] = old_end - self._starts[k]
            self._end = old_end
        except OSError:
            pass

    def truncate_from(self, index: int) -> None:
        """Drop entries >= `index` (a conflicting uncommitted suffix), durably.

        Index file first, then data, then the directory are fsynced before returning, so
        nothing appended afterwards can be confused with the dropped entries.
        """
        self._check_open()
        if index <= 0 or index > self._last + 1 or index < self._first:
            raise OutOfRange(
                f"truncate_from({index}) outside [{max(self._first, 1)}, {self._last + 1}]"
            )
        if index == self._last + 1:
            return
        pos = self._record(index)[0]
        new_last_term = self.term(index - 1)
        # 1. index: memory, then file (durably)
        self._drop_records_from(index)
        # 2. data: delete later segments, cut the one holding `pos`
        k = bisect.bisect_right(self._starts, pos) - 1
        if pos == self._starts[k] and k > 0:
            k -= 1
        for start in self._starts[k + 1 :]:
            self._drop_fd(start)
            self._dirty.discard(start)
            os.unlink(os.path.join(self.dir, _segment_name(start)))
            self._dir_dirty = True
        del self._starts[k + 1 :]
        del self._sizes[k + 1 :]
        os.ftruncate(self._fd(k), pos - self._starts[k])
        self._sizes[k] = pos - self._starts[k]
        self._dirty.add(self._starts[k])
        self._end = pos
        self._last = index - 1
        self._last_term = new_last_term
        self._durable = min(self._durable, self._last)
        self._generation += 1
        self._fsync_data()

    def _drop_records_from(self, index: int) -> None:
        if index >= self._tail_first:
            del self._tail[(index - self._tail_first) * INDEX_RECORD_SIZE :]
        else:
            self._tail.clear()
            self._tail_first = index
        keep = index - self._first
        if self._written > keep:
            self._written = keep
            os.ftruncate(self._ifd, keep * INDEX_RECORD_SIZE)
            _fsync(self._ifd)
            self._index_unsynced = 0

    # ------------------------------------------------------------------ retention

    def segment_bounds(self) -> list[SegmentInfo]:
        """Every segment, oldest first; the last one is the active segment.

        Costs a binary search over index records per segment (segments are few).
        """
        self._check_open()
        firsts = [self._first] + [self._first_index_at(s) for s in self._starts[1:]]
        out: list[SegmentInfo] = []
        for k, start in enumerate(self._starts):
            last = firsts[k + 1] - 1 if k + 1 < len(firsts) else self._last
            out.append(SegmentInfo(firsts[k], last, self._sizes[k], start, self._seg_path(k)))
        return out

    def delete_before(self, index: int) -> int:
        """Delete every whole segment whose entries all lie below `index`; returns the new
        `first_index()`.

        Never deletes the active segment or an entry past `durable_index()`. The caller
        must have made whatever the deleted entries fed (a state snapshot) durable first.
        Crash-safe in three steps (base file, index, unlink; see the module docstring).
        A failure before the new index is in place leaves the log usable as it was;
        one after it closes the log (reopen to recover).
        """
        self._check_open()
        limit = min(index, self._durable + 1)
        drop_segs = 0
        new_first = self._first
        for k in range(1, len(self._starts)):  # never the last (active) segment
            f = self._first_index_at(self._starts[k])
            if f > limit:
                break
            drop_segs, new_first = k, f
        if drop_segs == 0:
            return self._first
        base = (new_first - 1, self.term(new_first - 1))
        skip = new_first - self._first
        # 1. the base file: from here a reopen finishes the deletion
        self._write_base(*base)
        # 2. an index whose records start at the new first entry
        self._rewrite_index(skip, max(0, self._written - skip))
        self._written = max(0, self._written - skip)
        self._index_unsynced = 0
        self._first = new_first
        self._base = base
        if self._tail_first < new_first:
            del self._tail[: (new_first - self._tail_first) * INDEX_RECORD_SIZE]
            self._tail_first = new_first
        dead = self._starts[:drop_segs]
        del self._starts[:drop_segs]
        del self._sizes[:drop_segs]
        # 3. the data
        try:
            for start in dead:
                self._drop_fd(start)
                self._dirty.discard(start)
                os.unlink(os.path.join(self.dir, _segment_name(start)))
            fsync_dir(self.dir)
        except OSError as exc:
            self._close_fds()
            raise CommitLogError(
                f"deleting segments in {self.dir} failed: {exc}; the log is closed, "
                "reopen it to finish"
            ) from exc
        return new_first

    def reset_to(self, index: int, term: int) -> None:
        """Discard every entry, durably, and restart the log after `index` (of term
        `term`): afterwards `first_index() == index + 1`, `last_index() == index` and
        `term(index) == term`. For installing a snapshot that covers up to `index`.

        Crash-safe (see "Reset" in the module docstring): a reopen sees the old log or
        the new empty one, never a mix. Any failure closes the log (reopen to recover).
        """
        self._check_open()
        if index < 0 or term < 0:
            raise ValueError(f"reset_to({index}, {term}): negative index or term")
        pos = self._end
        reuse = self._sizes[-1] == 0 and self._starts[-1] == pos  # already empty there
        created = None
        try:
            if not reuse:
                created = os.path.join(self.dir, _segment_name(pos))
                os.close(os.open(created, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
            head = _RESET_HEAD.pack(_RESET_MAGIC, index, term, pos)
            atomic_write(os.path.join(self.dir, _BASE_NAME), head, _U32.pack(crc32c.crc32c(head)))
        except OSError as exc:
            self._close_fds()
            if created is not None:
                try:
                    os.unlink(created)
                except OSError:
                    pass
            raise CommitLogError(
                f"resetting {self.dir} failed: {exc}; the log is closed, reopen it to recover"
            ) from exc
        old = [s for s in self._starts if s != pos]
        try:
            os.ftruncate(self._ifd, 0)
            _fsync(self._ifd)
            for start in old:
                self._drop_fd(start)
                os.unlink(os.path.join(self.dir, _segment_name(start)))
            fsync_dir(self.dir)
        except OSError as exc:
            self._close_fds()
            raise CommitLogError(
                f"resetting {self.dir} failed after its base was written: {exc}; the log is "
                "closed, reopen it to finish"
            ) from exc
        self._starts, self._sizes = [pos], [0]
        self._dirty.clear()
        self._dir_dirty = False
        self._first = index + 1
        self._base = (index, term)
        self._last, self._last_term = index, term
        self._end = pos
        self._durable = index
        self._written = 0
        self._index_unsynced = 0
        self._tail = bytearray()
        self._tail_first = index + 1
        self._generation += 1  # an fsync begun before now vouches for nothing after it

    def _first_index_at(self, pos: int) -> int:
        """Smallest Raft index stored at or after position `pos` (last + 1 if none)."""
        lo, hi = self._first, self._last + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self._record(mid)[0] < pos:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _read_base(self) -> tuple[int, int, int]:
        """(index, term, start position) from the base file; the position is 0 unless
        `reset_to` wrote it."""
        try:
            with open(os.path.join(self.dir, _BASE_NAME), "rb") as f:
                raw = f.read(_RESET.size + 1)
        except FileNotFoundError:
            return (0, 0, 0)
        if len(raw) == _BASE.size:
            magic, index, term, crc = _BASE.unpack(raw)
            start, want_magic, head_size = 0, _BASE_MAGIC, _BASE_HEAD.size
        elif len(raw) == _RESET.size:
            magic, index, term, start, crc = _RESET.unpack(raw)
            want_magic, head_size = _RESET_MAGIC, _RESET_HEAD.size
        else:
            raise CommitLogError(f"{self.dir}/{_BASE_NAME}: {len(raw)} bytes, not {_BASE.size}")
        if magic != want_magic or crc != crc32c.crc32c(raw[:head_size]):
            raise CommitLogError(f"{self.dir}/{_BASE_NAME} is corrupt")
        return (index, term, start)

    def _write_base(self, index: int, term: int) -> None:
        """Replace the base file atomically (temp, fsync, rename, fsync dir)."""
        head = _BASE_HEAD.pack(_BASE_MAGIC, index, term)
        path = os.path.join(self.dir, _BASE_NAME)
        try:
            atomic_write(path, head, _U32.pack(crc32c.crc32c(head)))
        except OSError as exc:
            raise CommitLogError(f"writing {path} failed: {exc}") from exc

    def _rewrite_index(self, skip: int, count: int) -> None:
        """Replace the index file by its records [skip, skip + count) (temp, fsync, rename,
        fsync dir) and switch to it. Before the rename nothing has changed."""
        path = os.path.join(self.dir, _INDEX_NAME)
        tmp = path + _TMP
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise CommitLogError(f"creating {tmp} failed: {exc}") from exc
        try:
            _copy_range(self._ifd, fd, skip * INDEX_RECORD_SIZE, count * INDEX_RECORD_SIZE)
            _fsync(fd, tmp)
            os.rename(tmp, path)
        except BaseException as exc:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise CommitLogError(f"rewriting {path} failed: {exc}") from exc
            raise
        old, self._ifd = self._ifd, fd
        os.close(old)
        try:
            fsync_dir(self.dir)
        except OSError as exc:
            self._close_fds()
            raise CommitLogError(
                f"fsync of {self.dir} failed: {exc}; the log is closed, reopen it to recover"
            ) from exc

    # ------------------------------------------------------------------ durability

    def sync(self, now: float | None = None) -> int:
        """Group commit: one fsync per dirty file covers every append since the last.

        Returns the last index the configured policy counts as persisted: with
        ``fsync="always"`` the fsynced index (`durable_index`); with ``"interval"`` the
        last written index (page-cache durability) while the fsync itself only happens
        once `fsync_interval` has passed since the previous one (`now` defaults to
        ``time.monotonic()``). Safe to run in a worker thread if the caller runs nothing
        else on this log meanwhile.
        """
        self._check_open()
        if self.fsync_mode == "interval":
            now = time.monotonic() if now is None else now
            if now - self._last_fsync >= self.fsync_interval:
                self._fsync_data(now)
            return self._last
        self._fsync_data()
        return self._durable

    def begin_sync(self, now: float | None = None, *, fsync: bool = True) -> SyncPlan | None:
        """Group commit without blocking the caller: the fsyncs are `SyncPlan.run`, which
        may run in a worker thread while this log keeps taking appends and reads.

        Returns None when nothing new needs persisting. `fsync=False` makes a plan that
        reports the written entries as persisted without fsyncing them: only for the
        deliberate `skip-fsync` test mutation.
        """
        self._check_open()
        now = time.monotonic() if now is None else now
        due = self.fsync_mode == "always" or now - self._last_fsync >= self.fsync_interval
        if not (self._dirty or self._dir_dirty):
            return None  # every write is covered by a completed or in-flight fsync
        if not due or not fsync:
            return SyncPlan([], None, self._last, self._generation, now, fsynced=False)
        fds = [os.dup(self._fds[start]) for start in sorted(self._dirty)]
        self._dirty.clear()
        sync_dir = self.dir if self._dir_dirty else None
        self._dir_dirty = False
        return SyncPlan(fds, sync_dir, self._last, self._generation, now)

    def finish_sync(self, plan: SyncPlan) -> int:
        """Account for a completed `plan`; returns the index the policy counts as persisted
        (as `sync` does). A plan that failed closes the log, as a failed `sync` does."""
        plan.close()
        if plan.error is not None:
            self._close_fds()
            raise CommitLogError(
                f"fsync failed in {self.dir}: {plan.error}; the log is closed, reopen it to recover"
            ) from plan.error
        self._check_open()
        if plan.generation == self._generation:
            if plan.fsynced:
                self._durable = max(self._durable, min(plan.last, self._last))
                self._last_fsync = plan.started
                self._flush_index()
        if self.fsync_mode == "interval" or not plan.fsynced:
            return self._last
        return self._durable

    def _fsync_data(self, now: float | None = None) -> None:
        try:
            if self._dirty:
                for start in sorted(self._dirty):
                    _datasync(self._fds[start])
                self._dirty.clear()
            if self._dir_dirty:
                fsync_dir(self.dir)
                self._dir_dirty = False
        except OSError as exc:
            # After a failed fsync the kernel may have dropped the dirty pages and marked
            # them clean, so retrying could "succeed" without the data. Only a reopen,
            # whose recovery reads what is really on disk, can say what survived.
            self._close_fds()
            raise CommitLogError(
                f"fsync failed in {self.dir}: {exc}; the log is closed, reopen it to recover"
            ) from exc
        self._durable = self._last
        self._last_fsync = time.monotonic() if now is None else now
        self._flush_index()
        self._evict_fds()

    def _flush_index(self, force_fsync: bool = False) -> None:
        """Write index records of fsynced entries in batches; fsync the index now and then."""
        target = self._durable - self._first + 1  # records the file may hold
        if target > self._written and not force_fsync:
            pending = target - self._written
            lo_pos = self._record(self._first + self._written)[0]
            hi_pos, _t, hi_size, _y = self._record(self._durable)
            if pending < _INDEX_WRITE_RECORDS and hi_pos + hi_size - lo_pos < _INDEX_WRITE_BYTES:
                target = self._written
        if target > self._written:
            lo = (self._first + self._written - self._tail_first) * INDEX_RECORD_SIZE
            hi = (self._first + target - self._tail_first) * INDEX_RECORD_SIZE
            _pwritev_all(self._ifd, [self._tail[lo:hi]], self._written * INDEX_RECORD_SIZE)
            self._index_unsynced += target - self._written
            self._written = target
        if self._index_unsynced and (force_fsync or self._index_unsynced >= _INDEX_FSYNC_EVERY):
            _fsync(self._ifd)
            self._index_unsynced = 0
        # keep the in-memory tail bounded (only records already in the file may go)
        excess = len(self._tail) // INDEX_RECORD_SIZE - _TAIL_CACHE
        if excess > _TAIL_CACHE:
            drop = min(excess, self._first + self._written - self._tail_first)
            if drop > 0:
                del self._tail[: drop * INDEX_RECORD_SIZE]
                self._tail_first += drop

    # ------------------------------------------------------------------ reading

    def position_of(self, index: int) -> int:
        """Position of entry `index`: its message address within the group."""
        return self._record(index)[0]

    def read_raw(
        self, lo: int, hi: int, *, max_bytes: int | None = None, verify: bool = True
    ) -> bytes | memoryview:
        """Stored bytes (headers + bodies) of entries [lo, hi), read in one ``pread`` per
        segment and returned without per-entry objects: what peers and consumers get.

        With `max_bytes`, stops after the last whole entry that fits (at least one).
        With `verify` (default) both CRCs of every entry are checked; a corrupt entry
        after good ones ends the result early, a corrupt first entry raises CorruptEntry.
        """
        self._check_span(lo, hi)
        if lo >= hi:
            return b""
        if max_bytes is None and not verify:
            chunks = [c for _p, c in self._read_span(self._record(lo)[0], self._end_pos(hi))]
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks, stop = self._walk(lo, hi, max_bytes, verify, None)
        total = sum(len(c) for c in chunks)
        if len(chunks) == 1:
            return chunks[0] if stop == total else memoryview(chunks[0])[:stop]
        joined = b"".join(chunks)
        return joined if stop == total else memoryview(joined)[:stop]

    def read_at(self, position: int) -> Entry:
        """The entry stored at `position` (a message id), with both CRCs verified."""
        self._check_open()
        if not (self._starts[0] <= position < self._end):
            raise OutOfRange(f"position {position} outside [{self._starts[0]}, {self._end})")
        k = bisect.bisect_right(self._starts, position) - 1
        fd, path = self._fd(k), self._seg_path(k)
        seg_end = self._starts[k] + self._sizes[k]
        rel = position - self._starts[k]
        hdr = memoryview(_pread_exact(fd, min(HEADER_SIZE, seg_end - position), rel))
        if len(hdr) < HEADER_SIZE:
            raise CorruptEntry(path, position, "no entry header at this position")
        err, (_m, size, term, index, etype, bcrc) = _check_header(hdr, 0)
        if err:
            raise CorruptEntry(path, position, f"no valid entry here ({err})")
        if not (self._first <= index <= self._last) or self._record(index)[0] != position:
            raise CorruptEntry(path, position, "header does not match the index", index)
        if position + size > seg_end:
            raise CorruptEntry(path, position, "entry runs past the segment end", index)
        body = _pread_exact(fd, size - HEADER_SIZE, rel + HEADER_SIZE)
        if len(body) != size - HEADER_SIZE or crc32c.crc32c(body) != bcrc:
            raise CorruptEntry(path, position, "body CRC mismatch", index)
        return Entry(index, term, _TYPES[etype], body)

    def verify(self, lo: int | None = None, hi: int | None = None) -> list[CorruptEntry]:
        """Check every entry in [lo, hi) against its index record and CRCs.

        Driven by index records, so a corrupt header does not hide the entries after it.
        Returns the problems found (empty when all is well).
        """
        self._check_open()
        lo = self._first if lo is None else lo
        hi = self._last + 1 if hi is None else hi
        self._check_span(lo, hi)
        bad: list[CorruptEntry] = []
        i = lo
        while i < hi:
            n = min(hi - i, 4096)
            recs = self._records(i, i + n)
            # keep reads bounded: stop the batch once it spans _SCAN_CHUNK bytes
            span_end = recs[0][0]
            take = 0
            for pos, _t, size, _ty in recs:
                if take and pos + size - recs[0][0] > _SCAN_CHUNK:
                    break
                span_end = pos + size
                take += 1
            recs = recs[:take]
            base = recs[0][0]
            buf = bytearray()
            for _p, chunk in self._read_span(base, span_end, strict=False):
                buf += chunk
            mv = memoryview(buf)
            for j, (pos, term, size, etype) in enumerate(recs):
                problem = self._check_stored(mv, pos - base, i + j, term, size, etype)
                if problem:
                    k = bisect.bisect_right(self._starts, pos) - 1
                    bad.append(CorruptEntry(self._seg_path(k), pos, problem, i + j))
            i += take
        return bad

    def repair(self, index: int, raw: bytes | memoryview) -> bool:
        """Overwrite the stored entry `index` with `raw`, a peer's ``read_raw(index,
        index + 1)``, and fsync it; afterwards reads of it work again. Returns False,
        writing nothing, when the local copy is intact already.

        `raw` must be exactly one entry whose CRCs verify and whose index, term, type and
        size equal this log's record of `index` (and its header, where that is intact).
        Raises CorruptEntry when `raw` fails its CRCs, ValueError when it is another
        entry (nothing is written in either case), OutOfRange outside the log. A failed
        write or fsync closes the log, as a failed `sync` does.
        """
        self._check_open()
        if not self._first <= index <= self._last:
            raise OutOfRange(f"index {index} outside [{self._first}, {self._last}]")
        pos, term, size, etype = self._record(index)
        mv = memoryview(raw).cast("B")
        src = f"<repair of entry {index}>"
        if len(mv) < HEADER_SIZE:
            raise CorruptEntry(src, 0, f"{len(mv)} bytes, not even a header", index)
        err, (_m, rsize, rterm, rindex, rtype, bcrc) = _check_header(mv, 0)
        if err:
            raise CorruptEntry(src, 0, err, index)
        if (rindex, rterm, rsize, rtype) != (index, term, size, etype) or len(mv) != size:
            raise ValueError(
                f"repair of entry {index} (term {term}, type {etype}, {size} bytes) with "
                f"{len(mv)} bytes holding entry {rindex} (term {rterm}, type {rtype}, "
                f"{rsize} bytes)"
            )
        if crc32c.crc32c(mv[HEADER_SIZE:]) != bcrc:
            raise CorruptEntry(src, 0, "body CRC mismatch", index)
        k = bisect.bisect_right(self._starts, pos) - 1
        rel = pos - self._starts[k]
        if k < 0 or rel + size > self._sizes[k]:
            raise CommitLogError(f"{self.dir}: entry {index} lies outside its segment")
        fd = self._fd(k)
        local = memoryview(_pread_exact(fd, size, rel))
        if local == mv:
            return False
        if len(local) >= HEADER_SIZE:
            lerr, (_lm, lsize, lterm, lindex, ltype, _lb) = _check_header(local, 0)
            if lerr is None and (lindex, lterm, lsize, ltype) != (index, term, size, etype):
                raise ValueError(
                    f"entry {index}: its intact header (index {lindex}, term {lterm}) "
                    "disagrees with the index; not repairing over it"
                )
        try:
            _pwritev_all(fd, [mv], rel)
            _datasync(fd)
        except OSError as exc:
            self._close_fds()
            raise CommitLogError(
                f"repairing entry {index} in {self._seg_path(k)} failed: {exc}; the log is "
                "closed, reopen it to recover"
            ) from exc
        if index in self.recovery.corrupt:
            self.recovery.corrupt.remove(index)
        return True

    @staticmethod
    def _check_stored(
        mv: memoryview, off: int, index: int, term: int, size: int, etype: int
    ) -> str | None:
        if off + HEADER_SIZE > len(mv):
            return "missing data"
        err, (_m, hsize, hterm, hindex, htype, bcrc) = _check_header(mv, off)
        if err:
            return err
        if (hindex, hterm, hsize, htype) != (index, term, size, etype):
            return "header does not match the index record"
        if off + size > len(mv):
            return "missing data"
        if crc32c.crc32c(mv[off + HEADER_SIZE : off + size]) != bcrc:
            return "body CRC mismatch"
        return None

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise CommitLogError(f"commit log {self.dir} is closed")

    def _check_span(self, lo: int, hi: int) -> None:
        self._check_open()
        if lo < self._first or lo > self._last + 1 or hi > self._last + 1:
            raise OutOfRange(f"entries [{lo}, {hi}) outside [{self._first}, {self._last + 1})")

    def _seg_path(self, k: int) -> str:
        return os.path.join(self.dir, _segment_name(self._starts[k]))

    def _fd(self, k: int) -> int:
        start = self._starts[k]
        fd = self._fds.get(start)
        if fd is None:
            fd = os.open(self._seg_path(k), os.O_RDWR)
            self._fds[start] = fd
            self._evict_fds(keep=start)
        return fd

    def _drop_fd(self, start: int) -> None:
        fd = self._fds.pop(start, None)
        if fd is not None:
            os.close(fd)

    def _evict_fds(self, keep: int = -1) -> None:
        """Close clean read fds beyond the cap (never the active or a dirty segment)."""
        if len(self._fds) <= _MAX_OPEN_FDS:
            return
        active = self._starts[-1]
        for start in list(self._fds):
            if len(self._fds) <= _MAX_OPEN_FDS:
                break
            if start != active and start != keep and start not in self._dirty:
                os.close(self._fds.pop(start))

    def _record(self, index: int) -> tuple[int, int, int, int]:
        """(position, term, size, type) of `index` from the tail cache or the index file."""
        self._check_open()
        if not (self._first <= index <= self._last):
            raise OutOfRange(f"index {index} outside [{self._first}, {self._last}]")
        if index >= self._tail_first:
            pos, term, size, etype, _crc = _IREC.unpack_from(
                self._tail, (index - self._tail_first) * INDEX_RECORD_SIZE
            )
            return pos, term, size, etype
        raw = os.pread(self._ifd, INDEX_RECORD_SIZE, (index - self._first) * INDEX_RECORD_SIZE)
        if len(raw) != INDEX_RECORD_SIZE:
            raise CorruptIndex(f"{self.dir}/index: record {index} missing")
        pos, term, size, etype, crc = _IREC.unpack(raw)
        if crc != crc32c.crc32c(raw[: _IREC_HEAD.size], index & _M32):
            raise CorruptIndex(
                f"{self.dir}/index: record {index} fails its CRC; reopen to rebuild the index"
            )
        return pos, term, size, etype

    def _records(self, lo: int, hi: int) -> list[tuple[int, int, int, int]]:
        """Records [lo, hi) with one read of the index file for the part not in memory."""
        out: list[tuple[int, int, int, int]] = []
        disk_hi = min(hi, self._tail_first)
        if lo < disk_hi:
            raw = memoryview(
                _pread_exact(
                    self._ifd,
                    (disk_hi - lo) * INDEX_RECORD_SIZE,
                    (lo - self._first) * INDEX_RECORD_SIZE,
                )
            )
            if len(raw) != (disk_hi - lo) * INDEX_RECORD_SIZE:
                raise CorruptIndex(f"{self.dir}/index: records {lo}..{disk_hi - 1} missing")
            for j, (pos, term, size, etype, crc) in enumerate(_IREC.iter_unpack(raw)):
                off = j * INDEX_RECORD_SIZE
                if crc != crc32c.crc32c(raw[off : off + _IREC_CRC_AT], (lo + j) & _M32):
                    raise CorruptIndex(
                        f"{self.dir}/index: record {lo + j} fails its CRC; "
                        "reopen to rebuild the index"
                    )
                out.append((pos, term, size, etype))
        for j in range(max(lo, self._tail_first), hi):
            pos, term, size, etype, _crc = _IREC.unpack_from(
                self._tail, (j - self._tail_first) * INDEX_RECORD_SIZE
            )
            out.append((pos, term, size, etype))
        return out

    def _end_pos(self, hi: int) -> int:
        """Position just after entry hi-1."""
        if hi > self._last:
            return self._end
        return self._record(hi)[0]

    def _read_span(self, start: int, end: int, strict: bool = True) -> Iterator[tuple[int, bytes]]:
        """Bytes [start, end) as one chunk per segment: (position, bytes)."""
        k = bisect.bisect_right(self._starts, start) - 1
        while start < end:
            seg_end = self._starts[k] + self._sizes[k]
            n = min(end, seg_end) - start
            if n <= 0:
                if k + 1 >= len(self._starts):
                    if strict:
                        raise CorruptEntry(
                            self._seg_path(k), start, "data missing past segment end"
                        )
                    return
                k += 1
                continue
            data = _pread_exact(self._fd(k), n, start - self._starts[k])
            if len(data) != n and strict:
                raise CorruptEntry(
                    self._seg_path(k), start + len(data), "segment shorter than expected"
                )
            yield start, data
            if len(data) != n:
                return
            start += n
            k += 1

    def _walk(
        self,
        lo: int,
        hi: int,
        max_bytes: int | None,
        verify: bool,
        out: list[Entry] | None,
    ) -> tuple[list[bytes], int]:
        """Read entries [lo, hi) (bounded by max_bytes) segment by segment.

        Fills `out` with Entry objects when given. Returns the chunks read and the byte
        count of the complete, verified prefix within them.
        """
        start, _term, first_size, _t = self._record(lo)
        end = self._end_pos(hi)
        if max_bytes is not None:
            end = min(end, start + max(max_bytes, first_size))
        chunks: list[bytes] = []
        stop = 0  # bytes of complete verified entries across chunks
        expect = lo
        for cpos, chunk in self._read_span(start, end):
            chunks.append(chunk)
            mv = memoryview(chunk)
            n = len(mv)
            off = 0
            while off < n and expect < hi:
                if n - off < HEADER_SIZE:
                    break  # cut by max_bytes
                err, (_m, size, term, index, etype, bcrc) = _check_header(mv, off)
                if err is None and index != expect:
                    err = f"holds index {index}, expected {expect}"
                if err:
                    self._corrupt(expect, cpos + off, err, stop)
                    return chunks, stop
                if off + size > n:
                    if expect == lo:
                        self._corrupt(expect, cpos + off, "size disagrees with the index", stop)
                    break  # cut by max_bytes
                if verify and crc32c.crc32c(mv[off + HEADER_SIZE : off + size]) != bcrc:
                    self._corrupt(expect, cpos + off, "body CRC mismatch", stop)
                    return chunks, stop
                if out is not None:
                    out.append(
                        Entry(
                            index, term, _TYPES[etype], bytes(mv[off + HEADER_SIZE : off + size])
                        )
                    )
                off += size
                stop += size
                expect += 1
            if off < n or expect >= hi:
                break
        return chunks, stop

    def _corrupt(self, index: int, pos: int, reason: str, good_bytes: int) -> None:
        """Raise CorruptEntry unless some good entries precede it (then end the read)."""
        if good_bytes:
            return
        k = bisect.bisect_right(self._starts, pos) - 1
        raise CorruptEntry(self._seg_path(max(k, 0)), pos, reason, index)

    # ------------------------------------------------------------------ recovery

    def _recover(self, check_index: bool) -> None:
        rep = self.recovery
        created = not os.path.isdir(self.dir)
        os.makedirs(self.dir, exist_ok=True)
        if created:
            fsync_dir(self.path)
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        for leftover in (_INDEX_NAME + _TMP, _BASE_NAME + _TMP):
            try:
                os.unlink(os.path.join(self.dir, leftover))
            except FileNotFoundError:
                pass
        base_index, base_term, base_start = self._read_base()
        self._base = (base_index, base_term)
        names = sorted(
            n for n in os.listdir(self.dir) if len(n) == _SEGMENT_NAME_LEN and n.isdigit()
        )
        stale = [n for n in names if int(n) < base_start]
        if stale:  # an interrupted reset_to: its base is written, so the old log is gone
            for n in stale:
                os.unlink(os.path.join(self.dir, n))
                rep.deletion_finished.append(n)
            fsync_dir(self.dir)
            names = names[len(stale) :]
        self._starts = [int(n) for n in names]
        self._sizes = [os.path.getsize(os.path.join(self.dir, n)) for n in names]
        index_path = os.path.join(self.dir, _INDEX_NAME)
        self._ifd = os.open(index_path, os.O_RDWR | os.O_CREAT, 0o644)
        if not self._starts and self._base[0]:
            raise CommitLogError(
                f"{self.dir}: the base file says entries up to {self._base[0]} were deleted, "
                "but no segment is left"
            )
        if not self._starts:
            self._roll(0)
            os.ftruncate(self._ifd, 0)
            _fsync(self._ifd)
            fsync_dir(self.dir)
            self._dir_dirty = False
            self._dirty.clear()
            return

        self._finish_deletion()

        # first index: from the first entry's header, else after the base, else 1
        head_first = self._segment_head_index(0)
        if head_first is not None:
            self._first = head_first
        else:
            self._first = self._base[0] + 1
        data_start = self._starts[0]

        # 1. the index prefix that verifies
        nrec = os.fstat(self._ifd).st_size // INDEX_RECORD_SIZE
        valid = self._valid_index_prefix(nrec, data_start, check_index)
        rep.index_records_valid = valid

        # 2. walk back over a torn tail the index still vouches for
        scan_pos, expect, prev_term = data_start, self._first, self._base_term_or_zero()
        while valid > 0:
            idx = self._first + valid - 1
            pos, term, size, etype = self._disk_record(idx)
            problem = self._probe_entry(pos, idx, term, size, etype)
            if problem is None:
                scan_pos, expect, prev_term = pos + size, idx + 1, term
                break
            if self._follows_valid(pos, size, idx, term):
                rep.corrupt.append(idx)
                scan_pos, expect, prev_term = pos + size, idx + 1, term
                break
            valid -= 1
        self._written = valid
        self._last = expect - 1
        self._last_term = prev_term

        # 3. walk forward through the data past what the index vouched for
        verify_from = scan_pos if valid else self._starts[max(0, len(self._starts) - 2)]
        records = bytearray()
        cut, k, next_index, reason = self._scan(scan_pos, expect, prev_term, verify_from, records)
        rep.reason = reason
        rep.index_rebuilt = len(records) // INDEX_RECORD_SIZE

        # 4. cut the data, make everything durable, then fix the index
        if self._cut_data(cut, k):
            rep.truncated_from_index = next_index
        # segments before the one holding the last vouched entry were fsynced before that
        # entry's index record was written; the rest may hold page-cache-only data
        for j in range(max(0, bisect.bisect_right(self._starts, scan_pos) - 2), len(self._starts)):
            _datasync(self._fd(j))
        fsync_dir(self.dir)
        if os.fstat(self._ifd).st_size != self._written * INDEX_RECORD_SIZE or records:
            os.ftruncate(self._ifd, self._written * INDEX_RECORD_SIZE)
            if records:
                _pwritev_all(self._ifd, [records], self._written * INDEX_RECORD_SIZE)
            _fsync(self._ifd)
        self._written += len(records) // INDEX_RECORD_SIZE
        self._last = self._first + self._written - 1
        self._end = cut
        self._dirty.clear()
        self._dir_dirty = False
        self._durable = self._last
        self._last_term = (
            self._disk_record(self._last)[1]
            if self._last >= self._first
            else self._base_term_or_zero()
        )
        # warm the tail cache with the newest records
        keep = min(self._written, _TAIL_WARM)
        self._tail_first = self._last + 1 - keep
        self._tail = bytearray(
            _pread_exact(
                self._ifd, keep * INDEX_RECORD_SIZE, (self._written - keep) * INDEX_RECORD_SIZE
            )
        )
        self._evict_fds()

    def _base_term_or_zero(self) -> int:
        return self._base[1] if self._base[0] == self._first - 1 else 0

    def _segment_head_index(self, k: int) -> int | None:
        """Raft index in the header of segment `k`'s first entry (None if unreadable)."""
        head = memoryview(_pread_exact(self._fd(k), HEADER_SIZE, 0))
        if len(head) < HEADER_SIZE:
            return None
        err, fields = _check_header(head, 0)
        return None if err else fields[3]

    def _finish_deletion(self) -> None:
        """Roll forward a `delete_before` interrupted after its base file was written."""
        base = self._base[0]
        if not base or len(self._starts) < 2:
            return
        old_start = self._starts[0]
        old_first = self._segment_head_index(0)
        gone: list[int] = []
        while len(self._starts) > 1:
            nxt = self._segment_head_index(1)
            if nxt is None or nxt > base + 1:
                break
            start = self._starts.pop(0)
            self._sizes.pop(0)
            self._drop_fd(start)
            gone.append(start)
        if not gone:
            return
        new_first = self._segment_head_index(0)
        if old_first is not None and new_first is not None and new_first > old_first:
            # the index may still start at the old first entry (step 2 not done)
            raw = _pread_exact(self._ifd, INDEX_RECORD_SIZE, 0)
            if len(raw) == INDEX_RECORD_SIZE:
                pos, _t, _s, _y, crc = _IREC.unpack(raw)
                if pos == old_start and crc == crc32c.crc32c(raw[:_IREC_CRC_AT], old_first & _M32):
                    nrec = os.fstat(self._ifd).st_size // INDEX_RECORD_SIZE
                    skip = new_first - old_first
                    self._rewrite_index(skip, max(0, nrec - skip))
        for start in gone:
            name = _segment_name(start)
            self.recovery.deletion_finished.append(name)
            os.unlink(os.path.join(self.dir, name))
        fsync_dir(self.dir)

    def _disk_record(self, index: int) -> tuple[int, int, int, int]:
        raw = _pread_exact(self._ifd, INDEX_RECORD_SIZE, (index - self._first) * INDEX_RECORD_SIZE)
        pos, term, size, etype, _crc = _IREC.unpack(raw)
        return pos, term, size, etype

    def _valid_index_prefix(self, nrec: int, data_start: int, check_all: bool) -> int:
        """Number of leading index records whose CRC verifies and whose positions chain."""
        first = self._first
        if nrec and not check_all:
            # trust all but the last record, which is checked against its predecessor
            raw = (
                _pread_exact(self._ifd, 2 * INDEX_RECORD_SIZE, (nrec - 2) * INDEX_RECORD_SIZE)
                if nrec > 1
                else b""
            )
            if nrec > 1 and len(raw) == 2 * INDEX_RECORD_SIZE:
                p0, t0, s0, _y0, c0 = _IREC.unpack_from(raw, 0)
                p1, t1, _s1, y1, c1 = _IREC.unpack_from(raw, INDEX_RECORD_SIZE)
                ok0 = c0 == crc32c.crc32c(raw[:_IREC_CRC_AT], (first + nrec - 2) & _M32)
                ok1 = c1 == crc32c.crc32c(
                    raw[INDEX_RECORD_SIZE : INDEX_RECORD_SIZE + _IREC_CRC_AT],
                    (first + nrec - 1) & _M32,
                )
                if ok0 and ok1 and p1 == p0 + s0 and t1 >= t0 and y1 <= _MAX_TYPE:
                    return nrec
        valid = 0
        expect_pos = data_start
        prev_term = 0
        while valid < nrec:
            n = min(_INDEX_CHUNK, nrec - valid)
            buf = memoryview(
                _pread_exact(self._ifd, n * INDEX_RECORD_SIZE, valid * INDEX_RECORD_SIZE)
            )
            i = first + valid
            off = 0
            for pos, term, size, etype, crc in _IREC.iter_unpack(buf[: (len(buf) // 32) * 32]):
                if (
                    pos != expect_pos
                    or term < prev_term
                    or size < HEADER_SIZE
                    or etype > _MAX_TYPE
                    or crc != crc32c.crc32c(buf[off : off + _IREC_CRC_AT], i & _M32)
                ):
                    return valid
                expect_pos = pos + size
                prev_term = term
                valid += 1
                i += 1
                off += INDEX_RECORD_SIZE
            if len(buf) < n * INDEX_RECORD_SIZE:
                break
        return valid

    def _locate(self, pos: int) -> int:
        """Segment holding the entry starting at `pos` (-1 if none)."""
        k = bisect.bisect_right(self._starts, pos) - 1
        while 0 <= k < len(self._starts) and pos >= self._starts[k] + self._sizes[k]:
            if k + 1 < len(self._starts) and self._starts[k + 1] == pos:
                k += 1
            else:
                return -1
        return k

    def _probe_entry(self, pos: int, index: int, term: int, size: int, etype: int) -> str | None:
        """Why the entry an index record points at is not intact (None if it is)."""
        k = self._locate(pos)
        if k < 0:
            return "beyond the data"
        rel = pos - self._starts[k]
        if rel + size > self._sizes[k]:
            return "runs past the segment end"
        data = memoryview(_pread_exact(self._fd(k), size, rel))
        return self._check_stored(data, 0, index, term, size, etype)

    def _entry_ok(self, pos: int, index: int, min_term: int) -> bool:
        """Whether an intact entry `index` (term >= min_term) starts at `pos`."""
        k = self._locate(pos)
        if k < 0:
            return False
        rel = pos - self._starts[k]
        head = memoryview(_pread_exact(self._fd(k), HEADER_SIZE, rel))
        if len(head) < HEADER_SIZE:
            return False
        err, (_m, size, term, hindex, _ty, bcrc) = _check_header(head, 0)
        if err or hindex != index or term < min_term or rel + size > self._sizes[k]:
            return False
        body = _pread_exact(self._fd(k), size - HEADER_SIZE, rel + HEADER_SIZE)
        return crc32c.crc32c(body) == bcrc

    def _follows_valid(self, pos: int, size: int, index: int, term: int) -> bool:
        """A bad entry is 'in the middle' (kept) iff the next one is intact."""
        return self._entry_ok(pos + size, index + 1, term)

    def _scan(
        self, pos: int, expect: int, prev_term: int, verify_from: int, records: bytearray
    ) -> tuple[int, int, int, str]:
        """Walk entries from `pos`, appending their index records.

        Returns (cut position, segment holding it, first Raft index not kept, reason).
        """
        rep = self.recovery
        k = max(0, bisect.bisect_right(self._starts, pos) - 1)
        readahead = _SCAN_CHUNK
        win: _Window | None = None
        while True:
            seg_end = self._starts[k] + self._sizes[k]
            if pos >= seg_end:
                if k + 1 >= len(self._starts):
                    return pos, k, expect, "end of data"
                if self._starts[k + 1] != pos:
                    return (
                        pos,
                        k,
                        expect,
                        f"gap before segment {_segment_name(self._starts[k + 1])}",
                    )
                k += 1
                win = None
                continue
            if win is None:
                win = _Window(self._fd(k), self._starts[k], self._sizes[k])
            check_body = pos >= verify_from
            head = win.get(pos, HEADER_SIZE, _SCAN_CHUNK if check_body else readahead)
            if head is None:
                return pos, k, expect, f"torn header of entry {expect} at {pos}"
            err, (_m, size, term, index, etype, bcrc) = _check_header(head, 0)
            if err is None:
                if index != expect:
                    err = f"index {index} where {expect} was expected"
                elif term < prev_term:
                    err = f"term {term} below previous {prev_term}"
                elif pos + size > seg_end:
                    err = "torn body"
            if err:
                return pos, k, expect, f"entry {expect} at {pos}: {err}"
            if check_body:
                body = win.get(pos + HEADER_SIZE, size - HEADER_SIZE, _SCAN_CHUNK)
                if body is None or crc32c.crc32c(body) != bcrc:
                    if not self._follows_valid(pos, size, index, term):
                        return pos, k, expect, f"entry {expect} at {pos}: body CRC mismatch"
                    rep.corrupt.append(index)
            else:
                readahead = HEADER_SIZE if size >= _SCAN_CHUNK // 4 else _SCAN_CHUNK
            records += _index_record(index, pos, term, size, etype)
            pos += size
            expect += 1
            prev_term = term

    def _cut_data(self, cut: int, k: int) -> bool:
        """Truncate segment `k` at `cut` and delete every later segment; True if any
        bytes were dropped."""
        rep = self.recovery
        removed = 0
        for j in range(len(self._starts) - 1, k, -1):
            removed += self._sizes[j]
            name = _segment_name(self._starts[j])
            rep.segments_removed.append(name)
            self._drop_fd(self._starts[j])
            os.unlink(os.path.join(self.dir, name))
        del self._starts[k + 1 :]
        del self._sizes[k + 1 :]
        keep = cut - self._starts[k]
        if self._sizes[k] > keep:
            removed += self._sizes[k] - keep
            os.ftruncate(self._fd(k), keep)
            self._sizes[k] = keep
        rep.truncated_bytes = removed
        return removed > 0 or bool(rep.segments_removed)
