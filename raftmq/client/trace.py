"""Message trace on the client: a traced producer or consumer reports what it did with
each message, batched, to the node that stores the message (TRACE).

Tracing is off unless asked for (`trace=True`). Events are buffered per (group, topic)
and leave in one request per batch, at most `TRACE_INTERVAL` seconds after they happened
or as soon as `TRACE_BATCH` of them wait, from a task of the client's own: a traced send
or read never waits for its trace. A report that fails is dropped and counted
(`Tracer.dropped`): the trace is evidence about messages, never a reason for a message's
send or read to fail. The node writes the records (`broker.doors.trace`), so a record
says which message (by id) and, for a sent one, where it was stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import anyio
import anyio.abc

from raftmq.client.routes import Routes
from wire.protocol import RequestError
from wire.records import Message, parse_message_id
from wire.requests import TraceAnswer, TraceRequest
from wire.requests.trace import MAX_TRACE_EVENTS, TraceEvent

__all__ = ["TRACE_BATCH", "TRACE_INTERVAL", "Tracer", "now_ms"]

log = logging.getLogger(__name__)

TRACE_BATCH = 512  # events that make a report leave at once
TRACE_INTERVAL = 0.2  # seconds an event waits at most before it is reported
MAX_WAITING = 100_000  # events held at most; past it new ones are dropped (and counted)
MAX_UNACKED = 10_000  # deliveries per queue remembered until a commit covers them


def now_ms() -> int:
    return int(time.time() * 1000)


class Tracer:
    """The trace reports of one client (a producer, or a consumer of group `cg`)."""

    def __init__(self, role: str, client: str, cg: str | None = None, *,
                 commits: bool = False) -> None:
        self.role = role
        self.client = client
        self.cg = cg
        self.written = 0  # records the nodes wrote for this client's reports
        self.dropped = 0  # events lost: reports that failed, or a full buffer
        self.missing = 0  # events the node found no message for
        self._waiting: dict[tuple[str, str], list[TraceEvent]] = {}
        self._count = 0
        self._routes: Routes | None = None
        self._wakeup: anyio.Event | None = None
        self._groups: list[str] = []  # the cluster's groups, sorted (the trace queues' order)
        self._out = 0  # flushes whose reports are not all answered yet
        self._settled: anyio.Event | None = None  # set (and replaced) when none is left
        # a committing consumer's delivered messages not yet covered by a commit:
        # (topic, queue) -> offset -> group
        self._unacked: dict[tuple[str, int], dict[int, str]] | None = {} if commits else None

    def start(self, routes: Routes, tg: anyio.abc.TaskGroup) -> None:
        """Report from a task of `tg` until it is cancelled."""
        self._routes = routes
        self._wakeup = anyio.Event()
        self._settled = anyio.Event()
        tg.start_soon(self._run)

    def add(self, group: str, topic: str, kind: str, queue: int, offset: int, ms: int,
            committed: int = -1) -> None:
        """One event about message `offset` of `topic`/`queue`, stored in `group`."""
        if self._count >= MAX_WAITING:
            self.dropped += 1
            return
        self._waiting.setdefault((group, topic), []).append((kind, queue, offset, ms, committed))
        self._count += 1
        if self._count >= TRACE_BATCH and self._wakeup is not None:
            self._wakeup.set()

    def add_many(self, group: str, topic: str, kind: str,
                 items: Iterable[tuple[int, int]], ms: int, committed: int = -1) -> None:
        """Events of one kind at one time: (queue, offset) pairs."""
        for queue, offset in items:
            self.add(group, topic, kind, queue, offset, ms, committed)

    # ------------------------------------------------------------ a consumer's steps

    def delivered(self, msgs: Iterable[Message]) -> None:
        """Messages handed to the application now; a consumer committing offsets
        (`committed`) reports each acked once an offset commit covers it."""
        ms = now_ms()
        for m in msgs:
            group = _group_of(m)
            if group is None:
                continue
            self.add(group, m.topic, "delivered", m.queue, m.offset, ms)
            if self._unacked is not None:
                held = self._unacked.setdefault((m.topic, m.queue), {})
                if len(held) >= MAX_UNACKED:  # a queue never committed (or revoked):
                    del held[next(iter(held))]  # its oldest delivery goes unreported
                held[m.offset] = group

    def committed(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """The group's offsets committed now (the next offset to read, per queue): every
        message delivered below one is acked."""
        if self._unacked is None:
            return
        ms = now_ms()
        for (topic, queue), offset in offsets.items():
            held = self._unacked.get((topic, queue))
            if not held:
                continue
            for o in [o for o in held if o < offset]:
                self.add(held.pop(o), topic, "acked", queue, o, ms, offset)

    def acked(self, group: str, topic: str, queue: int, offset: int) -> None:
        """A simple consumer's ack of one message, committed."""
        self.add(group, topic, "acked", queue, offset, now_ms())

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            with anyio.move_on_after(TRACE_INTERVAL):
                await self._wakeup.wait()
            self._wakeup = anyio.Event()
            await self.flush()

    async def flush(self) -> None:
        """Report everything waiting now (each (group, topic) in requests of at most
        `MAX_TRACE_EVENTS` events, at once), and wait for the reports already out."""
        if self._routes is None or self._settled is None:
            return
        waiting, self._waiting, self._count = self._waiting, {}, 0
        self._out += 1
        try:
            async with anyio.create_task_group() as tg:
                for (group, topic), events in waiting.items():
                    for i in range(0, len(events), MAX_TRACE_EVENTS):
                        tg.start_soon(self._report, group, topic,
                                      events[i:i + MAX_TRACE_EVENTS])
        finally:
            self._out -= 1
            if not self._out:
                self._settled.set()
                self._settled = anyio.Event()
        while self._out:  # another flush's reports are still out: they are ours too
            await self._settled.wait()

    async def _report(self, group: str, topic: str, events: list[TraceEvent]) -> None:
        assert self._routes is not None
        try:
            slot, slots = await self._slot(group)
            req = TraceRequest(g=group, topic=topic, role=self.role, client=self.client,
                               cg=self.cg, slot=slot, slots=slots, events=tuple(events))
            frame = await self._routes.call_group(group, req.OP, req.header())
            answer = TraceAnswer.decode(frame.header)
        except RequestError as exc:
            self.dropped += len(events)
            log.warning("trace: %d events of %s in group %s not recorded: %s",
                        len(events), topic, group, exc)
            return
        self.written += answer.written
        self.missing += answer.missing

    async def _slot(self, group: str) -> tuple[int, int]:
        """This group's trace queue if the node creates it now: its place among the
        cluster's groups, sorted (what `Admin.create_topic` would give a topic of one
        queue per group), asked of the name servers once."""
        if group not in self._groups:
            assert self._routes is not None
            cluster: dict[str, Any] = await self._routes.cluster()
            self._groups = sorted(str(g) for g in cluster.get("groups") or {})
            if group not in self._groups:
                self._groups = sorted([*self._groups, group])
        return self._groups.index(group), len(self._groups)


def _group_of(msg: Message) -> str | None:
    """The group storing `msg` (its id names it); None for an id not of that form."""
    try:
        return parse_message_id(msg.msg_id)[0]
    except RequestError:
        return None
