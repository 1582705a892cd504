"""A power loss of every node that loses all unsynced log data (what `fsync = "interval"`
allows, modelled by the shell acknowledging writes before its fsync): every replica's
snapshot survives while its log is empty, so every replica is refilling. Scripted on the
simulator's network and disks, every checker running after each action; the two
checkers whose findings are the premise (acknowledged data not on disk, a committed
entry lost) are left out."""

from __future__ import annotations

import types

import pytest

import raftlog.core
from raftlog.sim.invariants import Violation
from raftlog.sim.script import Script
from raftlog.types import Message, Role

PREMISE = ("DurableBeforeSend", "CommittedSurvivesCrash")


def _powered_off(synced: tuple[int, ...] = (), core: types.ModuleType | None = None) -> Script:
    """Three nodes commit and apply 12 entries that reach no disk but those of `synced`;
    each snapshots its state; then every node loses power."""
    s = Script(3, mutation="ack-before-fsync", auto_sync=False, disable=PREMISE, core=core)
    s.elect(1, among={1, 2, 3})
    for k in range(12):
        s.propose(1, b"m%d" % k)
    s.stabilize()
    s.tick(1)  # a heartbeat carries the final commit index
    s.stabilize()
    assert all(s.node(i).applied == 13 for i in (1, 2, 3))
    for i in synced:
        s.sync(i)
    for i in (1, 2, 3):  # each state references every entry (the log keeps them all)
        assert s.node(i).take_snapshot(keep=13) is not None
    for i in (1, 2, 3):
        s.crash(i)
    return s


def _run(s: Script, nodes: list[int], rounds: int) -> None:
    """Tick every node in `nodes` once per round, delivering what follows each tick."""
    for _ in range(rounds):
        for i in nodes:
            s.tick(i)
            s.stabilize()


def _leader(s: Script) -> int | None:
    return next((n.id for n in s.c.live if n.raft.role == Role.LEADER), None)


def test_a_cluster_whose_every_log_was_lost_elects_from_its_snapshots_and_serves_on() -> None:
    s = _powered_off()
    for i in (1, 2, 3):
        s.restart(i)
        assert s.raft(i).refilling and s.raft(i).last_index == 0 and s.node(i).applied == 13
    rounds = 0
    while _leader(s) is None:
        rounds += 1
        assert rounds < 20 * s.raft(1).cfg.election_ticks, "no node ever led"
        _run(s, [1, 2, 3], 1)
    leader = _leader(s)
    assert leader is not None
    for i in (1, 2, 3):  # the gap is reported, not hidden
        raft = s.raft(i)
        assert raft.refill_gap in (None, (1, 13)), raft.refill_gap
    assert s.raft(leader).refill_gap == (1, 13)
    assert s.c.faults.refills_abandoned >= 1
    index = s.propose(leader, b"after")
    s.stabilize()
    _run(s, [1, 2, 3], 2)
    assert index == 15  # after the snapshot's entry and the new leader's NOOP
    assert all(s.node(i).applied == index for i in (1, 2, 3))
    assert all(not s.raft(i).refilling for i in (1, 2, 3))


def test_a_refill_a_voter_can_supply_is_waited_for_and_done() -> None:
    """Node 3 fsynced everything before the power loss; nodes 1 and 2 come back first
    and refuse each other, but node 3 is silent: it may hold the entries, so they wait
    for it; once it is back it leads and refills them, and nothing is lost."""
    s = _powered_off(synced=(3,))
    for i in (1, 2):
        s.restart(i)
    _run(s, [1, 2], 6 * s.raft(1).cfg.election_ticks)
    assert _leader(s) is None
    assert all(s.raft(i).refilling and s.raft(i).refill_gap is None for i in (1, 2))
    s.restart(3)
    rounds = 0
    while _leader(s) != 3 or any(s.raft(i).refilling for i in (1, 2)):
        rounds += 1
        assert rounds < 20 * s.raft(1).cfg.election_ticks, "node 3 never refilled the others"
        _run(s, [1, 2, 3], 1)
    assert all(s.raft(i).refill_gap is None for i in (1, 2, 3))
    assert s.c.faults.refills_abandoned == 0
    assert all(s.log(i)[:13] == s.log(3)[:13] for i in (1, 2))


class _GivesUpOnAMajority(raftlog.core.RaftNode):
    """Abandons its refill once a majority (itself included) cannot refill it, without
    waiting for the voters that stay silent."""

    def _refill_answer(self, m: Message) -> None:
        super()._refill_answer(m)
        if (self._may_probe_refill() and m.reject and m.context == self._refill_round
                and len(self._refill_refused) + 1 > len(self.membership.voters) // 2):
            self._abandon_refill()


def test_a_refill_abandoned_while_a_silent_voter_holds_the_entries_is_caught() -> None:
    broken = types.ModuleType("broken_core")
    broken.__dict__.update({**vars(raftlog.core), "RaftNode": _GivesUpOnAMajority})
    s = _powered_off(synced=(3,), core=broken)
    for i in (1, 2):
        s.restart(i)
    with pytest.raises(Violation) as err:
        _run(s, [1, 2], 6 * s.raft(1).cfg.election_ticks)
    assert err.value.invariant == "refill-abandoned-needlessly"
