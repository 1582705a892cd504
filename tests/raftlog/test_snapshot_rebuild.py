"""A damaged snapshot, or a ConsumeQueue chunk it references, is rebuilt from the
leader (three real GroupRuntimes over real files): the replica starts stateless with its
log kept exactly as it was, the leader sends it a snapshot, and it installs that over
its log (`raftlog.core`, "Lost state") whether or not retention has cut the log's
beginning. Only a replica alone in its group has no one to ask: it replays a log that
begins at entry 1, and refuses to start on one that retention has cut."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from broker.duties.retention import RetentionPolicy, retain_once
from broker.state.cqchunks import ChunkGone, CorruptChunk, FileChunkStore, provide, ship, unship
from broker.state.statemachine import BrokerState, chunk_refs, control_create_topic
from raftlog.fsutil import CorruptFile
from raftlog.hardstate import HardStateFile
from raftlog.runtime import GroupRuntime
from raftlog.snapshot import CorruptSnapshot, load_snapshot
from raftlog.types import EntryType, HardState, Membership, Message, MsgType
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
    and whose snapshots travel with the chunks they reference, as a node's do (the
    harness's default states keep them in memory)."""

    def __init__(self, tmp: Path, **opts: object) -> None:
        super().__init__(tmp, lambda: BrokerState("g"), restore=self._restore_state,
                         segment_size=SEG, **opts)
        self._shipped: dict[int, dict[str, bytes]] = {}

    def store(self, i: int) -> FileChunkStore:
        return FileChunkStore(self.tmp / f"n{i}" / "consumequeue")

    def _restore_state(self, data: bytes) -> BrokerState:
        raise AssertionError("restored through _restorer(i)")

    def _restorer(self, i: int) -> Callable[[bytes], BrokerState]:
        def restored(data: bytes) -> BrokerState:
            store = self.store(i)
            shipped = self._shipped.pop(i, None)
            if shipped:
                provide(store, chunk_refs(data), shipped)
            self.machines[i] = BrokerState.restore("g", data, chunk_store=store,
                                                   chunk_records=CHUNK)
            return self.machines[i]

        return restored

    def send(self, group: str, m: Message) -> None:
        if m.type == MsgType.SNAPSHOT and chunk_refs(m.snapshot):
            try:
                shipped = ship(m.snapshot, chunk_refs(m.snapshot), self.store(m.src))
            except (CorruptChunk, OSError):
                return  # never shipped: the leader sends it again later
            data, self._shipped[m.dst] = unship(shipped, chunk_refs)
            m = replace(m, snapshot=data)
        super().send(group, m)

    async def start(self, nursery: trio.Nursery, i: int) -> None:
        self.machine = lambda: BrokerState("g", chunk_store=self.store(i), chunk_records=CHUNK)
        await super().start(nursery, i)


async def settle(r: Replicas) -> None:
    leader = await r.leader()
    target = core_of(leader).commit
    await r.wait(lambda: all(rt.is_open and s.applied_index >= target
                             for rt, s in ((r.runtimes[i], r.machines[i]) for i in (1, 2, 3))))


def state_bytes(s: BrokerState) -> bytes:
    """`s.snapshot()`, taken beside the replica's own snapshots: one of those may delete a
    chunk this copy references before it is written (ChunkGone, as in the runtime's own
    loop), or write the same chunk file at the same moment (its temporary file then
    vanishes under this one); the next try writes it again."""
    for _ in range(20):
        try:
            return s.snapshot()
        except (ChunkGone, FileNotFoundError):
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


def damage(vdir: Path, what: str) -> None:
    if what == "snapshot":
        damage_snapshot(vdir / "snapshot")
        with pytest.raises(CorruptSnapshot):
            load_snapshot(vdir / "snapshot")
    else:
        chunk = damage_a_chunk(vdir)
        with pytest.raises(CorruptChunk):
            BrokerState.restore("g", load_snapshot(vdir / "snapshot").data,  # type: ignore[union-attr]
                                chunk_store=FileChunkStore(str(chunk.parent)),
                                chunk_records=CHUNK)


def log_bytes(rt: GroupRuntime) -> tuple[int, list[bytes]]:
    lg = log_of(rt)
    first = lg.first_index()
    return first, [e.data for e in lg.entries(first, lg.last_index() + 1, 1 << 30)]


