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

The I/O seam: the two steps whose disk work the rest of the Ready must wait for (the
hard state is durable before any message leaves; a conflicting suffix is durably
truncated before new entries are written) may hand that work back instead of doing it,
as a `Blocking` call. `carry_out`/`drain` run it in place, the way the simulator and the
test harness want it (synchronous, deterministic); `carry_out_async`/`drain_async` await
it through an `Offload` the shell supplies (the trio runtime runs it in a worker thread,
so a slow disk stalls only its own group, not the event loop every group shares). Both
walk the same sequence (`_sequence`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

from raftlog.types import Entry, HardState, Message, ReadState, Ready, Snapshot

__all__ = [
    "Blocking",
    "Core",
    "Offload",
    "Shell",
    "carry_out",
    "carry_out_async",
    "drain",
    "drain_async",
]

#: Blocking disk work a step handed back; nothing later in the Ready runs before it returns.
Blocking = Callable[[], object]
#: How an async shell runs `Blocking` work (e.g. in a worker thread).
Offload = Callable[[Blocking], Awaitable[object]]


class Shell(Protocol):
    """What a shell does with each part of a `Ready`, called in the order listed."""

    def save_hard_state(self, hs: HardState) -> Blocking | None:
        """Persist atomically and durably; no message of this Ready leaves before. May
        return the blocking part instead of doing it (see the I/O seam above)."""
        ...

    def install_snapshot(self, snap: Snapshot) -> None:
        """Start installing a leader's snapshot (restore, save, reset the log), then call
        `snapshot_installed` on the core, now or later."""
        ...

    def store_entries(self, entries: list[Entry]) -> Blocking | None:
        """Append (replacing any suffix from `entries[0].index`); durability may lag. May
        return a blocking part (a durable truncation) that must finish before the rest
        of the Ready (see the I/O seam above)."""
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


def _sequence(rd: Ready, shell: Shell) -> Iterator[Blocking]:
    """The order `raftlog.types` prescribes; yields the blocking work a step handed back,
    which the caller finishes before resuming the sequence."""
    if rd.hard_state is not None:
        work = shell.save_hard_state(rd.hard_state)
        if work is not None:
            yield work
    if rd.snapshot is not None:
        shell.install_snapshot(rd.snapshot)
    if rd.entries:
        work = shell.store_entries(rd.entries)
        if work is not None:
            yield work
    for m in rd.messages:
        shell.send_message(m)
    if rd.apply:
        shell.apply_entries(rd.apply)
    for r in rd.reads:
        shell.answer_read(r)
    if rd.repair:
        shell.fetch_for_repair(rd.repair)


def carry_out(rd: Ready, shell: Shell) -> None:
    """Do what one Ready asks, in the order `raftlog.types` prescribes; blocking work a
    step hands back runs in place."""
    for work in _sequence(rd, shell):
        work()


async def carry_out_async(rd: Ready, shell: Shell, offload: Offload) -> None:
    """`carry_out`, awaiting blocking work through `offload`."""
    for work in _sequence(rd, shell):
        await offload(work)


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


async def drain_async(core: Core, shell: Shell, offload: Offload,
                      pause: Callable[[], Awaitable[None]] | None = None) -> int:
    """`drain` for a shell that offloads blocking work (the trio runtime). `pause` runs
    between a Ready that applied entries and the next Ready: applying runs in place, and
    a long backlog (a state rebuilt from the log, a follower far behind) must leave the
    rest of the process (ticks, peers, other groups) turns between its batches. After
    the last Ready it does not run: the caller's next wait lets the others run anyway,
    and one entry at a time would otherwise pay an extra turn of the event loop for it.
    (Nothing reaches the core during a pause, so a Ready taken before it is the one that
    would be taken after.)"""
    n = 0
    applied = False
    while True:
        rd = core.ready()
        if not rd:
            break
        if applied and pause is not None:
            await pause()
        await carry_out_async(rd, shell, offload)
        n += 1
        applied = bool(rd.apply)
    return n
