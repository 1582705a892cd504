"""InstallSnapshot in the Raft core (paper §7, thesis §5.1): what a leader sends to a
follower that needs entries it no longer holds, how the follower installs it, and the
wire form of the message."""

from __future__ import annotations

import pytest

from raftlog.core import RaftConfig
from raftlog.sim.disk import SimStore
from raftlog.types import HardState, Membership, Message, MsgType, Role, Snapshot
from raftlog.wire import WireError, message_from_wire, message_to_wire
from tests.raft_harness import Cluster


def _behind(c: Cluster, n: int = 30) -> tuple[int, int]:
    """Elect, cut a follower off, commit `n` entries without it, snapshot the leader at
    its applied index and drop its whole log up to there. Returns (leader, follower)."""
    leader = c.elect()
    c.propose(b"before")
    follower = next(i for i in c.nodes if i != leader.id)
    c.isolate(follower)
    for k in range(n):
        c.propose(b"m%d" % k)
    c.tick(2)
    c.snapshot(leader.id)
    assert c.stores[leader.id].first_index() == leader.applied + 1
    return leader.id, follower


def _snapshots(c: Cluster, **match: object) -> list[Message]:
    return [m for m in c.mailbox if m.type == MsgType.SNAPSHOT
            and all(getattr(m, k) == v for k, v in match.items())]


def test_7_a_follower_behind_the_first_index_installs_the_leaders_snapshot() -> None:
    c = Cluster(3, seed=11)
    lead, follower = _behind(c)
    leader = c.nodes[lead]
    snap_index = leader.snapshot_index
    seen, held = len(c.applied[follower]), c.nodes[follower].last_index
    c.heal()
    c.tick(3)
    f = c.nodes[follower]
    assert [s.index for s in c.installed[follower]] == [snap_index]
    assert c.state[follower][: len(c.state[lead])] == c.state[lead]
    assert f.commit >= snap_index and f.applied >= snap_index
    assert c.stores[follower].first_index() == snap_index + 1
    assert leader._progress[follower].match >= snap_index
    assert not leader.sending_snapshot and not leader.needs_snapshot
    # replication carries on from the snapshot: the follower applies only what follows
    c.propose(b"after")
    c.tick(2)
    assert c.state[follower] == c.state[lead] == [b"before"] + [b"m%d" % k for k in range(30)] + [
        b"after"
    ]
    # what it held it may apply; what the snapshot covers it never applies entry by entry
    assert c.applied[follower][seen:]
    assert all(e.index <= held or e.index > snap_index for e in c.applied[follower][seen:])
    assert f.term_at(f.last_index) == leader.term_at(leader.last_index)


def test_the_snapshot_message_and_the_follower_ready_carry_the_membership() -> None:
    c = Cluster(3, seed=12)
    lead, follower = _behind(c)
    c.auto_install = False
    c.heal()
    c.tick()
    snap = c.installing[follower]
    assert snap.membership == Membership(frozenset({1, 2, 3}))
    # the membership went to disk with the Ready that handed out the snapshot
    hs = c.stores[follower].hard_state
    assert hs.configs[-1] == (snap.index, snap.term, snap.membership)
    c.install(follower)
    assert c.stores[follower].hard_state.configs == ((snap.index, snap.term, snap.membership),)


def test_4_membership_at_the_snapshot_index_reaches_a_new_learner() -> None:
    """A learner added after its peers compacted the log learns the configuration that
    names it from the snapshot: the CONFIG entry itself is gone."""
    c = Cluster(4, seed=13, voters=[1, 2, 3])
    leader = c.elect()
    c.isolate(4)
    c.leader().add_learner(4)
    c.stabilize()
    for k in range(10):
        c.propose(b"m%d" % k)
    c.tick(2)
    snap = c.snapshot(leader.id)
    want = Membership(frozenset({1, 2, 3}), frozenset({4}))
    assert snap.membership == want
    assert c.nodes[4].membership == Membership(frozenset({1, 2, 3}))  # its bootstrap
    c.heal()
    c.tick(4)
    assert [s.index for s in c.installed[4]] == [snap.index]
    assert c.nodes[4].membership == want
    assert c.nodes[4].commit == leader.commit
    # the learner catches up, is promoted and counts from then on
    c.leader().promote(4)
    c.stabilize()
    c.tick(2)
    assert c.nodes[4].membership == Membership(frozenset({1, 2, 3, 4}))


def test_a_snapshot_at_or_below_the_followers_commit_is_not_installed() -> None:
    c = Cluster(3, seed=14)
    leader = c.elect()
    for k in range(5):
        c.propose(b"m%d" % k)
    c.tick(2)
    follower = next(i for i in c.nodes if i != leader.id)
    f = c.nodes[follower]
    stale = Message(MsgType.SNAPSHOT, leader.id, follower, leader.term, log_index=3,
                    log_term=leader.term_at(3), commit=leader.commit, snapshot=b"old",
                    membership=leader.membership)
    f.step(stale)
    rd = f.ready()
    assert rd.snapshot is None and f.installing is None
    assert [m.type for m in rd.messages] == [MsgType.APPEND_RESP]
    assert not rd.messages[0].reject and rd.messages[0].log_index == f.commit


