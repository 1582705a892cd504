"""The registered duties, and what starts and stops them as this node's leaderships change.

`DUTIES` lists every leader-side duty (`broker.duties.base.Duty`), as `PARTS` lists the
parts of the state: a new duty is a class added here, and the node runs it for every
group it leads without any other change.

`LeaderDuties` holds one instance of each for the node. For each hosted group it leads
it opens a cancel scope (in its own nursery: structured concurrency, nothing outlives the
node), waits until the group is ready (`GroupRuntime.is_ready`: an entry of the new
term applied, so the state holds everything an earlier leader committed), then runs
every duty's `run(gid)` in it. When the node stops leading the group (a follower again,
a newer term, the replica dropped), the scope is cancelled. It looks again whenever a
group's role changes (`leadership_changed`, the runtime's `on_change`) and every
`RECHECK_S` in case a change came between two looks.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from broker.duties.base import Duty, DutyHost
from broker.duties.retention import Retention
from broker.duties.timers import DelayedDelivery
from broker.duties.transactions import TxTasks
from broker.state.statemachine import BrokerState
from raftlog.runtime import GroupRuntime, NotLeader, ProposalDropped, ProposalLost

__all__ = ["DUTIES", "RECHECK_S", "RESTART_PAUSE_S", "LeaderDuties"]

log = logging.getLogger("raftmq.duties")

#: Every leader-side duty, in the order they start in a group.
DUTIES: tuple[type[Duty], ...] = (TxTasks, Retention, DelayedDelivery)

RECHECK_S = 1.0  # leaderships are looked at this often even without a role change
RESTART_PAUSE_S = 1.0  # a duty that failed runs again after this
_LOST = (NotLeader, ProposalDropped, ProposalLost)

D = TypeVar("D", bound=Duty)


@dataclass(eq=False)
class _Led:
    """A group this node leads in `term`, and the scope its duties run in."""

    g: GroupRuntime[BrokerState]
    term: int
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class LeaderDuties:
    """Every duty of `kinds` for every group this node leads (see the module docstring)."""

    def __init__(self, host: DutyHost, kinds: Sequence[type[Duty]] = DUTIES) -> None:
        self.groups = host.registry
        self.duties: tuple[Duty, ...] = tuple(kind(host) for kind in kinds)
        names = [d.name for d in self.duties]
        if len(set(names)) != len(names) or not all(names):
            raise TypeError(f"duties need distinct names, got {names}")
        self._led: dict[str, _Led] = {}
        # (group, duty name) -> how many runs of it have started and not ended yet (a run
        # cancelled a moment ago may still be ending beside the next term's)
        self._running: Counter[tuple[str, str]] = Counter()
        self._wake = trio.Event()

    def duty(self, kind: type[D]) -> D:
        """This node's instance of duty `kind` (KeyError if it is not registered)."""
        for d in self.duties:
            if type(d) is kind:
                return d
        raise KeyError(kind.__name__)

    def leadership_changed(self) -> None:
        """A group's role, leader or term changed: look again now."""
        self._wake.set()

    def running(self, gid: str) -> frozenset[str]:
        """The names of the duties running for `gid` now (none unless led and ready, or
        a moment after, while cancelled ones end)."""
        return frozenset(name for (g, name), n in self._running.items() if g == gid and n)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve the duties, and start and stop them per group, until cancelled."""
        async with trio.open_nursery() as nursery:
            for duty in self.duties:
                await nursery.start(duty.serve)
            task_status.started()
            while True:
                self._look(nursery)
                with trio.move_on_after(RECHECK_S):
                    await self._wake.wait()
                self._wake = trio.Event()

    def _look(self, nursery: trio.Nursery) -> None:
        """Cancel the duties of groups no longer led as they were, start them for groups
        newly led."""
        for gid, led in list(self._led.items()):
            if not self._leads(gid, led.g, led.term):
                led.scope.cancel()
                del self._led[gid]
        for gid, g in list(self.groups.items()):
            if gid not in self._led and g.is_open and g.is_leader:
                led = self._led[gid] = _Led(g, g.term)
                nursery.start_soon(self._lead, gid, led)

    def _leads(self, gid: str, g: GroupRuntime[BrokerState], term: int) -> bool:
        """Whether this node still leads `gid`, with runtime `g`, in `term`."""
        return (self.groups.get(gid) is g and g.is_open and g.is_leader
                and g.term == term)

    async def _lead(self, gid: str, led: _Led) -> None:
        with led.scope:
            g = led.g
            while not g.is_ready:  # until then the state may lack committed entries
                if not self._leads(gid, g, led.term):
                    return  # the next look cancels the scope
                with trio.move_on_after(RECHECK_S):
                    await g.wait_applied_change()
            log.info("leader duties started", extra={"fields": {
                "group": gid, "term": led.term, "duties": [d.name for d in self.duties]}})
            try:
                async with trio.open_nursery() as nursery:
                    for duty in self.duties:
                        self._running[gid, duty.name] += 1
                        nursery.start_soon(self._run_duty, duty, gid)
            finally:
                if led.scope.cancel_called:
                    log.info("leader duties stopped", extra={"fields": {
                        "group": gid, "term": led.term}})

    async def _run_duty(self, duty: Duty, gid: str) -> None:
        """`duty.run(gid)` until it returns; a failure is logged and it starts again
        after a pause (as long as the group is still led: else the scope is cancelled)."""
        try:
            while True:
                try:
                    await duty.run(gid)
                    return
                except _LOST as exc:  # leadership moved under it: the look stops it
                    log.debug("duty stopped: leadership moved", extra={"fields": {
                        "group": gid, "duty": duty.name, "why": repr(exc)}})
                except Exception:  # a bug in one duty must not take the node down
                    log.exception("duty %s failed in group %s; restarting it", duty.name, gid)
                await trio.sleep(RESTART_PAUSE_S)
        finally:
            self._running[gid, duty.name] -= 1
            if not self._running[gid, duty.name]:
                del self._running[gid, duty.name]
