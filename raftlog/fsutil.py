"""File helpers shared by the CommitLog, the hard-state file and the snapshot file.

Durability: every fsync of a data file goes through `fsync_fd`, `fdatasync_fd`,
`fsync_dir` or `atomic_write` (temp file, fsync, rename, fsync directory), so that the
sync marks below see all of them.

Sync marks (test instrumentation, off by default)
    A chaos run simulates a power loss by killing a node with SIGKILL and then throwing
    away every byte no fsync covered (`chaos.disk_faults.discard_unsynced`). To know
    what that is, a node started with ``test_sync_marks`` calls `enable_sync_marks` on
    its data directory, and from then on every sync of a file under it appends a line
    to ``<data>/.sync-marks`` (one ``O_APPEND`` write; the marks file itself is never
    fsynced: it only has to survive SIGKILL, which the page cache guarantees). Lines
    are JSON arrays:

    * ``["s", path, inode, size]`` -- an fsync/fdatasync of the file made its first
      `size` bytes durable; `size` is taken with ``fstat`` *before* the sync starts
      (appends may go on meanwhile from another thread, and only what was written
      before the call is covered);
    * ``["b", path, inode]`` -- a directory fsync made the name `path` durable, bound
      to `inode` (creation or rename);
    * ``["u", path]`` -- a directory fsync made the removal of `path` durable.

    Paths are relative to the data directory. Enabling writes a fresh file holding
    every file already there at its full size and binding: whatever survived earlier
    crashes is durable. `load_sync_marks` replays the lines into `DurableState`.

    Directory durability: a name no directory fsync ever bound -- a file created, or
    renamed to a new name, since the last fsync of its directory -- vanishes with
    everything in it, however much of its content was fsynced (a real crash may lose
    such a name; the model always does).

    Simplifications, chosen so that the result is always a state a real power loss
    could leave: a file renamed *over* a durable name whose content was fsynced
    survives under that name even before the directory fsync (a real crash could also
    show the old file; both are states `atomic_write` callers handle). A removed file
    stays removed even when no directory fsync followed the unlink. An overwrite inside the durable size is kept whether or
    not it was fsynced. An inode number is taken to name the same file while a name is
    bound to it; when a file is removed and its number reused, the old name is
    recorded as removed (``u``) before the new file's first mark. Directories
    themselves are not tracked.

The checksummed envelope of the small state files (little-endian)::

    magic 4 bytes | version u16 | reserved u16 | fields... | payload length | payload |
    crc32c u32 over everything before it

`seal` builds one from a header `struct.Struct` whose last field is the payload length;
`unseal` verifies one and hands back the fields between reserved and length, and the
payload, or raises a `CorruptFile` subclass naming the file.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

__all__ = [
    "SYNC_MARKS_NAME",
    "CorruptFile",
    "DurableState",
    "atomic_write",
    "disable_sync_marks",
    "enable_sync_marks",
    "fdatasync_fd",
    "fsync_dir",
    "fsync_fd",
    "iter_data_files",
    "load_sync_marks",
    "mark_synced",
    "reset_sync_marks",
    "seal",
    "sync_marks_path",
    "unseal",
]

_CRC = struct.Struct("<I")
SYNC_MARKS_NAME = ".sync-marks"
_MARKS_RESERVE = 16 << 20  # bytes of marks file allocated ahead (see `_Root._reserve`)
_MARKS_TMP = SYNC_MARKS_NAME + ".tmp"


class CorruptFile(Exception):
    """A file exists but cannot be trusted (torn, garbled, wrong format)."""

    what = "file"

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"corrupt {self.what} {path}: {reason}")


def fsync_fd(fd: int, path: str | os.PathLike[str] | None = None) -> None:
    """``fsync`` an open data file (`path` names it for the sync marks; when None it is
    looked up only if marks are on)."""
    _sync(os.fsync, fd, path)


def fdatasync_fd(fd: int, path: str | os.PathLike[str] | None = None) -> None:
    """``fdatasync`` an open data file (``fsync`` where there is none); see `fsync_fd`."""
    _sync(_fdatasync, fd, path)


_fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def _sync(sync: Callable[[int], None], fd: int, path: str | os.PathLike[str] | None) -> None:
    if not _roots:  # the normal case: nothing but the syscall
        sync(fd)
        return
    st = os.fstat(fd)  # before the sync: only what was written by now is covered
    sync(fd)
    _marked_sync(fd, path, st)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (new, renamed or removed files) durable.

    A rename or file creation is not durable until its directory is fsynced.
    """
    names = _list_files(path) if _roots else None
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if names is not None:
        _marked_dir(path, names)


