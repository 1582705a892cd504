"""File helpers shared by the CommitLog, the hard-state file and the snapshot file.

Durability: `fsync_dir` and `atomic_write` (temp file, fsync, rename, fsync directory).

The checksummed envelope of the small state files (little-endian)::

    magic 4 bytes | version u16 | reserved u16 | fields... | payload length | payload |
    crc32c u32 over everything before it

`seal` builds one from a header `struct.Struct` whose last field is the payload length;
`unseal` verifies one and hands back the fields between reserved and length, and the
payload, or raises a `CorruptFile` subclass naming the file.
"""

from __future__ import annotations

import os
import struct

import crc32c

__all__ = ["CorruptFile", "atomic_write", "fsync_dir", "seal", "unseal"]

_CRC = struct.Struct("<I")


class CorruptFile(Exception):
    """A file exists but cannot be trusted (torn, garbled, wrong format)."""

    what = "file"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"corrupt {self.what} {path}: {reason}")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (new, renamed or removed files) durable.

    A rename or file creation is not durable until its directory is fsynced.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], *chunks: bytes) -> None:
    """Durably replace the file at `path` with `chunks`, one after another.

    Write a temp file, fsync it, rename it over the old one, fsync the directory: a
    reader sees the old or the new contents, never a mix, and a crash mid-write leaves
    the old file untouched.
    """
    path = os.fspath(path)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def seal(
    head: struct.Struct, magic: bytes, version: int, *fields: int, payload: bytes
) -> tuple[bytes, bytes, bytes]:
    """The envelope around `payload` as (header, payload, CRC trailer)."""
    header = head.pack(magic, version, 0, *fields, len(payload))
    return header, payload, _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(header)))


def unseal(
    data: bytes,
    path: str,
    head: struct.Struct,
    magic: bytes,
    version: int,
    corrupt: type[CorruptFile],
) -> tuple[tuple[int, ...], bytes]:
    """Verify the envelope read from `path`; return (the header fields between reserved
    and length, payload). Raises ``corrupt`` for a short, foreign, torn or garbled one."""
    if len(data) < head.size + _CRC.size:
        raise corrupt(path, f"file too short ({len(data)} bytes)")
    got_magic, got_version, _reserved, *fields, length = head.unpack_from(data, 0)
    if got_magic != magic:
        raise corrupt(path, f"bad magic {got_magic!r}")
    if len(data) != head.size + length + _CRC.size:
        raise corrupt(path, f"length {len(data)} does not match header ({length})")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if crc32c.crc32c(data[: -_CRC.size]) != crc:
        raise corrupt(path, "CRC mismatch")
    if got_version != version:
        raise corrupt(path, f"unsupported version {got_version}")
    return tuple(fields), data[head.size : -_CRC.size]
