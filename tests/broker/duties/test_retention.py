"""Retention end to end: the policy's choice, snapshots, segment deletion on every replica,
OFFSET_TOO_SMALL below the new minimum, and a replica restarting from its snapshot."""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

import pytest
import trio

from broker.config import ConfigError, NodeConfig
from broker.duties.retention import RetentionPolicy, choose_retain_index, retain_once
from broker.state.statemachine import BrokerState, control_create_topic
from raftlog.commitlog import CommitLog, SegmentInfo
from raftlog.hardstate import HardStateFile
from raftlog.runtime import GroupOptions, GroupRuntime, MissingEntries
from raftlog.snapshot import CorruptSnapshot, Snapshot, load_snapshot, save_snapshot
from raftlog.types import Entry, EntryType, HardState, Membership
from tests.runtime_harness import Group, core_of, log_of
from wire.protocol import Code, RequestError
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch

SEG = 64 << 10
HOUR_MS = 3600 * 1000


def batch(k: int, store_ms: int, size: int = 3000) -> bytes:
    msgs = [OutgoingMessage(body=bytes([k % 256]) * size, key=f"k{k}")]
    return STORED_PREFIX.pack(store_ms) + encode_batch("t", 0, msgs)


# ------------------------------------------------------------------ the choice


class _Committed:
    """A CommitLog whose entries all count as committed, read as retention reads a
    group's log (`broker.duties.retention.CommittedLog`)."""

    def __init__(self, lg: CommitLog) -> None:
        self._lg = lg

    def log_bounds(self) -> tuple[int, int]:
        return self._lg.first_index(), self._lg.last_index()

    async def segment_bounds(self) -> list[SegmentInfo]:
        return self._lg.segment_bounds()

    async def read_committed(self, index: int) -> Entry:
        return self._lg.entries(index, index + 1, 1 << 62)[0]


def segs(*bounds: tuple[int, int]) -> list[SegmentInfo]:
    return [SegmentInfo(a, b, 1000, k * 1000, f"s{k}") for k, (a, b) in enumerate(bounds)]


def test_choose_deletes_an_expired_prefix_and_never_the_active_segment() -> None:
    s = segs((1, 10), (11, 20), (21, 30), (31, 40))
    old = {"s0", "s1"}
    assert choose_retain_index(s, limit=100, expired=lambda g: g.path in old) == 21
    # an unexpired segment stops the prefix, even if later ones are old
    assert choose_retain_index(s, limit=100, expired=lambda g: g.path in {"s0", "s2"}) == 11
    # everything expired: the active segment stays
    assert choose_retain_index(s, limit=100, expired=lambda g: True) == 31
    assert choose_retain_index(s, limit=100, expired=lambda g: False) is None


def test_choose_respects_the_limit_and_frees_disk_oldest_first() -> None:
    s = segs((1, 10), (11, 20), (21, 30), (31, 40))
    # limit = min(commit, slowest follower's match) + 1: entries 1..24 may go
    assert choose_retain_index(s, limit=25, expired=lambda g: True) == 21
    assert choose_retain_index(s, limit=20, expired=lambda g: True) == 11
    assert choose_retain_index(s, limit=10, expired=lambda g: True) is None
    # disk pressure: 1500 bytes over means two 1000-byte segments, ages notwithstanding
    assert choose_retain_index(s, limit=100, expired=lambda g: False, excess_bytes=1500) == 21
    assert choose_retain_index(s, limit=100, expired=lambda g: False, excess_bytes=1) == 11


