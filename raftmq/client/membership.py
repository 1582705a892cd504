"""Replica membership of groups, for operators: who holds a replica, and changing that.

Every change is a single-server membership change in the group's Raft log (thesis
§4.1), made by its leader, one at a time:

* adding a replica: the node is told to host an empty replica (HOST_GROUP), the leader
  adds it as a learner (it replicates but neither votes nor counts), catches it up with
  appends or its snapshot, and promotes it to voter once it holds everything committed;
* removing one: the leader logs the smaller membership (refused when the remaining
  voters would not have a reachable majority, or when the node leads: move leadership
  first), then the node is told to stop hosting it and delete its data (DROP_GROUP);
* replacing one: add the new replica, then remove the old, so the group never has fewer
  voters than it started with. Replacing a node by itself (its disk was replaced and it
  came back empty) removes it first, then adds it back, the only order possible.

A step that fails leaves the group in a valid membership (each step is one logged
change); adding or removing again resumes where it stopped, since every step accepts
the state it would produce. A replace that stopped half way may leave the group one
voter short (a node replaced by itself is removed before it is added back); running the
same replace again finishes it: a node that is no voter any more is only added back (a
learner's catch-up resumed); a replace by another node whose old node is gone already
is refused, saying that the new node votes (it may have been done by the earlier run).
Within one `replace_replica` call, a run stopped by a failure that may pass (a node
restarting, an election) is resumed that way until the call's time is spent.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import anyio

from transport.connection import is_retriable
from wire.protocol import Code, Frame, RequestError, validate_group_name
from wire.requests import (
    DropGroupRequest,
    HostGroupRequest,
    MembershipAnswer,
    MembershipRequest,
    TransferLeaderRequest,
    WireType,
)
from wire.requests.cluster import host_taken

from .routes import Routes

__all__ = ["CATCH_UP_TIMEOUT", "LEADER_WAIT", "GroupMembers", "add_replica", "group_members",
           "remove_replica", "replace_replica", "transfer_leader"]

CATCH_UP_TIMEOUT = 300.0  # seconds a new replica may take to hold everything committed
LEADER_WAIT = 30.0  # seconds to wait for a group to have a leader (an election under way)
_DROP_WAIT = 15.0  # a removed voter stops following its old leader within an election
_POLL = 0.2
# A leader knows which voters are reachable only once it heard from them (within an
# election timeout or two): one that has just taken over may refuse a removal that its
# next heartbeats would allow, so a refusal for reachability is asked again this long.
REACHABLE_WAIT = 10.0
_RETRY_WAIT = 0.5  # seconds between runs of a replace a passing failure stopped

log = logging.getLogger("raftmq.client.membership")


@dataclass(frozen=True, slots=True)
class GroupMembers:
    """A group's membership as its leader sees it."""

    group: str
    leader: int
    voters: tuple[int, ...]
    learners: tuple[int, ...]
    matches: dict[int, int]  # each other member's last replicated index
    active: tuple[int, ...]  # members the leader heard from lately
    commit: int
    last: int
    preferred: int | None
    addresses: dict[int, str | None]
    peers: tuple[int, ...]  # every node of the cluster (the leader's peers table)
    hosts: dict[int, str] = dataclasses.field(default_factory=dict)  # node -> its host
    # after a removal: whether the node deleted its copy (False: it could not be reached;
    # it is no member, and running the removal again deletes it); None otherwise
    dropped: bool | None = None

    def lag(self, node: int) -> int | None:
        """Entries `node` lacks of the leader's log (None: not a member)."""
        if node == self.leader:
            return 0
        match = self.matches.get(node)
        return None if match is None else max(0, self.last - match)

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "leader": self.leader, "voters": list(self.voters),
                "learners": list(self.learners), "preferred": self.preferred,
                "active": list(self.active),
                "commit": self.commit, "last": self.last,
                "lag": {str(n): self.lag(n) for n in (*self.voters, *self.learners)},
                "hosts": {str(n): self.hosts[n] for n in (*self.voters, *self.learners)
                          if n in self.hosts},
                **({} if self.dropped is None else {"dropped": self.dropped})}


def _members(group: str, frame: Frame) -> GroupMembers:
    a = MembershipAnswer.decode(frame.header)
    return GroupMembers(
        group=group, leader=a.leader, voters=a.voters, learners=a.learners,
        matches={int(k): int(v) for k, v in a.matches.items()},
        active=a.active, commit=a.commit, last=a.last, preferred=a.preferred,
        addresses={int(k): v for k, v in a.addresses.items()},
        peers=a.peers,
        hosts={int(k): str(v) for k, v in (a.hosts or {}).items()},
    )


