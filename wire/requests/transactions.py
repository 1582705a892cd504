"""Transactions, both models: Kafka's (TX_INIT, TX_ADD, TX_OFFSETS, TX_END, TX_STATUS,
and TX_MARKER, the coordinator's decision sent node to node) and RocketMQ's (HALF_END,
PRODUCER_HEARTBEAT, and TX_CHECK, the node's question on a producer's connection), and
TX_LIST, what the groups a node leads hold of either.

Kafka's model names a transaction by its transactional id (`tid`), the epoch that fences
older producers of it and its number `n` within the epoch; RocketMQ's names a half
message by its `txid` and its producer group `pg`. What depends on the cluster (is a
group one of its groups, does it coordinate that id, is a timeout under its maximum) is
the node's to say after decoding; the types check what a header alone can be wrong in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from wire.protocol import (
    Code,
    Op,
    RequestError,
    header_field,
    is_int,
    validate_client_id,
    validate_group_name,
    validate_topic_name,
)
from wire.records import valid_tid
from wire.requests.base import Check, WireType, spec, str_list
from wire.requests.offsets import is_offset_item
from wire.txn import MAX_MARKERS

__all__ = [
    "CHECK_ANSWERS",
    "DEFAULT_LIST_LIMIT",
    "HALF_END_SOURCES",
    "MAX_LIST_LIMIT",
    "Marker",
    "HalfEndAnswer",
    "HalfEndRequest",
    "ProducerHeartbeatAnswer",
    "ProducerHeartbeatRequest",
    "TxAddAnswer",
    "TxAddRequest",
    "TxCheckAnswer",
    "TxCheckRequest",
    "TxEndAnswer",
    "TxEndRequest",
    "TxInitAnswer",
    "TxInitRequest",
    "TxListAnswer",
    "TxListRequest",
    "TxMarkerAnswer",
    "TxMarkerRequest",
    "TxOffsetsAnswer",
    "TxOffsetsRequest",
    "TxStatusAnswer",
    "TxStatusRequest",
    "check_count",
    "check_tid",
]

#: What a HALF_END request may say it comes from: the producer, or an operator deciding
#: a half message no producer did (`raftmq tx commit|rollback`).
HALF_END_SOURCES = ("client", "operator")
#: A producer's answers to TX_CHECK.
CHECK_ANSWERS = ("commit", "rollback", "unknown")
DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 10_000

#: One decision in a TX_MARKER request's `markers`: (tid, epoch, n, commit, fence).
Marker = tuple[str, int, int, bool, int]


# ---------------------------------------------------------------------- field rules


def check_count(name: str) -> Check:
    """An epoch, a transaction number or a fence: an integer in 0..2**63-1."""
    def check(v: int) -> int:
        if not 0 <= v < 1 << 63:
            raise RequestError(Code.MALFORMED, f"field {name!r} must be an integer >= 0, "
                               f"got {v}")
        return v
    return check


def check_tid(name: str) -> Check:
    """A transactional id or a half message's txid (`wire.records.valid_tid`)."""
    def check(v: str) -> str:
        if not valid_tid(v):
            raise RequestError(Code.MALFORMED, f"field {name!r}: bad id {v!r}: 1-255 "
                               "printable characters, no leading or trailing space")
        return v
    return check


def _group_ids(*, at_least_one: bool) -> Check:
    """Group ids, each a valid group name (whether the cluster has them is the node's
    to say: UNKNOWN_GROUP)."""
    def check(v: list[Any]) -> tuple[str, ...]:
        if at_least_one and not v:
            raise RequestError(Code.MALFORMED, "groups must name at least one group")
        for gid in v:
            if not isinstance(gid, str):
                raise RequestError(Code.MALFORMED, f"group ids must be strings, got {gid!r}")
            validate_group_name(gid)
        return tuple(v)
    return check


def _offset_items(v: list[Any]) -> tuple[tuple[str, int, int], ...]:
    if not v:
        raise RequestError(Code.MALFORMED, "offsets must list at least one offset")
    out = []
    for item in v:
        if not is_offset_item(item):
            raise RequestError(Code.MALFORMED, "offsets must be [[topic, queue, offset>=0], ...]")
        out.append((validate_topic_name(item[0]), item[1], item[2]))
    return tuple(out)


_MARKER_FIELDS = ("tid", "epoch", "n", "commit", "fence")
_SINGLE_MARKER = {"tid": check_tid("tid"), "epoch": check_count("epoch"),
                  "n": check_count("n"), "commit": None, "fence": check_count("fence")}
_MARKER_KINDS = {"tid": str, "epoch": int, "n": int, "commit": bool, "fence": int}


