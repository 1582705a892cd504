"""`python -m bench.peers`: our produce benchmark and the peers', same load, one report.

Runs `bench.produce` (imported, not copied) with the given messages, size and in-flight
window twice, once with one `send_async` call per message as every peer's client sends,
once with `send_batch` calls of `--ours-batch` messages (the same window in whole
batches), then each selected peer in turn with the same three numbers, and prints one
JSON object (`--json`, on stdout; the table then goes to stderr) and a table with the
ratio of each of our rows to each peer. A peer whose server or client is not installed is
reported as skipped, with the command that installs it. Every process started is stopped, on Ctrl-C and errors too.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from types import FrameType
from typing import Any

from bench.peers import PEER_MODULES, get_peer
from bench.peers.common import LoadSpec, run_peer

__all__ = ["build_parser", "main", "run_ours"]


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEER_MODULES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEER_MODULES)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers",
                                description=__doc__.split("\n\n")[0].strip("`: "))
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--size", type=int, default=100, help="message body bytes (default 100)")
    p.add_argument("--in-flight", type=int, default=256,
                   help="messages awaiting their ack, for every system (default 256)")
    p.add_argument("--only", type=_names, default=list(PEER_MODULES),
                   help=f"comma-separated peers to run (default all: {','.join(PEER_MODULES)})")
    p.add_argument("--skip-ours", action="store_true",
                   help="do not run our own benchmark (no ratios)")
    p.add_argument("--ours-batch", type=int, default=256,
                   help="messages per send_batch call of our second row (default 256: the "
                        "256-message window is one call); 0 leaves that row out")
    p.add_argument("--ours-fsync", choices=["always", "interval"], default="always",
                   help="our fsync policy (default always; interval is page-cache durability "
                        "like NATS's)")
    p.add_argument("--startup-timeout", type=float, default=120.0,
                   help="seconds for a peer cluster to become ready")
    p.add_argument("--load-timeout", type=float, default=600.0,
                   help="seconds for one peer's load to finish")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (the table goes to stderr)")
    return p


def run_ours(spec: LoadSpec, fsync: str, batch: int | None = None) -> dict[str, Any]:
    """Our figure, measured by bench.produce itself with this run's parameters: one
    `send_async` call per message, or with `batch`, `send_batch` calls of `batch` messages
    (`--api batch`: the same in-flight window, in whole batches)."""
    from bench.peers.report import ours_label, ours_row
    from bench.produce import build_parser as produce_parser
    from bench.produce import run_produce

    argv = ["--messages", str(spec.messages), "--size", str(spec.size),
            "--in-flight", str(spec.in_flight), "--fsync", fsync]
    if batch is not None:
        argv += ["--api", "batch", "--batch", str(batch)]
    args = produce_parser().parse_args(argv)
    try:
        return ours_row(run_produce(args))
    except Exception as exc:  # reported like a failed peer; the peers still run
        return {"peer": "ours", "system": ours_label(batch), "status": "error",
                "api": "single" if batch is None else "batch",
                "durability": "", "error": f"{type(exc).__name__}: {exc}"}


def _term_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spec = LoadSpec(args.messages, args.size, args.in_flight,
                    startup_timeout=args.startup_timeout, load_timeout=args.load_timeout)
    # `kill` of the bench runs the same cleanup as Ctrl-C (every `finally` on the way out).
    previous = signal.signal(signal.SIGTERM, _term_as_interrupt)
    try:
        return _run(args, spec)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace, spec: LoadSpec) -> int:
    from rich.console import Console

    from bench.common import batch_tasks, machine
    from bench.peers.report import build_report, render

    progress = Console(stderr=True)
    conditions = machine()
    try:
        ours = ours_batch = None
        if not args.skip_ours:
            progress.print(f"[dim]ours (send_async): {spec.messages:,} x {spec.size} B, "
                           f"{spec.in_flight} in flight[/dim]")
            ours = run_ours(spec, args.ours_fsync)
            if args.ours_batch > 0:
                progress.print(f"[dim]ours (send_batch {args.ours_batch}): same load, "
                               f"{batch_tasks(spec.in_flight, args.ours_batch)} calls in "
                               f"flight[/dim]")
                ours_batch = run_ours(spec, args.ours_fsync, args.ours_batch)
        rows = []
        for name in args.only:
            progress.print(f"[dim]{name}: starting a 3-node cluster[/dim]")
            row = run_peer(get_peer(name), spec)
            progress.print(f"[dim]{name}: {row['status']}[/dim]")
            rows.append(row)
    except KeyboardInterrupt:
        progress.print("[red]interrupted: every process started was stopped[/red]")
        return 130
    report = build_report(spec, ours, rows, conditions, ours_batch)
    if args.json:
        print(json.dumps(report), flush=True)
        out = progress
    else:
        out = Console()
    if not out.is_terminal:  # a log or a pipe: wide enough that rows stay on one line
        out.width = max(out.width, 150 if ours_batch else 120)
    out.print(render(report))
    failed = [r for r in [ours, ours_batch, *rows]
              if r is not None and r.get("status") == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
