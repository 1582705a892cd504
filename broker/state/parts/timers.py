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
the bucket keys in a heap. A bucket with messages due is sorted by (due, log position)
once and drained from its cursor as far as due (never in the order it was filled, which
depends on when a replica read a run back). A message's key, which queries by key need
once it is delivered, is kept beside it only when it has one. (A bucketed index rather
than a timing wheel of fixed slots: with delays up to the configured maximum, weeks, most
slots of a wheel would be empty, and a bucket costs nothing until a message falls in it.)

Memory stays flat however many are pending: once more than `TimerLimits.memory_records`
records are in memory, those due later than its `horizon_ms` ahead go to a *run*, one file
sorted by due time (`broker.state.timerruns`, in the group's chunk store, as RocketMQ keeps
its TimerLog on disk), and only the run's few numbers stay. A `DeliverDue` first reads
back, from each run whose next record is due within `load_ahead_ms`, the stretch due
within `load_ahead_ms + load_span_ms` (the horizon lies beyond, so what is read back is
not spilled again). Spilling and reading back are decided by the applied state alone, so
every replica writes the same runs under the same names; a snapshot references the runs
instead of copying them, and a restart reads their few numbers, not their messages.

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
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from broker.state.cqchunks import ChunkGone, ChunkRef, load_chunk
from broker.state.parts.base import (
    ControlRecord,
    ControlResult,
    Detached,
    Handler,
    Part,
    Refused,
    TopicConfig,
    int_field,
    is_int,
)
from broker.state.timerruns import RECORD, Run, encode_run, is_run_name, read_run, run_name, run_seq
from wire.protocol import Code
from wire.records import BatchHeader, RecordRef

__all__ = ["BUCKET_MS", "DELIVER_LIMIT", "DeliverDue", "ForgetPending", "TimerLimits", "Timers"]

BUCKET_MS = 100  # pending messages are grouped by due time in buckets this wide
DELIVER_LIMIT = 65536  # the most messages one DeliverDue may move
SPILL_AT = 262_144  # records in memory beyond which the far ones spill to a run (10 MiB)
SPILL_HORIZON_MS = 15 * 60_000  # records due further ahead than this may spill
_REC = RECORD
_SIZE = _REC.size


@dataclass(frozen=True, slots=True)
class TimerLimits:
    """How much of the pending index stays in memory. Every replica of a group must use
    the same (they decide the same spills from them), as with `consume_queue_chunk`."""

    memory_records: int = 0  # 0: SPILL_AT, as the module says now
    horizon_ms: int = 0  # 0: SPILL_HORIZON_MS

    def resolved(self) -> TimerLimits:
        return TimerLimits(self.memory_records or SPILL_AT, self.horizon_ms or SPILL_HORIZON_MS)

    @property
    def spill_min(self) -> int:
        """The fewest far records worth a run of their own."""
        return max(1, self.memory_records // 4)

    @property
    def load_ahead_ms(self) -> int:
        """A run's next stretch is read back this long before it falls due."""
        return self.horizon_ms // 15

    @property
    def load_span_ms(self) -> int:
        """The stretch spans this long: ahead + span stays short of the horizon."""
        return self.horizon_ms * 2 // 3


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
    and is drained in one pass, however many messages fell due in the same instant."""

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
        """Up to `limit` records due at or before `now_ms`, removed, in (due, log
        position) order. `whole`: every record of the bucket is due. A bucket is sorted
        even then: its records arrive in an order that depends on when each replica read
        a run back (live, or after restoring a snapshot), and the order they enter their
        queue must be the log's alone, the same on every replica."""
        if not self.ordered:
            if not whole:  # none due yet (`min_due` may be a bound): left unsorted, as
                # on a replica that restored a snapshot (exact bounds: it never asks)
                # where this one read the bucket back from a run (its edges for bounds)
                first = min(r[0] for r in _REC.iter_unpack(memoryview(self.buf)[self.pos:]))
                if first > now_ms:
                    self.min_due = first
                    return []
            recs = sorted(_REC.iter_unpack(memoryview(self.buf)[self.pos:]))
            self.buf = bytearray(b"".join(_REC.pack(*r) for r in recs))
            self.pos = 0
            self.ordered = True
        pos, end = self.pos, len(self.buf)
        if whole:  # every one is due: the first `limit`, unpacked in one pass
            stop = min(end, pos + limit * _SIZE)
            out = list(_REC.iter_unpack(memoryview(self.buf)[pos:stop]))
            pos = stop
        else:
            out = []
            while pos < end and len(out) < limit:
                rec = _REC.unpack_from(self.buf, pos)
                if rec[0] > now_ms:
                    break  # ordered: nothing after it is due either
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


class _BucketKeys:
    """The bucket keys of packed records (due time // BUCKET_MS), as a sequence `bisect`
    can search: a run's records are in bucket order."""

    __slots__ = ("records",)

    def __init__(self, records: memoryview) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records) // _SIZE

    def __getitem__(self, i: int) -> int:
        due: int = _REC.unpack_from(self.records, i * _SIZE)[0]
        return due // BUCKET_MS


