"""Which consumers of each consumer group are alive: the heartbeat registry.

A consumer sends HEARTBEAT (its group, its client id, a time to live) to every node of
the cluster every few seconds; CONSUMERS lists a group's live members on one node, and a
consumer allocates queues (RocketMQ's rebalance) over the union of every node's list.
Membership is soft state on each node, never replicated: a restarted node knows the
members again after one heartbeat round. Queue locks for ordered consumption will live
here too.
"""

from __future__ import annotations

__all__ = ["MAX_TTL_MS", "MIN_TTL_MS", "ConsumerRegistry"]

MIN_TTL_MS = 100
MAX_TTL_MS = 600_000


class ConsumerRegistry:
    """Live members of each consumer group, by heartbeat expiry (monotonic seconds)."""

    def __init__(self) -> None:
        self._expiry: dict[str, dict[str, float]] = {}  # cg -> client -> expiry

    def heartbeat(self, cg: str, client: str, ttl_ms: int, now: float) -> None:
        """`client` of `cg` is alive until `now` plus `ttl_ms` (clamped to a sane range)."""
        ttl = min(max(ttl_ms, MIN_TTL_MS), MAX_TTL_MS)
        self._expiry.setdefault(cg, {})[client] = now + ttl / 1000

    def members(self, cg: str, now: float) -> list[str]:
        """The clients of `cg` whose heartbeat has not expired at `now`, sorted (every
        member allocates from the same list); the expired ones are forgotten."""
        members = self._expiry.get(cg, {})
        for client in [c for c, exp in members.items() if exp < now]:
            del members[client]
        return sorted(members)
