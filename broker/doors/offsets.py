"""Consumer offsets: COMMIT_OFFSET, QUERY_OFFSET, OFFSETS, DELETE_GROUP.

Offsets are replicated state (`broker.state.parts.offsets`), written through the log so
a failover never rewinds them and read from the leader once a majority confirmed it
still leads, so a committed offset is never read back older than it is. A commit is
retried by the client when its answer is lost, so it carries a request id the state
machine deduplicates. An offset a transaction holds undecided is neither committed over
nor read (TX_PENDING, `TxService.check_no_pending`).
"""

from __future__ import annotations

from typing import Any

from broker.doors.base import Handler, QueueHosts, Response, applied, check_queue
from broker.doors.simple import now_ms
from broker.doors.transactions import TxService
from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead
from broker.state.statemachine import ControlResult, control_delete_group, control_offsets
from raftlog.runtime import NotLeader
from raftlog.types import EntryType
from transport.framing import Caller
from wire.protocol import Op, ok_header
from wire.requests import (
    CommitOffsetAnswer,
    CommitOffsetRequest,
    DeleteGroupAnswer,
    DeleteGroupRequest,
    OffsetsAnswer,
    OffsetsRequest,
    QueryOffsetAnswer,
    QueryOffsetRequest,
)

__all__ = ["OffsetDoor"]


class OffsetDoor:
    """The consumer offset requests of one node."""

    def __init__(self, lead: GroupLead, groups: GroupRegistry, hosts: QueueHosts,
                 tx: TxService) -> None:
        self.lead = lead
        self.groups = groups
        self.hosts = hosts
        self.tx = tx

    def handlers(self) -> dict[int, Handler]:
        return {
            Op.COMMIT_OFFSET: self._commit_offset,
            Op.QUERY_OFFSET: self._query_offset,
            Op.OFFSETS: self._offsets,
            Op.DELETE_GROUP: self._delete_group,
        }

    async def _commit_offset(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Commit offsets through the log. The client retries a commit whose answer it did
        not get, so a commit carries a request id ("req": [client id, sequence]) that the
        state machine deduplicates: a retry whose first copy was committed after all (by a
        new leader) must not overwrite an offset committed in between."""
        commit = CommitOffsetRequest.decode(h)
        cg, req = commit.cg, commit.req
        by_group: dict[str, list[tuple[str, int, int]]] = {}
        for topic, queue, offset in commit.offsets:
            g = await self.hosts.led_group(topic, check_queue(queue), confirm=False)  # a write
            self.tx.check_no_pending(self.groups.states[g.group_id], cg, topic, queue)
            by_group.setdefault(g.group_id, []).append((topic, queue, offset))
        dup = False
        for gid, offs in by_group.items():
            await self.lead.check_commit_bounds(self.groups[gid], offs)
        for gid, offs in by_group.items():
            # fenced by the queue locks, at this leader's clock (`parts.queuelocks`)
            result = applied(await self.groups[gid].propose(
                control_offsets(cg, offs, req, client=commit.client, now_ms=now_ms()),
                EntryType.CONTROL))
            dup = dup or (isinstance(result, ControlResult) and result.dup)
        return ok_header(0, **CommitOffsetAnswer(dup=dup).header()), b""

    async def _query_offset(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        q = QueryOffsetRequest.decode(h)
        cg, topic, queue = q.cg, q.topic, check_queue(q.queue)
        # confirmed (ReadIndex): a committed offset is never read back older than it is
        g = await self.hosts.led_group(topic, queue, q.g)
        state = self.lead.leading(g)
        self.tx.check_no_pending(state, cg, topic, queue)
        off = state.consumer_offset(cg, topic, queue)
        answer = QueryOffsetAnswer(offset=-1 if off is None else off)
        return ok_header(0, **answer.header()), b""

    async def _offsets(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Committed offsets in the groups this node leads, read after a barrier each."""
        only = OffsetsRequest.decode(h).cg
        rows: list[tuple[str, str, str, int, int]] = []
        led: list[str] = []
        for gid, g in list(self.groups.items()):
            if not g.is_leader:
                continue
            try:
                await g.read_barrier()
            except NotLeader:
                continue
            led.append(gid)
            for (cg, topic, queue), off in self.groups.states[gid].consumer_offsets(only).items():
                rows.append((gid, cg, topic, queue, off))
        return ok_header(0, **OffsetsAnswer(rows=tuple(rows), led=tuple(led)).header()), b""

    async def _delete_group(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        g = self.lead.group(h.get("g"))  # the group first, before the fields, as always
        req = DeleteGroupRequest.decode(h)
        self.lead.leading(g)
        result = applied(await g.propose(control_delete_group(req.cg, req.req),
                                         EntryType.CONTROL))
        assert isinstance(result, ControlResult)
        return ok_header(0, **DeleteGroupAnswer(deleted=result.applied).header()), b""
