"""The broker state machine: everything a client can observe, derived from committed entries.

Every replica of a group feeds the same committed entries, in log order, to `apply`, and
so computes the same topics, queue offsets, consumer offsets and duplicate-detection
state. A new leader therefore needs no recovery step, and a snapshot taken on one replica
restores on any other.

`apply` is pure and total: no I/O, no clocks (the store time travels inside MESSAGES
entries), no randomness, and it never raises for bad entry data. The leader validates
before proposing, but whatever reaches the log must have one deterministic outcome, which
for garbage is an `ErrorResult` and no change.

Entries applied:

- NOOP, CONFIG: nothing (result None).
- MESSAGES: `STORED_PREFIX` (store_ms) + a producer batch (`broker.records`). Each record
  gets the next offset of its (topic, queue); keyed records enter the key index.
  Idempotent producers (pid != 0) are deduplicated per (pid, topic, queue) by sequence.
- CONTROL: a msgpack map with "op": create_topic, delete_topic, offsets, retain (see the
  `control_*` encoders).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from broker.consumequeue import ConsumeQueue, CQEntry
from broker.protocol import (
    MAX_MESSAGE_BYTES,
    Code,
    RequestError,
    validate_group_name,
    validate_topic_name,
)
from broker.records import STORED_PREFIX, BatchHeader, RecordRef, walk_batch
from raftlog.types import Entry, EntryType

__all__ = [
    "DEDUP_WINDOW",
    "KEY_HISTORY",
    "MAX_QUEUES",
    "ApplyResult",
    "BrokerState",
    "ControlResult",
    "ErrorResult",
    "ProduceResult",
    "TopicConfig",
    "control_create_topic",
    "control_delete_group",
    "control_delete_topic",
    "control_grow_topic",
    "control_offsets",
    "control_retain",
]

MAX_QUEUES = 1024  # queues per topic; also what lets a key-index slot pack (offset, queue)
DEDUP_WINDOW = 5  # idempotent batches remembered per (pid, topic, queue), as Kafka does
KEY_HISTORY = 64  # newest (queue, offset) pairs kept per (topic, key)
SNAPSHOT_VERSION = 1
_MAX_ENTRY_DATA = 0xFFFFFFFF  # record starts are u32 in the ConsumeQueue
_MAX_WALKED = 1 << 14  # produce-path walks kept for apply (see `prewalked`)


# ---------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic as this group knows it: `queues` in total, of which it hosts `hosted`."""

    name: str
    queues: int
    hosted: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProduceResult:
    """Where a batch landed. A duplicate too old to remember has base_offset == index == -1."""

    base_offset: int
    count: int
    index: int
    dup: bool = False


@dataclass(frozen=True, slots=True)
class ControlResult:
    """A control entry took effect: `applied` things changed, `skipped` were ignored."""

    op: str
    applied: int = 0
    skipped: int = 0


@dataclass(frozen=True, slots=True)
class ErrorResult:
    """The entry was refused as a whole and changed nothing."""

    code: Code
    message: str


ApplyResult = ProduceResult | ControlResult | ErrorResult | None


