"""The cluster's own shape: STATUS, TRANSFER_LEADER, MEMBERSHIP, HOST_GROUP, DROP_GROUP.

What an operator asks of a node about its Raft groups rather than their data: the node's
status, moving a group's leadership, showing or changing a group's members one server at
a time, and starting or stopping a replica of a group here. A membership change is made
at the group's leader and refused when it would leave the group without a reachable
majority; a change already made answers OK, so a retried request does not fail for
having worked. Starting and stopping a replica is the node's own business
(`ClusterHost.host_group`, `drop_group`): this door checks the request and asks.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker.config import NodeConfig
from broker.doors.base import Handler, Response, applied
from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead
from broker.state.statemachine import control_prefer_leader
from raftlog.runtime import GroupRuntime
from raftlog.types import EntryType
from transport.framing import Caller
from wire.protocol import Code, Op, RequestError, ok_header
from wire.requests import (
    DropGroupAnswer,
    DropGroupRequest,
    HostGroupAnswer,
    HostGroupRequest,
    MembershipAnswer,
    MembershipRequest,
    StatusAnswer,
    StatusRequest,
    TransferLeaderAnswer,
    TransferLeaderRequest,
)
from wire.requests.cluster import host_taken

__all__ = ["ClusterDoor", "ClusterHost"]


class ClusterHost(Protocol):
    """What the cluster requests use of their node: its config (its id, its peers, the
    cluster's groups), its status, which peers it reaches, and the replicas it runs."""

    config: NodeConfig

    def reachable_peers(self) -> list[int]: ...

    def preferred_leader(self, gid: str) -> int | None: ...

    async def host_group(self, gid: str, voters: tuple[int, ...]) -> bool: ...

    async def drop_group(self, gid: str) -> bool: ...

    def status(self, caller: Caller | None = None) -> dict[str, Any]:
        """The fields of `StatusAnswer`."""
        ...


class ClusterDoor:
    """The cluster requests of one node."""

    def __init__(self, lead: GroupLead, groups: GroupRegistry, host: ClusterHost) -> None:
        self.lead = lead
        self.groups = groups
        self.host = host

    def handlers(self) -> dict[int, Handler]:
        return {
            Op.STATUS: self._status,
            Op.TRANSFER_LEADER: self._transfer_leader,
            Op.MEMBERSHIP: self._membership,
            Op.HOST_GROUP: self._host_group,
            Op.DROP_GROUP: self._drop_group,
        }

    async def _status(self, caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        StatusRequest.decode(h)
        return ok_header(0, **StatusAnswer(**self.host.status(caller)).header()), b""

    async def _transfer_leader(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Move the group's leadership to node `to`; with `prefer`, first log `to` as the
        group's preferred leader, so the core does not hand leadership back."""
        g = self.lead.group(h.get("g"))  # the group first, before the fields, as always
        req = TransferLeaderRequest.decode(h)
        to = req.to
        self.lead.leading(g)
        voters = sorted(g.membership.voters)
        if to not in voters:
            raise RequestError(Code.NOT_A_MEMBER, f"node {to} is not a voter of group "
                               f"{g.group_id} (voters: {voters})")
        if req.prefer:
            applied(await g.propose(control_prefer_leader(to), EntryType.CONTROL))
        try:
            g.transfer_leadership(to)
        except ValueError as exc:
            raise RequestError(Code.NOT_A_MEMBER, str(exc)) from None
        return ok_header(0, **TransferLeaderAnswer(voters=tuple(voters)).header()), b""

    # ------------------------------------------------------------------ membership

    def _members_view(self, g: GroupRuntime) -> Response:
        """The membership as this leader sees it; NOT_LEADER (retriable, with the hint)
        when it lost the leadership while the request waited (a barrier, a change)."""
        self.lead.leading(g)
        m = g.membership
        st = g.status()
        nodes = tuple(sorted(self.host.config.peers))
        assert g.leader is not None  # this node: it leads
        answer = MembershipAnswer(
            leader=g.leader, voters=tuple(sorted(m.voters)), learners=tuple(sorted(m.learners)),
            matches=g.peer_matches(), active=tuple(sorted(g.recently_active())),
            commit=st["commit"], last=st["last"],
            preferred=self.host.preferred_leader(g.group_id),
            addresses={n: self.groups.peer_addr(n) for n in nodes},
            peers=nodes,
            hosts={n: self.host.config.host_of(n) for n in nodes},
        )
        return ok_header(0, **answer.header()), b""

    async def _membership(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Show or change a group's membership, at its leader: one single-server change
        (add a learner, promote a caught-up learner, remove a member) at a time, refused
        when it would leave the group without a reachable majority. Changes already made
        answer OK (a retried request must not fail for having worked)."""
        g = self.lead.group(h.get("g"))  # the group first, before the fields, as always
        req = MembershipRequest.decode(h)
        action = req.action
        self.lead.leading(g)
        if action == "show":
            await g.read_barrier()  # still the leader, as a majority confirms
            return self._members_view(g)
        node = req.node
        if node is None:  # judged once this node knows it leads, as always
            raise RequestError(Code.MALFORMED, f"missing field 'node' (to {action})")
        me = self.host.config.node_id
        if node not in self.host.config.peers:
            raise RequestError(Code.NOT_A_MEMBER, f"node {node} is not in the cluster's peers "
                               f"table (known nodes: {sorted(self.host.config.peers)})")
        m = g.membership
        voters = sorted(m.voters)
        if action == "add-learner":
            if node in m.voters:
                raise RequestError(Code.MEMBERSHIP_REFUSED, f"node {node} is already a voter "
                                   f"of group {g.group_id} (voters: {voters})")
            if node in m.learners:
                return self._members_view(g)
            self._check_host(g.group_id, node, set(m.members) - {req.replaces})
        elif action == "promote":
            if node in m.voters:
                return self._members_view(g)
            if node not in m.learners:
                raise RequestError(Code.NOT_A_MEMBER, f"node {node} is not a learner of group "
                                   f"{g.group_id} (learners: {sorted(m.learners)})")
        else:
            if node not in m.members:
                return self._members_view(g)
            if node == me:
                raise RequestError(Code.MEMBERSHIP_REFUSED, f"node {node} leads group "
                                   f"{g.group_id}: move its leadership to another voter first "
                                   f"(raftmq cluster transfer-leader {g.group_id} NODE)")
            if node in m.voters:
                self._check_quorum_after_removal(g.group_id, node, voters)
        try:
            await g.change_membership(action, node)  # type: ignore[arg-type]
        except ValueError as exc:
            raise RequestError(Code.MEMBERSHIP_REFUSED, str(exc)) from None
        return self._members_view(g)

    def _check_host(self, gid: str, node: int, members: set[int]) -> None:
        """One replica of a group per host: a host's failure (its power, its disk, its
        kernel) takes every shard on it at once, so two replicas there are one."""
        cfg = self.host.config
        clash = cfg.host_clash(node, members)
        if clash is not None:
            raise RequestError(Code.MEMBERSHIP_REFUSED,
                               host_taken(node, cfg.host_of(node), clash, gid))

    def _check_quorum_after_removal(self, gid: str, node: int, voters: list[int]) -> None:
        rest = [v for v in voters if v != node]
        if not rest:
            raise RequestError(Code.MEMBERSHIP_REFUSED, f"node {node} is the last voter of "
                               f"group {gid}: a group needs at least one")
        me = self.host.config.node_id
        # connected, and heard from lately (a paused node keeps its connections)
        reachable = (set(self.host.reachable_peers()) | {me}) & self.groups[gid].recently_active()
        live = [v for v in rest if v in reachable]
        if len(live) < len(rest) // 2 + 1:
            raise RequestError(Code.MEMBERSHIP_REFUSED, f"removing node {node} from group {gid} "
                               f"would leave voters {rest}, of which only {live} are reachable: "
                               f"a majority ({len(rest) // 2 + 1}) must be, or the group "
                               "stops. Bring a node back (or add one) first")

    # ------------------------------------------------------------------ replicas here

    async def _host_group(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = HostGroupRequest.decode(h)
        gid = req.g
        known = sorted(gc.id for gc in self.host.config.groups)
        if gid not in known:
            raise RequestError(Code.UNKNOWN_GROUP, f"no group {gid!r} in the cluster "
                               f"(known: {known})")
        if not all(v in self.host.config.peers for v in req.voters):
            raise RequestError(Code.MALFORMED, f"voters must be node ids of the cluster's "
                               f"peers {sorted(self.host.config.peers)}, got "
                               f"{list(req.voters)!r}")
        created = await self.host.host_group(gid, tuple(sorted(set(req.voters))))
        return ok_header(0, **HostGroupAnswer(created=created).header()), b""

    async def _drop_group(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        gid = DropGroupRequest.decode(h).g
        try:
            dropped = await self.host.drop_group(gid)
        except ValueError as exc:
            raise RequestError(Code.MEMBERSHIP_REFUSED, f"{exc}: remove it from the group "
                               "first (raftmq cluster remove-replica)") from None
        return ok_header(0, **DropGroupAnswer(dropped=dropped).header()), b""
