"""The console's pages and the live JSON they poll: one gathering function per view
(`data`), rendered as a page at its path and sent as JSON under `/console/...`, so
what a page first shows and what refreshes it are the same numbers."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from raftmq.client import Admin
from raftmq.web.settings import WebSettings
from wire.protocol import Code, RequestError

from . import chaosruns, data
from .login import BadLogin, admin_for
from .render import failure, json_answer, page

__all__ = ["page_routes"]

Gather = Callable[[Request, Admin], Awaitable[dict[str, Any]]]


async def _messages(request: Request, admin: Admin) -> dict[str, Any]:
    q = request.query_params
    msg_id, topic, key = q.get("id", "").strip(), q.get("topic", "").strip(), q.get("key", "")
    dlq = q.get("dlq", "").strip()
    out: dict[str, Any] = {"query": {"id": msg_id, "topic": topic, "key": key, "dlq": dlq},
                           "messages": None, "trace": None, "dlq": None}
    if msg_id or (topic and key):
        found = await data.message_view(admin, msg_id=msg_id, topic=topic, key=key)
        out["messages"], out["trace"] = found["messages"], found["trace"]
    elif topic or key:
        raise ValueError("a lookup by key needs both the topic and the key")
    if dlq:
        out["dlq"] = await data.dead_letters(admin, dlq)
    return out


VIEWS: dict[str, tuple[str, str, Gather]] = {
    # name: (path below / and /console/, template, gathering)
    "cluster": ("cluster", "cluster.html", lambda r, a: data.cluster_view(a)),
    "topics": ("topics", "topics.html", lambda r, a: data.topics_list(a)),
    "topic": ("topics/{topic}", "topic.html",
              lambda r, a: data.topic_view(a, r.path_params["topic"])),
    "groups": ("groups", "groups.html", lambda r, a: data.groups_list(a)),
    "group": ("groups/{group}", "group.html",
              lambda r, a: data.group_view(a, r.path_params["group"])),
    "messages": ("messages", "messages.html", _messages),
    "transactions": ("transactions", "transactions.html", lambda r, a: data.transactions(a)),
    "users": ("users", "users.html", lambda r, a: data.acls_and_users(a)),
}
NAV = {"cluster": "cluster", "topic": "topics", "group": "groups"}


def page_routes(settings: WebSettings) -> list[Route]:
    """Each view as a page and as JSON, and the chaos run pages."""
    routes: list[Route] = []

    def serve(name: str, template: str, gather: Gather, as_json: bool
              ) -> Callable[[Request], Awaitable[Response]]:
        nav = NAV.get(name, name)

        async def handle(request: Request) -> Response:
            try:
                async with admin_for(request, settings) as admin:
                    found = await gather(request, admin)
            except (RequestError, ValueError, BadLogin) as exc:
                return failure(request, exc, as_json=as_json, nav=nav)
            if as_json:
                return json_answer(found)
            path = request.url.path
            live = "/console/cluster" if path == "/" else "/console" + path
            if request.url.query:
                live += "?" + request.url.query
            return page(request, template, nav=nav, d=found, live=live)
        return handle

    for name, (path, template, gather) in VIEWS.items():
        page_path = "/" if name == "cluster" else f"/{path}"
        routes.append(Route(page_path, serve(name, template, gather, False), name=name))
        routes.append(Route(f"/console/{path}", serve(name, template, gather, True),
                            name=f"{name}-json"))
    routes += _chaos_routes(settings)
    return routes


def _chaos_routes(settings: WebSettings) -> list[Route]:
    root = settings.chaos_dir

    async def runs(request: Request) -> Response:
        found = chaosruns.find_runs(root) if root is not None and root.is_dir() else []
        if request.url.path.startswith("/console/"):
            return json_answer({"dir": str(root) if root else None, "runs": found})
        return page(request, "chaos.html", nav="chaos", root_dir=root, runs=found)

    async def one(request: Request) -> Response:
        name = request.query_params.get("name", "")
        folder = chaosruns.run_dir(root, name) if root is not None and name else None
        if folder is None:
            return failure(request, _not_found(f"no chaos run {name!r}"),
                           as_json=False, nav="chaos")
        if request.url.path.endswith("/report"):
            report = folder / "report.html"
            if not report.is_file():
                return failure(request, _not_found(f"{name} has no report.html"),
                               as_json=False, nav="chaos")
            return FileResponse(report, media_type="text/html")
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        return page(request, "chaos_run.html", nav="chaos", name=name,
                    summary=chaosruns.summary(results), results=results,
                    has_report=(folder / "report.html").is_file())

    return [Route("/chaos", runs, name="chaos"), Route("/console/chaos", runs),
            Route("/chaos/run", one, name="chaos-run"),
            Route("/chaos/run/report", one, name="chaos-report")]


def _not_found(message: str) -> RequestError:
    return RequestError(Code.NOT_FOUND, message)
