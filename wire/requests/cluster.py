"""The cluster's own shape: STATUS, TRANSFER_LEADER, MEMBERSHIP, HOST_GROUP and
DROP_GROUP, what an operator asks of a node about its Raft groups rather than their data.

Which node ids are the cluster's (a membership change's `node`, HOST_GROUP's `voters`)
and which groups it has are the node's configuration: the node checks those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from wire.protocol import Code, Op, RequestError, is_int, validate_group_name
from wire.requests.base import WireType, spec

__all__ = ["MEMBERSHIP_ACTIONS", "host_taken", "DropGroupAnswer", "DropGroupRequest", "HostGroupAnswer",
           "HostGroupRequest", "MembershipAnswer", "MembershipRequest", "StatusAnswer",
           "StatusRequest", "TransferLeaderAnswer", "TransferLeaderRequest"]

#: What MEMBERSHIP may do: show the membership, or change it by one server.
MEMBERSHIP_ACTIONS = ("show", "add-learner", "promote", "remove")


def _node_ids(what: str) -> Any:
    def check(v: list[Any]) -> tuple[int, ...]:
        if not all(is_int(n) for n in v):
            raise RequestError(Code.MALFORMED, f"{what} must be node ids, got {v!r}")
        return tuple(v)
    return check


# ------------------------------------------------------------------ STATUS


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusRequest(WireType):
    OP: ClassVar[Op] = Op.STATUS
    ROLE: ClassVar[str] = "request"


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusAnswer(WireType):
    """The node's view of its groups; what a caller with ACLs may not see (topics,
    consumer groups) is left out of `groups`."""

    OP: ClassVar[Op] = Op.STATUS
    ROLE: ClassVar[str] = "answer"
    node: int = spec(int, "the node's id")
    addr: str = spec(str, "the node's address")
    host: str | None = spec(str, "the machine it runs on (its `[hosts]` entry, `n<id>` "
                            "without one)", default=None)
    groups: dict[str, Any] = spec(
        dict, "`{group: {...}}`: each group's Raft state (role, term, leader, commit, "
        "applied, last, durable, ...; `raftlog.runtime.GroupRuntime.status`), "
        "`leader_addr`, `queues` (`{topic: {queue: [min, end]}}`), `offsets` (`{cg: "
        "{topic: {queue: offset}}}`), `fifo` (`{cg: {topic: {queue: [message groups "
        "with a message in flight, messages held back behind them]}}}`: simple "
        "consumer groups' FIFO message groups), `tx_ids` and `tx_fences`, "
        "`delayed_pending` "
        "(delayed messages stored, not yet due), `delayed_in_memory` (of which in "
        "memory) and `delayed_runs` (files holding the others)")
    peers_connected: tuple[int, ...] = spec(list, "the peers this node holds a connection "
                                            "to", check=_node_ids("peers_connected"))


# ------------------------------------------------------------------ leadership


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferLeaderRequest(WireType):
    OP: ClassVar[Op] = Op.TRANSFER_LEADER
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group (its leader answers)")
    to: int = spec(int, "the voter to hand the leadership to")
    prefer: bool = spec(bool, "log `to` as the group's preferred leader first, so the "
                        "leadership stays (`broker.state.parts.leadership`)", default=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferLeaderAnswer(WireType):
    OP: ClassVar[Op] = Op.TRANSFER_LEADER
    ROLE: ClassVar[str] = "answer"
    voters: tuple[int, ...] = spec(list, "the group's voters", check=_node_ids("voters"))


# ------------------------------------------------------------------ membership


def _action(v: str) -> str:
    if v not in MEMBERSHIP_ACTIONS:
        raise RequestError(Code.MALFORMED, f"action must be show, add-learner, promote or "
                           f"remove, not {v!r}")
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipRequest(WireType):
    """Changes are single-server (thesis §4.1), one at a time, made at the leader."""

    OP: ClassVar[Op] = Op.MEMBERSHIP
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group (its leader answers)")
    action: str = spec(str, "`show`, `add-learner`, `promote` or `remove`", check=_action)
    node: int | None = spec(int, "the node a change is about (required but for `show`; "
                            "the leader checks it once it knows it leads)", default=None)
    replaces: int | None = spec(int, "for `add-learner`: the member the new one is to "
                                "replace, which may share its host (the other members may "
                                "not: one replica per host)", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipAnswer(WireType):
    """The membership as the leader sees it (after a change, once it is made)."""

    OP: ClassVar[Op] = Op.MEMBERSHIP
    ROLE: ClassVar[str] = "answer"
    leader: int = spec(int, "the leader (the answering node)")
    voters: tuple[int, ...] = spec(list, "the voters", check=_node_ids("voters"))
    learners: tuple[int, ...] = spec(list, "the learners", check=_node_ids("learners"))
    matches: dict[int, int] = spec(dict, "`{node: match index}`: each other member's last "
                                   "replicated entry")
    active: tuple[int, ...] = spec(list, "the members the leader heard from lately",
                                   check=_node_ids("active"))
    commit: int = spec(int, "the group's commit index")
    last: int = spec(int, "the leader's last log index")
    preferred: int | None = spec(int, "the group's preferred leader, when one was logged",
                                 default=None)
    addresses: dict[int, str | None] = spec(dict, "`{node: address}` of every node of the "
                                            "cluster")
    peers: tuple[int, ...] = spec(list, "every node of the cluster (the leader's peers "
                                  "table)", check=_node_ids("peers"))
    hosts: dict[int, str] | None = spec(dict, "`{node: host}`: the host of every node of "
                                        "the cluster (from the leader's `[hosts]` table; "
                                        "`n<id>` for a node of no named host)", default=None)


def host_taken(node: int, host: str, holder: int, group: str) -> str:
    """Why `node` may not take a replica of `group` (MEMBERSHIP_REFUSED): its host holds
    one already, on `holder`. The leader and the SDK say it alike."""
    return (f"node {node} is on host {host!r}, where node {holder} holds a replica of group "
            f"{group} already: a group keeps at most one replica per host (choose a node on "
            "another host, or replace that one)")


# ------------------------------------------------------------------ replicas here


def _voters(v: list[Any]) -> tuple[int, ...]:
    if not v or not all(is_int(n) for n in v):
        raise RequestError(Code.MALFORMED, f"voters must be node ids of the cluster, got {v!r}")
    return tuple(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostGroupRequest(WireType):
    OP: ClassVar[Op] = Op.HOST_GROUP
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group (one of the cluster's) to host an empty replica of, "
                  "caught up by its leader once added as a learner",
                  check=validate_group_name)
    voters: tuple[int, ...] = spec(list, "the group's voters (node ids of the cluster)",
                                   check=_voters)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostGroupAnswer(WireType):
    OP: ClassVar[Op] = Op.HOST_GROUP
    ROLE: ClassVar[str] = "answer"
    created: bool = spec(bool, "false when this node hosted it already")


@dataclass(frozen=True, slots=True, kw_only=True)
class DropGroupRequest(WireType):
    OP: ClassVar[Op] = Op.DROP_GROUP
    ROLE: ClassVar[str] = "request"
    g: str = spec(str, "the group to stop hosting and delete the data of (this node must "
                  "have been removed from it: else MEMBERSHIP_REFUSED)",
                  check=validate_group_name)


@dataclass(frozen=True, slots=True, kw_only=True)
class DropGroupAnswer(WireType):
    OP: ClassVar[Op] = Op.DROP_GROUP
    ROLE: ClassVar[str] = "answer"
    dropped: bool = spec(bool, "false when this node did not host it")
