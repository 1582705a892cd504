"""Scenario tests of the Raft core, named after the sections they check."""

from __future__ import annotations

import pytest

from raftlog.core import NotLeader, ProposalDropped, RaftConfig, RaftNode
from raftlog.driver import carry_out
from raftlog.types import EntryType, HardState, Membership, Message, MsgType, Role
from tests.paths import REPO_ROOT
from tests.raft_harness import Cluster, _NodeShell


def test_5_2_one_leader_is_elected_and_everyone_follows_it():
    c = Cluster(3)
    leader = c.elect()
    assert all(n.leader == leader.id and n.term == leader.term for n in c.nodes.values())
    # §5.4.2: the new leader's NOOP is committed and applied everywhere.
    c.tick(2)
    assert all(n.applied == n.commit == leader.last_index for n in c.nodes.values())
    assert c.applied[leader.id][0].type == EntryType.NOOP


def test_5_3_replication_commits_in_order_on_every_replica():
    c = Cluster(5)
    c.elect()
    for k in range(20):
        c.propose(b"m%d" % k)
    c.tick(2)
    want = [b"m%d" % k for k in range(20)]
    assert all(c.payloads(i) == want for i in c.nodes)


def test_proposals_to_a_follower_are_refused_with_a_leader_hint():
    c = Cluster(3)
    leader = c.elect()
    follower = next(n for n in c.nodes.values() if n is not leader)
    with pytest.raises(NotLeader) as e:
        follower.propose(b"x")
    assert e.value.leader == leader.id


def test_commit_waits_for_fsync_on_a_majority():
    """An ACK means fsynced on a majority: written-but-unsynced copies do not count."""
    c = Cluster(3)
    leader = c.elect()
    c.auto_persist = False
    index = leader.propose(b"x")
    c.stabilize()
    assert leader.commit < index  # written everywhere, fsynced nowhere
    c.persist(leader.id)
    c.stabilize()
    assert leader.commit < index  # leader alone is not a majority
    follower = next(i for i in c.nodes if i != leader.id)
    c.persist(follower)
    c.stabilize()
    assert leader.commit == index


def test_5_4_1_election_restriction_a_stale_log_cannot_win():
    c = Cluster(3)
    leader = c.elect()
    stale = next(i for i in c.nodes if i != leader.id)
    c.isolate(stale)
    for k in range(3):
        c.propose(b"m%d" % k)
    c.heal()
    c.crash(leader.id)
    # The stale node times out first; its log is shorter, so the other replica refuses.
    c.campaign(stale)
    assert c.nodes[stale].role != Role.LEADER
    new = c.elect()
    assert new.id != stale
    assert new.last_index >= 4


def test_5_2_a_refused_vote_does_not_restart_the_election_timer():
    """Figure 2: a follower converts to candidate when its timeout elapses "without
    receiving AppendEntries from the current leader or granting its vote". A newer term
    from a lagging candidate whose vote it refuses restarts nothing: without PreVote,
    candidates that cannot win would otherwise keep the up-to-date voters (the only
    ones that can) from ever timing out. A granted vote does restart it."""
    c = Cluster(3, config=lambda i: RaftConfig(pre_vote=False, check_quorum=False))
    leader = c.elect()
    lagging, up = (i for i in sorted(c.nodes) if i != leader.id)
    c.isolate(lagging)
    c.propose(b"x")
    c.crash(leader.id)
    node = c.nodes[up]
    timeout = node._timeout
    for _ in range(timeout - 1):
        node.tick()
    assert node.role == Role.FOLLOWER
    behind = c.nodes[lagging]
    node.step(Message(MsgType.VOTE, lagging, up, node.term + 5, log_index=behind.last_index,
                      log_term=behind.term_at(behind.last_index)))
    assert [m.reject for m in node.ready().messages if m.type == MsgType.VOTE_RESP] == [True]
    node.tick()  # its timeout elapses as if the refused candidate had never asked
    assert node.role == Role.CANDIDATE and node.vote == up

    # a vote granted does restart it
    term = node.term + 1
    node.step(Message(MsgType.VOTE, 9, up, term, log_index=node.last_index + 1,
                      log_term=term))
    assert [m.reject for m in node.ready().messages if m.type == MsgType.VOTE_RESP] == [False]
    for _ in range(node.cfg.election_ticks - 1):
        node.tick()
    assert node.role == Role.FOLLOWER and node.vote == 9


