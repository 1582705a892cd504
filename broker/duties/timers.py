"""Delayed delivery: the leader proposes "due up to now" when a delayed message falls due.

The pending messages and the moves are the state machine's (`broker.state.parts.timers`);
this duty only watches the clock. While it leads a group it sleeps until the earliest
pending message's due time (or until an applied entry may have brought an earlier one),
then proposes `DeliverDue(now)` with its clock *after* waking, so no move is ever
proposed before its messages are due by this node's clock. A new leader needs no
recovery: the pending set is in its state, and whatever an old leader's proposals
already moved is gone from it.

Lateness is the wake-up plus one commit: `LATE_SLACK_S` of oversleep at most, then a
Raft round trip. It is measured where it is felt, by consumers (`bench.delay`).
"""

from __future__ import annotations

import time

import trio

from broker.duties.base import Duty, DutyHost
from broker.state.parts.timers import DeliverDue, ForgetPending
from raftlog.types import EntryType

__all__ = ["DelayedDelivery", "MOVE_LIMIT"]

MOVE_LIMIT = 8192  # messages one DeliverDue moves at most: one apply stays short
IDLE_CHECK_S = 1.0  # with nothing pending, look again this often (besides applied entries)


class DelayedDelivery(Duty):
    """Propose `DeliverDue` for a led group whenever its earliest pending message is due."""

    name = "timers"

    def __init__(self, host: DutyHost) -> None:
        super().__init__(host)
        self.groups = host.registry

    async def run(self, gid: str) -> None:
        if "volatile-timers" in self.groups.states[gid].mutations:
            # Deliberately wrong (chaos tests only): a new leader knows nothing pending
            await self.groups[gid].propose(ForgetPending().encode(), EntryType.CONTROL)
        while True:
            g = self.groups.get(gid)
            if g is None or not g.is_open:
                return
            timers = self.groups.states[gid].timers
            due = timers.next_due()
            now_ms = time.time() * 1000
            if due is None or due > now_ms:
                wait_s = IDLE_CHECK_S if due is None else min(IDLE_CHECK_S,
                                                              (due - now_ms) / 1000)
                # an applied entry may hold a message due sooner than what we wait for
                with trio.move_on_after(max(wait_s, 0.0)):
                    while timers.next_due() == due:
                        await g.wait_applied_change()
                continue
            now = int(time.time() * 1000)
            if now < due:  # the clock (ms) has not quite reached it
                await trio.sleep((due - now) / 1000)
                continue
            await g.propose(DeliverDue(now, MOVE_LIMIT).encode(), EntryType.CONTROL)
