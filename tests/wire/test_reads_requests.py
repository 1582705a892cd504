"""The typed reads beside FETCH (`wire.requests.reads`): GET_MESSAGE, QUERY_KEY and
READ_RAW (node to node, for repairs)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wire.wiretypes import holds_to_its_fields, refused, round_trip
from wire.protocol import Code
from wire.requests import (
    GetMessageAnswer,
    GetMessageRequest,
    QueryKeyAnswer,
    QueryKeyRequest,
    ReadRawAnswer,
    ReadRawRequest,
    WireType,
)

names = st.from_regex(r"[A-Za-z0-9_%|.-]{1,20}", fullmatch=True)
ints = st.integers(0, 1 << 40)

EXAMPLES: list[WireType] = [
    GetMessageRequest(msg_id="g0:12:8"),
    GetMessageAnswer(topic="t", queue=1, g="g0", msgs=([3, 12, 8, 1700000000000],)),
    QueryKeyRequest(topic="t", key="k", max=5),
    QueryKeyAnswer(msgs=(["g0", 1, 3, 12, 8, 1700000000000],), searched=("g0", "g1")),
    ReadRawRequest(g="g0", index=7, hi=9),
    ReadRawAnswer(term=3),
]


@pytest.mark.parametrize("x", EXAMPLES, ids=lambda x: type(x).__name__)
def test_each_read_type_holds_to_its_fields(x: WireType) -> None:
    holds_to_its_fields(x)


@given(names, st.text(max_size=8), st.integers(-5, 5000), st.none() | ints)
def test_read_requests_survive_the_wire(topic: str, key: str, max_: int,
                                        hi: int | None) -> None:
    round_trip(QueryKeyRequest(topic=topic, key=key, max=max_))
    round_trip(ReadRawRequest(g=topic, index=0 if hi is None else hi - 1, hi=hi))


def test_defaults_are_left_out_and_filled_in() -> None:
    assert QueryKeyRequest.decode({"topic": "t", "key": "k"}).max == 32
    raw = ReadRawRequest(g="g0", index=4)
    assert raw.header() == {"g": "g0", "index": 4} and raw.end == 5
    assert ReadRawRequest.decode({"g": "g0", "index": 4, "hi": 10}).end == 10


def test_the_message_id_is_checked_and_parsed() -> None:
    assert GetMessageRequest.decode({"msg_id": "g-1:12:8"}).parts == ("g-1", 12, 8)
    for bad in ("garbage", "g0:x:y", "g0:1"):
        refused(GetMessageRequest, {"msg_id": bad}, Code.MALFORMED, bad)


def test_a_bad_topic_is_an_invalid_name() -> None:
    refused(QueryKeyRequest, {"topic": "bad name!", "key": "k"}, Code.INVALID_NAME, "topic")


@pytest.mark.parametrize("hi", [4, 3, -1])
def test_a_raw_range_must_end_above_its_start(hi: int) -> None:
    refused(ReadRawRequest, {"g": "g0", "index": 4, "hi": hi}, Code.MALFORMED, "hi")


def test_searched_groups_are_strings() -> None:
    refused(QueryKeyAnswer, {"msgs": [], "searched": [1]}, Code.MALFORMED, "searched")


def test_a_fetch_filter_longer_than_the_cap_is_refused_naming_the_cap() -> None:
    from wire.protocol import Code, RequestError
    from wire.requests import FetchRequest
    from wire.requests.reads import MAX_FILTER_CHARS

    ok = "a = '" + "x" * (MAX_FILTER_CHARS - 6) + "'"
    assert FetchRequest.decode({"topic": "t", "queue": 0, "offset": 0, "sql": ok}).sql == ok
    try:
        FetchRequest.decode({"topic": "t", "queue": 0, "offset": 0, "sql": ok + " "})
    except RequestError as exc:
        assert exc.code == Code.MALFORMED and str(MAX_FILTER_CHARS) in exc.message
    else:
        raise AssertionError("a filter over the cap was taken")
