"""TRACE: a traced client's events about messages of one group, reported in one request
per batch (`broker.doors.trace` writes them to the trace topic)."""

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
from wire.requests.base import WireType, spec

__all__ = ["MAX_TRACE_EVENTS", "TRACE_KINDS", "TraceAnswer", "TraceEvent", "TraceRequest"]

MAX_TRACE_EVENTS = 1024  # events one request carries at most
#: What each role may report; the node adds "stored" to every "sent" from its own state.
TRACE_KINDS: dict[str, frozenset[str]] = {
    "producer": frozenset({"sent"}),
    "consumer": frozenset({"delivered", "acked"}),
}
MAX_SLOTS = 1024  # the trace topic's queues at most (a topic's limit)

TraceEvent = tuple[str, int, int, int, int]  # kind, queue, offset, ms, committed


def _role(v: str) -> str:
    if v not in TRACE_KINDS:
        raise RequestError(Code.MALFORMED, f"role must be one of {sorted(TRACE_KINDS)}, "
                           f"not {v[:40]!r}")
    return v


def _events(v: list[Any]) -> tuple[TraceEvent, ...]:
    if not 0 < len(v) <= MAX_TRACE_EVENTS:
        raise RequestError(Code.MALFORMED, f"events must hold 1-{MAX_TRACE_EVENTS} events, "
                           f"not {len(v)}")
    out: list[TraceEvent] = []
    for e in v:
        if (not isinstance(e, list) or len(e) != 5 or not isinstance(e[0], str)
                or not all(is_int(x) for x in e[1:]) or e[1] < 0 or e[2] < 0 or e[3] < 0
                or e[4] < -1):
            raise RequestError(Code.MALFORMED, "an event is [kind, queue >= 0, offset >= 0, "
                               f"ms >= 0, committed >= -1]; got {str(e)[:80]}")
        out.append((e[0], e[1], e[2], e[3], e[4]))
    return tuple(out)


def _slots(v: int) -> int:
    if not 0 < v <= MAX_SLOTS:
        raise RequestError(Code.MALFORMED, f"slots must lie in 1..{MAX_SLOTS}, not {v}")
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRequest(WireType):
    """Events of a traced producer (sent) or consumer (delivered, acked) about messages of
    `topic` stored in group `g`; sent to that group's leader, which appends them, with a
    stored record for each sent one, to the group's queue of the trace topic."""

    OP: ClassVar[Op] = Op.TRACE
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group storing the messages (their ids name it)",
                  check=validate_group_name)
    topic: str = spec(str, "the traced topic", check=validate_topic_name)
    role: str = spec(str, "producer or consumer", check=_role)
    client: str = spec(str, "the reporting client's id", check=validate_client_id)
    cg: str | None = spec(str, "the consumer group (role consumer)", default=None,
                          check=validate_group_name)
    slot: int = spec(int, "the trace topic's queue this group hosts, if the node creates "
                     "the topic here now (the group's place among the cluster's groups, "
                     "sorted)")
    slots: int = spec(int, "the trace topic's queues in total, likewise (one per group)",
                      check=_slots)
    events: tuple[TraceEvent, ...] = spec(
        list, "[[kind, queue, offset, ms, committed]...]: kind sent (ms: born time), "
        "delivered (ms: when handed to the application) or acked (ms: when; committed: the "
        "consumer offset committed over it, -1 for a simple consumer's ack)", check=_events)

    def __post_init__(self) -> None:
        if not 0 <= self.slot < self.slots:
            raise RequestError(Code.MALFORMED, f"slot {self.slot} must lie in "
                               f"0..{self.slots - 1}")
        if (self.role == "consumer") != (self.cg is not None):
            raise RequestError(Code.MALFORMED, "a consumer's events name its group (cg), "
                               "a producer's none")
        allowed = TRACE_KINDS[self.role]
        for kind, *_rest in self.events:
            if kind not in allowed:
                raise RequestError(Code.MALFORMED, f"a {self.role} reports "
                                   f"{sorted(allowed)}, not {kind[:40]!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceAnswer(WireType):
    OP: ClassVar[Op] = Op.TRACE
    ROLE: ClassVar[str] = "answer"
    written: int = spec(int, "trace records appended")
    missing: int = spec(int, "events naming an offset the group does not hold (never "
                        "stored, or retention removed it): not recorded")
