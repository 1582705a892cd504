"""The simulator's own pieces: disk durability, network faults and partition shapes,
the event queue and knob drawing."""

from __future__ import annotations

import random

import pytest

from raftlog.sim import network
from raftlog.sim.disk import SimStore
from raftlog.sim.events import EventQueue
from raftlog.sim.knobs import PROFILES, Knobs
from raftlog.sim.network import SimNetwork
from raftlog.types import (
    Entry,
    EntryType,
    EntryUnreadable,
    HardState,
    Message,
    MsgType,
    Snapshot,
)


def _entries(lo: int, hi: int, term: int = 1) -> list[Entry]:
    return [Entry(i, term, EntryType.MESSAGES, b"%d" % i) for i in range(lo, hi)]


# ---------------------------------------------------------------------- disk


def test_crash_keeps_only_what_an_fsync_covered() -> None:
    d = SimStore(HardState())
    d.append(_entries(1, 4))
    d.begin_sync()
    d.append(_entries(4, 6))  # written after the fsync started: not covered by it
    assert d.finish_sync() == 3
    assert d.crash() == 2
    assert d.last_index() == 3 and d.durable_len == 3


def test_a_torn_tail_keeps_an_intact_prefix_of_the_unsynced_entries() -> None:
    kept = set()
    for seed in range(40):
        d = SimStore(HardState())
        d.append(_entries(1, 3))
        d.begin_sync()
        d.finish_sync()
        d.append(_entries(3, 8))
        d.crash(random.Random(seed))
        assert [e.index for e in d.log] == list(range(1, d.last_index() + 1))
        kept.add(d.last_index())
    assert min(kept) == 2 and max(kept) > 2


def test_truncation_is_durable_and_shrinks_an_fsync_in_flight() -> None:
    d = SimStore(HardState())
    d.append(_entries(1, 6))
    d.begin_sync()  # will cover 1..5
    d.append(_entries(3, 5, term=2))  # conflicting suffix from index 3 replaced
    assert [e.term for e in d.log] == [1, 1, 2, 2]
    assert d.finish_sync() == 2  # entries 3..5 of term 1 it covered are gone
    assert d.crash() == 2
    assert [e.term for e in d.log] == [1, 1]


def test_store_reads_follow_the_log_store_contract() -> None:
    d = SimStore(HardState())
    d.append(_entries(1, 6))
    assert d.term(0) == 0 and d.term(5) == 1
    assert [e.index for e in d.entries(2, 5, 1 << 20)] == [2, 3, 4]
    assert [e.index for e in d.entries(2, 5, 1)] == [2]  # at least one
    with pytest.raises(IndexError):
        d.term(6)
    with pytest.raises(ValueError):
        d.append(_entries(8, 9))


def test_compaction_drops_a_durable_prefix_covered_by_the_snapshot() -> None:
    d = SimStore(HardState())
    d.append(_entries(1, 4) + _entries(4, 9, term=2))
    d.begin_sync()
    d.finish_sync()
    with pytest.raises(ValueError):
        d.compact(5)  # no snapshot saved yet
    d.save_snapshot(Snapshot(6, 2, b"state"))
    with pytest.raises(ValueError):
        d.compact(7)  # past the snapshot
    d.compact(5)
    assert (d.first_index(), d.last_index(), d.term(5)) == (6, 8, 2)
    assert d.entry(5) is None and d.entry(6) == _entries(6, 7, term=2)[0]
    with pytest.raises(IndexError):
        d.term(3)
    with pytest.raises(IndexError):
        d.entries(5, 7, 1 << 20)
    assert [e.index for e in d.entries(6, 9, 1 << 20)] == [6, 7, 8]
    d.append(_entries(9, 10, term=3))
    assert d.crash() == 1 and d.first_index() == 6  # the compacted prefix is durable


def test_reset_and_wipe() -> None:
    d = SimStore(HardState(term=4, vote=2))
    d.append(_entries(1, 6))
    d.begin_sync()  # an fsync in flight over the old log covers nothing afterwards
    d.reset_to(20, 3)
    assert (d.first_index(), d.last_index(), d.durable_len, d.term(20)) == (21, 20, 20, 3)
    assert d.finish_sync() == 20
    d.append(_entries(21, 23, term=4))
    assert d.term(22) == 4 and d.unsynced == 2
    d.save_snapshot(Snapshot(20, 3, b"s"))
    d.wipe()
    assert (d.first_index(), d.last_index(), d.snapshot) == (1, 0, None)
    assert (d.hard_state.term, d.hard_state.vote) == (4, 2)


