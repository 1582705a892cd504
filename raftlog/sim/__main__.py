"""Command line: run seeded histories, print a summary (or JSON), exit 1 on a violation.

python -m raftlog.sim --seeds 200 --steps 3000 --json
python -m raftlog.sim --seed 17 --steps 3000 --nodes 5 --verbose
python -m raftlog.sim --seeds 200 --mutation commit-old-term --stop-at-first
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from raftlog.sim.knobs import SHELL_MUTATIONS
from raftlog.sim.runner import RunResult, run_seed
from raftlog.sim.sweep import sweep

__all__ = ["main"]


def _mutations() -> list[str]:
    try:
        from raftlog.core import MUTATIONS
    except ImportError:
        MUTATIONS = frozenset()
    return sorted(MUTATIONS | SHELL_MUTATIONS)


def _parser(prog: str = "python -m raftlog.sim") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    p.add_argument("--first-seed", type=int, default=0, help="run seeds from this one on")
    p.add_argument("--seed", type=int, help="run (replay) exactly this seed")
    p.add_argument(
        "--steps",
        type=int,
        default=3000,
        help="safety-phase events per seed (deliveries, ticks, ...)",
    )
    p.add_argument("--nodes", type=int, choices=(3, 5), help="group size (default: 3/5 by seed)")
    p.add_argument("--mutation", choices=_mutations(), help="switch on a deliberate bug")
    p.add_argument(
        "--disable",
        action="append",
        default=[],
        metavar="CHECKER",
        help="leave out a checker class (repeatable), e.g. DurableBeforeSend",
    )
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--stop-at-first", action="store_true", help="stop at the first violation")
    p.add_argument("--json", action="store_true", help="print one JSON summary line")
    p.add_argument("--verbose", action="store_true", help="knobs, trace and state of failures")
    p.add_argument("--save", default="sim-failures", help="directory for failing seeds ('' = off)")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m raftlog.sim") -> int:
    args = _parser(prog).parse_args(argv)
    if args.seed is not None:
        r = run_seed(
            args.seed,
            args.steps,
            args.nodes,
            args.mutation,
            verbose=args.verbose,
            disable=args.disable,
        )
        _save(args, r)
        if args.json:
            print(json.dumps({**_single(r), "run": r.to_json()}))
        elif not args.verbose:
            print(_line(r))
        return 0 if r.ok else 1

    def progress(r: RunResult) -> None:
        _save(args, r)
        if not args.json and (not r.ok or args.verbose):
            print(_line(r), flush=True)
            if args.verbose and not r.ok:
                print("\n".join(r.trace))

    seeds = range(args.first_seed, args.first_seed + args.seeds)
    summary = sweep(
        seeds,
        args.steps,
        args.nodes,
        args.mutation,
        jobs=args.jobs,
        stop_at_first=args.stop_at_first,
        disable=args.disable,
        on_result=progress,
    )
    if args.json:
        print(json.dumps(summary.to_json(args.mutation)))
    else:
        print(
            f"{summary.seeds} seeds x {args.steps} steps: {summary.violations} violations"
            f" (first failing seed {summary.first_failing_seed}); {summary.events} steps in"
            f" {summary.elapsed_s:.1f}s = {summary.steps_per_s:.0f} steps/s;"
            f" faults {summary.faults}"
        )
    return 0 if summary.violations == 0 else 1


def _single(r: RunResult) -> dict[str, object]:
    return {
        "seeds": 1,
        "steps": r.steps,
        "violations": 0 if r.ok else 1,
        "first_failing_seed": None if r.ok else r.seed,
        "steps_per_s": round(r.events / r.elapsed_s) if r.elapsed_s else 0,
    }


def _line(r: RunResult) -> str:
    if r.ok:
        return f"seed {r.seed} ({r.nodes} nodes, {r.knobs.profile}): ok, {r.events} steps, committed {r.committed}"
    return (
        f"seed {r.seed} ({r.nodes} nodes, {r.knobs.profile}): VIOLATION {r.violation.splitlines()[0] if r.violation else ''}\n"
        f"  replay: {r.replay}"
    )


def _save(args: argparse.Namespace, r: RunResult) -> None:
    """Keep a failing seed's report, unless it failed on purpose (a mutation run)."""
    if r.ok or not args.save or args.mutation:
        return
    d = Path(args.save)
    d.mkdir(exist_ok=True)
    text = [
        r.replay,
        r.violation or "",
        "knobs:",
        r.knobs.describe(),
        "trace:",
        *r.trace,
    ]
    (d / f"seed-{r.seed}-{r.nodes}n.txt").write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    sys.exit(main())
