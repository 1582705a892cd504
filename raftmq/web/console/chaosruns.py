"""Chaos run reports in a directory: each run is a folder `chaos run --out` wrote
(`results.json`, `report.html`, `history.jsonl`), found at any depth below it.

The console lists them with their verdict and headline counts and serves a run's own
HTML report as it is; a name that leaves the directory is no run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["find_runs", "run_dir", "summary"]

MAX_RUNS = 500
HEADLINE = ("verdict", "valid", "operations", "faults", "lost", "duplicated", "unexpected",
            "reordered", "longest_unavailability", "seconds")


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The few numbers a list of runs shows, from one results.json."""
    options = results.get("options") or {}
    out = {k: results.get(k) for k in HEADLINE}
    for k in ("operations", "faults"):  # counts, or lists of them
        value = out[k]
        if isinstance(value, (list, dict)):
            out[k] = len(value)
    out.update(seed=options.get("seed"), workload=options.get("workload"),
               nemesis=options.get("nemesis"), time=options.get("time"))
    return out


def find_runs(root: Path) -> list[dict[str, Any]]:
    """Every run below `root`, newest first: {"name" (its path below root), "mtime",
    **summary}; a results.json that does not parse is listed with its error."""
    runs: list[dict[str, Any]] = []
    for results in sorted(root.rglob("results.json"))[:MAX_RUNS]:
        folder = results.parent
        try:
            data = json.loads(results.read_text(encoding="utf-8"))
            row = summary(data if isinstance(data, dict) else {})
        except (OSError, ValueError) as exc:
            row = {"error": f"results.json unreadable: {exc}"}
        row["name"] = folder.relative_to(root).as_posix() or "."
        row["mtime"] = int(results.stat().st_mtime)
        row["has_report"] = (folder / "report.html").is_file()
        runs.append(row)
    runs.sort(key=lambda r: -r["mtime"])
    return runs


def run_dir(root: Path, name: str) -> Path | None:
    """The run folder `name` below `root`, or None when it is not one (or escapes)."""
    base = root.resolve()
    folder = (base / name).resolve()
    if folder != base and base not in folder.parents:
        return None
    return folder if (folder / "results.json").is_file() else None
