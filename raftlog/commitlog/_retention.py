"""Retention and reset: dropping old segments, and restarting the log for a snapshot.

Retention (`delete_before`)
    Whole segments below a Raft index are deleted, never the active one and never past
    `durable_index`. Three durable steps, each of which a reopen can finish:

    1. write the base file (index and term of the entry just before the new first one;
       temp, fsync, rename, fsync dir). From here the entries up to it are gone
       logically, and `term(first_index() - 1)` is answered from it.
    2. write a new index whose records start at the new first index (temp, fsync,
       rename, fsync dir).
    3. unlink the old segments, fsync dir.

    `open` rolls an interrupted deletion forward: it unlinks leading segments wholly
    below the base (step 3) and, if the index still starts at the old first entry, drops
    its leading records (step 2). Positions are never reused: the first segment simply
    no longer starts at position 0.

Reset (`reset_to`, for installing a snapshot)
    Every entry goes and the log restarts after a given (index, term), in a fresh empty
    segment at the current end position (positions are still never reused):

    1. create that segment;
    2. write the base file, in its reset form that also names the segment's position
       (temp, fsync, rename, fsync dir: this also makes step 1 durable). This is the
       commit point: from here the old entries are gone;
    3. empty the index file, fsync it; unlink the old segments, fsync dir.

    `open` rolls an interrupted reset forward: segments below the position the base
    names are unlinked, and an index whose records point below it is rebuilt (as empty).
    A failure at or after step 2 closes the log (reopen to recover).
"""

from __future__ import annotations

import os
import struct

import crc32c

from raftlog.commitlog._format import U32, CommitLogError
from raftlog.commitlog._index import INDEX_RECORD_SIZE, _Index
from raftlog.commitlog._segments import SegmentInfo, segment_name
from raftlog.fsutil import atomic_write, fsync_dir, fsync_fd

BASE_NAME = "base"
_BASE_MAGIC = 0x42514D52  # b"RMQB" read as a little-endian u32
_BASE_HEAD = struct.Struct("<IQQ")  # magic, index, term; then a crc32c of these
_BASE = struct.Struct("<IQQI")
_RESET_MAGIC = 0x52514D52  # b"RMQR": a base written by reset_to
_RESET_HEAD = struct.Struct("<IQQQ")  # magic, index, term, start position; then a crc32c
_RESET = struct.Struct("<IQQQI")