def atomic_write(
    path: str | os.PathLike[str], *chunks: bytes, sync_dir: bool = True
) -> None:
    """Durably replace the file at `path` with `chunks`, one after another.

    Write a temp file, fsync it, rename it over the old one, fsync the directory: a
    reader sees the old or the new contents, never a mix, and a crash mid-write leaves
    the old file untouched. Without `sync_dir` the caller fsyncs the directory itself,
    once for several files.
    """
    path = os.fspath(path)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        fsync_fd(fd, tmp)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


# --------------------------------------------------------------------------- sync marks


def sync_marks_path(data_dir: str | os.PathLike[str]) -> Path:
    """Where the sync marks of the node keeping its data in `data_dir` go."""
    return Path(data_dir) / SYNC_MARKS_NAME


def iter_data_files(data_dir: str | os.PathLike[str]) -> Iterator[tuple[str, os.stat_result]]:
    """(path relative to `data_dir`, lstat) of every regular file under it, except the
    sync marks themselves."""
    root = os.fspath(data_dir)
    for dirpath, _dirs, files in os.walk(root):
        for name in sorted(files):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel in (SYNC_MARKS_NAME, _MARKS_TMP):
                continue
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield rel, st


class _Root:
    """The marks of one data directory: its open marks file and what it has recorded."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.names: dict[str, int] = {}  # path -> inode, as recorded
        self.by_inode: dict[int, set[str]] = {}
        for rel, ino in reset_sync_marks(path).items():
            self.bind(rel, ino)
        self.fd = os.open(os.path.join(path, SYNC_MARKS_NAME), os.O_WRONLY)
        self.offset = os.fstat(self.fd).st_size  # where the next marks go
        self.reserved = self.offset
        self._reserve()

    def _reserve(self) -> None:
        """Allocate room for the marks ahead of time: the marks live on the disk they
        describe, and a disk-full fault must fail the node's own writes, not the record
        of its fsyncs (an fsync whose mark cannot be written would fail as a whole). The
        room reads as NUL bytes, which `load_sync_marks` skips."""
        try:
            os.posix_fallocate(self.fd, self.reserved, _MARKS_RESERVE)
            self.reserved += _MARKS_RESERVE
        except OSError:
            pass  # no room now: writes extend the file as they go, and may fail

    def bind(self, rel: str, ino: int) -> None:
        self.unbind(rel)
        self.names[rel] = ino
        self.by_inode.setdefault(ino, set()).add(rel)

    def unbind(self, rel: str) -> None:
        ino = self.names.pop(rel, None)
        if ino is not None:
            names = self.by_inode[ino]
            names.discard(rel)
            if not names:
                del self.by_inode[ino]

    def stale_names(self, rel: str, ino: int) -> list[str]:
        """Names recorded for `ino` that no longer lead to it: their file was removed
        and the inode number reused by the file at `rel`."""
        stale = []
        for other in self.by_inode.get(ino, ()):
            if other == rel:
                continue
            try:
                if os.lstat(os.path.join(self.path, other)).st_ino == ino:
                    continue  # a second name of the same file
            except OSError:
                pass
            stale.append(other)
        return stale

    def write(self, lines: list[list[object]]) -> None:
        """Record `lines` (under `lock`: one write, never interleaved)."""
        if lines:
            data = _encode(lines)
            if self.reserved - self.offset - len(data) < _MARKS_RESERVE // 4:
                self._reserve()
            os.pwrite(self.fd, data, self.offset)
            self.offset += len(data)


def reset_sync_marks(data_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Rewrite `data_dir`'s marks to say that every file now there is durable in full
    (and bound to its name); returns path -> inode of those files. Not while a process
    records marks there."""
    names: dict[str, int] = {}
    lines: list[list[object]] = []
    for rel, st in iter_data_files(data_dir):
        names[rel] = st.st_ino
        lines.append(["s", rel, st.st_ino, st.st_size])
        lines.append(["b", rel, st.st_ino])
    tmp = os.path.join(data_dir, _MARKS_TMP)
    with open(tmp, "wb") as f:
        f.write(_encode(lines))
    # a rename, so a SIGKILL mid-way leaves the old marks or the whole new baseline
    os.replace(tmp, os.path.join(data_dir, SYNC_MARKS_NAME))
    return names


