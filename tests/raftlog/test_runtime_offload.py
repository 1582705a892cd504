"""Blocking disk work leaves the event loop (`raftlog.runtime`, `_hold`): while one
group's disk call is slow, every other group on the same trio loop keeps being served.

Two groups of three real `GroupRuntime`s share one trio loop, each replica on its own
CommitLog in a temp directory. One replica of group A makes its disk calls through a
deliberately slowed filesystem call, injected at the runtime's I/O seam (`disk_call`):
in its worker thread, the call waits until group B's replicas have been handed a number
of further Raft messages (its heartbeats), then does the real work on the real files.
If the call ran on the event loop, B could not be served meanwhile and the wait would
end unfulfilled at its safety bound: the tests count events, they time nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from broker.duties.retention import RetentionPolicy, retain_once
from broker.state.statemachine import BrokerState, control_create_topic
from raftlog.types import Entry, EntryType, Message, Role
from tests.broker.duties.test_retention import HOUR_MS, SEG, batch
from tests.runtime_harness import Group, core_of, log_of

SERVED = 12  # messages group B must be handed while one disk call of group A waits
# (a few ticks: short of an election timeout of group A, whose log the call holds)
BOUND = 30.0  # seconds: a safety net for a broken build, not a measurement


class Recorder:
    def __init__(self) -> None:
        self.applied: list[bytes] = []

    def apply(self, entry: Entry) -> int:
        if entry.type == EntryType.MESSAGES:
            self.applied.append(bytes(entry.data))
        return entry.index


class CountingGroup(Group[Recorder]):
    """A group whose bus counts the messages it hands to replicas, and can cut a
    replica off (messages to and from it are dropped, the replica keeps running)."""

    def __init__(self, tmp: Path, **kw: Any) -> None:
        super().__init__(tmp, Recorder, **kw)
        self.delivered = 0
        self.cut: set[int] = set()

    def send(self, group: str, m: Message) -> None:
        if m.src in self.cut or m.dst in self.cut:
            return
        self.delivered += 1
        super().send(group, m)


class SlowDisk:
    """A disk call that, in its worker thread, first waits until `served()` has grown by
    `SERVED` (or `BOUND` seconds passed), then makes the real call. Records what it
    slowed and whether the rest of the node was served meanwhile."""

    def __init__(self, served: Callable[[], int], only: Callable[[str], bool]) -> None:
        self.served = served
        self.only = only
        self.calls: list[tuple[str, bool]] = []  # (call, was the loop serving meanwhile)
        self.entered = 0  # slowed calls begun
        self.lock = threading.Lock()

    def __call__(self, fn: Callable[[], Any]) -> Any:
        name = getattr(getattr(fn, "func", fn), "__qualname__", repr(fn))
        if self.only(name):
            with self.lock:
                self.entered += 1
            start = self.served()
            deadline = time.monotonic() + BOUND
            while self.served() - start < SERVED and time.monotonic() < deadline:
                time.sleep(0.002)
            with self.lock:
                self.calls.append((name, self.served() - start >= SERVED))
        return fn()


async def _start(g: Group[Any], n: trio.Nursery) -> None:
    for i in (1, 2, 3):
        await g.start(n, i)


def test_a_slow_hard_state_save_stalls_neither_the_loop_nor_its_own_group(tmp_path):
    """Replica 1 of group A saves its term and vote (temp file, fsync, rename, fsync
    dir) through the slowed call when an election begins; group B's heartbeats flow
    meanwhile. Afterwards A elects a leader and commits on every replica (events that
    reached replica 1 while it waited were handed to its core afterwards, in order)."""

    async def main() -> None:
        b = CountingGroup(tmp_path / "b")
        a = CountingGroup(tmp_path / "a")
        slow = SlowDisk(lambda: b.delivered, lambda name: name == "HardStateFile.save")
        a.disk_calls[1] = slow
        async with trio.open_nursery() as n:
            await _start(b, n)
            await b.leader()  # B is serving: its leader heartbeats every tick
            await _start(a, n)
            leader = await a.leader()
            await leader.propose(b"after the stall")
            await a.wait(lambda: all(m.applied == [b"after the stall"]
                                     for m in a.machines.values()))
            n.cancel_scope.cancel()
        assert slow.calls, "no hard-state save went through the slowed call"
        assert all(served for _, served in slow.calls), slow.calls

    trio.run(main)


def test_a_slow_committed_read_stalls_neither_the_loop_nor_the_group(tmp_path):
    """A cold read through the door (`read_committed`, what FETCH uses) runs in a
    worker thread; meanwhile group B is served. An event for the reading replica's core
    that comes meanwhile (a leadership transfer) waits for the read to let go of the
    log, then takes effect."""

    async def main() -> None:
        b = CountingGroup(tmp_path / "b")
        a = CountingGroup(tmp_path / "a")
        slow = SlowDisk(lambda: b.delivered, lambda name: name == "CommitLog.entries")
        a.disk_calls = {i: slow for i in (1, 2, 3)}
        async with trio.open_nursery() as n:
            await _start(b, n)
            await b.leader()
            await _start(a, n)
            leader = await a.leader()
            for k in range(5):
                await leader.propose(f"m{k}".encode())
            committed = core_of(leader).commit
            read: list[Entry] = []

            async def read_it() -> None:
                read.append(await leader.read_committed(committed))

            target = next(i for i in (1, 2, 3) if i != leader.node_id)
            async with trio.open_nursery() as reading:
                reading.start_soon(read_it)
                await a.wait(lambda: slow.entered == 1)
                leader.transfer_leadership(target)  # while the read holds the log
            assert bytes(read[0].data) == b"m4"
            await a.wait(lambda: a.runtimes[target].is_leader)
            await a.runtimes[target].propose(b"after the transfer")
            n.cancel_scope.cancel()
        assert [name for name, _ in slow.calls] == ["CommitLog.entries"]
        assert all(served for _, served in slow.calls), slow.calls

    trio.run(main)


def test_a_slow_truncation_of_a_conflicting_suffix_stalls_neither_the_loop_nor_the_group(
    tmp_path,
):
    """A cut-off leader stores entries that never commit; the other two elect a new
    leader and commit others. When the old leader rejoins, it durably truncates its
    conflicting suffix (index, data and directory fsyncs) through the slowed call, while
    group B is served; then it holds exactly the new leader's log."""

    async def main() -> None:
        b = CountingGroup(tmp_path / "b")
        a = CountingGroup(tmp_path / "a")
        slow = SlowDisk(lambda: b.delivered, lambda name: name == "CommitLog.store")
        a.disk_calls = {i: slow for i in (1, 2, 3)}
        async with trio.open_nursery() as n:
            await _start(b, n)
            await b.leader()
            await _start(a, n)
            old = await a.leader()
            await old.propose(b"committed")
            await a.wait(lambda: all(m.applied == [b"committed"] for m in a.machines.values()))
            a.cut.add(old.node_id)
            for k in range(3):  # stored by the old leader only; never committed
                n.start_soon(partial(_propose_ignoring_loss, old, f"lost{k}".encode()))
            await a.wait(lambda: log_of(old).last_index() >= core_of(old).commit + 3)
            new = await a.leader(exclude={old.node_id})
            for k in range(4):
                await new.propose(f"new{k}".encode())
            a.cut.clear()
            expected = [b"committed", *(f"new{k}".encode() for k in range(4))]
            await a.wait(lambda: a.machines[old.node_id].applied == expected)
            assert old.role == Role.FOLLOWER
            assert log_of(old).last_index() == log_of(new).last_index()
            n.cancel_scope.cancel()
        assert [name for name, _ in slow.calls] == ["CommitLog.store"]
        assert all(served for _, served in slow.calls), slow.calls

    trio.run(main)