class _Refused(Exception):
    """Internal: turns into an ErrorResult at the apply boundary."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class _Producer:
    """Dedup state of one (pid, topic, queue): last sequence and the recent outcomes."""

    last_seq: int
    recent: list[tuple[int, int, int, int]]  # (seq, base_offset, count, index), oldest first


# ---------------------------------------------------------------------- control encoders


def _pack(obj: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def control_create_topic(topic: str, queues: int, hosted: Iterable[int]) -> bytes:
    """CONTROL data creating `topic` with `queues` in total, `hosted` of them in this group."""
    return _pack({"op": "create_topic", "topic": topic, "queues": queues,
                  "hosted": sorted(hosted)})


def control_delete_topic(topic: str) -> bytes:
    """CONTROL data deleting `topic` with its queues, consumer offsets and key index."""
    return _pack({"op": "delete_topic", "topic": topic})


def control_grow_topic(topic: str, queues: int, hosted: Iterable[int]) -> bytes:
    """CONTROL data giving `topic` `queues` in total, `hosted` of them in this group: a
    superset of what it hosted (the topic is created here if this group had none)."""
    return _pack({"op": "grow_topic", "topic": topic, "queues": queues,
                  "hosted": sorted(hosted)})


def control_delete_group(cg: str) -> bytes:
    """CONTROL data forgetting every offset consumer group `cg` committed in this group."""
    return _pack({"op": "delete_group", "cg": cg})


def control_offsets(cg: str, offsets: Iterable[tuple[str, int, int]]) -> bytes:
    """CONTROL data committing consumer offsets [(topic, queue, offset), ...] of group `cg`."""
    return _pack({"op": "offsets", "cg": cg, "offsets": [[t, q, o] for t, q, o in offsets]})


def control_retain(min_index: int) -> bytes:
    """CONTROL data dropping every message stored below Raft index `min_index`."""
    return _pack({"op": "retain", "min_index": min_index})


# ---------------------------------------------------------------------- helpers


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_field(d: dict[str, Any], name: str, lo: int, hi: int | None = None) -> int:
    v = d.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise _Refused(Code.MALFORMED, f"{name} must be an integer {bound}, got {v!r}")
    return v


def _name(validate: Any, value: object) -> str:
    try:
        name: str = validate(value)
    except RequestError as exc:
        raise _Refused(exc.code, exc.message) from None
    return name


def _unknown_topic(topic: str) -> RequestError:
    return RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist in this group")


# ---------------------------------------------------------------------- the state


class BrokerState:
    """One group's broker state; `apply` committed entries in log order, query at will."""

    def __init__(self, group: str, *, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.group = group
        self.max_message_bytes = max_message_bytes
        self._applied = 0
        self._retained = 0
        self.messages_applied = 0  # records appended to consume queues, ever
        self.bytes_applied = 0  # their record bytes
        self._topics: dict[str, TopicConfig] = {}
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._offsets: dict[tuple[str, str, int], int] = {}  # (cg, topic, queue) -> offset
        self._producers: dict[tuple[int, str, int], _Producer] = {}
        # topic -> key -> packed (offset * MAX_QUEUES + queue), oldest first
        self._keys: dict[str, dict[str, list[int]]] = {}
        # Batches this replica's produce path already walked, by id of the entry data:
        # not state, only a saved walk (see `prewalked`).
        self._walked: dict[int, tuple[bytes, BatchHeader, list[RecordRef]]] = {}

    # ------------------------------------------------------------------ produce path

    def prewalked(
        self, data: bytes, header: BatchHeader, refs: list[RecordRef], max_message_bytes: int
    ) -> int | None:
        """Remember the walk of MESSAGES entry `data` (`walk_batch(data, STORED_PREFIX.size,
        max_message_bytes)`), done by the leader before proposing it, so that applying
        the very same bytes object does not walk it again. Returns a key for
        `forget_walk` (None when nothing was kept).

        A walk is a pure function of the bytes and the size limit, so the result of
        `apply` does not change: the walk is reused only for the identical object and
        when the limits agree.
        """
        if max_message_bytes != self.max_message_bytes:
            return None
        if len(self._walked) >= _MAX_WALKED:  # proposals that never applied here
            self._walked.clear()
        key = id(data)
        self._walked[key] = (data, header, refs)
        return key

    def forget_walk(self, key: int | None) -> None:
        """Drop a walk `prewalked` kept (a no-op once its entry was applied)."""
        if key is not None:
            self._walked.pop(key, None)

    # ------------------------------------------------------------------ apply

    @property
    def applied_index(self) -> int:
        """Index of the last entry applied (0 before any)."""
        return self._applied

    @property
    def retained_index(self) -> int:
        """The highest `retain` min_index applied: nothing below it is still referenced."""
        return self._retained

    def apply(self, entry: Entry) -> ApplyResult:
        """Apply one committed entry; never raises for bad data (the outcome is the result).

        An entry at or below `applied_index` was already applied (e.g. replayed after a
        snapshot restore) and is ignored, so replays cannot double-count.
        """
        if entry.index <= self._applied:
            return None
        self._applied = entry.index
        try:
            if entry.type == EntryType.MESSAGES:
                return self._apply_messages(entry)
            if entry.type == EntryType.CONTROL:
                return self._apply_control(entry.data)
        except _Refused as exc:
            return ErrorResult(exc.code, exc.message)
        return None

    def _apply_messages(self, entry: Entry) -> ApplyResult:
        data = entry.data
        if len(data) < STORED_PREFIX.size or len(data) > _MAX_ENTRY_DATA:
            raise _Refused(Code.MALFORMED, f"messages entry of {len(data)} bytes")
        (store_ms,) = STORED_PREFIX.unpack_from(data, 0)
        walked = self._walked.pop(id(data), None) if self._walked else None
        if walked is not None and walked[0] is data:
            _, header, refs = walked
        else:
            try:
                header, refs = walk_batch(data, STORED_PREFIX.size, self.max_message_bytes)
            except RequestError as exc:
                raise _Refused(exc.code, exc.message) from None
            except Exception as exc:  # walk_batch should only raise RequestError; stay total
                raise _Refused(Code.MALFORMED, f"malformed batch: {exc}") from None
        if header.pid and header.seq < 0:
            raise _Refused(Code.MALFORMED, "an idempotent batch (pid != 0) needs a sequence")
        topic, queue = header.topic, header.queue
        if topic not in self._topics:
            raise _Refused(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist in this group")
        cq = self._queues.get((topic, queue))
        if cq is None:
            raise _Refused(Code.UNKNOWN_QUEUE, f"queue {queue} of {topic!r} is not hosted here")

        pstate: _Producer | None = None
        if header.pid:
            pstate = self._producers.get((header.pid, topic, queue))
            if pstate is not None:
                for seq, base, count, index in pstate.recent:
                    if seq == header.seq:
                        return ProduceResult(base, count, index, dup=True)
                if header.seq <= pstate.last_seq:
                    return ProduceResult(-1, len(refs), -1, dup=True)
                if header.seq > pstate.last_seq + 1:
                    raise _Refused(
                        Code.SEQUENCE_GAP,
                        f"sequence {header.seq} after {pstate.last_seq} for producer "
                        f"{header.pid} on {topic}/{queue}",
                    )

        base = cq.extend(entry.index, refs, store_ms)
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

        if header.pid:
            outcome = (header.seq, base, len(refs), entry.index)
            if pstate is None:
                self._producers[(header.pid, topic, queue)] = _Producer(header.seq, [outcome])
            else:
                pstate.last_seq = header.seq
                pstate.recent.append(outcome)
                if len(pstate.recent) > DEDUP_WINDOW:
                    del pstate.recent[0]
        return ProduceResult(base, len(refs), entry.index)

    def _apply_control(self, data: bytes) -> ApplyResult:
        try:
            d = msgpack.unpackb(data, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise _Refused(Code.MALFORMED, f"undecodable control entry: {exc}") from None
        if not isinstance(d, dict):
            raise _Refused(Code.MALFORMED, "control entry is not a map")
        op = d.get("op")
        if op == "create_topic":
            return self._create_topic(d)
        if op == "delete_topic":
            return self._delete_topic(d)
        if op == "offsets":
            return self._commit_offsets(d)
        if op == "retain":
            return self._retain(d)
        if op == "grow_topic":
            return self._grow_topic(d)
        if op == "delete_group":
            return self._delete_group(d)
        raise _Refused(Code.MALFORMED, f"unknown control op {op!r}")

    def _create_topic(self, d: dict[str, Any]) -> ControlResult:
        name = _name(validate_topic_name, d.get("topic"))
        total = _int_field(d, "queues", 1, MAX_QUEUES)
        hosted = d.get("hosted")
        if not isinstance(hosted, list) or not hosted:
            raise _Refused(Code.MALFORMED, "hosted must be a non-empty list of queue ids")
        if not all(_is_int(q) and 0 <= q < total for q in hosted):
            raise _Refused(Code.MALFORMED, f"hosted queue ids must lie in 0..{total - 1}")
        ids = tuple(sorted(hosted))
        if len(set(ids)) != len(ids):
            raise _Refused(Code.MALFORMED, "hosted lists a queue twice")
        config = TopicConfig(name, total, ids)
        existing = self._topics.get(name)
        if existing is not None:
            if existing == config:
                return ControlResult("create_topic", 0)
            raise _Refused(
                Code.TOPIC_EXISTS,
                f"topic {name!r} exists with {existing.queues} queues, hosting {existing.hosted}",
            )
        self._topics[name] = config
        for q in ids:
            self._queues[(name, q)] = ConsumeQueue()
        return ControlResult("create_topic", 1)

    def _grow_topic(self, d: dict[str, Any]) -> ControlResult:
        """More queues for a topic: a larger total and a superset of the hosted queues.
        Existing queues, their messages and offsets stay as they are."""
        name = _name(validate_topic_name, d.get("topic"))
        total = _int_field(d, "queues", 1, MAX_QUEUES)
        hosted = d.get("hosted")
        if not isinstance(hosted, list) or not all(_is_int(q) and 0 <= q < total
                                                   for q in hosted):
            raise _Refused(Code.MALFORMED, f"hosted queue ids must lie in 0..{total - 1}")
        ids = tuple(sorted(set(hosted)))
        existing = self._topics.get(name)
        if existing is None:
            if not ids:
                raise _Refused(Code.MALFORMED, "a group new to a topic must host a queue")
        elif total < existing.queues or not set(existing.hosted) <= set(ids):
            raise _Refused(
                Code.MALFORMED,
                f"topic {name!r} has {existing.queues} queues, hosting {existing.hosted} "
                f"here: queues can only be added",
            )
        config = TopicConfig(name, total, ids)
        if existing == config:
            return ControlResult("grow_topic", 0)
        self._topics[name] = config
        for q in ids:
            if (name, q) not in self._queues:
                self._queues[(name, q)] = ConsumeQueue()
        return ControlResult("grow_topic", 1)

    def _delete_group(self, d: dict[str, Any]) -> ControlResult:
        cg = _name(validate_group_name, d.get("cg"))
        gone = [k for k in self._offsets if k[0] == cg]
        for k in gone:
            del self._offsets[k]
        return ControlResult("delete_group", len(gone))

    def _delete_topic(self, d: dict[str, Any]) -> ControlResult:
        name = d.get("topic")
        if not isinstance(name, str):
            raise _Refused(Code.MALFORMED, "topic must be a string")
        config = self._topics.pop(name, None)
        if config is None:
            raise _Refused(Code.UNKNOWN_TOPIC, f"topic {name!r} does not exist in this group")
        for q in config.hosted:
            del self._queues[(name, q)]
        self._keys.pop(name, None)
        # A re-created topic starts from offset 0: stale offsets and sequences must go too.
        for k in [k for k in self._offsets if k[1] == name]:
            del self._offsets[k]
        for p in [p for p in self._producers if p[1] == name]:
            del self._producers[p]
        return ControlResult("delete_topic", 1)

    def _commit_offsets(self, d: dict[str, Any]) -> ControlResult:
        cg = _name(validate_group_name, d.get("cg"))
        items = d.get("offsets")
        if not isinstance(items, list):
            raise _Refused(Code.MALFORMED, "offsets must be a list of [topic, queue, offset]")
        for it in items:  # validate everything before changing anything
            if (
                not isinstance(it, list)
                or len(it) != 3
                or not isinstance(it[0], str)
                or not _is_int(it[1])
                or not _is_int(it[2])
                or it[2] < 0
            ):
                raise _Refused(Code.MALFORMED, f"bad offset item {it!r}")
        applied = skipped = 0
        for topic, queue, offset in items:
            if (topic, queue) in self._queues:
                self._offsets[(cg, topic, queue)] = offset
                applied += 1
            else:
                skipped += 1
        return ControlResult("offsets", applied, skipped)

    def _retain(self, d: dict[str, Any]) -> ControlResult:
        min_index = _int_field(d, "min_index", 0)
        if min_index <= self._retained:
            return ControlResult("retain", 0)
        self._retained = min_index
        dropped = 0
        for cq in self._queues.values():
            dropped += cq.drop_before(cq.first_offset_at_or_after_index(min_index))
        # Key slots pointing below a queue's new minimum can never be served again.
        for topic, keys in self._keys.items():
            for key in list(keys):
                kept = [
                    p for p in keys[key]
                    if p // MAX_QUEUES >= self._queues[(topic, p % MAX_QUEUES)].min_offset
                ]
                if kept:
                    keys[key] = kept
                else:
                    del keys[key]
        # Producers silent since before the horizon are forgotten, which bounds the table;
        # a retry of a batch that old could no longer be told apart anyway.
        for p in [p for p, st in self._producers.items() if st.recent[-1][3] < min_index]:
            del self._producers[p]
        return ControlResult("retain", dropped)

    # ------------------------------------------------------------------ queries

    def topics(self) -> dict[str, TopicConfig]:
        """Topics known to this group (a copy)."""
        return dict(self._topics)

    def topic(self, name: str) -> TopicConfig | None:
        """One topic's config, without copying them all (requests ask this every time)."""
        return self._topics.get(name)

    @property
    def topic_count(self) -> int:
        return len(self._topics)

    def _queue(self, topic: str, queue: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue))
        if cq is None:
            if topic not in self._topics:
                raise _unknown_topic(topic)
            raise RequestError(
                Code.UNKNOWN_QUEUE, f"queue {queue} of topic {topic!r} is not hosted in this group"
            )
        return cq

    def queue_range(self, topic: str, queue: int) -> tuple[int, int]:
        """(min_offset, end_offset): readable offsets are min <= o < end."""
        cq = self._queue(topic, queue)
        return cq.min_offset, cq.end_offset

    def lookup(
        self,
        topic: str,
        queue: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        tag_hashes: set[int] | None = None,
    ) -> tuple[list[CQEntry], int]:
        """ConsumeQueue entries from `offset` and the offset to continue from.

        OFFSET_TOO_SMALL below the minimum, OFFSET_TOO_LARGE beyond the end, ([], end) at
        the end. With `tag_hashes` (None or empty = all tags) a bounded number of entries is
        scanned, so an empty list with next > offset means "skipped, ask again".
        """
        return self._queue(topic, queue).read(offset, max_count, max_bytes, tag_hashes)

    def entry_of(self, topic: str, queue: int, offset: int) -> CQEntry:
        """The ConsumeQueue entry of one message (OFFSET_TOO_SMALL/LARGE if none)."""
        return self._queue(topic, queue).get(offset)

    def locate(self, topic: str, queue: int, index: int, slot: int) -> int:
        """Queue offset of record `slot` of the batch at Raft `index` (message-id resolution).

        The caller reads the entry at `index` to learn its topic and queue; NOT_FOUND when
        that batch is not (or no longer) in the queue.
        """
        cq = self._queue(topic, queue)
        offset = cq.first_offset_at_or_after_index(index) + slot
        if slot >= 0 and cq.min_offset <= offset < cq.end_offset:
            if cq.get(offset).index == index:
                return offset
        raise RequestError(
            Code.NOT_FOUND, f"no message {slot} of entry {index} in {topic}/{queue}"
        )

    def keys(self, topic: str, key: str) -> list[tuple[int, int]]:
        """(queue, offset) of the newest messages with `key` in `topic`, oldest first."""
        if topic not in self._topics:
            raise _unknown_topic(topic)
        packed = self._keys.get(topic, {}).get(key, [])
        return [(p % MAX_QUEUES, p // MAX_QUEUES) for p in packed]

    def consumer_offset(self, cg: str, topic: str, queue: int) -> int | None:
        """The committed offset of consumer group `cg` on a queue, None if never committed."""
        return self._offsets.get((cg, topic, queue))

    def consumer_offsets(self, cg: str | None = None) -> dict[tuple[str, str, int], int]:
        """All committed offsets keyed (cg, topic, queue), optionally of one group only."""
        return {k: v for k, v in self._offsets.items() if cg is None or k[0] == cg}

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        """The whole state as msgpack; equal states give byte-identical snapshots.

        Everything is emitted in sorted order so the bytes do not depend on the order in
        which dicts were filled (a restored state and a straight run agree).
        """
        return self.snapshot_later()()

    def snapshot_later(self) -> Callable[[], bytes]:
        """Detach a copy of the state now and return what serialises it to `snapshot()`
        bytes later: the copy shares nothing mutable with this state (consume queues are
        copied as flat bytes, the rest as fresh lists), so the call may run in a worker
        thread while `apply` goes on."""
        state = {
            "v": SNAPSHOT_VERSION,
            "group": self.group,
            "applied": self._applied,
            "retained": self._retained,
            "counters": [self.messages_applied, self.bytes_applied],
            "topics": [[c.name, c.queues, list(c.hosted)] for _, c in sorted(self._topics.items())],
            "queues": [
                [t, q, cq.min_offset, cq.records()] for (t, q), cq in sorted(self._queues.items())
            ],
            "offsets": [[cg, t, q, o] for (cg, t, q), o in sorted(self._offsets.items())],
            "producers": [
                [pid, t, q, st.last_seq, [list(r) for r in st.recent]]
                for (pid, t, q), st in sorted(self._producers.items())
            ],
            "keys": [
                [t, k, list(keys[k])]
                for t, keys in sorted(self._keys.items())
                for k in sorted(keys)
            ],
        }
        return functools.partial(_pack, state)

    @classmethod
    def restore(
        cls, group: str, data: bytes, *, max_message_bytes: int = MAX_MESSAGE_BYTES
    ) -> BrokerState:
        """Rebuild a state from `snapshot()` bytes; ValueError if they are not one of ours."""
        try:
            d = msgpack.unpackb(data, raw=False, strict_map_key=False)
            if d["v"] != SNAPSHOT_VERSION:
                raise ValueError(f"unsupported snapshot version {d['v']!r}")
            if d["group"] != group:
                raise ValueError(f"snapshot of group {d['group']!r}, not {group!r}")
            s = cls(group, max_message_bytes=max_message_bytes)
            s._applied = int(d["applied"])
            s._retained = int(d["retained"])
            s.messages_applied, s.bytes_applied = (int(x) for x in d["counters"])
            for name, total, hosted in d["topics"]:
                s._topics[name] = TopicConfig(name, total, tuple(hosted))
            for t, q, lo, records in d["queues"]:
                s._queues[(t, q)] = ConsumeQueue(lo, records)
            for cg, t, q, o in d["offsets"]:
                s._offsets[(cg, t, q)] = o
            for pid, t, q, last, recent in d["producers"]:
                s._producers[(pid, t, q)] = _Producer(
                    last, [(seq, base, n, index) for seq, base, n, index in recent]
                )
            for t, k, packed in d["keys"]:
                s._keys.setdefault(t, {})[k] = list(packed)
        except ValueError:
            raise
        except Exception as exc:
            raise ValueError(f"not a broker snapshot: {exc}") from exc
        if sorted(s._queues) != sorted((c.name, q) for c in s._topics.values() for q in c.hosted):
            raise ValueError("snapshot queues do not match its topics")
        return s
