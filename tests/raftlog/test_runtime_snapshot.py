"""Snapshots in the trio shell: a replica whose disk was wiped after retention is caught up
by the leader's snapshot and refilled with the entries its state references, a periodic
snapshot bounds the replay of a restart, and an install (or refill) a crash interrupted
is finished (or restarted) on the next open."""

from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path

import crc32c
import msgpack
import trio

from broker.duties.retention import RetentionPolicy, retain_once
from broker.state.statemachine import BrokerState, control_create_topic
from raftlog.commitlog import CommitLog
from raftlog.runtime import GroupOptions, GroupRuntime
from raftlog.snapshot import load_snapshot, save_snapshot
from raftlog.types import Entry, EntryType, Membership, Snapshot
from tests.broker.duties.test_retention import HOUR_MS, SEG, batch
from tests.runtime_harness import Group, core_of, log_of


def _first(rt: GroupRuntime) -> int:
    return log_of(rt).first_index()


def test_a_wiped_replica_is_caught_up_from_the_leaders_snapshot(tmp_path: Path) -> None:
    async def main() -> None:
        r: Group[BrokerState] = Group(tmp_path, lambda: BrokerState("g"),
                                      restore=lambda d: BrokerState.restore("g", d),
                                      segment_size=SEG)
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
            target = core_of(leader).commit
            await r.wait(lambda: all(s.applied_index >= target for s in r.machines.values()))
            policy = RetentionPolicy(retention_hours=72, disk_ratio=1.0, data_dir=tmp_path,
                                     usage=lambda: (0, 1))
            index = await retain_once(policy, leader, r.machines[leader.node_id])
            assert index is not None and index > 1
            await r.wait(lambda: all(_first(rt) == index for rt in r.runtimes.values()))

            # a follower loses its whole directory (log, snapshot, hard state) and
            # comes back empty: the leader no longer holds what it needs
            victim = next(i for i in (1, 2, 3) if i != leader.node_id)
            await r.stop_and_wait(victim)
            shutil.rmtree(tmp_path / f"n{victim}")
            for k in range(80, 90):
                await leader.propose(batch(k, now))
            await r.start(n, victim)
            rt = r.runtimes[victim]
            assert log_of(rt).last_index() == 0
            await r.wait(lambda: rt.snapshots_installed == 1)
            snap = load_snapshot(tmp_path / f"n{victim}" / "snapshot")
            assert snap is not None and snap.index >= index
            assert snap.membership == Membership(frozenset({1, 2, 3}))
            # its log restarts where the leader's begins (not after the snapshot): the
            # entries in between are referenced by its queues and refilled by appends
            assert snap.base is not None and snap.base[0] + 1 == index < snap.index
            assert log_of(rt).first_index() == index
            assert rt.machine is r.machines[victim]  # restored through the callback

            # it keeps replicating from there, and its state is the leader's
            for k in range(90, 100):
                await leader.propose(batch(k, now))
            target = core_of(leader).commit
            await r.wait(lambda: all(s.applied_index >= target for s in r.machines.values()))
            assert r.machines[victim].snapshot() == r.machines[leader.node_id].snapshot()
            assert r.machines[victim].queue_range("t", 0) == (
                r.machines[leader.node_id].queue_range("t", 0)
            )
            assert not core_of(leader).needs_snapshot and not core_of(leader).sending_snapshot
            lo, end = r.machines[victim].queue_range("t", 0)
            refs, _ = r.machines[victim].lookup("t", 0, lo, end - lo, 1 << 40)
            assert len(refs) == end - lo
            assert all(log_of(rt).first_index() <= e.index <= log_of(rt).last_index() for e in refs)
            assert {e.index for e in refs} & set(range(index, snap.index + 1))
            st = rt.status()
            assert st["snapshot"] == snap.index and st["installing"] is None
            assert st["refilling"] is False

            # and it restarts from what it installed
            await r.stop_and_wait(victim)
            await r.start(n, victim)
            assert core_of(r.runtimes[victim]).applied >= snap.index
            await leader.propose(batch(100, now))
            target = core_of(leader).commit
            await r.wait(lambda: all(s.applied_index >= target for s in r.machines.values()))
            snaps = {s.snapshot() for s in r.machines.values()}
            assert len(snaps) == 1
            n.cancel_scope.cancel()

    trio.run(main)


