"""Where a broadcast consumer keeps its offsets: a file of its own on the consumer's host.

In broadcast mode every consumer reads every queue, so its positions are its own, not the
group's, and the cluster does not keep them (RocketMQ keeps them in a local file too).
Held in memory only, they were lost on a restart and the consumer read the whole topic
again. One JSON file per consumer group in a directory (`offsets_dir`, by default
`$RAFTMQ_OFFSETS_DIR` or `~/.raftmq/offsets`), replaced atomically (written beside it,
fsynced, renamed) at every commit, so a crash leaves the previous or the new positions,
never a torn file. A lock file keeps two live consumers of one group from sharing it: the
second gets `OffsetsInUseError` and should use an `offsets_dir` of its own.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import IO

from wire.protocol import RaftMQError

__all__ = ["LocalOffsets", "OffsetsInUseError", "default_offsets_dir"]

FORMAT_VERSION = 1


class OffsetsInUseError(RaftMQError):
    """Another live consumer holds this group's offsets file."""


def default_offsets_dir() -> Path:
    return Path(os.environ.get("RAFTMQ_OFFSETS_DIR") or "~/.raftmq/offsets").expanduser()


class LocalOffsets:
    """A broadcast consumer group's committed offsets in `directory/<group>.json`."""

    def __init__(self, directory: str | os.PathLike[str], group: str) -> None:
        self.directory = Path(directory)
        self.group = group
        self.path = self.directory / f"{group}.json"
        self._lock: IO[bytes] | None = None

    def open(self) -> dict[tuple[str, int], int]:
        """Take the group's lock and read its offsets (none if there is no file yet).

        ValueError, naming the file, if it is not one of ours: it is left as it is, for
        the user to move aside (starting from scratch silently would re-read everything).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        lock = open(self.directory / f"{self.group}.lock", "ab")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise OffsetsInUseError(
                f"another broadcast consumer of group {self.group!r} is using {self.path}; "
                f"give each consumer its own offsets_dir") from None
        self._lock = lock
        try:
            return self._read()
        except BaseException:
            self.close()
            raise

    def _read(self) -> dict[tuple[str, int], int]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(raw)
            if doc["version"] != FORMAT_VERSION or doc["group"] != self.group:
                raise ValueError(f"version {doc['version']!r} of group {doc['group']!r}")
            out: dict[tuple[str, int], int] = {}
            for topic, queue, offset in doc["offsets"]:
                if not (isinstance(topic, str) and type(queue) is int and type(offset) is int
                        and queue >= 0 and offset >= 0):
                    raise ValueError(f"bad row {[topic, queue, offset]!r}")
                out[(topic, queue)] = offset
            return out
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{self.path} is not a broadcast offsets file of group "
                             f"{self.group!r} ({exc}); move it aside to start afresh") from None

    def save(self, offsets: dict[tuple[str, int], int]) -> None:
        """Replace the file with `offsets`, durably (blocking: run it in a thread)."""
        doc = {"version": FORMAT_VERSION, "group": self.group,
               "offsets": [[t, q, o] for (t, q), o in sorted(offsets.items())]}
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "wb") as f:
            f.write(json.dumps(doc).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the lock
            self._lock = None
