"""`raftmq status`: is the cluster healthy, and who leads what?

The name server's CLUSTER answer says which nodes are registered and which group each
claims to lead, but it is as old as the last registration. So every node (registered or
only remembered as a replica) is also asked for its own STATUS, and a group's leader is
the node that itself reports leading it in the highest term; the name server's claim is
used only when no replica of the group answers. Lag is how far each member's applied
index trails the leader's last log index. Exit status 1 when any group has no leader.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import anyio
from rich.table import Table

from raftmq.client import Admin
from wire.protocol import Code, RequestError

from . import (
    add_namesrv_argument,
    login_hint,
    namesrv_addresses,
    print_json,
    run_async,
    table_console,
)

__all__ = ["build_status", "cluster_status", "gather_status", "main"]

PROG = "raftmq status"
LOGIN_REFUSED = Code.UNAUTHENTICATED.name
NODE_TIMEOUT = 2.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Groups, leaders, terms, indexes, lag and node liveness.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_namesrv_argument(p)
    return p


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _known_nodes(cluster: dict[str, Any]) -> dict[int, str]:
    """Node id -> address: registered nodes, plus replicas the groups remember (a node
    that stopped registering is exactly the one worth showing)."""
    nodes: dict[int, str] = {}
    for g in (cluster.get("groups") or {}).values():
        for nid, addr in (g.get("replicas") or {}).items():
            if _int(nid) is not None and addr:
                nodes[int(nid)] = str(addr)
    for nid, info in (cluster.get("nodes") or {}).items():
        if _int(nid) is not None and isinstance(info, dict) and info.get("addr"):
            nodes[int(nid)] = str(info["addr"])
    return dict(sorted(nodes.items()))


def build_status(cluster: dict[str, Any], statuses: dict[int, dict[str, Any] | str]) -> dict[str, Any]:
    """Merge the CLUSTER answer with each node's STATUS answer (or its error text)."""
    known = _known_nodes(cluster)
    registered = {int(n): v for n, v in (cluster.get("nodes") or {}).items()
                  if _int(n) is not None and isinstance(v, dict)}
    nodes: dict[int, dict[str, Any]] = {}
    for nid, addr in known.items():
        st = statuses.get(nid)
        reg = registered.get(nid)
        nodes[nid] = {
            "addr": addr,
            # the machine it runs on: shards of one host share it
            "host": (st.get("host") if isinstance(st, dict) else None)
            or (reg.get("host") if reg else None),
            "registered": reg is not None,
            "registration_age": round(float(reg.get("age", 0.0)), 3) if reg else None,
            "reachable": isinstance(st, dict),
            "error": st if isinstance(st, str) else None,
            # it answers, but nothing without a login: not down
            "login_needed": isinstance(st, str) and st.startswith(f"{LOGIN_REFUSED}:"),
            "peers_connected": list(st.get("peers_connected") or []) if isinstance(st, dict)
            else None,
            # where its Prometheus metrics are served (fsync latency, produce/fetch counts)
            "metrics": reg.get("metrics") if reg else None,
            "leads": [],
        }
    ns_groups: dict[str, Any] = cluster.get("groups") or {}
    gids = set(ns_groups)
    for st in statuses.values():
        if isinstance(st, dict):
            gids.update(st.get("groups") or {})
    groups: dict[str, dict[str, Any]] = {}
    for gid in sorted(gids):
        ns = ns_groups.get(gid) or {}
        own = {nid: st["groups"][gid] for nid, st in statuses.items()
               if isinstance(st, dict) and gid in (st.get("groups") or {})}
        claims = [(int(g.get("term", 0)), nid) for nid, g in own.items() if g.get("role") == "leader"]
        if claims:
            leader: int | None = max(claims)[1]
            source = "node"
        elif not own:
            leader = _int(ns.get("leader"))
            source = "namesrv"
        else:
            leader, source = None, "node"
        lg = own.get(leader) if leader is not None else None
        last = _int(lg.get("last")) if lg else None
        ns_members = {int(k): v for k, v in (ns.get("members") or {}).items() if _int(k) is not None}
        member_ids = sorted(set(ns_members) | set(own)
                            | {int(k) for k in (ns.get("replicas") or {}) if _int(k) is not None})
        members: dict[int, dict[str, Any]] = {}
        for nid in member_ids:
            m = own.get(nid)
            m_source = "node"
            if m is None:
                m, m_source = ns_members.get(nid) or {}, "namesrv" if nid in ns_members else "none"
            applied = _int(m.get("applied"))
            members[nid] = {
                "role": m.get("role"), "term": _int(m.get("term")),
                "commit": _int(m.get("commit")), "applied": applied,
                "last": _int(m.get("last")),
                "lag": max(0, last - applied) if last is not None and applied is not None else None,
                "source": m_source,
                # entries lost when a refill no replica could supply was abandoned
                "refill_gap": m.get("refill_gap"),
                # its disk is full: it writes, votes for and acknowledges nothing for now
                "disk_full": bool(m.get("disk_full")),
            }
        if leader is not None and leader in nodes:
            nodes[leader]["leads"].append(gid)
        lead = members.get(leader, {}) if leader is not None else {}
        groups[gid] = {
            "leader": leader,
            "leader_addr": known.get(leader) if leader is not None else None,
            "leader_source": source if leader is not None else None,
            "term": lead.get("term") if lead.get("term") is not None else _int(ns.get("term")),
            "commit": lead.get("commit") if lead.get("commit") is not None
            else _int(ns.get("commit")),
            "applied": lead.get("applied") if lead.get("applied") is not None
            else _int(ns.get("applied")),
            "last": last,
            # delayed messages stored and not yet due, as the leader counts them
            "delayed_pending": _int(lg.get("delayed_pending")) if lg else None,
            # simple consumer groups' FIFO message groups with a message in flight, and
            # the messages held back behind them: {cg: {topic: {queue: [groups, held]}}}
            "fifo": lg.get("fifo") or {} if lg else None,
            "members": members,
        }
    ok = bool(groups) and all(g["leader"] is not None for g in groups.values())
    return {"ok": ok, "nodes": nodes, "groups": groups}


