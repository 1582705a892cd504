"""A simulated Raft group: cores, their shells, disks, network and the virtual clock.

`SimNode` is the shell around one `RaftNode`: it drives the Ready loop exactly as
`raftlog.types` prescribes (hard state durable before messages leave, entries written
before the next event, `persisted()` only once a simulated fsync covers them, committed
entries applied in order, a snapshot from the leader installed in two timed steps --
saved, then log reset and state restored -- with a crash possible in between). Its state
machine is a hash chain over the applied entries, so a snapshot is just the chain value
at an index and any divergence shows. `Cluster` owns everything else and advances one
event per `step()`, running every checker after each one.
"""

from __future__ import annotations

import hashlib
import random
import traceback
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from raftlog.driver import drain
from raftlog.sim.disk import SimStore
from raftlog.sim.events import EventQueue
from raftlog.sim.invariants import Checker, Ledger, Violation, default_checkers
from raftlog.sim.knobs import SHELL_MUTATIONS, Knobs
from raftlog.sim.machine import GENESIS, chain, pack, unpack
from raftlog.sim.network import SimNetwork
from raftlog.types import (
    Entry,
    EntryType,
    HardState,
    Membership,
    Message,
    ReadState,
    Role,
    Snapshot,
)

__all__ = ["Cluster", "FaultStats", "SimNode", "load_core"]


def load_core() -> ModuleType:
    """The real core, imported late so the simulator's pieces load without it."""
    import raftlog.core

    return raftlog.core


@dataclass
class FaultStats:
    crashes: int = 0
    torn_writes: int = 0
    entries_lost: int = 0  # unsynced entries dropped by crashes
    restarts: int = 0
    pauses: int = 0
    partitions: int = 0
    heals: int = 0
    transfers: int = 0
    reconfigs: int = 0
    reads: int = 0
    proposals: int = 0
    leader_changes: int = 0
    wipes: int = 0  # disks replaced (log and snapshot lost, hard state kept)
    snapshots: int = 0  # snapshots taken by a replica (and its log compacted)
    installs: int = 0  # snapshots from a leader installed
    link_drops: int = 0  # "link to X dropped" reports handed to a core
    corruptions: int = 0  # entries damaged on a replica's disk
    states_lost: int = 0  # restarts without the snapshot and state, the log kept
    repairs: int = 0  # of those, repaired from a peer's copy
    refills_abandoned: int = 0  # refills no voter could supply (entries lost everywhere)