def test_a_corrupt_entry_is_unreadable_until_a_peer_copy_repairs_it() -> None:
    d = SimStore(HardState())
    d.append(_entries(1, 6))
    assert d.corrupt_entry(3) and not d.corrupt_entry(9)
    assert d.term(3) == 1  # index and term still known
    assert d.entries(1, 6, 1 << 20) == _entries(1, 3)  # a read stops before it
    with pytest.raises(EntryUnreadable):
        d.entries(3, 6, 1 << 20)
    assert d.readable(3) is None  # no peer gets it from here either
    assert not d.repair(3, Entry(3, 2, EntryType.MESSAGES, b"3"))  # another entry
    assert d.repair(3, _entries(3, 4)[0])
    assert d.entries(1, 6, 1 << 20) == _entries(1, 6)
    d.corrupt_entry(4)
    d.append(_entries(4, 5, term=2))  # overwritten by a new leader's entry: intact
    assert d.corrupt == set()
    d.corrupt_entry(2)
    d.verify = False  # the serve-corrupt mutation: the damaged entry is handed out
    assert d.entries(1, 3, 1 << 20) == _entries(1, 3)


# ---------------------------------------------------------------------- network


def _msg(src: int, dst: int, n: int) -> Message:
    return Message(MsgType.HEARTBEAT, src, dst, 1, commit=n)


def _drain(net: SimNetwork) -> list[Message]:
    out = []
    while net.next_time() is not None:
        m = net.pop()
        if m is not None:
            out.append(m)
    return out


def test_paths_are_fifo_unless_reordering() -> None:
    net = SimNetwork(random.Random(1), latency_min_us=1, latency_max_us=1000)
    for n in range(50):
        net.send(_msg(1, 2, n), now=n)
    assert [m.commit for m in _drain(net)] == list(range(50))
    net = SimNetwork(random.Random(1), latency_min_us=1, latency_max_us=1000, reorder_p=1.0)
    for n in range(50):
        net.send(_msg(1, 2, n), now=n)
    assert [m.commit for m in _drain(net)] != list(range(50))


def test_loss_and_duplication() -> None:
    net = SimNetwork(random.Random(2), drop_p=0.5, dup_p=0.5)
    for n in range(200):
        net.send(_msg(1, 2, n), now=0)
    got = _drain(net)
    assert net.stats.dropped > 50 and net.stats.duplicated > 20
    assert len(got) == 200 - net.stats.dropped + net.stats.duplicated
    assert all(isinstance(m, Message) for m in got)


def test_a_partition_swallows_messages_in_flight() -> None:
    net = SimNetwork(random.Random(3))
    net.send(_msg(1, 2, 0), now=0)
    net.send(_msg(2, 1, 0), now=0)
    net.partition("one_way", {(1, 2)})
    assert [(m.src, m.dst) for m in _drain(net)] == [(2, 1)]
    net.heal()
    net.send(_msg(1, 2, 1), now=0)
    assert len(_drain(net)) == 1


def _reach(blocked: set[tuple[int, int]], nodes: list[int]) -> dict[int, set[int]]:
    return {a: {b for b in nodes if a != b and (a, b) not in blocked} for a in nodes}


@pytest.mark.parametrize("seed", range(10))
def test_partition_shapes(seed: int) -> None:
    rng = random.Random(seed)
    five = [1, 2, 3, 4, 5]
    r = _reach(network.isolate(five, 3), five)
    assert r[3] == set() and all(3 not in r[n] for n in five)
    r = _reach(network.bridge(five, rng), five)
    assert any(len(r[n]) == 4 for n in five)  # the bridge sees everyone
    assert sum(len(r[n]) == 4 for n in five) == 1
    r = _reach(network.ring(five, rng), five)
    assert all(len(r[n]) == 2 for n in five)  # each sees itself and two: a majority of 3
    blocked = network.one_way(five, rng)
    assert all((b, a) not in blocked for a, b in blocked)  # one direction only


def test_split_yields_two_mutually_unreachable_groups() -> None:
    five = [1, 2, 3, 4, 5]
    for seed in range(20):
        r = _reach(network.split(five, random.Random(seed)), five)
        groups = {frozenset({n} | r[n]) for n in five}
        assert len(groups) == 2 and set().union(*groups) == set(five)
        assert min(len(g) for g in groups) <= 2


# ---------------------------------------------------------------------- clock, knobs


def test_event_queue_breaks_ties_by_insertion_order() -> None:
    q = EventQueue()
    seen: list[str] = []
    for name in "abc":
        q.push(5, seen.append, name)
    q.push(1, seen.append, "first")
    while len(q):
        _at, fn, args = q.pop()
        fn(*args)
    assert seen == ["first", "a", "b", "c"]


def test_knobs_are_a_function_of_the_seed() -> None:
    a = Knobs.draw(random.Random(9), 9, 5)
    b = Knobs.draw(random.Random(9), 9, 5)
    assert a == b and a.profile in PROFILES
    assert Knobs.draw(random.Random(9), 9, 5, drop_p=0.0).drop_p == 0.0
    assert "drop_p" in a.describe()
    assert {Knobs.draw(random.Random(s), s, 3, "commit-old-term").profile for s in range(20)} == {
        "churn"
    }
