"""Paper scenarios scripted on the simulator's network and disks (every checker runs
after each action), and exact reproductions of core bugs the random runs found."""

from __future__ import annotations

import pytest

from raftlog.sim.invariants import Violation
from raftlog.sim.script import Script
from raftlog.types import MsgType, Role

ALL5 = {1, 2, 3, 4, 5}


def _figure_8(mutation: str | None) -> Script:
    """§5.4.2, Figure 8: an old-term entry on a majority is not yet committed.

    (a) S1 leads and gets index 2 onto S2 only. (b) S5 leads a later term with the votes
    of S3 and S4 and writes a different index 2 only locally. (c) S1 leads again and
    copies its index 2 to S3, entry by entry: now on S1, S2, S3. (d) S1 crashes; S5 can
    still win with S3 and S4 (its last term is higher) and overwrites index 2. That is
    safe only because (c) did not count old-term replicas as a commit.
    """
    s = Script(5, mutation=mutation, max_append_bytes=1)
    s.elect(1, among=ALL5)
    s.stabilize()
    s.propose(1, b"x")  # index 2
    s.stabilize(among={1, 2})
    s.drop(src=1)
    s.crash(1)
    s.elect(5, among={3, 4, 5})  # (b)
    s.drop(src=5)
    s.crash(5)
    s.restart(1)
    s.elect(1, among={1, 2, 3, 4})  # (c)
    s.drop(src=1, dst=4)
    s.stabilize(among={1, 2})
    for _ in range(4):  # the probe to S3 backs up to index 2, then sends it alone
        s.deliver(src=1, dst=3)
        s.deliver(src=3, dst=1)
        if len(s.log(3)) >= 2:
            break
    assert s.log(3) == [(1, 1), (2, 1)]
    s.crash(1)  # (d)
    s.drop(src=1)
    s.restart(5)
    s.elect(5, among={3, 4, 5})
    s.stabilize(among={2, 3, 4, 5})
    return s


def test_figure_8_old_term_entries_are_not_committed_by_counting() -> None:
    s = _figure_8(None)
    assert s.raft(5).role == Role.LEADER
    for i in (2, 3, 4, 5):
        assert s.entry(i, 2).term == 2  # S5's entry replaced the uncommitted one
    assert s.raft(5).commit == 3


def test_figure_8_is_caught_when_old_terms_commit_by_counting() -> None:
    with pytest.raises(Violation) as err:
        _figure_8("commit-old-term")
    assert err.value.invariant == "leader-completeness"


def _stale_candidate(mutation: str | None, pre_vote: bool) -> Script:
    """§5.4.1: S1 commits index 2 with S2 while S3 is cut off; S1 crashes; S3, whose log
    is behind, asks S2 for its vote."""
    s = Script(3, mutation=mutation, pre_vote=pre_vote)
    s.elect(1, among={1, 2, 3})
    s.stabilize()
    s.propose(1, b"x")
    s.drop(src=1, dst=3)
    s.stabilize(among={1, 2})
    assert s.raft(1).commit == 2
    s.crash(1)
    s.drop(src=1)
    return s


@pytest.mark.parametrize("pre_vote", [False, True])
def test_election_restriction_denies_a_stale_log(pre_vote: bool) -> None:
    s = _stale_candidate(None, pre_vote)
    with pytest.raises(AssertionError, match="did not win"):
        s.elect(3, among={2, 3}, tries=3)
    s.drop()
    s.elect(2, among={2, 3})
    s.stabilize()
    assert s.entry(3, 2).data == b"x"


@pytest.mark.parametrize("pre_vote", [False, True])
def test_election_restriction_violation_is_caught(pre_vote: bool) -> None:
    s = _stale_candidate("no-prevote-term-check", pre_vote)
    with pytest.raises(Violation) as err:
        s.elect(3, among={2, 3})
    assert err.value.invariant == "leader-completeness"


def test_lagging_candidates_do_not_hold_back_the_voters_that_can_win() -> None:
    """§5.2 without PreVote: S1 leads and commits index 2 with S2 and S3 only, then
    crashes. S4 and S5 lag; S4 campaigns again and again, each time in a newer term,
    and S2 and S3 refuse it. A refused vote restarts no timer (Figure 2), so S2, ticking
    a few times between S4's campaigns, still reaches its timeout, and wins. (Were the
    timer restarted on every newer term, S2 would never time out: seen with 5 nodes.)"""
    s = Script(5, pre_vote=False, check_quorum=False)
    s.elect(1, among=ALL5)
    s.stabilize()
    s.propose(1, b"x")
    s.drop(src=1, dst=4)
    s.drop(src=1, dst=5)
    s.stabilize(among={1, 2, 3})
    assert s.raft(1).commit == 2 and len(s.log(4)) == 1
    s.crash(1)
    s.drop(src=1)
    ticks_between = s.raft(2).cfg.election_ticks // 2  # well inside any timeout
    for _ in range(8):
        s.campaign(4)
        s.stabilize(among={2, 3, 4, 5})
        assert s.raft(4).role != Role.LEADER  # a log behind the committed entry
        s.tick(2, ticks_between)
        s.stabilize(among={2, 3, 4, 5})
        if s.raft(2).role == Role.LEADER:
            break
    assert s.raft(2).role == Role.LEADER
    assert s.entry(2, 2).data == b"x"


