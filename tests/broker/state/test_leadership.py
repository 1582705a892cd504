"""The preferred leader as a replicated setting (`broker.state.parts.leadership`)."""

from __future__ import annotations

import msgpack
import pytest

from broker.state.parts.base import Refused
from broker.state.statemachine import (
    BrokerState,
    ControlResult,
    ErrorResult,
    PreferLeader,
    control_prefer_leader,
)
from raftlog.types import Entry, EntryType
from wire.protocol import Code


def _apply(state: BrokerState, index: int, data: bytes) -> object:
    return state.apply(Entry(index, 1, EntryType.CONTROL, data))


def test_a_logged_preference_replaces_the_configured_one_and_survives_snapshots() -> None:
    s = BrokerState("g0")
    assert s.preferred_leader is None  # the node config's applies
    assert _apply(s, 1, control_prefer_leader(3)) == ControlResult("prefer_leader", 1)
    assert s.preferred_leader == 3
    assert _apply(s, 2, control_prefer_leader(3)) == ControlResult("prefer_leader", 0)
    restored = BrokerState.restore("g0", s.snapshot())
    assert restored.preferred_leader == 3
    _apply(restored, 3, control_prefer_leader(0))
    assert restored.preferred_leader is None
    assert BrokerState.restore("g0", restored.snapshot()).preferred_leader is None


def test_a_snapshot_without_the_section_restores_with_no_preference() -> None:
    s = BrokerState("g0")
    _apply(s, 1, control_prefer_leader(2))
    d = msgpack.unpackb(s.snapshot(), raw=False, strict_map_key=False)
    d["parts"] = [p for p in d["parts"] if p[0] != "leadership"]  # an older release's
    old = BrokerState.restore("g0", msgpack.packb(d, use_bin_type=True))
    assert old.preferred_leader is None


@pytest.mark.parametrize("node", [-1, "2", True, None, 1 << 40])
def test_a_bad_preference_is_refused_and_changes_nothing(node: object) -> None:
    s = BrokerState("g0")
    _apply(s, 1, control_prefer_leader(2))
    res = _apply(s, 2, msgpack.packb({"op": "prefer_leader", "node": node}))
    assert isinstance(res, ErrorResult) and res.code == Code.MALFORMED
    assert s.preferred_leader == 2
    with pytest.raises(Refused):
        PreferLeader(node)  # type: ignore[arg-type]


def test_the_record_encodes_as_the_encoder_does() -> None:
    assert PreferLeader(4).encode() == control_prefer_leader(4)
    assert PreferLeader.decode(control_prefer_leader(4)) == PreferLeader(4)
    assert PreferLeader(4).describe() == "prefer_leader node=4"
