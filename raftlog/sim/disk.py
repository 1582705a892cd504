"""A simulated disk for one node: the Raft log, hard state and snapshot, and what is durable.

The log is a list of entries with a `durable_len` watermark: writes land above it and
only a (group-commit) fsync moves it. Truncating a conflicting suffix and saving the hard
state are durable at once, as the real CommitLog fsyncs both before it answers. A crash
keeps the durable prefix and, for a torn tail, the intact entries from the start of the
unsynced region up to the tear: exactly what CRC-checked recovery of a torn tail yields.

Snapshots (what `raftlog.runtime` keeps in `<group dir>/snapshot`): saving one is atomic
and durable. `compact` then drops the durable prefix it covers, the way retention deletes
segments, and `reset_to` discards the whole log when a snapshot from the leader is
installed, as `CommitLog.reset_to` does. The list keeps its shape: slot `i - 1` still
stands for index `i`, holding None once the entry is gone, and `base` names the entry
before the first one held. `wipe` is a replaced disk: log and snapshot lost, hard state
kept (see `raftlog.sim.nemesis` for why that is the fault modelled).

Corruption (`corrupt_entry`): a held entry whose bytes no longer pass their checks while
its index and term are still known, as the CommitLog keeps one. Reading it raises
`EntryUnreadable` (a read that starts before it stops there) until `repair` puts back a
peer's copy of the same entry.
"""

from __future__ import annotations

import random

from raftlog.types import Entry, EntryUnreadable, HardState, Snapshot

__all__ = ["ENTRY_OVERHEAD", "SimStore"]

ENTRY_OVERHEAD = 32  # bytes of header per entry, for append batching limits


