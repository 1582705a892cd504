"""A damaged snapshot, or a ConsumeQueue chunk it references, is rebuilt rather than
refused when the replica's log still begins at entry 1 (three real GroupRuntimes over
real files): the state is a function of the committed log, so replaying it gives the
same state as every other replica's. Once retention has cut the log's beginning, the
snapshot was the only copy of that part of the state, and opening refuses on it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from broker.cqchunks import ChunkGone, CorruptChunk, FileChunkStore
from broker.retention import RetentionPolicy, retain_once
from broker.statemachine import BrokerState, control_create_topic
from raftlog.fsutil import CorruptFile
from raftlog.runtime import GroupRuntime
from raftlog.snapshot import CorruptSnapshot, load_snapshot
from raftlog.types import EntryType
from tests.runtime_harness import Group, core_of, log_of
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch

SEG = 64 << 10
HOUR_MS = 3_600_000
CHUNK = 8  # records per sealed ConsumeQueue chunk: small, so a few batches seal some


def batch(k: int, store_ms: int, n: int = 4) -> bytes:
    msgs = [OutgoingMessage(body=b"m%d-%d" % (k, i) + b"x" * 700, key=f"k{k}") for i in range(n)]
    return STORED_PREFIX.pack(store_ms) + encode_batch("t", 0, msgs)


class Replicas(Group[BrokerState]):
    """Three replicas whose states keep their sealed chunks in files beside their logs,
    as a node's do (the harness's default states keep them in memory)."""

    def __init__(self, tmp: Path, **opts: object) -> None:
        super().__init__(tmp, lambda: BrokerState("g"), restore=self._restore_state,
                         segment_size=SEG, **opts)
        self._restoring = 0

    def store(self, i: int) -> FileChunkStore:
        return FileChunkStore(self.tmp / f"n{i}" / "consumequeue")

    def _restore_state(self, data: bytes) -> BrokerState:
        return BrokerState.restore("g", data, chunk_store=self.store(self._restoring),
                                   chunk_records=CHUNK)

    async def start(self, nursery: trio.Nursery, i: int) -> None:
        self.machine = lambda: BrokerState("g", chunk_store=self.store(i), chunk_records=CHUNK)
        self._restoring = i
        await super().start(nursery, i)


async def settle(r: Replicas) -> None:
    leader = await r.leader()
    target = core_of(leader).commit
    await r.wait(lambda: all(rt.is_open and s.applied_index >= target
                             for rt, s in ((r.runtimes[i], r.machines[i]) for i in (1, 2, 3))))


def state_bytes(s: BrokerState) -> bytes:
    """`s.snapshot()`, taken beside the replica's own snapshots: one of those may delete a
    chunk this copy references before it is written (ChunkGone, as in the runtime's own
    loop); the next try writes it again."""
    for _ in range(20):
        try:
            return s.snapshot()
        except ChunkGone:
            continue
    raise AssertionError("every try raced a snapshot of the replica's own")


def damage_snapshot(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # cut short, as the truncate-file nemesis does


def damage_a_chunk(node_dir: Path) -> Path:
    snap = load_snapshot(node_dir / "snapshot")
    assert snap is not None
    names = sorted(os.listdir(node_dir / "consumequeue"))
    assert names, "no sealed chunk to damage"
    victim = node_dir / "consumequeue" / names[0]
    raw = bytearray(victim.read_bytes())
    raw[5] ^= 0x01
    victim.write_bytes(bytes(raw))
    return victim


@pytest.mark.parametrize("damage", ["snapshot", "chunk"])
def test_a_damaged_snapshot_is_rebuilt_from_a_log_that_begins_at_entry_1(
        tmp_path: Path, damage: str) -> None:
    async def main() -> None:
        r = Replicas(tmp_path, snapshot_every_entries=20)
        now = int(time.time() * 1000)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            await leader.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            for k in range(40):
                await leader.propose(batch(k, now))
            await settle(r)
            victim = next(i for i in (1, 2, 3) if i != leader.node_id)
            vdir = tmp_path / f"n{victim}"
            await r.wait(lambda: load_snapshot(vdir / "snapshot") is not None)
            await r.stop_and_wait(victim)
            assert log_of(r.runtimes[victim]).first_index() == 1
            if damage == "snapshot":
                damage_snapshot(vdir / "snapshot")
                with pytest.raises(CorruptSnapshot):
                    load_snapshot(vdir / "snapshot")
            else:
                chunk = damage_a_chunk(vdir)
                with pytest.raises(CorruptChunk):
                    BrokerState.restore("g", load_snapshot(vdir / "snapshot").data,  # type: ignore[union-attr]
                                        chunk_store=FileChunkStore(str(chunk.parent)),
                                        chunk_records=CHUNK)
            for k in range(40, 50):  # the others go on meanwhile
                await leader.propose(batch(k, now))

            await r.start(n, victim)  # opens: no refusal
            rt = r.runtimes[victim]
            assert rt.status()["rebuilt_from_log"]
            assert (vdir / "snapshot.damaged").exists()
            await settle(r)
            states = {i: state_bytes(s) for i, s in r.machines.items()}
            assert states[victim] == states[leader.node_id]
            assert r.machines[victim].queue_range("t", 0) == (0, 200)
            # and the next snapshot it takes is whole again, chunks included
            for k in range(50, 80):
                await leader.propose(batch(k, now))
            await settle(r)
            await r.wait(lambda: (s := load_snapshot(vdir / "snapshot")) is not None
                         and s.index > core_of(rt).commit - 40)
            snap = load_snapshot(vdir / "snapshot")
            assert snap is not None
            BrokerState.restore("g", snap.data, chunk_store=FileChunkStore(str(vdir / "consumequeue")),
                                chunk_records=CHUNK)
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_damaged_snapshot_of_a_log_cut_by_retention_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        r = Replicas(tmp_path)
        now = int(time.time() * 1000)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            await leader.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            for k in range(60):
                await leader.propose(batch(k, now - 100 * HOUR_MS))
            for k in range(60, 80):
                await leader.propose(batch(k, now))
            await settle(r)
            policy = RetentionPolicy(retention_hours=72, disk_ratio=1.0, data_dir=tmp_path,
                                     usage=lambda: (0, 1))
            index = await retain_once(policy, leader, r.machines[leader.node_id])
            assert index is not None and index > 1
            await r.wait(lambda: all(log_of(rt).first_index() == index
                                     for rt in r.runtimes.values()))
            victim = next(i for i in (1, 2, 3) if i != leader.node_id)
            await r.stop_and_wait(victim)
            n.cancel_scope.cancel()
        vdir = tmp_path / f"n{victim}"
        damage_snapshot(vdir / "snapshot")
        cut = (vdir / "snapshot").read_bytes()
        rt = GroupRuntime("g", victim, vdir, (1, 2, 3), BrokerState("g"), lambda g, m: None,
                          r.runtimes[victim].options,
                          restore=lambda d: BrokerState.restore("g", d))
        with pytest.raises(CorruptFile):
            rt.open()
        assert (vdir / "snapshot").read_bytes() == cut  # nothing was changed
        assert not (vdir / "snapshot.damaged").exists()

    trio.run(main)
