"""Queues: one ConsumeQueue per hosted (topic, queue), the key index, and what was stored.

A MESSAGES entry's records get the next offsets of their queue (`append`); keyed records
enter the key index (the newest `KEY_HISTORY` (queue, offset) pairs per (topic, key)).
Retention drops every record stored below the horizon, and key slots pointing there.

Snapshot section, version 2 (version 1, every record inline, still loads)::

    {"counters": [messages, bytes], "chunk_records": n,
     "queues": [[topic, queue, min_offset, end_offset, head,
                 [[index, start, crc32c], ...], tail]],
     "keys": [[topic, key, [packed, ...]], ...]}

A queue's records from `min_offset` on are `head` (inline, up to the first chunk
boundary at or above `min_offset`), then its sealed chunks of `n` records each, by
reference (`broker.cqchunks`: named by their first record's Raft index and start, checked
by CRC32C, stored in the state's chunk store), then `tail` (inline, the open chunk). The
inline part of a queue is therefore under 2 * n records whatever the queue holds. Chunks
are cut at offsets that are multiples of `n`, so every replica, and every snapshot of a
replica, names the same chunks with the same bytes; a chunk is written to the store the
first time a snapshot needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import crc32c

from broker.consumequeue import CQ_RECORD, ConsumeQueue, CQEntry
from broker.cqchunks import ChunkGone, ChunkRef, chunk_name, load_chunk
from broker.parts.base import MAX_QUEUES, Detached, Part, TopicConfig
from broker.protocol import Code, RequestError
from broker.records import RecordRef

__all__ = ["CHUNK_RECORDS", "KEY_HISTORY", "Queues"]

KEY_HISTORY = 64  # newest (queue, offset) pairs kept per (topic, key)
CHUNK_RECORDS = 65_536  # records per sealed ConsumeQueue chunk (1.75 MiB)
_REC = CQ_RECORD.size


def _layout(lo: int, end: int, n: int) -> tuple[int, int]:
    """(a, b): a queue holding offsets lo..end-1 snapshots [lo, a) inline, the chunks of
    [a, b) by reference and [b, end) inline."""
    a = min(-(-lo // n) * n, end)  # the first chunk boundary at or above lo
    return a, max(a, end // n * n)


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
        # CRC32C of the sealed chunks the last snapshot named: a cache (chunks never
        # change), so taking a snapshot reads only chunks sealed since
        self._crcs: dict[str, int] = {}

    # ------------------------------------------------------------------ apply

    def hosts(self, topic: str, queue: int) -> bool:
        return (topic, queue) in self.queues

    def append(self, topic: str, queue: int, index: int, refs: Sequence[RecordRef],
               store_ms: int) -> int:
        """Add the records of the batch at Raft `index` to a hosted queue; returns the
        offset of the first."""
        base = self.queues[(topic, queue)].extend(index, refs, store_ms)
        self.bytes_applied += refs[-1].start + refs[-1].size - refs[0].start  # contiguous
        keys = self._keys.get(topic)
        for i, ref in enumerate(refs):
            if ref.key:
                if keys is None:
                    keys = self._keys[topic] = {}
                slots = keys.get(ref.key)
                packed = (base + i) * MAX_QUEUES + queue
                if slots is None:
                    keys[ref.key] = [packed]
                else:
                    slots.append(packed)
                    if len(slots) > KEY_HISTORY:
                        del slots[0]
        self.messages_applied += len(refs)
        return base

    def topic_created(self, config: TopicConfig) -> None:
        for q in config.hosted:
            self.queues[(config.name, q)] = ConsumeQueue()

    def topic_grown(self, old: TopicConfig, new: TopicConfig) -> None:
        for q in new.hosted:
            if (new.name, q) not in self.queues:
                self.queues[(new.name, q)] = ConsumeQueue()

    def topic_deleted(self, config: TopicConfig) -> None:
        for q in config.hosted:
            del self.queues[(config.name, q)]
        self._keys.pop(config.name, None)

    def retained(self, min_index: int) -> int:
        dropped = 0
        for cq in self.queues.values():
            dropped += cq.drop_before(cq.first_offset_at_or_after_index(min_index))
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

    def queue(self, topic: str, queue: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue))
        if cq is None:
            if self.state.topic(topic) is None:
                raise _unknown_topic(topic)
            raise RequestError(
                Code.UNKNOWN_QUEUE, f"queue {queue} of topic {topic!r} is not hosted in this group"
            )
        return cq

    def locate(self, topic: str, queue: int, index: int, slot: int) -> int:
        cq = self.queue(topic, queue)
        offset = cq.first_offset_at_or_after_index(index) + slot
        if slot >= 0 and cq.min_offset <= offset < cq.end_offset:
            if cq.get(offset).index == index:
                return offset
        raise RequestError(
            Code.NOT_FOUND, f"no message {slot} of entry {index} in {topic}/{queue}"
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
        crcs: dict[str, int] = {}
        new: list[tuple[str, bytes]] = []
        queues = []
        for (t, q), cq in sorted(self.queues.items()):
            lo, end = cq.min_offset, cq.end_offset
            a, b = _layout(lo, end, n)
            refs = []
            for first in range(a, b, n):
                index, start = cq.index_and_start(first)
                name = chunk_name(index, start, n)
                crc = self._crcs.get(name)
                if crc is None or not store.has(name):
                    data = cq.records_between(first, first + n)
                    crc = crc32c.crc32c(data)
                    if not store.has(name):
                        new.append((name, data))
                crcs[name] = crc
                refs.append([index, start, crc])
            queues.append([t, q, lo, end, cq.records_between(lo, a), refs,
                           cq.records_between(b, end)])
        self._crcs = crcs
        section = {
            "counters": [self.messages_applied, self.bytes_applied],
            "chunk_records": n,
            "queues": queues,
            "keys": [
                [t, k, list(keys[k])]
                for t, keys in sorted(self._keys.items())
                for k in sorted(keys)
            ],
        }

        def write() -> None:
            for name, data in new:
                store.put(name, data)
            gone = [name for name in crcs if not store.has(name)]
            if gone:
                raise ChunkGone(f"chunks {gone[:3]} ({len(gone)}) were deleted meanwhile")
            store.sync()

        def saved() -> None:
            store.keep_only(crcs)

        return Detached(section, write, saved)

    @staticmethod
    def chunk_refs(version: int, section: Any) -> list[ChunkRef]:
        """The chunks a section of `version` references (none before version 2)."""
        if version == 1:
            return []
        n = int(section["chunk_records"])
        return [(chunk_name(index, start, n), crc, n * _REC)
                for _t, _q, _lo, _end, _head, refs, _tail in section["queues"]
                for index, start, crc in refs]

    def load(self, version: int, section: Any) -> None:
        if version not in (1, 2):
            raise ValueError(f"unsupported queues section version {version!r}")
        self.messages_applied, self.bytes_applied = (int(x) for x in section["counters"])
        if version == 1:
            for t, q, lo, records in section["queues"]:
                self.queues[(t, q)] = ConsumeQueue(lo, records)
        else:
            self._load_queues(int(section["chunk_records"]), section["queues"])
        for t, k, packed in section["keys"]:
            self._keys.setdefault(t, {})[k] = list(packed)

    def _load_queues(self, n: int, queues: Any) -> None:
        """Version 2 queues: inline head, referenced chunks (read and checked), tail."""
        if n < 1:
            raise ValueError(f"bad chunk_records {n!r}")
        store = self.state.chunk_store
        for t, q, lo, end, head, refs, tail in queues:
            buf = bytearray(head)
            for index, start, crc in refs:
                name = chunk_name(index, start, n)
                chunk = load_chunk(store, (name, crc, n * _REC))
                if CQ_RECORD.unpack_from(chunk, 0)[:2] != (index, start):
                    raise ValueError(f"chunk {name} does not start with its own record")
                self._crcs[name] = crc
                buf += chunk
            buf += tail
            if lo < 0 or len(head) % _REC or len(tail) % _REC:
                raise ValueError(f"bad records of queue {t!r}/{q!r}")
            if end != lo + len(buf) // _REC:
                raise ValueError(f"queue {t!r}/{q!r} does not hold {lo}..{end}")
            a, b = _layout(lo, end, n)
            if (len(head), len(refs) * n, len(tail)) != ((a - lo) * _REC, b - a, (end - b) * _REC):
                raise ValueError(f"queue {t!r}/{q!r} is not cut at its chunk boundaries")
            self.queues[(t, q)] = ConsumeQueue(lo, buf)

    def check(self) -> None:
        hosted = sorted((c.name, q) for c in self.state.topics().values() for q in c.hosted)
        if sorted(self.queues) != hosted:
            raise ValueError("snapshot queues do not match its topics")
