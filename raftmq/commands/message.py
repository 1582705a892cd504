"""`raftmq message`: find messages by id or by key — the way to show a message is there.

    raftmq message get MSG_ID [--json]
    raftmq message key --topic T KEY [--json]
    raftmq message query --topic T --from TIME [--to TIME] [--limit N] [--json]

Ids name their group and log position, so `get` asks one group leader; `key` asks the
leader of every group hosting the topic (the broker keeps the newest messages per key);
`query` lists the messages stored in a time window over every queue of the topic, found
with the nodes' time index (OFFSET_FOR_TIME); TIME is ISO 8601, epoch ms or a time
before now (`--from=-10m`: with `=`, as it starts with a dash; `raftmq.commands.when`),
`--to` defaults to now.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raftmq.client import Admin
from wire.records import Message

from . import (
    add_namesrv_argument,
    make_table,
    namesrv_addresses,
    positive_int,
    print_json,
    run_async,
    table_console,
)
from .consume import message_json, message_line
from .when import iso_ms, parse_time, time_argument

__all__ = ["main"]

PROG = "raftmq message"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Look messages up by id or by key.")
    sub = p.add_subparsers(dest="what", required=True)
    g = sub.add_parser("get", help="the message with this id")
    g.add_argument("msg_id")
    g.add_argument("--json", action="store_true")
    add_namesrv_argument(g)
    k = sub.add_parser("key", help="the newest messages with this key in a topic")
    k.add_argument("--topic", required=True)
    k.add_argument("key")
    k.add_argument("--json", action="store_true")
    add_namesrv_argument(k)
    q = sub.add_parser("query", help="the messages stored in a time window")
    q.add_argument("--topic", required=True)
    q.add_argument("--from", dest="start", required=True, type=time_argument,
                   metavar="TIME", help="ISO 8601, epoch ms, or before now (-10m)")
    q.add_argument("--to", dest="end", type=time_argument, metavar="TIME",
                   help="the window's end, not included (default: now)")
    q.add_argument("--limit", type=positive_int, default=1000,
                   help="messages per queue at most, the first ones (default 1000)")
    q.add_argument("--json", action="store_true")
    add_namesrv_argument(q)
    return p


def _query_row(m: Message) -> dict[str, Any]:
    return {"msg_id": m.msg_id, "queue": m.queue, "offset": m.offset,
            "store_ms": m.store_ms, "store_time": iso_ms(m.store_ms), "keys": m.key,
            "tags": m.tags, "size": len(m.body)}


async def _query(args: argparse.Namespace, admin: Admin) -> int:
    end = parse_time("now") if args.end is None else args.end
    if end < args.start:
        print(f"{PROG}: --to is before --from", file=sys.stderr)
        return 2
    msgs = await admin.messages_stored_between(args.topic, args.start, end, limit=args.limit)
    if args.json:
        for m in msgs:
            print_json(_query_row(m))
        return 0
    console = table_console()
    console.print(make_table(
        ("msg_id", "queue", "offset", "store time", "keys", "tags", "size"),
        [(r["msg_id"], r["queue"], r["offset"], r["store_time"], r["keys"], r["tags"],
          r["size"]) for r in map(_query_row, msgs)],
        title=f"{len(msgs)} message(s) of {args.topic} stored {iso_ms(args.start)} .. "
        f"{iso_ms(end)}", right=("queue", "offset", "size"), whole=("msg_id",)))
    return 0


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    namesrv = namesrv_addresses(parser, args.namesrv)

    async def run() -> int:
        async with Admin(namesrv) as admin:
            if args.what == "query":
                return await _query(args, admin)
            if args.what == "get":
                msgs = [await admin.get_message(args.msg_id)]
            else:
                msgs = await admin.query_key(args.topic, args.key)
        for m in msgs:
            if args.json:
                print_json(message_json(m))
            else:
                print(message_line(m))
        if not msgs:
            print(f"{PROG}: no message with key {args.key!r} in topic {args.topic!r} (the "
                  "broker keeps the newest messages per key)", file=sys.stderr)
            return 1
        return 0

    return run_async(run, namesrv)
