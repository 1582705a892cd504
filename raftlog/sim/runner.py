"""One seeded history: a safety phase (faults on, every checker after every step), then
two liveness phases with explicit bounds of virtual time:

1. a majority that can talk elects (groups whose membership never changes): faults off,
   every node restarted, every damaged entry repaired from a peer and every refilling
   replica refilled (each within its own bound), then the leader (or, without one, some voter) is cut off alone. Within `ELECT_WITHIN` election timeouts (plus message, fsync and catch-up
   time) a node of the majority must lead (in a newer term, when the cut-off node led)
   and, with check-quorum on, the cut-off node must have stopped acting as leader.
   Then clients that need applied state, within the same bound: a ReadIndex read asked
   the moment the new leader is seen (its answer may not be below anything committed
   by then), and a produce-then-read (propose to the new leader, wait until the entry
   is applied there, read: answered at or after that entry, and applied; asked again
   of the next leader if that one loses its term);
2. heal, restart, faults off: the group must commit and apply a new entry on every
   member within a bound.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

from raftlog.sim import network
from raftlog.sim.cluster import Cluster, FaultStats, SimNode, load_core
from raftlog.sim.invariants import Checker, Violation
from raftlog.sim.knobs import Knobs, nodes_for_seed
from raftlog.sim.nemesis import Nemesis
from raftlog.sim.workload import Workload
from raftlog.types import ReadState, Role

__all__ = ["ELECT_WITHIN", "RunResult", "replay_command", "run_seed"]

ELECT_WITHIN = 10
"""Election timeouts within which a majority that can talk has a leader (randomized
timeouts in [T, 2T) and PreVote make a few split rounds possible, never many)."""
_READ_IDS = 1 << 40  # the liveness client's ReadIndex ids, apart from the workload's


@dataclass
class RunResult:
    seed: int
    nodes: int
    steps: int  # safety-phase steps asked for
    events: int  # steps actually run, both phases
    virtual_ms: float
    elapsed_s: float
    digest: str
    committed: int
    faults: FaultStats
    knobs: Knobs
    disabled: tuple[str, ...] = ()
    liveness_ms: float | None = None  # virtual time from healing to the probe applied everywhere
    violation: str | None = None
    invariant: str | None = None
    phase: str | None = None
    failed_at_step: int | None = None
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.violation is None

    @property
    def replay(self) -> str:
        return replay_command(self.seed, self.steps, self.nodes, self.knobs.mutation, self.disabled)

    def to_json(self) -> dict[str, object]:
        out = {k: v for k, v in asdict(self).items() if k not in ("knobs", "trace")}
        out["replay"] = self.replay
        return out


def replay_command(
    seed: int, steps: int, nodes: int, mutation: str | None, disable: Collection[str] = ()
) -> str:
    cmd = f"python -m raftlog.sim --seed {seed} --steps {steps} --nodes {nodes}"
    cmd += f" --mutation {mutation}" if mutation else ""
    cmd += "".join(f" --disable {name}" for name in disable)
    return cmd + " --verbose"


def run_seed(
    seed: int,
    steps: int = 3000,
    nodes: int | None = None,
    mutation: str | None = None,
    *,
    core: ModuleType | None = None,
    verbose: bool = False,
    log: Callable[[str], None] = print,
    disable: Collection[str] = (),
    **overrides: object,
) -> RunResult:
    """Run one history from `seed`. Knob `overrides` pin fields (hypothesis); `disable`
    names checker classes to leave out (to see what the others catch)."""
    nodes = nodes or nodes_for_seed(seed)
    started = time.perf_counter()
    rng = random.Random(seed)
    cluster_core = core or load_core()
    reconfig_ok = hasattr(cluster_core.RaftNode, "add_learner")
    knobs = Knobs.draw(rng, seed, nodes, mutation, reconfig_supported=reconfig_ok, **overrides)
    if verbose:
        log(f"seed {seed}: {nodes} nodes, {steps} steps, profile {knobs.profile}")
        log(knobs.describe())
    cluster = Cluster(knobs, rng, core=cluster_core, disable=disable)
    nemesis = Nemesis(cluster, rng)
    workload = Workload(cluster, rng)
    nemesis.start()
    workload.start()
    phase = "safety"
    violation: Violation | None = None
    liveness_ms: float | None = None
    try:
        for _ in range(steps):
            cluster.step()
        phase = "liveness"
        nemesis.active = workload.active = False
        _majority_liveness(cluster)
        healed_at = cluster.now
        _liveness(cluster)
        liveness_ms = (cluster.now - healed_at) / 1000
    except Violation as v:
        violation = v
    result = RunResult(
        seed=seed,
        nodes=nodes,
        steps=steps,
        events=cluster.steps,
        virtual_ms=cluster.now / 1000,
        elapsed_s=time.perf_counter() - started,
        digest=cluster.digest.hexdigest(),
        committed=len(cluster.ledger),
        faults=cluster.faults,
        knobs=knobs,
        disabled=tuple(disable),
        liveness_ms=liveness_ms,
    )
    if violation is not None:
        result.violation = str(violation)
        result.invariant = violation.invariant
        result.phase = phase
        result.failed_at_step = cluster.steps + 1
        result.trace = [
            *cluster.trace_lines(),
            "  state at failure:",
            cluster.describe(),
        ]
    if verbose:
        _report(result, cluster, log)
    return result


def _faults_off(cluster: Cluster, why: str) -> None:
    """Heal, restart the crashed, and let every pause run out (a paused node's next
    tick is already scheduled for the pause's end: cutting the pause short would leave
    it without ticks until then)."""
    cluster.net.faults_off()
    cluster.note("liveness", why)
    for node in cluster.nodes.values():
        if not node.up and not node.retired:
            cluster.restart(node)
    until = max((n.paused_until for n in cluster.nodes.values()), default=0)
    while cluster.now < until:
        cluster.step()


def _catch_up_us(cluster: Cluster) -> int:
    """Elections and fsyncs, plus catch-up of the longest log entry by entry at worst
    (one entry per append and round trip)."""
    k = cluster.knobs
    lag = max(len(n.store.log) for n in cluster.nodes.values()) + 1
    per_entry = (2 * k.latency_max_us + k.fsync_max_us + k.tick_us) // max(
        1, min(k.max_inflight, 8)
    )
    return lag * per_entry


def _majority_liveness(cluster: Cluster) -> None:
    """Phase 1 of the module docstring: cut off the leader; the rest must elect one, the
    cut-off one must step down, and a produce-then-read on the new leader must work."""
    k = cluster.knobs
    _faults_off(cluster, "faults off, restart all")
    if k.reconfig:
        # Not judged with membership changes: a voter whose log holds an uncommitted
        # change removing itself neither campaigns nor votes for the shorter logs
        # around it, so the rest can need the cut-off node back (seen at seed 130).
        return
    voters = sorted(i for i in cluster.committed_members.members
                    if i in cluster.nodes and not cluster.nodes[i].retired)
    if len(voters) < 3:
        return  # nobody can be cut off with a majority left
    _repair_all(cluster)
    _refill_all(cluster)
    leaders = [n for n in cluster.leaders() if n.id in voters]
    victim = max(leaders, key=lambda n: n.raft.term) if leaders else cluster.nodes[voters[0]]
    cut_term = victim.raft.term
    cluster.net.partition("cut-leader", network.isolate(sorted(cluster.nodes), victim.id))
    cluster.note("liveness", f"node {victim.id} cut off in term {cut_term}")
    bound = (ELECT_WITHIN * k.election_timeout_us + 4 * (k.latency_max_us + k.fsync_max_us)
             + _catch_up_us(cluster))
    deadline = cluster.now + bound

    led = victim.raft.role == Role.LEADER

    def new_leader() -> SimNode | None:
        """A leader in the majority; in a newer term when the victim led (its own)."""
        for n in cluster.leaders():
            if n.id != victim.id and n.id in voters and (n.raft.term > cut_term or not led):
                return n
        return None

    def stale() -> bool:  # without check-quorum a cut-off leader waits for a newer term
        r = victim.raft
        return k.check_quorum and r is not None and r.role == Role.LEADER and r.term <= cut_term

    while (leader := new_leader()) is None or stale():
        if cluster.now >= deadline:
            what = ("no node of the majority became leader" if leader is None else
                    f"node {victim.id}, cut off, still acts as leader in term {victim.raft.term}")
            raise Violation("liveness-election",
                            f"{what} within {bound / 1000:.0f}ms of virtual time "
                            f"({ELECT_WITHIN} election timeouts and catch-up)")
        cluster.step()
    _produce_then_read(cluster, new_leader, cluster.now + bound)
    cluster.net.heal()


def _repair_all(cluster: Cluster) -> None:
    """Start phase 1's clock with no damaged entry on any disk: a replica holding one
    does not campaign and is frozen while it is the next to apply (the core's promise),
    and its repair may need the very node about to be cut off (seen at seeds 20, 224).

    Every replica is told what its disk holds damaged (as a scrub or its check at open
    would find it, not only once a read trips on it) and, all healed, must repair each
    from a peer's copy within one repair round trip and two election timeouts (retries
    come every election timeout)."""
    k = cluster.knobs
    for node in cluster.live:
        if node.store.corrupt and node.store.verify and hasattr(node.raft, "entry_unreadable"):
            for index in sorted(node.store.corrupt):
                node.raft.entry_unreadable(index)
            node.drain()
    bound = 2 * k.election_timeout_us + 4 * k.latency_max_us
    deadline = cluster.now + bound

    def awaiting() -> dict[int, list[int]]:
        return {n.id: sorted(n.raft.unreadable) for n in cluster.live
                if getattr(n.raft, "unreadable", ())}

    while waiting := awaiting():
        if cluster.now >= deadline:
            raise Violation("liveness-repair",
                            f"entries still awaiting repair {waiting} within "
                            f"{bound / 1000:.0f}ms of virtual time, every peer reachable")
        cluster.step()
    cluster.note("liveness", "no damaged entry left")


def _refill_all(cluster: Cluster) -> None:
    """Start phase 1's clock with no replica refilling, for the same reason as
    `_repair_all`: a refilling replica does not campaign, only a leader refills it, and
    the entries it needs may be held by the very node about to be cut off alone (seen at
    seed 268: both others refilling; they rightly wait for it rather than give up what
    it holds). All healed, a leader must refill every replica within the election and
    catch-up bound. Likewise for replicas that lost their state: a leader must send them
    one within that bound (a stateless leader serves no reads)."""
    k = cluster.knobs
    bound = (ELECT_WITHIN * k.election_timeout_us + 4 * (k.latency_max_us + k.fsync_max_us)
             + _catch_up_us(cluster))
    deadline = cluster.now + bound

    def refilling() -> list[int]:
        return sorted(n.id for n in cluster.live if getattr(n.raft, "refilling", False))

    def stateless() -> list[int]:
        return sorted(n.id for n in cluster.live if getattr(n.raft, "stateless", False))

    while (waiting := refilling()) or (lost := stateless()):
        if cluster.now >= deadline:
            if waiting:
                raise Violation("liveness-refill",
                                f"replicas {waiting} still refilling {bound / 1000:.0f}ms of "
                                "virtual time after healing, every peer reachable")
            raise Violation("liveness-state",
                            f"replicas {lost} still without a state {bound / 1000:.0f}ms of "
                            "virtual time after healing, every peer reachable")
        cluster.step()
    cluster.note("liveness", "no replica refilling or without a state")


class _Reads(Checker):
    """Catches the ReadIndex answers to the liveness client's requests."""

    def __init__(self) -> None:
        self.got: dict[int, tuple[int, int]] = {}  # request id -> (node, read index)

    def on_read(self, node: SimNode, read: ReadState) -> None:
        if read.id >= _READ_IDS:  # answers to this phase's client only
            self.got[read.id] = (node.id, read.index)


