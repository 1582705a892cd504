"""Delayed messages: stored when sent, entering their queue when due.

A delayed batch (its header carries `delay` or `at`, `wire.records`) is stored like any
other: one MESSAGES entry, fsynced on a majority before the producer hears back. This part
claims it on the apply seam instead of its queue and keeps each of its messages pending,
by due time, until the group's leader proposes `DeliverDue(now_ms, limit)`: applied, the
due messages (due <= now) enter their queues as pointers to the records the entry already
holds, as a committed transaction's do: nothing is copied. Every replica moves the same
messages at the same log position, so a new leader neither loses, repeats nor delivers
early what an old one proposed; and nothing is moved before its due time by the clock of
the leader that proposed the move (the part never lets its clock run backwards: a record's
time below the highest applied counts as that one).

The pending index is packed, not a Python object per message: pending messages sit in
buckets of `BUCKET_MS` by due time, each a `bytearray` of fixed 40-byte records (due,
Raft index, start, size, tag hash, destination, store time) behind a read cursor, with
the bucket keys in a heap. A bucket wholly due is drained from its cursor in the order
its messages were stored; the one bucket only partly due is sorted by due time once and
drained as far as due. A message's key, which queries by key need once it is delivered,
is kept beside it only when it has one. (A bucketed index rather than a timing wheel of
fixed slots: with delays up to the configured maximum, weeks, most slots of a wheel would
be empty, and a bucket costs nothing until a message falls in it.)

Pending messages pin their entries: retention keeps everything from the lowest Raft index
still pending (`pinned_index`). A topic deleted drops its pending messages; a destination
queue that is gone when its messages fall due drops them (counted as skipped).

Two deliberate test mutations (`broker.config`), for the chaos checker to catch:
`deliver-at-send` puts a delayed batch in its queue when stored, as if it had no delay;
`volatile-timers` behaves as if the pending index lived only in the leader's memory: a
leader starting its term drops everything pending (`ForgetPending`, which apply refuses
unless the mutation is on).
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from broker.state.parts.base import (
    ControlRecord,
    ControlResult,
    Handler,
    Part,
    Refused,
    TopicConfig,
    int_field,
    is_int,
)
from wire.protocol import Code
from wire.records import BatchHeader, RecordRef

__all__ = ["BUCKET_MS", "DELIVER_LIMIT", "DeliverDue", "ForgetPending", "Timers"]

BUCKET_MS = 100  # pending messages are grouped by due time in buckets this wide
DELIVER_LIMIT = 65536  # the most messages one DeliverDue may move
_REC = struct.Struct(">QQIIIIQ")  # due_ms, index, start, size, tag hash, destination, store_ms
_SIZE = _REC.size


@dataclass(frozen=True, slots=True)
class DeliverDue(ControlRecord):
    """Move the pending messages due at or before `now_ms` into their queues, at most
    `limit` of them (those due first)."""

    op: ClassVar[str] = "deliver_due"
    now_ms: int
    limit: int

    def validate(self) -> None:
        int_field("now_ms", self.now_ms, 0)
        int_field("limit", self.limit, 1, DELIVER_LIMIT)

    def to_map(self) -> dict[str, Any]:
        return {"now": self.now_ms, "limit": self.limit}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> DeliverDue:
        return cls(d.get("now"), d.get("limit"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class ForgetPending(ControlRecord):
    """Test mutation `volatile-timers` only: drop every pending message."""

    op: ClassVar[str] = "forget_pending"

    def to_map(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> ForgetPending:
        return cls()


class _Bucket:
    """The pending records of one bucket: `buf[pos:]` are pending; `ordered` when they
    are sorted by due time (a bucket only partly due is sorted before it is drained).
    `min_due` and `min_index` are lower bounds of the pending ones' (exact after a
    change), `max_due` an upper bound: a bucket whose `max_due` has come is wholly due
    and needs no sorting, however many messages fell due in the same instant."""

    __slots__ = ("buf", "max_due", "min_due", "min_index", "ordered", "pos")

    def __init__(self, buf: bytearray, pos: int = 0, ordered: bool = False) -> None:
        self.buf = buf
        self.pos = pos
        self.ordered = ordered
        self.min_due, self.max_due, self.min_index = self._bounds()

    def _bounds(self) -> tuple[int, int, int]:
        recs = list(_REC.iter_unpack(memoryview(self.buf)[self.pos:]))
        if not recs:
            return 0, 0, 0
        dues = [r[0] for r in recs]
        return min(dues), max(dues), min(r[1] for r in recs)

    def __len__(self) -> int:
        return (len(self.buf) - self.pos) // _SIZE

    def add(self, packed: bytes, due: int, index: int) -> None:
        if not len(self):
            self.min_due, self.max_due, self.min_index = due, due, index
        else:
            self.min_due = min(self.min_due, due)
            self.max_due = max(self.max_due, due)
            self.min_index = min(self.min_index, index)
        self.buf += packed
        self.ordered = False

    def take(self, now_ms: int, limit: int, whole: bool) -> list[tuple[int, ...]]:
        """Up to `limit` records due at or before `now_ms`, removed. `whole`: every record
        of the bucket is due (no sorting needed)."""
        if not whole and not self.ordered:
            recs = sorted(_REC.iter_unpack(memoryview(self.buf)[self.pos:]))
            self.buf = bytearray(b"".join(_REC.pack(*r) for r in recs))
            self.pos = 0
            self.ordered = True
        out: list[tuple[int, ...]] = []
        pos, end = self.pos, len(self.buf)
        while pos < end and len(out) < limit:
            rec = _REC.unpack_from(self.buf, pos)
            if rec[0] > now_ms:
                break  # ordered (or whole, and then nothing is beyond now)
            out.append(rec)
            pos += _SIZE
        self.pos = pos
        if pos * 2 > end and pos > 1 << 16:  # give back the drained front's memory
            del self.buf[:pos]
            self.pos = 0
        if len(self):
            self.min_due, self.min_index = (
                _REC.unpack_from(self.buf, self.pos)[0] if self.ordered else self.min_due,
                self.min_index)  # a lower bound stays a lower bound
        return out

    def compact(self) -> bytes:
        return bytes(self.buf[self.pos:])


class Timers(Part):
    """Pending delayed messages by due time (see the module docstring)."""

    name = "timers"
    records = (DeliverDue, ForgetPending)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        mutations: frozenset[str] = getattr(state, "mutations", frozenset())
        self.deliver_at_send = "deliver-at-send" in mutations
        self.volatile = "volatile-timers" in mutations
        self._buckets: dict[int, _Bucket] = {}
        self._keys_heap: list[int] = []  # bucket keys, each once
        self._dests: list[tuple[str, int]] = []  # destination id -> (topic, queue)
        self._dest_ids: dict[tuple[str, int], int] = {}
        self._msg_keys: dict[tuple[int, int], str] = {}  # (index, start) -> message key
        self._pending = 0
        self.clock_ms = 0  # the highest time a DeliverDue carried
        self.delivered = 0  # messages moved into their queues, ever
        self.dropped = 0  # pending messages whose topic or queue went, ever

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {DeliverDue.op: (DeliverDue, self._deliver),
                ForgetPending.op: (ForgetPending, self._forget)}

    # ------------------------------------------------------------------ queries

    @property
    def pending(self) -> int:
        """Messages waiting for their time."""
        return self._pending

    def next_due(self) -> int | None:
        """A time at or before which the earliest pending message falls due (None: none
        pending): the leader proposes `DeliverDue` once its clock reaches it."""
        if not self._keys_heap:  # every key in it has a bucket holding something
            return None
        return self._buckets[self._keys_heap[0]].min_due

    def pinned_index(self) -> int | None:
        """The lowest Raft index a pending message is stored at (None: none pending)."""
        found = [b.min_index for b in self._buckets.values() if len(b)]
        return min(found) if found else None

    # ------------------------------------------------------------------ the apply seam

    def claims_batch(self, header: BatchHeader) -> bool:
        return header.delayed and not header.prepared and not self.deliver_at_send

    def hold_batch(self, header: BatchHeader, refs: list[RecordRef], index: int,
                   store_ms: int) -> None:
        self.hold(header.topic, header.queue, refs, index, store_ms, header.due_ms(store_ms))

    def hold(self, topic: str, queue: int, refs: list[RecordRef], index: int, store_ms: int,
             due_ms: int) -> None:
        """Keep the records `refs` of the entry at `index`, for `topic`/`queue` (hosted
        here), pending until `due_ms`."""
        dest = self._dest_ids.get((topic, queue))
        if dest is None:
            dest = self._dest_ids[(topic, queue)] = len(self._dests)
            self._dests.append((topic, queue))
        key = due_ms // BUCKET_MS
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(bytearray())
            heapq.heappush(self._keys_heap, key)
        packed = b"".join(_REC.pack(due_ms, index, r.start, r.size, r.tag_hash, dest, store_ms)
                          for r in refs)
        bucket.add(packed, due_ms, index)
        for r in refs:
            if r.key:
                self._msg_keys[(index, r.start)] = r.key
        self._pending += len(refs)

    # ------------------------------------------------------------------ apply

    def _deliver(self, rec: DeliverDue, _index: int) -> ControlResult:
        now = self.clock_ms = max(self.clock_ms, rec.now_ms)
        moved = dropped = 0
        limit = rec.limit
        heap = self._keys_heap
        while heap and moved + dropped < limit:
            key = heap[0]
            bucket = self._buckets[key]
            if bucket.min_due > now:
                break
            whole = bucket.max_due <= now
            recs = bucket.take(now, limit - moved - dropped, whole)
            if not recs:
                break  # the earliest bucket's first due is beyond now: so is everything
            m, d = self._enqueue(recs)
            moved += m
            dropped += d
            if not len(bucket):
                heapq.heappop(heap)
                del self._buckets[key]
            elif not whole:
                break  # the rest of this bucket, and every later one, is not due yet
        self._pending -= moved + dropped
        self.delivered += moved
        self.dropped += dropped
        return ControlResult(DeliverDue.op, moved, dropped)

    def _forget(self, _rec: ForgetPending, _index: int) -> ControlResult:
        if not self.volatile:
            raise Refused(Code.MALFORMED, "forget_pending is a test mutation's record "
                                          "(volatile-timers), and it is off")
        gone = self._pending
        self._buckets.clear()
        self._keys_heap.clear()
        self._msg_keys.clear()
        self._pending = 0
        self.dropped += gone
        return ControlResult(ForgetPending.op, gone)

    def _enqueue(self, recs: list[tuple[int, ...]]) -> tuple[int, int]:
        """Append due records to their queues, runs of one entry and destination at a
        time (contiguous records of a batch go in one append); (moved, dropped)."""
        moved = dropped = 0
        run: list[RecordRef] = []
        run_key: tuple[int, int, int] | None = None  # (dest, index, store_ms)
        for _due, index, start, size, tag_hash, dest, store_ms in recs:
            key = self._msg_keys.pop((index, start), "")
            if run and (run_key != (dest, index, store_ms)
                        or run[-1].start + run[-1].size != start):
                m, d = self._append(run_key, run)  # type: ignore[arg-type]
                moved += m
                dropped += d
                run = []
            run_key = (dest, index, store_ms)
            run.append(RecordRef(start, size, key, tag_hash))
        if run:
            m, d = self._append(run_key, run)  # type: ignore[arg-type]
            moved += m
            dropped += d
        return moved, dropped

    def _append(self, run_key: tuple[int, int, int], refs: list[RecordRef]) -> tuple[int, int]:
        dest, index, store_ms = run_key
        topic, queue = self._dests[dest]
        if not self.state.queues.hosts(topic, queue):
            return 0, len(refs)
        self.state.queues.append(topic, queue, index, refs, store_ms)
        return len(refs), 0

    # ------------------------------------------------------------------ hooks

    def topic_deleted(self, config: TopicConfig) -> None:
        gone = {i for i, (t, _q) in enumerate(self._dests) if t == config.name}
        if not gone:
            return
        for key, bucket in list(self._buckets.items()):
            kept = []
            for rec in _REC.iter_unpack(memoryview(bucket.buf)[bucket.pos:]):
                if rec[5] in gone:
                    self._msg_keys.pop((rec[1], rec[2]), None)
                    self._pending -= 1
                    self.dropped += 1
                else:
                    kept.append(_REC.pack(*rec))
            if not kept:
                del self._buckets[key]
            elif len(kept) != len(bucket):
                self._buckets[key] = _Bucket(bytearray(b"".join(kept)), 0, bucket.ordered)
        self._keys_heap = sorted(self._buckets)

    # ------------------------------------------------------------------ snapshot

    def section(self) -> Any:
        return {
            "clock": self.clock_ms,
            "counts": [self.delivered, self.dropped],
            "dests": [[t, q] for t, q in self._dests],
            "buckets": [[k, b.compact(), b.ordered]
                        for k, b in sorted(self._buckets.items()) if len(b)],
            "keys": [[i, s, k] for (i, s), k in sorted(self._msg_keys.items())],
        }

    def load(self, version: int, section: Any) -> None:
        if not isinstance(section, dict):
            raise ValueError("timers section is not a map")
        clock, counts = section.get("clock"), section.get("counts")
        if not is_int(clock) or not (isinstance(counts, list) and len(counts) == 2
                                     and all(is_int(c) for c in counts)):
            raise ValueError("timers section: bad clock or counts")
        self.clock_ms = clock
        self.delivered, self.dropped = counts
        for item in section.get("dests", ()):
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                    and is_int(item[1])):
                raise ValueError(f"bad timers destination {item!r}")
            self._dest_ids[(item[0], item[1])] = len(self._dests)
            self._dests.append((item[0], item[1]))
        for item in section.get("buckets", ()):
            if not (isinstance(item, list) and len(item) == 3 and is_int(item[0])
                    and isinstance(item[1], bytes) and len(item[1]) % _SIZE == 0
                    and isinstance(item[2], bool)):
                raise ValueError("bad timers bucket")
            bucket = _Bucket(bytearray(item[1]), 0, item[2])
            if any(rec[5] >= len(self._dests) or rec[0] // BUCKET_MS != item[0]
                   for rec in _REC.iter_unpack(item[1])):
                raise ValueError("timers bucket names an unknown destination or time")
            self._buckets[item[0]] = bucket
            self._pending += len(bucket)
        self._keys_heap = sorted(self._buckets)
        for item in section.get("keys", ()):
            if not (isinstance(item, list) and len(item) == 3 and is_int(item[0])
                    and is_int(item[1]) and isinstance(item[2], str)):
                raise ValueError("bad timers key")
            self._msg_keys[(item[0], item[1])] = item[2]

    def check(self) -> None:
        for topic, queue in self._dests:
            if queue < 0:
                raise ValueError(f"timers destination {topic!r}/{queue} is no queue")
