"""The typed topic requests (`wire.requests.topics`): CREATE_TOPIC, DELETE_TOPIC,
GROW_TOPIC and TOPICS."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wire.wiretypes import holds_to_its_fields, refused, round_trip
from wire.protocol import Code, RequestError
from wire.requests import (
    CreateTopicAnswer,
    CreateTopicRequest,
    DeleteTopicAnswer,
    DeleteTopicRequest,
    GrowTopicAnswer,
    GrowTopicRequest,
    TopicsAnswer,
    TopicsRequest,
    WireType,
)

names = st.from_regex(r"[A-Za-z0-9_%|.-]{1,20}", fullmatch=True)
ints = st.integers(0, 1 << 40)

EXAMPLES: list[WireType] = [
    CreateTopicRequest(g="g0", topic="t", queues=4, hosted=(0, 2)),
    CreateTopicAnswer(),
    DeleteTopicRequest(g="g0", topic="t", req=(3, 9)),
    DeleteTopicAnswer(),
    GrowTopicRequest(g="g1", topic="t", queues=8, hosted=(1, 3, 5, 7), req=(3, 10)),
    GrowTopicAnswer(),
    TopicsRequest(g="g0"),
    TopicsAnswer(topics={"t": {"queues": 4, "hosted": {"g0": [0, 2], "g1": [1, 3]}}}),
]


@pytest.mark.parametrize("x", EXAMPLES, ids=lambda x: type(x).__name__)
def test_each_topic_type_holds_to_its_fields(x: WireType) -> None:
    holds_to_its_fields(x)


@given(names, st.integers(1, 1024), st.data(),
       st.none() | st.tuples(st.integers(1, 1 << 40), ints))
def test_topic_requests_survive_the_wire(topic: str, queues: int, data: st.DataObject,
                                         req: tuple[int, int] | None) -> None:
    hosted = tuple(data.draw(st.lists(st.integers(0, queues - 1), min_size=1, max_size=5)))
    round_trip(CreateTopicRequest(g="g0", topic=topic, queues=queues, hosted=hosted))
    round_trip(GrowTopicRequest(g="g0", topic=topic, queues=queues, hosted=hosted, req=req))
    round_trip(DeleteTopicRequest(g="g0", topic=topic, req=req))


def test_every_group_when_none_is_named() -> None:
    assert TopicsRequest().header() == {}
    assert TopicsRequest.decode({}).g is None


def _create(**fields: Any) -> dict[str, Any]:
    return {"g": "g0", "topic": "N", "queues": 2, "hosted": [0], **fields}


@pytest.mark.parametrize(("header", "says"), [
    (_create(queues=0), "queues must be"),
    (_create(queues=-3), "queues must be"),
    (_create(hosted=[]), "hosted"),
    (_create(hosted=[2]), "hosted"),
    (_create(hosted=[-1]), "hosted"),
    (_create(hosted=["0"]), "hosted"),
    (_create(hosted=[True]), "hosted"),
    (_create(req=[1, 2]), None),  # no such field of CREATE_TOPIC: ignored
])
def test_create_checks_its_queues(header: dict[str, Any], says: str | None) -> None:
    if says is None:
        CreateTopicRequest.decode(header)
        return
    refused(CreateTopicRequest, header, Code.MALFORMED, says)


def test_grow_may_host_nothing_new_here_but_only_queues_it_has() -> None:
    assert GrowTopicRequest.decode(_create(hosted=[])).hosted == ()
    refused(GrowTopicRequest, _create(hosted=[2]), Code.MALFORMED, "hosted")
    refused(GrowTopicRequest, _create(req=[1]), Code.MALFORMED, "req")


@pytest.mark.parametrize("kind", [CreateTopicRequest, GrowTopicRequest, DeleteTopicRequest])
def test_a_bad_topic_is_an_invalid_name(kind: type[WireType]) -> None:
    refused(kind, _create(topic="bad name!"), Code.INVALID_NAME, "topic")


def test_the_sdk_cannot_build_a_create_its_node_would_refuse() -> None:
    with pytest.raises(RequestError) as caught:
        CreateTopicRequest(g="g0", topic="t", queues=2, hosted=(2,))
    assert caught.value.code == Code.MALFORMED
