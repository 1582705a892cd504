"""Which groups a node hosts, kept in `<data>/hosted.json` across restarts.

A group's membership lives in its Raft log and snapshots, and changes at run time
(`raftmq cluster add-replica`, `remove-replica`): a node told to join a group starts
hosting an empty replica of it, and one removed from a group stops hosting it and
deletes its data. The static config's `groups` only say what the cluster looked like
when it was first started, so the node records what it hosts now, durably (written to
a temp file, fsynced, renamed, directory fsynced), and a restart comes back with the
same groups whatever the config says. Each group is listed with the voters it was
created with: what an empty replica starts believing until the leader's log (or
snapshot) tells it the membership in force.

The first start (no file yet) hosts the config's groups naming this node, or none
with `join = true` (a replaced disk or a new node: it waits to be told).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from raftlog.fsutil import atomic_write

__all__ = ["HOSTED_FILE", "HostedError", "load_hosted", "save_hosted"]

HOSTED_FILE = "hosted.json"


class HostedError(ValueError):
    """The hosted-groups file is unreadable: the node refuses to start rather than
    guess which replicas it holds."""


def load_hosted(data: str | os.PathLike[str]) -> dict[str, tuple[int, ...]] | None:
    """Group id -> the voters it was created with; None when there is no file yet."""
    path = Path(data) / HOSTED_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(text)
        groups = doc["groups"]
        out = {str(gid): tuple(int(n) for n in voters) for gid, voters in groups.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HostedError(f"{path}: unreadable ({exc!r}); restore it or remove it (the "
                          "node then hosts what its config says)") from None
    for gid, voters in out.items():
        if not voters:
            raise HostedError(f"{path}: group {gid!r} has no voters")
    return out


def save_hosted(data: str | os.PathLike[str], groups: Mapping[str, tuple[int, ...]]) -> None:
    """Durably replace the file with `groups` (blocking: call it off the event loop)."""
    os.makedirs(data, exist_ok=True)
    doc = {"groups": {gid: sorted(v) for gid, v in sorted(groups.items())}}
    atomic_write(Path(data) / HOSTED_FILE, json.dumps(doc, indent=1).encode() + b"\n")
