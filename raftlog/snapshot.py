"""A group's state-machine snapshot file: what lets retention delete the log's prefix.

The file holds the state machine's own `snapshot()` bytes together with the Raft index
and term of the last entry they include. It must be durable *before* any entry it covers
is deleted, and a torn write must never replace a good snapshot, so a save is: write a
temp file, fsync it, rename it over the old one, fsync the directory (as for the hard
state).

File format (little-endian)::

    magic b"RMSN" | version u16 | reserved u16 | index u64 | term u64 | length u64 |
    state bytes | crc32c u32 over everything before it

A missing file means "no snapshot: replay the log from index 1"; a present but
unreadable one raises `CorruptSnapshot` -- starting from scratch over a log whose prefix
is gone would silently lose state.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from raftlog.fsutil import CorruptFile, atomic_write, seal, unseal

__all__ = ["CorruptSnapshot", "Snapshot", "load_snapshot", "save_snapshot"]

_MAGIC = b"RMSN"
_VERSION = 1
_HEAD = struct.Struct("<4sHHQQQ")


class CorruptSnapshot(CorruptFile):
    """The snapshot file exists but cannot be trusted."""

    what = "snapshot"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """State-machine bytes that include every entry up to `index` (of term `term`)."""

    index: int
    term: int
    data: bytes


def save_snapshot(path: str | os.PathLike[str], snap: Snapshot) -> None:
    """Durably replace the file at `path` (temp, fsync, rename, fsync dir).

    Blocking; fine in a worker thread (it touches only its own files).
    """
    atomic_write(path, *seal(_HEAD, _MAGIC, _VERSION, snap.index, snap.term, payload=snap.data))


def load_snapshot(path: str | os.PathLike[str]) -> Snapshot | None:
    """The saved snapshot, None if there is none; raises CorruptSnapshot."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    (index, term), state = unseal(data, path, _HEAD, _MAGIC, _VERSION, CorruptSnapshot)
    return Snapshot(index, term, state)
