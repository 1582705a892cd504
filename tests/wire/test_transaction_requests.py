"""The typed transaction requests and answers (`wire.requests.transactions`): each
survives the wire, a header missing a required field or holding one of the wrong kind is
MALFORMED naming it, and each field check refuses what the broker's door always refused,
with the same code."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wire.protocol import Code, RequestError
from wire.requests import TYPES
from wire.requests.base import WireType
from wire.requests.transactions import (
    HalfEndAnswer,
    HalfEndRequest,
    ProducerHeartbeatAnswer,
    ProducerHeartbeatRequest,
    TxAddAnswer,
    TxAddRequest,
    TxCheckAnswer,
    TxCheckRequest,
    TxEndAnswer,
    TxEndRequest,
    TxInitAnswer,
    TxInitRequest,
    TxListAnswer,
    TxListRequest,
    TxMarkerAnswer,
    TxMarkerRequest,
    TxOffsetsAnswer,
    TxOffsetsRequest,
    TxStatusAnswer,
    TxStatusRequest,
)
from wire.txn import MAX_MARKERS

names = st.from_regex(r"[A-Za-z0-9_%|.-]{1,20}", fullmatch=True)
tids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9 _.:-]{0,30}[A-Za-z0-9]", fullmatch=True)
counts = st.integers(0, (1 << 63) - 1)

SAMPLES: list[WireType] = [
    TxInitRequest(tid="t-1", timeout_ms=60_000, g="g0"),
    TxInitAnswer(epoch=3),
    TxAddRequest(tid="t-1", epoch=3, n=0, groups=("g0", "g1"), g="g0"),
    TxAddAnswer(),
    TxOffsetsRequest(tid="t-1", epoch=3, n=0, cg="cg", offsets=(("T", 0, 5), ("T", 2, 0)),
                     g="g1"),
    TxOffsetsAnswer(),
    TxEndRequest(tid="t-1", epoch=3, n=0, commit=True, g="g0"),
    TxEndRequest(tid="t-1", epoch=3, n=0, commit=False, wait=False, groups=("g2",), g="g0"),
    TxEndAnswer(state="complete_commit", dup=False),
    TxMarkerRequest(g="g1", tid="t-1", epoch=3, n=0, commit=True, fence=3),
    TxMarkerRequest(g="g1", markers=(("t-1", 3, 0, True, 3), ("t-2", 0, 7, False, 1))),
    TxMarkerAnswer(dup=True),
    TxStatusRequest(tid="t-1", g="g0"),
    TxStatusAnswer(epoch=3, n=1, state="ongoing", participants=("g0", "g1"),
                   timeout_ms=60_000, unfinished=((3, 0, "prepare_commit"),)),
    TxStatusAnswer(epoch=-1, n=-1, state="empty", participants=(), timeout_ms=0,
                   unfinished=()),
    HalfEndRequest(txid="ab12", commit=True, pg="pg", g="g0"),
    HalfEndRequest(txid="ab12", commit=False, pg="", source="operator", g="g0"),
    HalfEndAnswer(dup=False),
    TxListRequest(),
    TxListRequest(g="g1", tx="t-1", limit=5),
    TxListAnswer(led=("g0",), halves=({"g": "g0", "txid": "ab12"},), prepared=(), txns=(),
                 decided=({"g": "g0", "kind": "half", "id": "ab12"},), done=(), limit=1000,
                 truncated=False),
    TxCheckRequest(g="g0", txid="ab12", topic="T", queue=1, msg_id="g0:1:2", pg="pg",
                   checks=1),
    TxCheckRequest(g="g0", txid="ab12", topic="T", queue=1, pg="pg", checks=2),
    TxCheckAnswer(state="unknown"),
    ProducerHeartbeatRequest(pg="pg", client="c-1"),
    ProducerHeartbeatRequest(pg="pg", client="c-1", ttl_ms=5_000),
    ProducerHeartbeatAnswer(),
]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: type(s).__name__)
def test_each_type_survives_the_wire(sample: WireType) -> None:
    assert type(sample).decode(sample.header()) == sample
    assert sample.describe().startswith(sample.OP.name)


def test_every_transaction_op_is_typed() -> None:
    typed = {t for pair in TYPES.values() for t in pair}
    assert {type(s) for s in SAMPLES} <= typed


@given(tids, counts, counts, st.booleans(), st.booleans(),
       st.lists(names, max_size=4, unique=True), names)
def test_a_tx_end_survives_the_wire(tid: str, epoch: int, n: int, commit: bool, wait: bool,
                                    groups: list[str], g: str) -> None:
    req = TxEndRequest(tid=tid, epoch=epoch, n=n, commit=commit, wait=wait,
                       groups=tuple(groups), g=g)
    assert TxEndRequest.decode(req.header()) == req


@given(names, st.lists(st.tuples(tids, counts, counts, st.booleans(), counts), min_size=1,
                       max_size=5))
def test_markers_survive_the_wire(g: str, markers: list[Any]) -> None:
    req = TxMarkerRequest(g=g, markers=tuple(markers))
    assert TxMarkerRequest.decode(req.header()) == req
    assert req.decisions() == tuple(markers)


def test_defaults_are_left_out() -> None:
    assert TxEndRequest(tid="t", epoch=0, n=0, commit=True, g="g0").header() == {
        "tid": "t", "epoch": 0, "n": 0, "commit": True, "g": "g0"}
    assert ProducerHeartbeatRequest(pg="p", client="c").header() == {"pg": "p", "client": "c"}
    assert HalfEndRequest(txid="x", commit=True, pg="p", g="g0").header()["commit"] is True
    assert TxListRequest().header() == {}
    assert TxListRequest.decode({"g": None}) == TxListRequest()


OK = {
    TxInitRequest: {"tid": "T", "timeout_ms": 1000, "g": "g0"},
    TxAddRequest: {"tid": "T", "epoch": 0, "n": 0, "groups": ["g0"], "g": "g0"},
    TxOffsetsRequest: {"tid": "T", "epoch": 0, "n": 0, "cg": "cg", "offsets": [["T", 0, 0]],
                       "g": "g0"},
    TxEndRequest: {"tid": "T", "epoch": 0, "n": 0, "commit": True, "g": "g0"},
    TxMarkerRequest: {"g": "g0", "tid": "T", "epoch": 0, "n": 0, "commit": True, "fence": 0},
    TxStatusRequest: {"tid": "T", "g": "g0"},
    HalfEndRequest: {"txid": "x", "commit": True, "pg": "p", "g": "g0"},
    TxCheckRequest: {"g": "g0", "txid": "x", "topic": "T", "queue": 0, "pg": "p", "checks": 1},
    ProducerHeartbeatRequest: {"pg": "p", "client": "c"},
    TxListRequest: {},
}


def _missing_and_mistyped() -> list[tuple[type[WireType], dict[str, Any], str]]:
    """Each required field of each request left out, and each field of the wrong kind."""
    cases: list[tuple[type[WireType], dict[str, Any], str]] = []
    for kind, good in OK.items():
        assert kind.decode(good) is not None
        for name in good:
            if kind is not TxListRequest:
                cases.append((kind, {k: v for k, v in good.items() if k != name}, name))
            wrong = 1.5 if not isinstance(good[name], float) else "x"
            cases.append((kind, {**good, name: wrong}, name))
    return cases


@pytest.mark.parametrize(("kind", "header", "field"), _missing_and_mistyped())
def test_a_missing_or_mistyped_field_is_malformed_and_named(
        kind: type[WireType], header: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestError) as caught:
        kind.decode(header)
    assert caught.value.code == Code.MALFORMED
    assert field in caught.value.message


def _with(kind: type[WireType], **fields: Any) -> dict[str, Any]:
    return {**OK[kind], **fields}


@pytest.mark.parametrize(("kind", "header", "code", "says"), [
    # the checks the transaction door made by hand, with the codes it answered
    (TxInitRequest, _with(TxInitRequest, tid=""), Code.MALFORMED, "'tid'"),
    (TxInitRequest, _with(TxInitRequest, tid="x" * 256), Code.MALFORMED, "'tid'"),
    (TxInitRequest, _with(TxInitRequest, tid=" padded"), Code.MALFORMED, "'tid'"),
    (TxInitRequest, _with(TxInitRequest, timeout_ms=0), Code.MALFORMED, "timeout_ms"),
    (TxInitRequest, _with(TxInitRequest, timeout_ms=True), Code.MALFORMED, "timeout_ms"),
    (TxAddRequest, _with(TxAddRequest, groups=[]), Code.MALFORMED, "groups"),
    (TxAddRequest, _with(TxAddRequest, groups=[5]), Code.MALFORMED, "group ids"),
    (TxAddRequest, _with(TxAddRequest, groups=["a b"]), Code.INVALID_NAME, "group"),
    (TxAddRequest, _with(TxAddRequest, epoch=-1), Code.MALFORMED, "'epoch'"),
    (TxAddRequest, _with(TxAddRequest, n=1 << 63), Code.MALFORMED, "'n'"),
    (TxOffsetsRequest, _with(TxOffsetsRequest, offsets=[]), Code.MALFORMED, "offsets"),
    (TxOffsetsRequest, _with(TxOffsetsRequest, offsets=[["T", 0]]), Code.MALFORMED,
     "offsets"),
    (TxOffsetsRequest, _with(TxOffsetsRequest, offsets=[["T", True, 0]]), Code.MALFORMED,
     "offsets"),
    (TxOffsetsRequest, _with(TxOffsetsRequest, offsets=[["T", 0, -1]]), Code.MALFORMED,
     "offsets"),
    (TxOffsetsRequest, _with(TxOffsetsRequest, offsets=[["a b", 0, 0]]), Code.INVALID_NAME,
     "topic"),
    (TxOffsetsRequest, _with(TxOffsetsRequest, cg="c g"), Code.INVALID_NAME, "group"),
    (TxEndRequest, _with(TxEndRequest, commit=1), Code.MALFORMED, "'commit'"),
    (TxEndRequest, _with(TxEndRequest, wait=0), Code.MALFORMED, "'wait'"),
    (TxEndRequest, _with(TxEndRequest, groups=["g0", None]), Code.MALFORMED, "group ids"),
    (TxEndRequest, _with(TxEndRequest, groups=["a b"]), Code.INVALID_NAME, "group"),
    (TxMarkerRequest, _with(TxMarkerRequest, fence=-1), Code.MALFORMED, "'fence'"),
    (TxMarkerRequest, _with(TxMarkerRequest, tid=None), Code.MALFORMED, "'tid'"),
    (TxMarkerRequest, {"g": "g0", "markers": None}, Code.MALFORMED, "markers"),
    (TxMarkerRequest, {"g": "g0", "markers": []}, Code.MALFORMED, "markers"),
    (TxMarkerRequest, {"g": "g0", "markers": [["T", 0, 0, True, 0]] * (MAX_MARKERS + 1)},
     Code.MALFORMED, "markers"),
    (TxMarkerRequest, {"g": "g0", "markers": [["T", 0, 0, True]]}, Code.MALFORMED,
     "markers"),
    (TxMarkerRequest, {"g": "g0", "markers": [["T", 0, 0, 1, 0]]}, Code.MALFORMED,
     "'commit'"),
    (TxMarkerRequest, {"g": "g0", "markers": [["", 0, 0, True, 0]]}, Code.MALFORMED,
     "'tid'"),
    (TxMarkerRequest, {"g": "g0", "markers": [["T", 0, -2, True, 0]]}, Code.MALFORMED,
     "'n'"),
    (TxStatusRequest, {"g": "g0"}, Code.MALFORMED, "'tid'"),
    (HalfEndRequest, _with(HalfEndRequest, source="check"), Code.MALFORMED, "source"),
    (HalfEndRequest, _with(HalfEndRequest, pg="p q"), Code.INVALID_NAME, "group"),
    (HalfEndRequest, _with(HalfEndRequest, pg=""), Code.INVALID_NAME, "group"),
    (HalfEndRequest, _with(HalfEndRequest, txid="\n"), Code.MALFORMED, "'txid'"),
    (TxListRequest, {"limit": 0}, Code.MALFORMED, "limit"),
    (TxListRequest, {"limit": 10_001}, Code.MALFORMED, "limit"),
    (TxListRequest, {"g": "a b"}, Code.INVALID_NAME, "group"),
    (TxCheckRequest, _with(TxCheckRequest, topic="a b"), Code.INVALID_NAME, "topic"),
    (ProducerHeartbeatRequest, {"pg": "", "client": "c"}, Code.INVALID_NAME, "group"),
    (ProducerHeartbeatRequest, {"pg": "p", "client": "x" * 256}, Code.MALFORMED, "client id"),
    (ProducerHeartbeatRequest, {"pg": "p", "client": "a\nb"}, Code.MALFORMED, "client id"),
    (ProducerHeartbeatRequest, {"pg": "p"}, Code.MALFORMED, "client"),
    (ProducerHeartbeatRequest, {"pg": "p", "client": "c", "ttl_ms": None}, Code.MALFORMED,
     "'ttl_ms'"),
    (TxCheckAnswer, {"state": "maybe"}, Code.MALFORMED, "state"),
    (TxStatusAnswer, {"epoch": 0, "n": 0, "state": "ongoing", "participants": [],
                      "timeout_ms": 1, "unfinished": [[0, 0]]}, Code.MALFORMED, "unfinished"),
])
def test_the_field_checks_refuse_with_the_doors_codes(
        kind: type[WireType], header: dict[str, Any], code: Code, says: str) -> None:
    with pytest.raises(RequestError) as caught:
        kind.decode(header)
    assert caught.value.code == code, caught.value
    assert says in caught.value.message


def test_an_operator_may_decide_a_half_message_without_a_producer_group() -> None:
    req = HalfEndRequest.decode({"txid": "x", "commit": False, "pg": "", "source": "operator",
                                 "g": "g0"})
    assert (req.pg, req.source) == ("", "operator")


def test_the_markers_form_does_not_read_the_single_forms_fields() -> None:
    req = TxMarkerRequest.decode({"g": "g0", "markers": [["T", 1, 2, False, 1]], "tid": 5})
    assert req.decisions() == (("T", 1, 2, False, 1),) and req.tid is None
    single = TxMarkerRequest.single("g0", ("T", 1, 2, True, 4))
    assert single.decisions() == (("T", 1, 2, True, 4),)
    assert TxMarkerRequest.decode(single.header()) == single