def _old_term_entry_on_a_majority(mutations: frozenset[str] = frozenset()):
    """Figure 8's crux: a term-1 entry sits on a majority while the term-2 leader's own
    NOOP does not. Returns (leader, index of the old entry)."""
    c = Cluster(
        3, config=lambda i: RaftConfig(pre_vote=False, check_quorum=False, mutations=mutations)
    )
    leader = c.elect()
    c.tick(2)
    old = leader.propose(b"old")  # reaches nobody else
    c.process(leader.id)
    c.mailbox.clear()
    c.crash(leader.id)
    c.start(leader.id)
    node = c.nodes[leader.id]
    while node.role == Role.FOLLOWER:
        node.tick()
    votes_only = {MsgType.VOTE, MsgType.VOTE_RESP}
    while c.deliver(lambda m: m.type in votes_only):
        pass  # its log is the longest: it wins term 2, but its NOOP goes nowhere
    assert node.role == Role.LEADER and node.term_at(old) < node.term
    c.mailbox.clear()
    follower = next(i for i in c.nodes if i != node.id)
    # The follower acknowledges the old entry but not yet the NOOP after it.
    node.step(Message(MsgType.APPEND_RESP, follower, node.id, node.term, log_index=old))
    return node, old


def test_5_4_2_figure_8_an_old_term_entry_is_not_committed_by_counting():
    leader, old = _old_term_entry_on_a_majority()
    assert leader.commit < old


def test_5_4_2_mutation_commit_old_term_commits_by_counting_replicas():
    leader, old = _old_term_entry_on_a_majority(frozenset({"commit-old-term"}))
    assert leader.commit == old


def test_prevote_keeps_an_isolated_node_from_inflating_its_term():
    c = Cluster(3)
    leader = c.elect()
    lonely = next(i for i in c.nodes if i != leader.id)
    term = leader.term
    c.isolate(lonely)
    c.tick(60)
    assert c.nodes[lonely].term == term  # pre-votes never reached a majority
    c.heal()
    c.tick(3)
    assert c.leader() is leader and leader.term == term


def test_check_quorum_a_leader_cut_off_from_its_majority_steps_down():
    c = Cluster(3)
    leader = c.elect()
    c.isolate(leader.id)
    c.tick(leader.cfg.election_ticks * 2 + 1, only=[leader.id])
    assert leader.role == Role.FOLLOWER


def test_fast_backup_skips_a_whole_conflicting_term_per_round_trip():
    c = Cluster(3, config=lambda i: RaftConfig(check_quorum=False))
    leader = c.elect()
    c.tick(2)
    followers = [i for i in c.nodes if i != leader.id]
    # The leader, partitioned, accumulates 50 uncommitted entries of its term.
    for i in followers:
        c.isolate(i)
    for k in range(50):
        leader.propose(b"lost%d" % k)
    c.stabilize()
    c.crash(leader.id)
    c.heal()
    new = c.elect()
    for k in range(5):
        c.propose(b"kept%d" % k)
    c.start(leader.id)
    rejects = []
    for _ in range(10):
        c.tick()
        c.deliver(
            lambda m: (
                (rejects.append(m) if m.type == MsgType.APPEND_RESP and m.reject else None) or True
            )
        )
    assert c.payloads(leader.id)[-5:] == [b"kept%d" % k for k in range(5)]
    assert len(rejects) <= 3  # one per conflicting term, not one per entry
    assert new.commit == c.nodes[leader.id].commit


def test_thesis_3_10_leadership_transfer():
    c = Cluster(3)
    leader = c.elect()
    target = next(i for i in c.nodes if i != leader.id)
    c.propose(b"x")
    leader.transfer_leadership(target)
    with pytest.raises(ProposalDropped):
        leader.propose(b"refused while transferring")
    c.stabilize()
    c.tick(2)
    assert c.leader().id == target
    assert c.payloads(target) == [b"x"]


def test_preferred_leader_takes_over_once_caught_up():
    c = Cluster(3, config=lambda i: RaftConfig(preferred_leader=3))
    # Make node 1 win first.
    c.campaign(1)
    assert c.leader().id == 1
    c.tick(c.nodes[1].cfg.election_ticks * 2)
    assert c.leader().id == 3


def _led_by_1_preferring_3_caught_up() -> tuple[Cluster, RaftNode]:
    """A group led by node 1 whose preferred leader, node 3, holds every entry."""
    c = Cluster(3, config=lambda i: RaftConfig(preferred_leader=3))
    c.campaign(1)
    leader = c.leader()
    assert leader.id == 1
    c.tick(2)
    assert c.nodes[3].last_index == leader.last_index
    return c, leader


