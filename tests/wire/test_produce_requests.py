"""The typed PRODUCE header and answer (`wire.requests.produce`): the body's format is
`wire.produce`'s (tests/wire/test_produce.py). Both types decode and encode by hand on
the hot path; here they are held to what the generic `WireType` code gives for the same
fields, outcome and error code alike."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.wire.wiretypes import holds_to_its_fields, refused, round_trip
from wire.produce import MAX_BATCHES, encode_error, encode_ok
from wire.protocol import Code, RequestError
from wire.requests import ProduceAnswer, ProduceRequest, WireType

_generic_decode = WireType.decode.__func__  # type: ignore[attr-defined]

EXAMPLES: list[WireType] = [
    ProduceRequest(g="g0"),
    ProduceRequest(g="g0", sizes=(10, 20)),
    ProduceAnswer(base=5, n=2, index=9, dup=False, shift=0),
    ProduceAnswer(base=5, n=2, index=9, dup=True),  # from an older node: no shift
    ProduceAnswer(results=(encode_ok(5, 2, 9, False, 0),
                           encode_error(RequestError(Code.UNKNOWN_QUEUE, "no queue 7")))),
]


@pytest.mark.parametrize("x", EXAMPLES, ids=lambda x: x.describe())
def test_each_produce_type_holds_to_its_fields(x: WireType) -> None:
    holds_to_its_fields(x)
    assert x.header() == WireType.header(x)


def _same_as_generic(h: dict[Any, Any]) -> None:
    try:
        want: Any = _generic_decode(ProduceRequest, h)
    except RequestError as exc:
        want = exc.code
    try:
        got: Any = ProduceRequest.decode(h)
    except RequestError as exc:
        got = exc.code
    assert got == want, h


values = st.one_of(st.none(), st.booleans(), st.integers(-2, 5), st.text(max_size=3),
                   st.lists(st.integers(-1, 5) | st.booleans() | st.text(max_size=1),
                            max_size=4))


@settings(suppress_health_check=[HealthCheck.too_slow])  # a loaded machine is no failure
@given(st.dictionaries(st.sampled_from(["g", "sizes", "op", "id"]), values))
def test_the_hand_decoder_is_the_generic_one(h: dict[str, Any]) -> None:
    _same_as_generic(h)


@given(st.text(max_size=8), st.lists(st.integers(1, 1 << 30), min_size=1, max_size=20))
def test_a_produce_request_survives_the_wire(g: str, sizes: list[int]) -> None:
    round_trip(ProduceRequest(g=g))
    round_trip(ProduceRequest(g=g, sizes=tuple(sizes)))
    _same_as_generic({"g": g, "sizes": sizes})


@pytest.mark.parametrize(("sizes", "says"), [
    ([], "sizes"), (None, "sizes"), ([0], "batch size 0"), ([5, -1], "batch size -1"),
    ([True], "batch size True"), (["5"], "batch size '5'"),
    ([1] * (MAX_BATCHES + 1), "sizes"),
])
def test_sizes_are_checked(sizes: Any, says: str) -> None:
    refused(ProduceRequest, {"g": "g0", "sizes": sizes}, Code.MALFORMED, says)


def test_the_single_batch_form_leaves_sizes_out() -> None:
    assert ProduceRequest(g="g0").header() == {"g": "g0"}
    assert ProduceRequest.decode({"g": "g0"}).sizes == ()
    assert ProduceRequest(g="g0", sizes=(3,)).header() == {"g": "g0", "sizes": [3]}


def test_a_stored_batch_is_answered_with_every_field() -> None:
    # as the node always answered: dup and shift even when false and 0
    assert ProduceAnswer(base=0, n=1, index=2, dup=False, shift=0).header() == {
        "base": 0, "n": 1, "index": 2, "dup": False, "shift": 0}
    assert ProduceAnswer.decode({"results": [[0, 1, 1, 2, False, 0]]}).results == (
        [0, 1, 1, 2, False, 0],)
