"""Queue locks of orderly consumption: LOCK, UNLOCK and LOCKS.

Locks are replicated state (`broker.state.parts.queuelocks`): a LOCK or UNLOCK is a
record in the log of the group hosting the queues, with the leader's clock in it, so a
failover never hands a locked queue to a second client and a lease runs out by the same
clock on every replica. A request naming queues of several groups is split, one record
per group. LOCK and UNLOCK need no request id: taking a lock one holds renews it, and
letting go of one not held changes nothing, so a retry is harmless as it is.

LOCKS answers the locks held by the groups this node leads, after a barrier each (as
OFFSETS does), with whether each lease is live by this node's clock.
"""

from __future__ import annotations

from typing import Any

from broker.config import NodeConfig
from broker.doors.base import Handler, QueueHosts, Response, check_queue
from broker.doors.simple import now_ms
from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead, checked
from broker.state.parts.queuelocks import Lock, Unlock
from raftlog.runtime import GroupRuntime, NotLeader
from transport.framing import Caller
from wire.protocol import Op, ok_header
from wire.requests import (
    LockAnswer,
    LockRequest,
    LocksAnswer,
    LocksRequest,
    UnlockAnswer,
    UnlockRequest,
)

__all__ = ["LockDoor"]


class LockDoor:
    """The queue lock requests of one node."""

    def __init__(self, lead: GroupLead, groups: GroupRegistry, hosts: QueueHosts,
                 config: NodeConfig) -> None:
        self.lead = lead
        self.groups = groups
        self.hosts = hosts
        self.config = config

    def handlers(self) -> dict[int, Handler]:
        return {Op.LOCK: self._lock, Op.UNLOCK: self._unlock, Op.LOCKS: self._locks}

    async def _by_group(self, topic: str, queues: tuple[int, ...], gid: str | None
                        ) -> list[tuple[GroupRuntime, tuple[int, ...]]]:
        """The led groups hosting `queues` (writes: no barrier), each with its queues."""
        found: dict[str, tuple[GroupRuntime, list[int]]] = {}
        for q in queues:
            g = await self.hosts.led_group(topic, check_queue(q), gid, confirm=False)
            found.setdefault(g.group_id, (g, []))[1].append(q)
        return [(g, tuple(qs)) for g, qs in found.values()]

    async def _lock(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = LockRequest.decode(h)
        lease = self.config.queue_lock_lease_ms if req.lease_ms is None else req.lease_ms
        now = now_ms()
        checked(Lock, req.cg, req.topic, req.queues, req.client, now, lease)  # bad fields
        held: list[int] = []
        for g, qs in await self._by_group(req.topic, req.queues, req.g):
            result = await self.lead.propose(
                g, checked(Lock, req.cg, req.topic, qs, req.client, now, lease))
            held += result.items
        answer = LockAnswer(held=tuple(sorted(held)), expiry_ms=now + lease, lease_ms=lease)
        return ok_header(0, **answer.header()), b""

    async def _unlock(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = UnlockRequest.decode(h)
        checked(Unlock, req.cg, req.topic, req.queues, req.client)
        freed: list[int] = []
        for g, qs in await self._by_group(req.topic, req.queues, req.g):
            result = await self.lead.propose(g, checked(Unlock, req.cg, req.topic, qs,
                                                        req.client))
            freed += result.items
        return ok_header(0, **UnlockAnswer(freed=tuple(sorted(freed))).header()), b""

    async def _locks(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        only = LocksRequest.decode(h).cg
        rows: list[tuple[Any, ...]] = []
        led: list[str] = []
        for gid, g in list(self.groups.items()):
            if not g.is_leader:
                continue
            try:
                await g.read_barrier()
            except NotLeader:
                continue
            led.append(gid)
            locks = self.groups.states[gid].queuelocks
            now = now_ms()
            for (cg, topic, queue), held in locks.of_group(only).items():
                live = locks.holder(cg, topic, queue, now) is not None
                rows.append((gid, cg, topic, queue, held.client, held.expiry_ms, live))
        return ok_header(0, **LocksAnswer(rows=tuple(rows), led=tuple(led)).header()), b""
