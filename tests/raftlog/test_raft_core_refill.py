"""Refilling after InstallSnapshot (`raftlog.core`, "Refilling"): a state may reference
log entries at or below its snapshot's index (the broker's ConsumeQueues point at every
retained entry), so a follower that installs a snapshot keeps its log from the leader's
first index and gets the entries up to the snapshot by ordinary appends before it may
lead."""

from __future__ import annotations

from raftlog.core import RaftConfig, RaftNode
from raftlog.sim.disk import SimStore
from raftlog.types import HardState, Message, MsgType, Role
from tests.raft_harness import Cluster

KEEP = 8  # entries the leader's compaction keeps below its snapshot


def _behind(c: Cluster) -> tuple[int, int]:
    """Elect, cut a follower off, commit entries without it, snapshot the leader keeping
    the last KEEP entries below the snapshot. Returns (leader, follower)."""
    leader = c.elect()
    c.propose(b"before")
    follower = next(i for i in c.nodes if i != leader.id)
    c.isolate(follower)
    for k in range(30):
        c.propose(b"m%d" % k)
    c.tick(2)
    c.snapshot(leader.id, keep=KEEP)
    first = c.stores[leader.id].first_index()
    assert first == leader.applied - KEEP + 1 > c.nodes[follower].last_index + 1
    return leader.id, follower


def _run_without_appends_to(c: Cluster, follower: int, rounds: int = 6) -> None:
    """Tick and deliver, dropping every append to `follower` once it installed the
    leader's snapshot (it then waits for its entries)."""
    def keep(m: Message) -> bool:
        return not (c.installed[follower] and m.dst == follower and m.type == MsgType.APPEND)

    for _ in range(rounds):
        for node in c.nodes.values():
            node.tick()
        for _ in range(5):
            c.deliver(keep)


def test_the_snapshot_carries_the_leaders_first_index_and_the_follower_refills_from_it() -> None:
    c = Cluster(3, seed=11)
    lead, follower = _behind(c)
    leader, st = c.nodes[lead], c.stores[lead]
    first, snap = st.first_index(), leader.snapshot_index
    c.heal()
    _run_without_appends_to(c, follower)
    sent = [s.index for s in c.installed[follower]]
    assert sent == [snap] and c.installed[follower][0].base == (first - 1, st.term(first - 1))
    f = c.nodes[follower]
    assert f.refilling and (f.last_index, f.commit, f.applied) == (first - 1, snap, snap)
    assert c.stores[follower].first_index() == first
    assert leader._progress[follower].match == first - 1  # the base, not the snapshot

    # while refilling it neither campaigns nor takes a handed-over leadership
    term = f.term
    for _ in range(3 * f.cfg.election_ticks):
        f.tick()
    f.step(Message(MsgType.TIMEOUT_NOW, lead, follower, leader.term))
    c.process(follower)
    assert f.role == Role.FOLLOWER and f.term == term

    # the appends bring every entry from the leader's first index on
    c.propose(b"after")
    c.tick(3)
    assert not f.refilling and f.last_index == leader.last_index
    fst = c.stores[follower]
    assert fst.first_index() == first
    assert all(fst.entry(i) == st.entry(i) for i in range(first, leader.last_index + 1))
    assert c.state[follower] == c.state[lead]

    # and once whole it may lead, holding everything its state points at
    leader.transfer_leadership(follower)
    c.stabilize()
    c.tick(2)
    assert c.leader().id == follower
    assert c.stores[follower].first_index() == first


def test_a_refilling_follower_votes_as_if_its_log_ended_at_the_snapshot() -> None:
    """Its log ends at the base, but the snapshot's last entry is committed: a candidate
    whose log ends before it must not win with this vote (§5.4.1)."""
    c = Cluster(3, seed=12)
    lead, follower = _behind(c)
    leader = c.nodes[lead]
    c.heal()
    _run_without_appends_to(c, follower)
    f = c.nodes[follower]
    assert f.refilling
    snap = leader.snapshot_index
    behind = Message(MsgType.VOTE, 9, follower, f.term + 1, log_index=snap - 1,
                     log_term=leader.term_at(snap - 1), context=1)
    f.step(behind)
    assert [m.reject for m in f.ready().messages if m.type == MsgType.VOTE_RESP] == [True]
    level = Message(MsgType.VOTE, 9, follower, f.term, log_index=snap,
                    log_term=leader.term_at(snap), context=1)
    f.step(level)
    assert [m.reject for m in f.ready().messages if m.type == MsgType.VOTE_RESP] == [False]


def test_a_restart_with_a_state_ahead_of_the_log_resumes_refilling() -> None:
    """The shell restores a snapshot beyond its log's end (an interrupted refill, or an
    own snapshot whose unsynced tail a crash lost): commit and applied start there."""
    c = Cluster(3, seed=13)
    leader = c.elect()
    for k in range(10):
        c.propose(b"m%d" % k)
    st = SimStore(HardState(leader.term, None, ((0, 0, leader.membership),)))
    st.reset_to(4, leader.term_at(4))
    node = RaftNode(9, st, st.hard_state, RaftConfig(), rng=c.rng, applied=10)
    assert node.refilling and (node.last_index, node.commit, node.applied) == (4, 10, 10)
    assert not node.ready().apply  # nothing to apply until the log is past 10