def test_a_preferred_leader_that_went_silent_is_not_handed_leadership():
    """A caught-up preferred leader that stopped answering (down, cut off) is not made
    the transfer target again and again: each attempt refuses proposals for an election
    timeout. One attempt may start before the leader notices the silence (it was heard
    within the last election timeout); none after. Once it answers again, it takes over."""
    c, leader = _led_by_1_preferring_3_caught_up()
    c.isolate(3)
    timeout = c.nodes[1].cfg.election_ticks
    moving = []
    for k in range(timeout * 6):
        if leader.transferee is not None:
            moving.append(k)
        c.tick(1)
    assert len(moving) <= timeout and all(k < 3 * timeout for k in moving), moving
    leader.propose(b"taken")  # not refused with ProposalDropped
    c.heal()
    c.tick(c.nodes[1].cfg.election_ticks * 3)
    assert c.leader().id == 3


def test_thesis_6_4_read_index_is_answered_after_a_quorum_heartbeat():
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    c.propose(b"x")
    leader.read_index(7)
    c.stabilize()
    reads = c.reads[leader.id]
    assert [r.id for r in reads] == [7] and reads[0].index == leader.commit
    # A leader that lost its majority cannot confirm reads.
    c.isolate(leader.id)
    leader.read_index(8)
    c.stabilize()
    assert [r.id for r in c.reads[leader.id]] == [7]


def test_thesis_4_membership_learner_catches_up_then_votes_then_removal():
    c = Cluster(4, voters=[1, 2, 3])
    leader = c.elect()
    for k in range(5):
        c.propose(b"m%d" % k)
    c.tick(3)
    assert c.nodes[4].role == Role.FOLLOWER and c.payloads(4) == []  # not a member yet
    with pytest.raises(ValueError):
        leader.promote(4)
    leader.add_learner(4)
    c.tick(3)
    assert c.payloads(4) == [b"m%d" % k for k in range(5)]
    assert 4 in leader.membership.learners
    leader.promote(4)
    c.tick(3)
    assert leader.membership.voters == {1, 2, 3, 4}
    assert all(n.membership.voters == {1, 2, 3, 4} for n in c.nodes.values())
    # Removing the leader itself: it steps down once the change commits.
    leader.remove(leader.id)
    c.tick(3)
    assert leader.role == Role.FOLLOWER
    new = c.elect()
    assert new.id != leader.id and new.membership.voters == {1, 2, 3, 4} - {leader.id}


def test_one_membership_change_at_a_time():
    c = Cluster(5, voters=[1, 2, 3])
    leader = c.elect()
    c.tick(2)
    c.auto_persist = False
    leader.add_learner(4)
    with pytest.raises(ProposalDropped):
        leader.add_learner(5)


def test_restart_recovers_term_vote_and_membership_from_hard_state():
    c = Cluster(3)
    leader = c.elect()
    leader.add_learner(9)
    c.tick(2)
    i = leader.id
    c.crash(i)
    c.start(i)
    n = c.nodes[i]
    assert n.term == leader.term and 9 in n.membership.learners


def test_a_crash_that_loses_the_config_entry_also_forgets_the_membership():
    st_hard = HardState(
        term=3,
        vote=1,
        configs=(
            (0, 0, Membership(frozenset({1, 2, 3}))),
            (7, 3, Membership(frozenset({1, 2, 3, 4}))),
        ),
    )
    c = Cluster(1)
    store = c.stores[1]
    store.save_hard_state(st_hard)  # the log is empty: entry 7 never reached the disk
    c.start(1)
    assert c.nodes[1].membership.voters == {1, 2, 3}


def test_mutation_names_are_checked():
    with pytest.raises(ValueError):
        RaftConfig(mutations=frozenset({"no-such-bug"}))


def test_leadership_transfer_to_an_unreachable_target_gives_up_and_service_resumes():
    c = Cluster(3)
    leader = c.elect()
    target = next(i for i in c.nodes if i != leader.id)
    c.isolate(target)
    c.propose(b"x")  # the target now lags, so no TimeoutNow goes out at once
    leader.transfer_leadership(target)
    with pytest.raises(ProposalDropped):
        leader.propose(b"refused")
    c.tick(leader.cfg.election_ticks + 1, only=[leader.id])
    assert leader.role == Role.LEADER and leader.transferee is None
    leader.propose(b"accepted again")


