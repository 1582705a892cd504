"""The reads: FETCH (a queue), GET_MESSAGE (one message by id), QUERY_KEY (by key),
OFFSET_FOR_TIME (where a queue reaches a store time), and READ_RAW, a node asking a peer
for stored entries to repair its own corrupt copies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from wire.protocol import Code, Op, RequestError, validate_topic_name
from wire.records import parse_message_id
from wire.requests.base import WireType, spec, str_list

__all__ = ["FetchAnswer", "FetchRequest", "GetMessageAnswer", "GetMessageRequest",
           "OffsetForTimeAnswer", "OffsetForTimeRequest", "QueryKeyAnswer", "QueryKeyRequest",
           "ReadRawAnswer", "ReadRawRequest"]

MAX_FILTER_CHARS = 4096  # a SQL92 filter's length: compiled on the node's event loop


def _filter_text(v: str) -> str:
    if len(v) > MAX_FILTER_CHARS:
        raise RequestError(Code.MALFORMED, f"a SQL92 filter has at most {MAX_FILTER_CHARS} "
                           f"characters, this one {len(v)}")
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchRequest(WireType):
    OP: ClassVar[Op] = Op.FETCH
    ROLE: ClassVar[str] = "request"
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    offset: int = spec(int, "the first offset wanted")
    max: int = spec(int, "messages at most (the node caps it at 1,024)", default=32)
    max_bytes: int = spec(int, "record bytes at most (capped at 8 MiB)", default=1 << 20)
    wait_ms: int = spec(int, "how long the node holds the request at the end of the queue "
                        "(long polling; capped at 60 s)", default=15_000)
    tags: tuple[str, ...] = spec(list, "only messages with one of these tags (by hash; "
                                 "the exact match is the client's)", default=(),
                                 check=str_list("tags"))
    sql: str | None = spec(str, "only messages a SQL92 filter (RocketMQ's `bySql`) "
                           "matches, decided on the node over the message's properties "
                           "plus TAGS and KEYS; with `tags`, both must match. MALFORMED, "
                           "naming line and column, when it does not compile "
                           f"(at most {MAX_FILTER_CHARS:,} characters)",
                           default=None, check=_filter_text)
    g: str | None = spec(str, "the group the client's route names: only that group's "
                         "ready leader answers", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchAnswer(WireType):
    OP: ClassVar[Op] = Op.FETCH
    ROLE: ClassVar[str] = "answer"
    g: str = spec(str, "the group that answered")
    next: int = spec(int, "where to fetch next (past messages a tag or SQL92 filter "
                     "skipped)")
    min: int = spec(int, "the queue's first readable offset")
    end: int = spec(int, "the queue's end offset")
    msgs: tuple[Any, ...] = spec(list, "one row per message: offset, Raft index, place "
                                 "in the body and store time; the body holds the records")


def _message_id(v: str) -> str:
    parse_message_id(v)  # MALFORMED, naming the id, when it is not "group:index:start"
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMessageRequest(WireType):
    OP: ClassVar[Op] = Op.GET_MESSAGE
    ROLE: ClassVar[str] = "request"
    msg_id: str = spec(str, "the message id, `group:index:start` (its group's leader "
                       "answers)", check=_message_id)

    @property
    def parts(self) -> tuple[str, int, int]:
        """(group, Raft index of its entry, place in the entry)."""
        return parse_message_id(self.msg_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMessageAnswer(WireType):
    OP: ClassVar[Op] = Op.GET_MESSAGE
    ROLE: ClassVar[str] = "answer"
    topic: str = spec(str, "the message's topic")
    queue: int = spec(int, "its queue")
    g: str = spec(str, "the group that answered")
    msgs: tuple[Any, ...] = spec(list, "one row, as FETCH's: offset, Raft index, place in "
                                 "the body and store time; the body holds the record",
                                 check=tuple)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryKeyRequest(WireType):
    OP: ClassVar[Op] = Op.QUERY_KEY
    ROLE: ClassVar[str] = "request"
    topic: str = spec(str, "the topic", check=validate_topic_name)
    key: str = spec(str, "the message key")
    max: int = spec(int, "the newest messages at most, per group (capped at 1,024)",
                    default=32)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryKeyAnswer(WireType):
    OP: ClassVar[Op] = Op.QUERY_KEY
    ROLE: ClassVar[str] = "answer"
    msgs: tuple[Any, ...] = spec(list, "one row per message: group, queue, then FETCH's "
                                 "row (offset, Raft index, place in the body, store time); "
                                 "the body holds the records", check=tuple)
    searched: tuple[str, ...] = spec(list, "the groups searched: those hosting the topic "
                                     "that this node leads (the others answer at their "
                                     "leaders)", check=str_list("searched"))


def _epoch_ms(v: int) -> int:
    if not 0 <= v < 1 << 63:
        raise RequestError(Code.MALFORMED, f"ms must be epoch milliseconds >= 0, got {v}")
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetForTimeRequest(WireType):
    """Kafka's ListOffsets by timestamp for one queue: where a consumer starts to read
    what was stored from a moment on."""

    OP: ClassVar[Op] = Op.OFFSET_FOR_TIME
    ROLE: ClassVar[str] = "request"
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    ms: int = spec(int, "a store time, epoch milliseconds (>= 0)", check=_epoch_ms)
    g: str | None = spec(str, "the group the client's route names: only that group's "
                         "ready leader answers", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetForTimeAnswer(WireType):
    OP: ClassVar[Op] = Op.OFFSET_FOR_TIME
    ROLE: ClassVar[str] = "answer"
    g: str = spec(str, "the group that answered")
    offset: int = spec(int, "the first retained offset whose message, or one before it, "
                       "was stored at or after `ms` (store times follow the leaders' "
                       "clocks, so the search goes by their running maximum); `end` when "
                       "none was, `min` when every retained one was")
    min: int = spec(int, "the queue's first readable offset")
    end: int = spec(int, "the queue's end offset")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRawRequest(WireType):
    """Node to node only (FORBIDDEN to a client): entries a peer repairs."""

    OP: ClassVar[Op] = Op.READ_RAW
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group")
    index: int = spec(int, "the first entry wanted")
    hi: int | None = spec(int, "the end of the range wanted (exclusive, above `index`); "
                          "when left out, `index` + 1", default=None)

    def __post_init__(self) -> None:
        if self.hi is not None and self.hi <= self.index:
            raise RequestError(Code.MALFORMED, f"hi {self.hi} must be above index {self.index}")

    @property
    def end(self) -> int:
        """Where the range asked for ends (exclusive)."""
        return self.index + 1 if self.hi is None else self.hi


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRawAnswer(WireType):
    OP: ClassVar[Op] = Op.READ_RAW
    ROLE: ClassVar[str] = "answer"
    term: int = spec(int, "the term of entry `index`; the body holds the stored bytes of "
                     "entries [index, index + n), 1 <= n <= hi - index, ending before the "
                     "answering replica's own next unreadable entry and within "
                     "`broker.doors.reads.READ_RAW_MAX_BYTES`; NOT_FOUND (`gone`: true "
                     "when retention removed entry `index`)")