class SimNode:
    """The shell of one replica: its disk survives crashes, its core does not."""

    __slots__ = (
        "id",
        "cluster",
        "store",
        "raft",
        "up",
        "retired",
        "paused_until",
        "incarnation",
        "lose_state",
        "applied",
        "applied_term",
        "state",
        "horizon",
        "tick_period",
        "repair_due",
    )

    def __init__(self, cluster: Cluster, node_id: int, hard_state: HardState) -> None:
        self.id = node_id
        self.cluster = cluster
        self.store = SimStore(hard_state)
        self.store.verify = not cluster.serve_corrupt
        self.raft: Any = None
        self.repair_due = False  # a repair attempt is scheduled
        self.up = False
        self.retired = False
        self.paused_until = 0
        self.incarnation = 0
        self.applied = 0
        self.applied_term = 0
        self.state = GENESIS
        self.horizon = 1  # the first entry the state references
        self.lose_state = False  # its snapshot is set aside: it starts stateless
        k = cluster.knobs
        self.tick_period = int(k.tick_us * (1 + cluster.rng.uniform(-k.tick_skew, k.tick_skew)))

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Boot (or reboot) the core from what the disk holds: the state machine from the
        snapshot, if any, then the log. As `raftlog.runtime` does: a log that does not
        hold the snapshot's entries from its base on (an install or a refill a crash
        interrupted, or an own snapshot ahead of a log that lost its unsynced tail) is
        reset to the base, and the core refills it."""
        c = self.cluster
        store = self.store
        stateless = self.lose_state  # until a snapshot is saved again, restarts included
        if stateless:
            store.snapshot = None  # set aside: the log stays as it is
        snap = store.snapshot
        self.applied, self.applied_term, self.state, self.horizon = 0, 0, GENESIS, 1
        if snap is not None:
            assert snap.base is not None
            b, bt = snap.base
            first, last = store.first_index(), store.last_index()
            whole = first <= b + 1 and snap.index <= last and store.term(snap.index) == snap.term
            if not (whole or ((first, last) == (b + 1, b) and store.term(b) == bt)):
                store.reset_to(b, bt)
            self.applied, self.applied_term = snap.index, snap.term
            self.state, self.horizon = unpack(snap.data)
        if stateless:
            self.horizon = store.first_index()  # no state: it references nothing yet
        self.raft = c.core.RaftNode(
            self.id,
            store,
            store.hard_state,
            c.raft_config,
            rng=random.Random(c.rng.getrandbits(64)),
            applied=self.applied,
            **({"stateless": True} if stateless else {}),
        )
        if snap is not None and hasattr(self.raft, "set_snapshot"):
            self.raft.set_snapshot(snap)
        if store.corrupt and store.verify and hasattr(self.raft, "entry_unreadable"):
            for index in sorted(store.corrupt):  # a check at open finds them (the runtime's verify)
                self.raft.entry_unreadable(index)
        self.up = True
        self.paused_until = 0
        self.repair_due = False
        self.incarnation += 1
        for chk in c.checkers:
            chk.on_start(self)
        if not c.manual:
            c.schedule_tick(self)

    def crash(self, torn: bool) -> int:
        """Kill the process: the core's memory and unsynced writes are gone."""
        self.raft = None
        self.up = False
        self.incarnation += 1
        return self.store.crash(self.cluster.rng if torn else None)

    @property
    def paused(self) -> bool:
        return self.paused_until > self.cluster.now

    # ------------------------------------------------------------------ events

    def tick(self) -> None:
        self.raft.tick()
        self.drain()

    def deliver(self, msg: Message) -> None:
        self.raft.step(msg)
        self.drain()

    def fsync_done(self) -> None:
        store = self.store
        durable = store.finish_sync()
        if durable and not self.cluster.ack_before_fsync:
            self.raft.persisted(durable, store.term(durable))
        self.drain()

    def drain(self) -> None:
        """The Ready loop (`raftlog.driver`, shared with the runtime): run until the core
        has nothing more for the shell, or a step of it killed this node's core."""
        raft = self.raft
        if raft is not None:
            drain(raft, self, alive=lambda: self.raft is raft)
            wanted = getattr(raft, "state_wanted", None) if self.raft is raft else None
            if wanted:
                # a follower lost its state: a fresh snapshot, the log kept, whose state
                # lets go of what that follower's log no longer holds (the runtime's
                # states let go by the replicated retention horizon instead)
                self.horizon = max(self.horizon, min(min(wanted.values()), self.applied + 1))
                if self.take_snapshot(keep=len(self.store.log) + 1) is not None:
                    drain(raft, self, alive=lambda: self.raft is raft)
        if not self.cluster.manual and self.up:
            self._maybe_sync()

    # ------------------------------------------------------------------ the Ready steps

    def save_hard_state(self, hs: HardState) -> None:
        self.store.save_hard_state(hs)

    def install_snapshot(self, snap: Snapshot) -> None:
        self._install(snap)

    def store_entries(self, entries: list[Entry]) -> None:
        self._write(entries)

    def send_message(self, m: Message) -> None:
        c = self.cluster
        for chk in c.send_hooks:
            chk.on_send(self, m)
        c.send(m)

    def apply_entries(self, entries: list[Entry]) -> None:
        c = self.cluster
        for e in entries:
            if e.index != self.applied + 1:
                raise Violation(
                    "apply-order", f"node {self.id} applied {e.index} after {self.applied}"
                )
            self.applied = e.index
            self.applied_term = e.term
            self.state = chain(self.state, e)
            for chk in c.apply_hooks:
                chk.on_apply(self, e)
            if e.type == EntryType.CONFIG:
                c.config_applied(e)

    def answer_read(self, read: ReadState) -> None:
        for chk in self.cluster.read_hooks:
            chk.on_read(self, read)

    def fetch_for_repair(self, indexes: list[int]) -> None:
        if not self.repair_due:
            self.repair_due = True
            self.cluster.schedule_repair(self)

    def _write(self, entries: list[Entry]) -> None:
        c = self.cluster
        self.store.append(entries)
        for chk in c.append_hooks:
            chk.on_append(self, entries)
        if c.ack_before_fsync:
            last = entries[-1]
            self.raft.persisted(last.index, last.term)  # the mutation: ack before fsync

    # ------------------------------------------------------------------ snapshots

    def take_snapshot(self, keep: int) -> Snapshot | None:
        """Snapshot the state machine at `applied` and drop the log up to it, except the
        last `keep` entries and whatever is not durable yet. None if nothing is new."""
        store = self.store
        if not self.applied or self.raft.installing is not None:
            return None  # nothing applied, or a newer state is being installed
        if store.snapshot is not None and self.applied <= store.snapshot.index:
            return None
        upto = min(self.applied, store.durable_len) - keep
        # A corrupt entry is repaired from a peer that still holds it: keep what any
        # other replica's disk has damaged (the fault is survivable while a copy is left).
        damaged = [min(n.store.corrupt) for n in self.cluster.nodes.values()
                   if n is not self and n.store.corrupt]
        if damaged:
            upto = min(upto, min(damaged) - 1)
        self.horizon = max(self.horizon, upto + 1)  # the state lets go of what is compacted
        base = self.horizon - 1
        snap = Snapshot(
            self.applied, self.applied_term, pack(self.state, self.horizon),
            self.raft.membership_at(self.applied), (base, store.term(base)),
        )
        store.save_snapshot(snap)
        self.lose_state = False
        self.raft.set_snapshot(snap)
        if upto > store.base[0]:
            store.compact(upto)
        for chk in self.cluster.snapshot_hooks:
            chk.on_snapshot(self, snap)
        return snap

    def _install(self, snap: Snapshot) -> None:
        """Ready.snapshot: save it, then reset the log and restore the state machine from
        it, then tell the core. Scripted runs do it at once; otherwise each step takes
        disk time and a crash may fall in between."""
        c = self.cluster
        c.note("install", (self.id, snap.describe()))
        if c.manual:
            self.store.save_snapshot(snap)
            self.finish_install(snap)
        else:
            c.schedule_install(self, snap)

    def finish_install(self, snap: Snapshot) -> None:
        assert snap.base is not None
        if not snap.keep_log:  # else the log already holds what the state references
            self.store.reset_to(*snap.base)
        self.lose_state = False
        self.applied, self.applied_term = snap.index, snap.term
        self.state, self.horizon = unpack(snap.data)
        self.cluster.faults.installs += 1
        for chk in self.cluster.snapshot_hooks:
            chk.on_install(self, snap)
        if snap.lost is not None:
            # an abandoned refill: the entries it names are gone from every log (a
            # checker makes sure no voter could have supplied them), and so from the
            # log of every replica that installs this state from now on
            self.cluster.lost_upto = max(self.cluster.lost_upto, snap.lost[1])
            self.cluster.faults.refills_abandoned += 1
        self.raft.snapshot_installed(snap.index, snap.term)

    def _maybe_sync(self) -> None:
        store = self.store
        if store.durable_len < len(store.log) and not store.syncing:
            store.begin_sync()
            self.cluster.schedule_fsync(self)

    def sync_now(self) -> None:
        """Scripted runs: complete an fsync immediately."""
        if self.store.durable_len < len(self.store.log):
            self.store.begin_sync()
            self.fsync_done()

    def describe(self) -> str:
        if self.retired:
            return f"node {self.id} retired"
        if not self.up:
            return (
                f"node {self.id} down (log {len(self.store.log)}, durable {self.store.durable_len})"
            )
        d = self.raft.describe() if hasattr(self.raft, "describe") else f"node {self.id}"
        return f"{d} durable={self.store.durable_len}" + (" paused" if self.paused else "")


