"""``raftmq chaos check`` (check a recorded history) and ``raftmq chaos run`` (test a cluster).

``check`` exit codes: 0 linearizable, 1 not linearizable, 2 unknown (the time limit ran
out). ``run`` exits 0 when the run is valid and 1 when it is not. Usage and input errors
exit 3 in both, so they are never mistaken for a verdict.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .accounting import account_queue_history
from .histories import FORMATS, load_operations, parse_jsonl, records_to_operations
from .linearizability import CheckInfo, CheckResult, check_operations
from .models import MODELS, drop_unobserved_commits, make_model, pin_read_appends

__all__ = ["EXIT_CODES", "check_main", "main", "run_main"]

EXIT_CODES = {CheckResult.OK: 0, CheckResult.ILLEGAL: 1, CheckResult.UNKNOWN: 2}
EXIT_USAGE = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftmq chaos check",
        description="Check a history for linearizability (Porcupine's algorithm).",
    )
    parser.add_argument("file", type=Path, help="history file")
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--format", required=True, choices=FORMATS, dest="fmt")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="give up after S seconds with verdict unknown (exit 2)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="OUT.html",
        help="write a self-contained HTML report",
    )
    return parser


def check_main(argv: list[str]) -> int:
    """Run the check described by ``argv`` (without the program name); returns the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return 0 if exc.code in (0, None) else EXIT_USAGE
    try:
        loaded = time.monotonic()
        accounting = None
        if args.fmt == "jsonl":
            records = parse_jsonl(args.file)
            ops = records_to_operations(records, args.model)
            if args.model == "queue-log":
                accounting = account_queue_history(records)
                ops = pin_read_appends(ops)
            elif args.model == "consumer-offset":
                ops = drop_unobserved_commits(ops)
        else:
            ops = load_operations(args.file, args.fmt, args.model)
        parsed = time.monotonic() - loaded
    except (OSError, ValueError) as exc:
        print(f"raftmq chaos check: {args.file}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    model = make_model(args.model)
    info = check_operations(model, ops, timeout=args.timeout)
    if args.report is not None:
        from .report import write_report

        write_report(
            args.report,
            model,
            info,
            title=f"{args.file.name} ({args.model})",
            accounting=accounting,
        )
    summary = info.to_dict(model)
    summary.update(
        {
            "file": str(args.file),
            "model": args.model,
            "format": args.fmt,
            "parse_seconds": round(parsed, 6),
        }
    )
    if accounting is not None:
        summary["accounting"] = accounting
    if args.report is not None:
        summary["report"] = str(args.report)
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        _print_human(summary, info)
    return EXIT_CODES[info.result]


def _print_human(summary: dict[str, Any], info: CheckInfo) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    colour = {"ok": "green", "illegal": "red", "unknown": "yellow"}[info.result.value]
    table = Table(title=f"{summary['file']}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("verdict", f"[{colour}]{summary['verdict']}[/]")
    table.add_row("model / format", f"{summary['model']} / {summary['format']}")
    table.add_row("operations", str(summary["operations"]))
    counts = summary["partition_results"]
    table.add_row(
        "partitions",
        f"{summary['partitions']} (ok {counts['ok']}, illegal "
        f"{counts['illegal']}, unknown {counts['unknown']})",
    )
    table.add_row(
        "elapsed",
        f"{summary['elapsed']:.3f} s (+{summary['parse_seconds']:.3f} s parsing)"
        + (", timed out" if summary["timed_out"] else ""),
    )
    failure = summary["first_failure"]
    if failure is not None:
        if summary["partitions"] > 1:
            table.add_row("failing partition", json.dumps(failure["key"], default=str))
        table.add_row(
            "longest prefix",
            f"{failure['longest_prefix']} of {failure['partition_operations']} operations",
        )
        op = failure["operation"]
        if op is not None:
            table.add_row("fails at", f"#{op['index']} client {op['client']}: {op['description']}")
            table.add_row("why", failure["why"])
            table.add_row("state there", failure["state_before"])
    accounting = summary.get("accounting")
    if accounting is not None:
        totals = accounting["totals"]
        shown = ", ".join(
            f"{k} {totals.get(k, 0)}"
            for k in ("lost", "duplicated", "unexpected", "reordered", "recovered", "unread")
        )
        table.add_row(
            "accounting",
            ("[green]valid[/] " if accounting["valid"] else "[red]invalid[/] ") + shown,
        )
    if "report" in summary:
        table.add_row("report", summary["report"])
    console.print(table)


def _run_parser() -> argparse.ArgumentParser:
    from .nemesis import NEMESES

    p = argparse.ArgumentParser(
        prog="raftmq chaos run",
        description="Start a real cluster on loopback, inject faults under a recorded "
        "workload, heal, drain, and check that nothing acknowledged was lost and every "
        "queue is linearizable.",
    )
    p.add_argument("--nodes", type=int, default=3, choices=(3, 5))
    p.add_argument("--groups", type=int, default=3, help="Raft groups (default 3)")
    p.add_argument("--time", type=float, default=60.0, metavar="SECONDS",
                   help="how long faults and load run before the final heal (default 60)")
    p.add_argument("--nemesis", default="kill,partition-node", metavar="LIST",
                   help=f"comma-separated faults, or all: {', '.join(NEMESES)}")
    p.add_argument("--workload", default="queue", choices=("queue",))
    p.add_argument("--seed", type=int, default=0, help="decides the fault schedule")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="history.jsonl, results.json, report.html and the cluster's files")
    p.add_argument("--mutation", action="append", default=[], metavar="NAME",
                   help="make nodes misbehave on purpose (ack-before-commit, skip-fsync); "
                   "needs RAFTMQ_ALLOW_MUTATIONS=1")
    p.add_argument("--check-timeout", type=float, default=120.0, metavar="S",
                   help="linearizability check time limit (verdict unknown after it)")
    p.add_argument("--json", action="store_true", help="print results.json to stdout")
    return p


def run_main(argv: list[str]) -> int:
    """``raftmq chaos run``; returns 0 for a valid run, 1 for an invalid one, 3 for usage."""
    from .nemesis import NEMESES
    from .run import RunOptions, parse_list, run_chaos

    try:
        args = _run_parser().parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code in (0, None) else EXIT_USAGE
    try:
        opts = RunOptions(
            out=args.out, nodes=args.nodes, groups=args.groups, time=args.time,
            nemesis=parse_list(args.nemesis, NEMESES, "nemesis"), workload=args.workload,
            seed=args.seed, mutations=tuple(args.mutation), check_timeout=args.check_timeout,
        )
        opts.validate()
    except ValueError as exc:
        print(f"raftmq chaos run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    results = run_chaos(opts)
    if args.json:
        print(json.dumps(results, default=str))
    else:
        _print_run(results, args.out)
    return 0 if results["valid"] else 1


def _print_run(results: dict[str, Any], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"chaos run: {out}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    verdict = "[green]valid[/]" if results["valid"] else "[red]INVALID[/]"
    table.add_row("verdict", verdict)
    for problem in results.get("problems", []):
        table.add_row("problem", f"[red]{problem}[/]")
    ops = results.get("operations", {})
    table.add_row("operations", ", ".join(
        f"{f} " + "/".join(f"{n} {kind}" for kind, n in counts.items() if n)
        for f, counts in ops.items()
    ))
    faults = results.get("faults", {})
    table.add_row("faults", f"{sum(faults.values())}: " + ", ".join(
        f"{kind} {n}" for kind, n in faults.items()))
    table.add_row("messages", ", ".join(
        f"{kind} {results.get(kind, 0)}"
        for kind in ("lost", "duplicated", "duplicated_plain", "unexpected", "recovered")
    ))
    lin = results.get("linearizable", {})
    table.add_row("linearizable queues", f"{sum(v is True for v in lin.values())} of {len(lin)}")
    table.add_row("checker", f"{results.get('checker_seconds', 0):.1f} s")
    worst = results.get("longest_unavailability")
    table.add_row("longest unavailability after a leader loss",
                  "none" if worst is None else f"{worst:.2f} s")
    table.add_row("files", f"{out}/history.jsonl, results.json, report.html")
    Console().print(table)


def main() -> None:
    raise SystemExit(check_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
