"""Trace records: what the trace topic holds, one message per step of a traced message's
life, keyed by that message's id (so the key index finds them) and tagged by the step.

A record's body is a JSON object (readable by any tool, Spark's `from_json` included)::

    {"kind": "sent"|"stored"|"delivered"|"acked", "msg_id", "topic", "queue", "offset",
     "ms": when the step happened (epoch ms: born, stored, handed over, acknowledged),
     "client": the reporting client ("" for stored), "cg": the consumer group or null,
     "group": the Raft group storing the message, "index": its Raft index (stored only,
     else -1), "committed": the consumer offset committed over it (acked by a push or pull
     consumer; -1 for a simple consumer's ack and the other steps)}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from wire.protocol import Code, RequestError

__all__ = ["TRACE_KINDS_IN_ORDER", "TRACE_TOPIC", "TraceRecord", "is_system_topic"]

TRACE_TOPIC = "rmq_sys_trace"
_ENCODER = json.JSONEncoder(separators=(",", ":"))
SYSTEM_PREFIX = "rmq_sys_"
#: The steps of a message's life in their order. Steps are shown in this order, then by
#: time: their times come from different clocks (the producer's, the leader's, the
#: consumers'), so time alone could show a message delivered before it was stored.
TRACE_KINDS_IN_ORDER = ("sent", "stored", "delivered", "acked")


def is_system_topic(topic: str) -> bool:
    """Topics the cluster keeps for itself (the trace topic): hidden from listings."""
    return topic.startswith(SYSTEM_PREFIX)


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One step of one message's life."""

    kind: str
    msg_id: str
    topic: str
    queue: int
    offset: int
    ms: int
    client: str = ""
    cg: str | None = None
    group: str = ""
    index: int = -1
    committed: int = -1

    def encode(self) -> bytes:
        # by hand, not `asdict`: a node encodes one or two of these per traced message
        return _ENCODER.encode({
            "kind": self.kind, "msg_id": self.msg_id, "topic": self.topic,
            "queue": self.queue, "offset": self.offset, "ms": self.ms,
            "client": self.client, "cg": self.cg, "group": self.group, "index": self.index,
            "committed": self.committed}).encode()

    @classmethod
    def decode(cls, body: bytes) -> TraceRecord:
        """A record from a trace message's body; MALFORMED if it is none."""
        try:
            d: Any = json.loads(body)
            rec = cls(**d)
        except (ValueError, TypeError) as exc:
            raise RequestError(Code.MALFORMED, f"not a trace record: {exc}") from None
        if rec.kind not in TRACE_KINDS_IN_ORDER:
            raise RequestError(Code.MALFORMED, f"unknown trace step {rec.kind!r}")
        return rec

    def sort_key(self) -> tuple[int, int]:
        return TRACE_KINDS_IN_ORDER.index(self.kind), self.ms

    def as_row(self) -> dict[str, Any]:
        return asdict(self)