def test_a_learner_never_campaigns():
    c = Cluster(4, voters=[1, 2, 3])
    leader = c.elect()
    leader.add_learner(4)
    c.tick(2)
    c.isolate(4)
    c.tick(100, only=[4])
    assert c.nodes[4].role == Role.FOLLOWER and c.nodes[4].term == leader.term


def test_thesis_6_4_read_index_waits_for_the_new_leaders_first_commit():
    c = Cluster(3, auto_persist=False)  # nothing is fsynced: the NOOP cannot commit
    leader = c.elect()
    assert leader.commit < leader.last_index
    leader.read_index(1)
    c.tick(3)
    assert c.reads[leader.id] == []  # its commit index may still be stale
    for i in c.nodes:
        c.persist(i)
    c.stabilize()
    c.tick(1)
    assert [r.id for r in c.reads[leader.id]] == [1]
    assert c.reads[leader.id][0].index == leader.last_index  # covers the NOOP


def test_a_vote_is_handed_out_with_the_hard_state_that_records_it():
    """The shell persists `hard_state` before sending anything of the same Ready."""
    c = Cluster(3)
    c.elect()
    c.tick(2)
    voter = c.nodes[3]
    msg = Message(
        MsgType.VOTE,
        1,
        3,
        voter.term + 1,
        log_index=voter.last_index,
        log_term=voter.term,
        context=1,
    )
    voter.step(msg)
    rd = voter.ready()
    grants = [m for m in rd.messages if m.type == MsgType.VOTE_RESP and not m.reject]
    assert grants and rd.hard_state is not None
    assert rd.hard_state.vote == 1 and rd.hard_state.term == msg.term


