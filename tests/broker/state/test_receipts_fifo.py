"""FIFO message groups and filtered-out messages in the simple consumer's replicated
state (`broker.state.parts.receipts`): a group's messages go out one at a time in
offset order, different groups in parallel, filtered ones are passed for good, and
replicas (straight or through a snapshot taken anywhere) agree."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.parts.base import ControlResult, Refused
from broker.state.parts.horizon import Retain
from broker.state.parts.receipts import Ack, Nack, Receive
from broker.state.statemachine import BrokerState
from raftlog.types import Entry
from tests.broker.state.test_receipts import CG, Log, _log, offsets, receipts_of


def facts(groups: dict[int, str], lo: int, upto: int) -> tuple[tuple[int, str], ...]:
    return tuple((o, g) for o, g in sorted(groups.items()) if lo <= o < upto)


def receive(log: Log, now: int, groups: dict[int, str], *, max: int = 32,
            invisible: int = 1000, cap: int = 4096, skip: tuple[int, ...] = (),
            max_deliveries: int = 16, upto: int | None = None) -> ControlResult:
    """A receive as the door writes it: the facts of every message up to the queue's end."""
    end = log.state.queue_range("t", 0)[1] if upto is None else upto
    nxt = log.receipts.next_offset(CG, "t", 0)
    r = log.control(Receive(CG, "t", 0, now, invisible, max, "c1", max_deliveries, cap,
                            False, end, facts(groups, nxt, end),
                            tuple(o for o in skip if nxt <= o < end)))
    assert isinstance(r, ControlResult), r
    return r


def test_a_group_goes_out_one_message_at_a_time_and_others_in_parallel() -> None:
    log = _log(6)
    groups = {0: "a", 1: "a", 2: "b", 3: "a", 5: "b"}  # 4 has no group
    r = receive(log, 100, groups)
    assert offsets(r) == [0, 2, 4]  # a's first, b's first, the one without a group
    assert log.receipts.held(CG, "t", 0) == {"a": [1, 3], "b": [5]}
    assert log.receipts.next_offset(CG, "t", 0) == 6
    assert log.receipts.low_watermark(CG, "t", 0) == 0
    assert receive(log, 101, groups).items == ()  # both groups blocked
    assert log.receipts.fifo_summary() == {(CG, "t", 0): (2, 3)}
    # acking a's first frees a's second, and only that
    log.control(Ack(CG, "t", 0, receipts_of(r)[:1]))
    assert offsets(receive(log, 102, groups)) == [1]
    assert log.receipts.held(CG, "t", 0) == {"a": [3], "b": [5]}


def test_a_nack_or_expiry_redelivers_the_same_message_first_keeping_the_order() -> None:
    log = _log(2)
    groups = {0: "g", 1: "g"}
    first = receive(log, 100, groups, invisible=50)
    assert offsets(first) == [0]
    again = receive(log, 200, groups)  # expired: the same message again, not offset 1
    assert offsets(again) == [0] and again.items[0].deliveries == 2
    log.control(Nack(CG, "t", 0, receipts_of(again), 201, 0))
    third = receive(log, 202, groups)
    assert offsets(third) == [0] and third.items[0].deliveries == 3
    log.control(Ack(CG, "t", 0, receipts_of(third)))
    assert offsets(receive(log, 203, groups)) == [1]


def test_a_dead_lettered_message_frees_its_group() -> None:
    log = _log(2)
    groups = {0: "g", 1: "g"}
    r = receive(log, 100, groups, max_deliveries=1)
    log.control(Nack(CG, "t", 0, receipts_of(r), 101, 0, max_deliveries=1, dead=True))
    assert offsets(receive(log, 102, groups)) == [1]
    assert [d.offset for _, _, d in log.state.deadletters.of()] == [0]


def test_filtered_out_messages_are_passed_for_good_and_new_ones_wait_for_upto() -> None:
    log = _log(5)
    r = receive(log, 100, {}, skip=(0, 2), upto=4)
    assert offsets(r) == [1, 3]  # 4 is beyond what the leader read
    assert log.receipts.next_offset(CG, "t", 0) == 4
    log.control(Ack(CG, "t", 0, receipts_of(r)))
    assert log.receipts.low_watermark(CG, "t", 0) == 4
    assert offsets(receive(log, 101, {})) == [4]


def test_held_messages_count_against_the_cap_and_retention_drops_them() -> None:
    log = _log(6)
    groups = dict.fromkeys(range(6), "g")
    assert offsets(receive(log, 100, groups, cap=3)) == [0]
    assert log.receipts.held(CG, "t", 0) == {"g": [1, 2]}
    assert log.receipts.next_offset(CG, "t", 0) == 3
    assert not log.receipts.available(CG, "t", 0, 100, 3)
    log.produce(1)  # a second entry: retention can remove the first (offsets 0-5)
    log.control(Retain(3))
    assert log.receipts.held(CG, "t", 0) == {}
    assert log.receipts.inflight(CG, "t", 0) == {}
    assert log.receipts.next_offset(CG, "t", 0) == 6


def test_a_receive_record_refuses_bad_facts() -> None:
    for kw in ({"groups": ((0, "a"),)}, {"skip": (1,)}):
        with pytest.raises(Refused):
            Receive(CG, "t", 0, 1, **kw)  # facts need upto
    for bad in ({"upto": -1}, {"upto": 5, "groups": ((0, ""),)},
                {"upto": 5, "groups": ((0, "x" * 256),)}, {"upto": 5, "skip": (-1,)},
                {"upto": 5, "groups": ((0,),)}):
        with pytest.raises(Refused):
            Receive(CG, "t", 0, 1, **bad)  # type: ignore[arg-type]
    rec = Receive(CG, "t", 0, 1, upto=9, groups=((2, "a"), (3, "b")), skip=(4,))
    assert Receive.from_map(msgpack.unpackb(msgpack.packb(rec.to_map()))) == rec
    old = Receive(CG, "t", 0, 1)  # a record written before message groups: no new keys
    assert "upto" not in old.to_map() and Receive.from_map(old.to_map()) == old


