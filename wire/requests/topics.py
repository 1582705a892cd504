"""Topics: CREATE_TOPIC, DELETE_TOPIC, GROW_TOPIC and TOPICS.

A topic's configuration lives in the groups hosting its queues, so each change names the
group (`g`) whose leader applies it, and the queue ids that group hosts. The node's own
limit on queues per topic (`broker.state.parts.base.MAX_QUEUES`) is the node's to apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from wire.protocol import Code, Op, RequestError, check_request_id, is_int, validate_topic_name
from wire.requests.base import WireType, spec

__all__ = ["CreateTopicAnswer", "CreateTopicRequest", "DeleteTopicAnswer",
           "DeleteTopicRequest", "GrowTopicAnswer", "GrowTopicRequest", "TopicsAnswer",
           "TopicsRequest"]


def _queue_count(v: int) -> int:
    if v < 1:
        raise RequestError(Code.MALFORMED, f"queues must be at least 1, not {v}")
    return v


def _check_hosted(hosted: tuple[Any, ...], queues: int, *, empty_ok: bool) -> None:
    if (not hosted and not empty_ok) or any(not is_int(q) or not 0 <= q < queues
                                            for q in hosted):
        raise RequestError(Code.MALFORMED, f"hosted must list queue ids in [0, {queues})")


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopicRequest(WireType):
    OP: ClassVar[Op] = Op.CREATE_TOPIC
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group (its leader answers)")
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queues: int = spec(int, "the topic's queues in all groups (1 to the node's limit, "
                       "1,024)", check=_queue_count)
    hosted: tuple[int, ...] = spec(list, "the ids of the queues this group hosts "
                                   "(at least one, each below `queues`)", check=tuple)

    def __post_init__(self) -> None:
        _check_hosted(self.hosted, self.queues, empty_ok=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopicAnswer(WireType):
    """Nothing; TOPIC_EXISTS (with `same`: true when its configuration is the one asked
    for) when the topic is there already."""

    OP: ClassVar[Op] = Op.CREATE_TOPIC
    ROLE: ClassVar[str] = "answer"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicRequest(WireType):
    OP: ClassVar[Op] = Op.DELETE_TOPIC
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group (its leader answers): the topic's queues, offsets and "
                  "keys there go")
    topic: str = spec(str, "the topic", check=validate_topic_name)
    req: tuple[int, int] | None = spec(
        list, "`[client id, sequence]`: a retried delete is answered as its first copy",
        default=None, check=check_request_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicAnswer(WireType):
    OP: ClassVar[Op] = Op.DELETE_TOPIC
    ROLE: ClassVar[str] = "answer"


@dataclass(frozen=True, slots=True, kw_only=True)
class GrowTopicRequest(WireType):
    OP: ClassVar[Op] = Op.GROW_TOPIC
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group (its leader answers; a new group may join the topic)")
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queues: int = spec(int, "the new total of queues (existing queues stay)",
                       check=_queue_count)
    hosted: tuple[int, ...] = spec(list, "the ids of the queues this group hosts from now "
                                   "on, each below `queues`", check=tuple)
    req: tuple[int, int] | None = spec(
        list, "`[client id, sequence]`: a retried grow is answered as its first copy",
        default=None, check=check_request_id)

    def __post_init__(self) -> None:
        _check_hosted(self.hosted, self.queues, empty_ok=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class GrowTopicAnswer(WireType):
    OP: ClassVar[Op] = Op.GROW_TOPIC
    ROLE: ClassVar[str] = "answer"


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicsRequest(WireType):
    OP: ClassVar[Op] = Op.TOPICS
    ROLE: ClassVar[str] = "request"
    g: str | None = spec(str, "only this group's topics, from its leader once a majority "
                         "confirmed it leads (a linearizable read); left out, every group's "
                         "hosted here, as this node knows them", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicsAnswer(WireType):
    OP: ClassVar[Op] = Op.TOPICS
    ROLE: ClassVar[str] = "answer"
    topics: dict[str, Any] = spec(dict, "`{name: {queues: total, hosted: {group: [queue "
                                  "ids]}}}`")
