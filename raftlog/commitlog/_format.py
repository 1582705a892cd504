"""Entry format: how one Raft entry is stored, sent to peers and checked.

Little-endian, 33-byte header then the body::

    magic u32 | total size u32 | term u64 | index u64 | type u8 | body crc32c u32 |
    header crc32c u32 (over the 29 bytes before it)

The body is stored byte-for-byte. Peers exchange entries in exactly this format
(`encode_entry` on the leader, `decode_entries` checking both CRCs on the follower, see
`raftlog.wire`); `read_raw`/`append_raw` copy stored bytes without decoding, for repairing
a replica from a peer.
"""

from __future__ import annotations

import struct

import crc32c

from raftlog.types import Entry, EntryType

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "CommitLogError",
    "CorruptEntry",
    "CorruptIndex",
    "OutOfRange",
    "check_header",
    "check_stored",
    "decode_entries",
    "encode_entry",
]

MAGIC = 0x31514D52  # b"RMQ1" read as a little-endian u32
HEAD = struct.Struct("<IIQQBI")  # the part the header CRC covers (29 bytes)
_HEADER = struct.Struct("<IIQQBII")
HEADER_SIZE = _HEADER.size  # 33
U32 = struct.Struct("<I")
MAX_TOTAL = 0xFFFFFFFF
MAX_TYPE = max(EntryType)
TYPES = tuple(EntryType(t) for t in range(MAX_TYPE + 1))  # indexing beats EntryType(t)


class CommitLogError(Exception):
    """Any CommitLog failure that is not the caller's fault (I/O, broken files)."""


class CorruptEntry(CommitLogError):
    """A stored entry failed verification; it must be refetched, never served."""

    def __init__(self, path: str, position: int, reason: str, index: int | None = None) -> None:
        self.path = path
        self.position = position
        self.reason = reason
        self.index = index
        where = f"{path} at position {position}"
        what = f"entry {index}" if index is not None else "entry"
        super().__init__(f"corrupt {what} in {where}: {reason}")


class CorruptIndex(CommitLogError):
    """An index record failed its CRC after open; reopening rebuilds the index."""


class OutOfRange(CommitLogError, IndexError):
    """A Raft index or position outside what the log holds (an IndexError too)."""


def _header(index: int, term: int, etype: int, body: bytes | memoryview) -> bytes:
    size = HEADER_SIZE + len(body)
    if size > MAX_TOTAL:
        raise ValueError(f"entry {index} is too large ({size} bytes)")
    head = HEAD.pack(MAGIC, size, term, index, etype, crc32c.crc32c(body))
    return head + U32.pack(crc32c.crc32c(head))


def encode_entry(entry: Entry) -> bytes:
    """The exact stored bytes of `entry` (header + body): what `read_raw` returns."""
    return _header(entry.index, entry.term, int(entry.type), entry.data) + entry.data


def check_header(
    buf: memoryview, off: int
) -> tuple[str | None, tuple[int, int, int, int, int, int]]:
    """Parse a header; (error or None, (magic, size, term, index, type, body_crc))."""
    magic, size, term, index, etype, bcrc, hcrc = _HEADER.unpack_from(buf, off)
    fields = (magic, size, term, index, etype, bcrc)
    if magic != MAGIC:
        return f"bad magic {magic:#010x}", fields
    if crc32c.crc32c(buf[off : off + HEAD.size]) != hcrc:
        return "header CRC mismatch", fields
    if size < HEADER_SIZE:
        return f"total size {size} smaller than a header", fields
    if etype > MAX_TYPE:
        return f"unknown entry type {etype}", fields
    return None, fields


def decode_entries(data: bytes | memoryview, *, source: str = "<buffer>") -> list[Entry]:
    """Entries from stored bytes (e.g. `read_raw` output), verifying both CRCs of each.

    Raises CorruptEntry (position relative to `data`) on the first bad entry.
    """
    mv = memoryview(data).cast("B")
    out: list[Entry] = []
    off = 0
    n = len(mv)
    while off < n:
        if n - off < HEADER_SIZE:
            raise CorruptEntry(source, off, "truncated header")
        err, (_m, size, term, index, etype, bcrc) = check_header(mv, off)
        if err:
            raise CorruptEntry(source, off, err)
        if off + size > n:
            raise CorruptEntry(source, off, "truncated body", index)
        body = mv[off + HEADER_SIZE : off + size]
        if crc32c.crc32c(body) != bcrc:
            raise CorruptEntry(source, off, "body CRC mismatch", index)
        out.append(Entry(index, term, TYPES[etype], bytes(body)))
        off += size
    return out


def check_stored(
    mv: memoryview, off: int, index: int, term: int, size: int, etype: int
) -> str | None:
    """Why the entry at `off` in `mv` is not entry `index` as its index record describes
    it, intact (None if it is)."""
    if off + HEADER_SIZE > len(mv):
        return "missing data"
    err, (_m, hsize, hterm, hindex, htype, bcrc) = check_header(mv, off)
    if err:
        return err
    if (hindex, hterm, hsize, htype) != (index, term, size, etype):
        return "header does not match the index record"
    if off + size > len(mv):
        return "missing data"
    if crc32c.crc32c(mv[off + HEADER_SIZE : off + size]) != bcrc:
        return "body CRC mismatch"
    return None
