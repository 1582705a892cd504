"""Index: Raft index -> (position, term, size, type), in a file of fixed-size records.

Record ``i`` lives at ``(i - first_index) * 32``::

    position u64 | term u64 | size u32 | type u8 | flags u8 | 6 zero bytes | crc32c u32

The record CRC covers the 28 bytes before it and is seeded with the Raft index, so a
garbled or misplaced record is detected. Flag `VOUCHED` says the record was written by a
log under ``fsync="always"`` that never skipped an fsync: its entry was fsynced before
the record, and the Raft layer counted that fsync, so recovery treats such an entry
missing from the data as damage to repair, never as a torn tail. Records of older files
(whose flags byte is zero), and of ``interval`` or ``skip-fsync`` logs, are not vouched. `term()` reads only the index (an in-memory tail
of recent records, else one ``pread``), never an entry body.

Only fsynced entries get their index records written, so the index on disk never vouches
for data that was not fsynced first. Those writes are batched (every 4096 records or 64 MiB
of data) and the index is fsynced lazily (every 65536 records, on truncation and on
close): the data fsync stays the only fsync on the commit path, and recovery rebuilds any
suffix the index misses from the data. Records not yet in the file are served from memory.
"""

from __future__ import annotations

import errno
import os
import struct

import crc32c

from raftlog.commitlog._format import (
    HEADER_SIZE,
    MAX_TYPE,
    CommitLogError,
    CorruptIndex,
    OutOfRange,
)
from raftlog.commitlog._segments import _Segments, copy_range, pread_exact, pwritev_all
from raftlog.fsutil import fsync_dir, fsync_fd

__all__ = ["INDEX_RECORD_SIZE", "VOUCHED"]

IREC_HEAD = struct.Struct("<QQIBB6x")  # the part the record CRC covers (28 bytes)
IREC_TAIL = struct.Struct("<I")
IREC = struct.Struct("<QQIBB6xI")
VOUCHED = 1  # flags: the entry was fsynced under fsync="always" before this record was written
IREC_CRC_AT = IREC_HEAD.size
INDEX_RECORD_SIZE = IREC.size  # 32
M32 = 0xFFFFFFFF
INDEX_NAME = "index"
TMP = ".tmp"
_TAIL_CACHE = 1 << 16  # index records of the newest entries kept in memory (2 MiB)
# Index records of fsynced entries are written in batches: each write dirties a second
# file, which the next data fsync would also have to flush (ext4 data=ordered). Recovery
# rescans whatever the index does not cover, so these bound the rescan after a crash.
_INDEX_WRITE_RECORDS = 4096
_INDEX_WRITE_BYTES = 64 << 20  # data covered by the pending records
_INDEX_FSYNC_EVERY = 1 << 16  # records written since the index file's last fsync
_INDEX_CHUNK = 1 << 15  # records per read while validating the index



def index_record(index: int, pos: int, term: int, size: int, etype: int, flags: int = 0) -> bytes:
    """One index record: what `IREC` unpacks, its CRC seeded with the Raft index."""
    head = IREC_HEAD.pack(pos, term, size, etype, flags)
    return head + IREC_TAIL.pack(crc32c.crc32c(head, index & M32))


