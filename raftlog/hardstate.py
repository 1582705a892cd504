"""Atomic, checksummed persistence of `raftlog.types.HardState` (term, vote, configs).

A vote must survive a crash before it is answered, and a half-written file must never be
mistaken for a vote, so a save is: write a temp file, fsync it, rename it over the old
one, fsync the directory. The rename is atomic, so a reader sees the old or the new state
and never a mix.

File format (little-endian)::

    magic b"RMHS" | version u16 | reserved u16 | payload length u32 | payload |
    crc32c u32 over everything before it

    payload = msgpack {"t": term, "v": vote or nil, "c": [[index, term, voters, learners], ...]}

A missing file is a fresh node (``HardState()``); a present but unreadable one raises
`CorruptHardState` -- silently starting over would let the node vote twice in a term.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import msgpack

from raftlog.fsutil import CorruptFile, atomic_write, seal, unseal
from raftlog.types import HardState, Membership

__all__ = [
    "CorruptHardState",
    "HardStateFile",
    "decode_hardstate",
    "encode_hardstate",
    "load_hardstate",
    "save_hardstate",
]

_MAGIC = b"RMHS"
_VERSION = 1
_HEAD = struct.Struct("<4sHHI")


class CorruptHardState(CorruptFile):
    """The hard-state file exists but cannot be trusted (torn, garbled, wrong format)."""

    what = "hard state"


def encode_hardstate(hs: HardState) -> bytes:
    """The full file contents for `hs` (header, msgpack payload, CRC trailer)."""
    payload = msgpack.packb(
        {
            "t": hs.term,
            "v": hs.vote,
            "c": [
                [index, term, sorted(m.voters), sorted(m.learners)] for index, term, m in hs.configs
            ],
        }
    )
    return b"".join(seal(_HEAD, _MAGIC, _VERSION, payload=payload))


def decode_hardstate(data: bytes, path: str = "<bytes>") -> HardState:
    """Parse and verify file contents; raises CorruptHardState on any inconsistency."""
    _, payload = unseal(data, path, _HEAD, _MAGIC, _VERSION, CorruptHardState)
    try:
        d: Any = msgpack.unpackb(payload)
        term, vote = d["t"], d["v"]
        if not isinstance(term, int) or term < 0:
            raise ValueError(f"bad term {term!r}")
        if vote is not None and not isinstance(vote, int):
            raise ValueError(f"bad vote {vote!r}")
        configs = tuple(
            (int(index), int(cterm), Membership(frozenset(voters), frozenset(learners)))
            for index, cterm, voters, learners in d["c"]
        )
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        raise CorruptHardState(path, f"bad payload: {exc}") from exc
    return HardState(term=term, vote=vote, configs=configs)


def save_hardstate(path: str | os.PathLike[str], hs: HardState) -> None:
    """Durably replace the file at `path` with `hs` (temp, fsync, rename, fsync dir)."""
    atomic_write(path, encode_hardstate(hs))


def load_hardstate(path: str | os.PathLike[str]) -> HardState:
    """The saved state, or ``HardState()`` if none was ever saved."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return HardState()
    return decode_hardstate(data, path)


class HardStateFile:
    """A node's (or group's) hard-state file; skips rewriting an unchanged state."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._saved: HardState | None = None

    def load(self) -> HardState:
        """Read the state (``HardState()`` when absent); raises CorruptHardState."""
        hs = load_hardstate(self.path)
        self._saved = hs
        return hs

    def save(self, hs: HardState) -> None:
        """Persist `hs` durably before the caller answers any vote that depends on it."""
        if hs == self._saved:
            return
        save_hardstate(self.path, hs)
        self._saved = hs