def _produce_then_read(
    cluster: Cluster, find_leader: Callable[[], SimNode | None], deadline: int
) -> None:
    """Clients that need applied state, on the new leader, before `deadline`: a ReadIndex
    read asked at once, then a propose, a wait until the entry is applied there, and a
    second read, answered at or after the entry and applied. A leader that changes
    (node or term) meanwhile drops its pending reads: they are asked again, as a client
    retries, of whichever node leads then."""
    data = b"liveness-read:%d" % cluster.now
    index = 0
    reads = _Reads()
    cluster.read_hooks.append(reads)
    ids = iter(range(_READ_IDS + 4 * cluster.steps, _READ_IDS + 4 * cluster.steps + 10**6))
    first = second = -1  # ids of the read asked at once and of the read after the entry
    serving: tuple[int, int] | None = None  # (node, term) the reads were asked of
    next_try = cluster.now

    def ask(node: SimNode) -> int:
        rid = next(ids)
        cluster.call(node, lambda raft: raft.read_index(rid))
        cluster.read_requested(node, rid)  # ReadIndexFresh judges its answer
        return rid

    try:
        while True:
            if cluster.now >= deadline:
                raise Violation(
                    "liveness-read",
                    f"reads on the new leader not done in time (client entry "
                    f"{index or 'not committed'}, first read "
                    f"{'answered' if first in reads.got else 'not answered'}, read after "
                    f"the entry {'answered' if second in reads.got else 'not answered'})")
            leader = find_leader()
            if leader is not None and serving != (leader.id, leader.raft.term):
                serving = (leader.id, leader.raft.term)
                try:
                    first = ask(leader)
                    second = -1
                except (cluster.core.NotLeader, cluster.core.ProposalDropped):
                    serving = None
            if leader is not None and not index and cluster.now >= next_try:
                next_try = cluster.now + cluster.knobs.election_timeout_us
                try:
                    cluster.call(leader, _proposer(data))
                except (cluster.core.NotLeader, cluster.core.ProposalDropped):
                    pass
            if not index:
                index = next((e.index for e in cluster.ledger.entries if e.data == data), 0)
            if (leader is not None and index and leader.applied >= index and second < 0
                    and serving == (leader.id, leader.raft.term)):
                try:
                    second = ask(leader)
                except (cluster.core.NotLeader, cluster.core.ProposalDropped):
                    serving = None
            answer = reads.got.get(second)
            if answer is not None and first in reads.got:
                node, at = answer
                if at < index:
                    raise Violation("liveness-read", f"node {node} answered the read at {at}, "
                                    f"before the client's own applied entry {index}")
                if cluster.nodes[node].applied >= at:
                    return
            cluster.step()
    finally:
        cluster.read_hooks.remove(reads)


