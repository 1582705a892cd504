"""`raftmq tx`: transactions as an operator sees them, and the operator's decisions.

    raftmq tx list [--group G] [--limit N] [--json]
                                   half messages waiting for a decision, transactions'
                                   data the participants hold undecided, the
                                   coordinators' transactions, and the latest decisions
    raftmq tx show ID [--json]     everything known of one transactional id or txid
    raftmq tx commit TXID          deliver a half message no producer decided
    raftmq tx rollback TXID        drop a half message no producer decided

Only half messages (RocketMQ's model) take an operator's decision: a Kafka-style
transaction is decided by its producer, or aborted by its coordinator at its timeout.
A decision is logged like any other (source "operator"); deciding a half message the
same way twice is harmless, the other way is refused (TX_DECIDED).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any, cast

from rich.console import Console
from rich.table import Table

from raftmq.client import Admin, IncompleteError

from . import (
    add_namesrv_argument,
    incomplete_exit,
    make_table,
    positive_int,
    print_json,
    run_admin_action,
    table_console,
)

__all__ = ["main"]

PROG = "raftmq tx"

Listing = dict[str, list[dict[str, Any]]]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="List and show transactions; "
                                "commit or roll back half messages.")
    sub = p.add_subparsers(dest="action", metavar="{list,show,commit,rollback}")
    ls = sub.add_parser("list", help="pending half messages, open transactions, decisions")
    ls.add_argument("--group", help="one broker group only")
    ls.add_argument("--limit", type=positive_int, default=100,
                    help="rows per list and group (default 100)")
    ls.add_argument("--json", action="store_true")
    sh = sub.add_parser("show", help="one transactional id or half message txid")
    sh.add_argument("id")
    sh.add_argument("--json", action="store_true")
    c = sub.add_parser("commit", help="deliver a half message (operator's decision)")
    c.add_argument("txid")
    c.add_argument("--json", action="store_true")
    r = sub.add_parser("rollback", help="drop a half message (operator's decision)")
    r.add_argument("txid")
    r.add_argument("--json", action="store_true")
    for sp in (ls, sh, c, r):
        add_namesrv_argument(sp)
    return p


def _when(ms: object) -> str:
    if not isinstance(ms, int) or ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _table(title: str, rows: Sequence[dict[str, Any]], cols: Sequence[tuple[str, str]]) -> Table:
    # ids are copied into commands: never cut one short
    return make_table([head for _, head in cols],
                      [[_when(r.get(k)) if k.endswith("_ms") and k != "timeout_ms"
                        else r.get(k) for k, _ in cols] for r in rows],
                      title=title, whole=[head for key, head in cols if key in ID_KEYS])


ID_KEYS = ("txid", "tid", "id")
HALF_COLS = [("txid", "txid"), ("g", "group"), ("producer_group", "producer group"), ("topic", "topic"),
             ("queue", "queue"), ("messages", "msgs"), ("prepared_ms", "prepared"),
             ("checks", "checks"), ("last_check_ms", "last check")]
PREPARED_COLS = [("tid", "transactional id"), ("g", "group"), ("epoch", "epoch"),
                 ("n", "n"), ("queues", "queues"), ("messages", "msgs"),
                 ("offsets", "offsets"), ("prepared_ms", "prepared"),
                 ("first_index", "first index")]
TXN_COLS = [("tid", "transactional id"), ("g", "coordinator"), ("epoch", "epoch"),
            ("n", "n"), ("state", "state"), ("participants", "participants"),
            ("started_ms", "started"), ("timeout_ms", "timeout ms"), ("reason", "reason")]
DECIDED_COLS = [("kind", "kind"), ("id", "id"), ("g", "group"), ("epoch", "epoch"),
                ("n", "n"), ("commit", "commit"), ("source", "source"),
                ("messages", "msgs"), ("index", "index")]
DONE_COLS = [("tid", "transactional id"), ("g", "coordinator"), ("epoch", "epoch"),
             ("n", "n"), ("commit", "commit"), ("reason", "reason"),
             ("participants", "participants")]


def _print_listing(rows: Listing, console: Console) -> None:
    shown = False
    for key, title, cols in (("halves", "half messages waiting for a decision", HALF_COLS),
                             ("prepared", "transactions' data held undecided "
                                          "(participants)", PREPARED_COLS),
                             ("txns", "transactions (coordinators)", TXN_COLS),
                             ("decided", "latest decisions (participants)", DECIDED_COLS),
                             ("done", "finished transactions (coordinators)", DONE_COLS)):
        if rows.get(key):
            console.print(_table(title, rows[key], cols))
            shown = True
    if not shown:
        console.print("no transactions")


async def _list(args: argparse.Namespace, admin: Admin) -> int:
    incomplete: IncompleteError | None = None
    rows: Listing
    try:
        rows = await admin.tx_list(group=args.group, limit=args.limit)
    except IncompleteError as exc:
        incomplete = exc
        rows = cast(Listing, exc.partial)
    truncated = bool(getattr(rows, "truncated", False))
    if args.json:
        print_json({**rows, "unreadable": [] if incomplete is None else incomplete.unreadable,
                    "truncated": truncated})
    else:
        _print_listing(rows, table_console())
        if truncated:
            print(f"{PROG}: some lists were cut below --limit to fit one answer; "
                  "narrow with --group or `tx show ID`", file=sys.stderr)
    return incomplete_exit(PROG, incomplete)


async def _show(args: argparse.Namespace, admin: Admin) -> int:
    rows = await admin.tx_show(args.id)
    if args.json:
        print_json({"id": args.id, **rows})
    else:
        _print_listing(rows, table_console())
    return 0


async def _decide(args: argparse.Namespace, admin: Admin, commit: bool) -> int:
    dup = await (admin.tx_commit(args.txid) if commit else admin.tx_rollback(args.txid))
    verb = "committed" if commit else "rolled back"
    if args.json:
        print_json({"txid": args.txid, "decision": "commit" if commit else "rollback",
                    "already": dup})
    else:
        print(f"half message {args.txid}: {verb}" + (" (it already was)" if dup else ""))
    return 0


async def _commit(args: argparse.Namespace, admin: Admin) -> int:
    return await _decide(args, admin, True)


async def _rollback(args: argparse.Namespace, admin: Admin) -> int:
    return await _decide(args, admin, False)


def main(argv: list[str]) -> int:
    parser = _parser()
    return run_admin_action(parser, parser.parse_args(argv), PROG, {
        "list": _list, "show": _show, "commit": _commit, "rollback": _rollback})