def test_acknowledging_before_fsync_loses_a_commit_on_a_majority_crash() -> None:
    """DESIGN.md: an ack means fsynced on a majority. If a follower acknowledges a mere
    write, the leader commits, and a crash of both before their fsyncs loses the entry."""
    s = Script(3, mutation="ack-before-fsync", auto_sync=False)
    s.elect(1, among={1, 2, 3})
    with pytest.raises(Violation) as err:
        s.stabilize()
    assert err.value.invariant == "ack-not-durable"
    # Without that checker: S1 and S2 "persist" the NOOP by writing it, so it commits;
    # S2 crashes before its fsync and only S1 of three still holds a committed entry.
    s = Script(3, mutation="ack-before-fsync", auto_sync=False, disable=["DurableBeforeSend"])
    s.elect(1, among={1, 2, 3})
    s.stabilize(among={1, 2})
    assert s.raft(1).commit == 1 and s.node(1).store.durable_len == 0
    with pytest.raises(Violation) as err:
        s.crash(2)
    assert err.value.invariant == "committed-entry-lost"


# ---------------------------------------------------------------------- regressions
# Bugs the random runs found in the core; each script is the smallest history that
# showed one, kept so they stay fixed.


def test_a_follower_never_acknowledges_what_it_has_not_fsynced() -> None:
    """A duplicate append below the follower's commit index is answered with `match =
    commit`, but a follower's commit index can run ahead of its fsynced log."""
    s = Script(3, auto_sync=False)
    s.elect(1, among={1, 2, 3})
    s.deliver(src=1, type=MsgType.APPEND)  # S2 and S3 write the NOOP; no fsync yet
    s.sync(1)
    s.sync(3)
    s.stabilize(among={1, 3})  # S3 acks: the NOOP commits without S2
    s.tick(1)
    s.stabilize(among={1, 3})
    s.deliver(src=1, dst=2, type=MsgType.HEARTBEAT)
    s.deliver(src=2, dst=1)
    [append] = s.deliver(src=1, dst=2, type=MsgType.APPEND)  # commit 1 reaches S2
    assert s.raft(2).commit == 1 and s.node(2).store.durable_len == 0
    s.redeliver(append)  # Violation ack-not-durable: "2->1 APPEND_RESP match 1", 0 fsynced


def test_a_lost_acknowledgement_is_repeated() -> None:
    """S2 acks index 2 and the ack is lost. The leader keeps re-sending; S2 has already
    acknowledged that index once, so it stays silent, and with S3 down nothing commits
    again although a majority (S1, S2) is up and connected."""
    s = Script(3)
    s.elect(1, among={1, 2, 3})
    s.stabilize()
    s.tick(1)
    s.stabilize()
    s.crash(3)
    index = s.propose(1, b"x")
    s.deliver(src=1, dst=2, type=MsgType.APPEND)
    s.drop(src=2, dst=1)
    for _ in range(5):
        s.tick(1)
        s.stabilize()
    assert s.raft(1).commit == index


def test_a_follower_restarts_after_losing_an_unsynced_config_entry() -> None:
    """S2 writes a CONFIG entry and learns it is committed before its fsync; the core
    then forgets every older membership record in the (durable) hard state. A crash
    loses the unsynced entry, and S2 cannot restart: no membership covers its log."""
    s = Script(3, auto_sync=False)
    s.elect(1, among={1, 2, 3})
    s.stabilize()
    for i in (1, 2, 3):
        s.sync(i)
    s.stabilize()
    leader = s.node(1)
    s.c.call(leader, lambda raft: raft.add_learner(4))
    s.c.add_node(4)
    s.drop(dst=4)
    s.deliver(src=1, dst=2, type=MsgType.APPEND)  # S2 writes the CONFIG entry, unsynced
    s.deliver(src=1, dst=3, type=MsgType.APPEND)
    s.sync(1)
    s.sync(3)
    s.stabilize(among={1, 3})  # committed by S1 and S3
    s.tick(1)
    s.stabilize(among={1, 2})  # S2 learns the commit index
    assert s.raft(2).commit == 2 and s.node(2).store.durable_len == 1
    s.crash(2)
    s.restart(2)  # ValueError: hard state holds no membership
    assert s.raft(2).membership.voters == {1, 2, 3}
