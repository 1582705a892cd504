"""The broker's request dispatcher: what a node answers to clients and peers, by area.

Each area of requests is a door of its own module, built here with what it needs:
`produce` (PRODUCE), `reads` (FETCH, GET_MESSAGE, QUERY_KEY, READ_RAW), `offsets`
(consumer offsets), `simple` (the simple consumer and its dead letters), `topics` (topic configuration), `cluster` (status, leadership,
membership, replicas), `heartbeats` (consumer group members) and `transactions` (both
transaction models). Their op -> handler tables make the one table `handle` dispatches
on; two doors claiming one op is a programming error, found at construction.

Every handler validates its request fully before touching a Raft group, so bad input gets
a precise error and never reaches the log. Writes are proposed to the group's leader and
answered only once applied, i.e. committed — fsynced on a majority. What every request
shares is decided here, once: the requests served to proven peers only (FORBIDDEN for a
client: `transport.peerauth`), an unknown op, how a write Raft refused or could not finish
is answered (`broker.doors.refusals`), and the `crash-before-answer` test mutation.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol

from broker.doors.base import Door, Handler, QueueHosts, Response
from broker.doors.cluster import ClusterDoor, ClusterHost
from broker.doors.consumers import ConsumerRegistry
from broker.doors.heartbeats import HeartbeatDoor
from broker.doors.locks import LockDoor
from broker.doors.offsets import OffsetDoor
from broker.doors.produce import ProduceDoor, ProduceHost
from broker.doors.reads import ReadDoor
from broker.doors.refusals import refusal
from broker.doors.simple import SimpleDoor
from broker.doors.topics import TopicDoor, TopicHost
from broker.doors.trace import TraceDoor
from broker.doors.transactions import TxService
from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead
from broker.runtime.metrics import NodeMetrics
from raftlog.runtime import NotLeader, ProposalDropped, ProposalLost
from transport.framing import Caller
from wire.protocol import Code, Frame, Op, RequestError

__all__ = ["CRASH_BEFORE_ANSWER_EXIT", "BrokerHost", "BrokerService"]

log = logging.getLogger("raftmq.service")

CRASH_BEFORE_ANSWER_EXIT = 70  # exit code of the `crash-before-answer` test mutation
# the requests that change replicated state: `crash-before-answer` applies to each
_WRITES = frozenset({
    Op.PRODUCE, Op.COMMIT_OFFSET, Op.CREATE_TOPIC, Op.DELETE_TOPIC, Op.GROW_TOPIC,
    Op.DELETE_GROUP, Op.TX_INIT, Op.TX_ADD, Op.TX_OFFSETS, Op.TX_END, Op.TX_MARKER,
    Op.HALF_END, Op.LOCK, Op.UNLOCK,
})


#: Requests only a node proven by the peer handshake may make: raw entries bypass the
#: consumer's view, Raft traffic belongs on the peer link (never a request), and a
#: transaction marker is the coordinator's decision, never a client's.
_PEER_ONLY = frozenset({int(Op.READ_RAW), int(Op.RAFT), int(Op.TX_MARKER)})


class BrokerHost(ProduceHost, TopicHost, ClusterHost, Protocol):
    """What the service uses of the node that hosts it (`broker.node.Node` is one) beside
    its groups: what each door says it uses (its config, the produce test mutations, the
    topic and replica hooks), and the node's metrics and the test mutations the service
    itself carries out. The service imports nothing of the node; the node builds the
    service."""

    metrics: NodeMetrics
    # the deliberate test mutations read outside the doors (see `broker.config`)
    skip_read_barrier: bool
    crash_before_answer: bool


class BrokerService:
    """Dispatches the requests of one node to the doors of their areas."""

    def __init__(self, groups: GroupRegistry, node: BrokerHost) -> None:
        self.groups = groups
        self.node = node
        self.consumers = ConsumerRegistry()
        self.lead = GroupLead(groups, lambda gid: any(gc.id == gid for gc in node.config.groups),
                              lambda: node.skip_read_barrier)
        self.tx = TxService(self.lead, groups, node)
        hosts = QueueHosts(groups, self.lead)
        reads = ReadDoor(self.lead, groups, hosts, node.config, node.metrics)
        produce = ProduceDoor(self.lead, groups, node, node.metrics, self.tx)
        doors: list[Door] = [
            produce,
            TraceDoor(self.lead, produce, node),
            reads,
            OffsetDoor(self.lead, groups, hosts, self.tx),
            SimpleDoor(self.lead, groups, hosts, reads),
            LockDoor(self.lead, groups, hosts, node.config),
            TopicDoor(self.lead, groups, node),
            ClusterDoor(self.lead, groups, node),
            HeartbeatDoor(self.consumers),
            self.tx,
        ]
        self._handlers: dict[int, Handler] = {}
        for door in doors:
            for op, handler in door.handlers().items():
                if op in self._handlers:
                    raise ValueError(f"two doors answer {Op(op).name}")
                self._handlers[op] = handler

    async def handle(self, caller: Caller, frame: Frame) -> Response | None:
        h = frame.header
        op = h.get("op")
        rid = h.get("id", 0)
        if isinstance(op, int) and op in _PEER_ONLY and not caller.is_peer:
            raise RequestError(Code.FORBIDDEN, f"{Op(op).name} is served to the nodes of the "
                               "cluster only, on a connection opened with the peer handshake")
        handler = self._handlers.get(op) if isinstance(op, int) else None
        if handler is None:
            raise RequestError(Code.UNKNOWN_OP, f"unknown request type {op!r}")
        try:
            header, body = await handler(caller, h, frame.body)
            if self.node.crash_before_answer and op in _WRITES and h.get("test_exit") is True:
                # Deliberately wrong (tests only, on request): die between the commit and
                # the answer, so the client must retry a write that is already committed.
                log.critical("crash-before-answer: exiting before answering %s", Op(op).name)
                os._exit(CRASH_BEFORE_ANSWER_EXIT)
        except (NotLeader, ProposalDropped, ProposalLost) as exc:
            raise refusal(exc, self.groups.peer_addr) from None
        header["id"] = rid
        return header, body
