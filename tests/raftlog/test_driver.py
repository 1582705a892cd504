"""The Ready sequence shared by the runtime, the simulator and the harness (raftlog.driver)."""

from __future__ import annotations

import trio

from raftlog.driver import carry_out, drain, drain_async
from raftlog.types import (
    Entry,
    EntryType,
    HardState,
    Membership,
    Message,
    MsgType,
    ReadState,
    Ready,
    Snapshot,
)


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def save_hard_state(self, hs: HardState) -> None:
        self.calls.append("hard_state")

    def install_snapshot(self, snap: Snapshot) -> None:
        self.calls.append("snapshot")

    def store_entries(self, entries: list[Entry]) -> None:
        self.calls.append("entries")

    def send_message(self, m: Message) -> None:
        self.calls.append(f"send {m.dst}")

    def apply_entries(self, entries: list[Entry]) -> None:
        self.calls.append("apply")

    def answer_read(self, read: ReadState) -> None:
        self.calls.append(f"read {read.id}")

    def fetch_for_repair(self, indexes: list[int]) -> None:
        self.calls.append(f"repair {indexes}")


def _full_ready() -> Ready:
    e = Entry(1, 1, EntryType.MESSAGES, b"x")
    return Ready(
        hard_state=HardState(1, 1),
        entries=[e],
        messages=[Message(MsgType.APPEND, 1, 2, 1), Message(MsgType.APPEND, 1, 3, 1)],
        apply=[e],
        reads=[ReadState(7, 1)],
        snapshot=Snapshot(0, 0, b"", Membership(frozenset({1}))),
        repair=[4],
    )


def test_each_part_of_a_ready_is_carried_out_in_the_prescribed_order() -> None:
    """raftlog.types: the hard state is durable before any message leaves; a snapshot is
    begun before entries are written; entries are written before messages are sent;
    then committed entries are applied and reads answered."""
    shell = _Recorder()
    carry_out(_full_ready(), shell)
    assert shell.calls == [
        "hard_state", "snapshot", "entries", "send 2", "send 3", "apply", "read 7", "repair [4]",
    ]


class _Core:
    def __init__(self, readies: list[Ready]) -> None:
        self.readies = readies

    def ready(self) -> Ready:
        return self.readies.pop(0) if self.readies else Ready()


def test_drain_runs_until_the_core_has_nothing_or_the_shell_died() -> None:
    shell = _Recorder()
    core = _Core([Ready(reads=[ReadState(1, 0)]), Ready(reads=[ReadState(2, 0)])])
    assert drain(core, shell) == 2 and shell.calls == ["read 1", "read 2"]
    core = _Core([Ready(reads=[ReadState(3, 0)]), Ready(reads=[ReadState(4, 0)])])
    shell = _Recorder()
    assert drain(core, shell, alive=lambda: not shell.calls) == 1
    assert core.readies  # the rest is left for the next incarnation


def test_drain_async_pauses_after_each_ready_that_applied_before_the_next() -> None:
    """The runtime applies in place, so `drain_async` hands the loop back (`pause`) after
    every Ready with committed entries that another Ready follows: other groups and the
    peers' messages are served between the batches of a long backlog, not after all of
    it. After the last Ready there is no pause (the runtime's next wait is one)."""
    e = Entry(1, 1, EntryType.MESSAGES, b"x")
    shell = _Recorder()
    core = _Core([Ready(apply=[e]), Ready(reads=[ReadState(1, 0)]), Ready(apply=[e])])

    async def offload(work: object) -> None:
        raise AssertionError("nothing blocking here")

    async def pause() -> None:
        shell.calls.append("pause")

    assert trio.run(drain_async, core, shell, offload, pause) == 3
    assert shell.calls == ["apply", "pause", "read 1", "apply"]
