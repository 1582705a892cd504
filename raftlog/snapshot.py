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

import crc32c

from raftlog.fsutil import fsync_dir

__all__ = ["CorruptSnapshot", "Snapshot", "load_snapshot", "save_snapshot"]

_MAGIC = b"RMSN"
_VERSION = 1
_HEAD = struct.Struct("<4sHHQQQ")
_CRC = struct.Struct("<I")


class CorruptSnapshot(Exception):
    """The snapshot file exists but cannot be trusted."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"corrupt snapshot {path}: {reason}")


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
    path = os.fspath(path)
    head = _HEAD.pack(_MAGIC, _VERSION, 0, snap.index, snap.term, len(snap.data))
    crc = crc32c.crc32c(snap.data, crc32c.crc32c(head))
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for part in (head, snap.data, _CRC.pack(crc)):
            view = memoryview(part)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def load_snapshot(path: str | os.PathLike[str]) -> Snapshot | None:
    """The saved snapshot, None if there is none; raises CorruptSnapshot."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < _HEAD.size + _CRC.size:
        raise CorruptSnapshot(path, f"file too short ({len(data)} bytes)")
    magic, version, _reserved, index, term, length = _HEAD.unpack_from(data, 0)
    if magic != _MAGIC:
        raise CorruptSnapshot(path, f"bad magic {magic!r}")
    if len(data) != _HEAD.size + length + _CRC.size:
        raise CorruptSnapshot(path, f"length {len(data)} does not match header ({length})")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c.crc32c(data[: -_CRC.size]) != crc:
        raise CorruptSnapshot(path, "CRC mismatch")
    if version != _VERSION:
        raise CorruptSnapshot(path, f"unsupported version {version}")
    return Snapshot(index, term, data[_HEAD.size : -_CRC.size])
