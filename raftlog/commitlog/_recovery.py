"""Recovery (`CommitLog.open`): make what is on disk a consistent, durable log again.

1. Validate the index: the longest prefix of records whose CRCs verify and whose
   positions chain contiguously (``pos[i+1] == pos[i] + size[i]``). A short, garbled or
   missing index simply yields a shorter prefix; the rest is rebuilt from data.
2. Verify the entry of the last vouched record (both CRCs, and that it matches the
   record). If it is bad and no valid entry follows it, it is a torn tail: drop the
   record and try the one before -- unless the record is flagged `VOUCHED` (written
   under ``fsync="always"`` after its entry's fsync): then the entry was damaged after
   it was durable (a cut file, a bad disk), and dropping it would let this replica vote
   as if it never had it. It is kept as corrupt, as are the vouched entries before it
   that lie past the end of the last segment, which is extended to where the index says
   they end (a hole, read as zeros, until `repair` writes them back); the log goes on
   after them.
3. Walk forward from there through the remaining data, verifying header and body CRCs of
   every entry, index contiguity (i+1 after i), non-decreasing terms, and that each
   segment starts where the previous one ends. The first entry that fails ends the log
   (torn tail) and everything after it is truncated -- unless the entry has an intact
   header and the entry after it verifies: that is a corrupt entry in the middle; it is
   kept, reported in `RecoveryReport.corrupt`, and reads of it raise `CorruptEntry` so
   the Raft layer refetches it from a peer (`repair`). When the whole index had to be
   rebuilt, segments before the last two are walked by headers only (header CRCs and
   contiguity); their bodies are still checked on every read. A middle segment whose
   file ends before its successor starts was cut (the index vouches for entries past
   its end): those entries are kept and reported corrupt too, for `repair` to put back
   (as are those in a hole a crash left between such repairs).
4. Truncate data, fsync the segments from the last vouched entry on (earlier ones were
   fsynced before that entry's index record was written) and the directory, then rewrite
   the index suffix and fsync it. Everything present after `open` is durable.

Limits: an entry whose *header* is corrupt cannot be stepped over without its index
record, so when the index is lost as well it ends the log there. A torn entry whose
successor did reach the disk (out-of-order writeback in a machine crash) looks like
middle corruption and is kept as such; the Raft layer may drop it with `truncate_from`
when it lies above its commit index. `first_index` is taken from the first entry of the
first segment (else from the base file, else 1).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field

import crc32c

from raftlog.commitlog._format import HEADER_SIZE, CommitLogError, check_header, check_stored
from raftlog.commitlog._index import (
    INDEX_NAME,
    INDEX_RECORD_SIZE,
    IREC,
    IREC_CRC_AT,
    M32,
    TMP,
    VOUCHED,
    index_record,
)
from raftlog.commitlog._retention import BASE_NAME, _Retention
from raftlog.commitlog._segments import (
    SCAN_CHUNK,
    SEGMENT_NAME_LEN,
    Window,
    pread_exact,
    pwritev_all,
    segment_name,
)
from raftlog.fsutil import fdatasync_fd, fsync_dir, fsync_fd

__all__ = ["RecoveryReport"]

_TAIL_WARM = 1024  # records loaded into the tail cache at open



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


class _Recovery(_Retention):
    """`_recover` and the checks it runs over index and data."""

    recovery: RecoveryReport

    def __init__(self, path: str, segment_size: int) -> None:
        super().__init__(path, segment_size)
        self.recovery = RecoveryReport()

    def _recover(self, check_index: bool) -> None:
        rep = self.recovery
        created = not os.path.isdir(self.dir)
        os.makedirs(self.dir, exist_ok=True)
        if created:
            fsync_dir(self.path)
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        for leftover in (INDEX_NAME + TMP, BASE_NAME + TMP):
            try:
                os.unlink(os.path.join(self.dir, leftover))
            except FileNotFoundError:
                pass
        base_index, base_term, base_start = self._read_base()
        self._base = (base_index, base_term)
        names = sorted(
            n for n in os.listdir(self.dir) if len(n) == SEGMENT_NAME_LEN and n.isdigit()
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
        index_path = os.path.join(self.dir, INDEX_NAME)
        self._ifd = os.open(index_path, os.O_RDWR | os.O_CREAT, 0o644)
        if not self._starts and self._base[0]:
            raise CommitLogError(
                f"{self.dir}: the base file says entries up to {self._base[0]} were deleted, "
                "but no segment is left"
            )
        if not self._starts:
            self._roll(0)
            os.ftruncate(self._ifd, 0)
            fsync_fd(self._ifd)
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

        # 2. walk back over a torn tail the index still lists; an entry whose record
        # says it was fsynced first (`VOUCHED`) was damaged, not torn: it stays
        scan_pos, expect, prev_term = data_start, self._first, self._base_term_or_zero()
        lost_tail = False
        while valid > 0:
            idx = self._first + valid - 1
            pos, term, size, etype, flags = self._disk_record_flags(idx)
            problem = self._probe_entry(pos, idx, term, size, etype)
            if problem is None:
                scan_pos, expect, prev_term = pos + size, idx + 1, term
                break
            vouched = bool(flags & VOUCHED)
            if vouched or self._follows_valid(pos, size, idx, term):
                rep.corrupt.append(idx)
                scan_pos, expect, prev_term = pos + size, idx + 1, term
                lost_tail = vouched and pos + size > self._starts[-1] + self._sizes[-1]
                break
            valid -= 1
        self._written = valid
        self._last = expect - 1
        self._last_term = prev_term
        cut_short = self._cut_short_entries(valid, scan_pos if lost_tail else None)
        if cut_short:
            rep.corrupt = sorted(set(rep.corrupt) | set(cut_short))

        # 3. walk forward through the data past what the index vouched for
        verify_from = scan_pos if valid else self._starts[max(0, len(self._starts) - 2)]
        records = bytearray()
        cut, k, next_index, reason = self._scan(scan_pos, expect, prev_term, verify_from, records)
        rep.reason = reason
        rep.index_rebuilt = len(records) // INDEX_RECORD_SIZE

        # 4. cut the data, make everything durable, then fix the index
        if self._cut_data(cut, k):
            rep.truncated_from_index = next_index
        if lost_tail:
            # the last segment lost vouched entries: it is extended to where they end
            # (a hole that reads as zeros, so they fail their checks until `repair`
            # writes them back), and the log goes on after them
            k = len(self._starts) - 1
            self._sizes[k] = cut - self._starts[k]
            os.ftruncate(self._fd(k), self._sizes[k])
        # segments before the one holding the last vouched entry were fsynced before that
        # entry's index record was written; the rest may hold page-cache-only data
        for j in range(max(0, bisect.bisect_right(self._starts, scan_pos) - 2), len(self._starts)):
            fdatasync_fd(self._fd(j))
        fsync_dir(self.dir)
        if os.fstat(self._ifd).st_size != self._written * INDEX_RECORD_SIZE or records:
            os.ftruncate(self._ifd, self._written * INDEX_RECORD_SIZE)
            if records:
                pwritev_all(self._ifd, [records], self._written * INDEX_RECORD_SIZE)
            fsync_fd(self._ifd)
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
            pread_exact(
                self._ifd, keep * INDEX_RECORD_SIZE, (self._written - keep) * INDEX_RECORD_SIZE
            )
        )
        self._evict_fds()

    def _base_term_or_zero(self) -> int:
        return self._base[1] if self._base[0] == self._first - 1 else 0

    def _segment_head_index(self, k: int) -> int | None:
        """Raft index in the header of segment `k`'s first entry (None if unreadable)."""
        head = memoryview(pread_exact(self._fd(k), HEADER_SIZE, 0))
        if len(head) < HEADER_SIZE:
            return None
        err, fields = check_header(head, 0)
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
            raw = pread_exact(self._ifd, INDEX_RECORD_SIZE, 0)
            if len(raw) == INDEX_RECORD_SIZE:
                pos, _t, _s, _y, _f, crc = IREC.unpack(raw)
                if pos == old_start and crc == crc32c.crc32c(raw[:IREC_CRC_AT], old_first & M32):
                    nrec = os.fstat(self._ifd).st_size // INDEX_RECORD_SIZE
                    skip = new_first - old_first
                    self._rewrite_index(skip, max(0, nrec - skip))
        for start in gone:
            name = segment_name(start)
            self.recovery.deletion_finished.append(name)
            os.unlink(os.path.join(self.dir, name))
        fsync_dir(self.dir)

    def _cut_short_entries(self, vouched: int, extent: int | None = None) -> list[int]:
        """Entries among the first `vouched` whose bytes lie past the end of a middle
        segment cut short (its file ends before its successor starts), past the end of
        the last segment when its vouched entries reach `extent`, or in a hole a crash
        left between such entries' repairs: kept, as corrupt. The index says where each
        belongs, so `repair` can put it back there."""
        out: list[int] = []
        first, stop = self._first, self._first + vouched
        last = len(self._starts) - 1
        for k in range(len(self._starts)):
            end = self._starts[k] + self._sizes[k]
            nxt = self._starts[k + 1] if k < last else max(end, extent or 0)
            hole = self._first_hole(k)
            if end >= nxt and hole is None:
                continue
            frm = end if hole is None else min(end, hole)
            lo, hi = first, stop  # the first vouched entry ending past `frm`
            while lo < hi:
                mid = (lo + hi) // 2
                pos, _t, size, _y = self._disk_record(mid)
                if pos + size <= frm:
                    lo = mid + 1
                else:
                    hi = mid
            while lo < stop:
                pos, term, size, etype = self._disk_record(lo)
                if pos >= nxt:
                    break
                if self._probe_entry(pos, lo, term, size, etype) is not None:
                    out.append(lo)
                lo += 1
        return out

    def _first_hole(self, k: int) -> int | None:
        """Where never-written bytes may start inside segment `k` (None if the file
        system says it has no hole: segments are written densely, only a repair past a
        cut end leaves one)."""
        fd = self._fd(k)
        try:
            off = os.lseek(fd, 0, os.SEEK_HOLE)
        except (AttributeError, OSError):  # pragma: no cover - no SEEK_HOLE here
            return None
        if off >= self._sizes[k]:
            return None
        # a hole starts at a block boundary; the block before it may end in zeros too
        # (the file was cut inside it before the repair wrote past it)
        return self._starts[k] + max(0, off - os.fstat(fd).st_blksize)

    def _probe_entry(self, pos: int, index: int, term: int, size: int, etype: int) -> str | None:
        """Why the entry an index record points at is not intact (None if it is)."""
        k = self._locate(pos)
        if k < 0:
            return "beyond the data"
        rel = pos - self._starts[k]
        if rel + size > self._sizes[k]:
            return "runs past the segment end"
        data = memoryview(pread_exact(self._fd(k), size, rel))
        return check_stored(data, 0, index, term, size, etype)

    def _entry_ok(self, pos: int, index: int, min_term: int) -> bool:
        """Whether an intact entry `index` (term >= min_term) starts at `pos`."""
        k = self._locate(pos)
        if k < 0:
            return False
        rel = pos - self._starts[k]
        head = memoryview(pread_exact(self._fd(k), HEADER_SIZE, rel))
        if len(head) < HEADER_SIZE:
            return False
        err, (_m, size, term, hindex, _ty, bcrc) = check_header(head, 0)
        if err or hindex != index or term < min_term or rel + size > self._sizes[k]:
            return False
        body = pread_exact(self._fd(k), size - HEADER_SIZE, rel + HEADER_SIZE)
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
        readahead = SCAN_CHUNK
        win: Window | None = None
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
                        f"gap before segment {segment_name(self._starts[k + 1])}",
                    )
                k += 1
                win = None
                continue
            if win is None:
                win = Window(self._fd(k), self._starts[k], self._sizes[k])
            check_body = pos >= verify_from
            head = win.get(pos, HEADER_SIZE, SCAN_CHUNK if check_body else readahead)
            if head is None:
                return pos, k, expect, f"torn header of entry {expect} at {pos}"
            err, (_m, size, term, index, etype, bcrc) = check_header(head, 0)
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
                body = win.get(pos + HEADER_SIZE, size - HEADER_SIZE, SCAN_CHUNK)
                if body is None or crc32c.crc32c(body) != bcrc:
                    if not self._follows_valid(pos, size, index, term):
                        return pos, k, expect, f"entry {expect} at {pos}: body CRC mismatch"
                    rep.corrupt.append(index)
            else:
                readahead = HEADER_SIZE if size >= SCAN_CHUNK // 4 else SCAN_CHUNK
            records += index_record(index, pos, term, size, etype, self._index_flags)
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
            name = segment_name(self._starts[j])
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
