"""Which consumers of each consumer group are alive: the heartbeat registry.

A consumer sends HEARTBEAT (its group, its client id, a time to live) to every node of
the cluster every few seconds; CONSUMERS lists a group's live members on one node, and a
consumer allocates queues (RocketMQ's rebalance) over the union of every node's list.
Membership is soft state on each node, never replicated: a restarted node knows the
members again after one heartbeat round. Queue locks for ordered consumption will live
here too.

A member learns of a change without polling: CONSUMERS with the list it `known`s and a
`wait_ms` is held until the node's list differs (a new member's first heartbeat, a
leaving one's ttl of 0, an expiry) or the wait ends (`broker.doors.heartbeats`; this registry says
when the next expiry is due).

A consumer with manual assignment (a pull consumer: it reads the queues it chose)
heartbeats with `manual`: it is a live member for whoever asks (an offset reset refuses
while it runs) but not one a rebalance shares queues with (`members` leaves it out,
`manual_members` lists it).

What a client chooses is bounded, since the node keeps it for up to `MAX_TTL_MS`: a
client id is 1-255 printable characters (`wire.protocol.validate_client_id`), a group
has at most `MAX_GROUP_MEMBERS` live members and the node at most `MAX_MEMBERS` in all;
a new member beyond either is refused with BUSY (members already known keep beating).
"""

from __future__ import annotations

from wire.protocol import Code, RequestError, validate_client_id

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
        self._manual: dict[str, set[str]] = {}  # cg -> its members with manual assignment
        self._count = 0  # members of every group
        self.max_group_members = max_group_members
        self.max_members = max_members

    def __len__(self) -> int:
        return self._count

    def heartbeat(self, cg: str, client: str, ttl_ms: int, now: float, *,
                  manual: bool = False) -> None:
        """`client` of `cg` is alive until `now` plus `ttl_ms` (clamped to a sane range).
        Raises RequestError: MALFORMED for a bad client id, BUSY for a new member over
        the caps."""
        validate_client_id(client)
        if ttl_ms == 0:  # leaving: gone at once, so the others rebalance now
            self.leave(cg, client)
            return
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
        if manual:
            self._manual.setdefault(cg, set()).add(client)
        elif cg in self._manual:
            self._forget_manual(cg, client)

    def _forget_manual(self, cg: str, client: str) -> None:
        manual = self._manual.get(cg)
        if manual is not None:
            manual.discard(client)
            if not manual:
                del self._manual[cg]

    def members(self, cg: str, now: float) -> list[str]:
        """The clients of `cg` whose heartbeat has not expired at `now` and that take
        part in rebalances, sorted (every member allocates from the same list); the
        expired ones are forgotten."""
        live = self._live(cg, now)
        manual = self._manual.get(cg, ())
        return sorted(c for c in live if c not in manual)

    def manual_members(self, cg: str, now: float) -> list[str]:
        """The live clients of `cg` with manual assignment, sorted."""
        self._live(cg, now)
        return sorted(self._manual.get(cg, ()))

    def _live(self, cg: str, now: float) -> dict[str, float]:
        members = self._expiry.get(cg, {})
        for client in [c for c, exp in members.items() if exp < now]:
            del members[client]
            self._count -= 1
            self._forget_manual(cg, client)
        if not members:
            self._expiry.pop(cg, None)
        return members

    def leave(self, cg: str, client: str) -> None:
        """`client` left `cg` (a last heartbeat with a ttl of 0)."""
        members = self._expiry.get(cg)
        if members is not None and members.pop(client, None) is not None:
            self._count -= 1
            self._forget_manual(cg, client)
            if not members:
                del self._expiry[cg]

    def next_expiry(self, cg: str) -> float | None:
        """When the first live member of `cg` expires, if it has any."""
        members = self._expiry.get(cg)
        return min(members.values()) if members else None

    def _sweep(self, now: float) -> None:
        for cg in list(self._expiry):
            self.members(cg, now)
