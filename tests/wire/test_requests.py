"""The typed requests and answers (`wire.requests`): what a header decodes to, what a
malformed one is answered, the round trip both ends rely on, and the generated protocol
reference kept current."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import wire.protocol
from tests.paths import REPO_ROOT as ROOT
from wire.protocol import Code, Op, RequestError
from wire.requests import (
    TYPES,
    CommitOffsetRequest,
    FetchRequest,
    QueryOffsetAnswer,
    QueryOffsetRequest,
    op_comments,
    reference,
)

names = st.from_regex(r"[A-Za-z0-9_%|.-]{1,20}", fullmatch=True)
ints = st.integers(0, 1 << 40)


@given(names, ints, ints, st.integers(1, 4096), ints, st.integers(0, 60_000),
       st.lists(st.text(min_size=1, max_size=8), max_size=3), st.none() | names)
def test_a_fetch_request_survives_the_wire(topic: str, queue: int, offset: int, max_: int,
                                           max_bytes: int, wait_ms: int, tags: list[str],
                                           g: str | None) -> None:
    req = FetchRequest(topic=topic, queue=queue, offset=offset, max=max_,
                       max_bytes=max_bytes, wait_ms=wait_ms, tags=tuple(tags), g=g)
    assert FetchRequest.decode(req.header()) == req
    assert req.describe().startswith("FETCH request(topic=")


@given(names, st.lists(st.tuples(names, ints, ints), max_size=4),
       st.none() | st.tuples(st.integers(1, 1 << 40), ints))
def test_a_commit_request_survives_the_wire(cg: str, offsets: list[tuple[str, int, int]],
                                            req: tuple[int, int] | None) -> None:
    r = CommitOffsetRequest(cg=cg, offsets=tuple(offsets), req=req)
    assert CommitOffsetRequest.decode(r.header()) == r


def test_defaults_are_left_out_and_filled_in() -> None:
    req = FetchRequest(topic="t", queue=0, offset=5)
    assert req.header() == {"topic": "t", "queue": 0, "offset": 5}
    assert FetchRequest.decode({"topic": "t", "queue": 0, "offset": 5, "g": None}) == req
    assert QueryOffsetAnswer.decode({"offset": -1}).offset == -1


@pytest.mark.parametrize(("kind", "header", "code", "says"), [
    (FetchRequest, {"queue": 0, "offset": 0}, Code.MALFORMED, "missing field 'topic'"),
    (FetchRequest, {"topic": 5, "queue": 0, "offset": 0}, Code.MALFORMED, "'topic'"),
    (FetchRequest, {"topic": "no spaces", "queue": 0, "offset": 0}, Code.INVALID_NAME,
     "topic"),
    (FetchRequest, {"topic": "t", "queue": True, "offset": 0}, Code.MALFORMED, "'queue'"),
    (FetchRequest, {"topic": "t", "queue": 0, "offset": 1.0}, Code.MALFORMED, "'offset'"),
    (FetchRequest, {"topic": "t", "queue": 0, "offset": 0, "tags": [1]}, Code.MALFORMED,
     "tags"),
    (FetchRequest, {"topic": "t", "queue": 0, "offset": 0, "g": 3}, Code.MALFORMED, "'g'"),
    (QueryOffsetRequest, {"cg": ["c"], "topic": "t", "queue": 0}, Code.MALFORMED, "'cg'"),
    (CommitOffsetRequest, {"cg": "c", "offsets": [["t", 0]]}, Code.MALFORMED, "offsets"),
    (CommitOffsetRequest, {"cg": "c", "offsets": [["t", 0, -1]]}, Code.MALFORMED, "offsets"),
    (CommitOffsetRequest, {"cg": "c", "offsets": [], "req": [0, 1]}, Code.MALFORMED, "req"),
])
def test_a_malformed_header_is_refused_naming_what_is_wrong(
        kind: Any, header: dict[str, Any], code: Code, says: str) -> None:
    with pytest.raises(RequestError) as caught:
        kind.decode(header)
    assert caught.value.code == code and says in caught.value.message


def test_every_typed_op_has_a_request_and_an_answer_of_its_own() -> None:
    for op, (request, answer) in TYPES.items():
        assert (request.OP, request.ROLE, answer.OP, answer.ROLE) == (
            op, "request", op, "answer")


def test_the_protocol_reference_is_generated_from_the_types_and_current() -> None:
    source = Path(wire.protocol.__file__).read_text()
    comments = op_comments(source)
    assert set(comments) == set(Op), "every op has its comment"
    assert "(topic, queue, offset, max" in comments[Op.FETCH]
    want = reference(comments)
    assert (ROOT / "docs" / "protocol.md").read_text() == want, (
        "docs/protocol.md is stale: run `python -m wire.requests > docs/protocol.md`")
