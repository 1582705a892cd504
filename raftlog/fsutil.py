"""File-system durability helpers shared by the CommitLog and the hard-state file."""

from __future__ import annotations

import os

__all__ = ["fsync_dir"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries (new, renamed or removed files) durable.

    A rename or file creation is not durable until its directory is fsynced.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
