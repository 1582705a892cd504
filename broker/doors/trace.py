"""TRACE: traced clients report steps of their messages' lives; the leader of the group
storing those messages writes them to the trace topic.

Why the node writes the records rather than the clients producing them: a record is
only as good as what it claims. The client names a message by (topic, queue, offset) and
says what it did (sent it, was handed it, acknowledged it); the node finds the message in
its own queue, names it by its id, and for every "sent" adds the "stored" step from its
replicated state (Raft index, offset, store time), which no client could vouch for. Events
naming an offset the group does not hold are counted `missing` and not recorded.

Where the records go: the trace topic (`wire.trace.TRACE_TOPIC`) has one queue in every
group, created in a group the first time something traced in it is reported (its place
among the cluster's groups, sorted, as the client computed it: `slot` of `slots`). A
message's records thus sit in the group that stores the message, are appended by the
same produce path as any batch (checked, one entry per request, committed on a majority
before the answer), and are keyed by the message id, so QUERY_KEY on the trace topic
finds one message's life. A request writes one record per message it names, holding
that message's steps (a sent one and its stored one together): records, not steps, are
what each costs the group (a key index entry, a walk, bytes).

Permissions (`broker.doors.security`): a producer's report needs publish on the traced
topic, a consumer's subscribe on the topic and its group -- what the traced sends and
reads needed anyway. Reading the trace topic needs subscribe on it.

Reports are at least once: a retried request may record its steps twice (readers drop
steps that repeat exactly).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from broker.doors.base import Handler, Response, applied
from broker.doors.produce import ProduceDoor
from broker.runtime.leading import GroupLead
from broker.state.statemachine import BrokerState, control_create_topic
from raftlog.runtime import GroupRuntime
from raftlog.types import EntryType
from transport.framing import Caller
from wire.protocol import Code, Op, RequestError, ok_header
from wire.records import OutgoingMessage, encode_batch, message_id
from wire.requests import TraceAnswer, TraceRequest
from wire.trace import TRACE_TOPIC, TraceRecord, encode_steps

__all__ = ["TraceDoor", "TraceHost"]


class TraceHost(Protocol):
    """What trace uses of its node: routes are told when the trace topic appears."""

    def topics_changed(self) -> None: ...


class TraceDoor:
    """TRACE for one node."""

    def __init__(self, lead: GroupLead, produce: ProduceDoor, host: TraceHost) -> None:
        self.lead = lead
        self.produce = produce
        self.host = host

    def handlers(self) -> dict[int, Handler]:
        return {Op.TRACE: self._trace}

    async def _trace(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        g = self.lead.group(h.get("g"))  # the group and its leadership first, as always
        state = self.lead.leading(g)
        req = TraceRequest.decode(h)
        if state.topic(req.topic) is None:
            await g.read_barrier()  # a deposed leader must not refuse a topic created since
            state = self.lead.leading(g)
            if state.topic(req.topic) is None:
                raise RequestError(Code.UNKNOWN_TOPIC, f"topic {req.topic!r} is not in "
                                   f"group {g.group_id}")
        trace_queue, state = await self._trace_queue(g, state, req)
        records, missing = self._records(g.group_id, state, req)
        if not records:
            return ok_header(0, **TraceAnswer(written=0, missing=missing).header()), b""
        batch = encode_batch(TRACE_TOPIC, trace_queue,
                             [OutgoingMessage(encode_steps(steps), key=steps[0].msg_id,
                                              tags=steps[0].kind) for steps in records],
                             born_ms=int(time.time() * 1000))
        (outcome,) = await self.produce.store(g, state, [batch])
        if isinstance(outcome, RequestError):
            raise outcome
        return ok_header(0, **TraceAnswer(written=len(records), missing=missing).header()), b""

    async def _trace_queue(self, g: GroupRuntime, state: BrokerState,
                           req: TraceRequest) -> tuple[int, BrokerState]:
        """The trace topic's queue in this group, the topic created here first if new."""
        config = state.topic(TRACE_TOPIC)
        if config is None:
            applied(await g.propose(control_create_topic(TRACE_TOPIC, req.slots, [req.slot]),
                                    EntryType.CONTROL))
            self.host.topics_changed()
            state = self.lead.leading(g)
            config = state.topic(TRACE_TOPIC)
            if config is None:  # deleted at once by an operator: try again later
                raise RequestError(Code.BUSY, "the trace topic was deleted meanwhile")
        return config.hosted[0], state

    @staticmethod
    def _records(group: str, state: BrokerState,
                 req: TraceRequest) -> tuple[list[list[TraceRecord]], int]:
        """The steps of the request's events, one list per message (a stored step after
        each sent one), in the order the messages first appear; and how many events
        named offsets this group does not hold."""
        by_offset: dict[tuple[int, int], list[TraceRecord]] = {}
        missing = 0
        for kind, queue, offset, ms, committed in req.events:
            steps = by_offset.get((queue, offset))
            if steps is None:
                try:
                    entry = state.queues.queue(req.topic, queue).get(offset)
                except RequestError:  # an unknown queue, or an offset not (or no longer) held
                    missing += 1
                    continue
                msg_id = message_id(group, entry.index, entry.start)
                steps = by_offset[(queue, offset)] = []
            else:
                msg_id = steps[0].msg_id
            steps.append(TraceRecord(kind, msg_id, req.topic, queue, offset, ms,
                                     client=req.client, cg=req.cg, group=group,
                                     committed=committed if kind == "acked" else -1))
            if kind == "sent":
                steps.append(TraceRecord("stored", msg_id, req.topic, queue, offset,
                                         entry.store_ms, group=group, index=entry.index))
        return list(by_offset.values()), missing
