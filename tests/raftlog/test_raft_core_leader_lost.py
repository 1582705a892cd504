"""`leader_unreachable`: the shell's "link to the leader dropped" hint (thesis §9.6 PreVote
still guards every campaign it starts; thesis §6.2 leases still hold for the others)."""

from __future__ import annotations

from raftlog.core import RaftConfig
from raftlog.types import MsgType, Role
from tests.raft_harness import Cluster


def _followers(c: Cluster, leader_id: int) -> list[int]:
    return sorted(i for i in c.nodes if i != leader_id)


def test_followers_of_a_dead_leader_elect_within_a_few_ticks_not_a_timeout():
    c = Cluster(3)
    old = c.elect()
    term = old.term
    c.crash(old.id)
    for i in _followers(c, old.id):
        c.nodes[i].leader_unreachable(old.id)
    c.tick(2)  # the lowest-ranked follower campaigns at the first tick, and wins
    new = c.leader()
    assert new.id != old.id and new.term == term + 1  # one round: no split vote
    assert all(n.leader == new.id for n in c.nodes.values())
    assert new.cfg.election_ticks == 10  # against at least 10 ticks without the hint


def test_followers_campaign_in_distinct_ticks_so_the_vote_does_not_split():
    c = Cluster(5)
    old = c.elect()
    c.crash(old.id)
    for i in _followers(c, old.id):
        c.nodes[i].leader_unreachable(old.id)
    c.tick(1)
    first = min(_followers(c, old.id))
    assert c.leader().id == first
    c.tick(5)
    assert c.leader().id == first and c.leader().term == old.term + 1


def test_without_the_hint_the_election_waits_for_the_timeout():
    c = Cluster(3)
    old = c.elect()
    c.crash(old.id)
    c.tick(5)
    assert all(n.role == Role.FOLLOWER for n in c.nodes.values())


def test_a_leader_or_a_candidate_ignores_it():
    c = Cluster(3)
    leader = c.elect()
    other = _followers(c, leader.id)[0]
    leader.leader_unreachable(other)
    assert leader.role == Role.LEADER
    cand = c.nodes[other]
    cand.tick()  # a pre-vote round under way
    while cand.role == Role.FOLLOWER:
        cand.tick()
    role, term = cand.role, cand.term
    elapsed = cand._election_elapsed
    cand.leader_unreachable(leader.id)
    assert (cand.role, cand.term, cand._election_elapsed) == (role, term, elapsed)


def test_a_follower_ignores_a_peer_that_is_not_its_leader():
    c = Cluster(3)
    leader = c.elect()
    a, b = _followers(c, leader.id)
    before = c.nodes[a]._election_elapsed, c.nodes[a]._timeout
    c.nodes[a].leader_unreachable(b)
    assert (c.nodes[a]._election_elapsed, c.nodes[a]._timeout) == before


def test_9_6_prevote_protects_a_live_leader_from_one_dropped_link():
    """Only one follower's link dropped: the leader and the other follower are in lease,
    so the pre-vote fails, no term moves, and the next heartbeat ends the attempt."""
    c = Cluster(3)
    leader = c.elect()
    term = leader.term
    a, _b = _followers(c, leader.id)
    c.isolate(a)  # the connection is down for a moment
    c.nodes[a].leader_unreachable(leader.id)
    c.heal()  # it reconnects straight away
    for _ in range(4):
        c.tick()
    assert c.leader() is leader and all(n.term == term for n in c.nodes.values())
    assert c.nodes[a].role == Role.FOLLOWER and c.nodes[a].leader == leader.id
    assert not c.nodes[a]._timeout_forced  # the heartbeat gave back a random timeout


def test_a_heartbeat_before_the_timer_fires_cancels_the_campaign():
    c = Cluster(3)
    leader = c.elect()
    a = _followers(c, leader.id)[0]
    c.nodes[a].leader_unreachable(leader.id)
    c.tick(1, only=[leader.id])  # the leader's heartbeat arrives first
    c.tick(3)
    assert c.leader() is leader and c.nodes[a].role == Role.FOLLOWER


def test_it_does_nothing_without_prevote():
    c = Cluster(3, config=lambda i: RaftConfig(pre_vote=False))
    leader = c.elect()
    a = _followers(c, leader.id)[0]
    before = c.nodes[a]._election_elapsed, c.nodes[a]._timeout
    c.nodes[a].leader_unreachable(leader.id)
    assert (c.nodes[a]._election_elapsed, c.nodes[a]._timeout) == before


def test_the_campaign_starts_with_a_prevote():
    c = Cluster(3)
    leader = c.elect()
    a = _followers(c, leader.id)[0]
    c.crash(leader.id)
    c.nodes[a].leader_unreachable(leader.id)
    c.nodes[a].tick()
    sent = c.nodes[a].ready().messages
    assert sent and all(m.type == MsgType.PREVOTE for m in sent)


def test_repeated_reports_do_not_postpone_the_campaign():
    """A shell redialling a dead leader through a proxy reports the loss on every failed
    reconnect, several times a tick: the slot taken at the first report must hold."""
    c = Cluster(3)
    c.campaign(3)
    old = c.leader()
    assert old.id == 3
    c.crash(old.id)
    second = c.nodes[2]  # rank 1 among the other voters: campaigns at the second tick
    for _ in range(2):
        second.leader_unreachable(old.id)
        second.leader_unreachable(old.id)
        assert second.role == Role.FOLLOWER
        second.tick()
    assert second.role == Role.PRE_CANDIDATE


def test_a_follower_ahead_of_the_first_ranked_one_still_takes_over():
    """Chaos run, seed 11: leader 3 was killed while follower 1 (first in rank) held a
    shorter log than follower 2, and both kept redialling 3 through the fault proxy. 2
    rightly refused 1's pre-votes, and each new report moved 2's own campaign two ticks
    further off, so nobody led the group until 3 came back (7.75 s)."""
    c = Cluster(3)
    c.campaign(3)
    old = c.leader()
    assert old.id == 3
    c.isolate(1)
    c.propose(b"only 2 and 3 have it")  # committed by 2 and 3; 1 stays behind
    c.crash(old.id)
    c.heal()
    assert c.nodes[2].last_index > c.nodes[1].last_index
    for _ in range(4):
        for i in (1, 2, 1, 2):  # several reconnects fail within each tick
            c.nodes[i].leader_unreachable(old.id)
        c.tick()
    new = c.leader()
    assert new.id == 2 and new.term == old.term + 1
    assert c.nodes[1].leader == 2