class Tally:
    """A state machine that counts what it applies and remembers what it applied since
    it was created (or restored), to show where a replay starts."""

    def __init__(self, applied: int = 0, total: int = 0) -> None:
        self.applied = applied
        self.total = total
        self.replayed: list[int] = []

    def apply(self, entry: Entry) -> int:
        if entry.index <= self.applied:
            return self.total
        self.applied = entry.index
        self.replayed.append(entry.index)
        if entry.type == EntryType.MESSAGES:
            self.total += int(bytes(entry.data))
        return self.total

    def snapshot(self) -> bytes:
        data: bytes = msgpack.packb([self.applied, self.total])
        return data

    @classmethod
    def restore(cls, data: bytes) -> Tally:
        applied, total = msgpack.unpackb(data)
        return cls(applied, total)


def test_periodic_snapshots_bound_the_replay_of_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        r: Group[Tally] = Group(tmp_path, Tally, restore=Tally.restore, segment_size=SEG,
                                snapshot_every_entries=25)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            for k in range(1, 61):
                await leader.propose(b"%d" % k)
            target = core_of(leader).commit
            await r.wait(lambda: all(m.applied >= target for m in r.machines.values()))
            follower = next(i for i in (1, 2, 3) if i != leader.node_id)
            rt = r.runtimes[follower]
            await r.wait(lambda: rt.snapshots_written >= 2)
            snap = load_snapshot(tmp_path / f"n{follower}" / "snapshot")
            assert snap is not None and 25 <= snap.index <= target
            assert rt.snapshot_index == snap.index
            assert _first(rt) == 1  # periodic snapshots delete nothing

            await r.stop_and_wait(follower)
            await r.start(n, follower)
            restored = r.machines[follower]
            assert restored.applied == snap.index  # from the snapshot, before any replay
            await r.wait(lambda: restored.applied >= target)
            # the replay began right after the snapshot, not at entry 1
            assert restored.replayed[0] == snap.index + 1
            assert restored.replayed == list(range(snap.index + 1, restored.applied + 1))
            assert restored.total == sum(range(1, 61))
            n.cancel_scope.cancel()

    trio.run(main)


def test_snapshots_are_off_with_a_zero_period(tmp_path: Path) -> None:
    async def main() -> None:
        r: Group[Tally] = Group(tmp_path, Tally, restore=Tally.restore, segment_size=SEG,
                                snapshot_every_entries=0)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            for k in range(1, 31):
                await leader.propose(b"%d" % k)
            await trio.sleep(0.1)
            assert all(rt.snapshots_written == 0 for rt in r.runtimes.values())
            assert not (tmp_path / f"n{leader.node_id}" / "snapshot").exists()
            n.cancel_scope.cancel()

    trio.run(main)


def test_open_finishes_an_install_a_crash_interrupted(tmp_path: Path) -> None:
    """The snapshot file was written, the log not yet reset: the log is reset on open."""
    lg = CommitLog.open(tmp_path, segment_size=SEG)
    lg.append([Entry(i, 1, EntryType.MESSAGES, b"1") for i in range(1, 11)])
    lg.close()
    m = Membership(frozenset({1, 2, 3}))
    save_snapshot(tmp_path / "snapshot", Snapshot(40, 3, Tally(40, 99).snapshot(), m))
    rt = GroupRuntime("g", 1, tmp_path, (1, 2, 3), Tally(), lambda g, msg: None,
                      GroupOptions(segment_size=SEG), restore=Tally.restore)
    rt.open()
    assert (log_of(rt).first_index(), log_of(rt).last_index(), log_of(rt).term(40)) == (41, 40, 3)
    assert core_of(rt).commit == core_of(rt).applied == 40
    assert core_of(rt).snapshot_index == 40
    assert isinstance(rt.machine, Tally) and rt.machine.total == 99
    log_of(rt).close()


