"""Consumer group members: HEARTBEAT (a consumer is alive) and CONSUMERS (a group's live
members on one node, held until they change when asked so).

Members are each node's soft state, never replicated: a consumer heartbeats every node
and allocates queues over the union of their lists. Older clients sent fields the node
never looked at in any shape (`topics`) and `known` lists of any kind; such values are
taken as left out, as they always were, not refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from wire.protocol import Op, validate_client_id, validate_group_name
from wire.requests.base import WireType, spec, str_list

__all__ = ["ConsumersAnswer", "ConsumersRequest", "HeartbeatAnswer", "HeartbeatRequest"]

_decode = WireType.decode.__func__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatRequest(WireType):
    OP: ClassVar[Op] = Op.HEARTBEAT
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    client: str = spec(str, "the consumer's client id (1-255 printable characters)",
                       check=validate_client_id)
    topics: tuple[str, ...] = spec(list, "the topics it consumes (for operators; the node "
                                   "does not use them)", default=(), check=str_list("topics"))
    ttl_ms: int = spec(int, "how long it counts as alive without another heartbeat (kept "
                       "within 100 ms - 10 min); 0: it leaves now", default=30_000)
    manual: bool = spec(bool, "it reads queues it chose (a pull consumer): a member its "
                        "group sees, but not one a rebalance shares queues with",
                        default=False)

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        topics = h.get("topics")
        if "topics" in h and not (isinstance(topics, list)
                                  and all(isinstance(t, str) for t in topics)):
            h = {k: v for k, v in h.items() if k != "topics"}  # never checked: ignored
        return _decode(cls, h)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatAnswer(WireType):
    """Nothing; BUSY when a new member would exceed what the node keeps."""

    OP: ClassVar[Op] = Op.HEARTBEAT
    ROLE: ClassVar[str] = "answer"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumersRequest(WireType):
    OP: ClassVar[Op] = Op.CONSUMERS
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    known: tuple[str, ...] | None = spec(
        list, "the members the caller last saw: the answer waits (up to `wait_ms`) until "
        "they differ", default=None, check=tuple)
    wait_ms: int = spec(int, "how long to wait for a change of `known` (0 - 60 s)",
                        default=0)

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        if "known" in h and not isinstance(h["known"], list):
            h = {k: v for k, v in h.items() if k != "known"}  # none known: answered at once
        return _decode(cls, h)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumersAnswer(WireType):
    OP: ClassVar[Op] = Op.CONSUMERS
    ROLE: ClassVar[str] = "answer"
    clients: tuple[str, ...] = spec(list, "the live members a rebalance shares queues "
                                    "among, sorted", check=str_list("clients"))
    manual: tuple[str, ...] = spec(list, "the live members with manual assignment, sorted",
                                   check=str_list("manual"))
