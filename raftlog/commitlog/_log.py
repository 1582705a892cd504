"""The façade: `CommitLog`, the log's public operations over the layers below it.

Durability protocol
    * `append` writes entries to the OS (page cache) with one ``pwritev`` per segment and
      keeps their index records in memory.
    * `sync` ``fdatasync``s the segments written since the last sync (one fsync covers
      everything appended since: group commit); the index records of what it covered are
      then written in batches (see `_index`).
    * `truncate_from` makes the truncation durable (index, then data, then directory)
      before returning, so stale entries can never reappear under newer ones.
    * ``fsync="interval"`` is page-cache durability (DLedger's and NATS's default): `sync`
      reports everything written as persisted and fsyncs at most every
      ``fsync_interval`` seconds, so a machine crash can lose acknowledged entries.
      Deployments using it must say so.

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
    repaired again. An entry lost with the tail of a middle segment cut short is put
    back where its index record says, extending the file (never into the next
    segment's extent); one lost with the vouched tail of the last segment is put back
    in the hole recovery extended that segment by. Only entries that recovery scanned,
    and those the index places past the end of a cut segment, are checked at `open`
    (`RecoveryReport.corrupt`); the others the index vouches for are checked on every
    read, and `verify` checks a range.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import crc32c

from raftlog.commitlog._format import (
    HEAD,
    HEADER_SIZE,
    MAGIC,
    MAX_TOTAL,
    MAX_TYPE,
    TYPES,
    U32,
    CommitLogError,
    CorruptEntry,
    OutOfRange,
    check_header,
    check_stored,
)
from raftlog.commitlog._index import IREC_HEAD, M32, VOUCHED
from raftlog.commitlog._recovery import _Recovery
from raftlog.commitlog._segments import SCAN_CHUNK, pread_exact, pwritev_all, segment_name
from raftlog.fsutil import fdatasync_fd, fsync_dir
from raftlog.types import Entry

__all__ = ["CommitLog", "SyncPlan"]

# Every fsync goes through `raftlog.fsutil` (which records sync marks when a test asks).
_datasync = fdatasync_fd


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


def _check_frame(frame: bytes | memoryview, index: int, term: int, etype: int, size: int) -> None:
    """An entry's stored frame must be that entry: its header intact and agreeing."""
    if size < HEADER_SIZE:
        raise ValueError(f"entry {index}: a frame of {size} bytes holds no header")
    err, (_m, hsize, hterm, hindex, htype, _crc) = check_header(memoryview(frame), 0)
    if err:
        raise ValueError(f"entry {index}: its frame is not a stored entry ({err})")
    if (hindex, hterm, htype, hsize) != (index, term, etype, size):
        raise ValueError(
            f"entry {index} (term {term}, type {etype}) carries the frame of entry {hindex} "
            f"(term {hterm}, type {htype}, {hsize} of {size} bytes)"
        )


