"""Reading a queue: FETCH."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from wire.protocol import Op, validate_topic_name
from wire.requests.base import WireType, spec, str_list

__all__ = ["FetchAnswer", "FetchRequest"]

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
    g: str | None = spec(str, "the group the client's route names: only that group's "
                         "ready leader answers", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchAnswer(WireType):
    OP: ClassVar[Op] = Op.FETCH
    ROLE: ClassVar[str] = "answer"
    g: str = spec(str, "the group that answered")
    next: int = spec(int, "where to fetch next (past messages a tag filter skipped)")
    min: int = spec(int, "the queue's first readable offset")
    end: int = spec(int, "the queue's end offset")
    msgs: tuple[Any, ...] = spec(list, "one row per message: offset, Raft index, place "
                                 "in the body and store time; the body holds the records")
