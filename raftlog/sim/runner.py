"""One seeded history: a safety phase (faults on, every checker after every step), then
two liveness phases with explicit bounds of virtual time:

1. a majority that can talk elects (groups whose membership never changes): faults off,
   every node restarted, then the leader (or, without one, some voter) is cut off
   alone. Within `ELECT_WITHIN` election timeouts (plus message, fsync and catch-up
   time) a node of the majority must lead (in a newer term, when the cut-off node led)
   and, with check-quorum on, the cut-off node must have stopped acting as leader.
   Then clients that need applied state, within the same bound: a ReadIndex read asked
   the moment the new leader is seen (its answer may not be below anything committed
   by then), and a produce-then-read (propose to the new leader, wait until the entry
   is applied there, read: answered at or after that entry, and applied);
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
    _produce_then_read(cluster, leader, cluster.now + bound)
    cluster.net.heal()


class _Reads(Checker):
    """Catches the ReadIndex answers to the liveness client's requests."""

    def __init__(self) -> None:
        self.got: dict[int, tuple[int, int]] = {}  # request id -> (node, read index)

    def on_read(self, node: SimNode, read: ReadState) -> None:
        if read.id >= _READ_IDS:
            self.got[read.id] = (node.id, read.index)


def _produce_then_read(cluster: Cluster, leader: SimNode, deadline: int) -> None:
    """Propose to `leader`, wait until it applied the entry, then read through ReadIndex:
    the answer must come from `leader`, at or after the entry, and be applied there, all
    before `deadline`. A read right after an election needs the new term's first commit."""
    data = b"liveness-read:%d" % cluster.now
    index = 0
    reads = _Reads()
    cluster.read_hooks.append(reads)
    first = _READ_IDS + 2 * cluster.steps  # asked at once: right after the election
    rid = first + 1  # asked once the client's own entry is applied
    asked = False
    try:
        cluster.call(leader, lambda raft: raft.read_index(first))
        cluster.read_requested(leader, first)  # ReadIndexFresh judges its answer
        next_try = cluster.now
        while True:
            if cluster.now >= deadline:
                raise Violation(
                    "liveness-read",
                    f"produce-then-read on new leader {leader.id} not done in time (entry "
                    f"{index or 'not committed'}, applied {leader.applied}, read "
                    f"{'answered' if rid in reads.got else 'asked' if asked else 'not asked'}, "
                    f"first read {'answered' if first in reads.got else 'not answered'})")
            if not index and cluster.now >= next_try:
                next_try = cluster.now + cluster.knobs.election_timeout_us
                try:
                    cluster.call(leader, _proposer(data))
                except (cluster.core.NotLeader, cluster.core.ProposalDropped):
                    pass
            if not index:
                index = next((e.index for e in cluster.ledger.entries if e.data == data), 0)
            if index and leader.applied >= index and not asked:
                cluster.call(leader, lambda raft: raft.read_index(rid))
                cluster.read_requested(leader, rid)
                asked = True
            answer = reads.got.get(rid)
            if answer is not None:
                node, at = answer
                if at < index:
                    raise Violation("liveness-read", f"node {node} answered the read at {at}, "
                                    f"before the client's own applied entry {index}")
                if leader.applied >= at and first in reads.got:
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
