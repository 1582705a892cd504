"""Which producers of each producer group are alive on this node, and how to reach them.

A producer with a check listener (RocketMQ's transaction check-back) sends
PRODUCER_HEARTBEAT (its producer group, its client id, a time to live) to every node
every 10 s. The node keeps the connection's `Caller`, so the leader of a group holding
an undecided half message can ask a live member of its producer group on that very
connection (TX_CHECK). Soft state, never replicated, like the consumer registry: a
restarted node knows the members again after one heartbeat round, and a member whose
connection closed is forgotten at once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from transport.framing import Caller

__all__ = ["MAX_TTL_MS", "MIN_TTL_MS", "Member", "ProducerRegistry"]

MIN_TTL_MS = 100
MAX_TTL_MS = 600_000


@dataclass(slots=True)
class Member:
    client: str
    caller: Caller
    expiry: float  # monotonic seconds


class ProducerRegistry:
    """Live members of each producer group, by heartbeat expiry (monotonic seconds)."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, Member]] = {}  # pg -> client -> member
        self._turn = itertools.count()

    def heartbeat(self, pg: str, client: str, caller: Caller, ttl_ms: int, now: float) -> None:
        """`client` of `pg`, on the connection of `caller`, is alive until `now` plus
        `ttl_ms` (clamped to a sane range); a newer connection replaces an older one."""
        ttl = min(max(ttl_ms, MIN_TTL_MS), MAX_TTL_MS)
        self._groups.setdefault(pg, {})[client] = Member(client, caller, now + ttl / 1000)

    def members(self, pg: str, now: float) -> list[Member]:
        """The members of `pg` whose heartbeat has not expired and whose connection is
        open, sorted by client id; the others are forgotten."""
        group = self._groups.get(pg, {})
        for client in [c for c, m in group.items() if m.expiry < now or not m.caller.connected]:
            del group[client]
        if not group:
            self._groups.pop(pg, None)
        return [group[c] for c in sorted(group)]

    def pick(self, pg: str, now: float) -> Member | None:
        """A live member of `pg`, round robin over calls (None when there is none)."""
        live = self.members(pg, now)
        if not live:
            return None
        return live[next(self._turn) % len(live)]

    def forget(self, pg: str, client: str) -> None:
        """Drop one member (its connection failed under a request)."""
        group = self._groups.get(pg)
        if group is not None:
            group.pop(client, None)