class _Index(_Segments):
    """The index file, its in-memory tail, and the log bounds it vouches for."""

    _first: int
    _base: tuple[int, int]  # (index, term) from the base file: the last deleted entry
    _last: int
    _last_term: int
    _durable: int  # newest index covered by an fsync
    _generation: int  # bumped by truncations: an fsync begun before one covers nothing after
    _ifd: int
    _written: int  # records present in the index file: [first, first + written)
    _index_unsynced: int  # records written to the index file since its fsync
    _tail: bytearray  # records [tail_first, last] in memory
    _tail_first: int
    _index_flags: int  # flags of the records this log writes (VOUCHED or 0)

    def __init__(self, path: str, segment_size: int) -> None:
        super().__init__(path, segment_size)
        self._index_flags = 0
        self._first = 1
        self._base = (0, 0)
        self._last = 0
        self._last_term = 0
        self._durable = 0
        self._generation = 0
        self._ifd = -1
        self._written = 0
        self._index_unsynced = 0
        self._tail = bytearray()
        self._tail_first = 1

    def _close_fds(self) -> None:
        super()._close_fds()
        if self._ifd >= 0:
            try:
                os.close(self._ifd)
            except OSError:
                pass
            self._ifd = -1

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

    def _record(self, index: int) -> tuple[int, int, int, int]:
        """(position, term, size, type) of `index` from the tail cache or the index file."""
        self._check_open()
        if not (self._first <= index <= self._last):
            raise OutOfRange(f"index {index} outside [{self._first}, {self._last}]")
        if index >= self._tail_first:
            pos, term, size, etype, _fl, _crc = IREC.unpack_from(
                self._tail, (index - self._tail_first) * INDEX_RECORD_SIZE
            )
            return pos, term, size, etype
        raw = os.pread(self._ifd, INDEX_RECORD_SIZE, (index - self._first) * INDEX_RECORD_SIZE)
        if len(raw) != INDEX_RECORD_SIZE:
            raise CorruptIndex(f"{self.dir}/index: record {index} missing")
        pos, term, size, etype, _fl, crc = IREC.unpack(raw)
        if crc != crc32c.crc32c(raw[: IREC_HEAD.size], index & M32):
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
                pread_exact(
                    self._ifd,
                    (disk_hi - lo) * INDEX_RECORD_SIZE,
                    (lo - self._first) * INDEX_RECORD_SIZE,
                )
            )
            if len(raw) != (disk_hi - lo) * INDEX_RECORD_SIZE:
                raise CorruptIndex(f"{self.dir}/index: records {lo}..{disk_hi - 1} missing")
            for j, (pos, term, size, etype, _fl, crc) in enumerate(IREC.iter_unpack(raw)):
                off = j * INDEX_RECORD_SIZE
                if crc != crc32c.crc32c(raw[off : off + IREC_CRC_AT], (lo + j) & M32):
                    raise CorruptIndex(
                        f"{self.dir}/index: record {lo + j} fails its CRC; "
                        "reopen to rebuild the index"
                    )
                out.append((pos, term, size, etype))
        for j in range(max(lo, self._tail_first), hi):
            pos, term, size, etype, _fl, _crc = IREC.unpack_from(
                self._tail, (j - self._tail_first) * INDEX_RECORD_SIZE
            )
            out.append((pos, term, size, etype))
        return out

    def _end_pos(self, hi: int) -> int:
        """Position just after entry hi-1."""
        if hi > self._last:
            return self._end
        return self._record(hi)[0]

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

    def _unvouch_pending(self) -> None:
        """Clear `VOUCHED` on the records not yet in the index file (the log stopped
        counting entries persisted only after their fsync); later ones carry 0."""
        self._index_flags = 0
        for i in range(max(self._first + self._written, self._tail_first), self._last + 1):
            off = (i - self._tail_first) * INDEX_RECORD_SIZE
            pos, term, size, etype, _flags, _crc = IREC.unpack_from(self._tail, off)
            self._tail[off : off + INDEX_RECORD_SIZE] = index_record(i, pos, term, size, etype)

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
            fsync_fd(self._ifd)
            self._index_unsynced = 0

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
            try:
                pwritev_all(self._ifd, [self._tail[lo:hi]], self._written * INDEX_RECORD_SIZE)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # A full disk: the records stay in memory (the tail keeps every record
                # not yet in the file) and a later flush writes them; the file may lag
                # its data meanwhile, which recovery rebuilds from the segments.
                return
            self._index_unsynced += target - self._written
            self._written = target
        if self._index_unsynced and (force_fsync or self._index_unsynced >= _INDEX_FSYNC_EVERY):
            fsync_fd(self._ifd)
            self._index_unsynced = 0
        # keep the in-memory tail bounded (only records already in the file may go)
        excess = len(self._tail) // INDEX_RECORD_SIZE - _TAIL_CACHE
        if excess > _TAIL_CACHE:
            drop = min(excess, self._first + self._written - self._tail_first)
            if drop > 0:
                del self._tail[: drop * INDEX_RECORD_SIZE]
                self._tail_first += drop

    def _rewrite_index(self, skip: int, count: int) -> None:
        """Replace the index file by its records [skip, skip + count) (temp, fsync, rename,
        fsync dir) and switch to it. Before the rename nothing has changed."""
        path = os.path.join(self.dir, INDEX_NAME)
        tmp = path + TMP
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise CommitLogError(f"creating {tmp} failed: {exc}") from exc
        try:
            copy_range(self._ifd, fd, skip * INDEX_RECORD_SIZE, count * INDEX_RECORD_SIZE)
            fsync_fd(fd, tmp)
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

    def _disk_record(self, index: int) -> tuple[int, int, int, int]:
        return self._disk_record_flags(index)[:4]

    def _disk_record_flags(self, index: int) -> tuple[int, int, int, int, int]:
        """(position, term, size, type, flags) of `index` as the index file holds it."""
        raw = pread_exact(self._ifd, INDEX_RECORD_SIZE, (index - self._first) * INDEX_RECORD_SIZE)
        pos, term, size, etype, flags, _crc = IREC.unpack(raw)
        return pos, term, size, etype, flags

    def _valid_index_prefix(self, nrec: int, data_start: int, check_all: bool) -> int:
        """Number of leading index records whose CRC verifies and whose positions chain."""
        first = self._first
        if nrec and not check_all:
            # trust all but the last record, which is checked against its predecessor
            raw = (
                pread_exact(self._ifd, 2 * INDEX_RECORD_SIZE, (nrec - 2) * INDEX_RECORD_SIZE)
                if nrec > 1
                else b""
            )
            if nrec > 1 and len(raw) == 2 * INDEX_RECORD_SIZE:
                p0, t0, s0, _y0, _f0, c0 = IREC.unpack_from(raw, 0)
                p1, t1, _s1, y1, f1, c1 = IREC.unpack_from(raw, INDEX_RECORD_SIZE)
                ok0 = c0 == crc32c.crc32c(raw[:IREC_CRC_AT], (first + nrec - 2) & M32)
                ok1 = c1 == crc32c.crc32c(
                    raw[INDEX_RECORD_SIZE : INDEX_RECORD_SIZE + IREC_CRC_AT],
                    (first + nrec - 1) & M32,
                )
                if (ok0 and ok1 and p1 == p0 + s0 and t1 >= t0 and y1 <= MAX_TYPE
                        and not f1 & ~VOUCHED):
                    return nrec
        valid = 0
        expect_pos = data_start
        prev_term = 0
        while valid < nrec:
            n = min(_INDEX_CHUNK, nrec - valid)
            buf = memoryview(
                pread_exact(self._ifd, n * INDEX_RECORD_SIZE, valid * INDEX_RECORD_SIZE)
            )
            i = first + valid
            off = 0
            for pos, term, size, etype, flags, crc in IREC.iter_unpack(
                buf[: (len(buf) // 32) * 32]
            ):
                if (
                    pos != expect_pos
                    or term < prev_term
                    or size < HEADER_SIZE
                    or etype > MAX_TYPE
                    or flags & ~VOUCHED
                    or crc != crc32c.crc32c(buf[off : off + IREC_CRC_AT], i & M32)
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
