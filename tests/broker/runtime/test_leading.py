"""`GroupLead.propose` takes typed control records only, and a record built from a
request's fields (`checked`) is refused before proposal with the very code and message
apply would have answered."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
import trio

from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead, checked
from broker.state.parts.base import ControlResult, ErrorResult, Refused
from broker.state.parts.txcoord import MAX_PARTICIPANTS, TxAdd, TxInit
from broker.state.parts.txpart import HalfEnd, TxMarker
from broker.state.statemachine import BrokerState, Retain
from raftlog.types import Entry, EntryType
from wire.protocol import Code, RequestError


class _Group:
    """What `propose` uses of a group: its `propose`, answering `answer`."""

    group_id = "g"

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.proposed: list[tuple[bytes, EntryType]] = []

    async def propose(self, data: bytes, kind: EntryType) -> Any:
        self.proposed.append((data, kind))
        return self.answer


def _lead() -> GroupLead:
    return GroupLead(GroupRegistry({}, {}), lambda gid: False, lambda: False)


@pytest.mark.parametrize("raw", [
    {"op": "retain", "min_index": 5},  # the map a record encodes to
    Retain(5).encode(),  # its bytes
    None,
])
def test_propose_refuses_anything_but_a_record(raw: Any) -> None:
    g = _Group(ControlResult("retain", 1))

    async def main() -> None:
        with pytest.raises(TypeError, match="control record"):
            await _lead().propose(g, raw)  # type: ignore[arg-type]

    trio.run(main)
    assert g.proposed == []  # nothing reached the log


def test_propose_encodes_the_record_with_its_request_id_and_raises_a_refusal() -> None:
    ok = _Group(ControlResult("retain", 1))
    refused = _Group(ErrorResult(Code.TX_FENCED, "fenced"))

    async def main() -> None:
        assert await _lead().propose(ok, Retain(5), req=(7, 1)) == ControlResult("retain", 1)
        with pytest.raises(RequestError) as e:
            await _lead().propose(refused, Retain(5))
        assert (e.value.code, e.value.message) == (Code.TX_FENCED, "fenced")

    trio.run(main)
    assert ok.proposed == [(Retain(5).encode((7, 1)), EntryType.CONTROL)]


def test_no_raw_map_helper_is_left() -> None:
    import broker.runtime.leading as leading

    assert not hasattr(leading, "control_record")
    assert not hasattr(leading, "RECORD_TYPES")


BAD: list[tuple[type[Any], dict[str, Any], Code]] = [
    (TxInit, {"tid": "t", "timeout_ms": 0, "ts": 1}, Code.MALFORMED),
    (TxInit, {"tid": "", "timeout_ms": 10, "ts": 1}, Code.MALFORMED),
    (TxAdd, {"tid": "t", "epoch": 0, "n": 0, "ts": 1,
             "groups": tuple(f"g{i}" for i in range(MAX_PARTICIPANTS + 1))}, Code.TX_LIMIT),
    (TxMarker, {"tid": "t", "epoch": -1, "n": 0, "commit": True, "fence": 0}, Code.MALFORMED),
    (HalfEnd, {"txid": "x", "commit": True, "source": "client", "producer_group": "bad pg"},
     Code.INVALID_NAME),
    (Retain, {"min_index": -1}, Code.MALFORMED),
]


@pytest.mark.parametrize(("kind", "fields", "code"), BAD)
def test_a_refused_record_is_never_made_and_answers_as_apply_would(
        kind: type[Any], fields: dict[str, Any], code: Code) -> None:
    with pytest.raises(Refused):
        kind(**fields)
    with pytest.raises(RequestError) as e:
        checked(kind, **fields)
    assert e.value.code == code
    # the same map on the log: apply refuses it with the same code and message
    entry = {"op": kind.op, **{k: list(v) if isinstance(v, tuple) else v
                               for k, v in fields.items()}}
    state = BrokerState("g")
    result = state.apply(Entry(1, 1, EntryType.CONTROL, msgpack.packb(entry)))
    assert result == ErrorResult(e.value.code, e.value.message)


def test_checked_passes_a_valid_record_through() -> None:
    rec = checked(TxInit, tid="t", timeout_ms=10, ts=1)
    assert rec == TxInit("t", 10, 1)
    assert checked(TxMarker, "t", 0, 1, True, 0) == TxMarker("t", 0, 1, True, 0)