def _open_with(tmp_path: Path, log: list[Entry], snap: Snapshot,
               base: tuple[int, int] | None = None) -> GroupRuntime[Tally]:
    lg = CommitLog.open(tmp_path, segment_size=SEG)
    if base is not None:
        lg.reset_to(*base)
    if log:
        lg.append(log)
    lg.close()
    save_snapshot(tmp_path / "snapshot", snap)
    rt = GroupRuntime("g", 1, tmp_path, (1, 2, 3), Tally(), lambda g, msg: None,
                      GroupOptions(segment_size=SEG), restore=Tally.restore)
    rt.open()
    return rt


def test_open_restarts_an_install_whose_refill_a_crash_interrupted(tmp_path: Path) -> None:
    """The installed snapshot (40, base 20) is saved, the log reset to 20 and refilled
    up to 30 only: the refill starts over from the base, the core refilling."""
    m = Membership(frozenset({1, 2, 3}))
    rt = _open_with(tmp_path, [Entry(i, 3, EntryType.MESSAGES, b"1") for i in range(21, 31)],
                    Snapshot(40, 3, Tally(40, 99).snapshot(), m, (20, 2)), base=(20, 2))
    assert (log_of(rt).first_index(), log_of(rt).last_index(), log_of(rt).term(20)) == (21, 20, 2)
    assert core_of(rt).refilling and core_of(rt).commit == core_of(rt).applied == 40
    assert isinstance(rt.machine, Tally) and rt.machine.total == 99
    log_of(rt).close()


def test_open_keeps_a_log_that_holds_the_snapshots_entries_from_its_base(tmp_path: Path) -> None:
    m = Membership(frozenset({1, 2, 3}))
    entries = [Entry(i, 3, EntryType.MESSAGES, b"1") for i in range(21, 51)]
    rt = _open_with(tmp_path, entries, Snapshot(40, 3, Tally(40, 99).snapshot(), m, (20, 2)),
                    base=(20, 2))
    assert (log_of(rt).first_index(), log_of(rt).last_index()) == (21, 50)
    assert not core_of(rt).refilling and core_of(rt).applied == 40
    log_of(rt).close()


def test_an_own_snapshot_ahead_of_its_log_refills_from_its_horizon(tmp_path: Path) -> None:
    """A follower applied up to 40 and snapshotted (horizon 11) before its fsync covered
    past 30; a crash lost 31..40. Its log is reset to the horizon and refilled."""
    m = Membership(frozenset({1, 2, 3}))
    rt = _open_with(tmp_path, [Entry(i, 1, EntryType.MESSAGES, b"1") for i in range(1, 31)],
                    Snapshot(40, 1, Tally(40, 99).snapshot(), m, (10, 1)))
    assert (log_of(rt).first_index(), log_of(rt).last_index()) == (11, 10)
    assert core_of(rt).refilling and core_of(rt).applied == 40
    log_of(rt).close()


def test_snapshot_files_keep_the_base_and_older_files_still_load(tmp_path: Path) -> None:
    m = Membership(frozenset({1, 2}))
    path = tmp_path / "snapshot"
    for base in ((7, 2), None):
        save_snapshot(path, Snapshot(9, 3, b"state", m, base))
        assert load_snapshot(path) == Snapshot(9, 3, b"state", m, base)
    # a version 2 file (written before bases were recorded)
    members = m.encode()
    head = struct.pack("<4sHHQQIQ", b"RMSN", 2, 0, 9, 3, len(members), len(members) + 5)
    body = head + members + b"state"
    path.write_bytes(body + struct.pack("<I", crc32c.crc32c(body)))
    assert load_snapshot(path) == Snapshot(9, 3, b"state", m, None)