def mark_synced(data_dir: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Record in `data_dir`'s sync marks, when it has any, that the file at `path` is
    durable at its present size. For a harness that fsynced a file while no node ran
    (a damaged file put back): the marks a node wrote on its last start describe the
    file as it found it, and a later simulated power loss must not cut it back to that.
    Not while a process records marks there. The line starts on a line of its own: the
    file may end in the NUL room a node reserved."""
    marks = sync_marks_path(data_dir)
    if not marks.exists():
        return
    st = os.stat(path)
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(data_dir))
    with open(marks, "ab") as f:
        f.write(b"\n" + _encode([["s", rel, st.st_ino, st.st_size]]))


def _encode(lines: list[list[object]]) -> bytes:
    return b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n" for x in lines)


_roots: dict[str, _Root] = {}  # real path of a data dir -> its marks (empty: marks off)
_roots_lock = threading.Lock()


def enable_sync_marks(data_dir: str | os.PathLike[str]) -> Path:
    """Start recording sync marks for files under `data_dir` (creating it if needed).

    Writes a fresh marks file listing every file already there as durable at its full
    size, so call it before anything under `data_dir` is opened. Returns its path.
    """
    os.makedirs(data_dir, exist_ok=True)
    real = os.path.realpath(data_dir)
    with _roots_lock:
        old = _roots.pop(real, None)
        if old is not None:
            os.close(old.fd)
        _roots[real] = _Root(real)
    return sync_marks_path(real)


def disable_sync_marks(data_dir: str | os.PathLike[str]) -> None:
    """Stop recording sync marks for `data_dir` (the file stays)."""
    with _roots_lock:
        old = _roots.pop(os.path.realpath(data_dir), None)
    if old is not None:
        os.close(old.fd)


def _root_of(real: str, *, is_dir: bool = False) -> tuple[_Root, str] | None:
    """The data dir holding `real` and the path relative to it (for a directory: its
    prefix, "" for the data dir itself, else ending in "/")."""
    for base, root in list(_roots.items()):
        if is_dir and real == base:
            return root, ""
        if real.startswith(base + os.sep):
            rel = real[len(base) + 1 :]
            return root, rel + "/" if is_dir else rel
    return None


def _marked_sync(fd: int, path: str | os.PathLike[str] | None, st: os.stat_result) -> None:
    if path is None:
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if real.endswith(" (deleted)"):
            return  # unlinked meanwhile: nothing left to keep
    else:
        real = os.path.realpath(path)
    found = _root_of(real)
    if found is None:
        return
    root, rel = found
    lines: list[list[object]] = []
    with root.lock:
        for other in root.stale_names(rel, st.st_ino):
            # the old file is gone (its removal counts as durable): its size must not
            # carry over to the new file
            root.unbind(other)
            lines.append(["u", other])
        lines.append(["s", rel, st.st_ino, st.st_size])
        root.write(lines)


def _list_files(path: str | os.PathLike[str]) -> dict[str, int]:
    """name -> inode of the regular files directly in `path`."""
    out: dict[str, int] = {}
    try:
        with os.scandir(path) as it:
            for e in it:
                try:
                    if e.is_file(follow_symlinks=False):
                        out[e.name] = e.inode()
                except OSError:
                    continue
    except OSError:
        pass
    return out


def _marked_dir(path: str | os.PathLike[str], names: dict[str, int]) -> None:
    found = _root_of(os.path.realpath(path), is_dir=True)
    if found is None:
        return
    root, prefix = found
    unbound: list[list[object]] = []
    bound: list[list[object]] = []
    moved: list[list[object]] = []
    alive = set(names.values())
    with root.lock:
        # Removals of files that are gone come first: an inode freed here may be reused
        # by a name bound here. A name whose inode lives on under another name (the
        # source of a rename) is dropped only after that name is bound, so the file
        # keeps the size its fsyncs made durable: replayed the other way round, the
        # inode would look freed and the renamed file empty.
        for rel in [rel for rel in root.names
                    if rel.startswith(prefix) and os.sep not in rel[len(prefix):]
                    and rel[len(prefix):] not in names]:
            (moved if root.names[rel] in alive else unbound).append(["u", rel])
        for line in unbound:
            root.unbind(str(line[1]))
        for name, ino in names.items():
            rel = prefix + name
            if rel in (SYNC_MARKS_NAME, _MARKS_TMP) or root.names.get(rel) == ino:
                continue
            if rel in root.names:
                unbound.append(["u", rel])
            root.bind(rel, ino)
            bound.append(["b", rel, ino])
        for line in moved:
            root.unbind(str(line[1]))
        root.write(unbound + bound + moved)


@dataclass
class DurableState:
    """What the sync marks say survives a power loss (see `load_sync_marks`)."""

    sizes: dict[int, int] = field(default_factory=dict)  # inode -> durable size
    names: dict[str, int] = field(default_factory=dict)  # path -> inode, durably bound

    def durable_size(self, rel: str, inode: int) -> int | None:
        """How much of the file now at `rel` (with `inode`) survives; None: all of it
        goes (its name was never made durable by a directory fsync, or it replaced a
        durable name but none of its content was fsynced)."""
        bound = self.names.get(rel)
        if bound == inode:
            return self.sizes.get(inode, 0)  # its name is durable, maybe not its content
        if bound is None:
            return None  # a name the directory never made durable: it vanishes
        return self.sizes.get(inode)  # renamed over a durable name (see the docstring)


def load_sync_marks(data_dir: str | os.PathLike[str]) -> DurableState:
    """Replay `data_dir`'s marks file. Raises FileNotFoundError when there is none (the
    node did not run with sync marks on); a torn last line is skipped."""
    state = DurableState()
    bound: dict[int, set[str]] = {}
    with open(sync_marks_path(data_dir), "rb") as f:
        data = f.read().rstrip(b"\0")  # room allocated ahead and not written yet

    def unbind(rel: str) -> None:
        ino = state.names.pop(rel, None)
        if ino is None:
            return
        names = bound.get(ino)
        if names is not None:
            names.discard(rel)
            if not names:  # the inode is free now: a reuse of its number starts afresh
                del bound[ino]
                state.sizes.pop(ino, None)

    for raw in data.split(b"\n"):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(rec, list) or not rec:
            continue
        kind = rec[0]
        if kind == "s" and len(rec) == 4:
            state.sizes[int(rec[2])] = int(rec[3])
        elif kind == "b" and len(rec) == 3:
            rel, ino = str(rec[1]), int(rec[2])
            if state.names.get(rel) != ino:
                unbind(rel)
                state.names[rel] = ino
                bound.setdefault(ino, set()).add(rel)
        elif kind == "u" and len(rec) == 2:
            unbind(str(rec[1]))
    return state


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