def test_membership_changes_refilled_below_the_snapshot_do_not_replace_its_membership() -> None:
    """The snapshot names the membership in force at its index; CONFIG entries below it
    that the refill brings (one per append here) are history, not news (thesis §4.1)."""
    c = Cluster(3, seed=14, config=lambda i: RaftConfig(max_append_bytes=1))
    leader = c.elect()
    c.propose(b"before")
    follower = next(i for i in c.nodes if i != leader.id)
    c.isolate(follower)
    for k in range(10):
        c.propose(b"a%d" % k)
    leader.add_learner(4)
    c.stabilize()
    c.propose(b"b")
    leader.remove(4)
    c.stabilize()
    for k in range(6):
        c.propose(b"c%d" % k)
    c.tick(2)
    c.snapshot(leader.id, keep=10)
    first = c.stores[leader.id].first_index()
    assert c.nodes[follower].last_index + 1 < first < leader.applied - 8  # both changes kept
    want = leader.membership_at(leader.snapshot_index)
    assert 4 not in want.members
    seen = []

    def watch(m: Message) -> bool:
        f = c.nodes[follower]
        if c.installed[follower] and f.refilling:
            seen.append(f.membership)
        return True

    c.heal()
    for _ in range(30):
        for node in c.nodes.values():
            node.tick()
        c.deliver(watch)
    assert seen and all(m == want for m in seen)
    assert not c.nodes[follower].refilling and c.nodes[follower].membership == want


def test_a_new_leader_without_the_next_refill_entry_sends_its_own_snapshot() -> None:
    """The follower refills from leader A's first index; A is cut off and B, which
    compacted further, leads: B sends its snapshot (at the same index here) with its own
    base, and the follower installs it and refills from there instead of looping."""
    c = Cluster(3, seed=15, config=lambda i: RaftConfig(max_append_bytes=1))
    a = c.elect()
    c.propose(b"before")
    f, b = (i for i in sorted(c.nodes) if i != a.id)
    c.isolate(f)
    for k in range(30):
        c.propose(b"m%d" % k)
    c.tick(2)
    c.snapshot(a.id, keep=20)
    c.snapshot(b, keep=2)
    first_a, first_b = c.stores[a.id].first_index(), c.stores[b].first_index()
    assert first_a + 10 < first_b

    def keep(m: Message) -> bool:  # let the refill stop a little after A's first index
        return not (m.dst == f and m.type == MsgType.APPEND
                    and c.installed[f] and c.nodes[f].last_index >= first_a + 2)

    c.heal()
    for _ in range(6):
        for node in c.nodes.values():
            node.tick()
        for _ in range(5):
            c.deliver(keep)
    follower = c.nodes[f]
    assert follower.refilling and follower.last_index < first_b - 1

    c.isolate(a.id)
    for _ in range(100):  # the follower cannot campaign: only B can take over
        if c.nodes[b].role == Role.LEADER:
            break
        c.tick(1, only=[f, b])
    assert c.nodes[b].role == Role.LEADER
    c.nodes[b].propose(b"after")
    c.tick(4, only=[f, b])
    assert [s.base[0] + 1 for s in c.installed[f] if s.base] == [first_a, first_b]
    assert not follower.refilling and follower.last_index == c.nodes[b].last_index
    assert c.stores[f].first_index() == first_b
    assert c.state[f] == c.state[b]


def test_a_refill_stops_before_an_entry_the_leader_cannot_read_until_it_is_repaired() -> None:
    """The leader never sends an unreadable entry, not even to refill: the follower
    stays refilling (no lead, no apply) until the leader's copy is repaired."""
    c = Cluster(3, seed=15)
    lead, follower = _behind(c)
    leader = c.nodes[lead]
    first = c.stores[lead].first_index()
    c.corrupt(lead, first + 2)
    c.heal()
    c.tick(6)
    f = c.nodes[follower]
    assert f.refilling and f.last_index == first + 1
    assert c.to_repair[lead] == [first + 2] and lead == c.leader().id
    assert c.repair(lead) == [first + 2]
    c.propose(b"after")
    c.tick(3)
    assert not f.refilling and f.last_index == leader.last_index
    assert c.state[follower] == c.state[lead]


def test_a_refilled_entry_that_reads_back_bad_keeps_the_replica_from_leading() -> None:
    """Refilled entries lie below the applied state, so one found unreadable freezes
    nothing; but the replica may not lead until a peer's copy repairs it."""
    c = Cluster(3, seed=16)
    lead, follower = _behind(c)
    leader = c.nodes[lead]
    first = c.stores[lead].first_index()
    c.heal()
    c.propose(b"after")
    c.tick(3)
    f = c.nodes[follower]
    assert not f.refilling and f.last_index == leader.last_index
    c.corrupt(follower, first + 2)
    f.entry_unreadable(first + 2)  # as a check at open finds it
    applied = f.applied
    c.propose(b"later")
    c.tick(2)
    assert not f.frozen and f.applied > applied  # applies past it: it lies below the state
    leader.transfer_leadership(follower)
    c.stabilize()
    c.tick(2)
    assert c.leader().id == lead and f.role == Role.FOLLOWER
    c.tick(leader.cfg.election_ticks)  # the leader gives up on that transfer
    assert c.repair(follower) == [first + 2]
    leader.transfer_leadership(follower)
    c.stabilize()
    c.tick(2)
    assert c.leader().id == follower