class _Serialised:
    """What `TallyLater.snapshot_later` returns: the bytes, then `saved()` once durable."""

    def __init__(self, owner: TallyLater, applied: int, total: int) -> None:
        self.owner, self.applied, self.total = owner, applied, total

    def __call__(self) -> bytes:
        if self.owner.fail_next:
            self.owner.fail_next = False
            raise OSError("disk trouble")
        data: bytes = msgpack.packb([self.applied, self.total])
        return data

    def saved(self) -> None:
        # what the snapshot file holds when the runtime says it is durable
        snap = load_snapshot(Path(self.owner.path) / "snapshot")
        self.owner.saved.append((self.applied, snap.index if snap is not None else None))


class TallyLater(Tally):
    path = ""

    def __init__(self, applied: int = 0, total: int = 0) -> None:
        super().__init__(applied, total)
        self.saved: list[tuple[int, int | None]] = []
        self.fail_next = True  # the first snapshot fails to serialise

    def snapshot_later(self) -> _Serialised:
        return _Serialised(self, self.applied, self.total)


def test_a_serialiser_hears_saved_once_its_snapshot_file_is_durable(tmp_path: Path) -> None:
    async def main() -> None:
        r: Group[TallyLater] = Group(tmp_path, TallyLater, segment_size=SEG,
                                     snapshot_every_entries=10)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
                r.machines[i].path = str(tmp_path / f"n{i}")
            leader = await r.leader()
            machine = r.machines[leader.node_id]
            for k in range(1, 41):
                await leader.propose(b"%d" % k)
            # `saved` is heard in the worker thread, the count taken back on the event
            # loop: they agree once no snapshot is half way; never for the one that failed
            await r.wait(lambda: len(machine.saved) >= 2
                         and leader.snapshots_written == len(machine.saved))
            # each after its own file was in place
            assert all(applied == on_disk for applied, on_disk in machine.saved)
            n.cancel_scope.cancel()

    trio.run(main)


class _SlowSerialised:
    """A detached state whose serialising takes a while, as a large one's does."""

    def __init__(self, applied: int, total: int) -> None:
        self.applied, self.total = applied, total

    def __call__(self) -> bytes:
        time.sleep(0.2)  # in the writer's worker thread
        data: bytes = msgpack.packb([self.applied, self.total])
        return data


class TallyCountingDetaches(Tally):
    def __init__(self, applied: int = 0, total: int = 0) -> None:
        super().__init__(applied, total)
        self.detached: list[int] = []

    def snapshot_later(self) -> _SlowSerialised:
        self.detached.append(self.applied)  # detaching costs the event loop
        return _SlowSerialised(self.applied, self.total)


def test_no_state_is_detached_while_the_writer_is_busy_and_the_deferred_one_is_taken(
        tmp_path: Path) -> None:
    """Seed 21: a replica replaying a long log detached its state after every batch while
    the writer was still saving an earlier one, and the writer dropped all but the last;
    the detaching starved the node. One is detached per write, and none is lost: the one
    that came due meanwhile is taken when the writer is free."""
    every = 5

    async def main() -> None:
        r: Group[TallyCountingDetaches] = Group(tmp_path, TallyCountingDetaches,
                                                segment_size=SEG, snapshot_every_entries=every)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await r.start(n, i)
            leader = await r.leader()
            machine = r.machines[leader.node_id]
            for k in range(1, 151):
                await leader.propose(b"%d" % k)
            target = core_of(leader).commit
            # the last period's snapshot is taken once the writer is free
            await r.wait(lambda: leader.snapshot_index >= target - every + 1)
            written = leader.snapshots_written
            assert written >= 2
            # without deferring: one per `every` entries (30), most of them thrown away
            assert len(machine.detached) <= written + 1, (machine.detached, written)
            n.cancel_scope.cancel()

    trio.run(main)
