"""Which consumers of each consumer group are alive: the heartbeat registry.

A consumer sends HEARTBEAT (its group, its client id, a time to live) to every node of
the cluster every few seconds; CONSUMERS lists a group's live members on one node, and a
consumer allocates queues (RocketMQ's rebalance) over the union of every node's list.
Membership is soft state on each node, never replicated: a restarted node knows the
members again after one heartbeat round. Queue locks for ordered consumption will live
here too.

What a client chooses is bounded, since the node keeps it for up to `MAX_TTL_MS`: a
client id is 1-255 printable characters (`broker.protocol.validate_client_id`), a group
has at most `MAX_GROUP_MEMBERS` live members and the node at most `MAX_MEMBERS` in all;
a new member beyond either is refused with BUSY (members already known keep beating).
"""

from __future__ import annotations

from broker.protocol import Code, RequestError, validate_client_id

__all__ = ["MAX_GROUP_MEMBERS", "MAX_MEMBERS", "MAX_TTL_MS", "MIN_TTL_MS", "ConsumerRegistry"]

MIN_TTL_MS = 100
MAX_TTL_MS = 600_000
MAX_GROUP_MEMBERS = 1_000  # live members of one consumer group on one node
MAX_MEMBERS = 100_000  # live members of every group together on one node


class ConsumerRegistry:
    """Live members of each consumer group, by heartbeat expiry (monotonic seconds)."""

    def __init__(self, *, max_group_members: int = MAX_GROUP_MEMBERS,
                 max_members: int = MAX_MEMBERS) -> None:
        self._expiry: dict[str, dict[str, float]] = {}  # cg -> client -> expiry
        self._count = 0  # members of every group
        self.max_group_members = max_group_members
        self.max_members = max_members

    def __len__(self) -> int:
        return self._count

    def heartbeat(self, cg: str, client: str, ttl_ms: int, now: float) -> None:
        """`client` of `cg` is alive until `now` plus `ttl_ms` (clamped to a sane range).
        Raises RequestError: MALFORMED for a bad client id, BUSY for a new member over
        the caps."""
        validate_client_id(client)
        ttl = min(max(ttl_ms, MIN_TTL_MS), MAX_TTL_MS)
        members = self._expiry.get(cg)
        if members is None or client not in members:
            if members is not None and len(members) >= self.max_group_members:
                self.members(cg, now)  # the expired go first
                members = self._expiry.get(cg)
                if members is not None and len(members) >= self.max_group_members:
                    raise RequestError(Code.BUSY, f"consumer group {cg!r} has "
                                       f"{self.max_group_members} live members on this node, "
                                       "the most it keeps")
            if self._count >= self.max_members:
                self._sweep(now)
                if self._count >= self.max_members:
                    raise RequestError(Code.BUSY, f"this node keeps at most "
                                       f"{self.max_members} live consumers")
            members = self._expiry.setdefault(cg, {})
            self._count += 1
        members[client] = now + ttl / 1000

    def members(self, cg: str, now: float) -> list[str]:
        """The clients of `cg` whose heartbeat has not expired at `now`, sorted (every
        member allocates from the same list); the expired ones are forgotten."""
        members = self._expiry.get(cg, {})
        for client in [c for c, exp in members.items() if exp < now]:
            del members[client]
            self._count -= 1
        if not members:
            self._expiry.pop(cg, None)
        return sorted(members)

    def _sweep(self, now: float) -> None:
        for cg in list(self._expiry):
            self.members(cg, now)
