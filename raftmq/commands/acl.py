"""`raftmq acl add|remove|list`: who may publish, subscribe or administer what.

    raftmq acl add --user alice --allow publish --topic orders. --prefix
    raftmq acl add --user alice --deny subscribe --topic orders.secret
    raftmq acl add --user '*' --allow subscribe --group analytics
    raftmq acl add --user ops --allow admin --cluster
    raftmq acl add --user etl --allow publish --transactional-id etl- --prefix
    raftmq acl add --user shop --allow publish --producer-group shop-orders
    raftmq acl list

Entries are logged in the cluster's metadata group; deny wins over allow, and with
authorization on (`authorize = true`) a request no entry allows is refused. These
commands need a superuser's (or a cluster-admin's) login: `raftmq --user NAME ...`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from wire.protocol import RequestError
from wire.requests.security import (
    AclAddAnswer,
    AclAddRequest,
    AclListAnswer,
    AclListRequest,
    AclRemoveAnswer,
    AclRemoveRequest,
)
from wire.security import ACL_FIELDS as FIELDS
from wire.security import OPERATIONS

from . import add_namesrv_argument, namesrv_addresses, print_json
from .user import metadata_call

__all__ = ["main"]

PROG = "raftmq acl"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="ACLs: who may do what (deny wins).")
    sub = p.add_subparsers(dest="action")
    for name in ("add", "remove"):
        sp = sub.add_parser(name, help=f"{name} an entry")
        sp.add_argument("--user", required=True, help="a user name, or '*' for every user")
        verdict = sp.add_mutually_exclusive_group(required=True)
        verdict.add_argument("--allow", choices=OPERATIONS, metavar="OPERATION",
                             help=f"allow OPERATION ({', '.join(OPERATIONS)})")
        verdict.add_argument("--deny", choices=OPERATIONS, metavar="OPERATION",
                             help="deny OPERATION (deny wins over any allow)")
        what = sp.add_mutually_exclusive_group(required=True)
        what.add_argument("--topic", metavar="NAME")
        what.add_argument("--group", metavar="NAME", help="a consumer group")
        what.add_argument("--transactional-id", metavar="NAME",
                          help="a transactional id (TX_INIT with it fences its producer)")
        what.add_argument("--producer-group", metavar="NAME",
                          help="a producer group of half messages")
        what.add_argument("--cluster", action="store_true",
                          help="the cluster (topics' creation, replicas, users, ACLs, ...)")
        sp.add_argument("--prefix", action="store_true",
                        help="NAME is a prefix: every resource of the kind starting with it")
        sp.add_argument("--json", action="store_true")
        add_namesrv_argument(sp)
    sp = sub.add_parser("list", help="list the entries")
    sp.add_argument("--json", action="store_true")
    add_namesrv_argument(sp)
    return p


def _entry(args: argparse.Namespace) -> dict[str, Any]:
    kind, name = "cluster", ""
    for kind_, given in (("topic", args.topic), ("group", args.group),
                         ("transactional-id", args.transactional_id),
                         ("producer-group", args.producer_group)):
        if given is not None:
            kind, name = kind_, given
    return {"principal": args.user, "kind": kind,
            "pattern": "prefix" if args.prefix else "literal", "name": name,
            "operation": args.allow or args.deny,
            "permission": "allow" if args.allow else "deny"}


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action is None:
        parser.print_help()
        return 2
    namesrv = namesrv_addresses(parser, args.namesrv)
    try:
        if args.action == "list":
            out = metadata_call(namesrv, AclListRequest())
            rows = [dict(zip(FIELDS, a, strict=True)) for a in AclListAnswer.decode(out).acls]
            if args.json:
                print_json({"acls": rows})
            for r in [] if args.json else rows:
                what = "cluster" if r["kind"] == "cluster" else (
                    f"{r['kind']} {r['name']}" + ("*" if r["pattern"] == "prefix" else ""))
                print(f"{r['permission']:<5} {r['principal']:<16} {r['operation']:<9} {what}")
            return 0
        entry = _entry(args)
        if args.action == "add":
            done = AclAddAnswer.decode(metadata_call(namesrv, AclAddRequest(**entry))).added
        else:
            done = AclRemoveAnswer.decode(
                metadata_call(namesrv, AclRemoveRequest(**entry))).removed
    except (RequestError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json({**entry, "changed": done})
    elif not done:
        print("already there" if args.action == "add" else "no such entry")
    return 0