def test_a_snapshot_whose_last_entry_the_follower_holds_keeps_the_log_after_it() -> None:
    """Paper §7: if the follower already has the entry the snapshot ends with, it keeps
    the entries following it and does not install."""
    c = Cluster(3, seed=15)
    leader = c.elect()
    follower = next(i for i in c.nodes if i != leader.id)
    for k in range(6):
        c.propose(b"m%d" % k)
    f = c.nodes[follower]
    c.auto_persist = False
    leader.propose(b"tail")
    index = leader.propose(b"tail2")
    c.deliver(lambda m: m.dst == follower)  # written on the follower, not yet committed
    assert f.last_index == index and f.commit < index - 1
    at = index - 1
    f.step(Message(MsgType.SNAPSHOT, leader.id, follower, leader.term, log_index=at,
                   log_term=leader.term_at(at), commit=at, snapshot=b"x",
                   membership=leader.membership))
    rd = f.ready()
    assert rd.snapshot is None
    assert f.last_index == index and f.commit == at


def test_while_installing_the_follower_appends_acknowledges_and_campaigns_nothing() -> None:
    c = Cluster(3, seed=16)
    lead, follower = _behind(c)
    c.auto_install = False
    c.heal()
    c.tick(2)
    f = c.nodes[follower]
    snap = f.installing
    assert snap is not None and c.installing[follower] is snap
    before = (f.last_index, f.commit, f.applied)
    c.propose(b"during")  # appends to the follower are dropped meanwhile
    assert (f.last_index, f.commit, f.applied) == before
    assert not [m for m in c.mailbox if m.src == follower and m.type == MsgType.APPEND_RESP]
    f.persisted(f.last_index, f.term_at(f.last_index))  # a stale fsync report: ignored
    assert f.persisted_index <= before[0]
    # its leader gone, it still does not campaign: its log is about to change
    c.isolate(follower)
    for _ in range(4 * f.cfg.election_ticks):
        f.tick()
    c.process(follower)
    assert f.role == Role.FOLLOWER
    assert not [m for m in c.mailbox if m.src == follower and m.type in (MsgType.PREVOTE,
                                                                          MsgType.VOTE)]
    c.heal()
    c.install(follower)
    ack = [m for m in c.mailbox if m.src == follower and m.type == MsgType.APPEND_RESP]
    assert ack and not ack[-1].reject and ack[-1].log_index == snap.index
    assert (f.last_index, f.commit, f.applied, f.persisted_index) == (snap.index,) * 4
    c.tick(3)
    assert c.state[follower] == c.state[lead] and c.state[lead][-1] == b"during"


def test_a_lost_snapshot_is_sent_again_after_the_timeout() -> None:
    c = Cluster(3, seed=17, config=lambda i: RaftConfig(snapshot_timeout_ticks=5))
    lead, follower = _behind(c)
    leader = c.nodes[lead]
    c.heal()
    sent = 0
    for _ in range(20):
        leader.tick()
        c.process(lead)
        sent += len(_snapshots(c, dst=follower))
        c.deliver(lambda m: m.type != MsgType.SNAPSHOT)  # the network loses every snapshot
        if sent >= 2:
            break
    assert sent >= 2  # sent, lost, timed out, sent again
    c.tick(8)
    assert c.installed[follower] and not leader.sending_snapshot


def test_a_follower_whose_disk_was_replaced_is_caught_up_from_the_snapshot() -> None:
    """The leader's progress says the follower holds entries it no longer has; its
    refusal of the entry it once acknowledged resets that, and the snapshot follows."""
    c = Cluster(3, seed=18)
    leader = c.elect()
    for k in range(20):
        c.propose(b"m%d" % k)
    c.tick(2)
    follower = next(i for i in c.nodes if i != leader.id)
    assert leader._progress[follower].match == leader.last_index
    c.snapshot(leader.id)
    # the follower comes back with an empty disk (its term and vote kept)
    hs = c.stores[follower].hard_state
    c.crash(follower)
    c.stores[follower] = SimStore(HardState(hs.term, hs.vote, ((0, 0, leader.membership),)))
    c.start(follower)
    c.propose(b"after")
    c.tick(4)
    assert [s.index for s in c.installed[follower]] == [leader.snapshot_index]
    assert c.state[follower] == c.state[leader.id]
    assert leader._progress[follower].match == leader.last_index


@pytest.mark.parametrize("compacted", [False, True])
def test_a_replaced_disk_is_noticed_by_heartbeats_alone(compacted: bool) -> None:
    """With nothing new to send, the leader learns from the heartbeat answer that the
    follower lacks what it acknowledged, and refills it (log or snapshot)."""
    c = Cluster(3, seed=22)
    leader = c.elect()
    for k in range(12):
        c.propose(b"m%d" % k)
    c.tick(2)
    if compacted:
        c.snapshot(leader.id)
    follower = next(i for i in c.nodes if i != leader.id)
    hs = c.stores[follower].hard_state
    c.crash(follower)
    c.stores[follower] = SimStore(HardState(hs.term, hs.vote, ((0, 0, leader.membership),)))
    c.start(follower)
    c.tick(3)
    assert c.nodes[follower].commit == leader.commit
    assert c.state[follower] == c.state[leader.id]
    assert len(c.installed[follower]) == int(compacted)


