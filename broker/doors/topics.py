"""Topics: CREATE_TOPIC, DELETE_TOPIC, GROW_TOPIC, TOPICS.

A topic's configuration is replicated state of the group that hosts it (the catalog
part), so each change is proposed to that group's leader and answered once applied; the
node is then told (`topics_changed`) so that routes follow at once rather than at the
next name-server heartbeat. A delete or grow may carry a request id: a retry whose first
copy was applied after all is answered as that copy was. TOPICS reads what the node
knows, or, for one group, from its leader behind a ReadIndex barrier: a linearizable
read of that group's topics.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker.doors.base import Handler, Response, applied
from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead
from broker.state.statemachine import (
    MAX_QUEUES,
    ControlResult,
    control_create_topic,
    control_delete_topic,
    control_grow_topic,
)
from raftlog.types import EntryType
from transport.framing import Caller
from wire.protocol import Code, Op, RequestError, ok_header
from wire.requests import (
    CreateTopicAnswer,
    CreateTopicRequest,
    DeleteTopicAnswer,
    DeleteTopicRequest,
    GrowTopicAnswer,
    GrowTopicRequest,
    TopicsAnswer,
    TopicsRequest,
)

__all__ = ["TopicDoor", "TopicHost"]


class TopicHost(Protocol):
    """What the topic requests use of their node: its routes are told of a change."""

    def topics_changed(self) -> None: ...


class TopicDoor:
    """The topic requests of one node."""

    def __init__(self, lead: GroupLead, groups: GroupRegistry, host: TopicHost) -> None:
        self.lead = lead
        self.groups = groups
        self.host = host

    def handlers(self) -> dict[int, Handler]:
        return {
            Op.CREATE_TOPIC: self._create_topic,
            Op.DELETE_TOPIC: self._delete_topic,
            Op.GROW_TOPIC: self._grow_topic,
            Op.TOPICS: self._topics,
        }

    async def _create_topic(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        g = self.lead.group(h.get("g"))  # the group first, before the fields, as always
        req = CreateTopicRequest.decode(h)
        topic = req.topic
        _check_queue_count(req.queues)
        self.lead.leading(g)
        result = applied(await g.propose(
            control_create_topic(topic, req.queues, sorted(set(req.hosted))),
            EntryType.CONTROL))
        assert isinstance(result, ControlResult)
        self.host.topics_changed()  # routes should not wait for the next heartbeat
        if result.applied == 0:  # the same topic, same queues, was already there
            raise RequestError(Code.TOPIC_EXISTS,
                               f"topic {topic!r} already exists here with this configuration",
                               same=True)
        return ok_header(0, **CreateTopicAnswer().header()), b""

    async def _delete_topic(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        g = self.lead.group(h.get("g"))  # the group first, before the fields, as always
        req = DeleteTopicRequest.decode(h)
        self.lead.leading(g)
        applied(await g.propose(control_delete_topic(req.topic, req.req), EntryType.CONTROL))
        self.host.topics_changed()
        return ok_header(0, **DeleteTopicAnswer().header()), b""

    async def _grow_topic(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        g = self.lead.group(h.get("g"))  # the group first, before the fields, as always
        req = GrowTopicRequest.decode(h)
        _check_queue_count(req.queues)
        self.lead.leading(g)
        applied(await g.propose(
            control_grow_topic(req.topic, req.queues, list(req.hosted), req.req),
            EntryType.CONTROL))
        self.host.topics_changed()
        return ok_header(0, **GrowTopicAnswer().header()), b""

    async def _topics(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Every topic of every group hosted here, as this node knows them; with "g", only
        that group's, from its leader once it confirmed its leadership (ReadIndex): a
        linearizable read of the group's topics."""
        req = TopicsRequest.decode(h)
        topics: dict[str, dict[str, Any]] = {}
        states = self.groups.states
        if "g" in h:  # a g of null is no group (MALFORMED), as it always was
            g = self.lead.group(req.g)
            self.lead.leading(g)
            await self.lead.read_barrier(g)
            states = {g.group_id: self.lead.leading(g)}
        for gid, state in states.items():
            for name, cfg in state.topics().items():
                t = topics.setdefault(name, {"queues": cfg.queues, "hosted": {}})
                t["hosted"][gid] = list(cfg.hosted)
        return ok_header(0, **TopicsAnswer(topics=topics).header()), b""


def _check_queue_count(queues: int) -> None:
    """The node's own limit on queues per topic (the request type checked the rest)."""
    if not 1 <= queues <= MAX_QUEUES:
        raise RequestError(Code.MALFORMED, f"queues must be 1..{MAX_QUEUES}")
