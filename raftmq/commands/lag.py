"""`raftmq lag --group G --topic T`: how far a consumer group is behind, queue by queue.

Lag counts retained messages the group has not committed past: end - max(committed, min).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from rich.table import Table

from raftmq.client import Admin

from . import add_namesrv_argument, namesrv_addresses, print_json, run_async, table_console

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq lag", description=__doc__.split("\n\n")[0])
    p.add_argument("--group", required=True, help="consumer group")
    p.add_argument("--topic", required=True)
    p.add_argument("--json", action="store_true")
    add_namesrv_argument(p)
    return p


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    namesrv = namesrv_addresses(parser, args.namesrv)

    async def run() -> int:
        async with Admin(namesrv) as admin:
            lags = await admin.consumer_lag(args.group, args.topic)
        never = all(q.committed < 0 for q in lags.values())
        if args.json:
            print_json({"group": args.group, "topic": args.topic,
                        "total": sum(q.lag for q in lags.values()),
                        "never_committed": never,
                        "queues": [asdict(q) for q in lags.values()]})
            return 0
        table = Table(title=f"consumer group {args.group!r} on {args.topic!r}")
        for col in ("queue", "committed", "min", "end", "lag"):
            table.add_column(col, justify="right")
        for q in lags.values():
            table.add_row(str(q.queue), "-" if q.committed < 0 else str(q.committed),
                          str(q.min_offset), str(q.end_offset), f"{q.lag:,}")
        table.add_row("all", "", "", "", f"{sum(q.lag for q in lags.values()):,}")
        table_console().print(table)
        if never:
            print(f"raftmq lag: group {args.group!r} has committed no offset on "
                  f"{args.topic!r} (no such group, or it never committed): its lag is "
                  "every retained message", file=sys.stderr)
        return 0

    return run_async(run, namesrv)
