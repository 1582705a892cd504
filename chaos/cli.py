"""``raftmq chaos check`` (check a recorded history) and ``raftmq chaos run`` (test a cluster).

``check`` has two modes. Given a run's directory (``chaos check DIR``) or a run's history
with no model (``--history DIR/history.jsonl``), it runs exactly the analysis
``chaos run`` ran (`chaos.analysis.analyze_run`, with the facts and time limit of the
run's results.json beside the history), so both give the same verdict. Given ``--model``,
it checks any history in one of `chaos.histories.FORMATS` against that one model (a run's
history too: ``queue-log`` takes its queue operations, ``consumer-offset`` its offset
operations).

``check`` exit codes: 0 linearizable / valid, 1 not linearizable / invalid, 2 unknown (the
time limit ran out), 3 the input could not be checked (usage error, unreadable or malformed
history). ``run`` exits with the same codes for its verdict (0 valid, 1 invalid, 2 unknown), 3 for
usage errors. Code 3 is never a verdict.
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
from .models import MODELS, make_model

__all__ = ["EXIT_CODES", "EXIT_USAGE", "VERDICT_CODES", "check_main", "main", "run_main"]

EXIT_CODES = {CheckResult.OK: 0, CheckResult.ILLEGAL: 1, CheckResult.UNKNOWN: 2}
VERDICT_CODES = {"valid": 0, "invalid": 1, "unknown": 2}
EXIT_USAGE = 3
DEFAULT_CHECK_TIMEOUT = 120.0  # `chaos run`'s default, for a history without results.json

_CHECK_EXITS = """exit codes:
  0  linearizable (a run: valid)
  1  not linearizable (a run: invalid)
  2  unknown: the time limit ran out before an answer
  3  the input could not be checked: usage error, unreadable or malformed history
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftmq chaos check",
        description="Re-check a `raftmq chaos run` (its directory, or its history without "
        "--model) exactly as the run checked it, or check any history against one model "
        "with --model (Porcupine's algorithm).",
        epilog=_CHECK_EXITS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", type=Path, nargs="?", default=None,
                        help="a run's directory, or a history file")
    parser.add_argument("--history", type=Path, default=None, metavar="FILE",
                        help="a history file (a run's, when no --model is given)")
    parser.add_argument("--model", default=None, choices=sorted(MODELS),
                        help="check FILE against this model only (external histories)")
    parser.add_argument("--format", default=None, choices=FORMATS, dest="fmt",
                        help="the history's format with --model (default jsonl)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="give up after S seconds with verdict unknown (exit 2); a run's default is "
        "its own --check-timeout",
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="OUT.html",
        help="write a self-contained HTML report",
    )
    parser.add_argument(
        "--search-memory",
        type=int,
        default=None,
        metavar="MB",
        help="a run's check: give a queue, committed offset or topic up (verdict unknown) "
        "when its search would cache more than MB megabytes (default 1024)",
    )
    return parser


def check_main(argv: list[str]) -> int:
    """Run the check described by ``argv`` (without the program name); returns the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on usage errors
        return 0 if exc.code in (0, None) else EXIT_USAGE
    if (args.file is None) == (args.history is None):
        print("raftmq chaos check: give one history: a run's DIR, FILE or --history FILE",
              file=sys.stderr)
        return EXIT_USAGE
    target: Path = args.file if args.file is not None else args.history
    if args.timeout is not None and not args.timeout >= 0:
        print(f"raftmq chaos check: --timeout must not be negative, got {args.timeout}",
              file=sys.stderr)
        return EXIT_USAGE
    if args.search_memory is not None and (args.search_memory < 1 or args.model is not None):
        print("raftmq chaos check: --search-memory takes a run's history and at least 1 MB, "
              f"got {args.search_memory}" + (" with --model" if args.model else ""),
              file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.model is None:
            if args.fmt not in (None, "jsonl"):
                raise ValueError("a run's history is JSON lines; --format needs --model")
            return _check_run(target, args)
        return _check_model(target, args)
    except (OSError, ValueError) as exc:
        print(f"raftmq chaos check: {target}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - whatever it was, it is not a verdict
        print(f"raftmq chaos check: {target}: could not be checked "
              f"({type(exc).__name__}: {exc})", file=sys.stderr)
        return EXIT_USAGE


def _run_files(target: Path) -> tuple[Path, dict[str, Any] | None]:
    """The history and the results.json (None if there is none) of a run's DIR or history."""
    history = target / "history.jsonl" if target.is_dir() else target
    if not history.is_file():
        raise ValueError(f"no history at {history}")
    results_path = history.parent / "results.json"
    if not results_path.is_file():
        return history, None
    try:
        saved = json.loads(results_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{results_path}: invalid JSON: {exc.msg}") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{results_path}: not a results object")
    return history, saved


