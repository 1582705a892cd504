"""`raftmq topic create|list|describe|update|delete`: manage topics without a program.

Creation goes through `Admin.create_topic`, which writes the topic into each hosting
group's log and waits until the name servers route every queue, so a `send` right after
`create` finds the topic. `update --queues N` adds queues (never removes any); `delete`
removes the topic from every group hosting it, with its consumer offsets.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from rich.table import Table

from raftmq.client import Admin
from wire.protocol import Code, RequestError
from wire.trace import is_system_topic

from . import (
    add_namesrv_argument,
    namesrv_addresses,
    no_action,
    positive_int,
    print_json,
    run_async,
    table_console,
)

__all__ = ["main"]

PROG = "raftmq topic"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG,
                                description="Create, list, describe, grow and delete topics.")
    sub = p.add_subparsers(dest="action", metavar="{create,list,describe,update,delete}")
    c = sub.add_parser("create", help="create a topic with queues spread over the groups")
    c.add_argument("name")
    c.add_argument("--queues", type=positive_int, default=4,
                   help="number of queues (default %(default)s)")
    c.add_argument("--groups", metavar="G[,G]",
                   help="Raft groups to place queues in, in order (default: all groups)")
    c.add_argument("--exist-ok", action="store_true",
                   help="succeed if the topic already exists with this placement")
    c.add_argument("--json", action="store_true", help="print the placement as JSON")
    ls = sub.add_parser("list", help="every topic with its queues and hosting groups")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--all", action="store_true",
                    help="the cluster's own topics too (rmq_sys_*: the trace topic)")
    d = sub.add_parser("describe", help="each queue's group, leader and offsets")
    d.add_argument("name")
    d.add_argument("--json", action="store_true")
    u = sub.add_parser("update", help="add queues to a topic (--queues: the new total)")
    u.add_argument("name")
    u.add_argument("--queues", type=positive_int, required=True,
                   help="the new number of queues (more than it has)")
    u.add_argument("--json", action="store_true")
    rm = sub.add_parser("delete", help="delete a topic, its messages and consumer offsets")
    rm.add_argument("name")
    rm.add_argument("--json", action="store_true")
    for sp in (c, ls, d, u, rm):
        add_namesrv_argument(sp)
    return p


def _ranges(queues: list[int]) -> str:
    return ",".join(map(str, queues))


async def _create(args: argparse.Namespace, namesrv: list[str]) -> int:
    groups = [g.strip() for g in (args.groups or "").split(",") if g.strip()] or None
    async with Admin(namesrv) as admin:
        # Admin raises TOPIC_EXISTS for an existing topic (always when its configuration
        # differs); the listing only serves to say so in this command's words.
        existing = (await admin.list_topics()).get(args.name)
        if existing is not None and (not args.exist_ok or existing.get("queues") != args.queues):
            raise RequestError(
                Code.TOPIC_EXISTS,
                f"topic {args.name!r} already exists with {existing.get('queues')} queues",
            )
        placement = await admin.create_topic(args.name, args.queues, groups,
                                             exist_ok=args.exist_ok)
    if args.json:
        print_json({"topic": args.name, "queues": args.queues, "placement": placement})
        return 0
    console = table_console()
    done = "created" if existing is None else "already had"
    console.print(f"{done} topic {args.name} with {args.queues} queues")
    table = Table()
    table.add_column("group")
    table.add_column("queues")
    for g, qs in sorted(placement.items()):
        table.add_row(g, _ranges(qs))
    console.print(table)
    return 0


async def _list(args: argparse.Namespace, namesrv: list[str]) -> int:
    async with Admin(namesrv) as admin:
        topics = await admin.list_topics()
    if not args.all:
        topics = {name: info for name, info in topics.items() if not is_system_topic(name)}
    if args.json:
        print_json(topics)
        return 0
    if not topics:
        print("no topics")
        return 0
    table = Table(title="topics", title_justify="left")
    for col in ("topic", "queues", "groups"):
        table.add_column(col)
    for name, info in topics.items():
        hosted = info.get("hosted") or {}
        where = "  ".join(f"{g}: {_ranges(qs)}" for g, qs in sorted(hosted.items()))
        table.add_row(name, str(info.get("queues", 0)), where)
    table_console().print(table)
    return 0


async def _describe(args: argparse.Namespace, namesrv: list[str]) -> int:
    async with Admin(namesrv) as admin:
        info = await admin.describe_topic(args.name)
    if args.json:
        print_json(dataclasses.asdict(info))
        return 0
    table = Table(title=f"topic {info.topic} ({info.total} queues)", title_justify="left")
    for col in ("queue", "group", "leader", "min", "end", "messages"):
        table.add_column(col, justify="right" if col in ("queue", "min", "end", "messages")
                         else "left")
    for q in info.queues:
        stored = "-" if q.min_offset is None or q.end_offset is None else str(
            q.end_offset - q.min_offset)
        table.add_row(str(q.queue), q.group or "-", q.leader or "-",
                      "-" if q.min_offset is None else str(q.min_offset),
                      "-" if q.end_offset is None else str(q.end_offset), stored)
    console = table_console()
    console.print(table)
    for g, addrs in sorted(info.replicas.items()):
        console.print(f"{g} replicas: {', '.join(addrs)}")
    return 0


async def _update(args: argparse.Namespace, namesrv: list[str]) -> int:
    async with Admin(namesrv) as admin:
        try:
            added = await admin.add_queues(args.name, args.queues)
        except ValueError as exc:
            print(f"{PROG} update: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print_json({"topic": args.name, "queues": args.queues, "added": added})
    else:
        where = ", ".join(f"{g}: {_ranges(qs)}" for g, qs in sorted(added.items()))
        print(f"topic {args.name} now has {args.queues} queues (added {where})")
    return 0


async def _delete(args: argparse.Namespace, namesrv: list[str]) -> int:
    async with Admin(namesrv) as admin:
        groups = await admin.delete_topic(args.name)
    if args.json:
        print_json({"topic": args.name, "deleted_from": groups})
    else:
        print(f"deleted topic {args.name} from {', '.join(groups)}")
    return 0


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action is None:
        return no_action(parser, PROG, "create, list, describe, update or delete")
    namesrv = namesrv_addresses(parser, args.namesrv)
    action = {"create": _create, "list": _list, "describe": _describe, "update": _update,
              "delete": _delete}[args.action]

    async def run() -> int:
        return await action(args, namesrv)

    return run_async(run, namesrv)
