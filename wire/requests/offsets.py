"""Consumer offsets: QUERY_OFFSET, COMMIT_OFFSET, OFFSETS (every committed offset a
node's led groups hold) and DELETE_GROUP, and the rule for one committed offset that the
state machine's record applies too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from wire.protocol import (
    Code,
    Op,
    RequestError,
    check_request_id,
    is_int,
    validate_client_id,
    validate_group_name,
    validate_topic_name,
)
from wire.requests.base import WireType, spec, str_list

__all__ = ["CommitOffsetAnswer", "CommitOffsetRequest", "DeleteGroupAnswer",
           "DeleteGroupRequest", "OffsetsAnswer", "OffsetsRequest", "QueryOffsetAnswer",
           "QueryOffsetRequest", "is_offset_item"]

def is_offset_item(item: object, kind: type[list[Any]] | type[tuple[Any, ...]] = list) -> bool:
    """One committed offset, [topic, queue, offset >= 0], as a `kind`: a list as it
    travels in COMMIT_OFFSET, a tuple as the state machine's `CommitOffsets` record holds
    it (its `validate` applies this same rule)."""
    return (isinstance(item, kind) and len(item) == 3 and isinstance(item[0], str)
            and is_int(item[1]) and is_int(item[2]) and item[2] >= 0)


def _offset_items(v: Any) -> tuple[tuple[str, int, int], ...]:
    out = []
    for item in v:
        if not is_offset_item(item):
            raise RequestError(Code.MALFORMED, "offsets must be [[topic, queue, offset>=0], ...]")
        out.append((validate_topic_name(item[0]), item[1], item[2]))
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryOffsetRequest(WireType):
    OP: ClassVar[Op] = Op.QUERY_OFFSET
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queue: int = spec(int, "the queue id")
    g: str | None = spec(str, "the group the client's route names", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryOffsetAnswer(WireType):
    OP: ClassVar[Op] = Op.QUERY_OFFSET
    ROLE: ClassVar[str] = "answer"
    offset: int = spec(int, "the committed offset (the next to consume), -1 when none")


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitOffsetRequest(WireType):
    OP: ClassVar[Op] = Op.COMMIT_OFFSET
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    offsets: tuple[tuple[str, int, int], ...] = spec(
        list, "`[topic, queue, offset]` each: the next offset to consume",
        check=_offset_items)
    req: tuple[int, int] | None = spec(
        list, "`[client id, sequence]`: a retried commit is applied once", default=None,
        check=check_request_id)
    client: str | None = spec(
        str, "the committing consumer's client id: a queue locked in the group by another "
        "client's live lease refuses the commit (LOCK_LOST); an unlocked queue takes it "
        "whoever commits", default=None, check=validate_client_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitOffsetAnswer(WireType):
    OP: ClassVar[Op] = Op.COMMIT_OFFSET
    ROLE: ClassVar[str] = "answer"
    dup: bool = spec(bool, "a retry whose first copy was applied already")


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetsRequest(WireType):
    OP: ClassVar[Op] = Op.OFFSETS
    ROLE: ClassVar[str] = "request"
    cg: str | None = spec(str, "only this consumer group's offsets (every group's when "
                          "left out)", default=None, check=validate_group_name)

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        # a cg that is not a string is an invalid group name (INVALID_NAME), as it has
        # always been answered, rather than a mistyped field
        cg = h.get("cg")
        return cls(cg=None if cg is None else validate_group_name(cg))


def _offset_rows(v: Any) -> tuple[tuple[str, str, str, int, int], ...]:
    out = []
    for row in v:
        if not (isinstance(row, list | tuple) and len(row) == 5
                and all(isinstance(x, str) for x in row[:3]) and is_int(row[3])
                and is_int(row[4])):
            raise RequestError(Code.MALFORMED, "rows must be [[g, cg, topic, queue, offset], ...]")
        out.append((row[0], row[1], row[2], row[3], row[4]))
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetsAnswer(WireType):
    OP: ClassVar[Op] = Op.OFFSETS
    ROLE: ClassVar[str] = "answer"
    rows: tuple[tuple[str, str, str, int, int], ...] = spec(
        list, "`[group, consumer group, topic, queue, offset]` each, of the groups in `led`",
        check=_offset_rows)
    led: tuple[str, ...] = spec(list, "the groups this node leads and read (after a "
                                "ReadIndex barrier each): the offsets of the others are "
                                "their leaders' to answer", check=str_list("led"))


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteGroupRequest(WireType):
    OP: ClassVar[Op] = Op.DELETE_GROUP
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group (its leader answers)")
    cg: str = spec(str, "the consumer group whose committed offsets go",
                   check=validate_group_name)
    req: tuple[int, int] | None = spec(
        list, "`[client id, sequence]`: a retried delete is applied once", default=None,
        check=check_request_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteGroupAnswer(WireType):
    OP: ClassVar[Op] = Op.DELETE_GROUP
    ROLE: ClassVar[str] = "answer"
    deleted: int = spec(int, "how many committed offsets were deleted")
