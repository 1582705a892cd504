"""The typed cluster requests (`wire.requests.cluster`): STATUS, TRANSFER_LEADER,
MEMBERSHIP, HOST_GROUP and DROP_GROUP."""

from __future__ import annotations

import pytest

from tests.wire.wiretypes import holds_to_its_fields, refused, round_trip
from wire.protocol import Code
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
    WireType,
)

MEMBERS = MembershipAnswer(
    leader=1, voters=(1, 2, 3), learners=(4,), matches={2: 10, 3: 9, 4: 2}, active=(2, 3),
    commit=10, last=11, preferred=2, addresses={1: "n1:1", 2: "n2:1", 3: None, 4: "n4:1"},
    peers=(1, 2, 3, 4))

EXAMPLES: list[WireType] = [
    StatusRequest(),
    StatusAnswer(node=1, addr="127.0.0.1:7101", groups={"g0": {
        "role": "leader", "term": 3, "queues": {"t": {0: [0, 5]}}, "offsets": {}}},
        peers_connected=(2, 3)),
    TransferLeaderRequest(g="g0", to=2, prefer=True),
    TransferLeaderAnswer(voters=(1, 2, 3)),
    MembershipRequest(g="g0", action="promote", node=4),
    MEMBERS,
    HostGroupRequest(g="g0", voters=(1, 2, 3)),
    HostGroupAnswer(created=True),
    DropGroupRequest(g="g0"),
    DropGroupAnswer(dropped=False),
]


@pytest.mark.parametrize("x", EXAMPLES, ids=lambda x: type(x).__name__)
def test_each_cluster_type_holds_to_its_fields(x: WireType) -> None:
    holds_to_its_fields(x)


def test_defaults_are_left_out_and_filled_in() -> None:
    assert StatusRequest().header() == {}
    assert TransferLeaderRequest(g="g0", to=2).header() == {"g": "g0", "to": 2}
    show = MembershipRequest(g="g0", action="show")
    assert show.header() == {"g": "g0", "action": "show"} and show.node is None
    unpreferred = MembershipAnswer.decode({**MEMBERS.header(), "preferred": None})
    assert unpreferred.preferred is None
    round_trip(unpreferred)


@pytest.mark.parametrize("action", ["grow", "", "SHOW"])
def test_a_membership_action_is_one_of_four(action: str) -> None:
    refused(MembershipRequest, {"g": "g0", "action": action}, Code.MALFORMED, "action")


@pytest.mark.parametrize("voters", [[], [1, "2"], [True], [1.0]])
def test_host_group_voters_are_node_ids(voters: list[object]) -> None:
    refused(HostGroupRequest, {"g": "g0", "voters": voters}, Code.MALFORMED, "voters")


@pytest.mark.parametrize("kind", [HostGroupRequest, DropGroupRequest])
def test_a_bad_group_is_an_invalid_name(kind: type[WireType]) -> None:
    refused(kind, {"g": "bad group!", "voters": [1]}, Code.INVALID_NAME, "group")


def test_node_lists_are_node_ids() -> None:
    refused(MembershipAnswer, {**MEMBERS.header(), "voters": [1, "2"]}, Code.MALFORMED,
            "voters")
    refused(StatusAnswer, {"node": 1, "addr": "a:1", "groups": {},
                           "peers_connected": ["2"]}, Code.MALFORMED, "peers_connected")
