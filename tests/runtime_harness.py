"""Three replicas of group "g" as real GroupRuntimes in one process, each on its own
CommitLog under a temp directory, wired by an in-memory message bus and driven by real
timers. A stopped replica neither sends nor receives."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Generic, TypeVar

import trio

from raftlog.commitlog import CommitLog
from raftlog.core import RaftConfig, RaftNode
from raftlog.runtime import DiskCall, FetchRaw, GroupOptions, GroupRuntime, StateMachine
from raftlog.types import Message

__all__ = ["Group", "core_of", "log_of"]

M = TypeVar("M", bound=StateMachine)


class Group(Generic[M]):
    """Replicas 1, 2 and 3; `machine()` builds a fresh state machine for a start, and
    `restore(data)`, when given, rebuilds one from a snapshot."""

    def __init__(
        self,
        tmp: Path,
        machine: Callable[[], M],
        *,
        restore: Callable[[bytes], M] | None = None,
        preferred: int | None = None,
        node_dirs: bool = False,
        **opts: Any,
    ) -> None:
        self.tmp = tmp
        self.node_dirs = node_dirs  # replica i in n{i}/g, as a node keeps a group's data
        self.machine = machine
        self.restore = restore
        self.preferred = preferred
        self.opts = opts
        self.runtimes: dict[int, GroupRuntime] = {}
        self.machines: dict[int, M] = {}
        self.scopes: dict[int, trio.CancelScope] = {}
        self.down: set[int] = set()
        self.disk_calls: dict[int, DiskCall] = {}  # replica -> how its disk calls are made

    def send(self, _group: str, m: Message) -> None:
        rt = self.runtimes.get(m.dst)
        if rt is not None and rt.is_open and m.dst not in self.down and m.src not in self.down:
            rt.step(m)

    def fetcher(self, i: int) -> FetchRaw | None:
        """How replica i fetches a peer's stored entry for a repair (none by default)."""
        return None

    def _restorer(self, i: int) -> Callable[[bytes], M] | None:
        restore = self.restore
        if restore is None:
            return None

        def restored(data: bytes) -> M:
            self.machines[i] = restore(data)
            return self.machines[i]

        return restored

    async def start(self, nursery: trio.Nursery, i: int) -> None:
        self.machines[i] = self.machine()
        opts = GroupOptions(raft=RaftConfig(election_ticks=10, preferred_leader=self.preferred),
                            **self.opts)
        data = self.tmp / f"n{i}" / "g" if self.node_dirs else self.tmp / f"n{i}"
        rt = GroupRuntime("g", i, data, (1, 2, 3), self.machines[i], self.send,
                          opts, rng=random.Random(i), restore=self._restorer(i),
                          fetch_raw=self.fetcher(i), disk_call=self.disk_calls.get(i))
        rt.open()
        self.runtimes[i] = rt
        self.down.discard(i)

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                self.scopes[i] = scope
                task_status.started()
                async with trio.open_nursery() as inner:
                    inner.start_soon(rt.run)
                    while True:
                        await trio.sleep(0.01)
                        rt.tick()

        await nursery.start(run)

    def stop(self, i: int) -> None:
        self.down.add(i)
        self.scopes[i].cancel()

    async def stop_and_wait(self, i: int) -> None:
        """Stop replica `i` and wait until its runtime has closed its files."""
        self.stop(i)
        with trio.fail_after(5):
            while not self.runtimes[i].closed:
                await trio.sleep(0.01)

    async def leader(self, exclude: Collection[int] = frozenset()) -> GroupRuntime:
        with trio.fail_after(10):
            while True:
                for i, rt in self.runtimes.items():
                    if i not in self.down and i not in exclude and rt.is_leader:
                        return rt
                await trio.sleep(0.01)

    async def wait(self, cond: Callable[[], bool]) -> None:
        with trio.fail_after(10):
            while not cond():
                await trio.sleep(0.01)


def log_of(rt: GroupRuntime) -> CommitLog:
    """Test accessor: a replica's CommitLog, private to its runtime (the broker reads it
    through the runtime's door only)."""
    lg = rt._log
    assert lg is not None, "the runtime is not open"
    return lg


def core_of(rt: GroupRuntime) -> RaftNode:
    """Test accessor: a replica's Raft core, private to its runtime."""
    core = rt._core
    assert core is not None, "the runtime is not open"
    return core