def test_a_version_1_section_still_loads() -> None:
    log = _log(3)
    receive(log, 100, {}, max=2)
    section = log.receipts.section()
    v1 = {**section, "queues": [[cg, t, q, nxt, [row[:5] for row in inflight]]
                                for cg, t, q, nxt, inflight, _held in section["queues"]]}
    s = BrokerState("g")
    s.receipts.load(1, v1)
    assert s.receipts.slots.keys() == log.receipts.slots.keys()
    assert s.receipts.inflight(CG, "t", 0) == log.receipts.inflight(CG, "t", 0)


def _run(data: st.DataObject, mutations: frozenset[str] = frozenset()) -> tuple[Log, Any]:
    log = Log()
    log.state = BrokerState("g", mutations=mutations)
    from broker.state.statemachine import control_create_topic
    log.control(control_create_topic("t", 1, [0]))
    groups: dict[int, str] = {}
    skip: set[int] = set()
    now = 0
    current: dict[int, int] = {}
    first_out: list[int] = []  # offsets in the order first handed out
    done: set[int] = set()  # acked or dead
    overlap = []  # (group, offset) handed out while another of its group was in flight
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        now += data.draw(st.integers(-50, 300), label="clock step")
        op = data.draw(st.sampled_from(["produce", "receive", "receive", "ack", "nack",
                                        "retain"]))
        if op == "produce":
            base = log.state.queue_range("t", 0)[1]
            n = data.draw(st.integers(1, 4))
            for i in range(n):
                g = data.draw(st.sampled_from(["", "", "a", "b", "c"]))
                if g:
                    groups[base + i] = g
                if data.draw(st.integers(0, 5)) == 0:
                    skip.add(base + i)
            log.produce(n)
        elif op == "receive":
            end = log.state.queue_range("t", 0)[1]
            upto = data.draw(st.integers(max(end - 3, 0), end))
            r = receive(log, max(now, 0), groups, max=data.draw(st.integers(1, 5)),
                        invisible=data.draw(st.integers(10, 200)), max_deliveries=3,
                        cap=data.draw(st.integers(1, 8)), skip=tuple(sorted(skip)), upto=upto)
            inflight = log.receipts.inflight(CG, "t", 0)
            for d in r.items:
                assert d.offset not in skip
                g = groups.get(d.offset)
                if g and any(groups.get(o) == g for o in inflight if o != d.offset):
                    overlap.append((g, d.offset))
                if d.deliveries == 1:
                    first_out.append(d.offset)
                current[d.offset] = d.handle
            for off in [o for o in current if o not in inflight]:
                done.add(off)  # buried by the receive
                del current[off]
        elif op in ("ack", "nack") and current:
            picked = data.draw(st.lists(st.sampled_from(sorted(current.items())), min_size=1,
                                        max_size=3, unique=True))
            if op == "ack":
                log.control(Ack(CG, "t", 0, tuple(picked)))
                for off, _h in picked:
                    del current[off]
                    done.add(off)
            else:
                r = log.control(Nack(CG, "t", 0, tuple(picked), max(now, 0), 0, (20,), 3,
                                     "e", data.draw(st.booleans())))
                for off, _h in picked:
                    del current[off]
                    if ("dead", off) in r.items:
                        done.add(off)
        elif op == "retain":
            log.control(Retain(data.draw(st.integers(1, len(log.entries)))))
            lo = log.state.queue_range("t", 0)[0]
            for off in [o for o in current if o < lo]:
                del current[off]
    return log, (groups, first_out, overlap)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_groups_go_in_order_one_at_a_time_and_replicas_agree(data: st.DataObject) -> None:
    log, (groups, first_out, overlap) = _run(data)
    assert overlap == []
    # each group's messages were first handed out in offset order
    for g in set(groups.values()):
        mine = [o for o in first_out if groups.get(o) == g]
        assert mine == sorted(mine), g
    # at most one message of a group in flight, and held ones are below next
    inflight = log.receipts.inflight(CG, "t", 0)
    busy = [f.group for f in inflight.values() if f.group]
    assert len(busy) == len(set(busy))
    nxt = log.receipts.next_offset(CG, "t", 0)
    for g, offs in log.receipts.held(CG, "t", 0).items():
        assert offs == sorted(offs) and all(o < nxt and groups[o] == g for o in offs)
    # replicas: straight, and through a snapshot taken anywhere, hold the same state
    cut = data.draw(st.integers(0, len(log.entries)), label="snapshot at")
    b = BrokerState.restore("g", log.replay(cut).snapshot())
    for i, (kind, d2) in enumerate(log.entries[cut:], cut + 1):
        b.apply(Entry(i, 1, kind, d2))
    assert b.snapshot() == log.state.snapshot() == log.replay(len(log.entries)).snapshot()


def test_the_fifo_ignore_inflight_mutation_hands_out_a_group_s_next_message() -> None:
    """The test mutation (`broker.config`) the FIFO chaos checker must catch."""
    for mutations, expected in ((frozenset(), [0]), (frozenset({"fifo-ignore-inflight"}),
                                                     [0, 1, 2])):
        log = Log()
        log.state = BrokerState("g", mutations=mutations)
        from broker.state.statemachine import control_create_topic
        log.control(control_create_topic("t", 1, [0]))
        log.produce(3)
        assert offsets(receive(log, 100, dict.fromkeys(range(3), "g"))) == expected
