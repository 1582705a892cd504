"""Consumer group members: HEARTBEAT and CONSUMERS.

A consumer heartbeats every node of the cluster; each node keeps the live members of
each consumer group in memory (`ConsumerRegistry`: soft state, never replicated, known
again one heartbeat round after a restart) and lists them on CONSUMERS. So that a member
learns of a join or a leave when it happens rather than at its next poll, CONSUMERS with
the list the caller last saw (`known`) and a `wait_ms` is held until the list differs
(a heartbeat that changes it wakes the waits of its group) or the wait ends.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from broker.doors.base import MAX_WAIT_MS, Handler, Response
from broker.doors.consumers import ConsumerRegistry
from transport.framing import Caller
from wire.protocol import Code, Op, RequestError, ok_header
from wire.requests import ConsumersAnswer, ConsumersRequest, HeartbeatAnswer, HeartbeatRequest

__all__ = ["HeartbeatDoor"]


class HeartbeatDoor:
    """The consumer heartbeats of one node, and the CONSUMERS requests waiting on them."""

    def __init__(self, consumers: ConsumerRegistry) -> None:
        self.consumers = consumers
        self._member_waits: dict[str, trio.Event] = {}  # cg -> set when its members change

    def handlers(self) -> dict[int, Handler]:
        return {Op.HEARTBEAT: self._heartbeat, Op.CONSUMERS: self._consumers_of}

    async def _heartbeat(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        beat = HeartbeatRequest.decode(h)
        cg = beat.cg
        now = time.monotonic()
        before = self.consumers.members(cg, now)
        self.consumers.heartbeat(cg, beat.client, beat.ttl_ms, now, manual=beat.manual)
        if self.consumers.members(cg, now) != before:
            self._members_changed(cg)
        return ok_header(0, **HeartbeatAnswer().header()), b""

    def _members_changed(self, cg: str) -> None:
        """Wake the CONSUMERS requests held for `cg` (see `_consumers_of`)."""
        changed = self._member_waits.pop(cg, None)
        if changed is not None:
            changed.set()

    async def _consumers_of(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """The live members of a group. With `known` (the list the caller last saw) and
        `wait_ms`, the answer waits until the list differs from it, or the wait ends: a
        member learns of a join or a leave when it happens, not at its next poll."""
        req = ConsumersRequest.decode(h)
        cg = req.cg
        known = None if req.known is None else list(req.known)
        if not 0 <= req.wait_ms <= MAX_WAIT_MS:
            raise RequestError(Code.MALFORMED, f"wait_ms must be 0-{MAX_WAIT_MS}")
        deadline = time.monotonic() + req.wait_ms / 1000
        while True:
            now = time.monotonic()
            members = self.consumers.members(cg, now)
            if known is None or members != known or now >= deadline:
                answer = ConsumersAnswer(clients=tuple(members),
                                         manual=tuple(self.consumers.manual_members(cg, now)))
                return ok_header(0, **answer.header()), b""
            expiry = self.consumers.next_expiry(cg)
            changed = self._member_waits.setdefault(cg, trio.Event())
            with trio.move_on_at(min(deadline, expiry + 0.001 if expiry else deadline)):
                await changed.wait()
