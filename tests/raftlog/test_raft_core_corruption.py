"""Corruption as core events: `entry_unreadable` and `entry_repaired` (issue 12 part 5).

An entry whose bytes fail their checks keeps its index and term, so the log's length and
last term (what votes are decided on) stay right; the core must never hand it out, apply
past it, or lead while holding it, and must take it back once it is repaired.
"""

from __future__ import annotations

from raftlog.types import Entry, EntryType, Message, MsgType, Role
from tests.raft_harness import Cluster


def _follower(c: Cluster) -> int:
    return next(i for i, n in c.nodes.items() if n.role != Role.LEADER)


def _stored_not_committed(c: Cluster, payloads: list[bytes]) -> tuple[int, int]:
    """Leader proposes `payloads`; a follower stores them before it hears they commit.
    Returns (follower, index of the first)."""
    leader = c.leader()
    f = _follower(c)
    first = leader.propose(payloads[0])
    for p in payloads[1:]:
        leader.propose(p)
    c.deliver(lambda m: m.type == MsgType.APPEND)
    c.process(f)
    assert c.stores[f].last_index() >= first + len(payloads) - 1
    assert c.nodes[f].commit < first
    return f, first


def test_a_replica_applies_nothing_from_an_unreadable_entry_on_until_it_is_repaired():
    c = Cluster(3)
    c.elect()
    f, first = _stored_not_committed(c, [b"a", b"b", b"c"])
    c.corrupt(f, first + 1)
    c.tick(3)
    node = c.nodes[f]
    assert c.payloads(f) == [b"a"]  # stops right before the unreadable entry
    assert node.unreadable == {first + 1}
    assert c.to_repair[f] == [first + 1]  # listed once
    applied = node.applied
    c.tick(5)
    assert node.applied == applied and c.to_repair[f] == [first + 1]
    assert c.repair(f) == [first + 1]
    c.tick(2)
    assert not node.unreadable and not node.frozen
    assert c.payloads(f) == [b"a", b"b", b"c"]


def test_an_unreadable_next_entry_freezes_the_replica_until_repaired():
    c = Cluster(3)
    c.elect()
    f, first = _stored_not_committed(c, [b"a", b"b"])
    c.stabilize()
    c.tick(2, only=[c.leader().id])  # the commit reaches f: it applies both
    assert c.payloads(f) == [b"a", b"b"]
    f2, nxt = _stored_not_committed(c, [b"c", b"d"])
    assert f2 == f
    c.corrupt(f, nxt)
    c.tick(3)  # f learns the commit, reads entry `nxt` to apply it: unreadable
    node = c.nodes[f]
    assert node.frozen and c.payloads(f) == [b"a", b"b"]
    term, elapsed = node.term, node.commit
    c.tick(30, only=[f])  # frozen: ticks and messages are ignored, no campaign
    assert node.role == Role.FOLLOWER and node.term == term and node.commit == elapsed
    c.repair(f)
    c.tick(2)
    assert not node.frozen and c.payloads(f) == [b"a", b"b", b"c", b"d"]


def test_commit_from_the_leader_is_capped_below_an_unreadable_entry():
    c = Cluster(3)
    c.elect()
    f, first = _stored_not_committed(c, [b"x", b"y"])
    c.nodes[f].entry_unreadable(first + 1)
    c.tick(2)
    assert c.nodes[f].commit == first  # the leader's commit is further on
    assert c.leader().commit >= first + 1
    assert c.payloads(f) == [b"x"]


def test_a_replica_holding_an_unreadable_entry_never_seeks_leadership():
    c = Cluster(3)
    leader = c.elect()
    f = _follower(c)
    c.corrupt(f, leader.last_index)
    c.nodes[f].entry_unreadable(leader.last_index)  # as a check at open finds it
    c.isolate(leader.id)
    c.tick(40, only=[f])
    assert c.nodes[f].role == Role.FOLLOWER
    c.nodes[f].step(Message(MsgType.TIMEOUT_NOW, leader.id, f, leader.term))
    assert c.nodes[f].role == Role.FOLLOWER
    c.repair(f)
    c.tick(40, only=[f])
    assert c.nodes[f].role != Role.FOLLOWER  # campaigns again once repaired


def test_a_leader_never_sends_an_unreadable_entry_and_catches_up_after_repair():
    c = Cluster(3)
    leader = c.elect()
    lagging = _follower(c)
    c.isolate(lagging)
    first = c.propose(b"p")
    c.propose(b"q")
    c.corrupt(leader.id, first)
    c.heal()
    sent = []
    for _ in range(10):
        c.tick(1, only=[leader.id])
        sent += [m for m in c.mailbox if m.type == MsgType.APPEND]
    assert all(e.index != first for m in sent for e in m.entries)
    assert c.payloads(lagging) == []
    assert c.to_repair[leader.id] == [first]
    c.repair(leader.id)
    c.tick(3)
    assert c.payloads(lagging) == [b"p", b"q"]


def test_an_overwritten_unreadable_entry_needs_no_repair_and_others_are_ignored():
    c = Cluster(3)
    leader = c.elect()
    f, first = _stored_not_committed(c, [b"old"])
    node = c.nodes[f]
    node.entry_unreadable(first + 5)  # not in its log: ignored
    node.entry_unreadable(first)
    assert node.unreadable == {first}
    # a leader of a later term replaces the uncommitted entry: the new one is intact
    other = next(i for i in c.nodes if i not in (leader.id, f))
    new = Entry(first, leader.term + 1, EntryType.MESSAGES, b"new")
    node.step(Message(MsgType.APPEND, other, f, leader.term + 1, log_index=first - 1,
                      log_term=node.term_at(first - 1), entries=(new,)))
    assert node.unreadable == frozenset()


def test_a_leader_frozen_on_an_unreadable_entry_steps_down_and_follows_after_repair():
    # A frozen leader ignores ticks and messages: without stepping down it would claim
    # leadership forever while cut off (it never runs check-quorum), its clients waiting.
    c = Cluster(3)
    leader = c.elect()
    old = leader.id
    first = leader.propose(b"a")
    c.process(old)  # stored on the leader, not yet committed
    c.corrupt(old, first)
    c.stabilize()  # the followers acknowledge: it commits and reads `first` to apply it
    assert leader.frozen and leader.role == Role.LEADER and c.payloads(old) == []
    term = leader.term
    c.tick(1, only=[old])
    assert leader.role == Role.FOLLOWER and leader.leader is None and leader.term == term
    for _ in range(100):  # the others elect among themselves (the frozen one ignores it)
        new = next((n for n in c.nodes.values() if n.role == Role.LEADER), None)
        if new is not None:
            break
        c.tick()
    assert new is not None and new.id != old and new.term > term
    c.propose(b"b")
    assert c.payloads(old) == []  # still frozen until a peer's copy repairs it
    assert c.repair(old) == [first]
    c.tick(3)
    assert c.nodes[old].leader == new.id and c.payloads(old) == [b"a", b"b"]
