"""Queues: one ConsumeQueue per hosted (topic, queue), the key index, and what was stored.

A MESSAGES entry's records get the next offsets of their queue (`append`); keyed records
enter the key index (the newest `KEY_HISTORY` (queue, offset) pairs per (topic, key)).
Retention drops every record stored below the horizon, and key slots pointing there.

The key index is derived state: a (topic, key) lists the newest `KEY_HISTORY` retained
records of the topic carrying that key, in log order. So besides it each queue keeps the
keys of its keyed records (offset, key), which is what snapshots hold, and a restore
rebuilds the index from them.

Snapshot section, version 2 (version 1, every record and the key index inline, still
loads)::

    {"counters": [messages, bytes], "chunk_records": n,
     "queues": [[topic, queue, min_offset, end_offset, head, head_keys,
                 [[index, start, crc32c, length], ...], tail, tail_keys]]}

A queue's records from `min_offset` on are `head` (inline, up to the first chunk
boundary at or above `min_offset`), then its sealed chunks of `n` records each, by
reference (`broker.state.cqchunks`: named by their first record's Raft index and start, checked
by length and CRC32C, stored in the state's chunk store), then `tail` (inline, the open
chunk). `head_keys` and `tail_keys` are the [offset, key] of the keyed records inline; a
chunk is its `n` records followed by the msgpack list of [offset - first offset, key] of
its keyed ones. The inline part of a queue is therefore under 2 * n records whatever the
queue holds. Chunks are cut at offsets that are multiples of `n`, so every replica, and
every snapshot of a replica, names the same chunks with the same bytes; a chunk is
written to the store the first time a snapshot needs it.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any

import crc32c
import msgpack

from broker.state.consumequeue import CQ_RECORD, ConsumeQueue, CQEntry
from broker.state.cqchunks import (
    CHUNK_RECORDS,
    ChunkGone,
    ChunkRef,
    chunk_name,
    is_chunk_name,
    load_chunk,
)
from broker.state.parts.base import MAX_QUEUES, Detached, Part, TopicConfig, pack
from wire.protocol import Code, RequestError
from wire.records import RecordRef

__all__ = ["CHUNK_RECORDS", "KEY_HISTORY", "Queues"]

KEY_HISTORY = 64  # newest (queue, offset) pairs kept per (topic, key)
LATE_WINDOW = 65_536  # records looked at either side for a committed transaction's record
_REC = CQ_RECORD.size


def _layout(lo: int, end: int, n: int) -> tuple[int, int]:
    """(a, b): a queue holding offsets lo..end-1 snapshots [lo, a) inline, the chunks of
    [a, b) by reference and [b, end) inline."""
    a = min(-(-lo // n) * n, end)  # the first chunk boundary at or above lo
    return a, max(a, end // n * n)


class _Keyed:
    """The keyed records of one queue: offsets (ascending, 8 bytes each) and their keys
    (interned: a hot key is one string however many records carry it)."""

    __slots__ = ("keys", "offsets")

    def __init__(self, offsets: Iterable[int] = (), keys: Iterable[str] = ()) -> None:
        self.offsets = array("q", offsets)
        self.keys = [sys.intern(k) for k in keys]

    def between(self, lo: int, hi: int) -> list[list[Any]]:
        """[offset, key] of the keyed records at lo <= offset < hi."""
        i, j = bisect_left(self.offsets, lo), bisect_left(self.offsets, hi)
        return [[o, k] for o, k in zip(self.offsets[i:j], self.keys[i:j], strict=True)]

    def drop_before(self, offset: int) -> None:
        i = bisect_left(self.offsets, offset)
        del self.offsets[:i], self.keys[:i]


def _unknown_topic(topic: str) -> RequestError:
    return RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist in this group")


class Queues(Part):
    """ConsumeQueues, the key index and the counters of what they hold."""

    name = "queues"
    version = 2

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.messages_applied = 0  # records appended to consume queues, ever
        self.bytes_applied = 0  # their record bytes
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        # topic -> key -> packed (offset * MAX_QUEUES + queue), oldest first
        self._keys: dict[str, dict[str, list[int]]] = {}
        self._keyed: dict[tuple[str, int], _Keyed] = {}  # what the index is made from
        # (CRC32C, length) of the sealed chunks the last snapshot named: a cache (chunks
        # never change), so taking a snapshot reads only chunks sealed since
        self._crcs: dict[str, tuple[int, int]] = {}

    # ------------------------------------------------------------------ apply

    def hosts(self, topic: str, queue: int) -> bool:
        return (topic, queue) in self.queues

    def append(self, topic: str, queue: int, index: int, refs: Sequence[RecordRef],
               store_ms: int) -> int:
        """Add the records of the batch at Raft `index` to a hosted queue; returns the
        offset of the first."""
        return self.append_to(self.queues[(topic, queue)], topic, queue, index, refs, store_ms)

    def append_to(self, cq: ConsumeQueue, topic: str, queue: int, index: int,
                  refs: Sequence[RecordRef], store_ms: int) -> int:
        """`append` to `cq`, the queue (topic, queue) the caller has already found."""
        base = cq.extend(index, refs, store_ms)
        last = refs[-1]
        self.bytes_applied += last.start + last.size - refs[0].start  # contiguous
        self.messages_applied += len(refs)
        if len(refs) == 1 and not last.key:  # one keyless message: nothing to index
            return base
        keys = self._keys.get(topic)
        keyed = None
        for i, ref in enumerate(refs):
            if ref.key:
                if keys is None:
                    keys = self._keys[topic] = {}
                if keyed is None:
                    keyed = self._keyed[(topic, queue)]
                keyed.offsets.append(base + i)
                keyed.keys.append(sys.intern(ref.key))
                slots = keys.get(ref.key)
                packed = (base + i) * MAX_QUEUES + queue
                if slots is None:
                    keys[ref.key] = [packed]
                else:
                    slots.append(packed)
                    if len(slots) > KEY_HISTORY:
                        del slots[0]
        return base

    def append_packed(self, topic: str, queue: int, index: int,
                      records: Sequence[tuple[int, ...]]) -> int:
        """`append` for keyless records of the entry at `index` given as the delayed-
        message part holds them ((due, index, start, size, tag hash, destination, store
        time), contiguous in the entry): no `RecordRef` per record. Returns the first
        offset."""
        pack = CQ_RECORD.pack
        data = b"".join([pack(index, r[2], r[3], r[4], r[6]) for r in records])
        base = self.queues[(topic, queue)].extend_packed(index, data, len(records))
        self.bytes_applied += records[-1][2] + records[-1][3] - records[0][2]  # contiguous
        self.messages_applied += len(records)
        return base

    def topic_created(self, config: TopicConfig) -> None:
        for q in config.hosted:
            self.queues[(config.name, q)] = ConsumeQueue()
            self._keyed[(config.name, q)] = _Keyed()

    def topic_grown(self, old: TopicConfig, new: TopicConfig) -> None:
        for q in new.hosted:
            if (new.name, q) not in self.queues:
                self.queues[(new.name, q)] = ConsumeQueue()
                self._keyed[(new.name, q)] = _Keyed()

    def topic_deleted(self, config: TopicConfig) -> None:
        for q in config.hosted:
            del self.queues[(config.name, q)]
            del self._keyed[(config.name, q)]
        self._keys.pop(config.name, None)

    def retained(self, min_index: int) -> int:
        dropped = 0
        for tq, cq in self.queues.items():
            dropped += cq.drop_before(cq.first_offset_at_or_after_index(min_index))
            self._keyed[tq].drop_before(cq.min_offset)
        # Key slots pointing below a queue's new minimum can never be served again.
        for topic, keys in self._keys.items():
            for key in list(keys):
                kept = [
                    p for p in keys[key]
                    if p // MAX_QUEUES >= self.queues[(topic, p % MAX_QUEUES)].min_offset
                ]
                if kept:
                    keys[key] = kept
                else:
                    del keys[key]
        return dropped

    # ------------------------------------------------------------------ queries

    def retention_gaps(self) -> list[tuple[int, int]]:
        """Every queue's late spans, overlapping ones merged, in order."""
        spans = sorted({s for cq in self.queues.values() for s in cq.late_spans()})
        merged: list[tuple[int, int]] = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        return merged

    def queue(self, topic: str, queue: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue))
        if cq is None:
            if self.state.topic(topic) is None:
                raise _unknown_topic(topic)
            raise RequestError(
                Code.UNKNOWN_QUEUE, f"queue {queue} of topic {topic!r} is not hosted in this group"
            )
        return cq

    def locate(self, topic: str, queue: int, index: int, start: int) -> int:
        # Along a queue (index, start) only grows: entries in log order, and inside an
        # entry its batches and their records in data order. So: binary search (but for
        # committed transactions' records, see below).
        cq = self.queue(topic, queue)
        lo = cq.first_offset_at_or_after_index(index)
        hi = cq.first_offset_at_or_after_index(index + 1)
        while lo < hi:
            mid = (lo + hi) // 2
            if cq.get(mid).start < start:
                lo = mid + 1
            else:
                hi = mid
        if lo < cq.end_offset:
            e = cq.get(lo)
            if e.index == index and e.start == start:
                return lo
        # A committed transaction's records enter the queue at their decision, pointing
        # at the older entry that holds them, so there (index, start) breaks the order:
        # look near the place the search found, within a bound (no unbounded scan).
        found = cq.find_near(lo, index, start, LATE_WINDOW)
        if found is not None:
            return found
        raise RequestError(
            Code.NOT_FOUND, f"no message at {start} of entry {index} in {topic}/{queue}"
        )

    def entry_of(self, topic: str, queue: int, offset: int) -> CQEntry:
        return self.queue(topic, queue).get(offset)

    def keys(self, topic: str, key: str) -> list[tuple[int, int]]:
        if self.state.topic(topic) is None:
            raise _unknown_topic(topic)
        packed = self._keys.get(topic, {}).get(key, [])
        return [(p % MAX_QUEUES, p // MAX_QUEUES) for p in packed]

    # ------------------------------------------------------------------ snapshot

    def section(self) -> Any:
        """The section alone; the chunks it names are written by `detach().write`."""
        return self.detach().section

    def detach(self) -> Detached:
        store, n = self.state.chunk_store, self.state.chunk_records
        crcs: dict[str, tuple[int, int]] = {}
        new: list[tuple[str, bytes]] = []
        queues = []
        for (t, q), cq in sorted(self.queues.items()):
            keyed = self._keyed[(t, q)]
            lo, end = cq.min_offset, cq.end_offset
            a, b = _layout(lo, end, n)
            refs = []
            for first in range(a, b, n):
                index, start = cq.index_and_start(first)
                name = chunk_name(index, start, n)
                known = self._crcs.get(name)
                if known is not None and store.has(name):
                    crc, length = known
                else:
                    data = cq.records_between(first, first + n) + pack(
                        [[o - first, k] for o, k in keyed.between(first, first + n)])
                    crc, length = crc32c.crc32c(data), len(data)
                    # Written even where a file of that name exists: no snapshot of this
                    # state checked it (one left by a snapshot whose file was never
                    # written may have been damaged since), and a snapshot referencing
                    # a bad copy would be refused at every later start.
                    new.append((name, data))
                crcs[name] = (crc, length)
                refs.append([index, start, crc, length])
            queues.append([t, q, lo, end, cq.records_between(lo, a), keyed.between(lo, a),
                           refs, cq.records_between(b, end), keyed.between(b, end)])
        self._crcs = crcs
        section = {
            "counters": [self.messages_applied, self.bytes_applied],
            "chunk_records": n,
            "queues": queues,
        }

        def write() -> None:
            for name, data in new:
                store.put(name, data, overwrite=True)
            gone = [name for name in crcs if not store.has(name)]
            if gone:
                raise ChunkGone(f"chunks {gone[:3]} ({len(gone)}) were deleted meanwhile")
            store.sync()

        def saved() -> None:
            store.keep_only(crcs, only=is_chunk_name)

        return Detached(section, write, saved)

    @staticmethod
    def chunk_refs(version: int, section: Any) -> list[ChunkRef]:
        """The chunks a section of `version` references (none before version 2)."""
        if version == 1:
            return []
        n = int(section["chunk_records"])
        return [(chunk_name(index, start, n), crc, length)
                for _t, _q, _lo, _end, _head, _hk, refs, _tail, _tk in section["queues"]
                for index, start, crc, length in refs]

    def load(self, version: int, section: Any) -> None:
        if version not in (1, 2):
            raise ValueError(f"unsupported queues section version {version!r}")
        self.messages_applied, self.bytes_applied = (int(x) for x in section["counters"])
        if version == 1:
            self._load_v1(section)
        else:
            self._load_queues(int(section["chunk_records"]), section["queues"])
        self._index_keys()

    def _load_v1(self, section: Any) -> None:
        """Every record inline, and the key index itself (whose records are the keyed
        ones still to know: the index never names more than that)."""
        for t, q, lo, records in section["queues"]:
            self.queues[(t, q)] = ConsumeQueue(lo, records)
            self._keyed[(t, q)] = _Keyed()
        for t, k, packed in section["keys"]:
            for p in packed:
                if (t, p % MAX_QUEUES) not in self._keyed:
                    raise ValueError(f"key {k!r} of {t!r} in a queue not hosted")
            for p in packed:
                keyed = self._keyed[(t, p % MAX_QUEUES)]
                keyed.offsets.append(p // MAX_QUEUES)
                keyed.keys.append(k)
        for keyed in self._keyed.values():  # into offset order
            pairs = sorted(zip(keyed.offsets, keyed.keys, strict=True))
            keyed.offsets = array("q", [o for o, _ in pairs])
            keyed.keys = [k for _, k in pairs]

    def _load_queues(self, n: int, queues: Any) -> None:
        """Version 2 queues: inline head, referenced chunks (read and checked), tail."""
        if n < 1:
            raise ValueError(f"bad chunk_records {n!r}")
        store = self.state.chunk_store
        size = n * _REC
        for t, q, lo, end, head, head_keys, refs, tail, tail_keys in queues:
            buf = bytearray(head)
            pairs = [(int(o), k) for o, k in head_keys]
            for i, (index, start, crc, length) in enumerate(refs):
                name = chunk_name(index, start, n)
                chunk = load_chunk(store, (name, crc, length))
                if length < size or CQ_RECORD.unpack_from(chunk, 0)[:2] != (index, start):
                    raise ValueError(f"chunk {name} does not start with its own record")
                first = lo + len(head) // _REC + i * n
                for slot, k in msgpack.unpackb(chunk[size:], raw=False):
                    if not 0 <= slot < n:
                        raise ValueError(f"chunk {name} keys a record it does not hold")
                    pairs.append((first + slot, k))
                self._crcs[name] = (crc, length)
                buf += chunk[:size]
            buf += tail
            pairs += [(int(o), k) for o, k in tail_keys]
            if lo < 0 or len(head) % _REC or len(tail) % _REC:
                raise ValueError(f"bad records of queue {t!r}/{q!r}")
            if end != lo + len(buf) // _REC:
                raise ValueError(f"queue {t!r}/{q!r} does not hold {lo}..{end}")
            a, b = _layout(lo, end, n)
            if (len(head), len(refs) * n, len(tail)) != ((a - lo) * _REC, b - a, (end - b) * _REC):
                raise ValueError(f"queue {t!r}/{q!r} is not cut at its chunk boundaries")
            offsets = [o for o, _ in pairs]
            inside = not offsets or lo <= offsets[0] <= offsets[-1] < end
            if offsets != sorted(set(offsets)) or not inside or not all(
                    isinstance(k, str) and k for _, k in pairs):
                raise ValueError(f"bad keyed records of queue {t!r}/{q!r}")
            self.queues[(t, q)] = ConsumeQueue(lo, buf)
            self._keyed[(t, q)] = _Keyed(offsets, (k for _, k in pairs))

    def _index_keys(self) -> None:
        """The key index from the queues' keyed records: per (topic, key), the newest
        `KEY_HISTORY` in log order (Raft index, then place in the entry)."""
        by_topic: dict[str, list[tuple[int, int, int, str]]] = {}
        for (t, q), keyed in self._keyed.items():
            cq = self.queues[(t, q)]
            found = by_topic.setdefault(t, [])
            for o, k in zip(keyed.offsets, keyed.keys, strict=True):
                index, start = cq.index_and_start(o)
                found.append((index, start, o * MAX_QUEUES + q, k))
        self._keys = {}
        for t, found in sorted(by_topic.items()):
            if not found:
                continue
            found.sort()
            keys = self._keys[t] = {}
            for _index, _start, packed, k in found:
                keys.setdefault(k, []).append(packed)
            for k, slots in keys.items():
                if len(slots) > KEY_HISTORY:
                    keys[k] = slots[-KEY_HISTORY:]

    def check(self) -> None:
        hosted = sorted((c.name, q) for c in self.state.topics().values() for q in c.hosted)
        if sorted(self.queues) != hosted:
            raise ValueError("snapshot queues do not match its topics")
