"""What the doors share: the shape of a handler, the header fields several of them read,
and how a door finds the group that hosts a queue and leads it here.

A door is one area of requests (`Door.handlers`: op -> handler); `broker.doors.service`
merges every door's table into the one it dispatches on. The helpers here are the rules
more than one door must apply alike: a queue id in range, a topic or consumer group name,
a proposal's refusal raised as the request's error, and, before a topic or queue is
called unknown, a majority's word that this node still leads (`QueueHosts`,
`confirm_led`): a deposed leader that does not know it yet must not refuse a topic its
successor created.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import trio

from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead
from broker.state.statemachine import MAX_QUEUES, ErrorResult
from raftlog.runtime import GroupRuntime, NotLeader
from transport.framing import Caller
from wire.protocol import (
    Code,
    RequestError,
    header_field,
    validate_group_name,
    validate_topic_name,
)

__all__ = [
    "MAX_WAIT_MS",
    "UNKNOWN",
    "Door",
    "Handler",
    "QueueHosts",
    "Response",
    "applied",
    "cg_field",
    "check_queue",
    "confirm_led",
    "topic_field",
]

Response = tuple[dict[str, Any], bytes]
#: A per-op handler: the connection's caller (who asks: a client, or a node that proved
#: itself), the request's header and body.
Handler = Callable[[Caller, dict[str, Any], bytes], Awaitable[Response]]

MAX_WAIT_MS = 60_000  # the longest a request is held (a FETCH's long poll, a CONSUMERS wait)
UNKNOWN = frozenset({Code.UNKNOWN_TOPIC, Code.UNKNOWN_QUEUE})  # confirmed before refused


class Door(Protocol):
    """One area of requests: the ops it answers, each with its handler."""

    def handlers(self) -> dict[int, Handler]: ...


def check_queue(q: int) -> int:
    """Queue id `q`, UNKNOWN_QUEUE when no topic can have it."""
    if not 0 <= q < MAX_QUEUES:
        raise RequestError(Code.UNKNOWN_QUEUE, f"queue {q} is out of range")
    return q


def topic_field(h: dict[str, Any]) -> str:
    """The "topic" field: MALFORMED when missing or not a string, INVALID_NAME if bad."""
    return validate_topic_name(header_field(h, "topic", str))


def cg_field(h: dict[str, Any]) -> str:
    """The consumer group field "cg", checked like `topic_field`."""
    return validate_group_name(header_field(h, "cg", str))


def applied(result: Any) -> Any:
    """What a proposal applied to: the state machine's result, or its refusal
    (`ErrorResult`) raised as the request's error."""
    if isinstance(result, ErrorResult):
        raise RequestError(result.code, result.message)
    return result


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception in `group` that is not itself a group."""
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


async def confirm_led(groups: Mapping[str, GroupRuntime[Any]]) -> None:
    """Before a topic or queue missing from this node's state is refused as unknown:
    this node leads a group (else NOT_LEADER, naming a leader of a group it hosts),
    every group it leads is ready (else NOT_LEADER with ready false), and a majority
    confirmed each (ReadIndex, together; NotLeader if one was lost meanwhile)."""
    led = [g for g in groups.values() if g.is_leader]
    if not led:
        hint = next((g.leader for g in groups.values() if g.leader is not None), None)
        raise NotLeader(hint)
    for g in led:
        g.check_ready()
    try:
        async with trio.open_nursery() as nursery:
            for g in led:
                nursery.start_soon(g.read_barrier)
    except BaseExceptionGroup as group:
        # a barrier refused (leadership lost, a full disk) is the request's refusal,
        # as one group's would be; anything else stays the error it is
        lost, rest = group.split(NotLeader)
        if lost is None or rest is not None:
            raise
        raise _first_leaf(lost) from None


class QueueHosts:
    """Which group hosts a (topic, queue), led here: what the reads and the offset
    requests answer from."""

    def __init__(self, groups: GroupRegistry, lead: GroupLead) -> None:
        self.groups = groups
        self.lead = lead

    async def led_group(self, topic: str, queue: int, gid: object = None, *,
                        confirm: bool = True) -> GroupRuntime:
        """The group led (and ready) here that hosts (topic, queue). With `confirm`, a
        majority has also confirmed this node still leads it (ReadIndex) before the
        caller answers from its state, so a deposed leader that does not know it yet
        neither serves a topic deleted meanwhile nor calls one created meanwhile
        unknown.

        `gid` is the group the client's route names (the SDK sends it): only that
        group's ready leader answers, so a follower whose state lags never calls a topic
        unknown. Without it (older clients), the topic is looked up in every group
        hosted here, and an unknown topic or queue is refused only by a node that leads
        a group, once each group it leads is ready and confirmed (`confirm_led`): a
        lagging follower of a group this node does not lead can still miss a topic."""
        if gid is not None:
            g = self.lead.group(gid)
            state = self.lead.leading(g)
            if not state.hosts(topic, queue):
                await g.read_barrier()  # confirmed before it refuses, whatever `confirm`
                cfg = self.lead.leading(g).topic(topic)
                if cfg is None:
                    raise RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist")
                if queue >= cfg.queues:
                    raise RequestError(Code.UNKNOWN_QUEUE, f"topic {topic!r} has no queue "
                                       f"{queue}: its queues are 0..{cfg.queues - 1}")
                if queue not in cfg.hosted:  # the route is stale: look where it lives here
                    return await self.led_group(topic, queue, confirm=confirm)
                return g  # created meanwhile, and confirmed just now
        else:
            try:
                g = self.local_group(topic, queue)
            except RequestError as exc:
                if exc.code not in UNKNOWN:
                    raise
                await confirm_led(self.groups)
                g = self.local_group(topic, queue)
            self.lead.leading(g)
        if confirm:
            await self.lead.read_barrier(g)
        return g

    def local_group(self, topic: str, queue: int) -> GroupRuntime:
        """The group on this node that hosts (topic, queue), by the state applied so far."""
        known = False
        for gid, state in self.groups.states.items():
            cfg = state.topic(topic)
            if cfg is not None:
                known = True
                if queue in cfg.hosted:
                    return self.groups[gid]
                if queue >= cfg.queues:
                    raise RequestError(
                        Code.UNKNOWN_QUEUE, f"topic {topic!r} has no queue {queue}: its queues "
                        f"are 0..{cfg.queues - 1}"
                    )
        if known:
            # hosted by a group this node is not a replica of
            raise RequestError(Code.NOT_LEADER, f"{topic}/{queue} is not hosted on this node",
                               leader=None)
        raise RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist")
