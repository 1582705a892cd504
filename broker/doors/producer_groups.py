"""Which producers of each producer group are alive on this node, and how to reach them.

A producer with a check listener (RocketMQ's transaction check-back) sends
PRODUCER_HEARTBEAT (its producer group, its client id, a time to live) to every node
every 10 s. The node keeps the connection's `Caller`, so the leader of a group holding
an undecided half message can ask a live member of its producer group on that very
connection (TX_CHECK). Soft state, never replicated, like the consumer registry: a
restarted node knows the members again after one heartbeat round, and a member whose
connection closed is forgotten at once.

Bounded like the consumer registry: client ids of 1-255 printable characters, at most
`MAX_GROUP_MEMBERS` members per producer group and `MAX_MEMBERS` on the node; a new
member beyond either is refused with BUSY.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from transport.framing import Caller
from wire.protocol import Code, RequestError, validate_client_id

__all__ = ["MAX_GROUP_MEMBERS", "MAX_MEMBERS", "MAX_TTL_MS", "MIN_TTL_MS", "Member",
           "ProducerRegistry"]

MIN_TTL_MS = 100
MAX_TTL_MS = 600_000
MAX_GROUP_MEMBERS = 1_000  # live members of one producer group on one node
MAX_MEMBERS = 100_000  # live members of every producer group together on one node


@dataclass(slots=True)
class Member:
    client: str
    caller: Caller
    expiry: float  # monotonic seconds


class ProducerRegistry:
    """Live members of each producer group, by heartbeat expiry (monotonic seconds)."""

    def __init__(self, *, max_group_members: int = MAX_GROUP_MEMBERS,
                 max_members: int = MAX_MEMBERS) -> None:
        self._groups: dict[str, dict[str, Member]] = {}  # pg -> client -> member
        self._turn = itertools.count()
        self._count = 0  # members of every group
        self.max_group_members = max_group_members
        self.max_members = max_members

    def __len__(self) -> int:
        return self._count

    def heartbeat(self, pg: str, client: str, caller: Caller, ttl_ms: int, now: float) -> None:
        """`client` of `pg`, on the connection of `caller`, is alive until `now` plus
        `ttl_ms` (clamped to a sane range); a newer connection replaces an older one.
        Raises RequestError: MALFORMED for a bad client id, BUSY for a new member over
        the caps."""
        validate_client_id(client)
        ttl = min(max(ttl_ms, MIN_TTL_MS), MAX_TTL_MS)
        group = self._groups.get(pg)
        if group is None or client not in group:
            if group is not None and len(group) >= self.max_group_members:
                self.members(pg, now)  # the expired and disconnected go first
                group = self._groups.get(pg)
                if group is not None and len(group) >= self.max_group_members:
                    raise RequestError(Code.BUSY, f"producer group {pg!r} has "
                                       f"{self.max_group_members} live members on this node, "
                                       "the most it keeps")
            if self._count >= self.max_members:
                for other in list(self._groups):
                    self.members(other, now)
                if self._count >= self.max_members:
                    raise RequestError(Code.BUSY, f"this node keeps at most "
                                       f"{self.max_members} live transaction producers")
            group = self._groups.setdefault(pg, {})
            self._count += 1
        group[client] = Member(client, caller, now + ttl / 1000)

    def members(self, pg: str, now: float) -> list[Member]:
        """The members of `pg` whose heartbeat has not expired and whose connection is
        open, sorted by client id; the others are forgotten."""
        group = self._groups.get(pg, {})
        for client in [c for c, m in group.items() if m.expiry < now or not m.caller.connected]:
            del group[client]
            self._count -= 1
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
        if group is not None and group.pop(client, None) is not None:
            self._count -= 1
            if not group:
                del self._groups[pg]
