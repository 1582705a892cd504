"""Dead letters (`broker.state.parts.deadletters`): what a simple consumer group gave up
on, resent into its queue as a pointer to the stored record, or purged."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.parts.base import ControlResult, ErrorResult, Refused
from broker.state.parts.deadletters import MAX_DEAD_IDS, PurgeDead, ResendDead, dlq_name
from broker.state.parts.receipts import Nack, Receive
from broker.state.statemachine import BrokerState
from raftlog.types import Entry
from tests.broker.state.test_receipts import CG, Log, _log, receipts_of
from wire.protocol import Code


def _bury(log: Log, n: int, now: int = 1) -> list[int]:
    """Receive `n` messages and send them straight to the dead letters; their ids."""
    r = log.control(Receive(CG, "t", 0, now, 1000, n))
    if not r.items:
        return []
    log.control(Nack(CG, "t", 0, receipts_of(r), now, None, (1,), 16, "poison", dead=True))
    return [did for _, did, d in log.state.deadletters.of(CG)
            if d.offset in {x.offset for x in r.items}]


def test_resend_appends_a_pointer_to_the_stored_record_and_the_group_gets_it_again() -> None:
    log = _log(3)
    ids = _bury(log, 2)
    assert ids == [1, 2]
    entry = log.state.entry_of("t", 0, 1)
    r = log.control(ResendDead(CG, (2, 99)))
    assert r == ControlResult("dead_resend", 1, 1, items=((2, 3),))
    assert log.state.queue_range("t", 0) == (0, 4)
    moved = log.state.entry_of("t", 0, 3)  # the same record, no copy
    assert (moved.index, moved.start, moved.size, moved.store_ms) == (
        entry.index, entry.start, entry.size, entry.store_ms)
    assert [did for _, did, _ in log.state.deadletters.of(CG)] == [1]
    # the group's simple consumers receive it as a new message, first delivery
    again = log.control(Receive(CG, "t", 0, 2, 1000, 10))
    assert [(d.offset, d.deliveries) for d in again.items] == [(2, 1), (3, 1)]


def test_purge_drops_entries_and_ids_are_never_reused() -> None:
    log = _log(3)
    _bury(log, 2)
    r = log.control(PurgeDead(CG, (1, 2, 2, 5)))
    assert (r.applied, r.skipped) == (2, 2)
    assert log.state.deadletters.count(CG) == 0 and log.state.deadletters.dead == {}
    assert _bury(log, 1) == [3]


def test_a_group_sees_only_its_own_dead_letters() -> None:
    log = _log(2)
    _bury(log, 1)
    assert log.control(ResendDead("another", (1,))).applied == 0
    assert log.control(PurgeDead("another", (1,))).applied == 0
    assert log.state.deadletters.count(CG) == 1
    assert dlq_name(CG) == "%DLQ%workers"


def test_bad_records_are_refused_and_change_nothing() -> None:
    log = _log(2)
    _bury(log, 1)
    before = log.state.deadletters.section()
    for d in ({"op": "dead_resend", "cg": CG, "ids": []},
              {"op": "dead_resend", "cg": CG, "ids": [0]},
              {"op": "dead_purge", "cg": CG, "ids": [True]},
              {"op": "dead_purge", "cg": CG, "ids": list(range(1, MAX_DEAD_IDS + 2))},
              {"op": "dead_purge", "cg": "no good", "ids": [1]},
              {"op": "dead_purge", "cg": CG, "ids": "1"}):
        r = log.control(msgpack.packb(d))
        assert isinstance(r, ErrorResult) and r.code in (Code.MALFORMED, Code.INVALID_NAME), d
    assert log.state.deadletters.section() == before
    with pytest.raises(Refused):
        PurgeDead(CG, ())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_replicas_agree_through_snapshots(data: st.DataObject) -> None:
    log = _log(1)
    for _ in range(data.draw(st.integers(1, 12))):
        op = data.draw(st.sampled_from(["produce", "bury", "resend", "purge"]))
        held = [did for _, did, _ in log.state.deadletters.of(CG)]
        if op == "produce":
            log.produce(data.draw(st.integers(1, 3)))
        elif op == "bury":
            _bury(log, data.draw(st.integers(1, 3)))
        elif held:
            ids = tuple(data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=3)))
            log.control((ResendDead if op == "resend" else PurgeDead)(CG, ids))
    cut = data.draw(st.integers(0, len(log.entries)))
    b = BrokerState.restore("g", log.replay(cut).snapshot())
    for i, (kind, d) in enumerate(log.entries[cut:], cut + 1):
        b.apply(Entry(i, 1, kind, d))
    assert b.snapshot() == log.state.snapshot()
    assert b.deadletters.section() == log.state.deadletters.section()


def test_a_snapshot_with_a_dead_letter_of_a_queue_not_hosted_is_refused() -> None:
    log = _log(1)
    _bury(log, 1)
    d = msgpack.unpackb(log.state.snapshot(), raw=False, strict_map_key=False)
    for part in d["parts"]:
        if part[0] == "deadletters":
            part[2]["dead"][0][3] = 7  # queue 7 of t is hosted nowhere here
    with pytest.raises(ValueError):
        BrokerState.restore("g", msgpack.packb(d, use_bin_type=True))
