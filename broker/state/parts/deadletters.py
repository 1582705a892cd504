"""Dead letters: the messages a simple consumer group gave up on, per consumer group.

A message a group's simple consumers failed `max_deliveries` times (its invisible time
ran out each time, or they nacked it), or one a handler declared poison, leaves the
group's in-flight state (`broker.state.parts.receipts`) and lands here, in the same
apply: an entry with a sequence id (unique in this broker group, never reused), the
source topic, queue and offset, the stored record's place (Raft index, start, size, tag
hash, store time: what a read needs to fetch its bytes from the CommitLog), how many
times it was delivered, the last error a consumer gave (bounded) and when it died.

Nothing is copied: the entry points at the record the source queue stored, in this
same Raft group's log. Retention drops an entry whose Raft index fell below the horizon,
as the queues drop their messages. The operator's two records:

* `ResendDead(cg, ids)`: each entry goes back into its source queue as a new message (a
  pointer append, as `broker.state.parts.moves` does), and leaves the dead letters. The
  group's simple consumers get it again (with a fresh delivery count) -- and, as with any
  message appended to a topic, so does every other consumer group of the topic.
* `PurgeDead(cg, ids)`: the entries are dropped.

The dead letters of group `cg` are named `%DLQ%<cg>` in the CLI and the docs, after
RocketMQ's dead-letter topics, but they are no topic: nobody subscribes to them; they are
listed, shown, resent and purged (`raftmq dlq`).

Snapshot section, version 1: {"next": next id, "dead": [[cg, id, topic, queue, offset,
index, start, size, tag_hash, store_ms, deliveries, error, dead_ms], ...]} sorted by
(cg, id).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from broker.state.consumequeue import CQEntry
from broker.state.parts.base import (
    ControlRecord,
    ControlResult,
    Handler,
    Part,
    Refused,
    TopicConfig,
    is_int,
    name_field,
)
from wire.protocol import Code, validate_group_name
from wire.records import RecordRef

__all__ = ["MAX_DEAD_IDS", "MAX_ERROR_CHARS", "DeadLetter", "DeadLetters", "PurgeDead",
           "ResendDead", "dlq_name"]

MAX_DEAD_IDS = 1024  # entries one resend or purge names at most
MAX_ERROR_CHARS = 1024  # the last error a consumer gave, as kept (longer ones are cut)


def dlq_name(cg: str) -> str:
    """What the dead letters of consumer group `cg` are called (RocketMQ's name)."""
    return f"%DLQ%{cg}"


class DeadLetter(NamedTuple):
    """One dead message: where it came from, where its record is, and its history."""

    topic: str
    queue: int
    offset: int  # in the source queue
    index: int  # type: ignore[assignment]  # Raft index of the entry holding the record
    start: int
    size: int
    tag_hash: int
    store_ms: int
    deliveries: int
    error: str  # the last error a consumer gave ("" for none)
    dead_ms: int  # the leader's clock when it died


def _ids(name: str, v: object) -> tuple[int, ...]:
    if (not isinstance(v, tuple) or not 0 < len(v) <= MAX_DEAD_IDS
            or not all(is_int(i) and 0 < i < 1 << 63 for i in v)):
        raise Refused(Code.MALFORMED, f"{name} must be a list of 1-{MAX_DEAD_IDS} dead-letter "
                      f"ids (integers > 0)")
    return v


@dataclass(frozen=True, slots=True)
class ResendDead(ControlRecord):
    """Put dead letters `ids` of consumer group `cg` back into their source queues."""

    op: ClassVar[str] = "dead_resend"
    cg: str
    ids: tuple[int, ...]

    def validate(self) -> None:
        name_field(validate_group_name, self.cg)
        _ids("ids", self.ids)

    def to_map(self) -> dict[str, Any]:
        return {"cg": self.cg, "ids": list(self.ids)}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> ResendDead:
        ids = d.get("ids")
        return cls(d.get("cg"), tuple(ids) if isinstance(ids, list) else ids)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class PurgeDead(ResendDead):
    """Drop dead letters `ids` of consumer group `cg`."""

    op: ClassVar[str] = "dead_purge"


class DeadLetters(Part):
    """cg -> id -> `DeadLetter`, and the next id."""

    name = "deadletters"
    version = 1
    records = (ResendDead, PurgeDead)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.next_id = 1
        self.dead: dict[str, dict[int, DeadLetter]] = {}

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {ResendDead.op: (ResendDead, self._resend),
                PurgeDead.op: (PurgeDead, self._purge)}

    # ------------------------------------------------------------------ apply

    def bury(self, cg: str, topic: str, queue: int, entry: CQEntry, deliveries: int,
             error: str, dead_ms: int) -> int:
        """Keep message `entry` of `topic`/`queue` as a dead letter of `cg` (called by the
        receipts part inside its own apply); returns its id."""
        did = self.next_id
        self.next_id += 1
        self.dead.setdefault(cg, {})[did] = DeadLetter(
            topic, queue, entry.offset, entry.index, entry.start, entry.size, entry.tag_hash,
            entry.store_ms, deliveries, error[:MAX_ERROR_CHARS], dead_ms)
        return did

    def _resend(self, rec: ResendDead, index: int) -> ControlResult:
        """Each entry found goes back into its queue; `items` is (id, new offset) of each
        resent, in id order. Ids not (or no longer) held are skipped."""
        held = self.dead.get(rec.cg, {})
        queues = self.state.queues
        out: list[tuple[int, int]] = []
        skipped = 0
        for did in sorted(set(rec.ids)):
            d = held.get(did)
            if d is None or not queues.hosts(d.topic, d.queue):
                skipped += 1
                continue
            ref = RecordRef(d.start, d.size, "", d.tag_hash)
            out.append((did, queues.append(d.topic, d.queue, d.index, [ref], d.store_ms)))
            del held[did]
        skipped += len(rec.ids) - len(set(rec.ids))
        self._tidy(rec.cg)
        return ControlResult(ResendDead.op, len(out), skipped, items=tuple(out))

    def _purge(self, rec: PurgeDead, index: int) -> ControlResult:
        held = self.dead.get(rec.cg, {})
        gone = [did for did in sorted(set(rec.ids)) if did in held]
        for did in gone:
            del held[did]
        self._tidy(rec.cg)
        return ControlResult(PurgeDead.op, len(gone), len(rec.ids) - len(gone),
                             items=tuple(gone))

    def _tidy(self, cg: str) -> None:
        if cg in self.dead and not self.dead[cg]:
            del self.dead[cg]

    def topic_deleted(self, config: TopicConfig) -> None:
        for cg in list(self.dead):
            held = self.dead[cg]
            for did in [i for i, d in held.items() if d.topic == config.name]:
                del held[did]
            self._tidy(cg)

    def retained(self, min_index: int) -> int:
        for cg in list(self.dead):
            held = self.dead[cg]
            for did in [i for i, d in held.items() if d.index < min_index]:
                del held[did]
            self._tidy(cg)
        return 0

    # ------------------------------------------------------------------ queries

    def of(self, cg: str | None = None) -> Iterator[tuple[str, int, DeadLetter]]:
        """(cg, id, entry) of one consumer group's dead letters (every group's when None),
        by group and id."""
        for g in sorted(self.dead) if cg is None else [cg]:
            for did, d in sorted(self.dead.get(g, {}).items()):
                yield g, did, d

    def get(self, cg: str, did: int) -> DeadLetter | None:
        return self.dead.get(cg, {}).get(did)

    def count(self, cg: str) -> int:
        return len(self.dead.get(cg, {}))

    # ------------------------------------------------------------------ snapshot

    def section(self) -> Any:
        return {"next": self.next_id,
                "dead": [[cg, did, *d] for cg, did, d in self.of()]}

    def load(self, version: int, section: Any) -> None:
        if version != 1:
            raise ValueError(f"unsupported deadletters section version {version!r}")
        self.next_id = int(section["next"])
        for row in section["dead"]:
            cg, did, *rest = row
            d = DeadLetter(*rest)
            if (not isinstance(cg, str) or not is_int(did) or not 0 < did < self.next_id
                    or not isinstance(d.topic, str) or not isinstance(d.error, str)
                    or not all(is_int(x) for x in d[1:9]) or not is_int(d.dead_ms)):
                raise ValueError(f"bad dead letter {row!r}")
            self.dead.setdefault(cg, {})[did] = d

    def check(self) -> None:
        for cg, did, d in self.of():
            if not self.state.queues.hosts(d.topic, d.queue):
                raise ValueError(f"dead letter {did} of {cg!r} names {d.topic}/{d.queue}, "
                                 "which this group does not host")