async def _at_leader(routes: Routes, group: str, req: MembershipRequest,
                     wait: float = 0.0) -> GroupMembers:
    """MEMBERSHIP at `group`'s leader, retried up to `wait` seconds while none answers:
    an operator replacing a node that just died must not fail for the election still
    under way."""
    deadline = anyio.current_time() + wait
    while True:
        try:
            return _members(group, await routes.call_group(group, req.OP, req.header()))
        except RequestError as exc:
            if not exc.retriable or anyio.current_time() >= deadline:
                raise
        await anyio.sleep(_POLL)


async def group_members(routes: Routes, group: str, *, wait: float = LEADER_WAIT
                        ) -> GroupMembers:
    """The membership of `group`, from its leader (UNKNOWN_GROUP if there is none),
    waiting up to `wait` seconds for one."""
    validate_group_name(group)
    return await _at_leader(routes, group, MembershipRequest(g=group, action="show"), wait)


async def _change(routes: Routes, group: str, action: str, node: int,
                  replaces: int | None = None) -> GroupMembers:
    req = MembershipRequest(g=group, action=action, node=node, replaces=replaces)
    return await _at_leader(routes, group, req, LEADER_WAIT)


def _check_host(m: GroupMembers, node: int, replaces: int | None) -> None:
    """Refuse before anything is made on `node` when its host holds a replica of the
    group already (the leader refuses it too: this only spares an empty replica)."""
    where = m.hosts.get(node)
    if where is None:
        return
    for other in sorted({*m.voters, *m.learners} - {node, replaces}):
        if m.hosts.get(other) == where:
            raise RequestError(Code.MEMBERSHIP_REFUSED, host_taken(node, where, other, m.group))


def _check_node(m: GroupMembers, node: int) -> None:
    if node not in m.peers:
        raise RequestError(Code.NOT_A_MEMBER, f"node {node} is not a node of the cluster "
                           f"(known nodes: {list(m.peers)})")


async def _node_request(routes: Routes, m: GroupMembers, node: int, req: WireType,
                        timeout: float) -> Frame:
    addr = m.addresses.get(node)
    if addr is None:
        raise RequestError(Code.NOT_A_MEMBER, f"no address known for node {node}")
    return await routes.pool.request(addr, req.OP, req.header(), timeout=timeout)


async def transfer_leader(routes: Routes, group: str, to: int, *, prefer: bool = True) -> None:
    """See `Admin.transfer_leader`."""
    validate_group_name(group)
    req = TransferLeaderRequest(g=group, to=to, prefer=prefer)
    await routes.call_group(group, req.OP, req.header())


async def add_replica(routes: Routes, group: str, node: int, *,
                      catch_up_timeout: float = CATCH_UP_TIMEOUT,
                      replaces: int | None = None) -> GroupMembers:
    """Make `node` a voter of `group`: host, add as learner, catch up, promote. With
    `replaces`, the member it is to replace may share its host."""
    m = await group_members(routes, group)
    _check_node(m, node)
    if node in m.voters:
        raise RequestError(Code.MEMBERSHIP_REFUSED, f"node {node} is already a voter of "
                           f"group {group} (voters: {list(m.voters)})")
    if node not in m.learners:
        _check_host(m, node, replaces)
        await _drop(routes, m, node)  # a replica left over from an earlier membership
        await _node_request(routes, m, node, HostGroupRequest(g=group, voters=m.voters),
                            routes.timeout)
        m = await _change(routes, group, "add-learner", node, replaces)
    else:
        # an earlier add stopped half way: resume its catch-up. HOST_GROUP again (a no-op
        # when the node hosts it) in case the node came back without it (a new disk).
        await _node_request(routes, m, node, HostGroupRequest(g=group, voters=m.voters),
                            routes.timeout)
    with anyio.fail_after(catch_up_timeout):
        while True:
            m = await group_members(routes, group)
            if node in m.voters:
                return m
            if m.matches.get(node, 0) >= m.commit:
                try:
                    return await _change(routes, group, "promote", node)
                except RequestError as exc:
                    if not exc.retriable:
                        raise
            await anyio.sleep(_POLL)


async def remove_replica(routes: Routes, group: str, node: int) -> GroupMembers:
    """Take `node` out of `group` and have it delete its replica (when reachable)."""
    m = await group_members(routes, group)
    _check_node(m, node)
    if node in m.voters or node in m.learners:
        m = await _change(routes, group, "remove", node)
    return dataclasses.replace(m, dropped=await _drop(routes, m, node))


async def _drop(routes: Routes, m: GroupMembers, node: int) -> bool:
    """Have `node` delete its replica of the group; a node that is down is left be (a
    node coming back with an old replica of a group that left it takes no part: it is
    no member, and the next `remove-replica` deletes it)."""
    with anyio.move_on_after(_DROP_WAIT):
        while True:
            try:
                await _node_request(routes, m, node, DropGroupRequest(g=m.group),
                                    routes.timeout)
                return True
            except RequestError as exc:
                if exc.code not in (Code.MEMBERSHIP_REFUSED, Code.BUSY):
                    return False  # down or unreachable: nothing more to do now
            await anyio.sleep(_POLL)
    return False


