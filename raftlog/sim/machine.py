"""The simulated state machine: a hash chain over the applied entries.

Its state after applying entries 1..i is one 16-byte value, so a snapshot is that value
at i, and two replicas that applied anything different -- or restored a wrong snapshot --
disagree from then on.

Like the broker's ConsumeQueues, the state also points into the log: it references
every entry from its horizon on (the first entry its replica's last snapshot kept when
it compacted the log), and a snapshot carries the horizon beside the chain value
(`pack`), so a replica installing it knows which entries it must hold.
"""

from __future__ import annotations

import hashlib

from raftlog.types import Entry

__all__ = ["GENESIS", "chain", "pack", "unpack"]

GENESIS = bytes(16)  # the state before any entry


def pack(state: bytes, horizon: int) -> bytes:
    """Snapshot data: the chain value and the horizon."""
    return state + horizon.to_bytes(8, "little")


def unpack(data: bytes) -> tuple[bytes, int]:
    """(chain value, horizon) of snapshot data."""
    return data[:16], int.from_bytes(data[16:24], "little")


def chain(state: bytes, e: Entry) -> bytes:
    """The state after applying `e` to `state`."""
    h = hashlib.blake2b(state, digest_size=16)
    h.update(b"%d:%d:%d:" % (e.index, e.term, e.type))
    h.update(e.data)
    return h.digest()