def test_policy_reads_ages_from_store_times_and_disk_usage(tmp_path: Path) -> None:
    now = 1_000 * HOUR_MS
    lg = CommitLog.open(tmp_path, segment_size=SEG)
    entries = []
    for i in range(1, 121):
        ms = now - 100 * HOUR_MS if i <= 60 else now - HOUR_MS
        etype = EntryType.CONTROL if i % 7 == 0 else EntryType.MESSAGES
        entries.append(Entry(i, 1, etype, batch(i, ms) if etype == EntryType.MESSAGES else b"c"))
    lg.append(entries)
    lg.sync()
    bounds = lg.segment_bounds()
    assert len(bounds) > 4
    usage = [(50, 100)]
    policy = RetentionPolicy(retention_hours=72, disk_ratio=0.9, data_dir=tmp_path,
                             usage=lambda: usage[0])

    def candidate(commit: int, min_match: int, retained: int) -> int | None:
        return trio.run(partial(policy.candidate, _Committed(lg), commit=commit,
                                min_match=min_match, retained=retained, now_ms=now))

    got = candidate(120, 120, 0)
    old_segments = [s for s in bounds[:-1] if s.last_index <= 60]
    assert got == bounds[len(old_segments)].first_index
    assert candidate(120, 120, got) is None
    # a slow follower holds retention back
    assert candidate(120, 5, 0) is None
    # over the disk ratio by more than the expired segments hold: one more has to go
    usage[0] = (900_000_000 + sum(s.size for s in old_segments) + 1, 1_000_000_000)
    assert candidate(120, 120, 0) == (
        bounds[len(old_segments) + 1].first_index
    )
    # far over it: everything but the active segment may go
    usage[0] = (10**9, 10**9)
    assert candidate(120, 120, 0) == (
        bounds[-1].first_index
    )
    lg.close()


def test_retention_check_interval_is_validated() -> None:
    doc = {"node_id": 1, "listen": "127.0.0.1:7101", "data": "/d",
           "peers": {"1": "127.0.0.1:7101"}}
    assert NodeConfig.from_dict(doc, env={}).retention_check_interval == 60.0
    assert NodeConfig.from_dict({**doc, "retention_check_interval": 5},
                                env={}).retention_check_interval == 5.0
    for bad in (0, -1, "soon", float("inf")):
        with pytest.raises(ConfigError, match="retention_check_interval"):
            NodeConfig.from_dict({**doc, "retention_check_interval": bad}, env={})


def test_a_log_that_starts_after_the_snapshot_refuses_to_open(tmp_path: Path) -> None:
    lg = CommitLog.open(tmp_path, segment_size=SEG)
    lg.append([Entry(i, 1, EntryType.NOOP, b"x" * 4000) for i in range(1, 80)])
    lg.sync()
    first = lg.delete_before(40)
    lg.close()
    assert first > 1

    def runtime() -> GroupRuntime:
        return GroupRuntime("g", 1, tmp_path, (1,), BrokerState("g"), lambda g, m: None,
                            GroupOptions(segment_size=SEG),
                            restore=lambda data: BrokerState.restore("g", data))

    with pytest.raises(MissingEntries, match="lost"):
        runtime().open()
    save_snapshot(tmp_path / "snapshot", Snapshot(first - 2, 1, BrokerState("g").snapshot()))
    with pytest.raises(MissingEntries, match=f"entries {first - 1}..{first - 1} are lost"):
        runtime().open()
    save_snapshot(tmp_path / "snapshot", Snapshot(first - 1, 1, BrokerState("g").snapshot()))
    rt = runtime()
    rt.open()
    assert core_of(rt).commit == first - 1
    log_of(rt).close()


def test_snapshot_file_round_trip_and_corruption(tmp_path: Path) -> None:
    path = tmp_path / "snapshot"
    assert load_snapshot(path) is None
    save_snapshot(path, Snapshot(42, 3, b"state"))
    assert load_snapshot(path) == Snapshot(42, 3, b"state")
    raw = bytearray(path.read_bytes())
    raw[-6] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptSnapshot, match="CRC"):
        load_snapshot(path)
    path.write_bytes(bytes(raw[:10]))
    with pytest.raises(CorruptSnapshot, match="short"):
        load_snapshot(path)


# ------------------------------------------------------------------ three replicas


def replicas(tmp: Path) -> Group[BrokerState]:
    return Group(tmp, lambda: BrokerState("g"), restore=lambda d: BrokerState.restore("g", d),
                 segment_size=SEG)


def _first(rt: GroupRuntime) -> int:
    return log_of(rt).first_index()


