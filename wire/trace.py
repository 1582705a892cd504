"""Trace records: what the trace topic holds about traced messages, keyed by message id
(so the key index finds one message's records) and tagged by their first step.

One record holds the steps of one message that one report brought: a producer's report
gives each message one record with two steps (sent, and stored, which the node adds from
its own state), a consumer's one record with the steps it reported for that message
(delivered, acked, or both). A record's body is a JSON object (readable by any tool,
Spark's `from_json` included)::

    {"msg_id", "topic", "queue", "offset", "group": the Raft group storing the message,
     "steps": [{"kind": "sent"|"stored"|"delivered"|"acked",
                "ms": when (epoch ms: born, stored, handed over, acknowledged),
                "client": the reporting client ("" for stored),
                "cg": the consumer group or null,
                "index": the message's Raft index (stored only, else -1),
                "committed": the consumer offset committed over it (acked by a push or
                             pull consumer; -1 for a simple consumer's ack and the other
                             steps)}, ...]}

Readers see one `TraceRecord` per step (`decode_steps`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from wire.protocol import Code, RequestError

__all__ = ["TRACE_KINDS_IN_ORDER", "TRACE_TOPIC", "TraceRecord", "decode_steps",
           "encode_steps", "is_system_topic"]

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

    def sort_key(self) -> tuple[int, int]:
        return TRACE_KINDS_IN_ORDER.index(self.kind), self.ms

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def encode_steps(steps: Sequence[TraceRecord]) -> bytes:
    """The body of one record: `steps`, all of one message (the first one's)."""
    first = steps[0]
    # by hand, not `asdict`: a node encodes one of these per traced message and report
    return _ENCODER.encode({
        "msg_id": first.msg_id, "topic": first.topic, "queue": first.queue,
        "offset": first.offset, "group": first.group,
        "steps": [{"kind": s.kind, "ms": s.ms, "client": s.client, "cg": s.cg,
                   "index": s.index, "committed": s.committed} for s in steps]}).encode()


def decode_steps(body: bytes) -> list[TraceRecord]:
    """The steps a record's body holds; MALFORMED if it is no trace record."""
    try:
        d: Any = json.loads(body)
        where = (d["msg_id"], d["topic"], d["queue"], d["offset"])
        out = [TraceRecord(s["kind"], *where, s["ms"], client=s["client"], cg=s["cg"],
                           group=d["group"], index=s["index"], committed=s["committed"])
               for s in d["steps"]]
    except (ValueError, TypeError, KeyError) as exc:
        raise RequestError(Code.MALFORMED, f"not a trace record: {exc!r}") from None
    for rec in out:
        if rec.kind not in TRACE_KINDS_IN_ORDER:
            raise RequestError(Code.MALFORMED, f"unknown trace step {rec.kind!r}")
    return out
