"""Retention and transactions: a segment holding undecided prepared data is never deleted,
and once the transaction is decided the pin goes."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import trio

from broker.parts.txpart import TxMarker
from broker.records import STORED_PREFIX, OutgoingMessage, encode_batch
from broker.retention import RetentionPolicy, retain_once
from broker.statemachine import control_create_topic
from raftlog.commitlog import CommitLog
from raftlog.types import Entry, EntryType
from tests.runtime_harness import core_of, log_of
from tests.test_retention import SEG, _Committed, replicas

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
            # with the pin gone, retention may pass it
            later = await retain_once(policy, leader, state)
            assert later is not None and later > prepared_at
            n.cancel_scope.cancel()

    trio.run(main)