class SimStore:
    """Implements `raftlog.types.LogStore` over memory, with explicit durability."""

    __slots__ = (
        "log",
        "durable_len",
        "hard_state",
        "_sync_target",
        "writes",
        "truncations",
        "base",
        "snapshot",
        "corrupt",
        "verify",
    )

    def __init__(self, hard_state: HardState) -> None:
        self.log: list[Entry | None] = []  # None: dropped by compaction or a reset
        self.durable_len = 0
        self.hard_state = hard_state
        self._sync_target: int | None = None  # length an in-flight fsync will make durable
        self.writes = 0
        self.truncations = 0
        self.base = (0, 0)  # (index, term) of the entry before the first one held
        self.snapshot: Snapshot | None = None
        self.corrupt: set[int] = set()  # held entries that cannot be read
        self.verify = True  # False: the `serve-corrupt` mutation, a store skipping its checks

    # ------------------------------------------------------------------ LogStore

    def first_index(self) -> int:
        return self.base[0] + 1

    def last_index(self) -> int:
        return len(self.log)

    def term(self, index: int) -> int:
        if index == self.base[0]:
            return self.base[1]
        if not self.base[0] < index <= len(self.log):
            raise IndexError(f"term({index}) outside the log [{self.base[0]}, {len(self.log)}]")
        return self.log[index - 1].term  # type: ignore[union-attr]

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if not self.base[0] < lo <= hi <= len(self.log) + 1:
            raise IndexError(
                f"entries({lo}, {hi}) outside the log [{self.base[0] + 1}, {len(self.log)}]"
            )
        if self.corrupt and self.verify:
            if lo in self.corrupt:
                raise EntryUnreadable(lo, "corrupt on the simulated disk")
            hi = min([hi, *(i for i in self.corrupt if i > lo)])
        out: list[Entry] = []
        size = 0
        for e in self.log[lo - 1 : hi - 1]:
            assert e is not None
            size += len(e.data) + ENTRY_OVERHEAD
            if out and size > max_bytes:
                break
            out.append(e)
        return out

    def entry(self, index: int) -> Entry | None:
        """The entry held at `index` (None if absent or dropped)."""
        return self.log[index - 1] if 0 < index <= len(self.log) else None

    def readable(self, index: int) -> Entry | None:
        """The entry at `index` as a peer repairing its copy could fetch it (None if
        absent, dropped or corrupt here too)."""
        return None if index in self.corrupt else self.entry(index)

    # ------------------------------------------------------------------ corruption

    def corrupt_entry(self, index: int) -> bool:
        """Damage the held entry `index` (its index and term stay known). Returns
        whether there was one to damage."""
        if self.entry(index) is None:
            return False
        self.corrupt.add(index)
        return True

    def repair(self, index: int, entry: Entry) -> bool:
        """Overwrite corrupt entry `index` with a peer's copy of it; refused (False) unless
        it is the same entry (index and term), as `CommitLog.repair` refuses."""
        held = self.entry(index)
        if index not in self.corrupt or held is None or (entry.index, entry.term) != (
            held.index,
            held.term,
        ):
            return False
        self.log[index - 1] = entry
        self.corrupt.discard(index)
        return True

    # ------------------------------------------------------------------ writes

    def append(self, entries: list[Entry]) -> bool:
        """Write entries (truncating a conflicting suffix first). Returns whether it truncated."""
        first = entries[0].index
        log = self.log
        truncated = first <= len(log)
        if truncated:
            if first <= self.base[0]:
                raise ValueError(f"append at {first} into the dropped prefix (base {self.base})")
            del log[first - 1 :]
            self.corrupt = {i for i in self.corrupt if i < first}
            self.truncations += 1
            if self.durable_len > first - 1:
                self.durable_len = first - 1
            if self._sync_target is not None and self._sync_target > first - 1:
                self._sync_target = first - 1  # the fsync no longer covers what it started on
        elif first != len(log) + 1:
            raise ValueError(f"append at {first} leaves a gap after {len(log)}")
        log.extend(entries)
        self.writes += 1
        return truncated

    def save_hard_state(self, hs: HardState) -> None:
        self.hard_state = hs  # atomic and durable at once (write temp, fsync, rename)

    def save_snapshot(self, snap: Snapshot) -> None:
        self.snapshot = snap  # atomic and durable at once, as `raftlog.snapshot` writes it

    def compact(self, index: int) -> None:
        """Drop entries up to `index` (durable, and covered by the saved snapshot)."""
        snap = self.snapshot
        if snap is None or index > snap.index or index > self.durable_len:
            raise ValueError(f"compact({index}) past the snapshot or the durable prefix")
        if index <= self.base[0]:
            return
        base_term = self.term(index)
        for i in range(self.base[0], index):
            self.log[i] = None
        self.base = (index, base_term)
        self.corrupt = {i for i in self.corrupt if i > index}

    def reset_to(self, index: int, term: int) -> None:
        """Discard every entry; the log restarts after `index` (of `term`). Durable."""
        self.log = [None] * index
        self.durable_len = index
        self.base = (index, term)
        self._sync_target = None
        self.corrupt = set()

    def wipe(self) -> None:
        """A replaced disk: log and snapshot are gone, the hard state survives."""
        self.log = []
        self.durable_len = 0
        self.base = (0, 0)
        self.snapshot = None
        self._sync_target = None
        self.corrupt = set()

    # ------------------------------------------------------------------ durability

    @property
    def unsynced(self) -> int:
        return len(self.log) - self.durable_len

    @property
    def syncing(self) -> bool:
        return self._sync_target is not None

    def begin_sync(self) -> None:
        """Start a group-commit fsync: it covers everything written before this moment."""
        self._sync_target = len(self.log)

    def finish_sync(self) -> int:
        """The fsync completed; returns the new durable length."""
        if self._sync_target is not None and self._sync_target > self.durable_len:
            self.durable_len = self._sync_target
        self._sync_target = None
        return self.durable_len

    def crash(self, rng: random.Random | None = None) -> int:
        """Lose unsynced writes; with `rng`, a torn tail keeps a random intact prefix of
        them. Returns how many entries were lost."""
        keep = self.durable_len
        if rng is not None and self.unsynced:
            keep += rng.randint(0, self.unsynced)
        lost = len(self.log) - keep
        del self.log[keep:]
        self.corrupt = {i for i in self.corrupt if i <= keep}
        self.durable_len = keep
        self._sync_target = None
        return lost

    def durable_term(self, index: int) -> int | None:
        """Term of a durable entry, or None when `index` is not durable (or dropped)."""
        if 0 < index <= self.durable_len:
            e = self.log[index - 1]
            return e.term if e is not None else (self.base[1] if index == self.base[0] else None)
        return None