async def replace_replica(routes: Routes, group: str, old: int, new: int, *,
                          catch_up_timeout: float = CATCH_UP_TIMEOUT) -> GroupMembers:
    """Replace `old`'s replica of `group` by one on `new` (or by a fresh one on `old`
    itself, when `new == old`: a replaced disk). Leadership leaves `old` first.

    A step that fails for a reason that may pass (the node being re-created restarts
    under it: CONNECTION_LOST; an election) is not the end: the replace runs again,
    resuming where it stopped, until `catch_up_timeout` seconds from the start are
    spent; then the last error is raised."""
    deadline = anyio.current_time() + catch_up_timeout
    resumed = False
    while True:
        try:
            return await _replace(routes, group, old, new, resumed=resumed,
                                  catch_up_timeout=max(_POLL, deadline - anyio.current_time()))
        except RequestError as exc:
            if not is_retriable(exc) or anyio.current_time() + _RETRY_WAIT >= deadline:
                raise
            log.info("replace-replica %s %d %d: %s; resuming", group, old, new, exc)
            resumed = True
        await anyio.sleep(_RETRY_WAIT)


async def _replace(routes: Routes, group: str, old: int, new: int, *, resumed: bool,
                   catch_up_timeout: float) -> GroupMembers:
    """One run of `replace_replica`; `resumed`: an earlier run of this same call
    stopped, so a replace found done was done by it."""
    m = await group_members(routes, group)
    _check_node(m, old)
    _check_node(m, new)
    if resumed and old != new and old not in m.voters and new in m.voters:
        return m  # the earlier run finished but lost the last answer
    if old != new and old not in m.voters:
        # A bad request and an earlier run that lost its answer look alike here: refuse,
        # saying which, rather than answer success to a request that named the wrong node.
        done = (f"; node {new} votes already, so a replace of {old} by {new} that stopped "
                "after its last step is complete" if new in m.voters else "")
        raise RequestError(Code.NOT_A_MEMBER, f"node {old} is not a voter of group {group} "
                           f"(voters: {list(m.voters)}): nothing to replace{done}")
    if old == new:
        # Leadership leaves it for now only: once its replica is back it is the preferred
        # leader again, as before, and leaders stay spread. A node that is no voter any
        # more (an earlier run removed it and stopped) is only added back, a learner's
        # catch-up resumed.
        if old in m.voters:
            await _remove_not_leading(routes, group, old, prefer=False)
        return await add_replica(routes, group, new, catch_up_timeout=catch_up_timeout)
    if new not in m.voters:
        await add_replica(routes, group, new, catch_up_timeout=catch_up_timeout,
                          replaces=old)
    return await _remove_not_leading(routes, group, old, prefer=True)


async def _remove_not_leading(routes: Routes, group: str, node: int, *,
                              prefer: bool) -> GroupMembers:
    """`remove_replica`, moving leadership off `node` first (again, should the group hand
    it back meanwhile); `prefer` makes the new leader the preferred one if `node` was."""
    refused_since: float | None = None
    with anyio.fail_after(60.0):
        while True:
            m = await group_members(routes, group)
            if m.leader == node:
                await _move_leadership(routes, m, avoid=node,
                                       prefer=prefer and m.preferred == node)
            try:
                return await remove_replica(routes, group, node)
            except RequestError as exc:
                if exc.code != Code.MEMBERSHIP_REFUSED:
                    raise
                if (await group_members(routes, group)).leader != node:
                    # refused for another reason (no reachable majority): maybe only not
                    # yet known to a leader that has just taken over
                    now = anyio.current_time()
                    refused_since = now if refused_since is None else refused_since
                    if now - refused_since >= REACHABLE_WAIT:
                        raise
                    await anyio.sleep(_POLL)


async def _move_leadership(routes: Routes, m: GroupMembers, *, avoid: int,
                           prefer: bool) -> None:
    """Hand `m.group`'s leadership to its most caught-up other voter, and wait for it."""
    others = [v for v in m.voters if v != avoid]
    if not others:
        raise RequestError(Code.MEMBERSHIP_REFUSED, f"node {avoid} is the only voter of "
                           f"group {m.group}")
    to = max(others, key=lambda v: m.matches.get(v, 0))
    with anyio.fail_after(30.0):
        while True:
            try:
                await transfer_leader(routes, m.group, to, prefer=prefer)
            except RequestError as exc:
                if not exc.retriable:
                    raise
            await anyio.sleep(_POLL)
            try:
                now = await group_members(routes, m.group)
            except RequestError as exc:
                if not exc.retriable:
                    raise
                continue
            if now.leader != avoid:
                return
