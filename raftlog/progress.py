"""What a leader knows about one follower's log (etcd's `tracker.Progress`).

Invariant: `match < next`. In PROBE the leader sends one append at a time and waits for a
reply (it does not know where the follower's log diverges); in REPLICATE it streams
appends optimistically, at most `max_inflight` unacknowledged at once (pipelining).
"""

from __future__ import annotations

from collections import deque

__all__ = ["Progress"]


class Progress:
    __slots__ = ("match", "next", "replicating", "paused", "inflight", "recent_active")

    def __init__(self, next_index: int) -> None:
        self.match = 0
        self.next = next_index
        self.replicating = False
        self.paused = False  # PROBE only: an append is outstanding
        self.inflight: deque[int] = deque()  # REPLICATE only: last index of each unacked append
        self.recent_active = False  # heard from since the last check-quorum round

    def become_probe(self) -> None:
        self.replicating = False
        self.paused = False
        self.inflight.clear()
        self.next = self.match + 1

    def become_replicate(self) -> None:
        self.replicating = True
        self.paused = False
        self.inflight.clear()
        self.next = self.match + 1

    def can_send(self, max_inflight: int) -> bool:
        if self.replicating:
            return len(self.inflight) < max_inflight
        return not self.paused

    def sent(self, last: int) -> None:
        """Record an append carrying entries up to `last` (or none, in probe)."""
        if self.replicating:
            if last >= self.next:
                self.next = last + 1
                self.inflight.append(last)
        else:
            self.paused = True

    def acked(self, index: int) -> bool:
        """The follower matches up to `index`. Returns whether that is news."""
        self.paused = False
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        if index <= self.match:
            return False
        self.match = index
        self.next = max(self.next, index + 1)
        return True

    def rejected(self, rejected: int, next_hint: int) -> bool:
        """A follower refused an append whose previous index was `rejected`.

        Returns False when the refusal is stale (it answers an append sent before a
        later one already moved us on), so the caller ignores it.
        """
        if self.replicating:
            if rejected <= self.match:
                return False
        elif rejected != self.next - 1:
            return False
        self.become_probe()
        self.next = max(min(next_hint, rejected), self.match + 1)
        return True

    def __repr__(self) -> str:
        state = "replicate" if self.replicating else ("probe-paused" if self.paused else "probe")
        return f"Progress(match={self.match}, next={self.next}, {state}, inflight={len(self.inflight)})"
