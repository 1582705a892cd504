"""The entries a group's state references that no replica could supply, kept on disk.

When a refill is abandoned (`raftlog.core`, "Refilling": every voter lost the entries
below a snapshot, e.g. a power loss of every node under ``fsync = "interval"``), those
messages are gone for good; reads of them answer OFFSET_TOO_SMALL. The runtime reports
the range (`GroupRuntime.refill_gap`, `raftmq status`, the
``raftmq_refill_lost_entries`` metric), and this file keeps it across restarts, so an
operator who restarts the node still learns that data was lost. It is written (temp,
fsync, rename, fsync dir) before the install that gives up on the entries, so a crash
can never hide a loss; it can at worst name one that a refill after the restart
supplied after all.

File format (little-endian), the checksummed envelope of `raftlog.fsutil`::

    magic b"RMRG" | version u16 = 1 | reserved u16 | first u64 | last u64 |
    payload length u32 (0) | crc32c u32
"""

from __future__ import annotations

import os
import struct

from raftlog.fsutil import CorruptFile, atomic_write, seal, unseal

__all__ = ["CorruptRefillGap", "load_refill_gap", "save_refill_gap"]

_MAGIC = b"RMRG"
_VERSION = 1
_HEAD = struct.Struct("<4sHHQQI")


class CorruptRefillGap(CorruptFile):
    """The refill-gap file exists but cannot be trusted."""

    what = "refill gap"


def save_refill_gap(path: str | os.PathLike[str], gap: tuple[int, int]) -> None:
    """Durably record that entries `gap` (first, last) are lost. Blocking."""
    first, last = gap
    if not 0 < first <= last:
        raise ValueError(f"refill gap {first}..{last} is not a range of entries")
    atomic_write(path, *seal(_HEAD, _MAGIC, _VERSION, first, last, payload=b""))


def load_refill_gap(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """The recorded gap, None if there is none; raises CorruptRefillGap."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    (first, last), payload = unseal(data, path, _HEAD, _MAGIC, _VERSION, CorruptRefillGap)
    if payload or not 0 < first <= last:
        raise CorruptRefillGap(path, f"bad range {first}..{last}")
    return first, last