def test_retention_deletes_on_every_replica_and_a_restart_restores_the_snapshot(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        r = replicas(tmp_path)
        now = int(time.time() * 1000)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            await leader.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            for k in range(60):  # ~3 KiB each: 64 KiB segments hold ~20
                await leader.propose(batch(k, now - 100 * HOUR_MS))
            for k in range(60, 100):
                await leader.propose(batch(k, now))
            target = core_of(leader).commit
            await r.wait(lambda: all(
                s.applied_index >= target for s in r.machines.values()))
            segments_before = {i: len(log_of(rt).segment_bounds()) for i, rt in r.runtimes.items()
                               if rt.is_open}
            assert min(segments_before.values()) >= 5

            policy = RetentionPolicy(retention_hours=72, disk_ratio=1.0, data_dir=tmp_path,
                                     usage=lambda: (0, 1))
            state = r.machines[leader.node_id]
            index = await retain_once(policy, leader, state)
            assert index is not None and index > 1
            # everything before the segment holding the first new message could go
            assert index <= 62

            await r.wait(lambda: all(_first(rt) == index for rt in r.runtimes.values()))
            for i, rt in r.runtimes.items():
                assert len(log_of(rt).segment_bounds()) < segments_before[i]
                assert log_of(rt).segment_bounds()[0].first_index == index
                snap = load_snapshot(tmp_path / f"n{i}" / "snapshot")
                assert snap is not None and snap.index >= index
                assert rt.status()["snapshot"] == snap.index
            lows = {s.queue_range("t", 0) for s in r.machines.values()}
            assert len(lows) == 1
            lo, end = lows.pop()
            assert 0 < lo < 60 and end == 100
            for s in r.machines.values():
                with pytest.raises(RequestError) as err:
                    s.lookup("t", 0, lo - 1, 10, 1 << 20)
                assert err.value.code == Code.OFFSET_TOO_SMALL
                assert s.lookup("t", 0, lo, 1, 1 << 20)[0][0].index >= index
            # the policy does not propose the same retain twice
            assert await retain_once(policy, leader, state) is None

            # restart a follower from its snapshot and the log after it
            follower = next(i for i in (1, 2, 3) if i != leader.node_id)
            await r.stop_and_wait(follower)
            old_state = r.machines[follower]
            for k in range(100, 110):
                await leader.propose(batch(k, now))
            await r.start(n, follower)
            restored = r.machines[follower]
            assert restored is not old_state
            assert r.runtimes[follower].machine is restored
            assert _first(r.runtimes[follower]) == index
            for k in range(110, 120):
                await leader.propose(batch(k, now))
            target = core_of(leader).commit
            await r.wait(lambda: all(
                s.applied_index >= target for s in r.machines.values()))
            snaps = {s.snapshot() for s in r.machines.values()}
            assert len(snaps) == 1
            assert restored.queue_range("t", 0) == (lo, 120)
            n.cancel_scope.cancel()

    trio.run(main)
    # a replica whose snapshot vanished never replays a hole: with peers it opens
    # stateless, its log kept, and waits for a leader's snapshot (tests/
    # test_snapshot_rebuild.py); alone in its group it refuses to start
    os.unlink(tmp_path / "n1" / "snapshot")
    rt = GroupRuntime("g", 1, tmp_path / "n1", (1, 2, 3), BrokerState("g"),
                      lambda g, m: None, GroupOptions(segment_size=SEG))
    rt.open()
    assert rt.status()["stateless"] and rt.status()["applied"] == 0
    assert _first(rt) > 1
    rt.close_log()
    hs_file = HardStateFile(str(tmp_path / "n1" / "hardstate"))
    hs = hs_file.load()
    hs_file.save(HardState(hs.term, hs.vote, ((0, 0, Membership(frozenset({1}))),)))
    alone = GroupRuntime("g", 1, tmp_path / "n1", (1,), BrokerState("g"),
                         lambda g, m: None, GroupOptions(segment_size=SEG))
    with pytest.raises(MissingEntries):
        alone.open()