def _marker(m: Mapping[str, Any]) -> Marker:
    """One decision, from the fields of the single form or a `markers` row."""
    out = []
    for name in _MARKER_FIELDS:
        v = header_field(m, name, _MARKER_KINDS[name])
        check = _SINGLE_MARKER[name]
        out.append(check(v) if check is not None else v)
    tid, epoch, n, commit, fence = out
    return tid, epoch, n, commit, fence


def _markers(v: list[Any]) -> tuple[Marker, ...]:
    if not 1 <= len(v) <= MAX_MARKERS:
        raise RequestError(Code.MALFORMED, f"markers must list 1..{MAX_MARKERS} markers")
    out = []
    for item in v:
        if not isinstance(item, list) or len(item) != 5:
            raise RequestError(Code.MALFORMED, "markers must be [[tid, epoch, n, commit, "
                               "fence], ...]")
        out.append(_marker(dict(zip(_MARKER_FIELDS, item, strict=True))))
    return tuple(out)


def _choice(name: str, choices: tuple[str, ...]) -> Check:
    def check(v: str) -> str:
        if v not in choices:
            raise RequestError(Code.MALFORMED, f"{name} must be one of {', '.join(choices)}, "
                               f"not {v!r}")
        return v
    return check


def _at_least_one_ms(v: int) -> int:
    if v < 1:
        raise RequestError(Code.MALFORMED, f"timeout_ms must be >= 1, got {v}")
    return v


def _limit(v: int) -> int:
    if not 1 <= v <= MAX_LIST_LIMIT:
        raise RequestError(Code.MALFORMED, f"limit must be 1..{MAX_LIST_LIMIT}")
    return v


def _rows(name: str) -> Check:
    """A list of maps (a TX_LIST answer's rows, which carry what the state holds)."""
    def check(v: list[Any]) -> tuple[dict[str, Any], ...]:
        if not all(isinstance(r, dict) for r in v):
            raise RequestError(Code.MALFORMED, f"{name} must be maps")
        return tuple(v)
    return check


def _unfinished(v: list[Any]) -> tuple[tuple[int, int, str], ...]:
    out = []
    for u in v:
        if not (isinstance(u, list) and len(u) == 3 and is_int(u[0]) and is_int(u[1])
                and isinstance(u[2], str)):
            raise RequestError(Code.MALFORMED, "unfinished must be [[epoch, n, state], ...]")
        out.append((u[0], u[1], u[2]))
    return tuple(out)


# ---------------------------------------------------------------------- Kafka's model


@dataclass(frozen=True, slots=True, kw_only=True)
class TxInitRequest(WireType):
    OP: ClassVar[Op] = Op.TX_INIT
    ROLE: ClassVar[str] = "request"
    tid: str = spec(str, "the transactional id", check=check_tid("tid"))
    timeout_ms: int = spec(int, "how long a transaction of this producer may stay open "
                           "(at most the cluster's `tx_timeout_max_ms`: TX_LIMIT)",
                           check=_at_least_one_ms)
    g: str = spec(str, "the id's coordinator group (NOT_COORDINATOR, naming it, if not)")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxInitAnswer(WireType):
    OP: ClassVar[Op] = Op.TX_INIT
    ROLE: ClassVar[str] = "answer"
    epoch: int = spec(int, "the producer's epoch: older ones are fenced, and their open "
                      "transaction aborted")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxAddRequest(WireType):
    OP: ClassVar[Op] = Op.TX_ADD
    ROLE: ClassVar[str] = "request"
    tid: str = spec(str, "the transactional id", check=check_tid("tid"))
    epoch: int = spec(int, "the producer's epoch", check=check_count("epoch"))
    n: int = spec(int, "the transaction's number within the epoch", check=check_count("n"))
    groups: tuple[str, ...] = spec(list, "groups taking part (sent beside the first send "
                                   "to them; at most 64 in all: TX_LIMIT); starts the "
                                   "transaction", check=_group_ids(at_least_one=True))
    g: str = spec(str, "the id's coordinator group")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxAddAnswer(WireType):
    OP: ClassVar[Op] = Op.TX_ADD
    ROLE: ClassVar[str] = "answer"


@dataclass(frozen=True, slots=True, kw_only=True)
class TxOffsetsRequest(WireType):
    OP: ClassVar[Op] = Op.TX_OFFSETS
    ROLE: ClassVar[str] = "request"
    tid: str = spec(str, "the transactional id", check=check_tid("tid"))
    epoch: int = spec(int, "the producer's epoch", check=check_count("epoch"))
    n: int = spec(int, "the transaction's number within the epoch", check=check_count("n"))
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    offsets: tuple[tuple[str, int, int], ...] = spec(
        list, "`[topic, queue, offset]` each, queues group `g` hosts: the next offsets to "
        "consume, committed with the transaction", check=_offset_items)
    g: str = spec(str, "the participant group hosting those queues")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxOffsetsAnswer(WireType):
    OP: ClassVar[Op] = Op.TX_OFFSETS
    ROLE: ClassVar[str] = "answer"


