"""What a leader knows about one follower's log (etcd's `tracker.Progress`).

Invariant: `match < next`. In PROBE the leader sends one append at a time and waits for a
reply (it does not know where the follower's log diverges); in REPLICATE it streams
appends optimistically, at most `max_inflight` unacknowledged at once (pipelining); in
SNAPSHOT (`snapshot` > 0) it has sent its snapshot and sends nothing else until the
follower acknowledges it, or until `snapshot_elapsed` says the transfer was lost.

Heartbeat answers come far more often than heartbeats (every ReadIndex round sends one),
so what an answer may trigger (a probe resent, one append past a full window when its
acknowledgements stopped) happens once per heartbeat interval: `beat` says a heartbeat
went out since the last such answer, `acked_since_beat` that appends were acknowledged
meanwhile (the window is moving: no acknowledgement is lost).
"""

from __future__ import annotations

from collections import deque

__all__ = ["Progress"]


class Progress:
    __slots__ = (
        "match",
        "next",
        "replicating",
        "paused",
        "inflight",
        "recent_active",
        "snapshot",
        "snapshot_elapsed",
        "beat",
        "acked_since_beat",
    )

    def __init__(self, next_index: int) -> None:
        self.match = 0
        self.next = next_index
        self.replicating = False
        self.paused = False  # PROBE only: an append is outstanding
        self.inflight: deque[int] = deque()  # REPLICATE only: last index of each unacked append
        self.recent_active = False  # heard from since the last check-quorum round
        self.snapshot = 0  # SNAPSHOT only: index of the snapshot sent (0: not in SNAPSHOT)
        self.snapshot_elapsed = 0  # ticks since it was sent
        self.beat = False  # a heartbeat went out since the last answer that acted on one
        self.acked_since_beat = False  # an append was acknowledged since then

    def become_probe(self) -> None:
        self.replicating = False
        self.paused = False
        self.inflight.clear()
        self.snapshot = 0
        self.next = self.match + 1

    def become_replicate(self) -> None:
        self.replicating = True
        self.paused = False
        self.inflight.clear()
        self.snapshot = 0
        self.next = self.match + 1

    def become_snapshot(self, index: int) -> None:
        """The snapshot up to `index` is on its way: wait for its acknowledgement."""
        self.replicating = False
        self.paused = False
        self.inflight.clear()
        self.snapshot = index
        self.snapshot_elapsed = 0
        self.next = index + 1

    def offer_state(self, index: int) -> None:
        """Our snapshot up to `index` (at most `match`) is on its way to a follower that
        lost its state and kept its log: wait for its acknowledgement, then probe on from
        `match`, which the install leaves as it was."""
        self.replicating = False
        self.paused = False
        self.inflight.clear()
        self.snapshot = index
        self.snapshot_elapsed = 0
        self.next = self.match + 1

    def can_send(self, max_inflight: int) -> bool:
        if self.snapshot:
            return False
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
            self.acked_since_beat = True
        if self.snapshot and index >= self.snapshot:
            self.snapshot = 0  # installed: the caller moves on to replicating
        if index <= self.match:
            return False
        self.match = index
        self.next = max(self.next, index + 1)
        return True

    def rejected(self, rejected: int, next_hint: int) -> bool:
        """A follower refused an append whose previous index was `rejected`.

        Returns False when the refusal is stale (it answers an append sent before a
        later one already moved us on, or before the snapshot now on its way), so the
        caller ignores it.

        A probe refused at `match` itself means the follower no longer holds what it
        once acknowledged (its disk was replaced), or that the refusal is a duplicate of
        an older one. Either way `match` starts over from 0, which is always safe (it
        only delays commitment) and lets the probe walk below the old match; a healthy
        follower's next acknowledgement restores it.
        """
        if self.snapshot:
            return False
        if self.replicating:
            if rejected <= self.match:
                return False
        elif rejected != self.next - 1:
            return False
        if rejected <= self.match:
            self.match = 0
        self.become_probe()
        self.next = max(min(next_hint, rejected), self.match + 1)
        return True

    def lost(self, next_hint: int) -> None:
        """The follower says its log ends before `match` (its disk was replaced): forget
        the match and probe from where its log ends. Ignored while a snapshot is on its
        way (the follower holds nothing until it is installed), and when already probing
        from there (every heartbeat answer says it again: a probe under way stays the
        one outstanding)."""
        if self.snapshot:
            return
        if not self.replicating and self.match == 0 and self.next == max(1, next_hint):
            return
        self.match = 0
        self.become_probe()
        self.next = max(1, next_hint)

    def beat_answered(self, max_inflight: int) -> bool:
        """A heartbeat answer arrived. True for the first one after a heartbeat went out:
        the probe may be resent, and a full window whose acknowledgements stopped lets one
        append more through (an acknowledgement may have been lost). False for the rest:
        they change nothing here."""
        if not self.beat:
            return False
        self.beat = False
        self.paused = False
        if (self.replicating and len(self.inflight) >= max_inflight
                and not self.acked_since_beat):
            self.inflight.popleft()
        self.acked_since_beat = False
        return True

    def snapshot_tick(self, retry_ticks: int) -> bool:
        """One tick in SNAPSHOT; True when the transfer is given up as lost (back to
        PROBE, so the next contact sends the snapshot again)."""
        self.snapshot_elapsed += 1
        if self.snapshot_elapsed < retry_ticks:
            return False
        self.become_probe()
        return True

    def __repr__(self) -> str:
        if self.snapshot:
            state = f"snapshot {self.snapshot}"
        else:
            state = "replicate" if self.replicating else ("probe-paused" if self.paused else "probe")
        return f"Progress(match={self.match}, next={self.next}, {state}, inflight={len(self.inflight)})"
