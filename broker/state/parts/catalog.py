"""The topic catalog: which topics this group knows, and which of their queues it hosts.

Creating or deleting a topic is broadcast to every part (`Part.topic_created`,
`Part.topic_deleted`): the queues part opens or drops the ConsumeQueues, the others
forget what hung off a deleted topic, so a re-created topic starts from scratch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from broker.state.parts.base import (
    MAX_QUEUES,
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
from wire.protocol import Code, validate_topic_name

__all__ = ["Catalog", "CreateTopic", "DeleteTopic", "GrowTopic"]


@dataclass(frozen=True, slots=True)
class CreateTopic(ControlRecord):
    """Create `topic` with `queues` in total, `hosted` (sorted, distinct) of them here."""

    op: ClassVar[str] = "create_topic"
    topic: str
    queues: int
    hosted: tuple[int, ...]

    def validate(self) -> None:
        if not isinstance(self.hosted, tuple) or not self.hosted:
            name_field(validate_topic_name, self.topic)
            int_field("queues", self.queues, 1, MAX_QUEUES)
            raise Refused(Code.MALFORMED, "hosted must be a non-empty list of queue ids")
        _check_shape(self.topic, self.queues, self.hosted)

    def to_map(self) -> dict[str, Any]:
        return {"topic": self.topic, "queues": self.queues, "hosted": list(self.hosted)}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> CreateTopic:
        hosted = d.get("hosted")
        if isinstance(hosted, list) and all(is_int(q) for q in hosted):
            hosted = tuple(sorted(hosted))  # any order on the log, as before
        elif isinstance(hosted, list):
            hosted = tuple(hosted)
        return cls(d.get("topic"), d.get("queues"), hosted)  # type: ignore[arg-type]

    def config(self) -> TopicConfig:
        return TopicConfig(self.topic, self.queues, self.hosted)


@dataclass(frozen=True, slots=True)
class GrowTopic(CreateTopic):
    """Give `topic` `queues` in total, `hosted` (sorted, distinct) of them here: a superset
    of what this group hosted (the topic is created here if it had none of its queues).
    Existing queues keep their messages and offsets."""

    op: ClassVar[str] = "grow_topic"

    def validate(self) -> None:
        _check_shape(self.topic, self.queues, self.hosted)


def _check_shape(topic: object, queues: object, hosted: object) -> None:
    """A topic name, a total of queues, and the hosted ids as a sorted tuple of distinct
    queue ids below that total."""
    name_field(validate_topic_name, topic)
    total = int_field("queues", queues, 1, MAX_QUEUES)
    if not isinstance(hosted, tuple) or not all(is_int(q) and 0 <= q < total for q in hosted):
        raise Refused(Code.MALFORMED, f"hosted queue ids must lie in 0..{total - 1}")
    if len(set(hosted)) != len(hosted):
        raise Refused(Code.MALFORMED, "hosted lists a queue twice")
    if list(hosted) != sorted(hosted):
        raise Refused(Code.MALFORMED, "hosted must be sorted")


@dataclass(frozen=True, slots=True)
class DeleteTopic(ControlRecord):
    """Delete `topic` with its queues, consumer offsets, key index and producer state."""

    op: ClassVar[str] = "delete_topic"
    topic: str

    def validate(self) -> None:
        if not isinstance(self.topic, str):
            raise Refused(Code.MALFORMED, "topic must be a string")

    def to_map(self) -> dict[str, Any]:
        return {"topic": self.topic}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> DeleteTopic:
        return cls(d.get("topic"))  # type: ignore[arg-type]


class Catalog(Part):
    """Topics by name."""

    name = "catalog"
    version = 1
    records = (CreateTopic, GrowTopic, DeleteTopic)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.topics: dict[str, TopicConfig] = {}

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {CreateTopic.op: (CreateTopic, self._create),
                GrowTopic.op: (GrowTopic, self._grow),
                DeleteTopic.op: (DeleteTopic, self._delete)}

    def _create(self, rec: CreateTopic, index: int) -> ControlResult:
        config = rec.config()
        existing = self.topics.get(rec.topic)
        if existing is not None:
            if existing == config:
                return ControlResult(CreateTopic.op, 0)
            raise Refused(
                Code.TOPIC_EXISTS,
                f"topic {rec.topic!r} exists with {existing.queues} queues, "
                f"hosting {existing.hosted}",
            )
        self.topics[rec.topic] = config
        self.state.broadcast_topic_created(config)
        return ControlResult(CreateTopic.op, 1)

    def _grow(self, rec: GrowTopic, index: int) -> ControlResult:
        existing = self.topics.get(rec.topic)
        config = TopicConfig(rec.topic, rec.queues, rec.hosted)
        if existing is None:
            if not rec.hosted:
                raise Refused(Code.MALFORMED, "a group new to a topic must host a queue")
            self.topics[rec.topic] = config
            self.state.broadcast_topic_created(config)
            return ControlResult(GrowTopic.op, 1)
        if rec.queues < existing.queues or not set(existing.hosted) <= set(rec.hosted):
            raise Refused(
                Code.MALFORMED,
                f"topic {rec.topic!r} has {existing.queues} queues, hosting {existing.hosted} "
                f"here: queues can only be added",
            )
        if existing == config:
            return ControlResult(GrowTopic.op, 0)
        self.topics[rec.topic] = config
        self.state.broadcast_topic_grown(existing, config)
        return ControlResult(GrowTopic.op, 1)

    def _delete(self, rec: DeleteTopic, index: int) -> ControlResult:
        config = self.topics.pop(rec.topic, None)
        if config is None:
            raise Refused(Code.UNKNOWN_TOPIC, f"topic {rec.topic!r} does not exist in this group")
        self.state.broadcast_topic_deleted(config)
        return ControlResult(DeleteTopic.op, 1)

    # ------------------------------------------------------------------ snapshot

    def section(self) -> Any:
        return [[c.name, c.queues, list(c.hosted)] for _, c in sorted(self.topics.items())]

    def load(self, version: int, section: Any) -> None:
        if version != 1:
            raise ValueError(f"unsupported catalog section version {version!r}")
        for name, total, hosted in section:
            self.topics[name] = TopicConfig(name, total, tuple(hosted))
