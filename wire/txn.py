"""What client and broker agree on about Kafka-style transactions, outside any state.

A transactional id's state lives in one group, its coordinator, chosen by a hash every
process computes the same way from the group ids it knows (`coordinator_group`): the
client sends TX_INIT/TX_ADD/TX_END there, and a broker answers NOT_COORDINATOR when
asked in another group.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

__all__ = ["MAX_MARKERS", "TxKey", "coordinator_group", "half_key", "kafka_key"]

#: Coordinator decisions in one TX_MARKER request, applied as one entry (`tx_markers`).
MAX_MARKERS = 1024

#: The key of prepared data: ("k", tid, epoch, n) for a Kafka transaction, ("h", txid)
#: for a half message.
TxKey = tuple[str, str] | tuple[str, str, int, int]


def coordinator_group(tid: str, group_ids: Iterable[str]) -> str:
    """The group coordinating transactional id `tid`: sorted(group_ids)[crc32(tid) % n].

    ValueError when there are no groups."""
    groups = sorted(set(group_ids))
    if not groups:
        raise ValueError("no groups to choose a transaction coordinator from")
    return groups[zlib.crc32(tid.encode("utf-8")) % len(groups)]


def kafka_key(tid: str, epoch: int, n: int) -> TxKey:
    """The prepared-data key of transaction `n` of `tid` at `epoch`."""
    return ("k", tid, epoch, n)


def half_key(txid: str) -> TxKey:
    """The prepared-data key of the half message `txid`."""
    return ("h", txid)
