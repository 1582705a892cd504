"""What the core tells the shell about a group for operators, and the preferred leader
the shell may change at run time (`raftmq cluster transfer-leader`)."""

from __future__ import annotations

from raftlog.core import RaftConfig
from raftlog.types import Role
from tests.raft_harness import Cluster


def _elect_1(c: Cluster) -> None:
    c.campaign(1)
    assert c.leader().id == 1


def test_a_preferred_leader_set_at_run_time_gets_leadership_and_keeps_it() -> None:
    c = Cluster(3)
    _elect_1(c)
    for n in c.nodes.values():
        n.preferred_leader = 2  # what the shell does once a prefer_leader record applied
    c.tick(c.nodes[1].cfg.election_ticks + 1)
    assert c.leader().id == 2
    c.tick(3 * c.nodes[1].cfg.election_ticks)
    assert c.leader().id == 2  # nothing hands it back to anyone


def test_without_a_preference_no_hand_back_happens() -> None:
    c = Cluster(3, config=lambda i: RaftConfig(preferred_leader=1))
    _elect_1(c)
    leader = c.leader()
    leader.transfer_leadership(3)
    c.stabilize()
    assert c.leader().id == 3
    c.tick(2 * leader.cfg.election_ticks + 1)
    assert c.leader().id == 1  # the configured preference pulls it back
    for n in c.nodes.values():
        n.preferred_leader = None
    c.leader().transfer_leadership(3)
    c.stabilize()
    c.tick(3 * leader.cfg.election_ticks)
    assert c.leader().id == 3


def test_recently_active_drops_a_peer_that_went_silent_and_matches_show_progress() -> None:
    c = Cluster(3)
    _elect_1(c)
    leader = c.nodes[1]
    index = c.propose(b"x")
    c.tick(2)
    assert leader.recently_active() == {1, 2, 3}
    assert leader.peer_matches() == {2: index, 3: index}
    assert c.nodes[2].recently_active() == frozenset() and c.nodes[2].peer_matches() == {}
    c.isolate(3)
    c.tick(2 * leader.cfg.election_ticks + 1, only=[1, 2])
    assert leader.role == Role.LEADER  # node 2 keeps its quorum
    assert leader.recently_active() == {1, 2}
    c.heal()
    c.tick(1, only=[1, 2])
    assert 3 in leader.recently_active()
