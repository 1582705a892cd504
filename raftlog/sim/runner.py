"""One seeded history: a safety phase (faults on, every checker after every step), then
a liveness phase (heal, restart, faults off: the group must commit and apply a new entry
on every member within a bound of virtual time).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

from raftlog.sim.cluster import Cluster, FaultStats, load_core
from raftlog.sim.invariants import Violation
from raftlog.sim.knobs import Knobs, nodes_for_seed
from raftlog.sim.nemesis import Nemesis
from raftlog.sim.workload import Workload

__all__ = ["RunResult", "replay_command", "run_seed"]


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
