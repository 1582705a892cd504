"""The typed offset requests beside QUERY_OFFSET and COMMIT_OFFSET
(`wire.requests.offsets`): OFFSETS and DELETE_GROUP."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wire.wiretypes import holds_to_its_fields, refused, round_trip
from wire.protocol import Code
from wire.requests import (
    DeleteGroupAnswer,
    DeleteGroupRequest,
    OffsetsAnswer,
    OffsetsRequest,
    WireType,
)

names = st.from_regex(r"[A-Za-z0-9_%|.-]{1,20}", fullmatch=True)
ints = st.integers(0, 1 << 40)

EXAMPLES: list[WireType] = [
    OffsetsAnswer(rows=(("g0", "cg", "t", 1, 5),), led=("g0",)),
    DeleteGroupRequest(g="g0", cg="cg", req=(7, 1)),
    DeleteGroupAnswer(deleted=3),
]


@pytest.mark.parametrize("x", EXAMPLES, ids=lambda x: type(x).__name__)
def test_each_offsets_type_holds_to_its_fields(x: WireType) -> None:
    holds_to_its_fields(x)


@given(st.none() | names, st.lists(st.tuples(names, names, names, ints, ints), max_size=3),
       st.none() | st.tuples(st.integers(1, 1 << 40), ints))
def test_offsets_requests_survive_the_wire(
        cg: str | None, rows: list[tuple[str, str, str, int, int]],
        req: tuple[int, int] | None) -> None:
    round_trip(OffsetsRequest(cg=cg))
    round_trip(OffsetsAnswer(rows=tuple(rows), led=()))
    if cg is not None:
        round_trip(DeleteGroupRequest(g="g0", cg=cg, req=req))


def test_every_group_when_none_is_named() -> None:
    assert OffsetsRequest().header() == {}
    assert OffsetsRequest.decode({}).cg is None
    assert OffsetsRequest.decode({"cg": None}).cg is None


@pytest.mark.parametrize("cg", ["bad cg!", "", 5, ["c"]])
def test_a_bad_consumer_group_is_an_invalid_name_whatever_its_kind(cg: object) -> None:
    # as it has always been answered: the name rule refuses what is not a name
    refused(OffsetsRequest, {"cg": cg}, Code.INVALID_NAME, "group name")
    if isinstance(cg, str):
        refused(DeleteGroupRequest, {"g": "g0", "cg": cg}, Code.INVALID_NAME, "group name")


def test_a_delete_group_request_id_is_checked() -> None:
    refused(DeleteGroupRequest, {"g": "g0", "cg": "c", "req": [0, 1]}, Code.MALFORMED, "req")


@pytest.mark.parametrize("rows", [[["g0", "cg", "t", 1]], [["g0", "cg", "t", "1", 5]],
                                  [["g0", 1, "t", 1, 5]], ["row"]])
def test_offset_rows_are_checked(rows: list[object]) -> None:
    refused(OffsetsAnswer, {"rows": rows, "led": []}, Code.MALFORMED, "rows")
