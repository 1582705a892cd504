"""How one API endpoint is declared, served and described.

An `Endpoint` names its method, path, request and response dataclasses and query
parameters; `route(endpoint, settings)` turns it into a Starlette route that reads the
body (within `WebSettings.max_body_bytes`), decodes it (`raftmq.web.schema`), finds the
user's clients (`raftmq.web.auth`), runs the handler, maps failures through the one
error table (`raftmq.web.errors`) and audits state changes; `openapi(endpoints)`
describes the same declarations as an OpenAPI 3.1 document. Declaring once and deriving
both keeps the document true to the code.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from raftmq.client.errors import ClientClosedError
from wire.protocol import RequestError

from .auth import WebClients, audit, clients_for
from .errors import HTTP_STATUS, error_response, request_error_response
from .schema import BadInput, decode, encode, json_schema
from .settings import WebSettings

__all__ = ["Endpoint", "Query", "RawBody", "openapi", "route"]

log = logging.getLogger("raftmq.web")

Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Query:
    """A query parameter: `kind` int or str; `low`/`high` bound an int."""

    name: str
    kind: Literal["int", "str", "bool"]
    description: str
    low: int | None = None
    high: int | None = None

    def parse(self, raw: str | None) -> Any:
        if raw is None:
            return None
        if self.kind == "str":
            return raw
        if self.kind == "bool":
            if raw not in ("true", "false", "1", "0"):
                raise BadInput(f"query {self.name}: expected true or false")
            return raw in ("true", "1")
        try:
            value = int(raw)
        except ValueError:
            raise BadInput(f"query {self.name}: expected an integer, got {raw!r}") from None
        if (self.low is not None and value < self.low) or (
                self.high is not None and value > self.high):
            raise BadInput(f"query {self.name}: must be within {self.low}..{self.high}")
        return value


@dataclass(frozen=True)
class RawBody:
    """The raw bytes of an `application/octet-stream` body and its request headers."""

    data: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    name: str
    summary: str
    handler: Handler
    response: type
    request: type | None = None
    query: tuple[Query, ...] = ()
    writes: bool = False  # state-changing: audited
    raw_headers: tuple[tuple[str, str], ...] = ()  # accepts octet-stream; (header, what)
    tag: str = "api"
    statuses: tuple[int, ...] = field(default=(400, 401, 403, 404, 503))

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.path)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


class _TooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over the limit of {limit} bytes")


async def _decoded_body(ep: Endpoint, request: Request, settings: WebSettings) -> Any:
    if ep.request is None and not ep.raw_headers:
        return None
    data = await _read_body(request, settings.max_body_bytes)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ep.raw_headers and ctype == "application/octet-stream":
        return RawBody(data, {k.lower(): v for k, v in request.headers.items()})
    if ep.request is None:
        raise BadInput("this endpoint takes an application/octet-stream body")
    if not data:
        parsed: Any = {}
    else:
        try:
            parsed = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadInput(f"the body is not valid JSON: {exc}") from None
    return decode(ep.request, parsed)


def route(ep: Endpoint, settings: WebSettings) -> Route:
    """The Starlette route serving `ep`."""

    async def serve(request: Request) -> Response:
        target = "/".join(str(v) for v in request.path_params.values())
        try:
            query = {q.name: q.parse(request.query_params.get(q.name)) for q in ep.query}
            clients: WebClients = await clients_for(request)
            body = await _decoded_body(ep, request, settings)
            result = await ep.handler(request, clients, body=body, **request.path_params,
                                      **query)
        except BadInput as exc:
            return _refused(ep, request, target, error_response(400, "MALFORMED", str(exc)))
        except _TooLarge as exc:
            return _refused(ep, request, target, error_response(413, "MESSAGE_TOO_LARGE",
                                                                str(exc)))
        except RequestError as exc:
            return _refused(ep, request, target, request_error_response(exc))
        except ClientClosedError as exc:  # the user's session was closed under the request
            return _refused(ep, request, target, error_response(503, "UNAVAILABLE", str(exc)))
        except ValueError as exc:  # the SDK refusing an argument
            return _refused(ep, request, target, error_response(400, "MALFORMED", str(exc)))
        if ep.writes:
            audit(request, ep.name, target, "ok")
        if isinstance(result, Response):
            return result
        return JSONResponse(encode(result))

    return Route(ep.path, serve, methods=[ep.method], name=ep.name)


def _refused(ep: Endpoint, request: Request, target: str, response: JSONResponse) -> Response:
    if ep.writes:
        body = json.loads(bytes(response.body))
        audit(request, ep.name, target, str(body.get("error")), status=response.status_code)
    return response


# ------------------------------------------------------------------ OpenAPI

_STATUS_TEXT = {400: "bad input: nothing was written", 401: "log in (HTTP Basic)",
                403: "the user's ACLs do not allow it", 404: "no such topic, group or item",
                409: "conflicts with the current state", 413: "body or message too large",
                416: "offset out of range", 422: "over a transaction limit", 503: "retriable: try again after Retry-After",
                504: "outcome unknown: check before repeating"}


def openapi(endpoints: list[Endpoint], *, prefix: str, title: str,
            version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `endpoints` as served under `prefix`."""
    components: dict[str, Any] = {}
    error_schema = json_schema(ErrorBody, components)
    paths: dict[str, Any] = {}
    for ep in endpoints:
        op: dict[str, Any] = {"operationId": ep.name, "summary": ep.summary, "tags": [ep.tag]}
        params: list[dict[str, Any]] = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in ep.path_params]
        for q in ep.query:
            sch: dict[str, Any] = {"type": {"int": "integer", "str": "string",
                                            "bool": "boolean"}[q.kind]}
            if q.low is not None:
                sch["minimum"] = q.low
            if q.high is not None:
                sch["maximum"] = q.high
            params.append({"name": q.name, "in": "query", "required": False,
                           "description": q.description, "schema": sch})
        for header, what in ep.raw_headers:
            params.append({"name": header, "in": "header", "required": False,
                           "description": f"with an octet-stream body: {what}",
                           "schema": {"type": "string"}})
        if params:
            op["parameters"] = params
        content: dict[str, Any] = {}
        if ep.request is not None:
            content["application/json"] = {"schema": json_schema(ep.request, components)}
        if ep.raw_headers:
            content["application/octet-stream"] = {"schema": {"type": "string",
                                                              "format": "binary"}}
        if content:
            op["requestBody"] = {"required": ep.request is not None and not ep.raw_headers,
                                 "content": content}
        responses: dict[str, Any] = {"200": {
            "description": "done", "content": {"application/json": {
                "schema": json_schema(ep.response, components)}}}}
        for status in sorted(set(ep.statuses) | ({413} if content else set())):
            responses[str(status)] = {"description": _STATUS_TEXT.get(status, "error"),
                                      "content": {"application/json": {
                                          "schema": error_schema}}}
        op["responses"] = responses
        paths.setdefault(prefix + ep.path, {})[ep.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "JSON over HTTP for raftmq. Errors are "
                                "{\"error\": CODE, \"message\": text}; see docs/http.md "
                                "for the status of each code."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"basic": {"type": "http", "scheme": "basic"}}},
        "security": [{"basic": []}, {}],
    }


@dataclass
class ErrorBody:
    """Every failure: `error` is the raftmq code's name (or OUTCOME_UNKNOWN)."""

    error: str
    message: str


assert all(s in _STATUS_TEXT for s in set(HTTP_STATUS.values()) if s != 500)
