"""The one way request doors and leader-side duties reach a group of this node.

Find a hosted group by id, check this node leads it (and is ready to serve it), read
with a ReadIndex barrier, propose a control record: every door (`broker.doors`) and every
duty (`broker.duties`) goes through a `GroupLead`, so none reaches into another's private
helpers and the rules live in one place.

A control record reaches the log one way: its typed record (`broker.state.parts`),
constructed (which validates it) and handed to `GroupLead.propose`, which encodes it. A
record its type refuses never reaches the log: built from a request's fields with
`checked`, the caller gets the very error code apply would have given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from broker.runtime.groups import GroupRegistry
from broker.state.parts.base import ControlRecord, ControlResult, ErrorResult, Refused
from broker.state.statemachine import BrokerState
from raftlog.core import NotLeader
from raftlog.runtime import GroupRuntime
from raftlog.types import EntryType
from wire.protocol import Code, RequestError

__all__ = ["GroupLead", "checked"]

P = ParamSpec("P")
R = TypeVar("R", bound=ControlRecord)


def checked(kind: Callable[P, R], *args: P.args, **fields: P.kwargs) -> R:
    """The record `kind(*args, **fields)`; RequestError with the code and message apply
    would answer when its type refuses the fields (a door builds records from a request:
    bad input is answered as it always was, and never proposed)."""
    try:
        return kind(*args, **fields)
    except Refused as exc:
        raise RequestError(exc.code, exc.message) from None


class GroupLead:
    """Doors' and duties' access to the groups hosted here (see the module docstring)."""

    def __init__(self, groups: GroupRegistry, is_cluster_group: Callable[[str], bool],
                 skip_read_barrier: Callable[[], bool]) -> None:
        """`is_cluster_group(gid)`: a group of the cluster, hosted here or not;
        `skip_read_barrier()`: the deliberate test mutation of that name is on."""
        self.groups = groups
        self._is_cluster_group = is_cluster_group
        self._skip_read_barrier = skip_read_barrier

    def group(self, gid: object) -> GroupRuntime[BrokerState]:
        """The group a request names in its "g" field."""
        if not isinstance(gid, str):
            raise RequestError(Code.MALFORMED, f"field 'g' must be a group id string, got {gid!r}")
        g = self.groups.get(gid)
        if g is None:
            if self._is_cluster_group(gid):
                # a group of the cluster whose replica moved away (`raftmq cluster`): the
                # client's route is stale, the group lives on elsewhere
                raise RequestError(Code.NOT_LEADER, f"group {gid!r} has no replica on this "
                                   "node (any more)", leader=None)
            raise RequestError(Code.UNKNOWN_GROUP, f"group {gid!r} is not hosted on this node")
        return g

    def leading(self, g: GroupRuntime[BrokerState]) -> BrokerState:
        """The state of `g` while this node leads it and is ready (`GroupRuntime.
        check_ready`): a leader elected a moment ago answers NOT_LEADER naming itself,
        with ready false, until it applied an entry of its own term. Every request that
        reads or writes a group's state passes here first; one check per request."""
        g.check_ready()
        return self.groups.states[g.group_id]

    def led_state(self, gid: str) -> BrokerState:
        """For duties: the state of `gid` while this node leads it, else NotLeader (a
        duty's work is proposed, and a proposal waits for the leader to be ready)."""
        g = self.groups.get(gid)
        if g is None or not g.is_leader:
            raise NotLeader(None)
        return self.groups.states[gid]

    async def read_barrier(self, g: GroupRuntime[BrokerState]) -> None:
        """ReadIndex before an answer that depends on the latest state (skipped only by
        the deliberate `skip-read-barrier` test mutation)."""
        if not self._skip_read_barrier():
            await g.read_barrier()

    async def check_commit_bounds(self, g: GroupRuntime[BrokerState],
                                  offsets: list[tuple[str, int, int]]) -> None:
        """OFFSET_TOO_LARGE for an offset beyond its queue's end: it cannot be a position
        any consumer read up to. The end is checked again after a read barrier before
        refusing, so a leader still applying its predecessor's entries refuses nothing a
        consumer really read."""
        confirmed = False
        while True:
            state = self.leading(g)
            beyond = [(t, q, o, *state.queue_range(t, q)) for t, q, o in offsets
                      if o > state.queue_range(t, q)[1]]
            if not beyond:
                return
            if confirmed:
                t, q, o, lo, end = beyond[0]
                raise RequestError(Code.OFFSET_TOO_LARGE,
                                   f"offset {o} is beyond the end {end} of {t}/{q}",
                                   min=lo, end=end)
            await g.read_barrier()
            confirmed = True

    async def propose(self, g: GroupRuntime[BrokerState], record: ControlRecord,
                      req: tuple[int, int] | None = None) -> ControlResult:
        """Propose `record` (with the client's request id `req`, if it may be retried)
        and wait until it is applied; its refusal is raised as RequestError. Only a typed
        record goes: it validated its fields when it was made (a raw map never does)."""
        if not isinstance(record, ControlRecord):
            raise TypeError(f"propose takes a control record (broker.state.parts), not "
                            f"{type(record).__name__}")
        result = await g.propose(record.encode(req), EntryType.CONTROL)
        if isinstance(result, ErrorResult):
            raise RequestError(result.code, result.message)
        assert isinstance(result, ControlResult), result
        return result
