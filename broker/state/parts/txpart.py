"""Prepared data of both transaction models, held out of the ConsumeQueues until decided.

A MESSAGES batch whose header carries `tx` (a Kafka-style transaction's batch) or `half`
(a RocketMQ half message) is stored in the CommitLog like any other, but `prepare` only
remembers where its records lie (topic, queue, Raft index, store time, record refs). A
later decision in this group, `tx_marker` (Kafka; `tx_markers` carries several) or
`half_end` (RocketMQ), either
appends ConsumeQueue records pointing at those stored refs, in prepare order (commit: no
copy of the bodies; consumers see them from then on), or forgets them (abort, rollback).
Prepared consumer offsets (`tx_offsets`, a transaction's send_offsets) are applied
through the Offsets part on commit. So a consumer reads committed data by construction,
and an aborted message never enters a ConsumeQueue.

Fencing: per transactional id, the highest epoch its coordinator told this group of
(a marker's `fence`, the coordinator's epoch for the id); prepared data of an older epoch
is refused with TX_FENCED. A fence is never raised from what a client wrote (a batch
header's or TX_OFFSETS' epoch): a client could claim any epoch and lock the id's owner
out. The broker prepares a `tx` batch only once the coordinator has this group in that
transaction, which refuses an epoch it never granted (`TxService.register`); the state
machine trusts markers only. Decisions are kept in a ring of the last `DECISIONS`
(key -> commit, source, index, messages) so retried markers and ends are answered alike
and a decision never flips. One producer group holds at most `MAX_OPEN_HALVES` undecided
half messages here, so it cannot fill the group's `MAX_OPEN` slots for everyone.

A fence is kept while the id is in use: each marker stamps it with the participant leader's
clock (`ts`), and `tx_forget_fences`, proposed by the leader's tick for the ids idle
longer than `tx_id_expiration_ms` with nothing prepared here, drops it. That is safe
because the coordinator, which expires an idle id after the same time, gives the id's next
producer an epoch above every epoch it ever granted (`TxCoordinator.floor`), and the
coordinator refuses an older epoch before anything is prepared here anyway.

Everything is validated before anything changes; bad input is refused and changes
nothing. The test mutations `serve-prepared` (prepared batches enter their queues at
prepare time; commit does not append them again) and `no-fencing` (epochs ignored) are
read from the state's `mutations`.

Snapshot section, version 2 (version 1, fences without their time, still loads)::

    {"prepared": [[key, [[topic, queue, index, store_ms, [[start, size, key, tag_hash]...]]...],
                   [[cg, topic, queue, offset]...], first_index, prepared_ms,
                   producer_group, checks, last_check_ms]...]      (sorted by key)
     "fences": [[tid, epoch, ms]...]                              (sorted)
     "decided": [[key, commit, source, index, messages]...]}      (oldest first)

where a key is ["k", tid, epoch, n] or ["h", txid].
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from broker.state.dueheap import DueHeap
from broker.state.parts.base import (
    ControlRecord,
    ControlResult,
    Handler,
    Part,
    Refused,
    TopicConfig,
    int_field,
    is_int,
    name_field,
)
from wire.protocol import Code, validate_group_name
from wire.records import BatchHeader, RecordRef, message_id, valid_tid
from wire.txn import MAX_MARKERS, TxKey, half_key, kafka_key

__all__ = [
    "DECISIONS",
    "EXPIRE_BATCH",
    "HALF_SOURCES",
    "MAX_MARKERS",
    "MAX_OPEN",
    "MAX_OPEN_HALVES",
    "MAX_TX_BYTES",
    "MAX_TX_MESSAGES",
    "Decision",
    "HalfChecked",
    "HalfEnd",
    "HalfView",
    "IdleIds",
    "KafkaView",
    "Prepared",
    "PreparedBatch",
    "TxMarker",
    "TxForgetFences",
    "TxMarkers",
    "TxOffsets",
    "TxParticipant",
]

DECISIONS = 10_000  # decisions remembered, for idempotent answers and `tx show`
MAX_TX_MESSAGES = 10_000  # messages per prepared transaction
MAX_TX_BYTES = 64 << 20  # record bytes per prepared transaction
MAX_OPEN = 100_000  # open prepared transactions per group
MAX_OPEN_HALVES = 10_000  # undecided half messages of one producer group, per group
MAX_MS = 1 << 62
HALF_SOURCES = ("client", "check", "expired", "operator")
EXPIRE_BATCH = 1_000  # ids one expiry record names


# ---------------------------------------------------------------------- field checks


def tid_field(name: str, v: object) -> str:
    if not valid_tid(v):
        raise Refused(Code.MALFORMED, f"{name} must be 1-255 printable characters, got {v!r}")
    assert isinstance(v, str)
    return v


def bool_field(name: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise Refused(Code.MALFORMED, f"{name} must be true or false, got {v!r}")
    return v


def epoch_fields(epoch: object, n: object) -> None:
    int_field("epoch", epoch, 0, (1 << 63) - 1)
    int_field("n", n, 0, (1 << 63) - 1)


# ---------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class TxOffsets(ControlRecord):
    """Consumer offsets `offsets` ((topic, queue, offset), ...) of group `cg`, prepared by
    transaction `n` of `tid` at `epoch` (send_offsets): applied on commit, dropped on
    abort. `ts`: the leader's clock when proposed."""

    op: ClassVar[str] = "tx_offsets"
    tid: str
    epoch: int
    n: int
    cg: str
    offsets: tuple[tuple[str, int, int], ...]
    ts: int

    def validate(self) -> None:
        tid_field("tid", self.tid)
        epoch_fields(self.epoch, self.n)
        name_field(validate_group_name, self.cg)
        if not isinstance(self.offsets, tuple) or not self.offsets:
            raise Refused(Code.MALFORMED, "offsets must be a non-empty list of "
                                          "[topic, queue, offset]")
        for it in self.offsets:
            if (not isinstance(it, tuple) or len(it) != 3 or not isinstance(it[0], str)
                    or not is_int(it[1]) or not is_int(it[2]) or it[1] < 0 or it[2] < 0):
                raise Refused(Code.MALFORMED, f"bad offset item {list(it)!r}")
        int_field("ts", self.ts, 0, MAX_MS)

    def to_map(self) -> dict[str, Any]:
        return {"tid": self.tid, "epoch": self.epoch, "n": self.n, "cg": self.cg,
                "offsets": [list(it) for it in self.offsets], "ts": self.ts}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> TxOffsets:
        items = d.get("offsets")
        if isinstance(items, list):
            items = tuple(tuple(it) if isinstance(it, list) else it for it in items)
        return cls(d.get("tid"), d.get("epoch"), d.get("n"), d.get("cg"),  # type: ignore[arg-type]
                   items, d.get("ts"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TxMarker(ControlRecord):
    """The coordinator's decision on transaction `n` of `tid` at `epoch`, for this group:
    `commit` or abort; `fence` is the coordinator's epoch for `tid`, which fences older
    producers here too. It is below `epoch` only when the coordinator never granted
    `epoch` (data a client prepared under an epoch it made up, aborted): the made-up
    epoch raises no fence."""

    op: ClassVar[str] = "tx_marker"
    tid: str
    epoch: int
    n: int
    commit: bool
    fence: int
    ts: int = 0  # this group's leader's clock when proposed (0: a record from before it)

    def validate(self) -> None:
        tid_field("tid", self.tid)
        epoch_fields(self.epoch, self.n)
        bool_field("commit", self.commit)
        int_field("fence", self.fence, 0, (1 << 63) - 1)
        int_field("ts", self.ts, 0, MAX_MS)

    def to_map(self) -> dict[str, Any]:
        m = {"tid": self.tid, "epoch": self.epoch, "n": self.n, "commit": self.commit,
             "fence": self.fence}
        if self.ts:
            m["ts"] = self.ts
        return m

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> TxMarker:
        epoch = d.get("epoch")
        fence = d.get("fence")
        if not is_int(epoch):  # report the epoch, not the fence bound it makes
            epoch_fields(epoch, d.get("n"))
        return cls(d.get("tid"), epoch, d.get("n"), d.get("commit"), fence,  # type: ignore[arg-type]
                   d.get("ts", 0))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TxMarkers(ControlRecord):
    """Several coordinator decisions for this group in one entry (each as `TxMarker`):
    what the coordinator's leader had ready for this group at once, so concurrent
    transactions share one entry and one request. All are valid, or none applies."""

    op: ClassVar[str] = "tx_markers"
    markers: tuple[TxMarker, ...]
    ts: int = 0  # as `TxMarker.ts`, for them all

    def validate(self) -> None:
        if not isinstance(self.markers, tuple) or not 1 <= len(self.markers) <= MAX_MARKERS:
            raise Refused(Code.MALFORMED, f"markers must list 1..{MAX_MARKERS} markers")
        for m in self.markers:
            if not isinstance(m, TxMarker):
                raise Refused(Code.MALFORMED, "markers must be [tid, epoch, n, commit, fence]")
        int_field("ts", self.ts, 0, MAX_MS)

    def to_map(self) -> dict[str, Any]:
        m: dict[str, Any] = {
            "markers": [[m.tid, m.epoch, m.n, m.commit, m.fence] for m in self.markers]}
        if self.ts:
            m["ts"] = self.ts
        return m

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> TxMarkers:
        raw = d.get("markers")
        if not isinstance(raw, list):
            raise Refused(Code.MALFORMED, "markers must be a list")
        out = []
        for item in raw:
            if not isinstance(item, list) or len(item) != 5:
                raise Refused(Code.MALFORMED, "markers must be [tid, epoch, n, commit, fence]")
            tid, epoch, n, commit, fence = item
            out.append(TxMarker.from_map({"tid": tid, "epoch": epoch, "n": n,
                                          "commit": commit, "fence": fence}))
        return cls(tuple(out), d.get("ts", 0))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class IdleIds(ControlRecord):
    """Transactional ids a leader found idle for `after_ms` at its clock `ts`: each one
    still idle that long when the record applies is forgotten (what that means is the
    part's: `TxForgetFences` here, `TxExpire` at the coordinator). The record carries the
    time and the setting, so every replica decides alike whatever its own config."""

    op: ClassVar[str] = ""
    tids: tuple[str, ...]
    ts: int
    after_ms: int

    def validate(self) -> None:
        if not isinstance(self.tids, tuple) or not 1 <= len(self.tids) <= EXPIRE_BATCH:
            raise Refused(Code.MALFORMED, f"tids must list 1..{EXPIRE_BATCH} transactional ids")
        for tid in self.tids:
            tid_field("tid", tid)
        int_field("ts", self.ts, 0, MAX_MS)
        int_field("after_ms", self.after_ms, 1, MAX_MS)

    def to_map(self) -> dict[str, Any]:
        return {"tids": list(self.tids), "ts": self.ts, "after_ms": self.after_ms}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> IdleIds:
        tids = d.get("tids")
        if isinstance(tids, list):
            tids = tuple(tids)
        return cls(tids, d.get("ts"), d.get("after_ms"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TxForgetFences(IdleIds):
    """This group's fences of ids idle that long, with nothing prepared here, go."""

    op: ClassVar[str] = "tx_forget_fences"


@dataclass(frozen=True, slots=True)
class HalfEnd(ControlRecord):
    """The decision on half message `txid`: `commit` or roll back. `source` says who
    decided ("client", "check", "expired", "operator"); `producer_group` must be the
    half's own ("" only for "expired" and "operator", which skip that check)."""

    op: ClassVar[str] = "half_end"
    txid: str
    commit: bool
    source: str
    producer_group: str

    def validate(self) -> None:
        tid_field("txid", self.txid)
        bool_field("commit", self.commit)
        if self.source not in HALF_SOURCES:
            raise Refused(Code.MALFORMED, f"source must be one of {', '.join(HALF_SOURCES)}, "
                                          f"got {self.source!r}")
        if self.producer_group == "" and self.source in ("expired", "operator"):
            return
        name_field(validate_group_name, self.producer_group)

    def to_map(self) -> dict[str, Any]:
        return {"txid": self.txid, "commit": self.commit, "source": self.source,
                "producer_group": self.producer_group}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> HalfEnd:
        return cls(d.get("txid"), d.get("commit"), d.get("source"),  # type: ignore[arg-type]
                   d.get("producer_group"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class HalfChecked(ControlRecord):
    """One more check-back of half message `txid` was made at `ts` (the leader's clock),
    logged before it is sent so the count survives a failover."""

    op: ClassVar[str] = "half_checked"
    txid: str
    ts: int

    def validate(self) -> None:
        tid_field("txid", self.txid)
        int_field("ts", self.ts, 0, MAX_MS)

    def to_map(self) -> dict[str, Any]:
        return {"txid": self.txid, "ts": self.ts}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> HalfChecked:
        return cls(d.get("txid"), d.get("ts"))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """One stored batch of a prepared transaction: where its records lie."""

    topic: str
    queue: int
    index: int  # Raft index of the MESSAGES entry holding it
    store_ms: int
    refs: tuple[RecordRef, ...]
    due_ms: int = 0  # a delayed batch: when its messages enter the queue once committed


@dataclass(slots=True)
class Prepared:
    """An undecided transaction's data in this group (Kafka, or one half message)."""

    first_index: int  # Raft index of its first batch or offsets record
    prepared_ms: int  # store time of its first batch, or ts of its first offsets record
    producer_group: str = ""  # halves only
    batches: list[PreparedBatch] = field(default_factory=list)
    offsets: list[tuple[str, str, int, int]] = field(default_factory=list)  # cg, t, q, o
    checks: int = 0  # halves: check-backs made
    last_check_ms: int = 0
    messages: int = 0
    bytes: int = 0

    def pinned(self) -> int | None:
        """The lowest Raft index whose data it references (None: no batch)."""
        return min((b.index for b in self.batches), default=None)


@dataclass(frozen=True, slots=True)
class Decision:
    """What became of a transaction in this group."""

    commit: bool
    source: str  # "marker" for Kafka; the half_end source for halves
    index: int  # Raft index of the deciding entry
    messages: int  # messages it made visible (0 on abort)


@dataclass(frozen=True, slots=True)
class HalfView:
    """A pending half message, for check-back and `tx list`."""

    txid: str
    producer_group: str
    topic: str
    queue: int
    index: int
    prepared_ms: int
    checks: int
    last_check_ms: int
    messages: int
    msg_id: str  # the id of its first message
    start: int = 0  # where its first record lies in the data of entry `index`


@dataclass(frozen=True, slots=True)
class KafkaView:
    """An undecided Kafka-style transaction's data held here, for `tx list`: what an
    operator needs to see what pins this group's log."""

    tid: str
    epoch: int
    n: int
    prepared_ms: int
    first_index: int  # the lowest Raft index it holds (retention waits for it)
    messages: int
    offsets: int  # prepared consumer offsets
    queues: tuple[str, ...]  # "topic/queue" it prepared batches on, sorted


def _batch_bytes(refs: tuple[RecordRef, ...] | list[RecordRef]) -> int:
    return refs[-1].start + refs[-1].size - refs[0].start


class TxParticipant(Part):
    """Prepared batches and offsets, fences and decisions of this group's transactions."""

    name = "txpart"
    version = 2  # 2 added each fence's time: a version 1 reader must refuse it
    records = (TxOffsets, TxMarker, TxMarkers, HalfEnd, HalfChecked, TxForgetFences)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        mutations: frozenset[str] = getattr(state, "mutations", frozenset())
        self.serve_prepared = "serve-prepared" in mutations
        self.no_fencing = "no-fencing" in mutations
        self.prepared: dict[TxKey, Prepared] = {}
        self.fences: dict[str, int] = {}
        # tid -> the leader's clock at its last marker here (0: unknown, never forgotten)
        self.fence_ms: dict[str, int] = {}
        self.decided: OrderedDict[TxKey, Decision] = OrderedDict()
        # (cg, topic, queue) -> undecided prepared offsets on it (`pending_offsets`)
        self._offset_pins: dict[tuple[str, str, int], int] = {}
        # producer group -> its undecided half messages here (`MAX_OPEN_HALVES`): derived
        # from `prepared`, never snapshotted
        self._halves_of: dict[str, int] = {}
        # what a leader's tick asks for (`kafka_due`, `halves_due`), by due time; derived
        # from `prepared`, never snapshotted: Kafka transactions by prepared_ms, halves
        # not checked yet by prepared_ms, checked ones by last_check_ms
        self._kafka_due: DueHeap[TxKey] = DueHeap(self._kafka_time)
        self._unchecked_due: DueHeap[TxKey] = DueHeap(self._unchecked_time)
        self._checked_due: DueHeap[TxKey] = DueHeap(self._checked_time)
        # tid -> its undecided Kafka transactions here; fences by the time they went idle
        # (`idle_fences`): both derived, never snapshotted
        self._open_of: dict[str, int] = {}
        self._idle_fences: DueHeap[str] = DueHeap(self._fence_time)

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {TxOffsets.op: (TxOffsets, self._offsets),
                TxMarker.op: (TxMarker, self._marker),
                TxMarkers.op: (TxMarkers, self._markers),
                HalfEnd.op: (HalfEnd, self._half_end),
                HalfChecked.op: (HalfChecked, self._half_checked),
                TxForgetFences.op: (TxForgetFences, self._forget_fences)}

    # ------------------------------------------------------------------ apply

    def _check_fence(self, tid: str, epoch: int) -> None:
        fence = self.fences.get(tid, -1)
        if epoch < fence and not self.no_fencing:
            raise Refused(Code.TX_FENCED, f"transactional id {tid!r} epoch {epoch} is fenced "
                                          f"by epoch {fence}: a newer producer holds it")

    def _check_undecided(self, key: TxKey) -> None:
        if key in self.decided:
            raise Refused(Code.TX_DECIDED, "transaction already committed or aborted")

    def _check_room(self, key: TxKey, messages: int, nbytes: int) -> Prepared | None:
        p = self.prepared.get(key)
        if p is None and len(self.prepared) >= MAX_OPEN:
            raise Refused(Code.TX_LIMIT, f"{MAX_OPEN} prepared transactions are open in this "
                                         f"group already")
        have_m, have_b = (p.messages, p.bytes) if p is not None else (0, 0)
        if have_m + messages > MAX_TX_MESSAGES:
            raise Refused(Code.TX_LIMIT, f"a transaction holds at most {MAX_TX_MESSAGES} "
                                         f"messages per group")
        if have_b + nbytes > MAX_TX_BYTES:
            raise Refused(Code.TX_LIMIT, f"a transaction holds at most {MAX_TX_BYTES} bytes "
                                         f"per group")
        return p

    def claims_batch(self, header: BatchHeader) -> bool:
        """A transaction's batch: prepared here until its transaction is decided."""
        return header.tx is not None or header.half is not None

    def hold_batch(self, header: BatchHeader, refs: list[RecordRef], index: int,
                   store_ms: int) -> None:
        """Prepare the batch of the entry at `index` (whose topic and queue exist here and
        which is no duplicate) for its transaction; Refused changes nothing."""
        pg = ""
        if header.tx is not None:
            tid, epoch, n = header.tx
            key = kafka_key(tid, epoch, n)
            self._check_fence(tid, epoch)
        elif header.half is not None:
            txid, pg = header.half
            key = half_key(txid)
        else:
            raise Refused(Code.MALFORMED, "not a prepared batch")
        self._check_undecided(key)
        nbytes = _batch_bytes(refs)
        p = self._check_room(key, len(refs), nbytes)
        if p is not None and header.half is not None and p.producer_group != pg:
            raise Refused(Code.FORBIDDEN, f"half message {key[1]!r} belongs to producer group "
                                          f"{p.producer_group!r}")
        if p is None and header.half is not None and (
                self._halves_of.get(pg, 0) >= MAX_OPEN_HALVES):
            # one producer group that never decides its halves must not fill the group's
            # MAX_OPEN slots for every other producer
            raise Refused(Code.TX_LIMIT, f"producer group {pg!r} has {MAX_OPEN_HALVES} "
                                         f"undecided half messages in this group already")
        # valid: change things (a header's epoch raises no fence: only markers do)
        if p is None:
            p = self.prepared[key] = Prepared(index, store_ms, pg)
            self._track(key, p)
            self._opened(key)
            if header.half is not None:
                self._halves_of[pg] = self._halves_of.get(pg, 0) + 1
        p.batches.append(PreparedBatch(header.topic, header.queue, index, store_ms,
                                       tuple(refs),
                                       header.due_ms(store_ms) if header.delayed else 0))
        p.messages += len(refs)
        p.bytes += nbytes
        if self.serve_prepared:  # test mutation: consumers see it before any decision
            self.state.queues.append(header.topic, header.queue, index, refs, store_ms)

    def _offsets(self, rec: TxOffsets, index: int) -> ControlResult:
        key = kafka_key(rec.tid, rec.epoch, rec.n)
        self._check_fence(rec.tid, rec.epoch)
        self._check_undecided(key)
        for topic, queue, _offset in rec.offsets:
            if self.state.topic(topic) is None:
                raise Refused(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist in this group")
            if not self.state.hosts(topic, queue):
                raise Refused(Code.UNKNOWN_QUEUE,
                              f"queue {queue} of {topic!r} is not hosted here")
        p = self._check_room(key, 0, 0)
        if len(rec.offsets) + (len(p.offsets) if p is not None else 0) > MAX_TX_MESSAGES:
            raise Refused(Code.TX_LIMIT, f"a transaction holds at most {MAX_TX_MESSAGES} "
                                         f"offsets per group")
        # valid: change things (the client's epoch raises no fence: only markers do)
        if p is None:
            p = self.prepared[key] = Prepared(index, rec.ts)
            self._track(key, p)
            self._opened(key)
        for topic, queue, offset in rec.offsets:
            p.offsets.append((rec.cg, topic, queue, offset))
            pin = (rec.cg, topic, queue)
            self._offset_pins[pin] = self._offset_pins.get(pin, 0) + 1
        return ControlResult(TxOffsets.op, len(rec.offsets))

    def _marker(self, rec: TxMarker, index: int) -> ControlResult:
        key = kafka_key(rec.tid, rec.epoch, rec.n)
        if key in self.decided:  # a retried marker: the decision stands, nothing changes
            return ControlResult(TxMarker.op, dup=True)
        self.fences[rec.tid] = max(self.fences.get(rec.tid, -1), rec.fence)
        if rec.ts > self.fence_ms.get(rec.tid, 0):
            self.fence_ms[rec.tid] = rec.ts
        p = self.prepared.get(key)
        if p is None:  # nothing prepared here (yet): a late batch of it is refused
            self._decide(key, Decision(rec.commit, "marker", index, 0))
            self._track_fence(rec.tid)
            return ControlResult(TxMarker.op, dup=True)
        # deciding it (`_end`) tracks the fence once nothing of the id is left open
        applied, skipped = self._end(key, p, rec.commit, "marker", index)
        return ControlResult(TxMarker.op, applied, skipped)

    def apply_marker(self, rec: TxMarker, index: int) -> ControlResult:
        """A decision of this group's own coordinator, applied here within its `tx_end`
        entry (`TxCoordinator`): exactly what the `tx_marker` record would do."""
        return self._marker(rec, index)

    def _markers(self, rec: TxMarkers, index: int) -> ControlResult:
        applied = skipped = 0
        dup = True
        for m in rec.markers:  # a marker never refuses once valid: all apply, in order
            r = self._marker(replace(m, ts=rec.ts) if rec.ts else m, index)
            applied, skipped, dup = applied + r.applied, skipped + r.skipped, dup and r.dup
        return ControlResult(TxMarkers.op, applied, skipped, dup)

    def _half_end(self, rec: HalfEnd, index: int) -> ControlResult:
        key = half_key(rec.txid)
        d = self.decided.get(key)
        if d is not None:
            if d.commit == rec.commit:
                return ControlResult(HalfEnd.op, dup=True)
            raise Refused(Code.TX_DECIDED, f"half message {rec.txid!r} was already "
                                           f"{'committed' if d.commit else 'rolled back'}")
        p = self.prepared.get(key)
        if p is None:
            raise Refused(Code.TX_UNKNOWN, f"no half message {rec.txid!r} is pending here")
        if rec.producer_group != p.producer_group and not (
                rec.producer_group == "" and rec.source in ("expired", "operator")):
            raise Refused(Code.FORBIDDEN, f"half message {rec.txid!r} belongs to producer "
                                          f"group {p.producer_group!r}, not "
                                          f"{rec.producer_group!r}")
        applied, skipped = self._end(key, p, rec.commit, rec.source, index)
        return ControlResult(HalfEnd.op, applied, skipped)

    def _half_checked(self, rec: HalfChecked, index: int) -> ControlResult:
        p = self.prepared.get(half_key(rec.txid))
        if p is None:  # decided meanwhile, or unknown: nothing to count
            return ControlResult(HalfChecked.op, dup=True)
        p.checks += 1
        p.last_check_ms = rec.ts
        self._checked_due.push(p.last_check_ms, half_key(rec.txid))
        return ControlResult(HalfChecked.op, 1)

    def _forget_fences(self, rec: TxForgetFences, index: int) -> ControlResult:
        gone = 0
        for tid in rec.tids:
            at = self._fence_time(tid)
            if at is not None and at + rec.after_ms <= rec.ts:
                del self.fences[tid], self.fence_ms[tid]
                gone += 1
        return ControlResult(TxForgetFences.op, gone, dup=not gone)

    def _end(self, key: TxKey, p: Prepared, commit: bool, source: str,
             index: int) -> tuple[int, int]:
        """Decide prepared `p`: commit makes its batches visible in prepare order and
        applies its offsets; returns (messages appended, messages skipped)."""
        self._forget(key, p)
        applied = skipped = 0
        if commit:
            queues = self.state.queues
            for b in p.batches:
                if self.serve_prepared:  # already in the queue since prepare
                    applied += len(b.refs)
                elif (queues.hosts(b.topic, b.queue) and b.due_ms
                      and not self.state.timers.deliver_at_send):  # delayed: pending
                    self.state.timers.hold(b.topic, b.queue, list(b.refs), b.index,
                                           b.store_ms, b.due_ms)
                    applied += len(b.refs)
                elif queues.hosts(b.topic, b.queue):
                    queues.append(b.topic, b.queue, b.index, b.refs, b.store_ms)
                    applied += len(b.refs)
                else:  # its topic was deleted meanwhile
                    skipped += len(b.refs)
            by_group: dict[str, list[tuple[str, int, int]]] = {}
            for cg, topic, queue, offset in p.offsets:
                by_group.setdefault(cg, []).append((topic, queue, offset))
            for cg, items in by_group.items():
                self.state.offsets.put(cg, items)
        self._decide(key, Decision(commit, source, index, applied))
        return applied, skipped

    def _decide(self, key: TxKey, d: Decision) -> None:
        self.decided[key] = d
        while len(self.decided) > DECISIONS:
            self.decided.popitem(last=False)

    def _forget(self, key: TxKey, p: Prepared, *, unpin: bool = True) -> None:
        """`key` (prepared `p`) is no longer undecided here."""
        del self.prepared[key]
        if unpin:
            self._unpin(p)
        if key[0] == "k":
            tid = key[1]
            left = self._open_of[tid] - 1
            if left:
                self._open_of[tid] = left
            else:
                del self._open_of[tid]
                self._track_fence(tid)  # idle from its last marker
        if key[0] == "h":
            left = self._halves_of[p.producer_group] - 1
            if left:
                self._halves_of[p.producer_group] = left
            else:
                del self._halves_of[p.producer_group]

    def _unpin(self, p: Prepared) -> None:
        for cg, topic, queue, _o in p.offsets:
            pin = (cg, topic, queue)
            left = self._offset_pins[pin] - 1
            if left:
                self._offset_pins[pin] = left
            else:
                del self._offset_pins[pin]

    # ------------------------------------------------------------------ hooks

    def topic_deleted(self, config: TopicConfig) -> None:
        for key, p in list(self.prepared.items()):
            if not any(b.topic == config.name for b in p.batches) and not any(
                    o[1] == config.name for o in p.offsets):
                continue
            self._unpin(p)
            p.batches = [b for b in p.batches if b.topic != config.name]
            p.offsets = [o for o in p.offsets if o[1] != config.name]
            if not p.batches and not p.offsets:
                self._forget(key, p, unpin=False)  # unpinned above
                continue
            for cg, topic, queue, _o in p.offsets:
                pin = (cg, topic, queue)
                self._offset_pins[pin] = self._offset_pins.get(pin, 0) + 1
            p.messages = sum(len(b.refs) for b in p.batches)
            p.bytes = sum(_batch_bytes(b.refs) for b in p.batches)

    # retained(): prepared data is pinned (`pinned_index`), retention never goes past it

    # ------------------------------------------------------------------ due times

    def _track(self, key: TxKey, p: Prepared) -> None:
        """Put a prepared transaction where a tick finds it once it is due."""
        if key[0] == "k":
            self._kafka_due.push(p.prepared_ms, key)
        elif p.checks == 0:
            self._unchecked_due.push(p.prepared_ms, key)
        else:
            self._checked_due.push(p.last_check_ms, key)

    def _opened(self, key: TxKey) -> None:
        """A new undecided transaction `key` is held here."""
        if key[0] == "k":
            self._open_of[key[1]] = self._open_of.get(key[1], 0) + 1

    def _fence_time(self, tid: str) -> int | None:
        """Since when `tid`'s fence here is idle: its last marker's time, if known and
        nothing of `tid` is prepared here (None: not to be forgotten)."""
        at = self.fence_ms.get(tid, 0)
        return at if at and tid in self.fences and tid not in self._open_of else None

    def _track_fence(self, tid: str) -> None:
        """Put `tid`'s fence where a tick finds it once it has been idle long enough."""
        if (at := self._fence_time(tid)) is not None:
            self._idle_fences.push(at, tid)

    def _kafka_time(self, key: TxKey) -> int | None:
        p = self.prepared.get(key)
        return None if p is None else p.prepared_ms

    def _unchecked_time(self, key: TxKey) -> int | None:
        p = self.prepared.get(key)
        return None if p is None or p.checks else p.prepared_ms

    def _checked_time(self, key: TxKey) -> int | None:
        p = self.prepared.get(key)
        return None if p is None or not p.checks else p.last_check_ms

    # ------------------------------------------------------------------ queries

    def pending_halves(self) -> list[HalfView]:
        """Every undecided half message, by txid."""
        return [v for key in sorted(k for k in self.prepared if k[0] == "h")
                if (v := self.half(key[1])) is not None]

    def halves_due(self, now: int, first_ms: int, interval_ms: int) -> list[HalfView]:
        """The undecided half messages whose check-back is due at `now`, by txid: the
        first `first_ms` after it was prepared, then every `interval_ms` after the last.
        Costs O(due log n): a leader asks on every tick."""
        keys = sorted(self._unchecked_due.due(now - first_ms)
                      + self._checked_due.due(now - interval_ms))
        return [v for key in keys if (v := self.half(key[1])) is not None]

    def half(self, txid: str) -> HalfView | None:
        """The pending half message `txid` (None: decided, unknown, or its topic gone)."""
        p = self.prepared.get(half_key(txid))
        if p is None or not p.batches:
            return None
        b = p.batches[0]
        return HalfView(txid, p.producer_group, b.topic, b.queue, b.index, p.prepared_ms,
                        p.checks, p.last_check_ms, p.messages,
                        message_id(self.state.group, b.index, b.refs[0].start),
                        b.refs[0].start)

    def decision(self, key: TxKey) -> Decision | None:
        """How the transaction `key` was decided here, if it still is in the ring."""
        return self.decided.get(key)

    def pending_kafka(self) -> list[tuple[str, int, int, int, int]]:
        """(tid, epoch, n, prepared_ms, first_index) of every undecided Kafka transaction."""
        out = []
        for key in sorted(k for k in self.prepared if k[0] == "k"):
            p = self.prepared[key]
            _k, tid, epoch, n = key  # type: ignore[misc]
            out.append((tid, epoch, n, p.prepared_ms, p.first_index))
        return out

    def prepared_kafka(self, tid: str = "") -> list[KafkaView]:
        """Every undecided Kafka transaction's data here (only `tid`'s, when given), by
        key."""
        out = []
        for key in sorted(k for k in self.prepared if k[0] == "k" and (not tid or k[1] == tid)):
            p = self.prepared[key]
            _k, t, epoch, n = key  # type: ignore[misc]
            queues = tuple(sorted({f"{b.topic}/{b.queue}" for b in p.batches}))
            out.append(KafkaView(t, epoch, n, p.prepared_ms, p.first_index, p.messages,
                                 len(p.offsets), queues))
        return out

    def kafka_due(self, prepared_before: int) -> list[tuple[str, int, int, int, int]]:
        """`pending_kafka` of the transactions prepared before `prepared_before` (ms)
        only, in the same order; O(due log n), for a leader's every tick."""
        out = []
        for key in self._kafka_due.due(prepared_before - 1):
            p = self.prepared[key]
            _k, tid, epoch, n = key  # type: ignore[misc]
            out.append((tid, epoch, n, p.prepared_ms, p.first_index))
        return out

    def pending_offsets(self, cg: str, topic: str, queue: int) -> bool:
        """Whether an undecided transaction holds offsets of `cg` on that queue."""
        return (cg, topic, queue) in self._offset_pins

    def fence(self, tid: str) -> int:
        """The highest epoch seen for `tid` here (-1: none)."""
        return self.fences.get(tid, -1)

    def idle_fences(self, until: int, limit: int = EXPIRE_BATCH) -> list[str]:
        """Up to `limit` ids whose fence is idle since `until` (ms) or before, by tid;
        O(due log n), for a leader's every tick."""
        return self._idle_fences.due(until, limit)

    def pinned_index(self) -> int | None:
        """The lowest Raft index any undecided prepared batch lies at (None: none)."""
        return min((i for p in self.prepared.values() if (i := p.pinned()) is not None),
                   default=None)

    # ------------------------------------------------------------------ snapshot

    def section(self) -> Any:
        prepared = []
        for key in sorted(self.prepared):
            p = self.prepared[key]
            prepared.append([
                list(key),
                [[b.topic, b.queue, b.index, b.store_ms, [list(r) for r in b.refs]]
                 + ([b.due_ms] if b.due_ms else []) for b in p.batches],
                [list(o) for o in p.offsets],
                p.first_index, p.prepared_ms, p.producer_group, p.checks, p.last_check_ms,
            ])
        return {
            "prepared": prepared,
            "fences": [[t, e, self.fence_ms.get(t, 0)] for t, e in sorted(self.fences.items())],
            "decided": [[list(k), d.commit, d.source, d.index, d.messages]
                        for k, d in self.decided.items()],
        }

    def load(self, version: int, section: Any) -> None:
        if version not in (1, 2):
            raise ValueError(f"unsupported txpart section version {version!r}")
        for key, batches, offsets, first, pms, pg, checks, last in section["prepared"]:
            k = _key(key)
            p = Prepared(int(first), int(pms), str(pg), checks=int(checks),
                         last_check_ms=int(last))
            for t, q, index, sms, refs, *due in batches:
                rr = tuple(RecordRef(int(s), int(z), str(kk), int(h)) for s, z, kk, h in refs)
                if not rr:
                    raise ValueError("a prepared batch without records")
                p.batches.append(PreparedBatch(str(t), int(q), int(index), int(sms), rr,
                                               int(due[0]) if due else 0))
                p.messages += len(rr)
                p.bytes += _batch_bytes(rr)
            for cg, t, q, o in offsets:
                p.offsets.append((str(cg), str(t), int(q), int(o)))
                pin = (str(cg), str(t), int(q))
                self._offset_pins[pin] = self._offset_pins.get(pin, 0) + 1
            if k in self.prepared:
                raise ValueError(f"prepared transaction {key!r} twice")
            self.prepared[k] = p
            self._opened(k)
            if k[0] == "h":
                self._halves_of[p.producer_group] = self._halves_of.get(p.producer_group, 0) + 1
        kafka = [(p.prepared_ms, k) for k, p in self.prepared.items() if k[0] == "k"]
        self._kafka_due.rebuild(kafka)
        self._unchecked_due.rebuild((p.prepared_ms, k) for k, p in self.prepared.items()
                                    if k[0] == "h" and not p.checks)
        self._checked_due.rebuild((p.last_check_ms, k) for k, p in self.prepared.items()
                                  if k[0] == "h" and p.checks)
        for row in section["fences"]:
            tid, epoch, ms = row if version > 1 else (*row, 0)
            self.fences[str(tid)] = int(epoch)
            if ms:
                self.fence_ms[str(tid)] = int(ms)
        self._idle_fences.rebuild((at, tid) for tid in self.fences
                                  if (at := self._fence_time(tid)) is not None)
        for key, commit, source, index, messages in section["decided"]:
            if not isinstance(commit, bool):
                raise ValueError(f"bad decision {key!r}")
            self.decided[_key(key)] = Decision(commit, str(source), int(index), int(messages))

    def check(self) -> None:
        for key, p in self.prepared.items():
            if key in self.decided:
                raise ValueError(f"transaction {key!r} both prepared and decided")
            for b in p.batches:
                if not self.state.hosts(b.topic, b.queue):
                    raise ValueError(f"prepared batch of {b.topic!r}/{b.queue} not hosted")


def _key(v: Any) -> TxKey:
    """A key from its snapshot form."""
    if isinstance(v, list) and len(v) == 2 and v[0] == "h" and isinstance(v[1], str):
        return ("h", v[1])
    if (isinstance(v, list) and len(v) == 4 and v[0] == "k" and isinstance(v[1], str)
            and is_int(v[2]) and is_int(v[3])):
        return ("k", v[1], v[2], v[3])
    raise ValueError(f"bad transaction key {v!r}")