class Cluster:
    """Nodes, network, disks and clock of one simulated group; `step()` advances it."""

    def __init__(
        self,
        knobs: Knobs,
        rng: random.Random,
        *,
        core: ModuleType | None = None,
        manual: bool = False,
        checkers: list[Checker] | None = None,
        disable: Collection[str] = (),
        trace_len: int = 400,
    ) -> None:
        self.knobs = knobs
        self.rng = rng
        self.core = core or load_core()
        self.manual = manual
        self.now = 0
        self.steps = 0
        self.events = EventQueue()
        self.net = SimNetwork(
            rng,
            latency_min_us=knobs.latency_min_us,
            latency_max_us=knobs.latency_max_us,
            drop_p=knobs.drop_p,
            dup_p=knobs.dup_p,
            reorder_p=knobs.reorder_p,
            hold=manual,
        )
        self.ack_before_fsync = knobs.mutation == "ack-before-fsync"
        self.serve_corrupt = knobs.mutation == "serve-corrupt"
        core_mutations = frozenset({knobs.mutation}) - SHELL_MUTATIONS - {None}
        self.raft_config = self.core.RaftConfig(
            election_ticks=knobs.election_ticks,
            heartbeat_ticks=knobs.heartbeat_ticks,
            max_append_bytes=knobs.max_append_bytes,
            max_inflight=knobs.max_inflight,
            check_quorum=knobs.check_quorum,
            pre_vote=knobs.pre_vote,
            preferred_leader=knobs.preferred_leader,
            mutations=core_mutations,
        )
        voters = frozenset(range(1, knobs.nodes + 1))
        self.bootstrap = Membership(voters)
        self.committed_members = self.bootstrap
        self.ledger = Ledger()
        if checkers is None:
            checkers = default_checkers(self.ledger, voters, static=not knobs.reconfig)
        self.checkers = [c for c in checkers if type(c).__name__ not in disable]
        self.step_hooks = _overriding(self.checkers, "on_step")
        self.send_hooks = _overriding(self.checkers, "on_send")
        self.append_hooks = _overriding(self.checkers, "on_append")
        self.apply_hooks = _overriding(self.checkers, "on_apply")
        self.snapshot_hooks = _overriding(self.checkers, "on_snapshot", "on_install")
        self.crash_hooks = _overriding(self.checkers, "on_crash")
        self.read_hooks = _overriding(self.checkers, "on_read")
        self.read_request_hooks = _overriding(self.checkers, "on_read_request")
        self.trace: deque[tuple[int, str, Any]] = deque(maxlen=trace_len)
        self.digest = hashlib.blake2b(digest_size=16)
        self.faults = FaultStats()
        self.nodes: dict[int, SimNode] = {}
        self.live: list[SimNode] = []  # up, not retired: what checkers inspect
        self._roles: dict[int, tuple[int, int]] = {}
        self.on_new_leader: list[Callable[[SimNode], None]] = []
        self._config_applied = 0
        self.lost_upto = 0  # entries up to here were lost by an abandoned refill
        hs = HardState(configs=((0, 0, self.bootstrap),))
        for i in sorted(voters):
            self.nodes[i] = SimNode(self, i, hs)
        for node in self.nodes.values():
            node.start()
        self._refresh_live()

    # ------------------------------------------------------------------ stepping

    def step(self) -> None:
        """Process the next event (a delivery, tick, fsync, client or fault action)."""
        t_ev = self.events.peek_time()
        t_net = self.net.next_time()
        try:
            if t_net is not None and (t_ev is None or t_net <= t_ev):
                self.now = t_net
                self._deliver_next()
            elif t_ev is not None:
                at, fn, args = self.events.pop()
                self.now = at
                fn(*args)
            else:
                raise Violation("liveness", "nothing left to happen: no ticks, no messages")
        except Violation:
            raise
        except Exception as exc:
            tb = "".join(traceback.format_exception(exc, limit=-4))
            raise Violation("core-exception", f"{type(exc).__name__}: {exc}\n{tb}") from exc
        self.steps += 1
        self.check()

    def check(self) -> None:
        """Note role changes in the trace, then run every checker."""
        roles = self._roles
        for node in self.live:
            raft = node.raft
            rt = (raft.role, raft.term)
            if roles.get(node.id) != rt:
                roles[node.id] = rt
                self.note("role", (node.id, raft.role.name, raft.term))
                if raft.role == Role.LEADER:
                    self.faults.leader_changes += 1
                    for fn in self.on_new_leader:
                        fn(node)
        for chk in self.step_hooks:
            chk.on_step(self)

    def run_until(self, until: int) -> None:
        while self.now < until:
            nxt = _min_time(self.events.peek_time(), self.net.next_time())
            if nxt is None or nxt > until:
                break
            self.step()

    def note(self, kind: str, what: Any) -> None:
        self.trace.append((self.now, kind, what))

    # ------------------------------------------------------------------ network

    def send(self, msg: Message) -> None:
        self.net.send(msg, self.now)

    def _deliver_next(self) -> None:
        msg = self.net.pop()
        if msg is None:
            return
        node = self.nodes.get(msg.dst)
        if node is None or not node.up or node.retired:
            self.net.stats.cut += 1
            return
        if node.paused_until > self.now:
            self.net.defer(msg, node.paused_until)
            return
        self.deliver(msg)

    def deliver(self, msg: Message) -> None:
        """Hand one message to its destination (scripts call this directly)."""
        self.net.stats.delivered += 1
        self.digest.update(msg.describe().encode())
        self.note("deliver", msg)
        self.nodes[msg.dst].deliver(msg)

    # ------------------------------------------------------------------ timers

    def schedule_tick(self, node: SimNode) -> None:
        p = node.tick_period
        self.events.push(
            self.now + self.rng.randint(p - p // 50, p + p // 50),
            self._tick,
            node,
            node.incarnation,
        )

    def _tick(self, node: SimNode, incarnation: int) -> None:
        if node.incarnation != incarnation or not node.up or node.retired:
            return
        if node.paused_until > self.now:
            self.events.push(node.paused_until, self._tick, node, incarnation)
            return
        node.tick()
        self.schedule_tick(node)

    def schedule_fsync(self, node: SimNode) -> None:
        k = self.knobs
        at = self.now + self.rng.randint(k.fsync_min_us, k.fsync_max_us)
        self.events.push(at, self._fsync, node, node.incarnation)

    def _fsync(self, node: SimNode, incarnation: int) -> None:
        if node.incarnation != incarnation or not node.up or node.retired:
            return
        if node.paused_until > self.now:
            self.events.push(node.paused_until, self._fsync, node, incarnation)
            return
        self.note("fsync", (node.id, node.store.durable_len, len(node.store.log)))
        node.fsync_done()

    def schedule_repair(self, node: SimNode) -> None:
        """Fetch a peer's copy of every entry the node's core awaits (`Ready.repair`),
        one round trip from now; again every election timeout while some remain."""
        self.events.push(self.now + 2 * self.knobs.latency_max_us, self._repair, node,
                         node.incarnation)

    def _repair(self, node: SimNode, incarnation: int) -> None:
        if node.incarnation != incarnation or not node.up or node.retired:
            return  # a restarted core lists what it awaits again
        if node.paused_until > self.now:
            self.events.push(node.paused_until, self._repair, node, incarnation)
            return
        st = node.store
        for index in sorted(node.raft.unreadable):
            if index not in st.corrupt:
                node.raft.entry_repaired(index)  # overwritten or dropped meanwhile
                continue
            for peer in self.nodes.values():
                blocked = self.net.blocked
                if (peer is node or peer.retired or not peer.up
                        or (node.id, peer.id) in blocked or (peer.id, node.id) in blocked):
                    continue
                good = peer.store.readable(index)
                if good is not None and st.repair(index, good):
                    self.faults.repairs += 1
                    self.note("repair", (node.id, index, peer.id))
                    node.raft.entry_repaired(index)
                    break
        node.repair_due = bool(node.raft.unreadable)
        if node.repair_due:
            self.events.push(self.now + self.knobs.election_timeout_us, self._repair, node,
                             incarnation)
        node.drain()

    def schedule_install(self, node: SimNode, snap: Snapshot) -> None:
        k = self.knobs
        at = self.now + self.rng.randint(k.fsync_min_us, k.fsync_max_us)
        self.events.push(at, self._install_saved, node, node.incarnation, snap)

    def _install_saved(self, node: SimNode, incarnation: int, snap: Snapshot) -> None:
        if node.incarnation != incarnation or not node.up or node.retired:
            return
        if node.paused_until > self.now:
            self.events.push(node.paused_until, self._install_saved, node, incarnation, snap)
            return
        node.store.save_snapshot(snap)
        node.lose_state = False  # a restart now finds this snapshot
        k = self.knobs  # restoring the state and resetting the log take disk time too
        at = self.now + self.rng.randint(k.fsync_min_us, k.fsync_max_us)
        self.events.push(at, self._install_done, node, incarnation, snap)

    def _install_done(self, node: SimNode, incarnation: int, snap: Snapshot) -> None:
        if node.incarnation != incarnation or not node.up or node.retired:
            return
        if node.paused_until > self.now:
            self.events.push(node.paused_until, self._install_done, node, incarnation, snap)
            return
        self.note("installed", (node.id, snap.index))
        node.finish_install(snap)
        node.drain()

    # ------------------------------------------------------------------ node control

    def crash(self, node: SimNode, *, torn: bool = False) -> None:
        if not node.up:
            return
        unsynced = node.store.unsynced
        lost = node.crash(torn)
        self.faults.crashes += 1
        self.faults.torn_writes += torn and unsynced > 0
        self.faults.entries_lost += lost
        self.note(
            "crash", (node.id, f"lost {lost} of {unsynced} unsynced" + (" (torn)" if torn else ""))
        )
        self._refresh_live()
        for chk in self.crash_hooks:
            chk.on_crash(self, node)
        if self.knobs.link_drop_on_crash:
            # The kernel closes a killed process's sockets: its peers see EOF about one
            # network latency later (fixed: the seed's PRNG stream stays as it was).
            for other in self.live:
                self.events.push(self.now + self.knobs.latency_min_us, self._link_lost,
                                 other, other.incarnation, node.id)

    def drop_link(self, a: int, b: int) -> None:
        """The connection between `a` and `b` breaks: what was in flight on it is lost,
        and each live end is told the other is unreachable."""
        self.net.take(lambda m: {m.src, m.dst} == {a, b})
        self.note("link-drop", (a, b))
        for here, there in ((a, b), (b, a)):
            node = self.nodes.get(here)
            if node is not None and node.up and not node.retired:
                self._link_lost(node, node.incarnation, there)

    def _link_lost(self, node: SimNode, incarnation: int, peer: int) -> None:
        if node.incarnation != incarnation or not node.up or node.retired:
            return
        if node.paused_until > self.now:
            self.events.push(node.paused_until, self._link_lost, node, incarnation, peer)
            return
        lost = getattr(node.raft, "leader_unreachable", None)
        if lost is None:
            return  # a core without the event: nothing to tell
        self.faults.link_drops += 1
        lost(peer)
        node.drain()

    def wipe(self, node: SimNode) -> None:
        """Replace a replica's disk: crash it, lose its log, snapshot and state machine,
        keep its hard state (term and vote) with the membership it was configured with.
        The nemesis decides when that is a fault Raft must survive."""
        if node.retired:
            return
        self.crash(node)
        node.incarnation += 1
        st = node.store
        st.wipe()
        node.lose_state = False  # nothing left to set aside: an empty replica
        st.hard_state = HardState(st.hard_state.term, st.hard_state.vote,
                                  ((0, 0, self.committed_members),))
        self.faults.wipes += 1
        self.note("wipe", node.id)
        for chk in self.crash_hooks:
            chk.on_crash(self, node)

    def restart(self, node: SimNode) -> None:
        if node.up or node.retired:
            return
        self.faults.restarts += 1
        self.note("restart", (node.id, len(node.store.log)))
        node.start()
        self._refresh_live()

    def pause(self, node: SimNode, until: int) -> None:
        if node.up:
            self.faults.pauses += 1
            node.paused_until = max(node.paused_until, until)
            self.note("pause", (node.id, until))

    def add_node(self, node_id: int) -> SimNode:
        """A fresh replica joining as a learner. Its log is empty; the leader replicates
        everything to it, or a snapshot. Like the original members it starts from the
        group's bootstrap membership, which the log's history starts from, and learns its
        own from the CONFIG entry (or snapshot) that names it: bootstrapped with that
        membership instead, it would misreport what was in force before the entry."""
        hs = HardState(configs=((0, 0, self.bootstrap),))
        node = self.nodes[node_id] = SimNode(self, node_id, hs)
        self.note("join", node_id)
        node.start()
        self._refresh_live()
        return node

    def config_applied(self, e: Entry) -> None:
        """A membership change is committed: replicas it removed shut down for good."""
        if e.index <= self._config_applied:
            return
        self._config_applied = e.index
        new = Membership.decode(e.data)
        for nid in sorted(self.committed_members.members - new.members):
            node = self.nodes.get(nid)
            if node is not None and not node.retired:
                self.note("retire", nid)
                node.retired = True
                node.up = False
                node.raft = None
                node.incarnation += 1
        self.committed_members = new
        self._refresh_live()

    def _refresh_live(self) -> None:
        self.live = [n for n in self.nodes.values() if n.up and not n.retired]

    # ------------------------------------------------------------------ client calls

    def call(self, node: SimNode, fn: Callable[[Any], Any]) -> Any:
        """Run a client call against a node's core, then let the shell act on it."""
        try:
            return fn(node.raft)
        finally:
            node.drain()

    def read_requested(self, node: SimNode, request_id: int) -> None:
        for chk in self.read_request_hooks:
            chk.on_read_request(node, request_id)

    # ------------------------------------------------------------------ views

    def leaders(self) -> list[SimNode]:
        return [n for n in self.live if n.raft.role == Role.LEADER and not n.paused]

    def describe(self) -> str:
        return "\n".join(f"  {n.describe()}" for n in self.nodes.values())

    def trace_lines(self, last: int = 80) -> Iterator[str]:
        items = list(self.trace)[-last:]
        for at, kind, what in items:
            text = what.describe() if isinstance(what, Message) else what
            yield f"  {at / 1000:10.3f}ms {kind:8} {text}"


def _overriding(checkers: list[Checker], *hooks: str) -> list[Checker]:
    """The checkers that override any of `hooks`, in order."""
    return [
        c for c in checkers if any(getattr(type(c), h) is not getattr(Checker, h) for h in hooks)
    ]


def _min_time(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
