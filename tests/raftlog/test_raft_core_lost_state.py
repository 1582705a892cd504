"""A replica that lost its state but kept its log (`raftlog.core`, "Lost state"): its
snapshot, or a file the snapshot references, was damaged. It rebuilds from one snapshot
the leader offers, installed over its log as it is, instead of a replay of the whole log
or a refusal to start, and it never gives up an entry it acknowledged."""

from __future__ import annotations

import pytest

from raftlog.core import WANTS_STATE, ProposalDropped
from raftlog.types import Message, MsgType, Role
from tests.raft_harness import Cluster


def _compacted(c: Cluster, n: int = 20) -> tuple[int, int]:
    """Elect, commit `n` entries, snapshot and compact every replica. Returns (leader,
    one follower)."""
    leader = c.elect()
    for k in range(n):
        c.propose(b"m%d" % k)
    c.tick(2)
    for i in c.nodes:
        c.snapshot(i, keep=3)
    follower = next(i for i in c.nodes if i != leader.id)
    return leader.id, follower


def _offers(c: Cluster, to: int) -> list[Message]:
    return [m for m in c.mailbox if m.type == MsgType.SNAPSHOT and m.dst == to]


def _wants(c: Cluster, frm: int) -> list[Message]:
    return [m for m in c.mailbox if m.type == MsgType.HEARTBEAT_RESP and m.src == frm
            and m.hint_term == WANTS_STATE]


def test_a_follower_that_lost_its_state_gets_it_from_the_leader_and_keeps_its_log() -> None:
    c = Cluster(3, seed=21)
    lead, f = _compacted(c)
    entries_before = c.stores[f].entries(c.stores[f].first_index(), c.stores[f].last_index() + 1,
                                         1 << 30)
    first_before = c.stores[f].first_index()
    assert first_before > 1  # replaying from entry 1 is impossible: the log was cut
    c.lose_state(f)
    node = c.nodes[f]
    assert node.stateless and node.applied == 0
    c.tick(3)
    node = c.nodes[f]
    assert not node.stateless
    assert [s.keep_log for s in c.installed[f]] == [True]
    # the log is the very same: no entry dropped, none written again
    assert c.stores[f].first_index() == first_before
    assert c.stores[f].entries(first_before, first_before + len(entries_before),
                               1 << 30) == entries_before
    assert c.state[f] == c.state[lead]
    # and it applies what follows, as every replica does
    c.propose(b"after")
    c.tick(2)
    assert c.state[f] == c.state[lead] and c.state[f][-1] == b"after"
    assert not c.nodes[lead].state_wanted


def test_while_stateless_it_stores_acknowledges_and_votes_but_never_applies() -> None:
    c = Cluster(3, seed=22)
    lead, f = _compacted(c)
    other = next(i for i in c.nodes if i not in (lead, f))
    c.lose_state(f)
    c.isolate(other)
    # the leader holds no snapshot the follower could use yet: only appends reach it
    c.nodes[lead]._snapshot = None
    for k in range(5):
        c.propose(b"w%d" % k)
    c.tick(2)
    node = c.nodes[f]
    assert node.stateless and c.applied[f] == []
    # committed with the stateless follower's acknowledgements (the third is cut off)
    leader = c.nodes[lead]
    assert leader.commit == leader.last_index == node.last_index
    assert leader.state_wanted.keys() == {f}
    # the leader is lost for good: the third replica, behind, cannot win the stateless
    # one's vote, so the stateless one leads, brings the third up to date, hands over
    c.crash(lead)
    c.heal()
    new = c.elect()
    for _ in range(40):
        if new.id == other and not new.stateless:
            break
        c.tick()
        new = c.leader()
    assert new.id == other, [n.describe() for n in c.nodes.values()]
    assert new.last_index >= leader.last_index  # nothing the stateless replica held was lost
    assert b"w4" in c.state[other]
    c.snapshot(other)  # the shell's answer to `state_wanted`
    c.tick(3)
    assert not c.nodes[f].stateless and c.state[f] == c.state[other]


def test_a_stateless_leader_refuses_proposals_and_reads_and_hands_over() -> None:
    c = Cluster(3, seed=27)
    lead, f = _compacted(c)
    other = next(i for i in c.nodes if i not in (lead, f))
    c.isolate(other)
    c.propose(b"only on two")  # so the other voter is behind: it cannot win f's vote
    c.heal()
    c.lose_state(f)
    c.crash(lead)
    node = c.nodes[f]
    votes = {MsgType.PREVOTE, MsgType.PREVOTE_RESP, MsgType.VOTE, MsgType.VOTE_RESP}
    for _ in range(6 * node.cfg.election_ticks):
        node.tick()
        c.nodes[other].tick()
        c.deliver(lambda m: m.type in votes)
        if node.role == Role.LEADER:
            break
    assert node.role == Role.LEADER and node.stateless
    with pytest.raises(ProposalDropped, match="lost its state"):
        node.propose(b"x")
    with pytest.raises(ProposalDropped, match="lost its state"):
        node.read_index(1)
    c.stabilize()  # its appends reach the other voter, which catches up and takes over
    c.tick(2)
    assert c.leader().id == other
    assert not c.leader().stateless