async def cluster_status(namesrv: list[str]) -> dict[str, Any]:
    """The merged view `build_status` makes, fetched concurrently."""
    async with Admin(namesrv, timeout=NODE_TIMEOUT) as admin:
        status = await gather_status(admin)
    status["namesrv"] = namesrv
    return status


async def gather_status(admin: Admin) -> dict[str, Any]:
    """`build_status` of the CLUSTER answer and every known node's STATUS, asked through
    `admin` (so a caller acting as some user, like the web console, sees what it may)."""
    cluster = await admin.describe_cluster(topics=False)
    statuses: dict[int, dict[str, Any] | str] = {}

    async def one(nid: int, addr: str) -> None:
        try:
            statuses[nid] = await admin.node_status(addr)
        except RequestError as exc:
            statuses[nid] = f"{exc.code.name}: {exc.message}"

    async with anyio.create_task_group() as tg:
        for nid, addr in _known_nodes(cluster).items():
            tg.start_soon(one, nid, addr)
    return build_status(cluster, statuses)


def _cell(v: Any) -> str:
    return "-" if v is None else str(v)


def _fifo_cell(fifo: Any) -> str:
    """FIFO message groups in flight / messages held behind them, over a Raft group's
    consumer groups and queues."""
    if not isinstance(fifo, dict):
        return "-"
    pairs = [v for topics in fifo.values() if isinstance(topics, dict)
             for queues in topics.values() if isinstance(queues, dict)
             for v in queues.values() if isinstance(v, list) and len(v) == 2]
    return f"{sum(int(b) for b, _ in pairs)}/{sum(int(h) for _, h in pairs)}"


