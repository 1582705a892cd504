"""Many seeds: run them (in worker processes if asked) and sum up what happened."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import asdict, dataclass, field

from raftlog.sim.runner import RunResult, run_seed

__all__ = ["Summary", "sweep"]


@dataclass
class Summary:
    seeds: int = 0
    steps: int = 0
    violations: int = 0
    first_failing_seed: int | None = None
    events: int = 0
    elapsed_s: float = 0.0  # wall clock
    cpu_s: float = 0.0  # summed per-seed run time
    virtual_s: float = 0.0
    committed: int = 0
    nodes: dict[int, int] = field(default_factory=dict)
    profiles: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, object]] = field(default_factory=list)

    def add(self, r: RunResult) -> None:
        self.seeds += 1
        self.events += r.events
        self.cpu_s += r.elapsed_s
        self.virtual_s += r.virtual_ms / 1000
        self.committed += r.committed
        self.nodes[r.nodes] = self.nodes.get(r.nodes, 0) + 1
        self.profiles[r.knobs.profile] = self.profiles.get(r.knobs.profile, 0) + 1
        for name, n in asdict(r.faults).items():
            self.faults[name] = self.faults.get(name, 0) + n
        if not r.ok:
            self.violations += 1
            if self.first_failing_seed is None:
                self.first_failing_seed = r.seed
            if len(self.failures) < 20:
                self.failures.append(
                    {
                        "seed": r.seed,
                        "invariant": r.invariant,
                        "phase": r.phase,
                        "step": r.failed_at_step,
                        "violation": (r.violation or "").splitlines()[0],
                        "replay": r.replay,
                    }
                )

    @property
    def steps_per_s(self) -> float:
        return self.events / self.elapsed_s if self.elapsed_s else 0.0

    def to_json(self, mutation: str | None = None) -> dict[str, object]:
        return {
            "seeds": self.seeds,
            "steps": self.steps,
            "violations": self.violations,
            "first_failing_seed": self.first_failing_seed,
            "mutation": mutation,
            "events": self.events,
            "elapsed_s": round(self.elapsed_s, 2),
            "steps_per_s": round(self.steps_per_s),
            "steps_per_s_per_core": round(self.events / self.cpu_s) if self.cpu_s else 0,
            "virtual_s": round(self.virtual_s, 1),
            "committed": self.committed,
            "nodes": self.nodes,
            "profiles": self.profiles,
            "faults": self.faults,
            "failures": self.failures,
        }


def _one(args: tuple[int, int, int | None, str | None, tuple[str, ...]]) -> RunResult:
    seed, steps, nodes, mutation, disable = args
    result = run_seed(seed, steps, nodes, mutation, disable=disable)
    result.trace = result.trace[-120:]
    return result


def sweep(
    seeds: Iterable[int],
    steps: int,
    nodes: int | None = None,
    mutation: str | None = None,
    *,
    jobs: int = 1,
    stop_at_first: bool = False,
    disable: Collection[str] = (),
    on_result: Callable[[RunResult], None] | None = None,
) -> Summary:
    """Run every seed; with `stop_at_first`, stop once a violation is found."""
    summary = Summary(steps=steps)
    started = time.perf_counter()
    work = [(s, steps, nodes, mutation, tuple(disable)) for s in seeds]
    results: Iterator[RunResult]
    pool = None
    if jobs > 1 and len(work) > 1:
        pool = multiprocessing.get_context("fork").Pool(jobs)
        results = pool.imap(_one, work, chunksize=1)
    else:
        results = map(_one, work)
    try:
        for r in results:
            summary.add(r)
            if on_result is not None:
                on_result(r)
            if stop_at_first and not r.ok:
                break
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    summary.elapsed_s = time.perf_counter() - started
    return summary
