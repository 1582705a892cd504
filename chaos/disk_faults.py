"""Disk faults for the chaos nemeses, applied to the data directory of a stopped node.

* `discard_unsynced` simulates a power loss after a SIGKILL: every byte no fsync covered
  is thrown away, going by the sync marks the node recorded (it must run with
  ``test_sync_marks = true``; see `raftlog.fsutil` for the marks and the
  simplifications they make). Files are cut back to their last durable size and files
  whose existence was never made durable are deleted, leftover ``*.tmp`` files
  included. A node that skips fsync (the ``skip-fsync`` test mutation) leaves no marks
  for its CommitLog writes, so a power loss of every node loses what it acknowledged:
  what a chaos run must then report.
* `corrupt_entry` flips one byte in the body or the header of one stored CommitLog
  entry, away from the end of its log. The node's CommitLog reports the entry as corrupt and its group
  repairs it from a peer (`raftlog.runtime`); an acknowledged message must not be lost.

* `damage_file` truncates a file, or flips a few bits in it, choosing among the
  CommitLog segments, CommitLog index files, snapshot files and the ConsumeQueue chunk
  files snapshots reference, in a data directory; the
  returned `Damage` keeps the original bytes so `Damage.restore` can put them back (what
  an operator restoring from a backup does, after a node refused to start on them).
* `SmallDisk` puts a data directory on a loop-mounted ext4 file system of a fixed size,
  so `fill` can make it really full (ENOSPC for every write) and `free` can end that.
  Mounting needs root and a loop device; `SmallDisk.supported` says whether this
  machine allows it.

All but `SmallDisk.fill`/`free` are blocking and only for a node that is not running.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import crc32c

from raftlog.commitlog import HEADER_SIZE, MAGIC
from raftlog.fsutil import iter_data_files, load_sync_marks, reset_sync_marks, sync_marks_path

__all__ = [
    "FILE_KINDS",
    "Damage",
    "SmallDisk",
    "StoredEntry",
    "corrupt_entry",
    "damage_file",
    "damageable_files",
    "discard_unsynced",
    "stored_entries",
]

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
    part: str = "body",
    *,
    group: str | None = None,
    index: int | None = None,
) -> dict[str, Any] | None:
    """Flip one byte of a stored entry of some group's CommitLog under `data_dir`, never
    one of the last `KEEP_TAIL` entries of its log: in its body (`part="body"`) or in
    its header (`"header"`: one of the fields its header CRC covers, or that CRC).
    `group` and `index` narrow the choice to one group or one entry.

    Returns {"group", "index", "term", "file", "part", "position" (of the flipped byte
    in `file`), "entry_position" (of the entry in `file`)}, or None when no log holds a
    suitable entry.
    """
    if part not in ("body", "header"):
        raise ValueError(f"part must be body or header, not {part!r}")
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
        "part": part,
        "position": position,
        "entry_position": e.offset,
    }


# ------------------------------------------------------------------ damaged files

FILE_KINDS = ("segment", "index", "snapshot", "chunk")
DAMAGES = ("truncate", "bitflip")


def _file_kind(rel: Path) -> str | None:
    """What the file at `rel` (relative to a data directory) is, among `FILE_KINDS`."""
    parts = rel.parts
    if len(parts) == 2 and parts[1] == "snapshot":
        return "snapshot"
    if len(parts) == 3 and parts[1] == "consumequeue" and not parts[2].endswith(".tmp"):
        return "chunk"
    if len(parts) == 3 and parts[1] == "commitlog":
        if parts[2] == "index":
            return "index"
        if len(parts[2]) == _SEGMENT_NAME_LEN and parts[2].isdigit():
            return "segment"
    return None


def damageable_files(data_dir: Path, kinds: tuple[str, ...] = FILE_KINDS) -> list[tuple[str, Path]]:
    """(kind, path) of every non-empty file of `kinds` under `data_dir` (``<group>/
    commitlog/<segment>``, ``<group>/commitlog/index``, ``<group>/snapshot``, the
    ConsumeQueue chunks a snapshot references in ``<group>/consumequeue/``), sorted."""
    data_dir = Path(data_dir)
    out = []
    for path in (sorted(data_dir.glob("*/commitlog/*")) + sorted(data_dir.glob("*/snapshot"))
                 + sorted(data_dir.glob("*/consumequeue/*"))):
        kind = _file_kind(path.relative_to(data_dir))
        if kind in kinds and path.is_file() and path.stat().st_size > 0:
            out.append((kind, path))
    return sorted(out, key=lambda kp: str(kp[1]))


@dataclass
class Damage:
    """One damaged file: what was done to it, and its original bytes."""

    how: str  # "truncate" or "bitflip"
    kind: str  # one of FILE_KINDS
    path: Path
    size: int  # before
    detail: dict[str, Any]
    original: bytes = field(repr=False)

    def describe(self) -> dict[str, Any]:
        return {"how": self.how, "kind": self.kind, "file": str(self.path), "size": self.size,
                **self.detail}

    def restore(self) -> None:
        """Put the original bytes back into the same file, fsynced: a restored backup is
        as durable as the file was. (A new file renamed over it would be a name the
        node's sync marks never saw fsynced, so a later `crash-unsynced` would delete a
        file the node's snapshot needs.)"""
        with self.path.open("r+b") as f:
            f.write(self.original)
            f.truncate(len(self.original))
            f.flush()
            os.fsync(f.fileno())


def damage_file(
    data_dir: Path, rng: random.Random, how: str, kinds: tuple[str, ...] = FILE_KINDS
) -> Damage | None:
    """Damage one random file of `kinds` under `data_dir`; None when there is none.

    ``truncate`` cuts it to a random shorter length (possibly 0); ``bitflip`` flips 1 to
    4 random bits anywhere in it, headers included. Only for a node that is not running.
    """
    if how not in DAMAGES:
        raise ValueError(f"unknown damage {how!r} (known: {', '.join(DAMAGES)})")
    unknown = sorted(set(kinds) - set(FILE_KINDS))
    if unknown:
        raise ValueError(f"unknown file kinds {unknown} (known: {', '.join(FILE_KINDS)})")
    files = damageable_files(Path(data_dir), kinds)
    if not files:
        return None
    kind, path = rng.choice(files)
    original = path.read_bytes()
    size = len(original)
    detail: dict[str, Any]
    if how == "truncate":
        keep = rng.randrange(size)
        os.truncate(path, keep)
        detail = {"kept": keep}
    else:
        data = bytearray(original)
        bits = sorted(rng.sample(range(size * 8), min(size * 8, rng.randint(1, 4))))
        for bit in bits:
            data[bit // 8] ^= 1 << (bit % 8)
        with path.open("r+b") as f:
            f.write(data)
        detail = {"bits": bits}
    return Damage(how, kind, path, size, detail, original)


# ------------------------------------------------------------------ a disk that fills up


class SmallDisk:
    """`size` bytes of ext4 in a loop-mounted image file, mounted on `mount_point`.

    `mount` (empty mount point), `fill` (a ballast file takes every free block: writes
    fail with ENOSPC), `free` (the ballast goes), `unmount` (the files are copied back
    into the mount point, a plain directory again, and the image deleted).
    """

    BALLAST = ".ballast"

    def __init__(self, mount_point: Path, image: Path, size: int = 512 << 20) -> None:
        self.mount_point = Path(mount_point)
        self.image = Path(image)
        self.size = size
        self.mounted = False

    @staticmethod
    def supported(scratch: Path) -> str | None:
        """None when this machine can loop-mount a small ext4 file system (root, a loop
        device, mkfs.ext4), else why not. Tries it under `scratch`."""
        if os.geteuid() != 0:
            return "needs root (mount -o loop)"
        if shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
            return "needs mkfs.ext4 and mount"
        scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            disk = SmallDisk(Path(tmp) / "mnt", Path(tmp) / "img", 8 << 20)
            try:
                disk.mount()
            except (OSError, subprocess.CalledProcessError) as exc:
                return f"loop mount failed: {exc}"
            disk.unmount()
        return None

    def mount(self) -> None:
        self.mount_point.mkdir(parents=True, exist_ok=True)
        if any(self.mount_point.iterdir()):
            raise OSError(errno.ENOTEMPTY, f"{self.mount_point} is not empty")
        with self.image.open("wb") as f:
            f.truncate(self.size)  # sparse: blocks are taken as the file system uses them
        run = {"check": True, "capture_output": True}
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)], **run)  # type: ignore[call-overload]
        try:
            subprocess.run(["mount", "-o", "loop", str(self.image), str(self.mount_point)], **run)  # type: ignore[call-overload]
        except subprocess.CalledProcessError:
            self.image.unlink(missing_ok=True)
            raise
        self.mounted = True
        (self.mount_point / "lost+found").rmdir()

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.mount_point).free

    def fill(self) -> dict[str, int]:
        """Take every free block with a ballast file; returns {"free_before", "ballast"}."""
        before = self.free_bytes()
        path = self.mount_point / self.BALLAST
        written = 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            size = before
            while size >= 4096:  # fallocate what fits, then halve what is asked for
                try:
                    os.posix_fallocate(fd, written, size)
                    written += size
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    size //= 2
        finally:
            os.close(fd)
        return {"free_before": before, "ballast": written, "free_after": self.free_bytes()}

    def free(self) -> None:
        (self.mount_point / self.BALLAST).unlink(missing_ok=True)

    def unmount(self) -> None:
        """Copy the files out, unmount, put them back in the plain directory, drop the
        image. Safe to call twice."""
        if not self.mounted:
            return
        self.free()
        saved = self.mount_point.with_name(self.mount_point.name + ".unmounting")
        shutil.rmtree(saved, ignore_errors=True)
        shutil.copytree(self.mount_point, saved, symlinks=True)
        subprocess.run(["umount", str(self.mount_point)], check=True, capture_output=True)
        self.mounted = False
        self.image.unlink(missing_ok=True)
        for child in saved.iterdir():
            shutil.move(str(child), self.mount_point / child.name)
        saved.rmdir()