def test_the_offer_waits_until_the_followers_log_holds_the_snapshots_entry() -> None:
    c = Cluster(3, seed=23)
    lead, f = _compacted(c, n=10)
    c.lose_state(f)
    c.isolate(f)
    for k in range(10):
        c.propose(b"n%d" % k)
    c.tick(2)
    c.snapshot(lead, keep=1000)  # beyond the follower's log; the leader keeps its log
    snap_index = c.nodes[lead].snapshot_index
    assert c.nodes[f].last_index < snap_index
    c.heal()
    c.auto_install = False
    seen: list[Message] = []

    def note(m: Message) -> bool:
        if m.type == MsgType.SNAPSHOT and m.dst == f:
            seen.append(m)
            assert c.nodes[f].last_index >= m.log_index  # its log holds the entry by now
        return True

    for _ in range(6):
        c.nodes[lead].tick()
        while c.deliver(note):
            pass
        if f in c.installing:
            break
    snap = c.installing[f]
    assert snap.keep_log and snap.index == snap_index
    # the one offer went out once the follower's log reached the snapshot's entry
    assert len(seen) == 1 and c.nodes[f].last_index >= snap_index
    c.install(f)
    c.tick(2)
    assert c.state[f] == c.state[lead]


def test_a_stateless_follower_behind_the_leaders_first_index_installs_as_any_does() -> None:
    c = Cluster(3, seed=28)
    lead, f = _compacted(c, n=10)
    c.lose_state(f)
    c.isolate(f)
    for k in range(10):
        c.propose(b"n%d" % k)
    c.tick(2)
    c.snapshot(lead)  # and the leader's log now begins after it
    snap_index = c.nodes[lead].snapshot_index
    assert c.stores[lead].first_index() > c.nodes[f].last_index + 1
    c.heal()
    c.tick(3)
    assert not c.nodes[f].stateless
    assert [(s.index, s.keep_log) for s in c.installed[f]] == [(snap_index, False)]
    assert c.state[f] == c.state[lead]


def test_a_follower_whose_log_was_cut_above_the_leaders_base_asks_for_a_newer_snapshot(
        ) -> None:
    c = Cluster(3, seed=24)
    leader = c.elect()
    lead = leader.id
    for k in range(10):
        c.propose(b"a%d" % k)
    c.tick(2)
    c.snapshot(lead)  # the leader's snapshot at 11 keeps its log from 12
    old = c.nodes[lead].snapshot_index
    for k in range(10):
        c.propose(b"b%d" % k)
    c.tick(2)
    f = next(i for i in c.nodes if i != lead)
    c.snapshot(f)  # the follower's own retention cut further
    assert c.stores[f].first_index() > old + 1
    # the leader's log still begins right after its snapshot (hand-made: no retention)
    c.lose_state(f)
    c.tick(1)
    assert c.nodes[lead].state_wanted.keys() == {f} and not _offers(c, f)
    assert c.nodes[f].stateless
    c.snapshot(lead)  # the shell's answer to `state_wanted`: a fresh one
    c.tick(3)
    assert not c.nodes[f].stateless and c.state[f] == c.state[lead]
    assert c.installed[f][-1].index > old


def test_a_stateless_replica_whose_log_begins_at_entry_1_replays_it_when_no_leader_comes(
        ) -> None:
    c = Cluster(3, seed=25)
    lead = c.elect().id
    for k in range(8):
        c.propose(b"p%d" % k)
    c.tick(2)
    f = next(i for i in c.nodes if i != lead)
    assert c.stores[f].first_index() == 1
    c.lose_state(f)
    c.isolate(f)
    node = c.nodes[f]
    for _ in range(2 * node.cfg.election_ticks):
        node.tick()
    assert node.stateless  # still waiting for an offer
    for _ in range(9 * node.cfg.election_ticks):
        node.tick()
        c.process(f)
    assert not node.stateless
    assert node.role != Role.FOLLOWER or node.term > c.nodes[lead].term  # it campaigns again
    c.heal()
    c.tick(3)
    c.elect()
    c.tick(2)
    assert c.state[f] == c.state[lead]
    assert not c.installed[f]  # rebuilt from its own log, entry 1 on


def test_a_stateless_follower_asks_in_every_heartbeat_answer_and_stops_once_whole() -> None:
    c = Cluster(3, seed=26)
    lead, f = _compacted(c)
    c.lose_state(f)
    c.nodes[lead].tick()
    c.process_all()
    c.deliver(lambda m: m.type == MsgType.HEARTBEAT)
    asks = _wants(c, f)
    assert asks and asks[0].hint_index == c.stores[f].first_index()
    c.stabilize()
    c.tick(3)
    assert not c.nodes[f].stateless
    c.nodes[lead].tick()
    c.process_all()
    c.deliver(lambda m: m.type == MsgType.HEARTBEAT)
    assert not _wants(c, f)


def test_a_replica_far_behind_in_applying_campaigns_later_than_one_that_is_not() -> None:
    """Only timing: a replica replaying a long backlog would sit as a leader that is not
    ready to serve; it waits twice its election timeout, so one that applied more wins."""
    from raftlog.core import RaftConfig

    c = Cluster(3, seed=29, config=lambda i: RaftConfig(slow_apply_entries=2))
    lead = c.elect().id
    for k in range(6):
        c.propose(b"s%d" % k)
    c.tick(2)
    f = next(i for i in c.nodes if i != lead)
    c.crash(f)
    c.start(f)  # applied 0 again, its log whole: it replays once it knows the commit
    node = c.nodes[f]
    node.commit = node.last_index  # as a heartbeat from the old leader would tell it
    c.isolate(f)
    elapsed_needed = None
    for t in range(1, 4 * node.cfg.election_ticks + 1):
        node.tick()
        if node.role != Role.FOLLOWER:
            elapsed_needed = t
            break
    assert elapsed_needed is not None and elapsed_needed >= 2 * node.cfg.election_ticks
