"""The simple consumer's replicated per-message state (`broker.state.parts.receipts`):
what a receive chooses, acks and nacks by handle, redelivery counts, dead letters, the
part's clock, retention, and replicas that agree however they got their state."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.parts.base import ControlRecord, ControlResult, ErrorResult, Refused
from broker.state.parts.deadletters import DeadLetters
from broker.state.parts.horizon import Retain
from broker.state.parts.receipts import (
    DEFAULT_BACKOFF_MS,
    MAX_ACK_ITEMS,
    Ack,
    ChangeInvisible,
    Delivery,
    Nack,
    Receipts,
    Receive,
)
from broker.state.statemachine import BrokerState, control_create_topic, control_delete_topic
from raftlog.types import Entry, EntryType
from wire.protocol import Code
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch

CG = "workers"


class Log:
    """A replica applying a log it also keeps, for replaying to other replicas."""

    def __init__(self) -> None:
        self.state = BrokerState("g")
        self.entries: list[tuple[EntryType, bytes]] = []
        self.produced = 0

    def apply(self, kind: EntryType, data: bytes) -> Any:
        self.entries.append((kind, data))
        return self.state.apply(Entry(len(self.entries), 1, kind, data))

    def control(self, rec: ControlRecord | bytes) -> Any:
        return self.apply(EntryType.CONTROL, rec if isinstance(rec, bytes) else rec.encode())

    def produce(self, n: int, topic: str = "t") -> None:
        msgs = [OutgoingMessage(b"m%d" % (self.produced + i)) for i in range(n)]
        self.produced += n
        self.apply(EntryType.MESSAGES, STORED_PREFIX.pack(1000 + self.produced)
                   + encode_batch(topic, 0, msgs))

    def replay(self, upto: int) -> BrokerState:
        s = BrokerState("g")
        for i, (kind, data) in enumerate(self.entries[:upto]):
            s.apply(Entry(i + 1, 1, kind, data))
        return s

    @property
    def receipts(self) -> Receipts:
        return self.state.receipts


def _log(messages: int = 0) -> Log:
    log = Log()
    log.control(control_create_topic("t", 1, [0]))
    if messages:
        log.produce(messages)
    return log


def receive(log: Log, now: int, *, max: int = 32, invisible: int = 1000,
            max_deliveries: int = 16, cap: int = 4096) -> ControlResult:
    r = log.control(Receive(CG, "t", 0, now, invisible, max, "c1", max_deliveries, cap))
    assert isinstance(r, ControlResult), r
    return r


def offsets(r: ControlResult) -> list[int]:
    return [d.offset for d in r.items]


def receipts_of(r: ControlResult) -> tuple[tuple[int, int], ...]:
    return tuple((d.offset, d.handle) for d in r.items)


# ---------------------------------------------------------------------- units


def test_a_receive_hands_out_new_messages_in_order_each_with_its_own_handle() -> None:
    log = _log(5)
    r = receive(log, 100, max=3)
    assert offsets(r) == [0, 1, 2] and r.applied == 3
    handle = len(log.entries)  # the Raft index of the receive's own entry
    assert all(isinstance(d, Delivery) and d.handle == handle and d.deliveries == 1
               for d in r.items)
    entry = log.state.entry_of("t", 0, 1)
    assert (r.items[1].index, r.items[1].start, r.items[1].size) == (
        entry.index, entry.start, entry.size)
    assert offsets(receive(log, 101, max=10)) == [3, 4]
    assert receive(log, 102).items == ()  # all in flight, nothing visible
    assert log.receipts.next_offset(CG, "t", 0) == 5


def test_an_expired_delivery_is_handed_out_again_first_with_a_new_handle() -> None:
    log = _log(3)
    first = receive(log, 100, max=2, invisible=500)
    assert receive(log, 599, max=5).items[0].offset == 2  # not visible yet: only offset 2
    again = receive(log, 600, max=5)
    assert offsets(again) == [0, 1]  # visible at 100 + 500: redelivered, in offset order
    assert [d.deliveries for d in again.items] == [2, 2]
    assert again.items[0].handle != first.items[0].handle
    # the first delivery's ack is stale: never applied to the second delivery
    stale = log.control(Ack(CG, "t", 0, receipts_of(first)))
    assert stale == ControlResult("ack", 0, 2, items=receipts_of(first))
    assert set(log.receipts.inflight(CG, "t", 0)) == {0, 1, 2}
    ok = log.control(Ack(CG, "t", 0, receipts_of(again)))
    assert (ok.applied, ok.skipped) == (2, 0)
    assert set(log.receipts.inflight(CG, "t", 0)) == {2}
    assert log.receipts.low_watermark(CG, "t", 0) == 2


def test_an_expired_delivery_nobody_received_since_can_still_be_acked() -> None:
    log = _log(1)
    r = receive(log, 100, invisible=10)
    assert log.control(Ack(CG, "t", 0, receipts_of(r))).applied == 1
    assert receive(log, 10_000).items == ()  # acked: never delivered again


def test_groups_are_independent_and_a_new_group_starts_at_the_first_retained_offset() -> None:
    log = _log(2)
    receive(log, 1)
    other = log.control(Receive("other", "t", 0, 1, 1000, 32, "c9", 16, 4096))
    assert offsets(other) == [0, 1]


def test_the_cap_bounds_messages_in_flight_but_not_redeliveries() -> None:
    log = _log(10)
    assert offsets(receive(log, 0, cap=3, invisible=100)) == [0, 1, 2]
    assert receive(log, 1, cap=3).items == ()
    assert offsets(receive(log, 200, cap=3, max=2)) == [0, 1]  # redeliveries, within max
    assert offsets(receive(log, 201, cap=5)) == [2, 3, 4]  # offset 2 visible, 2 new


def test_nack_delays_by_the_backoff_of_the_delivery_count_or_the_delay_given() -> None:
    log = _log(2)
    r = receive(log, 1000)
    res = log.control(Nack(CG, "t", 0, receipts_of(r)[:1], 1000, None, (50, 70), 16, "boom"))
    assert (res.applied, res.skipped, res.items) == (1, 0, ())
    f = log.receipts.inflight(CG, "t", 0)[0]
    assert (f.visible_ms, f.handle, f.error) == (1050, 0, "boom")
    log.control(Nack(CG, "t", 0, receipts_of(r)[1:], 1000, 5, (50, 70), 16, ""))
    assert log.receipts.inflight(CG, "t", 0)[1].visible_ms == 1005
    # the nacked delivery's receipt is stale now: its ack is refused
    assert log.control(Ack(CG, "t", 0, receipts_of(r))).skipped == 2
    again = receive(log, 1050)
    assert offsets(again) == [0, 1] and [d.deliveries for d in again.items] == [2, 2]
    log.control(Nack(CG, "t", 0, receipts_of(again), 1050, None, (50, 70), 16, ""))
    third = receive(log, 1050 + 69)
    assert third.items == ()  # second step (70 ms)
    third = receive(log, 1050 + 70)
    log.control(Nack(CG, "t", 0, receipts_of(third), 1120, None, (50, 70), 16, ""))
    assert log.receipts.inflight(CG, "t", 0)[0].visible_ms == 1120 + 70  # the last repeats


def test_a_message_delivered_max_times_goes_to_the_dead_letters_with_its_history() -> None:
    log = _log(1)
    now = 0
    for n in range(1, 4):
        r = receive(log, now, max_deliveries=3, invisible=100)
        assert [d.deliveries for d in r.items] == [n]
        now += 100
    # delivered 3 times and visible again: buried at the next receive, not delivered
    r = receive(log, now, max_deliveries=3)
    assert r.items == () and r.skipped == 1
    assert log.receipts.inflight(CG, "t", 0) == {}
    [(cg, did, dead)] = list(log.state.deadletters.of())
    assert (cg, dead.topic, dead.queue, dead.offset, dead.deliveries, dead.dead_ms) == (
        CG, "t", 0, 0, 3, 300)
    entry = log.state.entry_of("t", 0, 0)
    assert (dead.index, dead.start, dead.size, dead.store_ms) == (
        entry.index, entry.start, entry.size, entry.store_ms)


def test_a_nack_at_max_deliveries_or_marked_dead_buries_at_once_with_the_error() -> None:
    log = _log(2)
    r = receive(log, 5, max_deliveries=1)
    res = log.control(Nack(CG, "t", 0, receipts_of(r)[:1], 7, None, (10,), 1, "bad data"))
    assert res.items == (("dead", 0),)
    res = log.control(Nack(CG, "t", 0, receipts_of(r)[1:], 8, None, (10,), 16, "poison",
                           dead=True))
    assert res.items == (("dead", 1),)
    rows = [(d.offset, d.deliveries, d.error, d.dead_ms) for _, _, d in log.state.deadletters.of()]
    assert rows == [(0, 1, "bad data", 7), (1, 1, "poison", 8)]


def test_change_invisible_re_times_a_current_delivery_and_refuses_a_stale_one() -> None:
    log = _log(1)
    r = receive(log, 100, invisible=50)
    (off, handle), = receipts_of(r)
    res = log.control(ChangeInvisible(CG, "t", 0, off, handle, 120, 1000))
    assert res.items == (1120,)
    assert receive(log, 1119).items == ()
    bad = log.control(ChangeInvisible(CG, "t", 0, off, handle + 1, 130, 1000))
    assert isinstance(bad, ErrorResult) and bad.code == Code.STALE_RECEIPT
    assert log.receipts.inflight(CG, "t", 0)[0].visible_ms == 1120


def test_the_clock_never_goes_back_across_leaders() -> None:
    log = _log(1)
    receive(log, 10_000, invisible=100)
    # a new leader whose clock is behind: the part's time is still 10_000
    assert receive(log, 5_000).items == ()
    assert log.receipts.now_ms == 10_000
    assert offsets(receive(log, 5_000 + 6_000)) == [0]  # 11_000 >= 10_100


def test_retention_drops_messages_in_flight_below_the_first_offset_and_moves_next() -> None:
    log = _log(2)
    receive(log, 1, max=1)
    log.produce(2)  # offsets 2, 3 in a later entry
    assert log.receipts.next_offset(CG, "t", 0) == 1
    cut = len(log.entries)  # the second batch's entry
    log.control(Retain(cut))
    assert log.state.queue_range("t", 0) == (2, 4)
    assert log.receipts.inflight(CG, "t", 0) == {}
    assert log.receipts.dropped == 1
    assert log.receipts.next_offset(CG, "t", 0) == 2
    assert offsets(receive(log, 2)) == [2, 3]


def test_dead_letters_go_with_retention_and_with_their_topic() -> None:
    log = _log(1)
    r = receive(log, 1)
    log.control(Nack(CG, "t", 0, receipts_of(r), 1, None, (1,), 16, "x", dead=True))
    assert log.state.deadletters.count(CG) == 1
    log.produce(1)
    log.control(Retain(len(log.entries)))
    assert log.state.deadletters.count(CG) == 0
    log.produce(1)
    r = receive(log, 2)
    log.control(Nack(CG, "t", 0, receipts_of(r)[:1], 2, None, (1,), 16, "", dead=True))
    assert log.state.deadletters.count(CG) == 1
    log.control(control_delete_topic("t"))
    assert log.state.deadletters.count(CG) == 0 and log.receipts.slots == {}


def test_records_refuse_bad_fields_before_anything_changes() -> None:
    log = _log(1)
    before = log.state.snapshot()
    bad = [
        {"op": "receive", "cg": CG, "t": "t", "q": 0, "now": 1, "inv": 0, "max": 1, "c": "c",
         "md": 16, "cap": 10},  # invisible 0
        {"op": "receive", "cg": CG, "t": "t", "q": 0, "now": 1, "inv": 100, "max": 0, "c": "c",
         "md": 16, "cap": 10},  # max 0
        {"op": "receive", "cg": CG, "t": "t", "q": 0, "now": -1, "inv": 100, "max": 1,
         "c": "c", "md": 16, "cap": 10},
        {"op": "receive", "cg": "bad name!", "t": "t", "q": 0, "now": 1, "inv": 100, "max": 1,
         "c": "c", "md": 16, "cap": 10},
        {"op": "ack", "cg": CG, "t": "t", "q": 0, "items": []},
        {"op": "ack", "cg": CG, "t": "t", "q": 0, "items": [[0, 0]]},  # handle 0
        {"op": "ack", "cg": CG, "t": "t", "q": 0, "items": [[0, 1]] * (MAX_ACK_ITEMS + 1)},
        {"op": "ack", "cg": CG, "t": "t", "q": 0, "items": [None]},
        {"op": "nack", "cg": CG, "t": "t", "q": 0, "items": [[0, 1]], "now": 1, "delay": None,
         "backoff": [], "md": 16, "err": "", "dead": False},
        {"op": "nack", "cg": CG, "t": "t", "q": 0, "items": [[0, 1]], "now": 1, "delay": None,
         "backoff": [1], "md": 16, "err": "x" * 5000, "dead": False},
        {"op": "nack", "cg": CG, "t": "t", "q": 0, "items": [[0, 1]], "now": 1, "delay": -5,
         "backoff": [1], "md": 16, "err": "", "dead": False},
        {"op": "nack", "cg": CG, "t": "t", "q": 0, "items": [[0, 1]], "now": 1, "delay": None,
         "backoff": [1], "md": 0, "err": "", "dead": False},
        {"op": "change_invisible", "cg": CG, "t": "t", "q": 0, "o": 0, "h": 1, "now": 1,
         "inv": 10 ** 12},
    ]
    for d in bad:
        r = log.control(msgpack.packb(d))
        assert isinstance(r, ErrorResult) and r.code in (Code.MALFORMED, Code.INVALID_NAME), d
    unknown = log.control(Receive(CG, "nope", 0, 1))
    assert isinstance(unknown, ErrorResult) and unknown.code == Code.UNKNOWN_TOPIC
    after = BrokerState.restore("g", before)
    assert after.receipts.section() == log.receipts.section()
    with pytest.raises(Refused):
        Receive(CG, "t", 0, 1, max_deliveries=0)


# ---------------------------------------------------------------------- properties


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_replicas_agree_and_deliveries_count_up_with_stale_receipts_changing_nothing(
        data: st.DataObject) -> None:
    log = _log()
    max_deliveries = data.draw(st.integers(1, 4), label="max deliveries")
    now = 0
    current: dict[int, int] = {}  # offset -> the handle of its current delivery
    old: list[tuple[int, int]] = []  # receipts no longer current
    counts: dict[int, list[int]] = {}  # offset -> the delivery counts seen, in order
    finished: set[int] = set()  # acked
    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        now += data.draw(st.integers(-50, 300), label="clock step")  # may go back
        op = data.draw(st.sampled_from(["produce", "receive", "receive", "ack", "nack",
                                        "stale", "change", "retain"]))
        if op == "produce":
            log.produce(data.draw(st.integers(1, 4)))
        elif op == "receive":
            r = receive(log, max(now, 0), max=data.draw(st.integers(1, 5)),
                        invisible=data.draw(st.integers(10, 200)),
                        max_deliveries=max_deliveries, cap=data.draw(st.integers(1, 8)))
            for d in r.items:
                if d.offset in current:
                    old.append((d.offset, current[d.offset]))
                current[d.offset] = d.handle
                counts.setdefault(d.offset, []).append(d.deliveries)
            # what the receive buried instead of delivering, it buried whole
            dead_now = {d.offset for _, _, d in log.state.deadletters.of()}
            buried = [o for o in current if o not in log.receipts.inflight(CG, "t", 0)]
            assert len(buried) == r.skipped and set(buried) <= dead_now
            for off in buried:
                old.append((off, current.pop(off)))
        elif op in ("ack", "nack", "change") and current:
            picked = data.draw(st.lists(st.sampled_from(sorted(current.items())), min_size=1,
                                        max_size=4, unique=True))
            if op == "ack":
                r = log.control(Ack(CG, "t", 0, tuple(picked)))
                for off, _h in picked:
                    del current[off]
                    finished.add(off)
                assert r.skipped == 0
            elif op == "nack":
                r = log.control(Nack(CG, "t", 0, tuple(picked), max(now, 0),
                                     data.draw(st.none() | st.integers(0, 100)), (20, 40),
                                     max_deliveries, "e", data.draw(st.booleans())))
                for off, h in picked:
                    old.append((off, h))
                    del current[off]
            else:
                off, h = picked[0]
                r = log.control(ChangeInvisible(CG, "t", 0, off, h, max(now, 0), 100))
                assert r.applied == 1
        elif op == "stale" and old:
            picked = data.draw(st.lists(st.sampled_from(old), min_size=1, max_size=3))
            before = log.state.snapshot()
            r = log.control(Ack(CG, "t", 0, tuple(picked)))
            assert r.applied == 0 and r.skipped == len(picked)
            b = BrokerState.restore("g", before)
            assert b.receipts.section() == log.receipts.section()  # nothing changed
            assert b.deadletters.section() == log.state.deadletters.section()
        elif op == "retain":
            log.control(Retain(data.draw(st.integers(1, len(log.entries)))))
            lo = log.state.queue_range("t", 0)[0]
            for off in [o for o in current if o < lo]:
                del current[off]
        # a message's current handle is its in-flight one; nothing else is in flight
        inflight = log.receipts.inflight(CG, "t", 0)
        assert {o: f.handle for o, f in inflight.items() if f.handle} == current
        for o, h in old:
            assert inflight.get(o) is None or inflight[o].handle != h
    # deliveries of each message count 1, 2, 3 ... with no skip or repeat, within the max
    for off, seen in counts.items():
        assert seen == list(range(1, len(seen) + 1)) and len(seen) <= max_deliveries, off
    # no message is both acked and dead, and dead ones carry their delivery count
    dead = {d.offset: d for _, _, d in log.state.deadletters.of()}
    assert not finished & set(dead)
    for off, d in dead.items():
        assert d.deliveries == len(counts[off])
    # replicas: straight, and through a snapshot taken anywhere, hold the same state
    cut = data.draw(st.integers(0, len(log.entries)), label="snapshot at")
    b = BrokerState.restore("g", log.replay(cut).snapshot())
    for i, (kind, d2) in enumerate(log.entries[cut:], cut + 1):
        b.apply(Entry(i, 1, kind, d2))
    assert b.snapshot() == log.state.snapshot() == log.replay(len(log.entries)).snapshot()


def test_the_defaults_are_rocketmq_s() -> None:
    assert len(DEFAULT_BACKOFF_MS) == 16
    assert DEFAULT_BACKOFF_MS[0] == 10_000 and DEFAULT_BACKOFF_MS[-1] == 7_200_000
    assert Receive(CG, "t", 0, 0).invisible_ms == 30_000
    assert Receive(CG, "t", 0, 0).max_deliveries == 16 and Receive(CG, "t", 0, 0).cap == 4096
    assert DeadLetters.name == "deadletters" and Receipts.name == "receipts"


def test_the_ack_later_delivery_mutation_takes_a_stale_ack_for_the_current_delivery() -> None:
    """The test mutation (`broker.config`) the simple-consumer chaos checker must catch:
    an ack of an older delivery removes the message its later delivery holds. Nothing
    else changes: a current ack, an ack of an acked or nacked message, nack and
    change_invisible of a stale receipt are what they are without it."""

    def run(mutations: set[str]) -> tuple[list[Any], dict[int, Any]]:
        log = Log()
        log.state = BrokerState("g", mutations=mutations)
        log.control(control_create_topic("t", 1, [0]))
        log.produce(4)
        first = receive(log, 100, max=4, invisible=500)
        again = receive(log, 600, max=3)  # offsets 0-2 delivered again; 3 is not visible
        (o0, h0), (o1, h1), (o2, h2), (o3, h3) = receipts_of(first)
        nacked = log.control(Nack(CG, "t", 0, ((o2, again.items[2].handle),), 601, 10_000))
        out = [
            log.control(Ack(CG, "t", 0, ((o0, h0),))),  # stale: offset 0 delivered again
            log.control(Nack(CG, "t", 0, ((o1, h1),), 602)),  # stale nack
            log.control(ChangeInvisible(CG, "t", 0, o1, h1, 603, 1000)),  # stale change
            log.control(Ack(CG, "t", 0, ((o2, h2),))),  # stale: its later delivery nacked
            log.control(Ack(CG, "t", 0, ((o3, h3),))),  # current: acked either way
            nacked,
        ]
        return out, log.receipts.inflight(CG, "t", 0)

    honest, honest_inflight = run(set())
    broken, broken_inflight = run({"ack-later-delivery"})
    assert honest[0] == ControlResult("ack", 0, 1, items=((0, 3),))
    assert broken[0] == ControlResult("ack", 1, 0)  # the stale ack taken
    assert set(honest_inflight) == {0, 1, 2} and set(broken_inflight) == {1, 2}
    assert honest[1:] == broken[1:]  # everything else the same
    assert isinstance(honest[2], ErrorResult) and honest[2].code == Code.STALE_RECEIPT
    assert honest[3] == ControlResult("ack", 0, 1, items=((2, 3),))
    assert honest[4] == ControlResult("ack", 1, 0)
    assert BrokerState("g", mutations={"ack-later-delivery"}).receipts.ack_later_delivery
    assert not BrokerState("g").receipts.ack_later_delivery