def _check_run(target: Path, args: argparse.Namespace) -> int:
    """A run's verdict again, by the run's own analysis (`analyze_run`)."""
    from .analysis import SEARCH_MEMORY, analyze_run

    history, saved = _run_files(target)
    facts = saved.get("run") if saved is not None else None
    timeout = args.timeout
    if timeout is None:
        options = saved.get("options") if saved is not None else None
        timeout = options.get("check_timeout") if isinstance(options, dict) else None
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout < 0:
            timeout = DEFAULT_CHECK_TIMEOUT
    if saved is not None and not isinstance(facts, dict):
        raise ValueError(f"{history.parent / 'results.json'}: no 'run' facts")
    memory = SEARCH_MEMORY if args.search_memory is None else args.search_memory << 20  # MB
    analysis = analyze_run(history, facts, check_timeout=float(timeout), search_memory=memory)
    results = dict(analysis.results)
    results["history"] = str(history)
    results["check_timeout"] = timeout
    if facts is None:
        results["note"] = ("no results.json beside the history: availability per group and "
                           "the harness's own findings are not judged")
    if args.report is not None:
        analysis.write_report(args.report, title=f"{history} (re-checked)")
        results["report"] = str(args.report)
    if args.json:
        print(json.dumps(results, default=str))
    else:
        _print_run(results, history.parent, title=f"chaos check: {history}")
        if "note" in results:
            print(results["note"], file=sys.stderr)
    return VERDICT_CODES[analysis.verdict]


