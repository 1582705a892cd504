"""`raftmq message`: find messages by id or by key — the way to show a message is there.

    raftmq message get MSG_ID [--json]
    raftmq message key --topic T KEY [--json]

Ids name their group and log position, so `get` asks one group leader; `key` asks the
leader of every group hosting the topic (the broker keeps the newest messages per key).
"""

from __future__ import annotations

import argparse
import sys

from raftmq.client import Admin

from . import add_namesrv_argument, namesrv_addresses, print_json, run_async
from .consume import message_json, message_line

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
    return p


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    namesrv = namesrv_addresses(parser, args.namesrv)

    async def run() -> int:
        async with Admin(namesrv) as admin:
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