def test_a_refusal_below_the_first_index_leads_to_the_snapshot() -> None:
    """Fast backup cannot look at terms the leader no longer holds: a refusal below its
    first index sends the follower the snapshot instead."""
    c = Cluster(3, seed=23)
    first = c.elect()
    first.transfer_leadership(next(i for i in c.nodes if i != first.id))
    c.stabilize()
    for k in range(30):
        c.propose(b"m%d" % k)
    c.tick(2)
    leader = c.leader()
    c.snapshot(leader.id)
    other = next(i for i in c.nodes if i != leader.id)
    pr = leader._progress[other]
    pr.match = 0
    pr.become_probe()
    pr.next = 11
    leader.step(Message(MsgType.APPEND_RESP, other, leader.id, leader.term, reject=True,
                        log_index=10, hint_term=leader.term - 1, hint_index=5))
    rd = leader.ready()
    assert [m.type for m in rd.messages if m.dst == other] == [MsgType.SNAPSHOT]
    assert leader.sending_snapshot == {other: leader.snapshot_index}


def test_without_a_snapshot_the_follower_is_only_reported() -> None:
    c = Cluster(3, seed=19)
    lead, follower = _behind(c)
    leader = c.nodes[lead]
    leader._snapshot = None  # as if the shell had never handed one over
    c.heal()
    c.tick(3)
    assert leader.needs_snapshot == {follower} and not c.installed[follower]
    assert not _snapshots(c)


def test_set_snapshot_checks_and_membership_after_a_restart() -> None:
    c = Cluster(3, seed=20)
    leader = c.elect()
    c.propose(b"x")
    c.tick(2)
    with pytest.raises(ValueError, match="beyond applied"):
        leader.set_snapshot(Snapshot(leader.applied + 1, leader.term, b""))
    snap = c.snapshot(leader.id)
    leader.set_snapshot(Snapshot(snap.index - 1, snap.term, b"older"))  # ignored
    assert leader.snapshot_index == snap.index
    # a snapshot from an older file, without membership: the core fills it in
    follower = next(i for i in c.nodes if i != leader.id)
    f = c.nodes[follower]
    f.set_snapshot(Snapshot(f.applied, f.term_at(f.applied), b"s"))
    assert f._snapshot is not None and f._snapshot.membership == f.membership
    with pytest.raises(ValueError, match="no snapshot"):
        f.snapshot_installed(5, 1)


def test_a_restart_restores_the_snapshot_and_replays_only_what_follows() -> None:
    c = Cluster(3, seed=21)
    leader = c.elect()
    for k in range(8):
        c.propose(b"a%d" % k)
    c.tick(2)
    follower = next(i for i in c.nodes if i != leader.id)
    snap = c.snapshot(follower, keep=3)
    for k in range(4):
        c.propose(b"b%d" % k)
    c.tick(2)
    c.crash(follower)
    c.start(follower)
    f = c.nodes[follower]
    assert f.applied == snap.index and f.commit == snap.index
    c.tick(3)
    assert all(e.index > snap.index for e in c.applied[follower])
    assert c.state[follower] == c.state[leader.id]


# ------------------------------------------------------------------ wire


def test_snapshot_messages_round_trip_on_the_wire() -> None:
    m = Message(MsgType.SNAPSHOT, 1, 2, 7, log_index=40, log_term=6, commit=44,
                snapshot=b"\x00state" * 100,
                membership=Membership(frozenset({1, 2, 3}), frozenset({4})))
    fields, body = message_to_wire(m)
    assert len(fields) == 13 and body == m.snapshot
    assert message_from_wire(fields, body) == m
    assert "SNAPSHOT" in m.describe() and "[40@6]" in m.describe()


def test_the_wire_format_of_other_messages_is_unchanged() -> None:
    m = Message(MsgType.HEARTBEAT, 1, 2, 3, commit=9, context=4)
    fields, body = message_to_wire(m)
    assert fields == [6, 1, 2, 3, 0, 0, 9, 0, 0, 0, 4] and body == b""
    assert message_from_wire(fields, body) == m


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ([9, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0], "SNAPSHOT message with 11 fields"),
        ([6, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, [1], []], "HEARTBEAT message with 13 fields"),
        ([9, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, [], []], "needs at least one voter"),
        ([9, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, ["a"], []], "lists of integers"),
        ([9, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, [1], [1]], "both voter and learner"),
        ([99, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0], "undecodable"),
    ],
)
def test_malformed_snapshot_messages_are_refused(fields: list[object], why: str) -> None:
    with pytest.raises(WireError, match=why):
        message_from_wire(fields, b"")


def test_a_snapshot_message_needs_its_membership() -> None:
    with pytest.raises(ValueError, match="membership"):
        message_to_wire(Message(MsgType.SNAPSHOT, 1, 2, 3))