def _render(status: dict[str, Any]) -> None:
    console = table_console()
    groups = Table(title="groups", title_justify="left")
    for col in ("group", "leader", "address", "term", "commit", "applied", "last", "max lag",
                "delayed", "fifo groups/held"):
        groups.add_column(col, justify="left" if col in ("group", "leader", "address")
                          else "right")
    replicas = Table(title="replicas (lag: leader's last index - member's applied)",
                     title_justify="left")
    for col in ("group", "node", "role", "term", "commit", "applied", "lag"):
        replicas.add_column(col, justify="left" if col in ("group", "role") else "right")
    for gid, g in status["groups"].items():
        leader = "[bold red]none[/]" if g["leader"] is None else str(g["leader"])
        if g["leader_source"] == "namesrv":
            leader += " (namesrv)"
        lags = [m["lag"] for m in g["members"].values() if m["lag"] is not None]
        groups.add_row(gid, leader, _cell(g["leader_addr"]), _cell(g["term"]),
                       _cell(g["commit"]), _cell(g["applied"]), _cell(g["last"]),
                       _cell(max(lags) if lags else None), _cell(g.get("delayed_pending")),
                       _fifo_cell(g.get("fifo")))
        for nid, m in g["members"].items():
            role = _cell(m["role"]) + (" (namesrv)" if m["source"] == "namesrv" else "")
            if m.get("disk_full"):
                role += " [bold red](disk full)[/]"
            lag = "-" if m["lag"] is None else f"[yellow]{m['lag']}[/]" if m["lag"] else "0"
            replicas.add_row(gid, str(nid), role, _cell(m["term"]), _cell(m["commit"]),
                             _cell(m["applied"]), lag)
    nodes = Table(title="nodes", title_justify="left")
    for col in ("host", "node", "address", "registered", "status", "peers", "leads"):
        nodes.add_column(col)
    # a host's shards together
    for nid, n in sorted(status["nodes"].items(), key=lambda kv: (str(kv[1]["host"] or ""),
                                                                 kv[0])):
        reg = (f"yes ({n['registration_age']:.1f} s ago)" if n["registered"]
               else "[red]no[/]")
        reason = str(n["error"] or "").split(":", 1)[0]  # the code; JSON has the rest
        state = ("[green]up[/]" if n["reachable"] else "[yellow]up, needs a login[/]"
                 if n["login_needed"] else f"[red]down[/] ({reason})")
        peers = ",".join(map(str, n["peers_connected"])) if n["peers_connected"] is not None \
            else "-"
        nodes.add_row(_cell(n["host"]), str(nid), n["addr"], reg, state, peers,
                      ", ".join(n["leads"]) or "-")
    console.print(groups)
    console.print(replicas)
    console.print(nodes)
    if not status["groups"]:
        console.print("[red]the name server knows no group[/]")
    elif not status["ok"]:
        missing = [g for g, v in status["groups"].items() if v["leader"] is None]
        console.print(f"[red]no leader: {', '.join(missing)}[/]")
    for gid, g in status["groups"].items():
        for nid, m in g["members"].items():
            if m.get("disk_full"):
                console.print(f"[red]{gid}: node {nid}'s disk is full: that replica writes "
                              "and acknowledges nothing until space is freed[/]")
            gap = m.get("refill_gap")
            if gap:
                console.print(f"[red]{gid}: node {nid} lost entries {gap[0]}..{gap[1]} "
                              "(no replica held them: refill abandoned)[/]")


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    namesrv = namesrv_addresses(parser, args.namesrv)

    async def run() -> int:
        status = await cluster_status(namesrv)
        if args.json:
            print_json(status)
        else:
            _render(status)
        refused = [str(n) for n, v in status["nodes"].items() if v["login_needed"]]
        if refused:  # what is shown comes from the name server only
            print(f"{PROG}: node(s) {', '.join(refused)} answer nothing without a login, so "
                  f"their state is unknown; {login_hint('status')}", file=sys.stderr)
            return 1
        if not status["ok"]:
            missing = [g for g, v in status["groups"].items() if v["leader"] is None]
            why = f"no leader in {', '.join(missing)}" if missing else "no groups known"
            print(f"{PROG}: {why}", file=sys.stderr)
            return 1
        return 0

    return run_async(run, namesrv)