def _check_model(target: Path, args: argparse.Namespace) -> int:
    """One model over any history (`--model`)."""
    fmt = args.fmt or "jsonl"
    loaded = time.monotonic()
    accounting = None
    if fmt == "jsonl":
        records = parse_jsonl(target)
        if args.model == "topic-config":
            from .analysis import topic_operations, topic_records

            ops = topic_operations(topic_records(records))
        elif args.model in ("queue-log", "consumer-offset"):
            from .analysis import offset_operations, queue_operations, split_records

            queue_records, offset_records = split_records(records)
            if args.model == "queue-log":
                ops = queue_operations(queue_records)
                accounting = account_queue_history(queue_records)
            else:
                ops = offset_operations(offset_records)
        else:
            ops = records_to_operations(records, args.model)
    else:
        ops = load_operations(target, fmt, args.model)
    parsed = time.monotonic() - loaded
    model = make_model(args.model)
    info = check_operations(model, ops, timeout=args.timeout)
    if args.report is not None:
        from .report import write_report

        write_report(
            args.report,
            model,
            info,
            title=f"{target.name} ({args.model})",
            accounting=accounting,
        )
    summary = info.to_dict(model)
    summary.update(
        {
            "file": str(target),
            "model": args.model,
            "format": fmt,
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
    from broker.config import KNOWN_MUTATIONS

    from .nemesis import NEMESES
    from .run import WORKLOADS

    p = argparse.ArgumentParser(
        prog="raftmq chaos run",
        description="Start a real cluster on loopback, inject faults under a recorded "
        "workload, heal, drain, and check that nothing acknowledged was lost and every "
        "queue is linearizable.",
        epilog="exit codes: 0 valid, 1 invalid, 2 unknown (the checker ran out of time), "
        "3 usage error. `raftmq chaos check DIR` re-checks the run and gives the same verdict.",
    )
    p.add_argument("--cluster", type=Path, default=None, metavar="CONFIG",
                   help="drive a cluster you started (nodes run by `raftmq chaos agent`; "
                   "see docs/chaos.md) instead of starting one; --nodes and --groups are "
                   "then the cluster's own")
    p.add_argument("--nodes", type=int, default=None, choices=(3, 5),
                   help="node processes, each its own host (default 3)")
    p.add_argument("--hosts", type=int, default=None, metavar="H",
                   help="instead of --nodes: H simulated machines (3 to 7) of --shards nodes "
                   "each; no group puts two replicas on one host, node faults pick a minority "
                   "of hosts, and kill-host / partition-host take a whole host")
    p.add_argument("--shards", type=int, default=None, metavar="S",
                   help="node processes per host with --hosts (1 to 4, default 1)")
    p.add_argument("--groups", type=int, default=None,
                   help="Raft groups (default 3; with --hosts, hosts x shards: a group "
                   "led by each shard)")
    p.add_argument("--time", type=float, default=60.0, metavar="SECONDS",
                   help="how long faults and load run before the final heal (default 60)")
    p.add_argument("--nemesis", default="kill,partition-node", metavar="LIST",
                   help=f"comma-separated faults, all, or none: {', '.join(NEMESES)}")
    p.add_argument("--workload", default="queue", choices=WORKLOADS,
                   help="queue (default), txn (transactions, half messages, a pipeline), "
                   "security (users and ACLs changed under faults, on a cluster with logins "
                   "and ACLs on), delay (delayed messages: never early, never lost), simple "
                   "(simple consumers: acks, retries, dead letters), fifo (simple consumers "
                   "of FIFO message groups: each group in order, one message at a time), "
                   "ordered (orderly push consumers coming and going: in order per key, "
                   "nothing handled twice while held) or all (the seven side by side)")
    p.add_argument("--seed", type=int, default=0, help="decides the fault schedule")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="history.jsonl, results.json, report.html and the cluster's files")
    p.add_argument("--mutation", action="append", default=[], metavar="NAME",
                   help="make nodes misbehave on purpose ("
                   f"{', '.join(sorted(KNOWN_MUTATIONS))}); needs RAFTMQ_ALLOW_MUTATIONS=1")
    p.add_argument("--check-timeout", type=float, default=None, metavar="S",
                   help="linearizability check time limit (verdict unknown after it; "
                   "default: --time, at least 120)")
    p.add_argument("--drain-timeout", type=float, default=None, metavar="S",
                   help="how long the final drain may take to read every queue to its end "
                   "(an unfinished drain makes the run invalid; default: a twentieth of "
                   "--time, at least 120)")
    p.add_argument("--json", action="store_true", help="print results.json to stdout")
    return p


def default_groups(hosts: int | None, shards: int | None) -> int:
    """Groups of a run that does not say: 3, or on hosts one per shard (hosts x shards),
    so that every shard leads one and a host's faults touch as many leaders as it has
    shards, as in a deployment laid out by `raftmq layout`."""
    return 3 if hosts is None else hosts * (shards or 1)


def run_main(argv: list[str]) -> int:
    """``raftmq chaos run``; returns 0 for a valid run, 1 for an invalid one, 2 when the
    checker ran out of time (verdict unknown), 3 for usage errors: `check_main`'s codes."""
    from .nemesis import NEMESES
    from .run import RunOptions, parse_list, run_chaos

    try:
        args = _run_parser().parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code in (0, None) else EXIT_USAGE
    try:
        if args.hosts is not None and args.nodes is not None:
            raise ValueError("--nodes and --hosts exclude each other (with --hosts the nodes "
                             "are hosts x shards)")
        if args.shards is not None and args.hosts is None:
            raise ValueError("--shards needs --hosts (the machines the shards run on)")
        opts = RunOptions(
            out=args.out, nodes=args.nodes or 3, hosts=args.hosts, shards=args.shards or 1,
            groups=args.groups if args.groups is not None else default_groups(args.hosts,
                                                                              args.shards),
            time=args.time,
            nemesis=parse_list(args.nemesis, NEMESES, "nemesis"), workload=args.workload,
            seed=args.seed, mutations=tuple(args.mutation), check_timeout=args.check_timeout,
            cluster=args.cluster, drain_timeout=args.drain_timeout,
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
    return VERDICT_CODES.get(results.get("verdict", ""), 0 if results["valid"] else 1)


def _print_run(results: dict[str, Any], out: Path, *, title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title or f"chaos run: {out}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    verdict = results.get("verdict") or ("valid" if results.get("valid") else "invalid")
    shown = {"valid": "[green]valid[/]",
             "unknown": "[yellow]UNKNOWN[/] (the checker gave up: see no verdict)"}
    table.add_row("verdict", shown.get(verdict, "[red]INVALID[/]"))
    for problem in results.get("problems", []):
        table.add_row("problem", f"[red]{problem}[/]")
    for key, reason in results.get("unknown", {}).items():
        table.add_row("no verdict", f"[yellow]{key}: {reason}[/]")
    ops = results.get("operations", {})
    table.add_row("operations", ", ".join(
        f"{f} " + "/".join(f"{n} {kind}" for kind, n in counts.items() if n)
        for f, counts in ops.items()
    ))
    layout = (results.get("run") or {}).get("layout") or {}
    if layout.get("hosts"):
        table.add_row("cluster", "; ".join(
            f"{host} runs node{'s' if len(ns) > 1 else ''} {', '.join(map(str, ns))}"
            for host, ns in layout["hosts"].items()))
    faults = results.get("faults", {})
    table.add_row("faults", f"{sum(faults.values())}: " + ", ".join(
        f"{kind} {n}" for kind, n in faults.items()))
    table.add_row("messages", ", ".join(
        f"{kind} {results.get(kind, 0)}"
        for kind in ("lost", "duplicated", "unexpected", "recovered")
    ))
    table.add_row("plain duplicates", (
        f"{results.get('duplicated_retried', 0)} with a matching retry, "
        f"{results.get('duplicated_unretried', 0)} without"
    ))
    lin = results.get("linearizable", {})
    table.add_row("linearizable queues", f"{sum(v is True for v in lin.values())} of {len(lin)}")
    tx = results.get("transactions")
    if isinstance(tx, dict):
        outcomes = tx.get("transactions", {})
        pipeline = tx.get("pipeline", {})
        table.add_row("transactions", (
            ", ".join(f"{n} {kind}" for kind, n in outcomes.items())
            + "; half messages " + ", ".join(f"{n} {k}" for k, n in tx.get("halves", {}).items())
            + f"; {tx.get('checks', {}).get('answered', 0)} check-backs answered"
            + f"; pipeline inputs committed {pipeline.get('inputs_committed', 0)}"
        ))
    sec = results.get("security")
    if isinstance(sec, dict):
        def outcomes(rows: Any) -> str:
            return ", ".join(f"{kind} " + "/".join(f"{n} {k}" for k, n in row.items())
                             for kind, row in (rows or {}).items())
        table.add_row("users and ACLs", (
            f"changes: {outcomes(sec.get('changes'))}; logins: {outcomes(sec.get('logins'))}; "
            f"operations: {outcomes(sec.get('authz'))}; "
            f"read at the end on nodes {', '.join(sec.get('final_nodes') or []) or 'none'}"
        ))
    delays = results.get("delays")
    if isinstance(delays, dict):
        msgs = delays.get("messages", {})
        late = delays.get("lateness_ms", {})

        def ms(v: Any) -> str:
            return "-" if v is None else f"{v:.0f}"

        table.add_row("delayed messages", (
            f"{msgs.get('sent', 0)} sent, {msgs.get('acknowledged', 0)} acknowledged, "
            f"{msgs.get('delivered', 0)} delivered; late past due p50/p99/max "
            f"{ms(late.get('p50'))}/{ms(late.get('p99'))}/{ms(late.get('max'))} ms; "
            + ", ".join(f"{kind} {delays.get(kind, 0)}"
                        for kind in ("early", "late", "lost", "duplicated", "phantom"))
        ))
    simple = results.get("simple")
    if isinstance(simple, dict):
        msgs = simple.get("messages", {})
        table.add_row("simple consumers", (
            f"{msgs.get('sent', 0)} sent, {msgs.get('acknowledged', 0)} acknowledged, "
            f"{msgs.get('deliveries', 0)} deliveries ({msgs.get('redeliveries', 0)} again), "
            f"{msgs.get('acked', 0)} acked, {msgs.get('dead_letters', 0)} dead letters; "
            + ", ".join(f"{kind} {simple.get(kind, 0)}"
                        for kind in ("lost", "acked_then_delivered", "stale_acks_accepted",
                                     "double_holding", "delivery_counts",
                                     "dead_letters_wrong", "phantoms"))
        ))
    fifo = results.get("fifo")
    if isinstance(fifo, dict):
        table.add_row("FIFO message groups", (
            f"{fifo.get('message_groups', 0)} groups, {fifo.get('messages', 0)} messages, "
            f"{fifo.get('deliveries', 0)} deliveries; "
            + ", ".join(f"{kind} {fifo.get(kind, 0)}"
                        for kind in ("out_of_order", "group_double_holding"))
        ))
    ordered = results.get("ordered")
    if isinstance(ordered, dict):
        table.add_row("ordered consumption", (
            f"{ordered.get('expected', 0)} acknowledged, {ordered.get('handlings', 0)} "
            f"handled ({ordered.get('handled_again', 0)} again) by "
            f"{ordered.get('holders', 0)} holders, {ordered.get('failed_attempts', 0)} "
            "failed attempts; "
            + ", ".join(f"{kind} {ordered.get(kind, 0)}"
                        for kind in ("out_of_order", "handled_twice", "skipped", "lost"))
        ))
    table.add_row("checker", f"{results.get('checker_seconds', 0):.1f} s")
    worst = results.get("longest_unavailability")
    table.add_row("longest unavailability after a leader loss",
                  f"{worst:.2f} s" if worst is not None
                  else "not measured (no queue appends)" if not results.get("linearizable")
                  else "none")
    table.add_row("files", f"{out}/history.jsonl, results.json, report.html")
    Console().print(table)
    again = _repeat_command(results.get("options"))
    if verdict != "valid" and again:  # one plain line, to copy whole
        print(f"same fault schedule again: {again}")


def _repeat_command(options: Any) -> str | None:
    """The `raftmq chaos run` that replays a run's fault schedule (its seed, time and
    nemeses; see the chaos guide), from results.json's options."""
    if not isinstance(options, dict) or "seed" not in options:
        return None
    nemesis = ",".join(options.get("nemesis") or ()) or "none"
    layout = (f"--hosts {options['hosts']} --shards {options.get('shards', 1)}"
              if options.get("hosts") else f"--nodes {options.get('nodes')}")
    parts = ["raftmq chaos run", f"--seed {options['seed']}", f"--time {options.get('time')}",
             f"--nemesis {nemesis}", layout, f"--groups {options.get('groups')}"]
    if options.get("workload", "queue") != "queue":
        parts.append(f"--workload {options['workload']}")
    parts += [f"--mutation {m}" for m in options.get("mutations") or ()]
    if options.get("cluster"):
        parts.append(f"--cluster {options['cluster']}")
    return " ".join(parts)


def main() -> None:
    raise SystemExit(check_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
