"""Consumer offsets of clustering groups, committed through the log so failover never
rewinds them. Last write wins; offsets of queues not hosted here are skipped.

Consumer group names are the client's choice and every replica keeps their offsets in
memory until the group is deleted, so a broker group keeps offsets of at most
`MAX_CONSUMER_GROUPS` consumer groups: a commit of one more is refused (MALFORMED,
nothing changed) until one is deleted. Committed transactions' offsets are applied
whatever the count (a decided transaction cannot fail).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
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
    name_field,
)
from broker.state.parts.queuelocks import QueueLocks
from wire.protocol import Code, validate_client_id, validate_group_name
from wire.requests import is_offset_item

__all__ = ["MAX_CONSUMER_GROUPS", "CommitOffsets", "DeleteGroup", "Offsets"]

MAX_CONSUMER_GROUPS = 100_000  # consumer groups with committed offsets, per broker group


@dataclass(frozen=True, slots=True)
class CommitOffsets(ControlRecord):
    """Consumer group `cg` has consumed up to `offsets`: ((topic, queue, offset), ...).

    With `now_ms` (the leader's clock when it proposed the commit) the commit is fenced
    by the queue locks (`broker.state.parts.queuelocks`): refused whole, LOCK_LOST, when
    a queue of it is held by a live lease of another client than `client`. Commits
    without it (older entries, transactions' offsets) are not fenced."""

    op: ClassVar[str] = "offsets"
    cg: str
    offsets: tuple[tuple[str, int, int], ...]
    client: str | None = None
    now_ms: int | None = None

    def validate(self) -> None:
        name_field(validate_group_name, self.cg)
        if not isinstance(self.offsets, tuple):
            raise Refused(Code.MALFORMED, "offsets must be a list of [topic, queue, offset]")
        for it in self.offsets:
            if not is_offset_item(it, tuple):  # the rule COMMIT_OFFSET's items pass
                raise Refused(Code.MALFORMED, f"bad offset item {list(it)!r}")
        if self.client is not None:
            name_field(validate_client_id, self.client)
        if self.now_ms is not None:
            int_field("now_ms", self.now_ms, 0, (1 << 63) - 1)

    def to_map(self) -> dict[str, Any]:
        d: dict[str, Any] = {"cg": self.cg, "offsets": [list(it) for it in self.offsets]}
        if self.client is not None:
            d["c"] = self.client
        if self.now_ms is not None:
            d["now"] = self.now_ms
        return d

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> CommitOffsets:
        items = d.get("offsets")
        if isinstance(items, list):
            bad = [it for it in items if not isinstance(it, list)]
            if bad:  # a null item too: it is no offset item either
                name_field(validate_group_name, d.get("cg"))  # the first error, as ever
                raise Refused(Code.MALFORMED, f"bad offset item {bad[0]!r}")
            items = tuple(tuple(it) for it in items)
        return cls(d.get("cg"), items, d.get("c"), d.get("now"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class DeleteGroup(ControlRecord):
    """Forget every offset consumer group `cg` committed in this group."""

    op: ClassVar[str] = "delete_group"
    cg: str

    def validate(self) -> None:
        name_field(validate_group_name, self.cg)

    def to_map(self) -> dict[str, Any]:
        return {"cg": self.cg}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> DeleteGroup:
        return cls(d.get("cg"))  # type: ignore[arg-type]


class Offsets(Part):
    """(cg, topic, queue) -> committed offset."""

    name = "offsets"
    version = 1
    records = (CommitOffsets, DeleteGroup)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.offsets: dict[tuple[str, str, int], int] = {}
        self._groups: Counter[str] = Counter()  # cg -> its (topic, queue) entries

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {CommitOffsets.op: (CommitOffsets, self._commit),
                DeleteGroup.op: (DeleteGroup, self._delete_group)}

    def _delete_group(self, rec: DeleteGroup, index: int) -> ControlResult:
        gone = [k for k in self.offsets if k[0] == rec.cg]
        for k in gone:
            self._drop(k)
        self.state.broadcast_group_deleted(rec.cg)
        return ControlResult(DeleteGroup.op, len(gone))

    def _commit(self, rec: CommitOffsets, index: int) -> ControlResult:
        if rec.cg not in self._groups and len(self._groups) >= MAX_CONSUMER_GROUPS:
            raise Refused(Code.MALFORMED, f"this broker group keeps committed offsets of at "
                          f"most {MAX_CONSUMER_GROUPS} consumer groups: delete unused ones "
                          f"(DELETE_GROUP) before committing for {rec.cg!r}")
        if rec.now_ms is not None:
            self._fence(rec)
        applied, skipped = self.put(rec.cg, rec.offsets)
        return ControlResult(CommitOffsets.op, applied, skipped)

    def _fence(self, rec: CommitOffsets) -> None:
        """Refuse the commit when another client holds a live lock on one of its queues
        (the lock moved on: what the committer handled is the new holder's to commit)."""
        assert rec.now_ms is not None
        locks = self.state.part(QueueLocks)
        for topic, queue, _offset in rec.offsets:
            holder = locks.holder(rec.cg, topic, queue, rec.now_ms)
            if holder is not None and holder != rec.client:
                raise Refused(Code.LOCK_LOST, f"{topic}/{queue} is locked in {rec.cg!r} by "
                              f"client {holder!r}, not {rec.client!r}: its offsets are that "
                              "client's to commit")

    def put(self, cg: str, offsets: Iterable[tuple[str, int, int]]) -> tuple[int, int]:
        """Commit `offsets` [(topic, queue, offset)] of `cg` (last write wins), as an
        `offsets` record does (a committed transaction's offsets come here too); returns
        (applied, skipped: queues not hosted here)."""
        applied = skipped = 0
        for topic, queue, offset in offsets:
            if self.state.hosts(topic, queue):
                if (cg, topic, queue) not in self.offsets:
                    self._groups[cg] += 1
                self.offsets[(cg, topic, queue)] = offset
                applied += 1
            else:
                skipped += 1
        return applied, skipped

    def committed(self, cg: str, topic: str, queue: int) -> int | None:
        return self.offsets.get((cg, topic, queue))

    def of_group(self, cg: str | None) -> dict[tuple[str, str, int], int]:
        return {k: v for k, v in self.offsets.items() if cg is None or k[0] == cg}

    def topic_deleted(self, config: TopicConfig) -> None:
        for k in [k for k in self.offsets if k[1] == config.name]:
            self._drop(k)

    def _drop(self, key: tuple[str, str, int]) -> None:
        del self.offsets[key]
        self._groups[key[0]] -= 1
        if not self._groups[key[0]]:
            del self._groups[key[0]]

    def section(self) -> Any:
        return [[cg, t, q, o] for (cg, t, q), o in sorted(self.offsets.items())]

    def load(self, version: int, section: Any) -> None:
        if version != 1:
            raise ValueError(f"unsupported offsets section version {version!r}")
        for cg, t, q, o in section:
            if (cg, t, q) not in self.offsets:
                self._groups[cg] += 1
            self.offsets[(cg, t, q)] = o
