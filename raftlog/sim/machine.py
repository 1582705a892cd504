"""The simulated state machine: a hash chain over the applied entries.

Its state after applying entries 1..i is one 16-byte value, so a snapshot is that value
at i, and two replicas that applied anything different -- or restored a wrong snapshot --
disagree from then on.
"""

from __future__ import annotations

import hashlib

from raftlog.types import Entry

__all__ = ["GENESIS", "chain"]

GENESIS = bytes(16)  # the state before any entry


def chain(state: bytes, e: Entry) -> bytes:
    """The state after applying `e` to `state`."""
    h = hashlib.blake2b(state, digest_size=16)
    h.update(b"%d:%d:%d:" % (e.index, e.term, e.type))
    h.update(e.data)
    return h.digest()
