"""Retention and transactions: a segment holding undecided prepared data is never deleted,
and once the transaction is decided the pin goes; a committed transaction's records,
queued after records stored later than them, never make a cut hide those records nor
read as gone while the records before them stay."""

from __future__ import annotations

import random
import time
from functools import partial
from pathlib import Path

import trio

from broker.duties.retention import RetentionPolicy, choose_retain_index, retain_once
from broker.state.consumequeue import ConsumeQueue
from broker.state.parts.txpart import TxMarker
from broker.state.statemachine import BrokerState, Retain, control_create_topic
from raftlog.commitlog import CommitLog
from raftlog.types import Entry, EntryType
from tests.broker.duties.test_retention import SEG, _Committed, replicas, segs
from tests.broker.transactions.test_participant_part import Replica
from tests.runtime_harness import core_of, log_of
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch

HOUR_MS = 3600 * 1000


def _batch(k: int, store_ms: int, tx: tuple[str, int, int] | None = None) -> bytes:
    msgs = [OutgoingMessage(body=bytes([k % 256]) * 3000)]
    return STORED_PREFIX.pack(store_ms) + encode_batch("t", 0, msgs, tx=tx)


def test_the_policy_keeps_every_segment_at_or_above_the_pinned_index(tmp_path: Path) -> None:
    now = 1_000 * HOUR_MS
    lg = CommitLog.open(tmp_path, segment_size=SEG)
    lg.append([Entry(i, 1, EntryType.MESSAGES, _batch(i, now - 100 * HOUR_MS))
               for i in range(1, 121)])
    lg.sync()
    bounds = lg.segment_bounds()
    policy = RetentionPolicy(retention_hours=72, disk_ratio=1.0, data_dir=tmp_path,
                             usage=lambda: (0, 1))

    def candidate(pinned: int | None) -> int | None:
        return trio.run(partial(policy.candidate, _Committed(lg), commit=120, min_match=120,
                                retained=0, now_ms=now, pinned=pinned))

    assert candidate(None) == bounds[-1].first_index  # all expired: all but the active one
    pin = bounds[2].first_index + 3  # inside the third segment
    assert candidate(pin) == bounds[2].first_index  # the segment holding it stays
    assert candidate(bounds[2].first_index) == bounds[2].first_index
    assert candidate(bounds[0].last_index) is None  # pinned in the first segment: nothing
    lg.close()


def test_retention_waits_for_an_undecided_transaction_then_moves_on(tmp_path: Path) -> None:
    async def main() -> None:
        r = replicas(tmp_path)
        old = int(time.time() * 1000) - 100 * HOUR_MS
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            await leader.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            for k in range(50):  # ~20 a segment
                await leader.propose(_batch(k, old))
            prepared_at = core_of(leader).commit + 1
            await leader.propose(_batch(99, old, tx=("tid", 0, 0)))
            for k in range(50, 110):
                await leader.propose(_batch(k, old))
            target = core_of(leader).commit
            await r.wait(lambda: all(s.applied_index >= target for s in r.machines.values()))
            state = r.machines[leader.node_id]
            assert state.pinned_index() == prepared_at
            policy = RetentionPolicy(retention_hours=72, disk_ratio=1.0, data_dir=tmp_path,
                                     usage=lambda: (0, 1))
            index = await retain_once(policy, leader, state)
            assert index is not None and 1 < index <= prepared_at
            await r.wait(lambda: all(log_of(rt).first_index() == index
                                     for rt in r.runtimes.values()))
            # the prepared batch is still there: committing it makes it readable
            await leader.propose(TxMarker("tid", 0, 0, True, 0).encode(), EntryType.CONTROL)
            target = core_of(leader).commit
            await r.wait(lambda: all(s.applied_index >= target for s in r.machines.values()))
            assert state.pinned_index() is None
            lo, end = state.queue_range("t", 0)
            entries, _ = state.lookup("t", 0, end - 1, 1, 1 << 20)
            assert entries[0].index == prepared_at
            stored = await leader.read_committed(prepared_at)
            assert stored.data[STORED_PREFIX.size:].startswith(b"RB")
            # with the pin gone, retention may pass it -- once it may also pass the
            # messages queued before the committed one (stored up to `top`)
            ((_, top),) = state.retention_gaps()
            for k in range(110, 150):
                await leader.propose(_batch(k, old))
            target = core_of(leader).commit
            await r.wait(lambda: all(s.applied_index >= target for s in r.machines.values()))
            later = await retain_once(policy, leader, state)
            assert later is not None and later > top
            n.cancel_scope.cancel()

    trio.run(main)


# ------------------------------------------------------------------ late records


def _late_queue() -> tuple[Replica, list[bytes]]:
    """Queue t/0 holding A, B, C, D (entries 8-11), then a committed transaction's record
    X (its prepare entry is 2), then E, F, G (13-15)."""
    rep = Replica()
    rep.control(control_create_topic("t", 1, [0]))  # 1
    rep.batch("t", 0, [b"X"], tx=("tid", 0, 0))  # 2: prepared
    rep.control(control_create_topic("u", 1, [0]))  # 3
    for k in range(4):  # 4-7: another topic's
        rep.batch("u", 0, [b"u%d" % k])
    for body in (b"A", b"B", b"C", b"D"):  # 8-11
        rep.batch("t", 0, [body])
    rep.control(TxMarker("tid", 0, 0, True, 0).encode())  # 12: X enters after D
    for body in (b"E", b"F", b"G"):  # 13-15
        rep.batch("t", 0, [body])
    assert rep.index == 15
    return rep, [b"A", b"B", b"C", b"D", b"X", b"E", b"F", b"G"]


