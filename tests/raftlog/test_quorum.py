"""Majority arithmetic and ReadIndex bookkeeping (raftlog.quorum, raftlog.readonly)."""

from __future__ import annotations

from raftlog.quorum import committed_index, has_quorum, majority, vote_result
from raftlog.readonly import ReadOnly
from raftlog.types import ReadState


def test_majority_of_each_cluster_size() -> None:
    assert [majority(range(n)) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]


def test_only_voters_count() -> None:
    voters = {1, 2, 3}
    assert has_quorum(voters, [1, 2])
    assert not has_quorum(voters, [1, 4, 5, 6])  # learners and strangers do not count
    assert not has_quorum(voters, [1, 1, 1])  # nor does one voter counted three times


def test_vote_result_needs_a_quorum_either_way() -> None:
    voters = {1, 2, 3, 4, 5}
    assert vote_result(voters, {1: True, 2: True}) is None
    assert vote_result(voters, {1: True, 2: True, 3: True}) is True
    assert vote_result(voters, {1: True, 2: False, 3: False, 9: False}) is None
    assert vote_result(voters, {2: False, 3: False, 4: False}) is False


def test_committed_index_is_what_a_quorum_holds() -> None:
    """§5.3: an entry is committed once a majority stores it."""
    assert committed_index({1, 2, 3}, {1: 9, 2: 5, 3: 7}) == 7
    assert committed_index({1, 2, 3, 4}, {1: 9, 2: 5, 3: 7, 4: 1}) == 5
    assert committed_index({1, 2, 3}, {1: 9, 4: 9, 5: 9}) == 0  # one known voter only


def test_read_index_waits_for_a_quorum_of_heartbeat_acks() -> None:
    """Thesis §6.4: reads are served at the commit index once a quorum confirmed it."""
    ro = ReadOnly()
    ro.request(7, committed_in_term=True)
    ctx, now = ro.start_round(commit=12, me=1, single_voter=False)
    assert ctx and now == [] and ro.pending_ctx == ctx
    assert ro.ack(4, ctx, {1, 2, 3}) == []  # a learner's ack does not count
    assert ro.ack(2, ctx, {1, 2, 3}) == [ReadState(7, 12)]
    assert ro.pending_ctx == 0


def test_reads_before_the_term_commits_wait_and_later_rounds_confirm_earlier_ones() -> None:
    ro = ReadOnly()
    ro.request(1, committed_in_term=False)
    assert not ro.has_new
    ro.term_committed()
    first, _ = ro.start_round(commit=3, me=1, single_voter=False)
    ro.request(2, committed_in_term=True)
    second, _ = ro.start_round(commit=4, me=1, single_voter=False)
    assert ro.ack(3, second, {1, 2, 3}) == [ReadState(1, 3), ReadState(2, 4)]
    assert first < second


def test_a_single_voter_answers_at_once_and_clear_drops_everything() -> None:
    ro = ReadOnly()
    ro.request(5, committed_in_term=True)
    assert ro.start_round(commit=8, me=1, single_voter=True) == (0, [ReadState(5, 8)])
    ro.request(6, committed_in_term=True)
    ctx, _ = ro.start_round(commit=8, me=1, single_voter=False)
    ro.clear()
    assert ro.ack(2, ctx, {1, 2, 3}) == []
