"""How the console answers: pages from the Jinja2 templates beside this module, JSON
for the live endpoints, and one table from the cluster's error codes to HTTP statuses,
so a refusal reads the same on every page."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from raftmq.web.errors import status_of
from wire.protocol import RequestError

from .login import BadLogin

__all__ = ["HERE", "error_status", "failure", "json_answer", "page"]

HERE = Path(__file__).parent
REALM = 'Basic realm="raftmq console", charset="UTF-8"'



def _when(ms: object) -> str:
    if not isinstance(ms, (int, float)) or ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def _num(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".")
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v) or "-"
    return str(v)


ENV = Environment(loader=FileSystemLoader(HERE / "templates"),
                  autoescape=select_autoescape(["html"]))
ENV.filters["num"] = _num
ENV.filters["when"] = _when
ENV.filters["tojson_attr"] = lambda v: json.dumps(v, default=str)


def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A page of the console; `nav` marks the menu entry it belongs to."""
    # under a mount (`raftmq.web.app`), links start at its path
    root = str(request.scope.get("root_path", "")).rstrip("/")
    html = ENV.get_template(template).render(request=request, root=root, **context)
    return HTMLResponse(html, status_code=status)


def json_answer(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(json.loads(json.dumps(data, default=str)), status_code=status,
                        headers={"Cache-Control": "no-store"})


def error_status(exc: BaseException) -> tuple[int, str, str]:
    """(HTTP status, code name, message) of a failure a handler may meet."""
    if isinstance(exc, RequestError):
        return status_of(exc), exc.code.name, exc.message
    if isinstance(exc, BadLogin):
        return 401, "UNAUTHENTICATED", str(exc)
    return 400, "BAD_REQUEST", str(exc)  # ValueError: the input was wrong


def failure(request: Request, exc: BaseException, *, as_json: bool, nav: str = "") -> Response:
    """The answer to a failed request: a 401 asks the browser for a login."""
    status, code, message = error_status(exc)
    headers = {"WWW-Authenticate": REALM} if status == 401 else {}
    if as_json:
        response: Response = json_answer({"error": {"code": code, "message": message}}, status)
    else:
        response = page(request, "error.html", status, nav=nav, code=code, message=message,
                        http_status=status)
    response.headers.update(headers)
    return response