def test_a_cut_inside_a_transactions_window_keeps_what_is_stored_above_it() -> None:
    rep, bodies = _late_queue()
    assert rep.bodies("t", 0) == bodies
    rep.control(Retain(5).encode())
    # A-D (8-11) are still stored: the queue keeps them; only entries below 5 went
    assert rep.state.queue_range("t", 0) == (0, 8)
    assert rep.bodies("t", 0)[:4] == bodies[:4]
    # a cut past D removes everything queued up to X with it
    rep.control(Retain(12).encode())
    assert rep.state.queue_range("t", 0) == (5, 8)
    assert rep.bodies("t", 0) == bodies[5:]


def test_the_gap_a_late_record_opens_is_known_to_retention_and_survives_a_restore() -> None:
    rep, _ = _late_queue()
    # X (stored at 2) is queued after D (stored at 11): a cut in (2, 11] would delete X
    # but not D
    assert rep.state.retention_gaps() == [(2, 11)]
    restored = BrokerState.restore("g1", rep.state.snapshot())
    assert restored.retention_gaps() == [(2, 11)]
    cq = restored.queues.queue("t", 0)
    assert cq.first_offset_at_or_after_index(5) == 0
    assert cq.first_offset_at_or_after_index(12) == 5
    rep.control(Retain(12).encode())  # past the gap: X went with everything before it
    assert rep.state.retention_gaps() == []


def test_choose_never_cuts_inside_a_gap() -> None:
    s = segs((1, 10), (11, 20), (21, 30), (31, 40), (41, 50))
    every = partial(choose_retain_index, s, limit=100, expired=lambda seg: True)
    assert every() == 41
    assert every(gaps=[(15, 35)]) == 41  # past the gap: everything queued up to it goes
    assert every(gaps=[(15, 45)]) == 11  # 21, 31 and 41 are inside: the cut stays at 11
    assert every(gaps=[(5, 25), (35, 45)]) == 31
    assert choose_retain_index(s, limit=35, expired=lambda seg: True, gaps=[(15, 35)]) == 11
    assert every(gaps=[(21, 30)]) == 41  # (21, 30]: 21 itself keeps the late record


def test_retention_leaves_a_committed_transactions_records_readable(tmp_path: Path) -> None:
    """Three replicas: old messages around a transaction's prepare and commit, then new
    ones. The expired segments end inside the transaction's window, yet every message
    the queue still holds reads back from the log, the committed one included."""

    async def main() -> None:
        r = replicas(tmp_path)
        old = int(time.time() * 1000) - 100 * HOUR_MS
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            await leader.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            for k in range(30):
                await leader.propose(_batch(k, old))
            prepared_at = core_of(leader).commit + 1
            await leader.propose(_batch(99, old, tx=("tid", 0, 0)))
            for k in range(30, 90):  # old too: segments past the prepare expire
                await leader.propose(_batch(k, old))
            await leader.propose(TxMarker("tid", 0, 0, True, 0).encode(), EntryType.CONTROL)
            for k in range(90, 130):
                await leader.propose(_batch(k, int(time.time() * 1000)))
            target = core_of(leader).commit
            await r.wait(lambda: all(s.applied_index >= target for s in r.machines.values()))
            state = r.machines[leader.node_id]
            policy = RetentionPolicy(retention_hours=72, disk_ratio=1.0, data_dir=tmp_path,
                                     usage=lambda: (0, 1))
            index = await retain_once(policy, leader, state)
            assert index is not None
            target = core_of(leader).commit
            await r.wait(lambda: all(s.applied_index >= target for s in r.machines.values()))
            await r.wait(lambda: log_of(leader).first_index() == index)
            lo, end = state.queue_range("t", 0)
            entries, _ = state.lookup("t", 0, lo, end - lo, 1 << 40)
            assert [e.offset for e in entries] == list(range(lo, end))
            assert prepared_at in {e.index for e in entries}
            for e in entries:  # every one still stored
                stored = await leader.read_committed(e.index)
                assert stored.index == e.index
            assert index <= prepared_at  # the cut waits below the transaction's window
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_restored_queue_finds_the_same_late_records_as_the_one_that_appended_them() -> None:
    """Late runs are derived state: a queue rebuilt from its records (a snapshot load)
    knows the same ones, and the same cut places, as the queue that appended them."""
    for seed in range(300):
        rng = random.Random(seed)
        cq = ConsumeQueue()
        top = 0
        for _ in range(rng.randrange(1, 6000 if seed % 50 == 0 else 60)):
            if rng.random() < 0.3:  # a committed transaction's record: an older entry
                index = rng.randrange(1, top + 2)
            else:
                top += rng.randrange(0, 3)
                index = top
            cq.append(index, 0, 1, 0, 0)
        copy = ConsumeQueue(cq.min_offset, cq.records())
        assert copy.late_spans() == cq.late_spans(), seed
        for m in range(0, top + 3):
            assert copy.first_offset_at_or_after_index(m) == cq.first_offset_at_or_after_index(m)
