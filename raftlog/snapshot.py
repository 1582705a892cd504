"""A group's state-machine snapshot file: what lets retention delete the log's prefix,
what a restart restores instead of replaying the whole log, and what a leader sends to a
follower that lacks entries it no longer holds.

The file holds the state machine's own `snapshot()` bytes together with the Raft index
and term of the last entry they include and the membership in force at that index. It
must be durable *before* any entry it covers is deleted, and a torn write must never
replace a good snapshot, so a save is: write a temp file, fsync it, rename it over the
old one, fsync the directory (as for the hard state).

File format (little-endian)::

    magic b"RMSN" | version u16 = 3 | reserved u16 | index u64 | term u64 | flags u32 |
    base index u64 | base term u64 | membership length u32 | length u64 |
    membership (`Membership.encode`) | state bytes | crc32c u32 over everything before it

    where `length` counts membership and state bytes, and flag bit 0 says the base
    fields hold `Snapshot.base` (a snapshot installed from a leader; else both are 0 and
    the base is None). Version 2 files (no flags, no base) and version 1 files (no
    membership either) are still read; their base and membership are None.

A missing file means "no snapshot: replay the log from index 1"; a present but
unreadable one raises `CorruptSnapshot` -- starting from scratch over a log whose prefix
is gone would silently lose state.
"""

from __future__ import annotations

import os
import struct

from raftlog.fsutil import CorruptFile, atomic_write, seal, unseal
from raftlog.types import Membership, Snapshot

__all__ = ["CorruptSnapshot", "Snapshot", "SnapshotSkipped", "load_snapshot", "save_snapshot"]


class SnapshotSkipped(OSError):
    """This snapshot cannot be written and need not be: the state it would save moved on
    meanwhile (the state machine raises a subclass), and the next snapshot covers it.
    Routine, unlike a failed write."""


_MAGIC = b"RMSN"
_VERSION = 3
_HEAD = struct.Struct("<4sHHQQIQQIQ")
_HEAD_V2 = struct.Struct("<4sHHQQIQ")
_HEAD_V1 = struct.Struct("<4sHHQQQ")
_HAS_BASE = 1
_VERSION_AT = struct.Struct("<H")


class CorruptSnapshot(CorruptFile):
    """The snapshot file exists but cannot be trusted."""

    what = "snapshot"


def save_snapshot(path: str | os.PathLike[str], snap: Snapshot) -> None:
    """Durably replace the file at `path` (temp, fsync, rename, fsync dir).

    Blocking; fine in a worker thread (it touches only its own files).
    """
    members = snap.membership.encode() if snap.membership is not None else b""
    flags, (base, base_term) = (_HAS_BASE, snap.base) if snap.base is not None else (0, (0, 0))
    atomic_write(
        path,
        *seal(_HEAD, _MAGIC, _VERSION, snap.index, snap.term, flags, base, base_term,
              len(members), payload=members + snap.data),
    )


def load_snapshot(path: str | os.PathLike[str]) -> Snapshot | None:
    """The saved snapshot, None if there is none; raises CorruptSnapshot."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    version = _VERSION_AT.unpack_from(data, 4)[0] if len(data) >= 6 else _VERSION
    if version == 1:
        (index, term), state = unseal(data, path, _HEAD_V1, _MAGIC, 1, CorruptSnapshot)
        return Snapshot(index, term, state)
    base: tuple[int, int] | None = None
    if version == 2:
        (index, term, mlen), payload = unseal(data, path, _HEAD_V2, _MAGIC, 2, CorruptSnapshot)
    else:
        (index, term, flags, b, bt, mlen), payload = unseal(
            data, path, _HEAD, _MAGIC, _VERSION, CorruptSnapshot)
        if flags & ~_HAS_BASE:
            raise CorruptSnapshot(path, f"unknown flags {flags:#x}")
        if flags & _HAS_BASE:
            if b > index:
                raise CorruptSnapshot(path, f"base {b} beyond the snapshot's index {index}")
            base = (b, bt)
    if mlen > len(payload):
        raise CorruptSnapshot(path, f"membership of {mlen} bytes in a {len(payload)}-byte payload")
    membership = None
    if mlen:
        try:
            membership = Membership.decode(payload[:mlen])
        except Exception as exc:  # msgpack raises several unrelated types
            raise CorruptSnapshot(path, f"bad membership: {exc}") from exc
    return Snapshot(index, term, payload[mlen:], membership, base)
