"""The typed consumer group requests (`wire.requests.consumers`): HEARTBEAT and
CONSUMERS."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wire.wiretypes import holds_to_its_fields, refused, round_trip
from wire.protocol import Code
from wire.requests import (
    ConsumersAnswer,
    ConsumersRequest,
    HeartbeatAnswer,
    HeartbeatRequest,
    WireType,
)

names = st.from_regex(r"[A-Za-z0-9_%|.-]{1,20}", fullmatch=True)

EXAMPLES: list[tuple[WireType, tuple[str, ...]]] = [
    (HeartbeatRequest(cg="cg", client="host@1@ab", topics=("a", "b"), ttl_ms=9_000,
                      manual=True), ("topics",)),
    (HeartbeatAnswer(), ()),
    (ConsumersRequest(cg="cg", known=("c1", "c2"), wait_ms=20_000), ("known",)),
    (ConsumersAnswer(clients=("c1", "c2"), manual=("p1",)), ()),
]


@pytest.mark.parametrize(("x", "lenient"), EXAMPLES, ids=lambda x: type(x).__name__)
def test_each_consumers_type_holds_to_its_fields(x: WireType, lenient: tuple[str, ...]) -> None:
    holds_to_its_fields(x, lenient=lenient)


@given(names, st.text(min_size=1, max_size=20).filter(str.isprintable),
       st.lists(names, max_size=3), st.integers(0, 1 << 30), st.booleans(),
       st.none() | st.lists(st.text(max_size=5), max_size=3))
def test_consumer_requests_survive_the_wire(cg: str, client: str, topics: list[str],
                                            ttl_ms: int, manual: bool,
                                            known: list[str] | None) -> None:
    round_trip(HeartbeatRequest(cg=cg, client=client, topics=tuple(topics), ttl_ms=ttl_ms,
                                manual=manual))
    round_trip(ConsumersRequest(cg=cg, known=None if known is None else tuple(known)))


def test_defaults_are_left_out_and_filled_in() -> None:
    beat = HeartbeatRequest.decode({"cg": "cg", "client": "c"})
    assert (beat.topics, beat.ttl_ms, beat.manual) == ((), 30_000, False)
    assert ConsumersRequest(cg="cg").header() == {"cg": "cg"}
    assert ConsumersRequest(cg="cg", known=()).header() == {"cg": "cg", "known": []}


@pytest.mark.parametrize("topics", ["t", [1], {"t": 1}, None])
def test_topics_the_node_never_read_are_ignored_in_any_shape(topics: Any) -> None:
    assert HeartbeatRequest.decode({"cg": "cg", "client": "c", "topics": topics}).topics == ()


@pytest.mark.parametrize("known", ["c1", 5, {"c1": 1}, None])
def test_known_members_not_a_list_are_none_known(known: Any) -> None:
    assert ConsumersRequest.decode({"cg": "cg", "known": known}).known is None


@pytest.mark.parametrize("client", ["", "x" * 256, "tab\there"])
def test_a_client_id_is_bounded_and_printable(client: str) -> None:
    refused(HeartbeatRequest, {"cg": "cg", "client": client}, Code.MALFORMED, "client id")


@pytest.mark.parametrize("kind", [HeartbeatRequest, ConsumersRequest])
def test_a_bad_consumer_group_is_an_invalid_name(kind: type[WireType]) -> None:
    refused(kind, {"cg": "bad cg!", "client": "c"}, Code.INVALID_NAME, "group name")
