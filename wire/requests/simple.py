"""The simple consumer: RECEIVE, ACK, NACK, CHANGE_INVISIBLE (per-message consumption,
several consumers on one queue, no assignment), and DLQ (a consumer group's dead
letters: list, show, resend, purge).

A receipt is what a client passes back for one delivery: the consumer group, the topic,
the queue, the offset and the delivery's handle (the Raft index of the receive that
handed it out). The values' bounds (invisible time, deliveries, backoff steps, the
in-flight cap, the error's length) are the state machine records' own checks
(`broker.state.parts.receipts`), answered with the codes apply would give."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from wire.protocol import (
    Code,
    Op,
    RequestError,
    check_request_id,
    is_int,
    validate_group_name,
    validate_topic_name,
)
from wire.requests.base import WireType, spec, str_list
from wire.requests.reads import MAX_FILTER_CHARS, _filter_text

__all__ = ["DLQ_ACTIONS", "AckAnswer", "AckRequest", "ChangeInvisibleAnswer",
           "ChangeInvisibleRequest", "DlqAnswer", "DlqRequest", "NackAnswer", "NackRequest",
           "ReceiveAnswer", "ReceiveRequest", "SendBackAnswer", "SendBackRequest"]

DLQ_ACTIONS = ("list", "show", "resend", "purge")


def _int_rows(name: str, width: int) -> Any:
    """A list of rows of `width` integers each."""
    def check(v: Any) -> tuple[tuple[int, ...], ...]:
        if not all(isinstance(r, list | tuple) and len(r) == width and all(is_int(x) for x in r)
                   for r in v):
            raise RequestError(Code.MALFORMED, f"{name} must be rows of {width} integers")
        return tuple(tuple(r) for r in v)
    return check


def _int_list(name: str) -> Any:
    def check(v: Any) -> tuple[int, ...]:
        if not all(is_int(x) for x in v):
            raise RequestError(Code.MALFORMED, f"{name} must be integers")
        return tuple(v)
    return check


def _rows(v: Any) -> tuple[tuple[Any, ...], ...]:
    if not all(isinstance(r, list | tuple) for r in v):
        raise RequestError(Code.MALFORMED, "rows must be lists")
    return tuple(tuple(r) for r in v)


def _action(v: str) -> str:
    if v not in DLQ_ACTIONS:
        raise RequestError(Code.MALFORMED, f"action must be one of {', '.join(DLQ_ACTIONS)}, "
                           f"got {v!r}")
    return v


_G = "the group the client's route names: only that group's ready leader answers"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiveRequest(WireType):
    OP: ClassVar[Op] = Op.RECEIVE
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    g: str | None = spec(str, _G, default=None)
    max: int = spec(int, "messages at most (1..1,024)", default=32)
    invisible_ms: int = spec(int, "how long the messages handed out stay invisible to the "
                             "group's other receives (10 ms .. 12 h)", default=30_000)
    wait_ms: int = spec(int, "how long the node holds the request while nothing is to be "
                        "had (long polling; capped at 60 s); an idle receive writes nothing",
                        default=15_000)
    max_deliveries: int = spec(int, "a message delivered this many times goes to the dead "
                               "letters instead of again (1..1,000)", default=16)
    cap: int = spec(int, "the group's messages in flight on this queue at most "
                    "(1..65,536)", default=4096)
    client: str = spec(str, "the consumer's client id (1-255 printable characters)",
                       default="-")
    retries: bool = spec(bool, "only messages sent back and visible again (a push "
                         "consumer's retries), never new ones", default=False)
    tags: tuple[str, ...] = spec(list, "only new messages with one of these tags (exactly, "
                                 "on the node); the others are passed for the consumer "
                                 "group for good, as a FETCH advances past them",
                                 default=(), check=str_list("tags"))
    sql: str | None = spec(str, "only new messages a SQL92 filter matches (as FETCH's "
                           "`sql`); the others are passed for the consumer group for good. "
                           "MALFORMED, naming line and column, when it does not compile "
                           f"(at most {MAX_FILTER_CHARS:,} characters)",
                           default=None, check=_filter_text)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiveAnswer(WireType):
    OP: ClassVar[Op] = Op.RECEIVE
    ROLE: ClassVar[str] = "answer"
    g: str = spec(str, "the group that answered")
    msgs: tuple[tuple[int, ...], ...] = spec(
        list, "one row per message: offset, Raft index, place in the body, store time, "
        "deliveries (1 the first time) and the delivery's handle; the body holds the "
        "records", check=_int_rows("msgs", 6))
    dead: int = spec(int, "messages this receive sent to the dead letters (delivered "
                     "max_deliveries times) instead of handing them out", default=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class AckRequest(WireType):
    OP: ClassVar[Op] = Op.ACK
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    g: str | None = spec(str, _G, default=None)
    items: tuple[tuple[int, int], ...] = spec(
        list, "`[offset, handle]` each: the deliveries acked (1..1,024)",
        check=_int_rows("items", 2))
    req: tuple[int, int] | None = spec(
        list, "`[client id, sequence]`: a retried ack is applied once", default=None,
        check=check_request_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class AckAnswer(WireType):
    OP: ClassVar[Op] = Op.ACK
    ROLE: ClassVar[str] = "answer"
    acked: int = spec(int, "deliveries acked")
    stale: tuple[tuple[int, int], ...] = spec(
        list, "`[offset, handle]` of the receipts that were not current (the message was "
        "delivered again, acked or dead-lettered): nothing was done for them",
        default=(), check=_int_rows("stale", 2))
    skipped: int = spec(int, "how many receipts were stale (a retry whose first copy was "
                        "applied knows the count, not which)", default=0)
    dup: bool = spec(bool, "a retry whose first copy was applied already", default=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class NackRequest(WireType):
    OP: ClassVar[Op] = Op.NACK
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    g: str | None = spec(str, _G, default=None)
    items: tuple[tuple[int, int], ...] = spec(
        list, "`[offset, handle]` each: the deliveries failed (1..1,024)",
        check=_int_rows("items", 2))
    delay_ms: int | None = spec(int, "visible again after this (0 .. 24 h); when left out, "
                                "after the backoff step of the delivery count", default=None)
    backoff_ms: tuple[int, ...] = spec(
        list, "the delays by delivery count, the last repeating (1..64 steps of 0 .. 24 h); "
        "when left out, RocketMQ's 10 s 30 s 1 m 2 m ... 1 h 2 h", default=(),
        check=_int_list("backoff_ms"))
    max_deliveries: int = spec(int, "a message delivered this many times goes to the dead "
                               "letters instead (1..1,000)", default=16)
    error: str = spec(str, "why it failed (kept with a dead letter; 1,024 characters at "
                      "most)", default="")
    dead: bool = spec(bool, "send the messages to the dead letters now (poison)",
                      default=False)
    req: tuple[int, int] | None = spec(
        list, "`[client id, sequence]`: a retried nack is applied once", default=None,
        check=check_request_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class NackAnswer(WireType):
    OP: ClassVar[Op] = Op.NACK
    ROLE: ClassVar[str] = "answer"
    nacked: int = spec(int, "deliveries failed (to be delivered again, or dead letters)")
    dead: tuple[int, ...] = spec(list, "offsets sent to the dead letters", default=(),
                                 check=_int_list("dead"))
    stale: tuple[tuple[int, int], ...] = spec(
        list, "`[offset, handle]` of the receipts that were not current: nothing was done "
        "for them", default=(), check=_int_rows("stale", 2))
    skipped: int = spec(int, "how many receipts were stale", default=0)
    dup: bool = spec(bool, "a retry whose first copy was applied already", default=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendBackRequest(WireType):
    OP: ClassVar[Op] = Op.SEND_BACK
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    g: str | None = spec(str, _G, default=None)
    offset: int = spec(int, "the message a push consumer failed (read by offset)")
    backoff_ms: tuple[int, ...] = spec(
        list, "the delays by delivery count, the last repeating (1..64 steps of 0 .. 24 h); "
        "when left out, RocketMQ's 10 s 30 s 1 m 2 m ... 1 h 2 h", default=(),
        check=_int_list("backoff_ms"))
    max_deliveries: int = spec(int, "a message delivered this many times goes to the dead "
                               "letters instead (1..1,000)", default=16)
    error: str = spec(str, "why it failed (kept with a dead letter; 1,024 characters at "
                      "most)", default="")
    dead: bool = spec(bool, "send it to the dead letters now (poison)", default=False)
    req: tuple[int, int] | None = spec(
        list, "`[client id, sequence]`: a retried send-back is applied once", default=None,
        check=check_request_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendBackAnswer(WireType):
    OP: ClassVar[Op] = Op.SEND_BACK
    ROLE: ClassVar[str] = "answer"
    parked: bool = spec(bool, "it is the group's to receive again (or a dead letter now); "
                        "false: it was sent back before and is in flight already")
    dead: bool = spec(bool, "it went to the dead letters", default=False)
    dup: bool = spec(bool, "a retry whose first copy was applied already", default=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeInvisibleRequest(WireType):
    OP: ClassVar[Op] = Op.CHANGE_INVISIBLE
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    g: str | None = spec(str, _G, default=None)
    offset: int = spec(int, "the message's offset")
    handle: int = spec(int, "its current delivery's handle (STALE_RECEIPT otherwise)")
    invisible_ms: int = spec(int, "invisible this long from now on (10 ms .. 12 h)")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeInvisibleAnswer(WireType):
    OP: ClassVar[Op] = Op.CHANGE_INVISIBLE
    ROLE: ClassVar[str] = "answer"
    visible_ms: int = spec(int, "when the message becomes visible again (the leader's clock)")


@dataclass(frozen=True, slots=True, kw_only=True)
class DlqRequest(WireType):
    OP: ClassVar[Op] = Op.DLQ
    ROLE: ClassVar[str] = "request"
    action: str = spec(str, "`list` (every group this node leads), `show` (`ids` with their "
                       "records in the body), `resend` (back into their queues) or `purge`",
                       check=_action)
    cg: str = spec(str, "the consumer group whose dead letters (`%DLQ%<cg>`)",
                   check=validate_group_name)
    g: str | None = spec(str, "the group holding them (required but for `list`, where it "
                         "keeps one group)", default=None)
    ids: tuple[int, ...] = spec(list, "the dead letters' ids (`show`, `resend`, `purge`: "
                                "1..1,024)", default=(), check=_int_list("ids"))
    limit: int = spec(int, "rows per group at most (`list`)", default=1000)
    req: tuple[int, int] | None = spec(
        list, "`[client id, sequence]`: a retried resend or purge is applied once",
        default=None, check=check_request_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class DlqAnswer(WireType):
    OP: ClassVar[Op] = Op.DLQ
    ROLE: ClassVar[str] = "answer"
    rows: tuple[tuple[Any, ...], ...] = spec(
        list, "`list`, `show`: `[group, id, topic, queue, offset, Raft index, place, store "
        "time, deliveries, last error, dead time]` each; with `show` the body holds their "
        "records in row order", default=(), check=_rows)
    led: tuple[str, ...] = spec(list, "`list`: the groups this node leads and read (after a "
                                "ReadIndex barrier each)", default=(), check=str_list("led"))
    done: int = spec(int, "`resend`, `purge`: the dead letters resent or purged (ids not "
                     "held are skipped)", default=0)
    offsets: tuple[tuple[int, int], ...] = spec(
        list, "`resend`: `[id, new offset]` of each resent", default=(),
        check=_int_rows("offsets", 2))
    dup: bool = spec(bool, "a retry whose first copy was applied already", default=False)