@dataclass(frozen=True, slots=True, kw_only=True)
class TxEndRequest(WireType):
    OP: ClassVar[Op] = Op.TX_END
    ROLE: ClassVar[str] = "request"
    tid: str = spec(str, "the transactional id", check=check_tid("tid"))
    epoch: int = spec(int, "the producer's epoch", check=check_count("epoch"))
    n: int = spec(int, "the transaction's number within the epoch", check=check_count("n"))
    commit: bool = spec(bool, "commit (true) or abort: the commit point")
    wait: bool = spec(bool, "answer once every participant applied its marker (or after "
                      "5 s); false: once the decision is logged", default=True)
    groups: tuple[str, ...] = spec(list, "the groups sent to: participants whether or not "
                                   "a TX_ADD named them", default=(),
                                   check=_group_ids(at_least_one=False))
    g: str = spec(str, "the id's coordinator group")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxEndAnswer(WireType):
    OP: ClassVar[Op] = Op.TX_END
    ROLE: ClassVar[str] = "answer"
    state: str = spec(str, "`complete_commit`/`complete_abort` once every participant "
                      "applied its marker, `prepare_*` while markers still go out")
    dup: bool = spec(bool, "the transaction was decided that way already (a retry)")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxMarkerRequest(WireType):
    """Node to node only. The single form (tid, epoch, n, commit, fence) or, for several
    transactions at once, `markers`; with `markers` the single form's fields are not
    read."""

    OP: ClassVar[Op] = Op.TX_MARKER
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the participant group")
    tid: str | None = spec(str, "single form: the transactional id", default=None,
                           check=check_tid("tid"))
    epoch: int | None = spec(int, "single form: the transaction's epoch", default=None,
                             check=check_count("epoch"))
    n: int | None = spec(int, "single form: its number", default=None, check=check_count("n"))
    commit: bool | None = spec(bool, "single form: the decision", default=None)
    fence: int | None = spec(int, "single form: the coordinator's epoch of the id, which "
                             "fences older producers' data", default=None,
                             check=check_count("fence"))
    markers: tuple[Marker, ...] | None = spec(
        list, f"`[tid, epoch, n, commit, fence]` each (1..{MAX_MARKERS}): several "
        "decisions, applied as one entry", default=None, check=_markers)

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        if "markers" in h:
            form = {k: h[k] for k in ("g", "markers") if k in h}
            if form.get("markers") is None:
                raise RequestError(Code.MALFORMED, f"markers must list 1..{MAX_MARKERS} "
                                   "markers")
            return super(TxMarkerRequest, cls).decode(form)
        decoded = super(TxMarkerRequest, cls).decode(h)
        for name in _MARKER_FIELDS:  # the single form has them all
            if getattr(decoded, name) is None:
                header_field(h, name, _MARKER_KINDS[name])  # raises: missing or null
        return decoded

    @classmethod
    def single(cls, g: str, marker: Marker) -> TxMarkerRequest:
        tid, epoch, n, commit, fence = marker
        return cls(g=g, tid=tid, epoch=epoch, n=n, commit=commit, fence=fence)

    def decisions(self) -> tuple[Marker, ...]:
        """The decisions the request carries, in either form."""
        if self.markers is not None:
            return self.markers
        assert (self.tid is not None and self.epoch is not None and self.n is not None
                and self.commit is not None and self.fence is not None)
        return ((self.tid, self.epoch, self.n, self.commit, self.fence),)


@dataclass(frozen=True, slots=True, kw_only=True)
class TxMarkerAnswer(WireType):
    OP: ClassVar[Op] = Op.TX_MARKER
    ROLE: ClassVar[str] = "answer"
    dup: bool = spec(bool, "applied already (a retry)")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxStatusRequest(WireType):
    OP: ClassVar[Op] = Op.TX_STATUS
    ROLE: ClassVar[str] = "request"
    tid: str = spec(str, "the transactional id", check=check_tid("tid"))
    g: str = spec(str, "the id's coordinator group")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxStatusAnswer(WireType):
    """What the coordinator knows of an id, read after a barrier (a participant
    resolving data no marker came for must not act on a deposed leader's view)."""

    OP: ClassVar[Op] = Op.TX_STATUS
    ROLE: ClassVar[str] = "answer"
    epoch: int = spec(int, "the id's epoch, -1 when the coordinator knows no such id")
    n: int = spec(int, "its current transaction's number, -1 when none")
    state: str = spec(str, "that transaction's state (`empty`, `ongoing`, `prepare_*`, "
                      "`complete_*`: every participant applied its marker, as the leader "
                      "saw it, whether or not the entry recording that is in the log yet)")
    participants: tuple[str, ...] = spec(list, "its participant groups",
                                         check=str_list("participants"))
    timeout_ms: int = spec(int, "its timeout")
    unfinished: tuple[tuple[int, int, str], ...] = spec(
        list, "`[epoch, n, state]` each: earlier transactions still writing markers",
        check=_unfinished)


