"""Queue locks of orderly consumption: LOCK (take or renew), UNLOCK (let go) and LOCKS
(who holds what). A lock is a lease per (consumer group, topic, queue) held by one
client, kept in the replicated state (`broker.state.parts.queuelocks`); the values'
bounds are the records' own checks, answered with the codes apply would give."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from wire.protocol import (
    Code,
    Op,
    RequestError,
    is_int,
    validate_client_id,
    validate_group_name,
    validate_topic_name,
)
from wire.requests.base import WireType, spec, str_list

__all__ = ["LockAnswer", "LockRequest", "LocksAnswer", "LocksRequest", "UnlockAnswer",
           "UnlockRequest"]


def _queue_ids(name: str) -> Any:
    def check(v: Any) -> tuple[int, ...]:
        if not all(is_int(q) for q in v):
            raise RequestError(Code.MALFORMED, f"{name} must be queue ids (integers)")
        return tuple(v)
    return check


def _lock_rows(v: Any) -> tuple[tuple[Any, ...], ...]:
    out = []
    for row in v:
        if not (isinstance(row, list | tuple) and len(row) == 7
                and all(isinstance(x, str) for x in row[:3]) and is_int(row[3])
                and isinstance(row[4], str) and is_int(row[5]) and isinstance(row[6], bool)):
            raise RequestError(Code.MALFORMED, "rows must be [[g, cg, topic, queue, client, "
                               "expiry_ms, live], ...]")
        out.append(tuple(row))
    return tuple(out)


_G = "the group the client's route names: only that group's ready leader answers"


@dataclass(frozen=True, slots=True, kw_only=True)
class LockRequest(WireType):
    OP: ClassVar[Op] = Op.LOCK
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queues: tuple[int, ...] = spec(list, "the queues to lock, all of one group (1..1,024 "
                                   "distinct ids)", check=_queue_ids("queues"))
    client: str = spec(str, "the locking consumer's client id", check=validate_client_id)
    lease_ms: int | None = spec(int, "how long the locks hold unrenewed (100 ms .. 1 h); "
                                "the node's `queue_lock_lease_ms` (60 s) when left out",
                                default=None)
    g: str | None = spec(str, _G, default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class LockAnswer(WireType):
    OP: ClassVar[Op] = Op.LOCK
    ROLE: ClassVar[str] = "answer"
    held: tuple[int, ...] = spec(list, "the queues asked that the client holds now "
                                 "(taken or renewed); the others are another client's",
                                 check=_queue_ids("held"))
    expiry_ms: int = spec(int, "when the locks held run out unless renewed (the leader's "
                          "clock)")
    lease_ms: int = spec(int, "the lease they were given")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnlockRequest(WireType):
    OP: ClassVar[Op] = Op.UNLOCK
    ROLE: ClassVar[str] = "request"
    cg: str = spec(str, "the consumer group", check=validate_group_name)
    topic: str = spec(str, "the topic", check=validate_topic_name)
    queues: tuple[int, ...] = spec(list, "the queues to let go of (another client's locks "
                                   "are left alone)", check=_queue_ids("queues"))
    client: str = spec(str, "the unlocking consumer's client id", check=validate_client_id)
    g: str | None = spec(str, _G, default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnlockAnswer(WireType):
    OP: ClassVar[Op] = Op.UNLOCK
    ROLE: ClassVar[str] = "answer"
    freed: tuple[int, ...] = spec(list, "the queues the client held and let go of",
                                  check=_queue_ids("freed"))


@dataclass(frozen=True, slots=True, kw_only=True)
class LocksRequest(WireType):
    OP: ClassVar[Op] = Op.LOCKS
    ROLE: ClassVar[str] = "request"
    cg: str | None = spec(str, "only this consumer group's locks (every group's when left "
                          "out)", default=None, check=validate_group_name)


@dataclass(frozen=True, slots=True, kw_only=True)
class LocksAnswer(WireType):
    OP: ClassVar[Op] = Op.LOCKS
    ROLE: ClassVar[str] = "answer"
    rows: tuple[tuple[Any, ...], ...] = spec(
        list, "`[group, consumer group, topic, queue, client, lease expiry (the leader's "
        "clock, ms), live]` each, of the groups in `led`", check=_lock_rows)
    led: tuple[str, ...] = spec(list, "the groups this node leads and read (after a "
                                "ReadIndex barrier each)", check=str_list("led"))
