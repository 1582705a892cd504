"""ConsumeQueue: the per-(topic, queue) offset index into the CommitLog.

Queue offset `o` maps to a fixed-size record locating message `o` in the log::

    u64 raft index   u32 start   u32 size   u32 tag hash   u64 store_ms     (28 bytes)

`start` is the record's position inside the entry's data (after the store prefix is
counted), so a fetch reads entry `index` and slices `[start, start + size)`. Records live
packed in one `bytearray` rather than as a Python object per message: a queue holding
millions of messages costs 28 bytes each. Offsets keep counting across retention; only the
dropped prefix's storage is released.

Raft indexes grow along a queue except at *late* records: a committed transaction's
records (and a late-decided half message's) enter at their decision, pointing back at the
older entry that holds them. The queue remembers them as runs (first offset, end offset,
their index, the highest index appended before them) so that its searches go by the
running maximum of the index -- which does grow -- and so that retention can avoid a cut
that would delete a late record's entry while keeping a record before it
(`late_spans`).

Everything here is pure and deterministic: the broker state machine owns the queues and
snapshots them as `min_offset` plus the raw record bytes, those of sealed chunks by
reference (`broker.state.cqchunks`).
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Collection, Sequence
from itertools import accumulate, chain, compress
from operator import lt
from typing import NamedTuple

from wire.protocol import Code, RequestError
from wire.records import RecordRef

__all__ = ["CQ_RECORD", "CQEntry", "ConsumeQueue"]

CQ_RECORD = struct.Struct(">QIIIQ")  # index, start, size, tag hash, store_ms
_SIZE = CQ_RECORD.size
_INDEX = struct.Struct(">Q")  # the leading field alone, for binary search
_INDEX_START = struct.Struct(">QI")
_INDEX_START_REC = struct.Struct(">QI16x")  # a whole record, its index and start only


_CHUNK = 4096
_INDEX_CHUNK = struct.Struct(">" + "Q20x" * _CHUNK)  # the indexes of _CHUNK whole records
_MS_CHUNK = struct.Struct(">" + "20xQ" * _CHUNK)  # the store times of _CHUNK whole records


def _indexes(buf: bytearray) -> list[int]:
    """The Raft index of every record in `buf`, unpacked _CHUNK records per call."""
    n = len(buf) // _SIZE
    full = n // _CHUNK * _CHUNK
    out = list(chain.from_iterable(_INDEX_CHUNK.iter_unpack(memoryview(buf)[: full * _SIZE])))
    if n > full:
        out += struct.unpack_from(">" + "Q20x" * (n - full), buf, full * _SIZE)
    return out


class CQEntry(NamedTuple):
    """One message's place: queue offset, Raft index, slice of the entry data, filter data.
    (A tuple: a large read makes a thousand of them, and a tuple is made several times
    faster than a frozen dataclass.)"""

    offset: int
    index: int  # type: ignore[assignment]  # (shadows tuple.index, which nothing uses)
    start: int
    size: int
    tag_hash: int
    store_ms: int


class ConsumeQueue:
    """Append-only array of fixed-size records addressed by queue offset."""

    __slots__ = ("_buf", "_late", "_late_first", "_min", "_top")

    def __init__(self, min_offset: int = 0, records: bytes | bytearray = b"") -> None:
        if min_offset < 0 or len(records) % _SIZE:
            raise ValueError("bad consume queue state: negative offset or partial record")
        self._min = min_offset
        self._buf = bytearray(records)
        self._top = -1  # the highest Raft index appended (retained ones, after a restore)
        # runs of late records, in offset order: [first, end, index, top before them]
        self._late: list[list[int]] = []
        self._late_first: list[int] = []  # their first offsets, for bisect
        if records:
            self._find_late(min_offset)

    def _find_late(self, min_offset: int) -> None:
        """Late records of restored `records`: those below the highest index before them.
        A late stretch starts where the index drops, so only drops are looked for record
        by record; the rest are C-level passes (a restore of millions of records stays
        quick, late records being few)."""
        indexes = _indexes(self._buf)
        n = len(indexes)
        if indexes == sorted(indexes):  # no late record (timsort: one pass when sorted)
            self._top = indexes[-1]
            return
        top, pos = -1, 0
        for k in compress(range(1, n), map(lt, indexes[1:], indexes)):
            if k < pos:
                continue  # inside a late stretch already walked
            top = max(top, max(indexes[pos:k]))
            while k < n and indexes[k] < top:
                self._note_late(min_offset + k, 1, indexes[k], top)
                k += 1
            pos = k
        self._top = max(top, max(indexes[pos:], default=-1))

    # ------------------------------------------------------------------ shape

    @property
    def min_offset(self) -> int:
        """The earliest offset still readable (advances with retention)."""
        return self._min

    @property
    def end_offset(self) -> int:
        """The offset the next appended message will get."""
        return self._min + len(self._buf) // _SIZE

    def __len__(self) -> int:
        return len(self._buf) // _SIZE

    def records(self) -> bytes:
        """The raw records from `min_offset` on, for snapshots."""
        return bytes(self._buf)

    def records_between(self, lo: int, hi: int) -> bytes:
        """A copy of the raw records of offsets `lo` <= o < `hi` (within min..end)."""
        if not self._min <= lo <= hi <= self.end_offset:
            raise ValueError(f"records {lo}..{hi} outside {self._min}..{self.end_offset}")
        return bytes(self._buf[(lo - self._min) * _SIZE : (hi - self._min) * _SIZE])

    def index_and_start(self, offset: int) -> tuple[int, int]:
        """The Raft index and start of the record at `offset` (which must be retained)."""
        if not self._min <= offset < self.end_offset:
            raise ValueError(f"offset {offset} outside {self._min}..{self.end_offset}")
        index, start = _INDEX_START.unpack_from(self._buf, (offset - self._min) * _SIZE)
        return int(index), int(start)

    # ------------------------------------------------------------------ writes

    def append(self, index: int, start: int, size: int, tag_hash: int, store_ms: int) -> int:
        """Add one message; returns the offset it was given."""
        offset = self.end_offset
        self._buf += CQ_RECORD.pack(index, start, size, tag_hash, store_ms)
        self._appended(offset, 1, index)
        return offset

    def extend(self, index: int, refs: Sequence[RecordRef], store_ms: int) -> int:
        """Add the records of one batch (the entry at Raft `index`) in one write; returns
        the offset of the first."""
        offset = self.end_offset
        pack = CQ_RECORD.pack
        if len(refs) == 1:  # a batch of one message: no list to join
            r = refs[0]
            self._buf += pack(index, r.start, r.size, r.tag_hash, store_ms)
        else:
            self._buf += b"".join([pack(index, r.start, r.size, r.tag_hash, store_ms)
                                   for r in refs])
        self._appended(offset, len(refs), index)
        return offset

    def extend_packed(self, index: int, records: bytes, n: int) -> int:
        """`extend` with the `n` records (all of the entry at Raft `index`) already
        packed in this queue's record format; returns the offset of the first."""
        offset = self.end_offset
        self._buf += records
        self._appended(offset, n, index)
        return offset

    def _appended(self, offset: int, n: int, index: int) -> None:
        if index >= self._top:
            self._top = index
        else:
            self._note_late(offset, n, index, self._top)

    def _note_late(self, offset: int, n: int, index: int, top: int) -> None:
        last = self._late[-1] if self._late else None
        if last is not None and last[1] == offset and last[3] == top:
            # the same batch, one more record of it, or another late one right after
            # it (delayed messages falling due together): one run, whose lowest index
            # is the one a retention cut must not pass while keeping `top`
            last[1] += n
            if index < last[2]:
                last[2] = index
        else:
            self._late.append([offset, offset + n, index, top])
            self._late_first.append(offset)

    def drop_before(self, offset: int) -> int:
        """Forget offsets below `offset` (never moves backwards); returns how many went.

        The remaining records are copied into a fresh buffer so the dropped prefix's memory
        is really returned, not just hidden behind a moved start pointer.
        """
        offset = min(offset, self.end_offset)
        n = offset - self._min
        if n <= 0:
            return 0
        self._buf = self._buf[n * _SIZE :]
        self._min = offset
        gone = 0
        for run in self._late:
            if run[1] > offset:
                run[0] = max(run[0], offset)
                break
            gone += 1
        del self._late[:gone]
        self._late_first = [run[0] for run in self._late]
        return n

    def late_spans(self) -> list[tuple[int, int]]:
        """(index, top) of each retained run of late records: a retention cut `m` with
        index < m <= top would delete their entry yet keep the record at index `top`
        before them, so the queue could not pass them and they would read as gone. A cut
        at or below `index`, or above `top`, removes them with everything before them or
        keeps them."""
        return [(run[2], run[3]) for run in self._late]

    # ------------------------------------------------------------------ reads

    def _top_at(self, i: int) -> int:
        """The highest Raft index among the retained records up to position `i`: the
        record's own, or for a late record the one it came after (which grows along the
        queue where the indexes themselves need not)."""
        offset = self._min + i
        k = bisect_right(self._late_first, offset) - 1
        if k >= 0 and offset < self._late[k][1]:
            return self._late[k][3]
        return int(_INDEX.unpack_from(self._buf, i * _SIZE)[0])

    def first_offset_at_or_after_index(self, index: int) -> int:
        """The first retained offset whose Raft index, or that of a record before it, is
        >= `index` (`end_offset` if none): every record below it is stored below `index`.

        This is where retention's cut at `index` leaves the queue's minimum, and where a
        message-id search starts. It is a binary search over the running maximum of the
        indexes, which grows although a late record's own index does not: a cut inside a
        transaction's prepare-to-commit window on the queue then keeps the records after
        the late one's prepare entry, rather than dropping them with it.
        """
        lo, hi = 0, len(self)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._top_at(mid) < index:
                lo = mid + 1
            else:
                hi = mid
        return self._min + lo

    def first_offset_at_or_after_ms(self, ms: int) -> int:
        """The first retained offset whose store time, or that of a record before it, is
        >= `ms` (`end_offset` if none): every retained record below it was stored before
        `ms`. Offsets below retention have no answer of their own, so a time older than
        everything retained gives `min_offset`.

        Store times are the leaders' clocks, so they may step back where leadership moved
        (a new leader's clock behind the old one's): the search goes by the running
        maximum of the store times, which does grow, as `first_offset_at_or_after_index`
        goes by that of the indexes. The first place the running maximum reaches `ms` is
        the first record stored at or after `ms`; finding it reads store times a chunk
        at a time in C (`_MS_CHUNK`) and looks at single records only in the chunk that
        holds it, so no Python work is done per record passed over.
        """
        n = len(self)
        pos = 0
        with memoryview(self._buf) as view:  # released: a live view pins the buffer's size
            while pos < n:
                k = min(_CHUNK, n - pos)
                unpack = _MS_CHUNK if k == _CHUNK else struct.Struct(">" + "20xQ" * k)
                times = unpack.unpack_from(view, pos * _SIZE)
                if max(times) >= ms:
                    return self._min + pos + next(i for i, t in enumerate(times) if t >= ms)
                pos += k
        return self.end_offset

    def find_near(self, offset: int, index: int, start: int, window: int) -> int | None:
        """The offset of the record (index, start) within `window` offsets of `offset`
        either way, None if none: a record appended out of index order (a committed
        transaction's, pointing at the older entry holding it) is found by no binary
        search, but lies near where one ends."""
        lo = max(self._min, offset - window)
        hi = min(self.end_offset, offset + window)
        want = (index, start)
        for i, rec in enumerate(_INDEX_START_REC.iter_unpack(
                self._buf[(lo - self._min) * _SIZE : (hi - self._min) * _SIZE])):
            if rec[:2] == want:
                return lo + i
        return None

    def _check(self, offset: int) -> None:
        if offset < self._min:
            raise RequestError(
                Code.OFFSET_TOO_SMALL,
                f"offset {offset} is below the earliest retained offset {self._min}",
                min=self._min,
                end=self.end_offset,
            )
        if offset > self.end_offset:
            raise RequestError(
                Code.OFFSET_TOO_LARGE,
                f"offset {offset} is beyond the end of the queue {self.end_offset}",
                min=self._min,
                end=self.end_offset,
            )

    def get(self, offset: int) -> CQEntry:
        """The entry at `offset`; RequestError OFFSET_TOO_SMALL/OFFSET_TOO_LARGE otherwise."""
        self._check(offset)
        if offset == self.end_offset:
            raise RequestError(
                Code.OFFSET_TOO_LARGE,
                f"offset {offset} has not been written yet (end {offset})",
                min=self._min,
                end=offset,
            )
        return CQEntry(offset, *CQ_RECORD.unpack_from(self._buf, (offset - self._min) * _SIZE))

    def read(
        self,
        offset: int,
        max_count: int,
        max_bytes: int,
        tag_hashes: Collection[int] | None = None,
        max_scan: int | None = None,
    ) -> tuple[list[CQEntry], int]:
        """Entries from `offset` on and the offset to continue from.

        Stops at `max_count` entries or before the entry that would pass `max_bytes`, but
        always returns at least one entry if one matches, so an oversized message can
        still be consumed. With `tag_hashes`, non-matching entries are skipped; at most
        `max_scan` entries (default max(10 * max_count, 1000)) are looked at so a rare tag
        cannot make one call walk a whole queue. The returned next offset then lies past
        everything skipped, even when no entry matched.
        """
        if max_count < 1:
            raise RequestError(Code.MALFORMED, f"max_count must be at least 1, got {max_count}")
        self._check(offset)
        end = self.end_offset
        if tag_hashes is None or not tag_hashes:
            stop = min(end, offset + max_count)
        else:
            scan = max(10 * max_count, 1000) if max_scan is None else max(1, max_scan)
            stop = min(end, offset + scan)
        lo = (offset - self._min) * _SIZE
        hi = (stop - self._min) * _SIZE
        # Copy the slice: a live memoryview would pin the bytearray's size.
        if not tag_hashes:  # every record up to the count, then the byte bound: no loop
            recs = list(CQ_RECORD.iter_unpack(self._buf[lo:hi]))
            n = min(len(recs), max(1, bisect_right(list(accumulate(r[2] for r in recs)),
                                                   max_bytes)))
            return [CQEntry(o, *r) for o, r in enumerate(recs[:n], offset)], offset + n
        out: list[CQEntry] = []
        used = 0
        nxt = offset
        for rec in CQ_RECORD.iter_unpack(self._buf[lo:hi]):
            if tag_hashes and rec[3] not in tag_hashes:
                nxt += 1
                continue
            if out and used + rec[2] > max_bytes:
                break
            out.append(CQEntry(nxt, *rec))
            used += rec[2]
            nxt += 1
            if len(out) >= max_count:
                break
        return out, nxt