# ---------------------------------------------------------------------- RocketMQ's model


@dataclass(frozen=True, slots=True, kw_only=True)
class HalfEndRequest(WireType):
    OP: ClassVar[Op] = Op.HALF_END
    ROLE: ClassVar[str] = "request"
    txid: str = spec(str, "the half message", check=check_tid("txid"))
    commit: bool = spec(bool, "commit (true) or roll back")
    source: str = spec(str, "`client` (its producer) or `operator` (any producer group's, "
                       "or none: needs cluster admin)", default="client",
                       check=_choice("source", HALF_END_SOURCES))
    pg: str = spec(str, "its producer group (may be empty from the operator)")
    g: str = spec(str, "the group holding it")

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        req = super(HalfEndRequest, cls).decode(h)
        if req.pg or req.source != "operator":
            validate_group_name(req.pg)
        return req


@dataclass(frozen=True, slots=True, kw_only=True)
class HalfEndAnswer(WireType):
    OP: ClassVar[Op] = Op.HALF_END
    ROLE: ClassVar[str] = "answer"
    dup: bool = spec(bool, "decided that way already (a retry, or a check-back's answer)")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxCheckRequest(WireType):
    """Node to client, on a connection a PRODUCER_HEARTBEAT registered: did the local
    transaction of this half message commit?"""

    OP: ClassVar[Op] = Op.TX_CHECK
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group holding the half message", check=validate_group_name)
    txid: str = spec(str, "the half message", check=check_tid("txid"))
    topic: str = spec(str, "its topic", check=validate_topic_name)
    queue: int = spec(int, "its queue")
    msg_id: str | None = spec(str, "its message id", default=None)
    pg: str = spec(str, "its producer group", check=validate_group_name)
    checks: int = spec(int, "how many times it was checked, this one included")


@dataclass(frozen=True, slots=True, kw_only=True)
class TxCheckAnswer(WireType):
    OP: ClassVar[Op] = Op.TX_CHECK
    ROLE: ClassVar[str] = "answer"
    state: str = spec(str, "`commit`, `rollback` or `unknown` (asked again later)",
                      check=_choice("state", CHECK_ANSWERS))


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerHeartbeatRequest(WireType):
    OP: ClassVar[Op] = Op.PRODUCER_HEARTBEAT
    ROLE: ClassVar[str] = "request"
    pg: str = spec(str, "the producer group", check=validate_group_name)
    client: str = spec(str, "the producer's client id (1-255 printable characters)",
                       check=validate_client_id)
    ttl_ms: int = spec(int, "how long the membership lasts without another heartbeat",
                       default=30_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerHeartbeatAnswer(WireType):
    OP: ClassVar[Op] = Op.PRODUCER_HEARTBEAT
    ROLE: ClassVar[str] = "answer"


# ---------------------------------------------------------------------- both


@dataclass(frozen=True, slots=True, kw_only=True)
class TxListRequest(WireType):
    OP: ClassVar[Op] = Op.TX_LIST
    ROLE: ClassVar[str] = "request"
    g: str | None = spec(str, "only this group (UNKNOWN_GROUP if the cluster has none)",
                         default=None, check=validate_group_name)
    tx: str = spec(str, "only the rows of this transactional id or txid (`id` is the "
                   "request's own)", default="")
    limit: int = spec(int, f"rows at most per list and group (1..{MAX_LIST_LIMIT})",
                      default=DEFAULT_LIST_LIMIT, check=_limit)


@dataclass(frozen=True, slots=True, kw_only=True)
class TxListAnswer(WireType):
    OP: ClassVar[Op] = Op.TX_LIST
    ROLE: ClassVar[str] = "answer"
    led: tuple[str, ...] = spec(list, "the groups this node leads whose rows these are",
                                check=str_list("led"))
    halves: tuple[dict[str, Any], ...] = spec(list, "half messages waiting for a decision",
                                              check=_rows("halves"))
    prepared: tuple[dict[str, Any], ...] = spec(
        list, "Kafka transactions' data held undecided (what holds retention back)",
        check=_rows("prepared"))
    txns: tuple[dict[str, Any], ...] = spec(list, "the coordinators' transactions",
                                            check=_rows("txns"))
    decided: tuple[dict[str, Any], ...] = spec(list, "the participants' latest decisions, "
                                               "newest first", check=_rows("decided"))
    done: tuple[dict[str, Any], ...] = spec(list, "the coordinators' latest finished "
                                            "transactions", check=_rows("done"))
    limit: int = spec(int, "the rows per list and group the answer holds at most")
    truncated: bool = spec(bool, "`limit` is under the one asked for: that many rows "
                           "would not fit a header")
