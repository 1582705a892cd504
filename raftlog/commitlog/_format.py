"""Entry format: how one Raft entry is stored, sent to peers and checked.

Little-endian, 33-byte header then the body::

    magic u32 | total size u32 | term u64 | index u64 | type u8 | body crc32c u32 |
    header crc32c u32 (over the 29 bytes before it)

The body is stored byte-for-byte, and this frame is the one currency of an entry: a
leader builds it once when it proposes the entry (`EntryDraft`: the data written in
place, then the header and both CRCs), stores it, and sends those same bytes to its
followers (`encode_entry` hands back an entry's frame, see `raftlog.wire`); a follower
checks both CRCs once (`decode_entries`) and stores the frame as received
(`CommitLog.append` writes an entry's frame without computing its CRCs again).
`read_raw` serves stored frames to peers repairing a replica.
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
    "EntryDraft",
    "OutOfRange",
    "check_header",
    "check_stored",
    "decode_entries",
    "encode_entry",
    "split_stored",
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


def encode_entry(entry: Entry) -> bytes | memoryview:
    """The exact stored bytes of `entry` (header + body): what `read_raw` returns.

    An entry that carries its stored frame already (sealed by the leader that proposed
    it, or received from a peer and verified) is not encoded again.
    """
    if entry.frame is not None:
        return entry.frame
    return _header(entry.index, entry.term, int(entry.type), entry.data) + entry.data


class EntryDraft:
    """A new entry's stored frame, built in one buffer before the entry has an index.

    The proposer writes the entry's data straight into `data` (filling any slot it
    reserved there, such as a store timestamp), so the data is copied once; when the
    Raft core assigns index and term, `seal` writes the header in front and computes
    both CRCs -- the only time they are computed for this entry on the leader. From
    there the same bytes are stored, sent to followers and served.
    """

    __slots__ = ("_buf", "data")

    def __init__(self, size: int) -> None:
        if size < 0 or HEADER_SIZE + size > MAX_TOTAL:
            raise ValueError(f"an entry of {size} bytes does not fit the entry format")
        self._buf = bytearray(HEADER_SIZE + size)
        self.data = memoryview(self._buf)[HEADER_SIZE:]

    @classmethod
    def of(cls, data: bytes | bytearray | memoryview) -> EntryDraft:
        """A draft holding a copy of `data`."""
        draft = cls(len(data))
        draft.data[:] = data
        return draft

    def __len__(self) -> int:
        return len(self.data)

    def seal(self, index: int, term: int, type: EntryType) -> Entry:
        """The entry, with its header written and both CRCs computed (once)."""
        buf = self._buf
        head = HEAD.pack(MAGIC, len(buf), term, index, int(type), crc32c.crc32c(self.data))
        buf[: HEAD.size] = head
        U32.pack_into(buf, HEAD.size, crc32c.crc32c(head))
        frame = memoryview(buf).toreadonly()
        return Entry(index, term, type, frame[HEADER_SIZE:], frame=frame)


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
    """Entries from stored bytes (a peer's append, `read_raw` output), verifying both CRCs
    of each: the one check a received entry gets.

    Each entry keeps its stored frame and its data as views of `data` (copied once
    first unless it is immutable `bytes`), so storing it writes the bytes as received.
    Raises CorruptEntry (position relative to `data`) on the first bad entry.
    """
    mv = memoryview(data if isinstance(data, bytes) else bytes(data))
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
        frame = mv[off : off + size]
        out.append(Entry(index, term, TYPES[etype], body, frame=frame))
        off += size
    return out


def split_stored(data: bytes | memoryview, lo: int, hi: int) -> list[tuple[int, memoryview]]:
    """(index, stored bytes) of the consecutive entries [lo, hi) at the start of `data`
    (a peer's `read_raw` output), cut by their headers; stops at the first header that
    does not verify or holds another index. Bodies are not checked here: whoever writes
    an entry checks it whole (`CommitLog.repair`)."""
    mv = memoryview(data).cast("B")
    out: list[tuple[int, memoryview]] = []
    off, expect, n = 0, lo, len(mv)
    while expect < hi and n - off >= HEADER_SIZE:
        err, (_m, size, _term, index, _etype, _bcrc) = check_header(mv, off)
        if err or index != expect or off + size > n:
            break
        out.append((index, mv[off : off + size]))
        off += size
        expect += 1
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