def test_the_core_does_no_io_of_its_own():
    """Sans-I/O: the core modules import no sockets, files, clocks or threads."""
    import ast

    allowed = {
        "__future__",
        "random",
        "collections",
        "collections.abc",
        "dataclasses",
        "enum",
        "typing",
        "msgpack",
    }
    root = REPO_ROOT / "raftlog"
    for name in ("core.py", "driver.py", "progress.py", "quorum.py", "readonly.py", "types.py"):
        tree = ast.parse((root / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                assert mod in allowed or mod.startswith("raftlog."), f"{name} imports {mod}"
                top = ".".join(mod.split(".")[:2])
                assert top not in ("raftlog.commitlog", "raftlog.hardstate", "raftlog.demo")
    # Randomness comes only from the Random the shell passes in.
    src = (root / "core.py").read_text()
    assert "random.random(" not in src and "random.randrange(" not in src


def test_propose_many_leaves_in_one_ready_and_one_append_per_follower():
    """Several entries proposed together cost one store write and one AppendEntries per
    follower, and commit in order everywhere."""
    c = Cluster(3)
    leader = c.elect()
    c.tick(2)
    last = leader.last_index
    first = leader.propose_many([b"a", b"b", b"c"])
    assert first == last + 1 and leader.last_index == last + 3
    rd = leader.ready()
    assert [e.data for e in rd.entries] == [b"a", b"b", b"c"]
    appends = [m for m in rd.messages if m.type == MsgType.APPEND]
    assert sorted(m.dst for m in appends) == sorted(i for i in c.nodes if i != leader.id)
    assert all([e.data for e in m.entries] == [b"a", b"b", b"c"] for m in appends)
    carry_out(rd, _NodeShell(c, leader.id))  # as the runtime would
    c.persist(leader.id)
    c.stabilize()
    c.tick(2)  # followers learn the commit index
    assert all(c.payloads(i) == [b"a", b"b", b"c"] for i in c.nodes)


def test_propose_many_is_all_or_nothing_when_refused():
    c = Cluster(3)
    leader = c.elect()
    follower = next(n for n in c.nodes.values() if n is not leader)
    with pytest.raises(NotLeader):
        follower.propose_many([b"x", b"y"])
    assert follower.last_index == leader.last_index
    last = leader.last_index
    leader.transfer_leadership(follower.id)
    with pytest.raises(ProposalDropped):
        leader.propose_many([b"x", b"y"])
    assert leader.last_index == last
    with pytest.raises(ValueError):
        Cluster(1).elect().propose_many([])


def test_a_preferred_leader_that_cannot_take_over_is_asked_less_and_less_often():
    """A preferred leader that answers and is caught up but cannot lead (an entry of its
    log awaits repair, so it ignores TimeoutNow) must not be handed leadership over and
    over: each hand-back refuses proposals for an election timeout, and back to back
    they kept the group from taking any write. Failed hand-backs wait longer and longer;
    once it can lead again, it does."""
    c, leader = _led_by_1_preferring_3_caught_up()
    c.nodes[3].entry_unreadable(1)
    timeout = leader.cfg.election_ticks
    moving = 0
    for _ in range(timeout * 40):
        moving += leader.transferee is not None
        c.tick(1)
    assert c.leader() is leader
    assert moving <= 6 * timeout, moving  # without the back-off: nearly every tick
    c.nodes[3].entry_repaired(1)
    c.tick(timeout * 70)  # the longest wait, then a hand-back that succeeds
    assert c.leader().id == 3


def test_a_backlog_of_committed_entries_is_applied_in_bounded_batches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica that restarts without a snapshot applies its whole log again: each Ready
    carries at most `max_apply_entries` of it (the shell applies them in place, and the
    rest of its process runs between batches), and every entry still arrives, in order."""
    batches: list[tuple[int, int]] = []
    apply = _NodeShell.apply_entries

    def counted(self: _NodeShell, entries: list) -> None:
        batches.append((self.i, len(entries)))
        apply(self, entries)

    monkeypatch.setattr(_NodeShell, "apply_entries", counted)
    c = Cluster(3, config=lambda i: RaftConfig(max_apply_entries=4))
    c.elect()
    follower = next(i for i in c.nodes if c.nodes[i].role != Role.LEADER)
    c.isolate(follower)
    for k in range(30):
        c.propose(b"m%d" % k)
    c.heal()
    batches.clear()
    c.tick(3)  # the isolated replica catches up on 30 committed entries at once
    want = [b"m%d" % k for k in range(30)]
    assert all(c.payloads(i) == want for i in c.nodes)
    mine = [n for i, n in batches if i == follower]
    assert sum(mine) >= 30 and max(mine) == 4, mine
    c.crash(follower)  # and again from its log after a restart
    c.start(follower)
    batches.clear()
    c.tick(3)
    assert c.payloads(follower) == want
    mine = [n for i, n in batches if i == follower]
    assert sum(mine) >= 30 and max(mine) == 4, mine


def test_heartbeat_answers_cost_a_follower_far_behind_one_append_per_heartbeat():
    """Every ReadIndex round sends a heartbeat, so a leader serving reads gets answers far
    more often than it beats. An answer may resend a lost probe, or let one append past a
    full window whose acknowledgements stopped, but only the first answer after each
    heartbeat: otherwise a follower catching up costs the leader another append read and
    sent per read, faster than the follower takes them (a leader under reads grew to
    gigabytes while a replaced disk caught up)."""
    c = Cluster(3, config=lambda i: RaftConfig(max_append_bytes=1, max_inflight=2))
    leader = c.elect()
    c.tick(2)
    f = next(i for i in c.nodes if i != leader.id)
    # f takes appends but its acknowledgements are lost: the window to it fills
    for k in range(6):
        leader.propose(b"m%d" % k)
        c.deliver(keep=lambda m: not (m.src == f and m.type == MsgType.APPEND_RESP))
    c.process_all()
    assert len(leader._progress[f].inflight) == 2  # full, and nothing comes back

    def appends_to_f_after(answers: int, *, reject: bool = False) -> int:
        c.mailbox.clear()
        for _ in range(answers):
            leader.step(Message(MsgType.HEARTBEAT_RESP, f, leader.id, leader.term,
                                reject=reject, hint_index=1 if reject else 0))
        c.process(leader.id)
        return sum(m.dst == f and m.type == MsgType.APPEND for m in c.mailbox)

    def beat() -> None:
        leader.tick()
        c.process(leader.id)
        c.mailbox.clear()  # the heartbeats themselves (their answers are scripted)

    beat()
    assert appends_to_f_after(50) == 1  # one append past the stalled window
    assert appends_to_f_after(50) == 0  # no heartbeat since: the answers change nothing
    beat()
    assert appends_to_f_after(50) == 1
    # f says its log ends at 0 (a replaced disk): one probe, resent once per heartbeat
    beat()
    assert appends_to_f_after(50, reject=True) == 1
    assert appends_to_f_after(50, reject=True) == 0
    beat()
    assert appends_to_f_after(50, reject=True) == 1
    # the cluster still converges once messages flow again
    c.tick(3)
    assert c.payloads(f) == [b"m%d" % k for k in range(6)]
