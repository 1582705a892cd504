"""The OpenAPI description the application serves says what its code accepts.

Served by the real application (`build_app`, no cluster needed to read the document):
every endpoint's path and query parameters are the ones its handler takes, every JSON
request body's schema has the request dataclass's fields (required exactly when the field
has no default), and for each field a JSON Schema validator and the API's own decoder
(`raftmq.web.schema.decode`) agree on which values are acceptable — so a client generated
from the document sends only what the API takes, and is refused only where it says so.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import anyio
import httpx
import pytest
from jsonschema import Draft202012Validator

from raftmq.web.api import API_PREFIX, ENDPOINTS
from raftmq.web.app import build_app
from raftmq.web.endpoints import Endpoint
from raftmq.web.schema import BadInput, decode
from raftmq.web.settings import WebSettings

# values of every JSON type: each field is tried with each of them
PROBES: list[Any] = [None, "text", 7, 1.5, True, [], {}, ["text"], {"k": "v"}]


@pytest.fixture(scope="module")
def served() -> dict[str, Any]:
    app = build_app(WebSettings(namesrv=("127.0.0.1:1",)))  # never dialled here

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://web") as client:
            return await client.get(API_PREFIX + "/openapi.json")

    r = anyio.run(get)
    assert r.status_code == 200
    document: dict[str, Any] = r.json()
    return document


def _operation(doc: dict[str, Any], ep: Endpoint) -> dict[str, Any]:
    op: dict[str, Any] = doc["paths"][API_PREFIX + ep.path][ep.method.lower()]
    return op


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].removeprefix("#/components/schemas/")
        schema = doc["components"]["schemas"][name]
    return schema


def _example(doc: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A value the schema allows, every optional property included."""
    schema = _resolve(doc, schema)
    if "anyOf" in schema:
        return _example(doc, next(s for s in schema["anyOf"] if s.get("type") != "null"))
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        return {k: _example(doc, v) for k, v in schema["properties"].items()}
    if kind == "object":
        return {"k": _example(doc, schema.get("additionalProperties", {}))}
    if kind == "array":
        return [_example(doc, schema["items"])]
    if schema.get("contentEncoding") == "base64":
        return "aGk="
    return {"string": "text", "integer": 3, "number": 2.5, "boolean": False,
            None: "anything"}[kind]


def _accepted(cls: type, body: Any) -> bool:
    try:
        decode(cls, body)
    except BadInput:
        return False
    return True


def _handler_params(ep: Endpoint) -> set[str]:
    params = inspect.signature(ep.handler).parameters
    return {name for name, p in params.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "body"}


@pytest.mark.parametrize("ep", ENDPOINTS, ids=lambda ep: ep.name)
def test_parameters_are_what_the_handler_takes(served: dict[str, Any], ep: Endpoint) -> None:
    op = _operation(served, ep)
    described = op.get("parameters", [])
    path = {p["name"] for p in described if p["in"] == "path"}
    query = {p["name"] for p in described if p["in"] == "query"}
    assert path == set(ep.path_params)
    assert query == {q.name for q in ep.query}
    assert path | query == _handler_params(ep)


@pytest.mark.parametrize("ep", [ep for ep in ENDPOINTS if ep.request is not None],
                         ids=lambda ep: ep.name)
def test_a_request_body_schema_is_its_dataclass(served: dict[str, Any], ep: Endpoint) -> None:
    assert ep.request is not None
    op = _operation(served, ep)
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    component = _resolve(served, schema)
    fields = {f.name: f for f in dataclasses.fields(ep.request)}
    assert set(component["properties"]) == set(fields)
    required = {name for name, f in fields.items()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert set(component.get("required", [])) == required
    assert component["additionalProperties"] is False


@pytest.mark.parametrize("ep", [ep for ep in ENDPOINTS if ep.request is not None],
                         ids=lambda ep: ep.name)
def test_the_schema_and_the_decoder_accept_the_same_bodies(served: dict[str, Any],
                                                          ep: Endpoint) -> None:
    assert ep.request is not None
    schema = _operation(served, ep)["requestBody"]["content"]["application/json"]["schema"]
    # the document as the root, so its component references resolve
    validator = Draft202012Validator({**schema, "components": served["components"]})
    full = _example(served, schema)
    assert validator.is_valid(full) and _accepted(ep.request, full), full
    assert not validator.is_valid({**full, "no_such_field": 1})
    assert not _accepted(ep.request, {**full, "no_such_field": 1})
    for name in full:
        without = {k: v for k, v in full.items() if k != name}
        assert validator.is_valid(without) == _accepted(ep.request, without), name
        for probe in PROBES:
            body = {**full, name: probe}
            assert validator.is_valid(body) == _accepted(ep.request, body), (name, probe)
