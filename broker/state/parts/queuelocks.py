"""Queue locks: which client of a consumer group may consume a queue now, replicated so a
failover never hands a locked queue to a second client (RocketMQ's broker-held locks of
orderly consumption).

Per (consumer group, topic, queue): (client id, lease expiry ms). A lock is a lease: its
holder renews it before it runs out, and one that runs out frees the queue without
anyone asking (a crashed client's queues pass on after the lease).

Time: records carry the leader's clock (`now_ms`); the part keeps the highest it saw and
uses the later of the two, so its time never goes back across leader changes (a new
leader whose clock is behind cannot revive an expired lease or shorten a live one).

The records:

* `Lock`: each queue of `queues` that is free, whose lease ran out at now, or that the
  client holds already (a renewal) becomes the client's until now + `lease_ms`; the
  others stay their holders'. The result's `items` are the queues the client holds now.
* `Unlock`: each queue of `queues` that the client holds is freed; another's lock is
  left alone. `items`: the queues freed.

Offsets are fenced by the locks (`broker.state.parts.offsets`): a commit for a queue
held by another client's live lease is refused LOCK_LOST. A deleted topic or consumer
group takes its locks with it.

Snapshot section, version 1: {"now": ms, "locks": [[cg, topic, queue, client, expiry],
...]} sorted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

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
from wire.protocol import Code, validate_client_id, validate_group_name, validate_topic_name

__all__ = ["DEFAULT_LEASE_MS", "MAX_LEASE_MS", "MIN_LEASE_MS", "Held", "Lock",
           "QueueLocks", "Unlock"]

#: How long a lock holds without renewal (RocketMQ's 60 s).
DEFAULT_LEASE_MS = 60_000
MIN_LEASE_MS = 100
MAX_LEASE_MS = 3_600_000


class Held(NamedTuple):
    """A queue's lock: its holder and when its lease runs out (the leader's clock)."""

    client: str
    expiry_ms: int


def _queues(v: object) -> tuple[int, ...]:
    if (not isinstance(v, tuple) or not 0 < len(v) <= MAX_QUEUES
            or not all(is_int(q) and 0 <= q < MAX_QUEUES for q in v)
            or len(set(v)) != len(v)):
        raise Refused(Code.MALFORMED, f"queues must be 1-{MAX_QUEUES} distinct queue ids "
                      f"0..{MAX_QUEUES - 1}")
    return v


def _tuple(v: object) -> object:
    return tuple(v) if isinstance(v, list) else v


@dataclass(frozen=True, slots=True)
class Lock(ControlRecord):
    """Client `client` of group `cg` takes (or renews) the locks of `queues` of `topic`
    at the leader's time `now_ms`, each for `lease_ms`."""

    op: ClassVar[str] = "lock"
    cg: str
    topic: str
    queues: tuple[int, ...]
    client: str
    now_ms: int
    lease_ms: int = DEFAULT_LEASE_MS

    def validate(self) -> None:
        name_field(validate_group_name, self.cg)
        name_field(validate_topic_name, self.topic)
        _queues(self.queues)
        name_field(validate_client_id, self.client)
        int_field("now_ms", self.now_ms, 0, (1 << 63) - 1)
        int_field("lease_ms", self.lease_ms, MIN_LEASE_MS, MAX_LEASE_MS)

    def to_map(self) -> dict[str, Any]:
        return {"cg": self.cg, "t": self.topic, "qs": list(self.queues), "c": self.client,
                "now": self.now_ms, "lease": self.lease_ms}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> Lock:
        return cls(d.get("cg"), d.get("t"), _tuple(d.get("qs")),  # type: ignore[arg-type]
                   d.get("c"), d.get("now"), d.get("lease"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Unlock(ControlRecord):
    """Client `client` of group `cg` lets go of the locks it holds of `queues` of `topic`."""

    op: ClassVar[str] = "unlock"
    cg: str
    topic: str
    queues: tuple[int, ...]
    client: str

    def validate(self) -> None:
        name_field(validate_group_name, self.cg)
        name_field(validate_topic_name, self.topic)
        _queues(self.queues)
        name_field(validate_client_id, self.client)

    def to_map(self) -> dict[str, Any]:
        return {"cg": self.cg, "t": self.topic, "qs": list(self.queues), "c": self.client}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> Unlock:
        return cls(d.get("cg"), d.get("t"), _tuple(d.get("qs")),  # type: ignore[arg-type]
                   d.get("c"))  # type: ignore[arg-type]


class QueueLocks(Part):
    """(cg, topic, queue) -> (client, lease expiry); the part's clock."""

    name = "queuelocks"
    version = 1
    records = (Lock, Unlock)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.now_ms = 0  # the highest leader time seen in a record
        self.locks: dict[tuple[str, str, int], Held] = {}

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {Lock.op: (Lock, self._lock), Unlock.op: (Unlock, self._unlock)}

    def _tick(self, now_ms: int) -> int:
        self.now_ms = max(self.now_ms, now_ms)
        return self.now_ms

    def _lock(self, rec: Lock, index: int) -> ControlResult:
        """Queues not hosted here are skipped (they are another group's to lock)."""
        now = self._tick(rec.now_ms)
        held: list[int] = []
        skipped = 0
        for q in rec.queues:
            if not self.state.hosts(rec.topic, q):
                skipped += 1
                continue
            key = (rec.cg, rec.topic, q)
            h = self.locks.get(key)
            if h is None or h.expiry_ms <= now or h.client == rec.client:
                self.locks[key] = Held(rec.client, now + rec.lease_ms)
                held.append(q)
        return ControlResult(Lock.op, len(held), skipped, items=tuple(held))

    def _unlock(self, rec: Unlock, index: int) -> ControlResult:
        freed = []
        for q in rec.queues:
            key = (rec.cg, rec.topic, q)
            h = self.locks.get(key)
            if h is not None and h.client == rec.client:
                del self.locks[key]
                freed.append(q)
        return ControlResult(Unlock.op, len(freed), len(rec.queues) - len(freed),
                             items=tuple(freed))

    # ------------------------------------------------------------------ hooks

    def topic_deleted(self, config: TopicConfig) -> None:
        for key in [k for k in self.locks if k[1] == config.name]:
            del self.locks[key]

    def group_deleted(self, cg: str) -> None:
        """Consumer group `cg` was deleted: its locks go with it."""
        for key in [k for k in self.locks if k[0] == cg]:
            del self.locks[key]

    # ------------------------------------------------------------------ queries

    def holder(self, cg: str, topic: str, queue: int, now_ms: int) -> str | None:
        """Who holds a live lease on the queue at `now_ms` (never earlier than the part's
        own time), or None."""
        h = self.locks.get((cg, topic, queue))
        if h is None or h.expiry_ms <= max(now_ms, self.now_ms):
            return None
        return h.client

    def of_group(self, cg: str | None) -> dict[tuple[str, str, int], Held]:
        """The locks of `cg` (every group's with None), expired ones too, sorted."""
        return {k: v for k, v in sorted(self.locks.items()) if cg is None or k[0] == cg}

    # ------------------------------------------------------------------ snapshot

    def section(self) -> Any:
        return {"now": self.now_ms,
                "locks": [[cg, t, q, h.client, h.expiry_ms]
                          for (cg, t, q), h in sorted(self.locks.items())]}

    def load(self, version: int, section: Any) -> None:
        if version != 1:
            raise ValueError(f"unsupported queuelocks section version {version!r}")
        self.now_ms = int(section["now"])
        for cg, t, q, client, expiry in section["locks"]:
            if not (isinstance(cg, str) and isinstance(t, str) and is_int(q)
                    and isinstance(client, str) and is_int(expiry)):
                raise ValueError(f"bad queue lock {[cg, t, q, client, expiry]!r}")
            self.locks[(cg, t, q)] = Held(client, expiry)

    def check(self) -> None:
        for cg, t, q in self.locks:
            if not self.state.hosts(t, q):
                raise ValueError(f"lock of {cg!r} on {t}/{q}, not hosted here")
