"""Queues: one ConsumeQueue per hosted (topic, queue), the key index, and what was stored.

A MESSAGES entry's records get the next offsets of their queue (`append`); keyed records
enter the key index (the newest `KEY_HISTORY` (queue, offset) pairs per (topic, key)).
Retention drops every record stored below the horizon, and key slots pointing there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker.consumequeue import ConsumeQueue, CQEntry
from broker.parts.base import MAX_QUEUES, Part, TopicConfig
from broker.protocol import Code, RequestError
from broker.records import RecordRef

__all__ = ["KEY_HISTORY", "Queues"]

KEY_HISTORY = 64  # newest (queue, offset) pairs kept per (topic, key)


def _unknown_topic(topic: str) -> RequestError:
    return RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist in this group")


class Queues(Part):
    """ConsumeQueues, the key index and the counters of what they hold."""

    name = "queues"
    version = 1

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.messages_applied = 0  # records appended to consume queues, ever
        self.bytes_applied = 0  # their record bytes
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        # topic -> key -> packed (offset * MAX_QUEUES + queue), oldest first
        self._keys: dict[str, dict[str, list[int]]] = {}

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

    def locate(self, topic: str, queue: int, index: int, start: int) -> int:
        # Along a queue (index, start) only grows: entries in log order, and inside an
        # entry its batches and their records in data order. So: binary search.
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
        return {
            "counters": [self.messages_applied, self.bytes_applied],
            "queues": [
                [t, q, cq.min_offset, cq.records()] for (t, q), cq in sorted(self.queues.items())
            ],
            "keys": [
                [t, k, list(keys[k])]
                for t, keys in sorted(self._keys.items())
                for k in sorted(keys)
            ],
        }

    def load(self, version: int, section: Any) -> None:
        if version != 1:
            raise ValueError(f"unsupported queues section version {version!r}")
        self.messages_applied, self.bytes_applied = (int(x) for x in section["counters"])
        for t, q, lo, records in section["queues"]:
            self.queues[(t, q)] = ConsumeQueue(lo, records)
        for t, k, packed in section["keys"]:
            self._keys.setdefault(t, {})[k] = list(packed)

    def check(self) -> None:
        hosted = sorted((c.name, q) for c in self.state.topics().values() for q in c.hosted)
        if sorted(self.queues) != hosted:
            raise ValueError("snapshot queues do not match its topics")