def _liveness(cluster: Cluster) -> None:
    """Heal everything, restart the crashed, turn faults off; then a leader must commit a
    new entry and every member must apply it (and so everything committed before it)."""
    k = cluster.knobs
    cluster.net.faults_off()
    cluster.note("liveness", "heal all, restart all, faults off")
    for node in cluster.nodes.values():
        node.paused_until = 0
        if not node.up and not node.retired:
            cluster.restart(node)
    # Bound: elections and fsyncs, plus catch-up of the longest log entry by entry at
    # worst (one entry per append and round trip).
    lag = max(len(n.store.log) for n in cluster.nodes.values()) + 1
    per_entry = (2 * k.latency_max_us + k.fsync_max_us + k.tick_us) // max(
        1, min(k.max_inflight, 8)
    )
    deadline = cluster.now + 60 * k.election_timeout_us + lag * per_entry
    probe = _Probe(cluster)
    while True:
        if probe.done():
            return
        if cluster.now >= deadline:
            raise Violation(
                "liveness",
                f"no new entry committed and applied on all members within "
                f"{(deadline - probe.started) / 1000:.0f}ms of virtual time after healing "
                f"(members {sorted(cluster.committed_members.members)}, "
                f"probes {probe.attempts})",
            )
        probe.maybe_propose()
        cluster.step()


