"""The console's actions: create a topic, reset a group's offsets, move a group's
leadership, resend dead letters, decide a half message.

Each is a form POSTed twice: first without `confirm`, which changes nothing and answers
a page saying exactly what would happen (for an offset reset, the plan itself, from a
dry run); then with `confirm=yes`, which does it as the request's user (the cluster's
ACLs decide) and writes one audit line, done or refused. Input is checked before any
request is sent; bad input is a 400 and nothing changes.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from raftmq.client import Admin
from raftmq.client.admin import dead_letter_id
from raftmq.commands.group import parse_target
from raftmq.web.settings import WebSettings
from wire.protocol import RequestError, validate_group_name, validate_topic_name

from .login import BadLogin, admin_for, audit
from .render import error_status, failure, page

__all__ = ["ACTIONS", "action_routes"]

MAX_FORM = 64 * 1024
MAX_QUEUES = 1024

Form = dict[str, list[str]]


def _one(form: Form, name: str) -> str:
    values = form.get(name) or [""]
    value = values[0].strip()
    if not value:
        raise ValueError(f"{name} is required")
    return value


def _int(form: Form, name: str, lo: int, hi: int) -> int:
    text = _one(form, name)
    if not text.isdigit() or not lo <= int(text) <= hi:
        raise ValueError(f"{name} is a whole number from {lo} to {hi}, not {text!r}")
    return int(text)


@dataclass(frozen=True)
class Action:
    """One action: what it asks for (`check`: the form -> its arguments, raising
    ValueError), what the confirm page says, and how it is done."""

    name: str
    title: str
    check: Callable[[Form], dict[str, Any]]
    describe: Callable[[dict[str, Any]], str]
    perform: Callable[[Admin, dict[str, Any]], Awaitable[dict[str, Any]]]
    back: Callable[[dict[str, Any]], str]
    preview: Callable[[Admin, dict[str, Any]], Awaitable[dict[str, Any]]] | None = None


# ---------------------------------------------------------------- create topic

def _create_check(form: Form) -> dict[str, Any]:
    topic = _one(form, "topic")
    validate_topic_name(topic)
    return {"topic": topic, "queues": _int(form, "queues", 1, MAX_QUEUES)}


async def _create(admin: Admin, a: dict[str, Any]) -> dict[str, Any]:
    placement = await admin.create_topic(a["topic"], a["queues"])
    return {"placement": placement}


# ---------------------------------------------------------------- reset offsets

def _reset_check(form: Form) -> dict[str, Any]:
    group, topic = _one(form, "group"), _one(form, "topic")
    validate_group_name(group)
    validate_topic_name(topic)
    try:
        to = parse_target(_one(form, "to"))
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"to: {exc}") from None
    return {"group": group, "topic": topic, "to": to}


def _plan(plan: dict[int, tuple[int, int]]) -> dict[str, Any]:
    return {"queues": [{"queue": q, "old": o, "new": n} for q, (o, n) in plan.items()]}


async def _reset_preview(admin: Admin, a: dict[str, Any]) -> dict[str, Any]:
    return _plan(await admin.reset_offsets(a["group"], a["topic"], a["to"], dry_run=True))


async def _reset(admin: Admin, a: dict[str, Any]) -> dict[str, Any]:
    return _plan(await admin.reset_offsets(a["group"], a["topic"], a["to"]))


# ---------------------------------------------------------------- leadership

def _transfer_check(form: Form) -> dict[str, Any]:
    group = _one(form, "group")
    validate_group_name(group)
    return {"group": group, "node": _int(form, "node", 1, 1_000_000)}


async def _transfer(admin: Admin, a: dict[str, Any]) -> dict[str, Any]:
    await admin.transfer_leader(a["group"], a["node"])
    return {"preferred": a["node"]}


# ---------------------------------------------------------------- dead letters

def _resend_check(form: Form) -> dict[str, Any]:
    group = _one(form, "group")
    validate_group_name(group)
    ids = [i.strip() for i in form.get("id") or [] if i.strip()]
    if not ids:
        raise ValueError("choose the dead letters to resend (id)")
    if ids != ["all"]:
        for i in ids:
            dead_letter_id(i)  # ValueError names the bad one
    return {"group": group, "ids": ids}


async def _resend(admin: Admin, a: dict[str, Any]) -> dict[str, Any]:
    ids = "all" if a["ids"] == ["all"] else a["ids"]
    return {"resent": await admin.dlq_resend(a["group"], ids)}


# ---------------------------------------------------------------- half messages

def _decide_check(form: Form) -> dict[str, Any]:
    decision = _one(form, "decision")
    if decision not in ("commit", "rollback"):
        raise ValueError(f"decision is commit or rollback, not {decision!r}")
    return {"txid": _one(form, "txid"), "decision": decision}


async def _decide(admin: Admin, a: dict[str, Any]) -> dict[str, Any]:
    commit = a["decision"] == "commit"
    dup = await (admin.tx_commit(a["txid"]) if commit else admin.tx_rollback(a["txid"]))
    return {"already": dup}


ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("create-topic", "Create a topic", _create_check,
           lambda a: f"Create topic {a['topic']} with {a['queues']} queue(s), spread over "
                     "every group.",
           _create, lambda a: f"/topics/{quote(a['topic'], safe='')}"),
    Action("reset-offsets", "Reset a consumer group's offsets", _reset_check,
           lambda a: f"Move consumer group {a['group']}'s committed offsets on topic "
                     f"{a['topic']} to {a['to']}. The group must have no live member.",
           _reset, lambda a: f"/groups/{quote(a['group'], safe='')}", _reset_preview),
    Action("transfer-leader", "Transfer leadership", _transfer_check,
           lambda a: f"Make node {a['node']} the preferred leader of group {a['group']}: "
                     "leadership moves to it once it has caught up, and stays.",
           _transfer, lambda a: "/"),
    Action("dlq-resend", "Resend dead letters", _resend_check,
           lambda a: (f"Put {'every dead letter' if a['ids'] == ['all'] else ', '.join(a['ids'])}"
                      f" of consumer group {a['group']} back into its source queue as a new "
                      "message (every consumer group of the topic receives it)."),
           _resend, lambda a: f"/messages?dlq={quote(a['group'], safe='')}"),
    Action("tx-decide", "Decide a half message", _decide_check,
           lambda a: f"{'Commit (deliver)' if a['decision'] == 'commit' else 'Roll back (drop)'}"
                     f" half message {a['txid']}: the operator's decision, logged.",
           _decide, lambda a: "/transactions"),
)}


def _same_origin(request: Request) -> bool:
    """A form posted from another site (whose page the browser sends our login with) is
    refused: its Origin, when the browser says one, must be ours."""
    origin = request.headers.get("origin")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


def action_routes(settings: WebSettings) -> list[Route]:
    """POST /actions/<name> for each action."""

    def handler(action: Action) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            if not _same_origin(request):
                return failure(request, ValueError("a form from another site is refused"),
                               as_json=False)
            body = await request.body()
            try:
                if len(body) > MAX_FORM:
                    raise ValueError("the form is too large")
                form = parse_qs(body.decode(), keep_blank_values=True)
                args = action.check(form)
            except (ValueError, RequestError) as exc:  # INVALID_NAME from a name check
                return failure(request, exc, as_json=False)
            confirmed = (form.get("confirm") or [""])[0] == "yes"
            try:
                async with admin_for(request, settings) as admin:
                    if not confirmed:
                        preview = await action.preview(admin, args) if action.preview else None
                        return page(request, "confirm.html", action=action, args=args,
                                    summary=action.describe(args), preview=preview,
                                    fields=[(k, v) for k, vs in form.items() for v in vs
                                            if k != "confirm"],
                                    back=action.back(args))
                    result = await action.perform(admin, args)
            except (RequestError, ValueError, BadLogin) as exc:
                if confirmed:
                    audit(request, settings, action.name, args,
                          f"refused: {error_status(exc)[1]}")
                return failure(request, exc, as_json=False)
            audit(request, settings, action.name, args, "done")
            return page(request, "done.html", action=action, args=args, result=result,
                        summary=action.describe(args), back=action.back(args))
        return handle

    return [Route(f"/actions/{name}", handler(a), methods=["POST"], name=f"action-{name}")
            for name, a in ACTIONS.items()]
