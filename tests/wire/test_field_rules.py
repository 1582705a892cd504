"""The field rules every end applies (`wire.protocol`'s `is_int` and request ids,
`wire.requests.is_offset_item`): one definition each, which the typed requests, the doors
and the state machine's records share, so a value one accepts the others accept too."""

from __future__ import annotations

from typing import Any

import pytest

from broker.state.parts.base import Refused
from broker.state.parts.offsets import CommitOffsets
from broker.state.parts.requests import Requests
from wire.protocol import (
    REQUEST_ID_RULE,
    Code,
    RequestError,
    check_request_id,
    is_int,
    request_id_field,
    valid_request_id,
)
from wire.requests import CommitOffsetRequest, is_offset_item


def test_an_int_is_never_a_bool() -> None:
    assert is_int(0) and is_int(-3) and is_int(1 << 70)
    assert not is_int(True) and not is_int(False)
    assert not is_int(1.0) and not is_int("1") and not is_int(None)


GOOD_IDS = [([1, 0], (1, 0)), ((7, 3), (7, 3)), ([(1 << 64) - 1, (1 << 64) - 1],
                                                  ((1 << 64) - 1, (1 << 64) - 1))]
BAD_IDS: list[Any] = [None, 5, "1,2", [], [1], [1, 2, 3], [0, 1], [-1, 1], [1, -1],
                      [1 << 64, 0], [1, 1 << 64], [True, 1], [1, False], [1.0, 1], ["1", 1]]


@pytest.mark.parametrize(("req", "want"), GOOD_IDS)
def test_a_request_id_is_a_client_above_zero_and_a_sequence(req: Any,
                                                            want: tuple[int, int]) -> None:
    assert valid_request_id(req) == want
    assert check_request_id(req) == want
    assert request_id_field({"req": req}) == want


@pytest.mark.parametrize("req", BAD_IDS)
def test_anything_else_is_not_a_request_id_at_any_end(req: Any) -> None:
    assert valid_request_id(req) is None
    with pytest.raises(RequestError) as err:
        check_request_id(req)
    assert err.value.code == Code.MALFORMED and err.value.message == REQUEST_ID_RULE
    with pytest.raises(RequestError):  # a door's optional field, present: null included
        request_id_field({"req": req})
    with pytest.raises(Refused) as refused:  # the state machine's deduplication
        Requests(None).deduplicate(req, 1, lambda: pytest.fail("applied"))
    assert refused.value.code == Code.MALFORMED
    assert refused.value.message == f"{REQUEST_ID_RULE}, got {req!r}"


def test_a_door_leaves_a_missing_request_id_out() -> None:
    assert request_id_field({}) is None


GOOD_ITEMS: list[Any] = [["t", 0, 0], ["t", 5, 1 << 40]]
BAD_ITEMS: list[Any] = [["t", 0], ["t", 0, 0, 0], [1, 0, 0], ["t", True, 0], ["t", 0, False],
                        ["t", 0, -1], ["t", 0.0, 0], ["t", 0, None], "t00", None]


@pytest.mark.parametrize("item", GOOD_ITEMS)
def test_an_offset_item_passes_on_the_wire_and_in_the_record(item: list[Any]) -> None:
    assert is_offset_item(item) and is_offset_item(tuple(item), tuple)
    assert not is_offset_item(tuple(item)) and not is_offset_item(item, tuple)
    CommitOffsetRequest.decode({"cg": "cg", "offsets": [item]})
    CommitOffsets("cg", (tuple(item),)).validate()


@pytest.mark.parametrize("item", BAD_ITEMS)
def test_a_bad_offset_item_is_refused_on_the_wire_and_in_the_record(item: Any) -> None:
    assert not is_offset_item(item)
    with pytest.raises(RequestError) as err:
        CommitOffsetRequest.decode({"cg": "cg", "offsets": [item]})
    assert err.value.code == Code.MALFORMED
    if isinstance(item, list):  # a record holds each item as a tuple
        with pytest.raises(Refused) as refused:
            CommitOffsets("cg", (tuple(item),))
        assert refused.value.code == Code.MALFORMED
