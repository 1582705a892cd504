"""ReadIndex bookkeeping on a leader (thesis §6.4; etcd's `readOnly`).

A read request gets the commit index as its read point once a quorum has confirmed, by
answering a heartbeat sent after the request, that this node was still leader. Requests
made before the leader committed an entry of its own term wait until it has (only then
is its commit index known to be the cluster's). Requests are batched into rounds: one
heartbeat round per `ready()`, each round's context a counter, and an acknowledgement of
round `c` confirms every round up to `c`.
"""

from __future__ import annotations

from collections.abc import Collection

from raftlog.quorum import has_quorum
from raftlog.types import ReadState

__all__ = ["ReadOnly"]


class ReadOnly:
    """Pending ReadIndex requests of one leader term."""

    __slots__ = ("_waiting", "_new", "_rounds", "_ctx")

    def __init__(self) -> None:
        self._waiting: list[int] = []  # requested before this term committed an entry
        self._new: list[int] = []  # ready for the next round
        self._rounds: list[tuple[int, int, list[int], set[int]]] = []  # ctx, index, ids, acks
        self._ctx = 0  # context of the newest round (never reused within a node's life)

    def request(self, request_id: int, committed_in_term: bool) -> None:
        (self._new if committed_in_term else self._waiting).append(request_id)

    def term_committed(self) -> None:
        """The leader committed an entry of its term: waiting requests may go."""
        if self._waiting:
            self._new.extend(self._waiting)
            self._waiting = []

    @property
    def has_new(self) -> bool:
        return bool(self._new)

    @property
    def pending_ctx(self) -> int:
        """Context of the newest unconfirmed round (0: none); a heartbeat carrying it asks
        again, in case that round's heartbeats were lost."""
        return self._rounds[-1][0] if self._rounds else 0

    def start_round(self, commit: int, me: int, single_voter: bool) -> tuple[int, list[ReadState]]:
        """Take the new requests into a round at `commit`; returns its context (0 when
        none is needed: a single voter confirms itself) and the reads answered at once."""
        ids, self._new = self._new, []
        if single_voter:
            return 0, [ReadState(i, commit) for i in ids]
        self._ctx += 1
        self._rounds.append((self._ctx, commit, ids, {me}))
        return self._ctx, []

    def ack(self, peer: int, ctx: int, voters: Collection[int]) -> list[ReadState]:
        """`peer` answered the heartbeat of round `ctx`: the reads now confirmed."""
        confirmed = 0
        for k, (c, _index, _ids, acks) in enumerate(self._rounds):
            if c > ctx:
                break
            if peer in voters:
                acks.add(peer)
            if has_quorum(voters, acks):
                confirmed = k + 1
        out = [
            ReadState(i, index) for _c, index, ids, _acks in self._rounds[:confirmed] for i in ids
        ]
        del self._rounds[:confirmed]
        return out

    def clear(self) -> None:
        """Leadership lost: every pending request is dropped (clients retry)."""
        self._waiting = []
        self._new = []
        self._rounds = []
