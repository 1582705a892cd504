"""`raftmq dlq`: the dead letters of a simple consumer group (`%DLQ%<group>`).

    raftmq dlq list --group G [--limit N] [--json]
                                     what the group gave up on: source queue and offset,
                                     deliveries, last error, when it died
    raftmq dlq show --group G --id ID [--json]
                                     one dead letter with its message
    raftmq dlq resend --group G (--id ID ... | --all) [--json]
                                     back into their source queues as new messages
    raftmq dlq purge --group G (--id ID ... | --all) [--json]
                                     dropped

A dead letter's id is `<broker group>:<n>`, as `list` shows it. `%DLQ%<group>` is no
topic a consumer subscribes to: the dead letters are pointers to messages their source
queues stored, kept per consumer group in the source queue's broker group. A resent
message reaches the group's simple consumers again, with a fresh delivery count, and,
like any message of the topic, every other consumer group of the topic too.
"""

from __future__ import annotations

import argparse
import base64
import time
from typing import Any, cast

from raftmq.client import Admin, DeadLetter, IncompleteError

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

PROG = "raftmq dlq"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="List, show, resend and purge the dead "
                                "letters of a simple consumer group (%DLQ%<group>).")
    sub = p.add_subparsers(dest="action", metavar="{list,show,resend,purge}")
    ls = sub.add_parser("list", help="the group's dead letters")
    ls.add_argument("--limit", type=positive_int, default=1000,
                    help="rows per broker group (default 1000)")
    sh = sub.add_parser("show", help="one dead letter with its message")
    sh.add_argument("--id", required=True, help="its id, <broker group>:<n>")
    parsers = [ls, sh]
    for name, what in (("resend", "put dead letters back into their source queues"),
                       ("purge", "drop dead letters for good")):
        sp = sub.add_parser(name, help=what)
        which = sp.add_mutually_exclusive_group(required=True)
        which.add_argument("--id", action="append", dest="ids", metavar="ID",
                           help="a dead letter's id (repeat for several)")
        which.add_argument("--all", action="store_true", help="every dead letter of the group")
        parsers.append(sp)
    for sp in parsers:
        sp.add_argument("--group", required=True, help="the simple consumer group")
        sp.add_argument("--json", action="store_true")
        add_namesrv_argument(sp)
    return p


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _json(d: DeadLetter) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": d.id, "group": d.group, "dlq": f"%DLQ%{d.consumer_group}", "topic": d.topic,
        "queue": d.queue, "offset": d.offset, "msg_id": d.msg_id, "store_ms": d.store_ms,
        "deliveries": d.deliveries, "error": d.error, "dead_ms": d.dead_ms}
    m = d.message
    if m is not None:
        try:
            body: Any = m.body.decode()
        except UnicodeDecodeError:
            body = {"base64": base64.b64encode(m.body).decode()}
        out["message"] = {"key": m.key, "tags": m.tags, "properties": m.properties,
                          "born_ms": m.born_ms, "body": body}
    return out


async def _list(args: argparse.Namespace, admin: Admin) -> int:
    incomplete: IncompleteError | None = None
    try:
        rows = await admin.dlq_list(args.group, limit=args.limit)
    except IncompleteError as exc:
        incomplete = exc
        rows = cast(list[DeadLetter], exc.partial)
    if args.json:
        print_json({"group": args.group, "dlq": f"%DLQ%{args.group}",
                    "dead": [_json(d) for d in rows],
                    "unreadable": [] if incomplete is None else incomplete.unreadable})
    elif rows:
        heads = ["id", "topic", "queue", "offset", "deliveries", "last error", "died"]
        table_console().print(make_table(
            heads, [[d.id, d.topic, d.queue, d.offset, d.deliveries, d.error or "-",
                     _when(d.dead_ms)] for d in rows],
            title=f"%DLQ%{args.group}", right=["queue", "offset", "deliveries"],
            whole=["id"]))
    else:
        print(f"%DLQ%{args.group}: no dead letters")
    return incomplete_exit(PROG, incomplete)


async def _show(args: argparse.Namespace, admin: Admin) -> int:
    d = await admin.dlq_show(args.group, args.id)
    if args.json:
        print_json(_json(d))
    else:
        for key, value in _json(d).items():
            print(f"{key:>10}: {value}")
    return 0


async def _change(args: argparse.Namespace, admin: Admin, action: str) -> int:
    ids = "all" if args.all else args.ids
    change = admin.dlq_resend if action == "resend" else admin.dlq_purge
    done = await change(args.group, ids)
    if args.json:
        print_json({"group": args.group, "action": action, "done": done})
    else:
        verb = "resent" if action == "resend" else "purged"
        print(f"%DLQ%{args.group}: {done} dead letter(s) {verb}")
    return 0


async def _resend(args: argparse.Namespace, admin: Admin) -> int:
    return await _change(args, admin, "resend")


async def _purge(args: argparse.Namespace, admin: Admin) -> int:
    return await _change(args, admin, "purge")


def main(argv: list[str]) -> int:
    parser = _parser()
    return run_admin_action(parser, parser.parse_args(argv), PROG, {
        "list": _list, "show": _show, "resend": _resend, "purge": _purge})