class _Retention(_Index):
    """Deleting whole old segments and resetting the log, crash-safely via the base file."""

    def segment_bounds(self) -> list[SegmentInfo]:
        """Every segment, oldest first; the last one is the active segment.

        Costs a binary search over index records per segment (segments are few).
        """
        self._check_open()
        firsts = [self._first] + [self._first_index_at(s) for s in self._starts[1:]]
        out: list[SegmentInfo] = []
        for k, start in enumerate(self._starts):
            last = firsts[k + 1] - 1 if k + 1 < len(firsts) else self._last
            out.append(SegmentInfo(firsts[k], last, self._sizes[k], start, self._seg_path(k)))
        return out

    def delete_before(self, index: int) -> int:
        """Delete every whole segment whose entries all lie below `index`; returns the new
        `first_index()`.

        Never deletes the active segment or an entry past `durable_index()`. The caller
        must have made whatever the deleted entries fed (a state snapshot) durable first.
        Crash-safe in three steps (base file, index, unlink; see the module docstring).
        A failure before the new index is in place leaves the log usable as it was;
        one after it closes the log (reopen to recover).
        """
        self._check_open()
        limit = min(index, self._durable + 1)
        drop_segs = 0
        new_first = self._first
        for k in range(1, len(self._starts)):  # never the last (active) segment
            f = self._first_index_at(self._starts[k])
            if f > limit:
                break
            drop_segs, new_first = k, f
        if drop_segs == 0:
            return self._first
        base = (new_first - 1, self.term(new_first - 1))
        skip = new_first - self._first
        # 1. the base file: from here a reopen finishes the deletion
        self._write_base(*base)
        # 2. an index whose records start at the new first entry
        self._rewrite_index(skip, max(0, self._written - skip))
        self._written = max(0, self._written - skip)
        self._index_unsynced = 0
        self._first = new_first
        self._base = base
        if self._tail_first < new_first:
            del self._tail[: (new_first - self._tail_first) * INDEX_RECORD_SIZE]
            self._tail_first = new_first
        dead = self._starts[:drop_segs]
        del self._starts[:drop_segs]
        del self._sizes[:drop_segs]
        # 3. the data
        try:
            for start in dead:
                self._drop_fd(start)
                self._dirty.discard(start)
                os.unlink(os.path.join(self.dir, segment_name(start)))
            fsync_dir(self.dir)
        except OSError as exc:
            self._close_fds()
            raise CommitLogError(
                f"deleting segments in {self.dir} failed: {exc}; the log is closed, "
                "reopen it to finish"
            ) from exc
        return new_first

    def reset_to(self, index: int, term: int) -> None:
        """Discard every entry, durably, and restart the log after `index` (of term
        `term`): afterwards `first_index() == index + 1`, `last_index() == index` and
        `term(index) == term`. For installing a snapshot that covers up to `index`.

        Crash-safe (see "Reset" in the module docstring): a reopen sees the old log or
        the new empty one, never a mix. Any failure closes the log (reopen to recover).
        """
        self._check_open()
        if index < 0 or term < 0:
            raise ValueError(f"reset_to({index}, {term}): negative index or term")
        pos = self._end
        reuse = self._sizes[-1] == 0 and self._starts[-1] == pos  # already empty there
        created = None
        try:
            if not reuse:
                created = os.path.join(self.dir, segment_name(pos))
                os.close(os.open(created, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
            head = _RESET_HEAD.pack(_RESET_MAGIC, index, term, pos)
            atomic_write(os.path.join(self.dir, BASE_NAME), head, U32.pack(crc32c.crc32c(head)))
        except OSError as exc:
            self._close_fds()
            if created is not None:
                try:
                    os.unlink(created)
                except OSError:
                    pass
            raise CommitLogError(
                f"resetting {self.dir} failed: {exc}; the log is closed, reopen it to recover"
            ) from exc
        old = [s for s in self._starts if s != pos]
        try:
            os.ftruncate(self._ifd, 0)
            fsync_fd(self._ifd)
            for start in old:
                self._drop_fd(start)
                os.unlink(os.path.join(self.dir, segment_name(start)))
            fsync_dir(self.dir)
        except OSError as exc:
            self._close_fds()
            raise CommitLogError(
                f"resetting {self.dir} failed after its base was written: {exc}; the log is "
                "closed, reopen it to finish"
            ) from exc
        self._starts, self._sizes = [pos], [0]
        self._dirty.clear()
        self._dir_dirty = False
        self._first = index + 1
        self._base = (index, term)
        self._last, self._last_term = index, term
        self._end = pos
        self._durable = index
        self._written = 0
        self._index_unsynced = 0
        self._tail = bytearray()
        self._tail_first = index + 1
        self._generation += 1  # an fsync begun before now vouches for nothing after it

    def _read_base(self) -> tuple[int, int, int]:
        """(index, term, start position) from the base file; the position is 0 unless
        `reset_to` wrote it."""
        try:
            with open(os.path.join(self.dir, BASE_NAME), "rb") as f:
                raw = f.read(_RESET.size + 1)
        except FileNotFoundError:
            return (0, 0, 0)
        if len(raw) == _BASE.size:
            magic, index, term, crc = _BASE.unpack(raw)
            start, want_magic, head_size = 0, _BASE_MAGIC, _BASE_HEAD.size
        elif len(raw) == _RESET.size:
            magic, index, term, start, crc = _RESET.unpack(raw)
            want_magic, head_size = _RESET_MAGIC, _RESET_HEAD.size
        else:
            raise CommitLogError(f"{self.dir}/{BASE_NAME}: {len(raw)} bytes, not {_BASE.size}")
        if magic != want_magic or crc != crc32c.crc32c(raw[:head_size]):
            raise CommitLogError(f"{self.dir}/{BASE_NAME} is corrupt")
        return (index, term, start)

    def _write_base(self, index: int, term: int) -> None:
        """Replace the base file atomically (temp, fsync, rename, fsync dir)."""
        head = _BASE_HEAD.pack(_BASE_MAGIC, index, term)
        path = os.path.join(self.dir, BASE_NAME)
        try:
            atomic_write(path, head, U32.pack(crc32c.crc32c(head)))
        except OSError as exc:
            raise CommitLogError(f"writing {path} failed: {exc}") from exc
