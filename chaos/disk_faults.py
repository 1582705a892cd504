"""Disk faults for the chaos nemeses, applied to the data directory of a stopped node.

* `discard_unsynced` simulates a power loss after a SIGKILL: every byte no fsync covered
  is thrown away, going by the sync marks the node recorded (it must run with
  ``test_sync_marks = true``; see `raftlog.fsutil` for the marks and the
  simplifications they make). Files are cut back to their last durable size and files
  whose existence was never made durable are deleted, leftover ``*.tmp`` files
  included. A node that skips fsync (the ``skip-fsync`` test mutation) leaves no marks
  for its CommitLog writes, so a power loss of every node loses what it acknowledged:
  what a chaos run must then report.
* `corrupt_entry` flips one byte in the body of one stored CommitLog entry, away from
  the end of its log. The node's CommitLog reports the entry as corrupt and its group
  repairs it from a peer (`raftlog.runtime`); an acknowledged message must not be lost.

Both are blocking and only for a node that is not running.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c

from raftlog.commitlog import HEADER_SIZE, MAGIC
from raftlog.fsutil import iter_data_files, load_sync_marks, reset_sync_marks, sync_marks_path

__all__ = ["StoredEntry", "corrupt_entry", "discard_unsynced", "stored_entries"]

#: Entries at the end of a log `corrupt_entry` leaves alone: there a corrupt entry would
#: be taken for a torn tail and cut off, not repaired.
KEEP_TAIL = 3
# The entry header of `raftlog.commitlog`: magic, total size, term, index, type, body
# CRC (the part the header CRC covers), then that CRC.
_HEAD = struct.Struct("<IIQQBI")
_HCRC = struct.Struct("<I")
assert _HEAD.size + _HCRC.size == HEADER_SIZE
_SEGMENT_NAME_LEN = 20


def discard_unsynced(data_dir: Path) -> dict[str, Any]:
    """Throw away whatever the last fsyncs did not cover under `data_dir`, then reset its
    marks (what is left now counts as durable). Returns a JSON-able summary.

    Raises FileNotFoundError when the directory has no sync marks: the node did not run
    with ``test_sync_marks``, and guessing would delete its data.
    """
    data_dir = Path(data_dir)
    marks = sync_marks_path(data_dir)
    if not marks.exists():
        raise FileNotFoundError(
            f"{marks} is missing: the node did not run with test_sync_marks = true"
        )
    state = load_sync_marks(data_dir)
    truncated: dict[str, list[int]] = {}  # path -> [size before, size after]
    deleted: list[str] = []
    discarded = 0
    for rel, st in list(iter_data_files(data_dir)):
        keep = state.durable_size(rel, st.st_ino)
        path = data_dir / rel
        if keep is None:
            path.unlink()
            deleted.append(rel)
            discarded += st.st_size
        elif st.st_size > keep:
            os.truncate(path, keep)
            truncated[rel] = [st.st_size, keep]
            discarded += st.st_size - keep
    reset_sync_marks(data_dir)
    return {
        "files_truncated": len(truncated),
        "files_deleted": len(deleted),
        "bytes_discarded": discarded,
        "truncated": truncated,
        "deleted": deleted,
    }


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """Where one entry with an intact header lies in a segment file."""

    index: int
    term: int
    size: int  # header + body
    file: Path
    offset: int  # of its header, within `file`


def stored_entries(log_dir: Path) -> list[StoredEntry]:
    """Every entry with an intact header in the segments of the CommitLog directory
    `log_dir` (``<data>/<group>/commitlog``), in file order. Reads headers only; a
    segment's walk stops at the first header that does not verify."""
    out: list[StoredEntry] = []
    names = sorted(n for n in os.listdir(log_dir)
                   if len(n) == _SEGMENT_NAME_LEN and n.isdigit())
    for name in names:
        path = Path(log_dir) / name
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER_SIZE:
                continue
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                off = 0
                while off + HEADER_SIZE <= size:
                    magic, total, term, index, _etype, _bcrc = _HEAD.unpack_from(mm, off)
                    (hcrc,) = _HCRC.unpack_from(mm, off + _HEAD.size)
                    if (magic != MAGIC or total < HEADER_SIZE or off + total > size
                            or crc32c.crc32c(mm[off : off + _HEAD.size]) != hcrc):
                        break
                    out.append(StoredEntry(index, term, total, path, off))
                    off += total
    return out


def corrupt_entry(
    data_dir: Path,
    rng: random.Random,
    *,
    part: str = "body",
    group: str | None = None,
    index: int | None = None,
) -> dict[str, Any] | None:
    """Flip one byte of a stored entry of some group's CommitLog under `data_dir`, never
    one of the last `KEEP_TAIL` entries of its log: in its body (`part="body"`) or in
    its header (`"header"`: any of its fields or its CRC). `group` and `index` narrow the
    choice to one group or one entry.

    Returns {"group", "index", "term", "file", "position" (of the flipped byte in
    `file`), "entry_position" (of the entry in `file`)}, or None when no log holds a
    suitable entry.
    """
    if part not in ("body", "header"):
        raise ValueError(f"part is 'body' or 'header', got {part!r}")
    data_dir = Path(data_dir)
    candidates: list[tuple[str, list[StoredEntry]]] = []
    for group_dir in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        log_dir = group_dir / "commitlog"
        if not log_dir.is_dir() or group not in (None, group_dir.name):
            continue
        entries = stored_entries(log_dir)
        if not entries:
            continue
        last = max(e.index for e in entries)
        ok = [e for e in entries if e.index <= last - KEEP_TAIL and e.size > HEADER_SIZE
              and index in (None, e.index)]
        if ok:
            candidates.append((group_dir.name, ok))
    if not candidates:
        return None
    chosen, entries = rng.choice(candidates)
    e = rng.choice(entries)
    if part == "body":
        position = e.offset + HEADER_SIZE + rng.randrange(e.size - HEADER_SIZE)
    else:
        position = e.offset + rng.randrange(HEADER_SIZE)
    fd = os.open(e.file, os.O_RDWR)
    try:
        old = os.pread(fd, 1, position)
        os.pwrite(fd, bytes([old[0] ^ rng.randrange(1, 256)]), position)
    finally:
        os.close(fd)
    return {
        "group": chosen,
        "index": e.index,
        "term": e.term,
        "file": str(e.file),
        "position": position,
        "entry_position": e.offset,
    }