async def _propose_ignoring_loss(rt: Any, data: bytes) -> None:
    try:
        await rt.propose(data)
    except Exception:  # noqa: BLE001 - the entry is meant to be lost
        pass



def test_a_slow_segment_deletion_after_a_snapshot_stalls_neither_the_loop_nor_the_group(
    tmp_path,
):
    """Retention: every replica of A snapshots and deletes the log segments below the
    retained index through the slowed call, while group B is served; the segments go
    and A keeps committing."""

    async def main() -> None:
        b = CountingGroup(tmp_path / "b")
        a: Group[BrokerState] = Group(tmp_path / "a", lambda: BrokerState("g"),
                                      restore=lambda d: BrokerState.restore("g", d),
                                      segment_size=SEG)
        slow = SlowDisk(lambda: b.delivered, lambda name: name.endswith(".delete_before"))
        a.disk_calls = {i: slow for i in (1, 2, 3)}
        now = int(time.time() * 1000)
        async with trio.open_nursery() as n:
            await _start(b, n)
            await b.leader()
            await _start(a, n)
            leader = await a.leader()
            await leader.propose(control_create_topic("t", 1, [0]), EntryType.CONTROL)
            for k in range(60):
                await leader.propose(batch(k, now - 100 * HOUR_MS))
            for k in range(60, 80):
                await leader.propose(batch(k, now))
            target = core_of(leader).commit
            await a.wait(lambda: all(s.applied_index >= target for s in a.machines.values()))
            policy = RetentionPolicy(retention_hours=72, disk_ratio=1.0, data_dir=tmp_path,
                                     usage=lambda: (0, 1))
            index = await retain_once(policy, leader, a.machines[leader.node_id])
            assert index is not None and index > 1
            await a.wait(lambda: all(log_of(rt).first_index() == index
                                     for rt in a.runtimes.values()))
            # (while its deletion held its log the leader sent no heartbeats: the group
            # may have elected another; what counts is that it commits)
            await (await a.leader()).propose(batch(80, now))
            n.cancel_scope.cancel()
        assert len(slow.calls) == 3
        assert all(served for _, served in slow.calls), slow.calls

    trio.run(main)
