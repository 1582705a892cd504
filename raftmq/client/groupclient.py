"""What the pull and push consumers share: the client id, the routes, and membership in
a consumer group (heartbeats, the members' list, the queues allocated to this member).
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc

from transport.connection import ClientClosedError, ConnectionPool
from wire.protocol import MAX_CLIENT_CHARS, RequestError
from wire.requests import ConsumersAnswer, ConsumersRequest, HeartbeatRequest

from .errors import close_stack
from .lifecycle import StartClose
from .routes import Routes, backoff_delay, node_addresses, normalize_addresses, open_routes
from .trace import Tracer

log = logging.getLogger("raftmq.client.consumer")

MEMBERS_WAIT_MS = 20_000  # how long a node holds a CONSUMERS request with nothing new


def default_client_id() -> str:
    """Unique per consumer instance, readable in CONSUMERS answers: host@pid@random."""
    return f"{socket.gethostname()[:200]}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def checked_client_id(client_id: str | None) -> str:
    """`client_id`, or a unique one when None; ValueError for one the nodes would refuse
    (MALFORMED), said before anything starts."""
    client_id = client_id or default_client_id()
    if not (len(client_id) <= MAX_CLIENT_CHARS and client_id.isprintable()):
        raise ValueError(f"client_id must be 1-{MAX_CLIENT_CHARS} printable characters")
    return client_id


def check_isolation(isolation: str) -> str:
    """Consumers read committed data only: a transaction's messages reach a queue when
    it commits (and never when it aborts), so there is nothing else to read."""
    if isolation != "read_committed":
        raise ValueError(
            f"isolation={isolation!r} is not supported: consumers read committed messages "
            "only ('read_committed'); prepared transactional messages are not in any queue "
            "until their transaction commits")
    return isolation


class ClientBase(StartClose):
    """Owns a connection pool (unless given one), route cache and task group; open it
    with `async with` or `start()`/`close()`."""

    def __init__(
        self, namesrv: Sequence[str] | str, pool: ConnectionPool | None, timeout: float
    ) -> None:
        self.namesrv = normalize_addresses(namesrv)
        self.timeout = timeout
        self._pool = pool
        self._routes: Routes | None = None
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False
        self.tracer: Tracer | None = None  # message trace, when a subclass turns it on

    async def _open(self) -> None:
        if self._stack is not None:
            raise RuntimeError(f"a {type(self).__name__} can be entered once")
        self._stack, self._routes, self._tg = await open_routes(
            self._pool, self.namesrv, self.timeout
        )
        if self.tracer is not None:
            self.tracer.start(self._routes, self._tg)

    async def _close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._stack is not None and self._tg is not None
        if self.tracer is not None and not self._closed:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeout):
                await self.tracer.flush()  # the last steps, before the connections close
        self._closed = True
        self._tg.cancel_scope.cancel()
        return await close_stack(self._stack, exc)

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._close(exc_type, exc, tb)

    @property
    def routes(self) -> Routes:
        if self._routes is None or self._closed:
            raise ClientClosedError(f"the {type(self).__name__} is not open (use `async with`)")
        return self._routes


class Heartbeats:
    """One group member's heartbeats, each to every node of the cluster, with the rule
    that nothing follows the leave.

    A beat still on its way when the member leaves could reach a node after the leaving
    beat (a node handles a connection's requests concurrently) and make the member a
    member again until its ttl ran out: its group would wait for it (a rebalance, an
    offset reset). So beats do not overlap (a lock), a beat in flight is not cancelled
    midway (it finishes or times out), and once the leave started no beat is sent.
    """

    def __init__(self) -> None:
        self._lock = anyio.Lock()
        self._left = False

    async def beat(self, routes: Routes, beat: HeartbeatRequest, timeout: float) -> None:
        """One heartbeat (a failure is only logged: the next beat tries again, and the
        ttl covers three of them)."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout):
            async with self._lock:
                if not self._left:
                    await _to_every_node(routes, beat, timeout)

    async def leave(self, routes: Routes, beat: HeartbeatRequest, timeout: float) -> None:
        """The last heartbeat, with a ttl of 0: the member is gone at once, not at its
        expiry. Waits for a beat in flight first."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(2 * timeout):
            async with self._lock:
                self._left = True
                await _to_every_node(routes, replace(beat, ttl_ms=0), timeout)


async def _to_every_node(routes: Routes, beat: HeartbeatRequest, timeout: float) -> None:
    try:
        cluster = await routes.cluster()
    except RequestError as exc:
        log.debug("heartbeat: no cluster view (%s)", exc)
        return
    header = beat.header()

    async def one(addr: str) -> None:
        try:
            await routes.pool.request(addr, beat.OP, header, timeout=timeout)
        except RequestError as exc:
            log.debug("heartbeat to %s failed: %s", addr, exc)

    async with anyio.create_task_group() as tg:
        for addr in node_addresses(cluster):
            tg.start_soon(one, addr)


QueuesCallback = Callable[[list[tuple[str, int]]], Any]
"""`on_assign` / `on_revoke`: called with the (topic, queue) pairs gained or given up."""


async def call_back(fn: QueuesCallback | None, queues: list[tuple[str, int]]) -> None:
    """Run a rebalance callback to completion: awaited when async, in a worker thread
    when plain (so it may make a blocking client's calls, which need the loop free)."""
    if fn is None:
        return
    if is_async_callable(fn):
        await fn(list(queues))
    else:
        await anyio.to_thread.run_sync(fn, list(queues))


class GroupClient(ClientBase):
    """What a consumer sharing its group's queues with others needs: the group's live
    members, and a watch that sets `_members_changed` as soon as a node says they
    changed. Subclasses set `group`, `client_id` and `rebalance_interval`."""

    group: str
    client_id: str
    rebalance_interval: float
    _allocate: Callable[..., list[Any]]

    def __init__(
        self, namesrv: Sequence[str] | str, pool: ConnectionPool | None, timeout: float
    ) -> None:
        super().__init__(namesrv, pool, timeout)
        self._beats = Heartbeats()
        self._members_changed: anyio.Event | NeverSet = NeverSet()  # an Event once running

    async def _watch_members(self, tg: anyio.abc.TaskGroup) -> None:
        """Keep one `_watch_node` per node of the cluster (nodes added later too)."""
        watched: set[str] = set()
        while True:
            try:
                for addr in node_addresses(await self.routes.cluster()):
                    if addr not in watched:
                        watched.add(addr)
                        tg.start_soon(self._watch_node, addr)
            except RequestError as exc:
                log.debug("%s: no cluster view to watch (%s)", self.client_id, exc)
            await anyio.sleep(self.rebalance_interval)

    async def _watch_node(self, addr: str) -> None:
        """Hold a CONSUMERS request at `addr` that the node answers when the group's
        members differ from what this client saw there (a join, a leave, an expiry):
        the rebalance follows at once, instead of at the next `rebalance_interval`."""
        known: list[str] | None = None
        failures = 0
        while True:
            asked = anyio.current_time()
            req = ConsumersRequest(cg=self.group, known=tuple(known or ()),
                                   wait_ms=MEMBERS_WAIT_MS)
            try:
                frame = await self.routes.pool.request(
                    addr, req.OP, req.header(), timeout=self.timeout + MEMBERS_WAIT_MS / 1000)
                members = list(ConsumersAnswer.decode(frame.header).clients)
            except RequestError as exc:
                failures += 1
                log.debug("%s: watching members at %s: %s", self.client_id, addr, exc)
                await anyio.sleep(backoff_delay(failures, base=0.1, cap=5.0))
                continue
            failures = 0
            if known is not None and members != known:
                self._members_changed.set()
            elif known is not None and anyio.current_time() - asked < MEMBERS_WAIT_MS / 10_000:
                await anyio.sleep(1.0)  # answered at once with nothing new: do not spin
            known = members

    async def _desired(
        self, topics: Iterable[str], clients: list[str], *, share: bool = True
    ) -> tuple[set[tuple[str, int]], set[str]]:
        """This member's share of `topics`' queues among `clients` (every queue without
        `share`: broadcast), and the topics whose route was known: a topic without one
        says nothing of the queues held of it."""
        desired: set[tuple[str, int]] = set()
        known: set[str] = set()
        for topic in sorted(topics):
            try:
                route = await self.routes.route(topic)
            except RequestError as exc:
                log.warning("%s: no route for %s (%s)", self.client_id, topic, exc)
                continue
            known.add(topic)
            queues = list(range(route.total))
            mine = self._allocate(queues, clients, self.client_id) if share else queues
            desired.update((topic, q) for q in mine)
        return desired, known

    async def clients(self) -> list[str]:
        """The group's live consumers: the union of what every reachable node has seen,
        plus this one (its heartbeat may not have arrived everywhere yet)."""
        cluster = await self.routes.cluster()
        seen: set[str] = {self.client_id}
        pool = self.routes.pool
        req = ConsumersRequest(cg=self.group)

        async def one(addr: str) -> None:
            try:
                frame = await pool.request(addr, req.OP, req.header(), timeout=self.timeout)
                answer = ConsumersAnswer.decode(frame.header)
            except RequestError as exc:
                log.debug("CONSUMERS from %s failed: %s", addr, exc)
                return
            seen.update(answer.clients)

        async with anyio.create_task_group() as tg:
            for addr in node_addresses(cluster):
                tg.start_soon(one, addr)
        return sorted(seen)


# ---------------------------------------------------------------- pull consumer


class NeverSet:
    """Stands for an event before there is an event loop to make one in."""

    def set(self) -> None:
        pass

    def is_set(self) -> bool:
        return False


def is_async_callable(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
