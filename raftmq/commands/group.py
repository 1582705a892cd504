"""`raftmq group`: consumer groups, as `kafka-consumer-groups` shows and changes them.

    raftmq group list [--json]
    raftmq group describe G [--json]          members, committed offsets, lag per queue
    raftmq group reset-offsets G --topic T --to earliest|latest|OFFSET|TIME [--dry-run]
    raftmq group reset-offsets G --topic T --to-time TIME [--dry-run]
    raftmq group delete G
    raftmq group locks G [--json]             who holds each queue's lock, until when

Resetting and deleting change committed offsets through the Raft log, and only while the
group has no live members (a running consumer would overwrite them at its next commit).
TIME is ISO 8601 (`2026-11-25T17:00:00Z`; no zone means UTC) or `@<epoch ms>`;
`--to-time` also takes epoch milliseconds and times before now (`-10m`,
`raftmq.commands.when`). A time moves each queue to its first message stored at or after
it (the node's time index, OFFSET_FOR_TIME), or to its end when none was.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import cast

from raftmq.client import Admin, GroupQueue, IncompleteError

from . import (
    add_namesrv_argument,
    incomplete_exit,
    make_table,
    print_json,
    run_admin_action,
    table_console,
)
from .when import time_argument

__all__ = ["main", "parse_target"]

PROG = "raftmq group"


def parse_target(text: str) -> str | int:
    """--to: "earliest", "latest", an offset, or a time as "@<epoch ms>"."""
    if text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return int(text)
    if text.startswith("@") and text[1:].isdigit():
        return text
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: use earliest, latest, an offset, an ISO time or @<epoch ms>") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return f"@{int(when.timestamp() * 1000)}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="List, describe, reset and delete "
                                "consumer groups.")
    sub = p.add_subparsers(dest="action",
                           metavar="{list,describe,reset-offsets,delete,locks}")
    ls = sub.add_parser("list", help="every consumer group with committed offsets")
    ls.add_argument("--json", action="store_true")
    d = sub.add_parser("describe", help="members, committed offsets and lag per queue")
    d.add_argument("group")
    d.add_argument("--json", action="store_true")
    r = sub.add_parser("reset-offsets", help="move a group's offsets on a topic "
                       "(no live members)")
    r.add_argument("group")
    r.add_argument("--topic", required=True)
    to = r.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", type=parse_target, metavar="WHERE",
                    help="earliest, latest, an offset, an ISO 8601 time or @<epoch ms>")
    to.add_argument("--to-time", type=time_argument, metavar="TIME",
                    help="the first message stored at or after TIME: ISO 8601, epoch ms, "
                    "or before now (-10m, -2h)")
    r.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    r.add_argument("--json", action="store_true")
    rm = sub.add_parser("delete", help="forget a group's offsets (no live members)")
    rm.add_argument("group")
    rm.add_argument("--json", action="store_true")
    lk = sub.add_parser("locks", help="the group's queue locks: holders and lease expiry")
    lk.add_argument("group")
    lk.add_argument("--json", action="store_true")
    for sp in (ls, d, r, rm, lk):
        add_namesrv_argument(sp)
    return p


async def _list(args: argparse.Namespace, admin: Admin) -> int:
    incomplete: IncompleteError | None = None
    try:
        groups = await admin.group_offsets()
    except IncompleteError as exc:
        incomplete = exc
        groups = cast(dict[str, dict[tuple[str, int], int]], exc.partial)
    if args.json:
        print_json({cg: sorted({t for t, _ in offs}) for cg, offs in groups.items()})
        return incomplete_exit(PROG, incomplete)
    if not groups and incomplete is None:
        print("no consumer group has committed an offset")
    for cg, offs in groups.items():
        print(f"{cg}  topics: {', '.join(sorted({t for t, _ in offs}))}")
    return incomplete_exit(PROG, incomplete)


async def _describe(args: argparse.Namespace, admin: Admin) -> int:
    incomplete: IncompleteError | None = None
    try:
        members, rows = await admin.describe_group(args.group)
    except IncompleteError as exc:
        incomplete = exc
        members, rows = cast(tuple[list[str], list[GroupQueue]], exc.partial)
    if args.json:
        print_json({"group": args.group, "members": members, "queues": [
            {"topic": r.topic, "queue": r.queue, "committed": r.committed,
             "min": r.min_offset, "end": r.end_offset, "lag": r.lag} for r in rows],
            "unreadable": [] if incomplete is None else incomplete.unreadable})
        return incomplete_exit(PROG, incomplete)
    console = table_console()
    console.print(f"consumer group {args.group}: {len(members)} live member(s)"
                  + (f": {', '.join(members)}" if members else ""))
    if not rows:
        if incomplete is None:
            console.print("no committed offsets (no such group, or it never committed)")
        return incomplete_exit(PROG, incomplete)
    console.print(make_table(
        ("topic", "queue", "committed", "min", "end", "lag"),
        [(r.topic, r.queue, r.committed, r.min_offset, r.end_offset,
          None if r.lag is None else f"{r.lag:,}") for r in rows],
        right=("queue", "committed", "min", "end", "lag")))
    return incomplete_exit(PROG, incomplete)


async def _reset(args: argparse.Namespace, admin: Admin) -> int:
    to = args.to if args.to_time is None else f"@{args.to_time}"
    plan = await admin.reset_offsets(args.group, args.topic, to, dry_run=args.dry_run)
    if args.json:
        print_json({"group": args.group, "topic": args.topic, "dry_run": args.dry_run,
                    "queues": {q: {"old": o, "new": n} for q, (o, n) in plan.items()}})
        return 0
    verb = "would move" if args.dry_run else "moved"
    for q, (old, new) in plan.items():
        print(f"{args.topic}/{q}: {verb} {'-' if old < 0 else old} -> {new}")
    if args.dry_run:
        print("dry run: nothing changed")
    return 0


async def _delete(args: argparse.Namespace, admin: Admin) -> int:
    deleted = await admin.delete_group(args.group)
    if args.json:
        print_json({"group": args.group, "deleted_offsets": deleted})
    else:
        print(f"deleted consumer group {args.group} ({deleted} committed offset(s))")
    return 0


async def _locks(args: argparse.Namespace, admin: Admin) -> int:
    locks = await admin.queue_locks(args.group)
    if args.json:
        print_json({"group": args.group, "locks": [lk.to_json() for lk in locks]})
        return 0
    if not locks:
        print(f"consumer group {args.group} holds no queue lock")
        return 0
    console = table_console()
    console.print(make_table(
        ("topic", "queue", "client", "lease expiry (UTC)", "live"),
        [(lk.topic, lk.queue, lk.client,
          datetime.fromtimestamp(lk.expiry_ms / 1000, UTC).isoformat(timespec="milliseconds"),
          "yes" if lk.live else "expired") for lk in locks],
        right=("queue",)))
    return 0


def main(argv: list[str]) -> int:
    parser = _parser()
    return run_admin_action(parser, parser.parse_args(argv), PROG, {
        "list": _list, "describe": _describe, "reset-offsets": _reset, "delete": _delete,
        "locks": _locks})
