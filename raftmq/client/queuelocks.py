"""Queue locks held by the broker (orderly consumption): take, renew and release the
locks of a consumer group's queues, and list who holds what.

A lock is a lease the queue's group keeps in its replicated state (`LOCK`, `UNLOCK`,
`LOCKS`); a consumer takes the lock of a queue before it reads it and lets go only after
it committed what it handled, so two consumers of a group never handle one queue at one
time, whatever a rebalance or a failover does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import anyio

from transport.connection import is_retriable
from wire.protocol import Op, RequestError, validate_group_name
from wire.requests import (
    LockAnswer,
    LockRequest,
    LocksAnswer,
    LocksRequest,
    UnlockAnswer,
    UnlockRequest,
)

from .routes import Routes, node_addresses

__all__ = ["QueueLock", "group_locks", "held_by", "lock_queue", "unlock_queue"]


@dataclass(frozen=True, slots=True)
class QueueLock:
    """One queue's lock as its group's leader holds it: the client, when its lease runs
    out (the leader's clock, ms since the epoch), and whether it is live now."""

    group: str
    cg: str
    topic: str
    queue: int
    client: str
    expiry_ms: int
    live: bool

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "consumer_group": self.cg, "topic": self.topic,
                "queue": self.queue, "client": self.client, "expiry_ms": self.expiry_ms,
                "live": self.live}


async def lock_queue(routes: Routes, cg: str, topic: str, queue: int, client: str,
                     lease_ms: int | None = None) -> int | None:
    """Take (or renew) the lock of one queue for `client`; the lease's expiry (the
    leader's clock) when held, None when another client holds it."""
    _, frame = await routes.call_queue(
        topic, queue, Op.LOCK,
        lambda g: LockRequest(cg=cg, topic=topic, queues=(queue,), client=client,
                              lease_ms=lease_ms, g=g).header(), write=True)
    answer = LockAnswer.decode(frame.header)
    return answer.expiry_ms if queue in answer.held else None


async def unlock_queue(routes: Routes, cg: str, topic: str, queue: int, client: str) -> bool:
    """Let go of one queue's lock if `client` holds it; whether it did."""
    _, frame = await routes.call_queue(
        topic, queue, Op.UNLOCK,
        lambda g: UnlockRequest(cg=cg, topic=topic, queues=(queue,), client=client,
                                g=g).header(), write=True)
    return queue in UnlockAnswer.decode(frame.header).freed


async def group_locks(routes: Routes, cg: str | None = None, *,
                      wait: float = 5.0) -> list[QueueLock]:
    """Every queue lock (of `cg`, or of every consumer group) the groups' leaders hold,
    asking every node: each answers for the groups it leads. Asked again for up to
    `wait` seconds while a group has no leader that answered."""
    if cg is not None:
        validate_group_name(cg)
    req = LocksRequest(cg=cg)
    deadline = anyio.current_time() + wait
    while True:
        cluster = await routes.cluster()
        groups = set((cluster.get("groups") or {}).keys())
        rows: dict[str, list[QueueLock]] = {}
        errors: list[RequestError] = []
        async with anyio.create_task_group() as tg:
            for addr in node_addresses(cluster):
                tg.start_soon(_ask_node, routes, addr, req, rows, errors)
        for exc in errors:
            if not is_retriable(exc):
                raise exc
        if set(rows) >= groups or anyio.current_time() >= deadline:
            return sorted((lk for found in rows.values() for lk in found),
                          key=lambda lk: (lk.cg, lk.topic, lk.queue))
        await anyio.sleep(0.2)


async def _ask_node(routes: Routes, addr: str, req: LocksRequest,
                    rows: dict[str, list[QueueLock]], errors: list[RequestError]) -> None:
    """LOCKS at one node: its rows, by the groups it leads, into `rows`."""
    try:
        frame = await routes.pool.request(addr, req.OP, req.header(), timeout=routes.timeout)
    except RequestError as exc:
        errors.append(exc)
        return
    answer = LocksAnswer.decode(frame.header)
    for gid in answer.led:
        rows[gid] = [QueueLock(*r) for r in answer.rows if r[0] == gid]


def held_by(locks: Iterable[QueueLock], client: str) -> list[tuple[str, int]]:
    """The (topic, queue) pairs `client` holds a live lock of."""
    return sorted((lk.topic, lk.queue) for lk in locks if lk.live and lk.client == client)
