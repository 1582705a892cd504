"""The numbers each console page shows, asked through an `Admin` acting as the request's
user. They come from the same functions the CLI prints (`raftmq status`, the `Admin`
calls behind `raftmq topic/group/tx/dlq`), so a page and a command never disagree.
Every function returns plain JSON-able data: the pages render it, the live endpoints
send it as it is.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, cast

from raftmq.client import Admin, GroupQueue, IncompleteError
from raftmq.client.admin import DeadLetter
from raftmq.commands.consume import message_json
from raftmq.commands.status import gather_status
from raftmq.commands.trace import step_detail
from wire.protocol import Code, RequestError
from wire.records import Message
from wire.requests.security import AclListAnswer, AclListRequest, UserListAnswer, UserListRequest
from wire.security import ACL_FIELDS

from . import nodemetrics

__all__ = ["acls_and_users", "cluster_view", "dead_letters", "group_view", "groups_list",
           "message_view", "topic_view", "topics_list", "transactions"]


def _now_ms() -> int:
    return int(time.time() * 1000)


async def cluster_view(admin: Admin) -> dict[str, Any]:
    """`raftmq status`'s merged view, each group's health in a word, and what the nodes'
    metrics say (fsync latency, produce/fetch counters for the live rates)."""
    status = await gather_status(admin)
    # a host's shards together
    status["nodes"] = dict(sorted(status["nodes"].items(),
                                  key=lambda kv: (str(kv[1].get("host") or ""), kv[0])))
    addresses = {int(n): v["metrics"] for n, v in status["nodes"].items() if v.get("metrics")}
    metrics = nodemetrics.totals(await nodemetrics.scrape(addresses))
    for gid, g in status["groups"].items():
        g["health"] = _health(g)
        lags = [m["lag"] for m in g["members"].values() if m["lag"] is not None]
        g["max_lag"] = max(lags) if lags else None
        for nid, m in g["members"].items():
            m["fsync_ms"] = metrics["fsync_ms"].get(int(nid), {}).get(gid)
    return {"t": _now_ms(), **status, "produced": metrics["produced"],
            "fetched": metrics["fetched"], "lagging_entries": LAGGING_ENTRIES}


LAGGING_ENTRIES = 500
"""A member this many entries behind its leader is lagging: under load a follower is
always a few entries behind, which is replication working, not a problem to flag."""


def _health(group: dict[str, Any]) -> str:
    """One word for a group: no-leader, disk-full, refill-gap, lagging or ok."""
    members = group["members"].values()
    if group["leader"] is None:
        return "no-leader"
    if any(m.get("disk_full") for m in members):
        return "disk-full"
    if any(m.get("refill_gap") for m in members):
        return "refill-gap"
    if any((m.get("lag") or 0) >= LAGGING_ENTRIES for m in members):
        return "lagging"
    return "ok"


async def topics_list(admin: Admin) -> dict[str, Any]:
    """`raftmq topic list`: every topic with its queue count and placement."""
    return {"t": _now_ms(), "topics": await admin.list_topics()}


async def topic_view(admin: Admin, topic: str) -> dict[str, Any]:
    """`raftmq topic describe`: each queue's group, leader and offsets; `stored` and
    `end` summed for the live produce rate."""
    info = await admin.describe_topic(topic)
    queues = [dataclasses.asdict(q) for q in info.queues]
    return {"t": _now_ms(), "topic": info.topic, "total": info.total, "queues": queues,
            "replicas": info.replicas,
            "end": sum(q["end_offset"] or 0 for q in queues),
            "stored": sum((q["end_offset"] or 0) - (q["min_offset"] or 0) for q in queues)}


async def groups_list(admin: Admin) -> dict[str, Any]:
    """`raftmq group list`: every consumer group with committed offsets, by topic."""
    unreadable: list[str] = []
    try:
        groups = await admin.group_offsets()
    except IncompleteError as exc:
        unreadable = list(exc.unreadable)
        groups = cast(dict[str, dict[tuple[str, int], int]], exc.partial)
    return {"t": _now_ms(), "unreadable": unreadable,
            "groups": {cg: sorted({t for t, _ in offs}) for cg, offs in sorted(groups.items())}}


async def group_view(admin: Admin, group: str) -> dict[str, Any]:
    """`raftmq group describe`: live members, committed offsets and lag per queue;
    `committed` summed for the live consume rate."""
    unreadable: list[str] = []
    try:
        members, rows = await admin.describe_group(group)
    except IncompleteError as exc:
        unreadable = list(exc.unreadable)
        members, rows = cast(tuple[list[str], list[GroupQueue]], exc.partial)
    queues = [{"topic": r.topic, "queue": r.queue, "committed": r.committed,
               "min": r.min_offset, "end": r.end_offset, "lag": r.lag} for r in rows]
    return {"t": _now_ms(), "group": group, "members": members, "queues": queues,
            "unreadable": unreadable,
            "lag": sum(r.lag or 0 for r in rows),
            "committed": sum(max(0, r.committed) for r in rows)}


def _message(m: Message) -> dict[str, Any]:
    out = message_json(m)
    out["store_time"] = _iso(m.store_ms)
    return out


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


async def message_view(admin: Admin, *, msg_id: str = "", topic: str = "",
                       key: str = "") -> dict[str, Any]:
    """`raftmq message get` (by id) or `raftmq message key` (by topic and key)."""
    if msg_id:
        try:
            found = [await admin.get_message(msg_id)]
        except ValueError as exc:  # not the shape of a message id
            raise RequestError(Code.MALFORMED, str(exc)) from None
    else:
        found = await admin.query_key(topic, key)
    out: dict[str, Any] = {"t": _now_ms(), "messages": [_message(m) for m in found],
                           "trace": None}
    if msg_id:
        out["trace"] = await trace_view(admin, msg_id)
    return out


async def trace_view(admin: Admin, msg_id: str) -> dict[str, Any]:
    """`raftmq trace MSG_ID`: the message's steps, or why they cannot be shown (reading
    the trace topic needs subscribe on it; a user without it still sees the message)."""
    try:
        records = await admin.trace(msg_id)
    except RequestError as exc:
        if exc.code != Code.FORBIDDEN:
            raise
        return {"steps": [], "refused": exc.message}
    return {"steps": [{**r.as_row(), "time": _iso(r.ms), "detail": step_detail(r)}
                      for r in records], "refused": None}


def _dead_letter(d: DeadLetter) -> dict[str, Any]:
    out = {f.name: getattr(d, f.name) for f in dataclasses.fields(d) if f.name != "message"}
    out["dead_time"] = _iso(d.dead_ms)
    return out


async def dead_letters(admin: Admin, group: str, limit: int = 200) -> dict[str, Any]:
    """`raftmq dlq list`: what the simple consumer group gave up on."""
    unreadable: list[str] = []
    try:
        rows = await admin.dlq_list(group, limit=limit)
    except IncompleteError as exc:
        unreadable = list(exc.unreadable)
        rows = cast(list[DeadLetter], exc.partial)
    return {"t": _now_ms(), "group": group, "unreadable": unreadable,
            "dead_letters": [_dead_letter(d) for d in rows]}


async def transactions(admin: Admin, limit: int = 100) -> dict[str, Any]:
    """`raftmq tx list`: half messages waiting, prepared data, coordinators'
    transactions and the latest decisions."""
    unreadable: list[str] = []
    try:
        rows = await admin.tx_list(limit=limit)
    except IncompleteError as exc:
        unreadable = list(exc.unreadable)
        rows = cast(Any, exc.partial)
    return {"t": _now_ms(), **{k: list(v) for k, v in rows.items()},
            "truncated": bool(getattr(rows, "truncated", False)), "unreadable": unreadable}


async def acls_and_users(admin: Admin) -> dict[str, Any]:
    """`raftmq user list` and `raftmq acl list`, from the metadata group (the lowest
    group id)'s leader."""
    cluster = await admin.describe_cluster(topics=False)
    groups = sorted(str(g) for g in cluster.get("groups") or {})
    if not groups:
        raise RequestError(Code.UNAVAILABLE, "the name servers know no group")
    meta = groups[0]
    users_req, acls_req = UserListRequest(), AclListRequest()
    users = UserListAnswer.decode((await admin.routes.call_group(
        meta, users_req.OP, users_req.header())).header).users
    acls = AclListAnswer.decode((await admin.routes.call_group(
        meta, acls_req.OP, acls_req.header())).header).acls
    return {"t": _now_ms(), "metadata_group": meta, "users": list(users),
            "acls": [dict(zip(ACL_FIELDS, a, strict=True)) for a in acls]}