@pytest.mark.parametrize("what", ["snapshot", "chunk"])
@pytest.mark.parametrize("retained", [False, True], ids=["log-from-1", "log-cut"])
def test_a_damaged_snapshot_is_rebuilt_from_the_leader_over_the_log_as_it_is(
        tmp_path: Path, what: str, retained: bool) -> None:
    async def main() -> None:
        r = Replicas(tmp_path, snapshot_every_entries=20)
        now = int(time.time() * 1000)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            await leader.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            for k in range(40):
                await leader.propose(batch(k, now - (100 * HOUR_MS if retained else 0)))
            for k in range(40, 50):
                await leader.propose(batch(k, now))
            await settle(r)
            if retained:
                policy = RetentionPolicy(retention_hours=72, disk_ratio=1.0, data_dir=tmp_path,
                                         usage=lambda: (0, 1))
                index = await retain_once(policy, leader, r.machines[leader.node_id])
                assert index is not None and index > 1
                await r.wait(lambda: all(log_of(rt).first_index() > 1
                                         for rt in r.runtimes.values()))
            victim = next(i for i in (1, 2, 3) if i != leader.node_id)
            vdir = tmp_path / f"n{victim}"
            await r.wait(lambda: load_snapshot(vdir / "snapshot") is not None)
            first, entries = log_bytes(r.runtimes[victim])  # settled: nothing on its way
            await r.stop_and_wait(victim)
            assert (first > 1) == retained
            damage(vdir, what)
            for k in range(50, 60):  # the others go on meanwhile
                await leader.propose(batch(k, now))

            await r.start(n, victim)  # opens: no refusal
            rt = r.runtimes[victim]
            assert rt.status()["snapshot_set_aside"]
            assert (vdir / "snapshot.damaged").exists()
            await r.wait(lambda: rt.snapshots_installed == 1 and not rt.status()["stateless"])
            await settle(r)
            # its log is the very one it had, and grew by what it missed
            again_first, again = log_bytes(rt)
            assert (again_first, again[: len(entries)]) == (first, entries)
            assert len(again) >= len(entries) + 10
            states = {i: state_bytes(s) for i, s in r.machines.items()}
            assert states[victim] == states[leader.node_id]
            assert r.machines[victim].queue_range("t", 0)[1] == 240
            assert (r.machines[victim].queue_range("t", 0)
                    == r.machines[leader.node_id].queue_range("t", 0))
            # and the next snapshot it takes is whole again, chunks included
            for k in range(60, 90):
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


def test_a_leader_without_a_snapshot_takes_one_for_a_follower_that_lost_its_state(
        tmp_path: Path) -> None:
    async def main() -> None:
        r = Replicas(tmp_path, snapshot_every_entries=0)  # none of their own
        now = int(time.time() * 1000)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            await leader.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            for k in range(30):
                await leader.propose(batch(k, now))
            await settle(r)
            victim = next(i for i in (1, 2, 3) if i != leader.node_id)
            vdir = tmp_path / f"n{victim}"
            await r.stop_and_wait(victim)
            (vdir / "snapshot").write_bytes(b"RMSN" + b"\0" * 10)  # a torn file of its own
            await r.start(n, victim)
            rt = r.runtimes[victim]
            assert rt.status()["stateless"]
            await r.wait(lambda: rt.snapshots_installed == 1)
            await settle(r)
            assert leader.snapshots_written == 1  # taken for it alone
            assert state_bytes(r.machines[victim]) == state_bytes(r.machines[leader.node_id])
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_damaged_snapshot_of_a_replica_alone_in_its_group_over_a_cut_log_is_refused(
        tmp_path: Path) -> None:
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
        # the group is this one replica now (as if it had always been alone)
        hs_file = HardStateFile(str(vdir / "hardstate"))
        hs = hs_file.load()
        hs_file.save(HardState(hs.term, hs.vote, ((0, 0, Membership(frozenset({victim}))),)))
        damage_snapshot(vdir / "snapshot")
        cut = (vdir / "snapshot").read_bytes()
        rt = GroupRuntime("g", victim, vdir, (victim,), BrokerState("g"), lambda g, m: None,
                          r.runtimes[victim].options,
                          restore=lambda d: BrokerState.restore("g", d))
        with pytest.raises(CorruptFile):
            rt.open()
        assert (vdir / "snapshot").read_bytes() == cut  # nothing was changed
        assert not (vdir / "snapshot.damaged").exists()

    trio.run(main)
