"""`raftmq cluster`: where each group's replicas live and who leads it, and changing that.

    raftmq cluster status [--json]                  members, learners, leader, lag
    raftmq cluster transfer-leader GROUP NODE       move leadership for good
    raftmq cluster add-replica GROUP NODE           host, catch up as learner, promote
    raftmq cluster remove-replica GROUP NODE        remove, then the node deletes its copy
    raftmq cluster replace-replica GROUP OLD NEW    add NEW, then remove OLD (OLD == NEW:
                                                    a node whose disk was replaced)

Every change is one single-server membership change in the group's Raft log, made by
its leader, one at a time (see `raftmq.client.membership`); steps that would leave a
group without a reachable majority are refused.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from raftmq.client import Admin, GroupMembers
from wire.protocol import Code, RequestError

from . import (
    add_namesrv_argument,
    namesrv_addresses,
    no_action,
    print_json,
    run_async,
    table_console,
)

__all__ = ["main"]

PROG = "raftmq cluster"


def _node(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node id (a positive integer)")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Group replicas and leadership: show "
                                "them, move leadership, add, remove and replace replicas.")
    sub = p.add_subparsers(dest="action", metavar="{status,transfer-leader,add-replica,"
                           "remove-replica,replace-replica}")
    st = sub.add_parser("status", help="each group's voters, learners, leader and lag")
    st.add_argument("groups", nargs="*", metavar="GROUP", help="only these groups")
    tl = sub.add_parser("transfer-leader", help="make NODE the group's (preferred) leader")
    tl.add_argument("group")
    tl.add_argument("node", type=_node)
    ad = sub.add_parser("add-replica", help="give NODE a replica of the group")
    ad.add_argument("group")
    ad.add_argument("node", type=_node)
    rm = sub.add_parser("remove-replica", help="take NODE's replica out of the group")
    rm.add_argument("group")
    rm.add_argument("node", type=_node)
    rp = sub.add_parser("replace-replica", help="move OLD's replica to NEW (or re-create "
                        "it on OLD when NEW == OLD)")
    rp.add_argument("group")
    rp.add_argument("old", type=_node)
    rp.add_argument("new", type=_node)
    ad.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="seconds the new replica may take to catch up (default %(default)s)")
    rp.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="seconds the replace may take: the new replica's catch-up, and "
                    "its steps tried again while a node restarts or a group elects "
                    "(default %(default)s)")
    for sp in (st, tl, ad, rm, rp):
        sp.add_argument("--json", action="store_true", help="print JSON")
        add_namesrv_argument(sp)
    return p


def _ids(nodes: tuple[int, ...]) -> str:
    return ",".join(str(n) for n in nodes) or "-"


def _print(members: dict[str, GroupMembers | RequestError], as_json: bool) -> None:
    if as_json:
        print_json({g: m.to_json() if isinstance(m, GroupMembers)
                    else {"group": g, "error": f"{m.code.name}: {m.message}"}
                    for g, m in members.items()})
        return
    table = Table()
    for col in ("group", "leader", "preferred", "voters", "learners", "hosts", "lag"):
        table.add_column(col)
    for g, m in members.items():
        if not isinstance(m, GroupMembers):
            table.add_row(g, "-", "-", "-", "-", "-", f"{m.code.name}: {m.message}")
            continue
        lag = " ".join(f"{n}:{m.lag(n)}" for n in (*m.voters, *m.learners))
        hosts = " ".join(f"{n}@{m.hosts[n]}" for n in (*m.voters, *m.learners)
                         if n in m.hosts) or "-"
        table.add_row(g, str(m.leader), "-" if m.preferred is None else str(m.preferred),
                      _ids(m.voters), _ids(m.learners), hosts, lag)
    table_console().print(table)


async def _status(args: argparse.Namespace, admin: Admin) -> int:
    """Every group's membership from its leader; a group none answers for (no leader:
    a lost quorum) is listed with the error and makes the exit status 1."""
    groups = list(args.groups)
    if not groups:
        info = await admin.describe_cluster(topics=False)
        groups = sorted(str(g) for g in info.get("groups") or {})
    members: dict[str, GroupMembers | RequestError] = {}
    for g in groups:
        try:
            members[g] = await admin.group_members(g, wait=0)
        except RequestError as exc:
            if exc.code == Code.UNKNOWN_GROUP:
                raise
            members[g] = exc
    _print(members, args.json)
    return 0 if all(isinstance(m, GroupMembers) for m in members.values()) else 1


async def _transfer(args: argparse.Namespace, admin: Admin) -> int:
    await admin.transfer_leader(args.group, args.node)
    if args.json:
        print_json({"group": args.group, "preferred": args.node})
    else:
        print(f"{args.group}: node {args.node} is now the preferred leader; leadership moves "
              "to it as soon as it has caught up")
    return 0


async def _add(args: argparse.Namespace, admin: Admin) -> int:
    m = await admin.add_replica(args.group, args.node, catch_up_timeout=args.timeout)
    _done(args, m, f"node {args.node} holds a replica and votes")
    return 0


async def _remove(args: argparse.Namespace, admin: Admin) -> int:
    m = await admin.remove_replica(args.group, args.node)
    what = f"node {args.node} is no longer a member"
    what += (" and deleted its copy" if m.dropped else
             " (it could not be reached to delete its copy: run this again once it is up)")
    _done(args, m, what)
    return 0


async def _replace(args: argparse.Namespace, admin: Admin) -> int:
    m = await admin.replace_replica(args.group, args.old, args.new,
                                    catch_up_timeout=args.timeout)
    what = (f"node {args.old}'s replica was re-created and caught up" if args.old == args.new
            else f"node {args.new} replaced node {args.old}")
    _done(args, m, what)
    return 0


def _done(args: argparse.Namespace, m: GroupMembers, what: str) -> None:
    if args.json:
        print_json(m.to_json())
    else:
        print(f"{m.group}: {what}; voters {_ids(m.voters)}, learners {_ids(m.learners)}, "
              f"leader {m.leader}")


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action is None:
        return no_action(parser, PROG, "status, transfer-leader, add-replica, remove-replica "
                         "or replace-replica")
    namesrv = namesrv_addresses(parser, args.namesrv)
    action = {"status": _status, "transfer-leader": _transfer, "add-replica": _add,
              "remove-replica": _remove, "replace-replica": _replace}[args.action]

    async def run() -> int:
        async with Admin(namesrv) as admin:
            return await action(args, admin)

    return run_async(run, namesrv, PROG)