class CommitLog(_Recovery):
    """Segmented, CRC-checked, append-only Raft log; implements `raftlog.types.LogStore`.

    Create with `CommitLog.open`. Not thread-safe: the caller serializes calls (see the
    package docstring).
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
        super().__init__(os.fspath(path), segment_size)
        self.fsync_mode = fsync
        self.fsync_interval = fsync_interval
        self._last_fsync = float("-inf")
        # the flags of the index records this log writes (see `_index`): only a log
        # that fsyncs every entry before counting it persisted vouches for its entries
        self._index_flags = VOUCHED if fsync == "always" else 0

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

    @property
    def closed(self) -> bool:
        """Whether the log was closed (by `close` or by a failure that needs a reopen)."""
        return self._closed

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

    def append(self, entries: Sequence[Entry]) -> list[int]:
        """Write `entries` (contiguous, after `last_index()`); returns their positions.

        An entry that carries its stored frame (`Entry.frame`: sealed by the leader that
        proposed it, or received from a peer and checked by `decode_entries`) is written
        as is: its header is checked against the entry, its body CRC is not computed
        again. Others are encoded here. A peer's `read_raw` bytes are appended as
        ``append(decode_entries(raw))``.

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
        head_pack, u32, crc, rec_pack = HEAD.pack, U32.pack, crc32c.crc32c, IREC_HEAD.pack
        flags = self._index_flags
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
            if not 0 <= etype <= MAX_TYPE:
                raise ValueError(f"entry {index} has unknown type {etype}")
            frame = e.frame
            if frame is not None:
                size = len(frame)
                _check_frame(frame, index, term, etype, size)
            else:
                body = e.data
                size = HEADER_SIZE + len(body)
                if size > MAX_TOTAL:
                    raise ValueError(f"entry {index} is too large ({size} bytes)")
            if used and used + size > seg_size:
                parts = []
                groups.append((pos, parts))
                used = 0
            if frame is not None:
                parts.append(frame)
            else:
                head = head_pack(MAGIC, size, term, index, etype, crc(body))
                parts.append(head + u32(crc(head)))
                if body:
                    parts.append(body)
            positions.append(pos)
            rec = rec_pack(pos, term, size, etype, flags)
            records.append(rec)
            records.append(u32(crc(rec, index & M32)))
            pos += size
            used += size
            index += 1
            prev_term = term
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
            os.unlink(os.path.join(self.dir, segment_name(start)))
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
        if not fsync and self._index_flags:
            self._unvouch_pending()  # entries counted persisted unfsynced: vouch for none
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
        if position >= seg_end:  # in the lost tail of a segment cut short
            raise CorruptEntry(path, position, "data missing past segment end")
        hdr = memoryview(pread_exact(fd, min(HEADER_SIZE, seg_end - position), rel))
        if len(hdr) < HEADER_SIZE:
            raise CorruptEntry(path, position, "no entry header at this position")
        err, (_m, size, term, index, etype, bcrc) = check_header(hdr, 0)
        if err:
            raise CorruptEntry(path, position, f"no valid entry here ({err})")
        if not (self._first <= index <= self._last) or self._record(index)[0] != position:
            raise CorruptEntry(path, position, "header does not match the index", index)
        if position + size > seg_end:
            raise CorruptEntry(path, position, "entry runs past the segment end", index)
        body = pread_exact(fd, size - HEADER_SIZE, rel + HEADER_SIZE)
        if len(body) != size - HEADER_SIZE or crc32c.crc32c(body) != bcrc:
            raise CorruptEntry(path, position, "body CRC mismatch", index)
        return Entry(index, term, TYPES[etype], body)

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
            # keep reads bounded: stop the batch once it spans SCAN_CHUNK bytes
            span_end = recs[0][0]
            take = 0
            for pos, _t, size, _ty in recs:
                if take and pos + size - recs[0][0] > SCAN_CHUNK:
                    break
                span_end = pos + size
                take += 1
            recs = recs[:take]
            base = recs[0][0]
            buf = bytearray(span_end - base)  # missing bytes stay zero: they fail the checks
            for cpos, chunk in self._read_span(base, span_end, strict=False):
                buf[cpos - base : cpos - base + len(chunk)] = chunk
            mv = memoryview(buf)
            for j, (pos, term, size, etype) in enumerate(recs):
                problem = check_stored(mv, pos - base, i + j, term, size, etype)
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
        entry (nothing is written in either case), OutOfRange outside the log, and
        CommitLogError (the log stays open) when the index places the entry where it
        cannot be written: across the next segment's start or past the log's end. A
        failed write or fsync closes the log, as a failed `sync` does.
        """
        outcome = self.repair_many([(index, raw)])[index]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def repair_many(
        self, raws: Sequence[tuple[int, bytes | memoryview]]
    ) -> dict[int, bool | CommitLogError | ValueError]:
        """`repair` for several entries, (index, that entry's stored bytes from a peer)
        each, written in turn and then made durable with one fsync per segment written:
        a damaged segment holds hundreds of entries, and an fsync each costs more than
        the writes. Each entry is checked on its own, as `repair` checks it: the outcome
        per index is True (written), False (intact already) or the exception `repair`
        would raise for it (nothing of that entry is written; the others still are). A
        failed write or fsync closes the log and raises CommitLogError; a reopen's
        recovery then says which of the entries are whole."""
        self._check_open()
        outcome: dict[int, bool | CommitLogError | ValueError] = {}
        written: list[tuple[int, int, int]] = []  # (index, segment, its end in the segment)
        for index, raw in raws:
            try:
                plan = self._repair_plan(index, raw)
            except (CommitLogError, ValueError) as exc:  # CorruptEntry is a CommitLogError
                outcome[index] = exc
                continue
            if plan is None:
                outcome[index] = False
                continue
            k, rel, mv = plan
            try:
                pwritev_all(self._fd(k), [mv], rel)
            except OSError as exc:
                self._close_fds()
                raise CommitLogError(
                    f"repairing entry {index} in {self._seg_path(k)} failed: {exc}; the log "
                    "is closed, reopen it to recover"
                ) from exc
            written.append((index, k, rel + len(mv)))
        for k in sorted({k for _i, k, _e in written}):
            try:
                _datasync(self._fd(k))  # a descriptor evicted meanwhile syncs the same file
            except OSError as exc:
                self._close_fds()
                raise CommitLogError(
                    f"syncing repaired entries in {self._seg_path(k)} failed: {exc}; the log "
                    "is closed, reopen it to recover"
                ) from exc
        for index, k, end in written:
            # written past the end of a cut segment: the file (maybe with a hole of other
            # lost entries before this one, unreadable until repaired too) now ends later
            self._sizes[k] = max(self._sizes[k], end)
            if index in self.recovery.corrupt:
                self.recovery.corrupt.remove(index)
            outcome[index] = True
        return outcome

    def _repair_plan(
        self, index: int, raw: bytes | memoryview
    ) -> tuple[int, int, memoryview] | None:
        """Where `raw` goes to repair entry `index`: (segment, offset in it, the bytes),
        None when the local copy is intact already; raises as `repair` documents."""
        if not self._first <= index <= self._last:
            raise OutOfRange(f"index {index} outside [{self._first}, {self._last}]")
        pos, term, size, etype = self._record(index)
        mv = memoryview(raw).cast("B")
        src = f"<repair of entry {index}>"
        if len(mv) < HEADER_SIZE:
            raise CorruptEntry(src, 0, f"{len(mv)} bytes, not even a header", index)
        err, (_m, rsize, rterm, rindex, rtype, bcrc) = check_header(mv, 0)
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
        if k < 0:
            raise CommitLogError(f"{self.dir}: entry {index} lies before the first segment")
        rel = pos - self._starts[k]
        # a middle segment cut short (its successor starts past its end) lost its tail:
        # the index says where each lost entry belongs, up to the next segment's start
        limit = self._starts[k + 1] if k + 1 < len(self._starts) else self._end
        if pos + size > limit:
            raise CommitLogError(
                f"{self.dir}: entry {index} ({size} bytes at {pos}) would run past "
                f"{'the next segment' if k + 1 < len(self._starts) else 'the log end'} "
                f"at {limit}"
            )
        local = memoryview(pread_exact(self._fd(k), size, rel))
        if local == mv:
            return None
        if len(local) >= HEADER_SIZE:
            lerr, (_lm, lsize, lterm, lindex, ltype, _lb) = check_header(local, 0)
            if lerr is None and (lindex, lterm, lsize, ltype) != (index, term, size, etype):
                raise ValueError(
                    f"entry {index}: its intact header (index {lindex}, term {lterm}) "
                    "disagrees with the index; not repairing over it"
                )
        return k, rel, mv

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
                err, (_m, size, term, index, etype, bcrc) = check_header(mv, off)
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
                        Entry(index, term, TYPES[etype], bytes(mv[off + HEADER_SIZE : off + size]))
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

    def _check_span(self, lo: int, hi: int) -> None:
        self._check_open()
        if lo < self._first or lo > self._last + 1 or hi > self._last + 1:
            raise OutOfRange(f"entries [{lo}, {hi}) outside [{self._first}, {self._last + 1})")
