"""The internal produce path: a leader-side duty puts a stored message into a queue.

Retries, dead letters and delayed delivery all move a message the group already stores
into another queue of the group (a retry or dead-letter topic, or the topic a delayed
message was meant for). A duty proposes one `MoveMessage` record per message: the source
(topic, queue, offset) and the destination (topic, queue). Applied, the destination
queue gets a pointer to the very record the source holds (its Raft index and place in
that entry, as a committed transaction's messages get theirs): no bytes are copied, and
retention keeps the entry while any queue points at it.

Exactly once across leader changes, as an idempotent producer's sequence numbers make
a retried batch a no-op: a duty moves the messages of one source queue in offset order,
and this part keeps, per (duty, source queue), the offset after the last one moved. A
proposal below it is a duplicate (its result counts it skipped, nothing changes), so a duty
restarted on a new leader at any point may propose again everything its view of the
state shows pending, and whatever an old leader's proposals already moved is moved only
once. Offsets the duty chose to pass over (it may skip) stay passed over.

The destination keeps no key index entry for a moved message (queries by key find it
at its source).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from broker.state.parts.base import (
    ControlRecord,
    ControlResult,
    Handler,
    Part,
    Refused,
    TopicConfig,
    int_field,
    is_int,
    name_field,
)
from wire.protocol import Code, RequestError, validate_client_id, validate_topic_name
from wire.records import RecordRef

__all__ = ["MoveMessage", "Moves"]


@dataclass(frozen=True, slots=True)
class MoveMessage(ControlRecord):
    """Duty `duty` moves message `offset` of `topic`/`queue` into `to_topic`/`to_queue`."""

    op: ClassVar[str] = "move"
    duty: str
    topic: str
    queue: int
    offset: int
    to_topic: str
    to_queue: int

    def validate(self) -> None:
        name_field(validate_client_id, self.duty)
        name_field(validate_topic_name, self.topic)
        name_field(validate_topic_name, self.to_topic)
        int_field("queue", self.queue, 0)
        int_field("offset", self.offset, 0)
        int_field("to_queue", self.to_queue, 0)
        if (self.topic, self.queue) == (self.to_topic, self.to_queue):
            raise Refused(Code.MALFORMED, "a message is moved into another queue")

    def to_map(self) -> dict[str, Any]:
        return {"duty": self.duty, "t": self.topic, "q": self.queue, "o": self.offset,
                "tt": self.to_topic, "tq": self.to_queue}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> MoveMessage:
        return cls(d.get("duty"), d.get("t"), d.get("q"), d.get("o"),  # type: ignore[arg-type]
                   d.get("tt"), d.get("tq"))  # type: ignore[arg-type]


class Moves(Part):
    """Per (duty, source topic, source queue): the offset after the last message moved."""

    name = "moves"
    records = (MoveMessage,)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.moved: dict[tuple[str, str, int], int] = {}

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {MoveMessage.op: (MoveMessage, self._move)}

    def next_to_move(self, duty: str, topic: str, queue: int) -> int:
        """The lowest source offset `duty` may still move out of `topic`/`queue` (the
        duty's own view starts here after a leader change)."""
        return self.moved.get((duty, topic, queue), 0)

    def _move(self, rec: MoveMessage, index: int) -> ControlResult:
        queues = self.state.queues
        for topic, queue in ((rec.topic, rec.queue), (rec.to_topic, rec.to_queue)):
            if not queues.hosts(topic, queue):
                raise Refused(Code.UNKNOWN_QUEUE, f"queue {queue} of {topic!r} is not hosted here")
        key = (rec.duty, rec.topic, rec.queue)
        if rec.offset < self.moved.get(key, 0):
            return ControlResult(MoveMessage.op, 0, 1)  # moved already: nothing changes
        try:
            entry = queues.queue(rec.topic, rec.queue).get(rec.offset)
        except RequestError as exc:
            raise Refused(exc.code, exc.message) from None
        ref = RecordRef(entry.start, entry.size, "", entry.tag_hash)
        queues.append(rec.to_topic, rec.to_queue, entry.index, [ref], entry.store_ms)
        self.moved[key] = rec.offset + 1
        return ControlResult(MoveMessage.op, 1)

    def topic_deleted(self, config: TopicConfig) -> None:
        for key in [k for k in self.moved if k[1] == config.name]:
            del self.moved[key]

    def section(self) -> Any:
        return [[d, t, q, o] for (d, t, q), o in sorted(self.moved.items())]

    def load(self, version: int, section: Any) -> None:
        if not isinstance(section, list):
            raise ValueError("moves section is not a list")
        for item in section:
            if (not isinstance(item, list) or len(item) != 4 or not isinstance(item[0], str)
                    or not isinstance(item[1], str) or not is_int(item[2])
                    or not is_int(item[3])):
                raise ValueError(f"bad moves item {item!r}")
            self.moved[(item[0], item[1], item[2])] = item[3]
