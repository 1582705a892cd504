"""The Ready sequence, written once for every shell that drives a `RaftNode`.

The trio runtime (`raftlog.runtime`), the deterministic simulator (`raftlog.sim`) and
the scripted test harness each carry out the core's `Ready` bundles against their own
disk, network and state machine. The order in which they must do so (`raftlog.types`)
lives here only, so the three cannot drift apart: what the simulator checks is what the
runtime does.

A shell implements `Shell`. Every step is synchronous; a step that takes long on a real
disk starts the work and reports back to the core later (`install_snapshot`: the core
hears `snapshot_installed` when it is done; storing entries: the core hears `persisted`
after an fsync). Until then the core hands out nothing that depends on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from raftlog.types import Entry, HardState, Message, ReadState, Ready, Snapshot

__all__ = ["Core", "Shell", "carry_out", "drain"]


class Shell(Protocol):
    """What a shell does with each part of a `Ready`, called in the order listed."""

    def save_hard_state(self, hs: HardState) -> None:
        """Persist atomically and durably; no message of this Ready leaves before."""
        ...

    def install_snapshot(self, snap: Snapshot) -> None:
        """Start installing a leader's snapshot (restore, save, reset the log), then call
        `snapshot_installed` on the core, now or later."""
        ...

    def store_entries(self, entries: list[Entry]) -> None:
        """Append (replacing any suffix from `entries[0].index`); durability may lag."""
        ...

    def send_message(self, m: Message) -> None: ...

    def apply_entries(self, entries: list[Entry]) -> None:
        """Committed entries, in order."""
        ...

    def answer_read(self, read: ReadState) -> None: ...

    def fetch_for_repair(self, indexes: list[int]) -> None:
        """Entries the core found unreadable: fetch a peer's copy of each, then call
        `entry_repaired` on the core."""
        ...


class Core(Protocol):
    def ready(self) -> Ready: ...


def carry_out(rd: Ready, shell: Shell) -> None:
    """Do what one Ready asks, in the order `raftlog.types` prescribes."""
    if rd.hard_state is not None:
        shell.save_hard_state(rd.hard_state)
    if rd.snapshot is not None:
        shell.install_snapshot(rd.snapshot)
    if rd.entries:
        shell.store_entries(rd.entries)
    for m in rd.messages:
        shell.send_message(m)
    if rd.apply:
        shell.apply_entries(rd.apply)
    for r in rd.reads:
        shell.answer_read(r)
    if rd.repair:
        shell.fetch_for_repair(rd.repair)


def drain(core: Core, shell: Shell, *, alive: Callable[[], bool] | None = None) -> int:
    """Carry out Readies until the core has nothing more (or `alive()` turns false, e.g.
    the shell's process was killed by one of its steps). Returns how many were done."""
    n = 0
    while alive is None or alive():
        rd = core.ready()
        if not rd:
            break
        carry_out(rd, shell)
        n += 1
    return n
