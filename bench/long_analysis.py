"""Memory and time of a chaos run's analysis as the history grows.

    python -m bench.long_analysis --seconds 60,120,240,480 [--dead-after S] [--before REV]
        [--json]

For each length a history is simulated by `chaos.synthetic.write_history` (the workload's
record shapes and rates, faults every 15 s, a final drain), then `analyze_run` runs on it
in a fresh process whose peak resident memory (``ru_maxrss``) and wall time are
reported, with the history's size, operations checked, search steps, the verdict, the
seconds per phase (results.json's ``analysis_seconds``) and why any key has no verdict.
`--dead-after S` has group g0 lose its quorum for good S seconds in (its queues then
collect appends that timed out, and the drain cannot read them: the run is invalid),
the shape of a two-hour run whose harness lost a group. With `--before REV` the
analysis of git revision REV (its `chaos` package, extracted to a temporary directory)
is measured on the same files, for a before/after table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from chaos.synthetic import write_history

_CHILD = """
import json, resource, sys, time
from chaos.analysis import analyze_run
facts = json.loads(sys.argv[2])
began = time.monotonic()
a = analyze_run(sys.argv[1], facts, check_timeout=float(sys.argv[3]))
seconds = time.monotonic() - began
a.write_report(sys.argv[4])
r = a.results
print(json.dumps({"verdict": r["verdict"], "seconds": round(seconds, 1),
  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
  "operations": r["linearizability"]["operations"], "steps": r["linearizability"]["steps"],
  "phases": r.get("analysis_seconds"), "unknown": r.get("unknown"),
  "problems": r["problems"][:3]}))
"""


def _measure(history: Path, facts: dict[str, Any], path: list[str], timeout: float,
             report: Path) -> dict[str, Any]:
    env_path = ":".join(path)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(history), json.dumps(facts), str(timeout),
         str(report)],
        check=True, capture_output=True, text=True, env={"PYTHONPATH": env_path},
        cwd=report.parent,  # not the source tree: `-c` puts the working directory first
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["report_bytes"] = report.stat().st_size
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.long_analysis")
    parser.add_argument("--seconds", default="60,120,240,480",
                        help="comma-separated history lengths in seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dead-after", type=float, default=None, metavar="S",
                        help="group g0 loses its quorum for good S seconds in")
    parser.add_argument("--before", default=None, metavar="REV",
                        help="also measure the analysis of this git revision")
    parser.add_argument("--check-timeout", type=float, default=3600.0)
    parser.add_argument("--dir", type=Path, default=None, help="keep the histories here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    rows = []
    with tempfile.TemporaryDirectory(prefix="long-analysis-") as tmp:
        work = args.dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        old: Path | None = None
        if args.before:
            old = Path(tmp) / "before"
            (old / "chaos").mkdir(parents=True)
            names = subprocess.run(
                ["git", "ls-tree", "--name-only", args.before, "chaos/"], cwd=root,
                check=True, capture_output=True, text=True,
            ).stdout.split()
            for name in names:
                text = subprocess.run(["git", "show", f"{args.before}:{name}"], cwd=root,
                                      check=True, capture_output=True, text=True).stdout
                (old / name).write_text(text)
        for seconds in (float(s) for s in args.seconds.split(",")):
            history = work / f"history-{seconds:g}s.jsonl"
            facts = write_history(history, seconds=seconds, seed=args.seed,
                                  dead_after=args.dead_after)
            lines = facts.pop("lines")
            row: dict[str, Any] = {"seconds": seconds, "history_mb": round(
                history.stat().st_size / 2**20, 1), "lines": lines}
            row["after"] = _measure(history, facts, [str(root)], args.check_timeout,
                                    work / "report.html")
            if old is not None:
                row["before"] = _measure(history, facts, [str(old), str(root)],
                                         args.check_timeout, work / "report-before.html")
            rows.append(row)
            print(json.dumps(row) if args.json else row, flush=True)
            if args.dir is None:
                history.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
