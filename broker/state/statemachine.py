"""The broker state machine: everything a client can observe, derived from committed entries.

Every replica of a group feeds the same committed entries, in log order, to `apply`, and
so computes the same topics, queue offsets, consumer offsets and duplicate-detection
state. A new leader therefore needs no recovery step, and a snapshot taken on one replica
restores on any other.

`apply` is pure and total: no I/O, no clocks (the store time travels inside MESSAGES
entries), no randomness, and it never raises for bad entry data. The leader validates
before proposing, but whatever reaches the log must have one deterministic outcome, which
for garbage is an `ErrorResult` and no change.

`BrokerState` is a composition of parts (`broker.state.parts`), each owning a slice of the
state, its control records, their apply handlers, its queries and its snapshot section:

- `Catalog`: topics and the queues of each hosted here (create_topic, delete_topic);
- `Queues`: the ConsumeQueues, the key index and the counters of what was stored;
- `Producers`: idempotent producers' sequences;
- `Offsets`: consumer offsets (offsets);
- `Requests`: results of client requests that may be retried (the `req` envelope);
- `Horizon`: the retention horizon (retain);
- `Leadership`: the preferred leader set through the log (prefer_leader);
- `TxParticipant`: transactions' prepared batches and offsets, fences and decisions
  (tx_offsets, tx_marker, half_end, half_checked);
- `TxCoordinator`: the Kafka-style transactions this group coordinates (tx_init, tx_add,
  tx_end, tx_complete);
- `Moves`: the internal produce path, a stored message put into another queue (move);
- `Timers`: delayed messages pending until due (deliver_due);
- `Users`: client credentials (SCRAM verifiers) in the metadata group (user_put, user_del).
- `Acls`: who may publish/subscribe/administer what, in the metadata group (acl_add,
  acl_remove).
- `Moves`: the internal produce path, a stored message into another queue (move).
- `DeadLetters`: what simple consumer groups gave up on (dead_resend, dead_purge).
- `Receipts`: simple consumer groups' per-message state: in flight, delivery counts,
  handles (receive, ack, nack, change_invisible).
- `QueueLocks`: which client of a consumer group holds each queue, a lease (lock, unlock);
  they fence the group's offset commits.

A new part (transactions, timers, retries, queue locks, users) is a `Part` subclass added
to `PARTS` (or to a subclass's `part_types`): its records join the dispatch table, it hears the broadcasts (topic created
or deleted, horizon moved) and it gets its own snapshot section, without any other part
changing.

Entries applied:

- NOOP, CONFIG: nothing (result None).
- MESSAGES: `STORED_PREFIX` (store_ms) + one or more producer batches back to back
  (`wire.records`), for any queues of the group. Each record gets the next offset of
  its (topic, queue); keyed records enter the key index. Idempotent producers (pid != 0)
  are deduplicated per (pid, topic, queue) by sequence. Each batch stands alone: one
  refused (its topic deleted meanwhile, a sequence gap) or skipped as a duplicate leaves
  the others of its entry stored, and the result is a `BatchOutcomes` when the entry
  holds several (a batch's own result when it holds one). Data that cannot be split
  into well-formed batches is refused whole and changes nothing. A batch whose header
  carries `tx` or `half` is prepared instead (`TxParticipant.prepare`): stored, not in any
  queue until its transaction commits; its result has base offset -1.
- CONTROL: a msgpack map whose "op" names a control record (see the parts: a record's
  `encode` makes it). A control entry a client may send twice (a retry after a leader
  change, whose first copy was committed after all) carries `req`: [client id, sequence];
  the second copy is answered with the first one's result and changes nothing, so a retried
  offset commit can never roll back a later one.

Snapshots (version 3) are {"v", "group", "applied", "parts": [[name, version, section]]},
one section per part in `PARTS` order; versions 1 and 2 (one flat map) still restore, and
a part missing from a snapshot starts empty. The queues section references the sealed
chunks of the ConsumeQueues instead of copying them (`broker.state.cqchunks`): they live in the
state's chunk store, which the serialiser returned by `snapshot_later` writes before it
makes the bytes, and restoring reads and checks them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeVar

import msgpack

from broker.state.consumequeue import CQEntry
from broker.state.cqchunks import ChunkRef, ChunkStore, MemoryChunkStore
from broker.state.parts.acls import Acls
from broker.state.parts.base import (
    MAX_QUEUES,
    ApplyResult,
    BatchOutcomes,
    ControlRecord,
    ControlResult,
    Detached,
    ErrorResult,
    Handler,
    Part,
    ProduceResult,
    Refused,
    TopicConfig,
    pack,
)
from broker.state.parts.catalog import Catalog, CreateTopic, DeleteTopic, GrowTopic
from broker.state.parts.deadletters import DeadLetters
from broker.state.parts.horizon import Horizon, Retain
from broker.state.parts.leadership import Leadership, PreferLeader
from broker.state.parts.moves import MoveMessage, Moves
from broker.state.parts.offsets import CommitOffsets, DeleteGroup, Offsets
from broker.state.parts.producers import DEDUP_WINDOW, Producers
from broker.state.parts.queuelocks import QueueLocks
from broker.state.parts.queues import CHUNK_RECORDS, KEY_HISTORY, Queues
from broker.state.parts.receipts import Receipts
from broker.state.parts.requests import MAX_CLIENTS, REQUEST_WINDOW, Requests
from broker.state.parts.timers import DeliverDue, TimerLimits, Timers
from broker.state.parts.txcoord import TxCoordinator
from broker.state.parts.txpart import TxParticipant
from broker.state.parts.users import Users
from raftlog.fsutil import CorruptFile
from raftlog.types import Entry, EntryType
from wire.protocol import MAX_MESSAGE_BYTES, Code, RequestError
from wire.records import (
    STORED_PREFIX,
    BatchHeader,
    RecordRef,
    WalkedBatch,
    WalkedEntry,
    walk_entry,
)

__all__ = [
    "CHUNK_RECORDS",
    "DEDUP_WINDOW",
    "KEY_HISTORY",
    "MAX_CLIENTS",
    "MAX_QUEUES",
    "PARTS",
    "REQUEST_WINDOW",
    "ApplyResult",
    "BatchOutcomes",
    "BrokerState",
    "CommitOffsets",
    "ControlResult",
    "CreateTopic",
    "DeliverDue",
    "DeleteGroup",
    "DeleteTopic",
    "ErrorResult",
    "GrowTopic",
    "ProduceResult",
    "PreferLeader",
    "MoveMessage",
    "Moves",
    "Retain",
    "TimerLimits",
    "TopicConfig",
    "chunk_refs",
    "control_create_topic",
    "control_delete_group",
    "control_delete_topic",
    "control_grow_topic",
    "control_offsets",
    "control_prefer_leader",
]

#: The parts, in the order they hear broadcasts and appear in snapshots.
PARTS: tuple[type[Part], ...] = (Catalog, Queues, Producers, Offsets, Requests, Horizon,
                                 Leadership, TxParticipant, TxCoordinator, Users, Acls, Moves,
                                 Timers, DeadLetters, Receipts, QueueLocks)
#: The test mutations the state machine itself carries out (see `broker.config`).
STATE_MUTATIONS = frozenset({"serve-prepared", "no-fencing", "forget-epochs",
                             "drop-acl-remove", "deliver-at-send", "volatile-timers",
                             "ack-later-delivery", "fifo-ignore-inflight"})
SNAPSHOT_VERSION = 3  # 3: a section per part; 2 added "clients" to 1's flat map
_MAX_ENTRY_DATA = 0xFFFFFFFF  # record starts are u32 in the ConsumeQueue


# ---------------------------------------------------------------------- control encoders
# What the consumer-offset and admin doors still call: each builds its typed record (which
# validates it: `Refused` for fields apply would refuse) and encodes it. Anything else
# proposes the record itself (`broker.runtime.leading.GroupLead.propose`); a test that
# needs an entry apply must refuse packs the map itself.


def control_create_topic(topic: str, queues: int, hosted: Iterable[int]) -> bytes:
    """CONTROL data creating `topic` with `queues` in total, `hosted` of them in this group."""
    return CreateTopic(topic, queues, tuple(sorted(hosted))).encode()


def control_delete_topic(topic: str, req: tuple[int, int] | None = None) -> bytes:
    """CONTROL data deleting `topic` with its queues, consumer offsets and key index."""
    return DeleteTopic(topic).encode(req)


def control_grow_topic(topic: str, queues: int, hosted: Iterable[int],
                       req: tuple[int, int] | None = None) -> bytes:
    """CONTROL data giving `topic` `queues` in total, `hosted` of them in this group: a
    superset of what it hosted (the topic is created here if this group had none)."""
    return GrowTopic(topic, queues, tuple(sorted(set(hosted)))).encode(req)


def control_delete_group(cg: str, req: tuple[int, int] | None = None) -> bytes:
    """CONTROL data forgetting every offset consumer group `cg` committed in this group."""
    return DeleteGroup(cg).encode(req)


def control_offsets(
    cg: str, offsets: Iterable[tuple[str, int, int]], req: tuple[int, int] | None = None,
    *, client: str | None = None, now_ms: int | None = None,
) -> bytes:
    """CONTROL data committing consumer offsets [(topic, queue, offset), ...] of group `cg`;
    `req` (client id, sequence) makes a retried commit a no-op (see the module docstring).
    With `now_ms` (the leader's clock) the commit is fenced by the queue locks: refused
    LOCK_LOST for a queue another client than `client` holds a live lease on."""
    return CommitOffsets(cg, tuple((t, q, o) for t, q, o in offsets), client,
                         now_ms).encode(req)


def control_prefer_leader(node: int) -> bytes:
    """CONTROL data making `node` the group's preferred leader (0: the configured one)."""
    return PreferLeader(node).encode()


# ---------------------------------------------------------------------- the state


P = TypeVar("P", bound=Part)


class BrokerState:
    """One group's broker state; `apply` committed entries in log order, query at will."""

    part_types: ClassVar[tuple[type[Part], ...]] = PARTS

    def __init__(self, group: str, *, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 chunk_store: ChunkStore | None = None,
                 chunk_records: int = CHUNK_RECORDS,
                 mutations: Iterable[str] = (),
                 timer_limits: TimerLimits | None = None) -> None:
        """`chunk_store` keeps the sealed ConsumeQueue chunks snapshots reference (a
        private in-memory one by default), and the spilled runs of delayed messages;
        `chunk_records` sizes the chunks (every replica of a group should use the same, or
        their snapshots differ, though each restores); `timer_limits` how much of the
        pending delayed messages stays in memory (every replica the same, or they spill
        differently).
        `mutations`: the deliberate test mutations of `STATE_MUTATIONS` to carry out
        (others are ignored: they belong to the node)."""
        if chunk_records < 1:
            raise ValueError(f"chunk_records must be at least 1, got {chunk_records}")
        self.group = group
        self.mutations = frozenset(mutations) & STATE_MUTATIONS
        self.max_message_bytes = max_message_bytes
        self.chunk_store: ChunkStore = chunk_store if chunk_store is not None else (
            MemoryChunkStore())
        self.chunk_records = chunk_records
        self.timer_limits = timer_limits
        self._applied = 0
        self.parts: tuple[Part, ...] = tuple(part(self) for part in self.part_types)
        self.catalog = self.part(Catalog)
        self.queues = self.part(Queues)
        self.producers = self.part(Producers)
        self.offsets = self.part(Offsets)
        self.requests = self.part(Requests)
        self.horizon = self.part(Horizon)
        self.txpart = self.part(TxParticipant)
        self.txcoord = self.part(TxCoordinator)
        self.moves = self.part(Moves)
        self.timers = self.part(Timers)
        self.deadletters = self.part(DeadLetters)
        self.receipts = self.part(Receipts)
        self.queuelocks = self.part(QueueLocks)
        self._dispatch: dict[str, tuple[type[ControlRecord], Handler]] = {}
        for part in self.parts:
            handlers = part.handlers()
            if {record for record, _ in handlers.values()} != set(part.records):
                raise TypeError(f"part {part.name!r} handles other records than it declares")
            for op, handler in handlers.items():
                if op in self._dispatch:
                    raise TypeError(f"control op {op!r} claimed by two parts")
                self._dispatch[op] = handler
        # the apply seam: parts that hold some batches themselves (`Part.claims_batch`)
        self._claimers = tuple(p for p in self.parts
                               if type(p).claims_batch is not Part.claims_batch)
        self._claims_plain = any(p.claims_plain for p in self._claimers)

    def part(self, kind: type[P]) -> P:
        """This state's part of type `kind` (KeyError if it has none)."""
        for p in self.parts:
            if type(p) is kind:
                return p
        raise KeyError(kind.__name__)

    # ------------------------------------------------------------------ apply

    @property
    def applied_index(self) -> int:
        """Index of the last entry applied (0 before any)."""
        return self._applied

    @property
    def retained_index(self) -> int:
        """The highest `retain` min_index applied: nothing below it is still referenced."""
        return self.horizon.retained_index

    def pinned_index(self) -> int | None:
        """The lowest Raft index still holding undecided prepared data or a delayed message
        not yet due (None: none): retention must not delete it (`broker.duties.retention` keeps its limit below)."""
        pins = [i for i in (self.txpart.pinned_index(), self.timers.pinned_index())
                if i is not None]
        return min(pins) if pins else None

    def retention_gaps(self) -> list[tuple[int, int]]:
        """The (lo, hi] ranges a retention cut must not fall in: each queue's late
        records, stored at index lo but queued after a record stored at hi
        (`ConsumeQueue.late_spans`), merged and sorted."""
        return self.queues.retention_gaps()

    @property
    def messages_applied(self) -> int:
        """Records appended to consume queues, ever."""
        return self.queues.messages_applied

    @property
    def bytes_applied(self) -> int:
        """Their record bytes."""
        return self.queues.bytes_applied

    def apply(
        self, entry: Entry, walked: WalkedBatch | WalkedEntry | None = None
    ) -> ApplyResult:
        """Apply one committed entry; never raises for bad data (the outcome is the result).

        An entry at or below `applied_index` was already applied (e.g. replayed after a
        snapshot restore) and is ignored, so replays cannot double-count. `walked` is the
        leader's walk of this very entry's batches, made before proposing it and handed
        back with it (`GroupRuntime.propose`'s context): a walk is a pure function of the
        bytes and the size limit, so it is used when the limits agree and changes nothing.
        """
        if entry.index <= self._applied:
            return None
        self._applied = entry.index
        try:
            if entry.type == EntryType.MESSAGES:
                return self._apply_messages(entry, walked)
            if entry.type == EntryType.CONTROL:
                return self._apply_control(entry.data, entry.index)
        except Refused as exc:
            return ErrorResult(exc.code, exc.message)
        return None

    def _apply_messages(
        self, entry: Entry, walked: WalkedBatch | WalkedEntry | None
    ) -> ApplyResult:
        data = entry.data
        if len(data) < STORED_PREFIX.size or len(data) > _MAX_ENTRY_DATA:
            raise Refused(Code.MALFORMED, f"messages entry of {len(data)} bytes")
        (store_ms,) = STORED_PREFIX.unpack_from(data, 0)
        batches: list[tuple[BatchHeader, list[RecordRef]]]
        if walked is not None and walked.max_message_bytes == self.max_message_bytes:
            if isinstance(walked, WalkedEntry):
                batches = walked.batches
            else:
                batches = [(walked.header, walked.refs)]
        else:
            try:
                batches = walk_entry(data, self.max_message_bytes)
            except RequestError as exc:
                raise Refused(exc.code, exc.message) from None
            except Exception as exc:  # walk_entry should only raise RequestError; stay total
                raise Refused(Code.MALFORMED, f"malformed batch: {exc}") from None
        if len(batches) == 1:
            header, refs = batches[0]
            return self._apply_batch(header, refs, entry.index, store_ms, 0)
        results: list[ProduceResult | ErrorResult] = []
        pos = STORED_PREFIX.size  # where the batch starts: the previous one's end
        for header, refs in batches:
            try:
                results.append(self._apply_batch(header, refs, entry.index, store_ms,
                                                 pos - STORED_PREFIX.size))
            except Refused as exc:  # this batch alone; the others of the entry stand
                results.append(ErrorResult(exc.code, exc.message))
            pos = refs[-1].start + refs[-1].size
        return BatchOutcomes(tuple(results))

    def _apply_batch(self, header: BatchHeader, refs: list[RecordRef], index: int,
                     store_ms: int, shift: int) -> ProduceResult:
        """Store one batch of the entry at `index`, `shift` bytes beyond the place of the
        entry's first batch (or find it a duplicate); Refused changes nothing."""
        topic, queue = header.topic, header.queue
        if not header.pid and not header.held and not self._claims_plain:
            # the common batch (no idempotence, neither prepared nor delayed) to a queue
            # of this group (so of a topic it knows): nothing to check, hold or remember
            cq = self.queues.queues.get((topic, queue))
            if cq is not None:
                return ProduceResult(self.queues.append_to(cq, topic, queue, index, refs,
                                                           store_ms), len(refs), index, False,
                                     shift)
        self.producers.validate(header)
        if self.catalog.topics.get(topic) is None:
            raise Refused(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist in this group")
        if not self.queues.hosts(topic, queue):
            raise Refused(Code.UNKNOWN_QUEUE, f"queue {queue} of {topic!r} is not hosted here")
        dup = self.producers.check_batch(header, len(refs))
        if dup is not None:
            return dup
        if header.held or self._claims_plain:
            for part in self._claimers:
                if part.claims_batch(header):
                    part.hold_batch(header, refs, index, store_ms)
                    self.producers.stored(header, -1, len(refs), index, shift)
                    return ProduceResult(-1, len(refs), index, shift=shift)
        base = self.queues.append(topic, queue, index, refs, store_ms)
        self.producers.stored(header, base, len(refs), index, shift)
        return ProduceResult(base, len(refs), index, shift=shift)

    def _apply_control(self, data: bytes | memoryview, index: int) -> ApplyResult:
        try:
            d = msgpack.unpackb(data, raw=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise Refused(Code.MALFORMED, f"undecodable control entry: {exc}") from None
        if not isinstance(d, dict):
            raise Refused(Code.MALFORMED, "control entry is not a map")
        if "req" not in d:
            return self._apply_record(d, index)
        return self.requests.deduplicate(d["req"], index, lambda: self._apply_record(d, index))

    def _apply_record(self, d: Mapping[str, Any], index: int) -> ControlResult:
        """Decode (validating) the record `d` holds and run its part's handler."""
        op = d.get("op")
        found = self._dispatch.get(op) if isinstance(op, str) else None
        if found is None:
            raise Refused(Code.MALFORMED, f"unknown control op {op!r}")
        record_type, handler = found
        return handler(record_type.from_map(d), index)

    # ------------------------------------------------------------------ broadcasts

    def broadcast_topic_created(self, config: TopicConfig) -> None:
        for part in self.parts:
            part.topic_created(config)

    def broadcast_topic_grown(self, old: TopicConfig, new: TopicConfig) -> None:
        for part in self.parts:
            part.topic_grown(old, new)

    def broadcast_topic_deleted(self, config: TopicConfig) -> None:
        for part in self.parts:
            part.topic_deleted(config)

    def broadcast_group_deleted(self, cg: str) -> None:
        for part in self.parts:
            part.group_deleted(cg)

    def broadcast_retained(self, min_index: int) -> int:
        """Every part forgets what lies below `min_index`; returns the messages dropped."""
        return sum(part.retained(min_index) for part in self.parts)

    # ------------------------------------------------------------------ queries

    def topics(self) -> dict[str, TopicConfig]:
        """Topics known to this group (a copy)."""
        return dict(self.catalog.topics)

    def topic(self, name: str) -> TopicConfig | None:
        """One topic's config, without copying them all (requests ask this every time)."""
        return self.catalog.topics.get(name)

    @property
    def topic_count(self) -> int:
        return len(self.catalog.topics)

    @property
    def preferred_leader(self) -> int | None:
        """The preferred leader set through the log (None: the node config's applies)."""
        return self.part(Leadership).preferred

    def hosts(self, topic: str, queue: int) -> bool:
        """Whether (topic, queue) is a queue of this group."""
        return self.queues.hosts(topic, queue)

    def queue_range(self, topic: str, queue: int) -> tuple[int, int]:
        """(min_offset, end_offset): readable offsets are min <= o < end."""
        cq = self.queues.queue(topic, queue)
        return cq.min_offset, cq.end_offset

    def lookup(
        self,
        topic: str,
        queue: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        tag_hashes: set[int] | None = None,
        max_scan: int | None = None,
    ) -> tuple[list[CQEntry], int]:
        """ConsumeQueue entries from `offset` and the offset to continue from.

        OFFSET_TOO_SMALL below the minimum, OFFSET_TOO_LARGE beyond the end, ([], end) at
        the end. With `tag_hashes` (None or empty = all tags) a bounded number of entries
        (`max_scan`, see `ConsumeQueue.read`) is scanned, so an empty list with
        next > offset means "skipped, ask again".
        """
        return self.queues.queue(topic, queue).read(offset, max_count, max_bytes, tag_hashes,
                                                    max_scan)

    def entry_of(self, topic: str, queue: int, offset: int) -> CQEntry:
        """The ConsumeQueue entry of one message (OFFSET_TOO_SMALL/LARGE if none)."""
        return self.queues.entry_of(topic, queue, offset)

    def locate(self, topic: str, queue: int, index: int, start: int) -> int:
        """Queue offset of the record starting at `start` in the data of the entry at Raft
        `index` (message-id resolution).

        The caller reads the entry at `index` to learn the record's batch, so its topic
        and queue; NOT_FOUND when that record is not (or no longer) in the queue.
        """
        return self.queues.locate(topic, queue, index, start)

    def keys(self, topic: str, key: str) -> list[tuple[int, int]]:
        """(queue, offset) of the newest messages with `key` in `topic`, oldest first."""
        return self.queues.keys(topic, key)

    def consumer_offset(self, cg: str, topic: str, queue: int) -> int | None:
        """The committed offset of consumer group `cg` on a queue, None if never committed."""
        return self.offsets.committed(cg, topic, queue)

    def consumer_offsets(self, cg: str | None = None) -> dict[tuple[str, str, int], int]:
        """All committed offsets keyed (cg, topic, queue), optionally of one group only."""
        return self.offsets.of_group(cg)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes:
        """The whole state as msgpack; equal states give byte-identical snapshots.

        Every section is emitted in sorted (or otherwise state-defined) order so the bytes
        do not depend on the order in which dicts were filled (a restored state and a
        straight run agree).
        """
        return self.snapshot_later()()

    def snapshot_later(self) -> _Serialiser:
        """Detach a copy of the state now and return what serialises it to `snapshot()`
        bytes later: the copy shares nothing mutable with this state (each part's section
        is made of fresh values), so the call may run in a worker thread while `apply`
        goes on. The call first writes the chunks the snapshot references to the chunk
        store, durably; call its `saved()` once the bytes are durable."""
        detached = [(p, p.detach()) for p in self.parts]
        state = {
            "v": SNAPSHOT_VERSION,
            "group": self.group,
            "applied": self._applied,
            "parts": [[p.name, p.version, d.section] for p, d in detached],
        }
        return _Serialiser(state, [d for _, d in detached])

    @classmethod
    def restore(
        cls, group: str, data: bytes, *, max_message_bytes: int = MAX_MESSAGE_BYTES,
        chunk_store: ChunkStore | None = None, chunk_records: int = CHUNK_RECORDS,
        mutations: Iterable[str] = (), timer_limits: TimerLimits | None = None,
    ) -> BrokerState:
        """Rebuild a state from `snapshot()` bytes (of this version or of 1 and 2), reading
        the chunks they reference from `chunk_store`; ValueError if they are not one of
        ours, `broker.state.cqchunks.CorruptChunk` if a chunk is missing or damaged."""
        try:
            d = msgpack.unpackb(data, raw=False, strict_map_key=False)
            version = d["v"]
            if version not in (1, 2, SNAPSHOT_VERSION):
                raise ValueError(f"unsupported snapshot version {version!r}")
            if d["group"] != group:
                raise ValueError(f"snapshot of group {d['group']!r}, not {group!r}")
            sections = _legacy_sections(d) if version in (1, 2) else d["parts"]
            s = cls(group, max_message_bytes=max_message_bytes, chunk_store=chunk_store,
                    chunk_records=chunk_records, mutations=mutations,
                    timer_limits=timer_limits)
            s._applied = int(d["applied"])
            by_name = {p.name: p for p in s.parts}
            seen: set[str] = set()
            for name, part_version, section in sections:
                part = by_name.get(name)
                if part is None or name in seen:
                    raise ValueError(f"snapshot section {name!r} is unknown or repeated")
                seen.add(name)
                part.load(part_version, section)
            for part in s.parts:
                part.check()
        except (ValueError, CorruptFile):
            raise
        except Exception as exc:
            raise ValueError(f"not a broker snapshot: {exc}") from exc
        return s


class _Serialiser:
    """`BrokerState.snapshot_later`'s result: call it (in any thread) for the bytes, after
    it has made the data they reference durable; `saved()` once they are durable too."""

    __slots__ = ("_detached", "_state")

    def __init__(self, state: dict[str, Any], detached: list[Detached]) -> None:
        self._state = state
        self._detached = detached

    def __call__(self) -> bytes:
        for d in self._detached:
            if d.write is not None:
                d.write()
        return pack(self._state)

    def saved(self) -> None:
        """A snapshot of these bytes is durable: drop what only older ones referenced."""
        for d in self._detached:
            if d.saved is not None:
                d.saved()


def chunk_refs(data: bytes) -> list[ChunkRef]:
    """The files of the chunk store `snapshot()` bytes reference (ConsumeQueue chunks and
    spilled timer runs); ValueError if they are not a snapshot."""
    try:
        d = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if d.get("v") != SNAPSHOT_VERSION:
            return []  # older snapshots copy every record
        refs: list[ChunkRef] = []
        for name, version, section in d["parts"]:
            if name == Queues.name:
                refs += Queues.chunk_refs(version, section)
            elif name == Timers.name:
                refs += Timers.chunk_refs(version, section)
    except Exception as exc:
        raise ValueError(f"not a broker snapshot: {exc}") from exc
    return refs


def _legacy_sections(d: dict[str, Any]) -> list[list[Any]]:
    """A version 1 or 2 snapshot (one flat map) as version 3's part sections."""
    return [
        [Catalog.name, 1, d["topics"]],
        [Queues.name, 1, {"counters": d["counters"], "queues": d["queues"], "keys": d["keys"]}],
        [Producers.name, 1, d["producers"]],
        [Offsets.name, 1, d["offsets"]],
        [Requests.name, 1, d.get("clients", [])],  # version 1 had no request ids
        [Horizon.name, 1, d["retained"]],
    ]
