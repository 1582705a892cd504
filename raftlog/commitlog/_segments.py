"""Segments: the data files of a log and the byte-level I/O on them.

A *position* is a global byte offset into the concatenation of all segments. It addresses
an entry for its whole life (message ids are group + position). Segments are named by the
position of their first byte (20 digits) and hold a contiguous run of entries; a
segment's data ends at its file size. An entry never spans segments: when the next entry
does not fit in what is left of ``segment_size``, a new segment is started at the current
end position, so no padding and no end-of-segment marker are needed and the byte stream
stays contiguous across files. An entry larger than ``segment_size`` gets a segment of its
own. Position -> segment is a ``bisect`` over start positions.

`_Segments` is the lowest layer of `CommitLog`: the segment table, the cache of open
descriptors, and writing and reading runs of bytes.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from raftlog.commitlog._format import CommitLogError, CorruptEntry

__all__ = ["SegmentInfo"]

SEGMENT_NAME_LEN = 20
SCAN_CHUNK = 4 << 20  # bytes per read when walking data
_COPY_CHUNK = 8 << 20
_MAX_OPEN_FDS = 32

try:
    _IOV_MAX = os.sysconf("SC_IOV_MAX")
except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
    _IOV_MAX = 1024
if _IOV_MAX <= 0:  # pragma: no cover
    _IOV_MAX = 1024


class SegmentInfo(NamedTuple):
    """One segment as a retention policy sees it (`last_index < first_index` if empty)."""

    first_index: int
    last_index: int
    size: int  # bytes
    start: int  # position of its first byte
    path: str


def segment_name(start: int) -> str:
    return f"{start:0{SEGMENT_NAME_LEN}d}"


def pwritev_all(fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int) -> None:
    """Write all `buffers` at `offset` with as few syscalls as possible (no joining copy)."""
    parts = list(buffers)
    while parts:
        chunk = parts[:_IOV_MAX]
        n = os.pwritev(fd, chunk, offset)
        if n <= 0:
            raise CommitLogError(f"pwritev wrote {n} bytes")
        offset += n
        i = 0
        while i < len(chunk) and n >= len(chunk[i]):
            n -= len(chunk[i])
            i += 1
        parts = parts[i:]
        if n:
            parts[0] = memoryview(parts[0])[n:]


def pread_exact(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) == n or n == 0:
        return data
    chunks = [data]
    got = len(data)
    while got < n:
        more = os.pread(fd, n - got, offset + got)
        if not more:
            break
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


def copy_range(src: int, dst: int, offset: int, n: int) -> None:
    """Copy `n` bytes of `src` from `offset` to the start of `dst` (in-kernel if possible)."""
    copy = getattr(os, "copy_file_range", None)
    out = 0
    while out < n:
        want = min(_COPY_CHUNK, n - out)
        if copy is not None:
            try:
                got = copy(src, dst, want, offset + out, out)
            except OSError:
                copy = None  # e.g. not supported by this file system: copy by hand
            else:
                if got <= 0:
                    raise CommitLogError(f"index file ended {n - out} bytes early")
                out += got
                continue
        data = pread_exact(src, want, offset + out)
        if len(data) != want:
            raise CommitLogError(f"index file ended {n - out - len(data)} bytes early")
        pwritev_all(dst, [data], out)
        out += want


# --------------------------------------------------------------------------- scanning


class Window:
    """Sequential reads over one segment with few syscalls (used by recovery)."""

    __slots__ = ("fd", "start", "end", "ws", "buf")

    def __init__(self, fd: int, start: int, size: int) -> None:
        self.fd = fd
        self.start = start
        self.end = start + size
        self.ws = start
        self.buf = memoryview(b"")

    def get(self, pos: int, n: int, readahead: int) -> memoryview | None:
        if pos + n > self.end:
            return None
        rel = pos - self.ws
        if rel >= 0 and rel + n <= len(self.buf):
            return self.buf[rel : rel + n]
        want = min(max(n, readahead), self.end - pos)
        self.buf = memoryview(pread_exact(self.fd, want, pos - self.start))
        self.ws = pos
        if len(self.buf) < n:
            return None
        return self.buf[:n]


class _Segments:
    """The segment table and its descriptors; writes and reads runs of bytes."""

    path: str
    dir: str
    segment_size: int
    _closed: bool
    _starts: list[int]  # start position of each segment, ascending
    _sizes: list[int]  # bytes of data in each segment
    _fds: dict[int, int]  # segment start -> fd (insertion order ~ LRU)
    _dirty: set[int]  # segment starts written since the last fsync
    _dir_dirty: bool
    _end: int  # position after the last entry

    def __init__(self, path: str, segment_size: int) -> None:
        self.path = path
        self.dir = os.path.join(path, "commitlog")
        self.segment_size = segment_size
        self._closed = False
        self._starts = []
        self._sizes = []
        self._fds = {}
        self._dirty = set()
        self._dir_dirty = False
        self._end = 0

    def _close_fds(self) -> None:
        """Mark the log closed and release every descriptor (extended by later layers)."""
        self._closed = True
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise CommitLogError(f"commit log {self.dir} is closed")

    def _seg_path(self, k: int) -> str:
        return os.path.join(self.dir, segment_name(self._starts[k]))

    def _fd(self, k: int) -> int:
        start = self._starts[k]
        fd = self._fds.get(start)
        if fd is None:
            fd = os.open(self._seg_path(k), os.O_RDWR)
            self._fds[start] = fd
            self._evict_fds(keep=start)
        return fd

    def _drop_fd(self, start: int) -> None:
        fd = self._fds.pop(start, None)
        if fd is not None:
            os.close(fd)

    def _evict_fds(self, keep: int = -1) -> None:
        """Close clean read fds beyond the cap (never the active or a dirty segment)."""
        if len(self._fds) <= _MAX_OPEN_FDS:
            return
        active = self._starts[-1]
        for start in list(self._fds):
            if len(self._fds) <= _MAX_OPEN_FDS:
                break
            if start != active and start != keep and start not in self._dirty:
                os.close(self._fds.pop(start))

    def _write_groups(self, groups: list[tuple[int | None, list[bytes | memoryview]]]) -> None:
        """Write planned runs of bytes: the first continues the active segment, each later
        one starts a new segment at its position. Undone on failure."""
        old_end, old_nseg = self._end, len(self._starts)
        try:
            for start, parts in groups:
                if start is not None:
                    self._roll(start)
                if parts:
                    self._write_segment(self._starts[-1], parts, self._end)
        except BaseException:
            self._undo_write(old_end, old_nseg)
            raise

    def _write_segment(self, seg: int, parts: list[bytes | memoryview], pos: int) -> None:
        fd = self._fd(len(self._starts) - 1)
        pwritev_all(fd, parts, pos - seg)
        written = sum(len(p) for p in parts)
        self._sizes[-1] = pos - seg + written
        self._end = pos + written
        self._dirty.add(seg)

    def _roll(self, pos: int) -> None:
        """Start a new segment at `pos` (the current end); the old one stays dirty."""
        name = os.path.join(self.dir, segment_name(pos))
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._starts.append(pos)
        self._sizes.append(0)
        self._fds[pos] = fd
        self._dirty.add(pos)
        self._dir_dirty = True
        self._evict_fds()

    def _undo_write(self, old_end: int, old_nseg: int) -> None:
        """Best-effort rollback of a failed append so memory and files agree again."""
        try:
            while len(self._starts) > old_nseg:
                start = self._starts.pop()
                self._sizes.pop()
                self._drop_fd(start)
                self._dirty.discard(start)
                try:
                    os.unlink(os.path.join(self.dir, segment_name(start)))
                except FileNotFoundError:
                    pass
            k = len(self._starts) - 1
            os.ftruncate(self._fd(k), old_end - self._starts[k])
            self._sizes[k] = old_end - self._starts[k]
            self._end = old_end
        except OSError:
            pass

    def _read_span(self, start: int, end: int, strict: bool = True) -> Iterator[tuple[int, bytes]]:
        """Bytes [start, end) as one chunk per segment: (position, bytes).

        Bytes missing (a damaged segment shorter than its successor's start leaves a
        gap) raise CorruptEntry when `strict`, else are skipped: each chunk then says
        where its bytes belong."""
        k = bisect.bisect_right(self._starts, start) - 1
        while start < end:
            seg_end = self._starts[k] + self._sizes[k]
            n = min(end, seg_end) - start
            if n <= 0:
                # past this segment's end: go on if the next one starts right here
                if k + 1 >= len(self._starts) or start < self._starts[k + 1]:
                    if strict:
                        raise CorruptEntry(
                            self._seg_path(k), start, "data missing past segment end"
                        )
                    if k + 1 >= len(self._starts):
                        return
                    start = self._starts[k + 1]  # skip the gap
                k += 1
                continue
            data = pread_exact(self._fd(k), n, start - self._starts[k])
            if len(data) != n and strict:
                raise CorruptEntry(
                    self._seg_path(k), start + len(data), "segment shorter than expected"
                )
            if data:
                yield start, data
            start += n  # the check above moves on to the next segment, or stops at a gap

    def _locate(self, pos: int) -> int:
        """Segment holding the entry starting at `pos` (-1 if none)."""
        k = bisect.bisect_right(self._starts, pos) - 1
        while 0 <= k < len(self._starts) and pos >= self._starts[k] + self._sizes[k]:
            if k + 1 < len(self._starts) and self._starts[k + 1] == pos:
                k += 1
            else:
                return -1
        return k
