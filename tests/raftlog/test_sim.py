"""The deterministic simulator against the real core: seeded histories with crashes,
torn writes and partitions must show no violation; deliberate bugs must be caught; a seed
must replay exactly.

Scale with SIM_SEEDS (default 1000 histories) and SIM_JOBS (default: 2 processes).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raftlog.core
from raftlog.sim import run_seed, sweep
from raftlog.types import Role, Snapshot

SEEDS = int(os.environ.get("SIM_SEEDS", "1000"))
STEPS = 3000
JOBS = int(os.environ.get("SIM_JOBS", str(min(2, os.cpu_count() or 1))))
CHUNKS = 4
MUTATION_SEEDS = 200
# Catching a deliberate bug means seeing its consequence: committed data overwritten or
# lost (or, for the shell's own lie, an acknowledgement of data not on disk).
LOSS = {"leader-completeness", "committed-entry-changed", "state-machine-safety"}
MUTATIONS = {
    "commit-old-term": LOSS,
    "no-prevote-term-check": LOSS,
    "ack-before-fsync": LOSS | {"committed-entry-lost", "ack-not-durable"},
    # a store that skips its checks hands out what the disk damaged
    "serve-corrupt": {"corrupt-applied", "corrupt-served"},
    # a follower that installs a snapshot keeps none of the entries its state points at
    "snapshot-no-base": {"referenced-entry-dropped", "leader-lacks-referenced-entry"},
}


def _fail_report(summary: object) -> str:
    failures = summary.failures  # type: ignore[attr-defined]
    return "\n".join(
        f"{f['invariant']}: {f['violation']}\n  replay: {f['replay']}" for f in failures
    )


@pytest.mark.parametrize("chunk", range(CHUNKS))
@pytest.mark.live
def test_default_histories_have_no_violations(chunk: int) -> None:
    size = -(-SEEDS // CHUNKS)
    seeds = range(chunk * size, min(SEEDS, (chunk + 1) * size))
    summary = sweep(seeds, STEPS, jobs=JOBS)
    f = summary.faults
    print(
        f"\nseeds {seeds.start}-{seeds.stop - 1}: {summary.seeds} histories, {summary.events} steps"
        f" in {summary.elapsed_s:.1f}s ({summary.steps_per_s:.0f} steps/s), nodes {summary.nodes},"
        f" crashes {f['crashes']}, torn writes {f['torn_writes']}, partitions {f['partitions']},"
        f" pauses {f['pauses']}, leader changes {f['leader_changes']}, wipes {f['wipes']},"
        f" snapshots taken {f['snapshots']} and installed {f['installs']},"
        f" corrupt entries {f['corruptions']} (repaired {f['repairs']}),"
        f" committed {summary.committed}, violations {summary.violations}"
    )
    assert summary.seeds == len(seeds)
    assert f["crashes"] > 0 and f["torn_writes"] > 0 and f["partitions"] > 0
    assert f["snapshots"] > 0 and f["installs"] > 0 and f["wipes"] > 0
    assert f["corruptions"] > 0 and f["repairs"] > 0
    assert summary.violations == 0, _fail_report(summary)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_mutation_is_caught_within_200_seeds(mutation: str) -> None:
    for seed in range(MUTATION_SEEDS):
        r = run_seed(seed, STEPS, mutation=mutation)
        if r.invariant in MUTATIONS[mutation]:
            print(f"\n{mutation}: caught by {r.invariant} at seed {seed} ({seed + 1} seeds)")
            return
    pytest.fail(f"{mutation} survived {MUTATION_SEEDS} seeds")


def test_ack_before_fsync_loses_a_committed_entry_end_to_end() -> None:
    """Without the checker that compares acknowledgements with the disk, the lie must
    still surface as lost committed data once a majority crashes before its fsync."""
    skip = ("DurableBeforeSend",)
    for seed in range(MUTATION_SEEDS):
        r = run_seed(seed, STEPS, mutation="ack-before-fsync", disable=skip)
        if r.invariant in LOSS | {"committed-entry-lost"}:
            print(f"\nack-before-fsync end to end: {r.invariant} at seed {seed}")
            return
    pytest.fail("ack-before-fsync never lost a committed entry")


def test_the_same_seed_gives_the_same_history() -> None:
    for seed in (3, 8):
        a = run_seed(seed, 2000)
        b = run_seed(seed, 2000)
        assert (a.digest, a.events, a.committed, a.faults) == (
            b.digest,
            b.events,
            b.committed,
            b.faults,
        )
    assert run_seed(3, 2000).digest != run_seed(4, 2000).digest


def _cli(*args: str, hashseed: str = "0") -> tuple[int, dict[str, object]]:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    p = subprocess.run(
        [sys.executable, "-m", "raftlog.sim", *args, "--json", "--save", ""],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.live
def test_a_seed_replays_identically_in_other_processes() -> None:
    _, a = _cli("--seed", "11", "--steps", "1500", hashseed="1")
    _, b = _cli("--seed", "11", "--steps", "1500", hashseed="2")
    assert a["run"]["digest"] == b["run"]["digest"]  # type: ignore[index]
    assert a["run"]["digest"] == run_seed(11, 1500).digest  # type: ignore[index]


@pytest.mark.live
def test_a_failing_seed_replays_exactly_from_its_command() -> None:
    r = run_seed(0, STEPS, mutation="no-prevote-term-check")
    assert not r.ok
    cmd = r.replay.split()
    assert cmd[:3] == ["python", "-m", "raftlog.sim"]
    code, out = _cli(*[a for a in cmd[3:] if a != "--verbose"])
    assert code == 1
    run = out["run"]
    assert (run["violation"], run["failed_at_step"], run["digest"]) == (  # type: ignore[index]
        r.violation,
        r.failed_at_step,
        r.digest,
    )


@pytest.mark.live
def test_cli_json_summary() -> None:
    code, out = _cli("--seeds", "4", "--steps", "300", "--nodes", "3")
    for key in ("seeds", "steps", "violations", "first_failing_seed", "steps_per_s", "faults"):
        assert key in out
    assert out["seeds"] == 4 and out["steps"] == 300
    assert code == (0 if out["violations"] == 0 else 1)
    code, out = _cli("--seeds", "3", "--steps", "3000", "--mutation", "no-prevote-term-check")
    assert code == 1 and out["first_failing_seed"] == 0 and out["violations"] >= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    nodes=st.sampled_from([3, 5]),
    drop_p=st.floats(0.0, 0.3),
    dup_p=st.floats(0.0, 0.2),
    reorder_p=st.floats(0.0, 0.8),
    torn_p=st.floats(0.0, 1.0),
    flap_p=st.floats(0.0, 1.0),
    max_append_bytes=st.sampled_from([1, 300, 1 << 20]),
    max_inflight=st.sampled_from([1, 3, 64]),
    pre_vote=st.booleans(),
    check_quorum=st.booleans(),
    fault_mean_us=st.integers(20_000, 500_000),
)
def test_hypothesis_chooses_the_knobs(seed: int, nodes: int, **knobs: object) -> None:
    r = run_seed(seed, 2000, nodes, **knobs)
    assert r.ok, f"{r.violation}\nreproduce: run_seed({seed}, 2000, {nodes}, **{knobs!r})"


def test_liveness_after_heal() -> None:
    """After the faults stop, every history recovers: a leader commits a new entry and
    every member applies it, within the bound."""
    worst = 0.0
    for seed in range(12):
        r = run_seed(seed, STEPS)
        assert r.ok, f"{r.violation}\n  replay: {r.replay}"
        assert r.liveness_ms is not None
        worst = max(worst, r.liveness_ms)
    print(f"\nslowest recovery after heal: {worst:.0f}ms of virtual time")


class _MislabelledSnapshot(raftlog.core.RaftNode):
    """Holds each snapshot under the previous entry's index: what it sends carries one
    entry more than it claims, so that entry is applied twice."""

    def set_snapshot(self, snap: Snapshot) -> None:
        if snap.index > self._store.first_index():
            snap = dataclasses.replace(snap, index=snap.index - 1,
                                       term=self.term_at(snap.index - 1))
        super().set_snapshot(snap)


def test_a_snapshot_that_does_not_match_its_index_is_caught() -> None:
    broken = types.SimpleNamespace(**{**vars(raftlog.core), "RaftNode": _MislabelledSnapshot})
    for seed in range(MUTATION_SEEDS):
        r = run_seed(seed, STEPS, core=broken)  # type: ignore[arg-type]
        if r.invariant in {"state-machine-safety", "snapshot-term"}:
            print(f"\nmislabelled snapshot: caught by {r.invariant} at seed {seed}")
            return
    pytest.fail(f"a mislabelled snapshot survived {MUTATION_SEEDS} seeds")


class _NeverCampaigns(raftlog.core.RaftNode):
    def tick(self) -> None:
        if self.role == Role.LEADER:
            super().tick()


def test_a_group_that_cannot_elect_fails_liveness() -> None:
    stuck = types.SimpleNamespace(**{**vars(raftlog.core), "RaftNode": _NeverCampaigns})
    r = run_seed(1, 300, 3, core=stuck)  # type: ignore[arg-type]
    assert r.invariant == "liveness" and r.phase == "liveness"


class _NeverStepsDown(raftlog.core.RaftNode):
    """Check-quorum that always finds a quorum: a cut-off leader acts as one forever."""

    def _quorum_active(self) -> bool:
        return True


class _ReadsBeforeItsFirstCommit(raftlog.core.RaftNode):
    """Answers ReadIndex before its term committed anything: a new leader's commit index
    may lag what the old leader committed, so such a read can miss acknowledged writes."""

    def _committed_in_term(self) -> bool:
        return True


def test_a_cut_off_leader_that_never_steps_down_fails_the_election_bound() -> None:
    broken = types.SimpleNamespace(**{**vars(raftlog.core), "RaftNode": _NeverStepsDown})
    for seed in range(10):
        r = run_seed(seed, 300, core=broken, check_quorum=True, reconfig=False)  # type: ignore[arg-type]
        if r.invariant == "liveness-election":
            assert r.phase == "liveness" and "still acts as leader" in (r.violation or "")
            return
    pytest.fail("a leader that never steps down passed 10 seeds")


def test_a_read_right_after_an_election_catches_reads_before_the_first_commit() -> None:
    """Short safety phases rarely catch it; the liveness client's read asked the moment
    a new leader is seen does."""
    broken = types.SimpleNamespace(
        **{**vars(raftlog.core), "RaftNode": _ReadsBeforeItsFirstCommit})
    for seed in range(12):
        r = run_seed(seed, 300, core=broken, check_quorum=True, reconfig=False)  # type: ignore[arg-type]
        if r.invariant == "read-index-stale" and r.phase == "liveness":
            return
    pytest.fail("reads before a new leader's first commit passed 12 seeds' liveness phases")


class _NeverRepaired(raftlog.core.RaftNode):
    """A replica that never takes a repaired entry back: it awaits repair forever."""

    def entry_repaired(self, index: int) -> None:
        pass


def test_the_repair_before_the_cut_is_bounded_too() -> None:
    """Phase 1 starts its clock once every damaged entry is repaired; a repair that
    never completes fails that wait instead of passing unjudged."""
    broken = types.SimpleNamespace(**{**vars(raftlog.core), "RaftNode": _NeverRepaired})
    for seed in range(10):
        r = run_seed(seed, 300, core=broken, reconfig=False,  # type: ignore[arg-type]
                     corrupt_mean_us=20_000)
        if r.invariant == "liveness-repair":
            assert r.phase == "liveness" and "awaiting repair" in (r.violation or "")
            return
    pytest.fail("replicas that never finish a repair passed 10 seeds")


class _DropsReads(raftlog.core.RaftNode):
    """Never answers a ReadIndex request (as if every leader lost its term at once)."""

    def read_index(self, request_id: int) -> None:
        if self.role != Role.LEADER:
            raise raftlog.core.NotLeader(self.leader, self.term)


def test_reads_never_answered_fail_the_produce_then_read_bound() -> None:
    """Asking the next leader again after a leader loses its term does not excuse a
    leader that keeps its term and never answers."""
    broken = types.SimpleNamespace(**{**vars(raftlog.core), "RaftNode": _DropsReads})
    for seed in range(10):
        r = run_seed(seed, 300, core=broken, reconfig=False)  # type: ignore[arg-type]
        if r.invariant == "liveness-read":
            assert "not done in time" in (r.violation or "")
            return
    pytest.fail("leaders that never answer a read passed 10 seeds")


def test_majority_liveness_holds_on_the_real_core() -> None:
    """The bounds hold for the real core: a cut-off leader is replaced and steps down,
    and the produce-then-read completes, on every seed (static groups)."""
    for seed in range(16):
        r = run_seed(seed, 300, check_quorum=True, reconfig=False)
        assert r.ok, f"{r.violation}\n  replay: {r.replay}"