class Timers(Part):
    """Pending delayed messages by due time (see the module docstring)."""

    name = "timers"
    version = 2  # 2: spilled runs; 1 held every pending record inline
    records = (DeliverDue, ForgetPending)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        mutations: frozenset[str] = getattr(state, "mutations", frozenset())
        self.deliver_at_send = "deliver-at-send" in mutations
        self.volatile = "volatile-timers" in mutations
        limits: TimerLimits = getattr(state, "timer_limits", None) or TimerLimits()
        self.limits = limits.resolved()
        self._buckets: dict[int, _Bucket] = {}
        self._keys_heap: list[int] = []  # bucket keys, each once
        self._dests: list[tuple[str, int]] = []  # destination id -> (topic, queue)
        self._dest_ids: dict[tuple[str, int], int] = {}  # live ones (a deleted topic's go)
        self._dead: set[int] = set()  # destination ids of deleted topics' queues
        self._msg_keys: dict[tuple[int, int], str] = {}  # (index, start) -> message key
        self._runs: list[Run] = []  # spilled, in the order they were made
        self._run_seq = 0  # the next run's number
        self._in_memory = 0  # records in the buckets
        self._pending = 0  # records in the buckets and unread in runs (live destinations)
        self.clock_ms = 0  # the highest time a DeliverDue carried
        self.seen_ms = 0  # the highest of that and the store times of held messages
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

    @property
    def in_memory(self) -> int:
        """Pending records held in memory (the others are in spilled runs)."""
        return self._in_memory

    @property
    def runs(self) -> int:
        """Spilled runs with records still to be read back."""
        return len(self._runs)

    def next_due(self) -> int | None:
        """A time at or before which the leader should propose `DeliverDue` (None: none
        pending): the earliest pending message's due time, or the time a run's next
        stretch is to be read back."""
        times = [self._buckets[self._keys_heap[0]].min_due] if self._keys_heap else []
        times += [r.min_due - self.limits.load_ahead_ms for r in self._runs]
        return min(times) if times else None

    def pinned_index(self) -> int | None:
        """The lowest Raft index a pending message is stored at (None: none pending)."""
        found = [b.min_index for b in self._buckets.values() if len(b)]
        found += [r.min_index for r in self._runs]
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
        packed = b"".join(_REC.pack(due_ms, index, r.start, r.size, r.tag_hash, dest, store_ms)
                          for r in refs)
        self._add(due_ms // BUCKET_MS, packed, due_ms, due_ms, index)
        for r in refs:
            if r.key:
                self._msg_keys[(index, r.start)] = r.key
        self._pending += len(refs)
        if store_ms > self.seen_ms:
            self.seen_ms = store_ms
        if self._in_memory > self.limits.memory_records:
            self._spill()

    def _add(self, key: int, packed: bytes, min_due: int, max_due: int,
             min_index: int) -> None:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(bytearray())
            heapq.heappush(self._keys_heap, key)
        bucket.add(packed, min_due, min_index)
        if max_due > bucket.max_due:
            bucket.max_due = max_due
        self._in_memory += len(packed) // _SIZE

    # ------------------------------------------------------------------ runs

    def _spill(self) -> None:
        """Write the records due beyond the horizon to a new run, if there are enough."""
        first = (self.seen_ms + self.limits.horizon_ms) // BUCKET_MS + 1
        far = sorted(k for k in self._buckets if k >= first)
        count = sum(len(self._buckets[k]) for k in far)
        if count < self.limits.spill_min:
            return
        records = b"".join(self._buckets[k].compact() for k in far)
        keys: list[list[object]] = []
        if self._msg_keys:  # (the common case, no keyed message pending, reads nothing)
            for rec in _REC.iter_unpack(records):
                key = self._msg_keys.pop((rec[1], rec[2]), None)
                if key is not None:
                    keys.append([rec[1], rec[2], key])
        for k in far:
            del self._buckets[k]
        self._keys_heap = sorted(self._buckets)
        self._in_memory -= count
        data, run = encode_run(run_name(self._run_seq), records, keys, far[0] * BUCKET_MS,
                               (far[-1] + 1) * BUCKET_MS - 1)
        self._run_seq += 1
        # written (and fsynced) at once: the records leave memory now; its directory
        # entry is made durable before a snapshot references it (`detach`)
        self.state.chunk_store.put(run.name, data, overwrite=True)
        self._runs.append(run)

    def _load(self, now: int) -> None:
        """Read back from every run the stretch due within the load window of `now`."""
        if not self._runs:
            return
        soon = now + self.limits.load_ahead_ms
        until = soon + self.limits.load_span_ms
        kept: list[Run] = []
        for run in self._runs:
            if run.min_due > soon:
                kept.append(run)
                continue
            records, keys = read_run(self.state.chunk_store, run)
            buckets = _BucketKeys(records)
            end = bisect_right(buckets, until // BUCKET_MS, run.skip, run.count)
            self._take(records[run.skip * _SIZE:end * _SIZE], keys, run.min_index)
            run.skip = end
            if run.skip < run.count:
                run.min_due = buckets[end] * BUCKET_MS
                kept.append(run)
        self._runs = kept

    def _take(self, records: memoryview, keys: dict[tuple[int, int], str],
              min_index: int) -> None:
        """Put records read back from a run (in bucket order) into their buckets, a
        bucket's slice at a time; a deleted topic's are dropped (counted when it was
        deleted). `min_index`: the run's, a lower bound of every record's."""
        buckets = _BucketKeys(records)
        n = len(buckets)
        i = 0
        while i < n:
            key = buckets[i]
            j = bisect_right(buckets, key, i, n)
            chunk = records[i * _SIZE:j * _SIZE]
            if self._dead or keys:
                recs = [r for r in _REC.iter_unpack(chunk) if r[5] not in self._dead]
                for r in recs:
                    k = keys.get((r[1], r[2]))
                    if k is not None:
                        self._msg_keys[(r[1], r[2])] = k
                packed = b"".join(_REC.pack(*r) for r in recs)
            else:
                packed = bytes(chunk)
            if packed:
                self._add(key, packed, key * BUCKET_MS, (key + 1) * BUCKET_MS - 1, min_index)
            i = j

    # ------------------------------------------------------------------ apply

    def _deliver(self, rec: DeliverDue, _index: int) -> ControlResult:
        now = self.clock_ms = max(self.clock_ms, rec.now_ms)
        if now > self.seen_ms:
            self.seen_ms = now
        self._load(now)
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
            self._in_memory -= len(recs)
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
        self._runs.clear()
        self._in_memory = self._pending = 0
        self.dropped += gone
        return ControlResult(ForgetPending.op, gone)

    def _enqueue(self, recs: list[tuple[int, ...]]) -> tuple[int, int]:
        """Append due records to their queues, a run of one entry and destination at a
        time (a batch's records go in one append); (moved, dropped)."""
        moved = dropped = 0
        first = 0
        for i in range(1, len(recs) + 1):
            if i < len(recs):
                a, b = recs[i - 1], recs[i]
                # same destination (5), entry (1) and store time (6), record after record
                if a[5] == b[5] and a[1] == b[1] and a[6] == b[6] and a[2] + a[3] == b[2]:
                    continue
            m, d = self._append(recs[first:i])
            moved += m
            dropped += d
            first = i
        return moved, dropped

    def _append(self, run: list[tuple[int, ...]]) -> tuple[int, int]:
        """One run of records of one entry for one destination into its queue."""
        _due, index, _start, _size, _tag, dest, store_ms = run[0]
        topic, queue = self._dests[dest]
        if dest in self._dead or not self.state.queues.hosts(topic, queue):
            if self._msg_keys:
                for r in run:
                    self._msg_keys.pop((r[1], r[2]), None)
            return 0, len(run)
        keys = self._msg_keys
        if keys and any((r[1], r[2]) in keys for r in run):
            refs = [RecordRef(r[2], r[3], keys.pop((r[1], r[2]), ""), r[4]) for r in run]
            self.state.queues.append(topic, queue, index, refs, store_ms)
        else:  # keyless (the common case): the queue's records packed in one pass
            self.state.queues.append_packed(topic, queue, index, run)
        return len(run), 0

    # ------------------------------------------------------------------ hooks

    def topic_deleted(self, config: TopicConfig) -> None:
        gone = {i for i, (t, _q) in enumerate(self._dests)
                if t == config.name and i not in self._dead}
        if not gone:
            return
        for i in gone:  # a topic created again with this name gets new destinations
            del self._dest_ids[self._dests[i]]
        self._dead |= gone
        for key, bucket in list(self._buckets.items()):
            kept = []
            for rec in _REC.iter_unpack(bucket.compact()):
                if rec[5] in gone:
                    self._msg_keys.pop((rec[1], rec[2]), None)
                    self._pending -= 1
                    self._in_memory -= 1
                    self.dropped += 1
                else:
                    kept.append(_REC.pack(*rec))
            if not kept:
                del self._buckets[key]
            elif len(kept) != len(bucket):
                self._buckets[key] = _Bucket(bytearray(b"".join(kept)), 0, bucket.ordered)
        self._keys_heap = sorted(self._buckets)
        for run in self._runs:  # their records stay in the file; counted as dropped now
            records, _keys = read_run(self.state.chunk_store, run)
            n = sum(1 for rec in _REC.iter_unpack(records[run.skip * _SIZE:])
                    if rec[5] in gone)
            self._pending -= n
            self.dropped += n

    # ------------------------------------------------------------------ snapshot

    def section(self) -> Any:
        return {
            "clock": self.clock_ms,
            "seen": self.seen_ms,
            "counts": [self.delivered, self.dropped],
            "dests": [[t, q, i in self._dead] for i, (t, q) in enumerate(self._dests)],
            "buckets": [[k, b.compact(), b.ordered]
                        for k, b in sorted(self._buckets.items()) if len(b)],
            "keys": [[i, s, k] for (i, s), k in sorted(self._msg_keys.items())],
            "runs": [r.to_list() for r in self._runs],
            "run_seq": self._run_seq,
            "pending": self._pending,
        }

    def detach(self) -> Detached:
        section = self.section()
        store = self.state.chunk_store
        refs = [r.ref for r in self._runs]
        seq = self._run_seq

        def write() -> None:
            gone = [name for name, _crc, _len in refs if not store.has(name)]
            if gone:
                raise ChunkGone(f"timer runs {gone[:3]} ({len(gone)}) were deleted meanwhile")
            store.sync()

        def saved() -> None:
            # runs made before this snapshot and not in it were read back: no durable
            # snapshot needs them any more (later ones may be live: left alone)
            keep = {name for name, _crc, _len in refs}
            store.keep_only(keep, only=lambda n: is_run_name(n) and run_seq(n) < seq)

        return Detached(section, write, saved)

    @staticmethod
    def chunk_refs(version: int, section: Any) -> list[ChunkRef]:
        """The run files a section of `version` references."""
        if version < 2:
            return []
        return [Run.from_list(item).ref for item in section.get("runs", ())]

    def load(self, version: int, section: Any) -> None:
        if version not in (1, 2):
            raise ValueError(f"unsupported timers section version {version!r}")
        if not isinstance(section, dict):
            raise ValueError("timers section is not a map")
        clock, counts = section.get("clock"), section.get("counts")
        if not is_int(clock) or not (isinstance(counts, list) and len(counts) == 2
                                     and all(is_int(c) for c in counts)):
            raise ValueError("timers section: bad clock or counts")
        self.clock_ms = clock
        self.seen_ms = section.get("seen", clock)
        self.delivered, self.dropped = counts
        for item in section.get("dests", ()):
            if not (isinstance(item, list) and len(item) in (2, 3) and isinstance(item[0], str)
                    and is_int(item[1])):
                raise ValueError(f"bad timers destination {item!r}")
            i = len(self._dests)
            self._dests.append((item[0], item[1]))
            if len(item) == 3 and item[2]:
                self._dead.add(i)
            else:
                self._dest_ids[(item[0], item[1])] = i
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
            self._in_memory += len(bucket)
        self._keys_heap = sorted(self._buckets)
        for item in section.get("keys", ()):
            if not (isinstance(item, list) and len(item) == 3 and is_int(item[0])
                    and is_int(item[1]) and isinstance(item[2], str)):
                raise ValueError("bad timers key")
            self._msg_keys[(item[0], item[1])] = item[2]
        self._runs = [Run.from_list(item) for item in section.get("runs", ())]
        for run in self._runs:  # present and whole: checked, not parsed
            load_chunk(self.state.chunk_store, run.ref)
        self._run_seq = section.get("run_seq", 0)
        self._pending = section.get("pending", self._in_memory)
        if not is_int(self._run_seq) or not is_int(self._pending):
            raise ValueError("timers section: bad run_seq or pending")