class _Probe:
    """Proposes fresh entries to the leader until one is applied by every member."""

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster
        self.started = cluster.now
        self.attempts = 0
        self.payloads: set[bytes] = set()
        self.applied: dict[bytes, set[int]] = {}
        self._next = cluster.now
        self._scanned = 0
        self.target = 0  # index of a committed probe entry

    def maybe_propose(self) -> None:
        if self.c.now < self._next:
            return
        self._next = self.c.now + self.c.knobs.election_timeout_us
        for node in self.c.leaders():
            data = b"liveness:%d" % self.attempts
            try:
                self.c.call(node, _proposer(data))
            except (self.c.core.NotLeader, self.c.core.ProposalDropped):
                continue
            self.attempts += 1
            self.payloads.add(data)
            self.c.note("probe", data)

    def done(self) -> bool:
        ledger = self.c.ledger.entries
        for e in ledger[self._scanned :]:
            if e.data in self.payloads:
                self.target = e.index
        self._scanned = len(ledger)
        target = self.target
        if not target:
            return False
        members = self.c.committed_members.members
        return all(
            (n := self.c.nodes.get(m)) is not None
            and n.up
            and n.applied >= target
            and not getattr(n.raft, "unreadable", ())  # every repair done
            for m in members
        )


def _report(result: RunResult, cluster: Cluster, log: Callable[[str], None]) -> None:
    f = result.faults
    log(
        f"seed {result.seed}: {result.events} steps, {result.virtual_ms:.0f}ms virtual, "
        f"{result.elapsed_s:.2f}s, committed {result.committed}, faults {asdict(f)}, "
        f"net {asdict(cluster.net.stats)}"
    )
    if result.violation is None:
        log(f"seed {result.seed}: ok, digest {result.digest}")
        return
    log("trace (most recent last):")
    for line in result.trace:
        log(line)
    log(
        f"VIOLATION in the {result.phase} phase at step {result.failed_at_step}: {result.violation}"
    )
    log(f"replay: {result.replay}")


def _proposer(data: bytes) -> Callable[[Any], Any]:
    return lambda raft: raft.propose(data)


def _reader(request_id: int) -> Callable[[Any], Any]:
    return lambda raft: raft.read_index(request_id)
