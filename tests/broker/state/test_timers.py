"""Delayed messages in the state machine (`broker.state.parts.timers`): stored when sent,
in their queue only once a `DeliverDue` at or after their time is applied, never before,
each exactly once, the same on every replica and across snapshots."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.cqchunks import CorruptChunk, MemoryChunkStore
from broker.state.parts import timers as timers_part
from broker.state.parts.base import ControlResult, ErrorResult, ProduceResult
from broker.state.parts.timers import (
    BUCKET_MS,
    DELIVER_LIMIT,
    DeliverDue,
    ForgetPending,
    TimerLimits,
)
from broker.state.statemachine import BrokerState, control_create_topic, control_delete_topic
from raftlog.types import Entry, EntryType
from wire.protocol import Code, RequestError
from wire.records import (
    MAX_DUE_MS,
    STORED_PREFIX,
    OutgoingMessage,
    batch_header,
    decode_record,
    encode_batch,
)

T0 = 1_700_000_000_000  # store times of the tests' entries start here (ms)


class Log:
    """A group's log as the tests write it, applied to any number of replicas."""

    def __init__(self) -> None:
        self.entries: list[tuple[EntryType, bytes]] = [
            (EntryType.CONTROL, control_create_topic("t", 2, [0, 1])),
            (EntryType.CONTROL, control_create_topic("u", 1, [0]))]
        self.bodies: dict[bytes, int] = {}  # body -> its due time
        self.delayed: set[bytes] = set()  # the bodies sent with a delay or a time
        self.place: dict[bytes, tuple[int, int]] = {}  # body -> (Raft index, record)
        self.script: list[str] = []  # what was written, for a falsifying example's report

    def __repr__(self) -> str:
        return "Log(T0 + ms: [\n  " + ",\n  ".join(self.script) + "])"

    def send(self, store_ms: int, *, queue: int = 0, topic: str = "t", n: int = 1,
             delay_ms: int = 0, deliver_ms: int = 0, key: str = "") -> list[bytes]:
        k = len(self.entries)
        bodies = [b"e%d-%d" % (k, i) for i in range(n)]
        msgs = [OutgoingMessage(b, key=key) for b in bodies]
        batch = encode_batch(topic, queue, msgs, delay_ms=delay_ms, deliver_ms=deliver_ms)
        self.entries.append((EntryType.MESSAGES, STORED_PREFIX.pack(store_ms) + batch))
        due = store_ms + delay_ms if delay_ms else (deliver_ms or store_ms)
        self.bodies.update({b: due for b in bodies})
        self.place.update({b: (k + 1, i) for i, b in enumerate(bodies)})
        if delay_ms or deliver_ms:
            self.delayed.update(bodies)
        self.script.append(f"{k + 1}: send {topic}/{queue} at {store_ms - T0} n={n}"
                           + (f" due {due - T0}" if delay_ms or deliver_ms else ""))
        return bodies

    def tick(self, now_ms: int, limit: int = 65536) -> None:
        self.entries.append((EntryType.CONTROL, DeliverDue(now_ms, limit).encode()))
        self.script.append(f"{len(self.entries)}: tick {now_ms - T0} limit={limit}")

    def apply(self, state: BrokerState, start: int = 0) -> list[Any]:
        return [state.apply(Entry(i + 1, 1, t, d))
                for i, (t, d) in enumerate(self.entries) if i >= start]


def queued(state: BrokerState, topic: str = "t", queue: int = 0,
           log: Log | None = None) -> list[bytes]:
    """The bodies in a queue, in offset order (read from the log's entries)."""
    assert log is not None
    lo, end = state.queue_range(topic, queue)
    out = []
    for o in range(lo, end):
        e = state.entry_of(topic, queue, o)
        data = log.entries[e.index - 1][1]
        msg, _ = decode_record(data, e.start, topic=topic, queue=queue, offset=o,
                               store_ms=e.store_ms, msg_id="")
        out.append(msg.body)
    return out


def test_a_delayed_message_waits_for_its_time_and_then_enters_its_queue_once() -> None:
    log = Log()
    plain = log.send(T0)
    later = log.send(T0, delay_ms=5000, key="order-1")
    at = log.send(T0 + 1, deliver_ms=T0 + 3000)
    s = BrokerState("g")
    results = log.apply(s)
    assert isinstance(results[3], ProduceResult) and results[3].base_offset == -1
    assert queued(s, log=log) == plain
    due = s.timers.next_due()
    assert s.timers.pending == 2 and due is not None and due <= T0 + 3000
    log.tick(T0 + 2999)
    log.tick(T0 + 3000)
    log.tick(T0 + 4999)
    log.tick(T0 + 5000)
    log.tick(T0 + 9000)
    results = log.apply(s, start=5)
    assert [r.applied for r in results] == [0, 1, 0, 1, 0]
    assert queued(s, log=log) == plain + at + later
    assert s.timers.pending == 0 and s.timers.next_due() is None
    # the key index finds the delayed message once it is in its queue
    assert s.keys("t", "order-1") == [(0, 2)]
    # its store time is the one it was sent with: consumers see when it was stored
    assert s.entry_of("t", 0, 2).store_ms == T0


def test_time_never_runs_backwards_and_nothing_is_moved_early() -> None:
    log = Log()
    log.send(T0, delay_ms=1000)
    log.tick(T0 + 2000, limit=1)  # nothing there yet... (sent before: it moves)
    log.send(T0 + 10, delay_ms=5000)
    log.tick(T0 + 100)  # a new leader with a clock behind: the part's clock stays
    s = BrokerState("g")
    results = log.apply(s)
    assert [r.applied for r in results[3:4]] == [1]
    assert results[5] == ControlResult("deliver_due", 0, 0)
    assert s.timers.clock_ms == T0 + 2000 and s.timers.pending == 1


def test_a_limit_moves_the_earliest_first_and_leaves_the_rest_for_the_next() -> None:
    log = Log()
    for k in range(5):
        log.send(T0, delay_ms=5000 - k * 1000)  # due 5000, 4000, ... 1000
    log.tick(T0 + 10_000, limit=2)
    log.tick(T0 + 10_000, limit=2)
    log.tick(T0 + 10_000, limit=2)
    s = BrokerState("g")
    results = log.apply(s)
    assert [r.applied for r in results[-3:]] == [2, 2, 1]
    assert queued(s, log=log) == sorted(log.bodies, key=lambda b: log.bodies[b])


def test_one_bucket_partly_due_gives_only_its_due_messages_in_due_order() -> None:
    log = Log()
    base = (T0 // BUCKET_MS + 10) * BUCKET_MS  # a bucket boundary ahead
    dues = [base + 90, base + 10, base + 50, base + 30, base + 70]
    for d in dues:
        log.send(T0, deliver_ms=d)
    log.tick(base + 40)
    s = BrokerState("g")
    log.apply(s)
    got = queued(s, log=log)
    assert [log.bodies[b] for b in got] == [base + 10, base + 30]
    log.tick(base + 99)
    log.apply(s, start=len(log.entries) - 1)
    assert [log.bodies[b] for b in queued(s, log=log)] == sorted(dues)


def test_a_wholly_due_bucket_gives_the_same_order_whatever_order_it_was_filled_in() -> None:
    """A replica that read a spilled run back before a new message came in, and one that
    read it after (or after restoring a snapshot), hold one bucket's records in different
    orders: what enters the queue must not depend on it (seed 47 of the chaos run saw two
    messages due 3 ms apart swapped between leaders)."""
    size = timers_part._SIZE
    base = (T0 // BUCKET_MS + 10) * BUCKET_MS
    log = Log()
    log.send(T0, deliver_ms=base + 7)
    log.send(T0, deliver_ms=base + 4)
    log.send(T0, deliver_ms=base + 5)
    s = BrokerState("g")
    log.apply(s)
    [bucket] = s.timers._buckets.values()
    recs = [bytes(bucket.buf[i:i + size]) for i in range(bucket.pos, len(bucket.buf), size)]
    forward = timers_part._Bucket(bytearray(b"".join(recs)))
    backward = timers_part._Bucket(bytearray(b"".join(reversed(recs))))
    now = base + BUCKET_MS - 1  # every record of the bucket is due
    a, b = forward.take(now, 10, whole=True), backward.take(now, 10, whole=True)
    assert a == b == sorted(a)
    assert [r[0] for r in a] == [base + 4, base + 5, base + 7]


def test_a_tick_before_a_read_back_bucket_is_due_leaves_it_alike_on_every_replica() -> None:
    """A replica that read a run back live bounds the bucket by its edges; one that
    restored a snapshot taken after, by its records' exact due times. A tick inside the
    bucket but before its first due time must leave its records as they are on both: the
    first sorted them (asked, as its bound said one might be due), and the two replicas'
    snapshots differed at the same log position until the next tick drained them."""
    limits = TimerLimits(1, 1500)  # (read back 100 ms ahead)
    base = (T0 // BUCKET_MS + 20) * BUCKET_MS  # beyond the horizon: spilled
    log = Log()
    for d in (50, 20, 30):
        log.send(T0, deliver_ms=base + d)
    log.tick(base - 50)  # reads the run back
    live = BrokerState("g", timer_limits=limits)
    log.apply(live)
    assert live.timers.runs == 0 and live.timers.in_memory == 3
    restored = BrokerState.restore("g", live.snapshot(), chunk_store=live.chunk_store,
                                   timer_limits=limits)
    for now in (base + 5, base + 99):  # nothing due yet; then all of it
        log.tick(now)
        for s in (live, restored):
            log.apply(s, start=len(log.entries) - 1)
        assert live.snapshot() == restored.snapshot()
    assert [log.bodies[b] - base for b in queued(live, log=log)] == [20, 30, 50]


def test_a_deleted_topic_drops_its_pending_messages_and_keeps_the_others() -> None:
    log = Log()
    log.send(T0, topic="u", delay_ms=100)
    kept = log.send(T0, delay_ms=100)
    log.entries.append((EntryType.CONTROL, control_delete_topic("u")))
    log.tick(T0 + 200)
    s = BrokerState("g")
    log.apply(s)
    assert s.timers.pending == 0 and s.timers.dropped == 1
    assert queued(s, log=log) == kept


def test_pending_messages_pin_their_entries_from_retention() -> None:
    log = Log()
    log.send(T0)
    log.send(T0, delay_ms=60_000)  # entry 4
    log.send(T0 + 1)
    s = BrokerState("g")
    log.apply(s)
    assert s.pinned_index() == 4
    log.tick(T0 + 60_000)
    log.apply(s, start=len(log.entries) - 1)
    assert s.pinned_index() is None


def test_a_delayed_idempotent_retry_is_a_duplicate_and_pends_once() -> None:
    s = BrokerState("g")
    s.apply(Entry(1, 1, EntryType.CONTROL, control_create_topic("t", 1, [0])))
    batch = encode_batch("t", 0, [b"x"], pid=7, seq=0, delay_ms=500)
    first = s.apply(Entry(2, 1, EntryType.MESSAGES, STORED_PREFIX.pack(T0) + batch))
    again = s.apply(Entry(3, 1, EntryType.MESSAGES, STORED_PREFIX.pack(T0 + 5) + batch))
    assert isinstance(first, ProduceResult) and isinstance(again, ProduceResult)
    assert again.dup and s.timers.pending == 1


def test_bad_delay_fields_are_refused_whole() -> None:
    with pytest.raises(RequestError) as e:
        encode_batch("t", 0, [b"x"], delay_ms=10, deliver_ms=T0)
    assert e.value.code == Code.MALFORMED
    for bad in (-1, MAX_DUE_MS + 1, 1.5, True, "10"):
        with pytest.raises(RequestError):
            encode_batch("t", 0, [b"x"], delay_ms=bad)  # type: ignore[arg-type]
    # a header written by hand: refused at apply too, changing nothing
    import msgpack

    from wire.records import _BATCH_PREFIX, MAGIC, RECORD_HEADER, VERSION
    for field in ({"delay": -5}, {"at": "soon"}, {"delay": 5, "at": T0}):
        h = msgpack.packb({"topic": "t", "queue": 0, "pid": 0, "seq": -1, "n": 1, **field})
        body = (_BATCH_PREFIX.pack(MAGIC, VERSION, 0, len(h)) + h
                + RECORD_HEADER.pack(RECORD_HEADER.size + 1, 0, 0, 0, 0, 1) + b"x")
        s = BrokerState("g")
        s.apply(Entry(1, 1, EntryType.CONTROL, control_create_topic("t", 1, [0])))
        r = s.apply(Entry(2, 1, EntryType.MESSAGES, STORED_PREFIX.pack(T0) + body))
        assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED, (field, r)
        assert s.timers.pending == 0 and s.queue_range("t", 0) == (0, 0)
    for tick in ({"now": -1, "limit": 1}, {"now": 1, "limit": 0}, {"now": 1}):
        s = BrokerState("g")
        r = s.apply(Entry(1, 1, EntryType.CONTROL, msgpack.packb({"op": "deliver_due", **tick})))
        assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED


def test_the_header_says_when_a_batch_is_due() -> None:
    h = batch_header(encode_batch("t", 3, [b"x"], delay_ms=250))
    assert h.delayed and h.due_ms(T0) == T0 + 250 and not h.prepared
    h = batch_header(encode_batch("t", 3, [b"x"], deliver_ms=T0 + 9))
    assert h.delayed and h.due_ms(T0) == T0 + 9
    assert not batch_header(encode_batch("t", 3, [b"x"])).delayed


# ---------------------------------------------------------------------- the model


@st.composite
def histories(draw: st.DrawFn) -> tuple[Log, list[int]]:
    """Sends (plain, delayed by a delay or to a time, of 1-3 messages, any queue) and
    ticks at non-decreasing or stepping-back leader clocks, with small limits."""
    log = Log()
    clock = T0
    ticks: list[int] = []
    for _ in range(draw(st.integers(1, 40))):
        clock += draw(st.integers(0, 400))
        kind = draw(st.sampled_from(["plain", "delay", "at", "tick", "tick"]))
        if kind == "tick":
            now = clock - draw(st.sampled_from([0, 0, 0, 150]))  # a leader behind, now and then
            log.tick(now, draw(st.integers(1, 6)))
            ticks.append(len(log.entries))
            continue
        n = draw(st.integers(1, 3))
        q = draw(st.integers(0, 1))
        if kind == "plain":
            log.send(clock, queue=q, n=n)
        elif kind == "delay":
            log.send(clock, queue=q, n=n, delay_ms=draw(st.integers(1, 900)))
        else:
            log.send(clock, queue=q, n=n, deliver_ms=clock + draw(st.integers(-300, 900)) or 1)
    log.tick(clock + 10_000)
    log.tick(clock + 10_000)
    log.tick(clock + 10_000)
    return log, ticks


def small_runs() -> Any:
    """Spill thresholds small enough for a test's few messages to make runs."""
    return mock.patch.multiple(timers_part, SPILL_AT=8, SPILL_HORIZON_MS=400)


@st.composite
def crowded_histories(draw: st.DrawFn) -> tuple[Log, TimerLimits]:
    """Histories whose delayed messages crowd into one or two *hot* buckets, a few ms
    apart and in any order: sent while their bucket is beyond the spill horizon (they go
    to runs), as a run holding it is read back, and after (landing beside records read
    back); the leader's clock waits for the hot buckets, then crawls through them, ticks
    falling before, between and after their messages' due times, with small limits. The
    spill limits (the same for every replica, as `TimerLimits` requires) are tiny enough
    for a few messages to make runs."""
    limits = TimerLimits(draw(st.sampled_from([1, 2, 4]), label="memory records"),
                         draw(st.sampled_from([300, 600, 1500]), label="horizon ms"))
    log = Log()
    clock = T0
    first = (T0 + limits.horizon_ms + 160) // BUCKET_MS + 1 + draw(st.integers(0, 3))
    hot = sorted({first + d for d in draw(st.lists(st.integers(0, 3), min_size=1,
                                                   max_size=2), label="hot buckets")})
    near = hot[0] * BUCKET_MS - limits.load_ahead_ms - 50  # a run holding it is read back
    limit = st.integers(1, 4) | st.just(DELIVER_LIMIT)

    def step(clock: int) -> None:
        kind = draw(st.sampled_from(["hot", "hot", "far", "plain", "tick", "tick"]))
        n = draw(st.integers(1, 2))
        q = draw(st.integers(0, 1))
        if kind == "hot":
            due = draw(st.sampled_from(hot)) * BUCKET_MS + draw(st.integers(0, 9)
                                                                  | st.integers(0, 99))
            if due > clock and draw(st.booleans()):
                log.send(clock, queue=q, n=n, delay_ms=due - clock)
            else:  # (or due already: it waits for the next tick all the same)
                log.send(clock, queue=q, n=n, deliver_ms=due)
        elif kind == "far":  # beyond the horizon: spills, and makes the hot ones spill
            log.send(clock, queue=q, n=n,
                     delay_ms=limits.horizon_ms + draw(st.integers(1, 2000)))
        elif kind == "plain":
            log.send(clock, queue=q, n=n)
        else:  # now and then a leader whose clock is behind
            log.tick(clock - draw(st.sampled_from([0, 0, 0, 150])), draw(limit))

    for _ in range(draw(st.integers(0, 20))):  # while the hot buckets are far ahead
        clock += draw(st.integers(0, 8))
        step(clock)
    # then the clock moves on to when a run holding them is read back, and crawls
    # through them
    clock = max(clock, near + draw(st.integers(0, limits.load_ahead_ms + 50)))
    for _ in range(draw(st.integers(1, 40))):
        step(clock)
        clock += draw(st.integers(0, 15))
    for _ in range(3):
        log.tick(clock + 10_000)
    return log, limits


@pytest.mark.parametrize("spill", [False, True], ids=["in-memory", "spilled-runs"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.data())
def test_replicas_agree_nothing_is_early_and_everything_arrives_once(
        spill: bool, h: tuple[Log, list[int]], data: st.DataObject) -> None:
    log, _ticks = h
    check_replicas(log, TimerLimits(8, 400) if spill else None, data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crowded_histories(), st.data())
def test_replicas_that_read_runs_back_at_different_moments_move_the_same_in_one_order(
        h: tuple[Log, TimerLimits], data: st.DataObject) -> None:
    """Replicas apply one log but hold a bucket's records in different orders and with
    different bounds: one read a run back live (its bucket's bounds are the bucket's
    edges), one restored a snapshot taken after (exact bounds), before every tick or at
    a few points drawn; each moves the same messages into each queue at the same log
    positions, in (due, log position) order (chaos seed 47 swapped two due 3 ms apart)."""
    log, limits = h
    check_replicas(log, limits, data)


Move = tuple[int, str, int, int, bytes]  # log position, topic, queue, offset, body


def replay(log: Log, limits: TimerLimits | None, restore_at: AbstractSet[int],
           snap_at: AbstractSet[int] = frozenset(),
           ) -> tuple[BrokerState, list[Move], dict[int, bytes]]:
    """Apply the log to a new replica that, before applying the entry at each position
    of `restore_at` (0: the first), snapshots and restores itself from it (the runs the
    snapshot no longer needs deleted, as once it is durable); every message that enters
    one of its queues, as it enters; and its snapshots before the positions `snap_at`."""
    s = BrokerState("g", timer_limits=limits)
    ends = dict.fromkeys(QUEUES, 0)
    moves: list[Move] = []
    snaps: dict[int, bytes] = {}
    for i, (t, d) in enumerate([*log.entries, (None, b"")]):
        if i in restore_at:
            later = s.snapshot_later()
            snaps[i] = later()
            later.saved()
            s = BrokerState.restore("g", snaps[i], chunk_store=s.chunk_store,
                                    timer_limits=limits)
        elif i in snap_at:
            snaps[i] = s.snapshot()
        if t is None:
            break
        s.apply(Entry(i + 1, 1, t, d))
        for topic, q in QUEUES:
            end = s.queue_range(topic, q)[1]
            moves += [(i + 1, topic, q, o, body_at(s, log, topic, q, o))
                      for o in range(ends[(topic, q)], end)]
            ends[(topic, q)] = end
    return s, moves, snaps


QUEUES = (("t", 0), ("t", 1))


def body_at(state: BrokerState, log: Log, topic: str, queue: int, offset: int) -> bytes:
    e = state.entry_of(topic, queue, offset)
    msg, _ = decode_record(log.entries[e.index - 1][1], e.start, topic=topic, queue=queue,
                           offset=offset, store_ms=e.store_ms, msg_id="")
    return msg.body


def check_replicas(log: Log, limits: TimerLimits | None, data: st.DataObject) -> None:
    """Three replicas of one log (live; restored at a few points drawn; restored before
    every tick, so every bucket it holds read back from a run has exact bounds) make
    the same moves, at the same positions, in one order, and the same snapshots; no
    message moves before its time or out of (due, log position) order within a tick,
    and every one moves exactly once."""
    n = len(log.entries)
    some = data.draw(st.sets(st.integers(0, n), min_size=1, max_size=3), label="restored at")
    ticks = {i for i, (t, d) in enumerate(log.entries) if t == EntryType.CONTROL and _is_tick(d)}
    a, moves, snaps = replay(log, limits, set(), some | ticks | {n})
    for restore_at in (some, ticks):
        r, other, other_snaps = replay(log, limits, restore_at, {n})
        assert other == moves, f"restored before {sorted(restore_at)}: moved otherwise"
        assert r.timers.pending == 0 and other_snaps[n] == snaps[n]
        for i in sorted(restore_at):
            assert other_snaps[i] == snaps[i], f"snapshots before entry {i} differ"
    # every message arrived exactly once (the last ticks are far past every due time)
    assert sorted(m[4] for m in moves) == sorted(log.bodies) and a.timers.pending == 0
    # never before its time, and those a tick moves in (due, log position) order
    clock, clocks = 0, {}  # the highest time a tick carried, by the tick's log position
    for i in sorted(ticks):
        clock = clocks[i + 1] = max(clock, DeliverDue.decode(log.entries[i][1]).now_ms)
    by_tick: dict[tuple[int, str, int], list[bytes]] = {}
    for pos, topic, q, _o, body in moves:
        if pos not in clocks:
            assert body not in log.delayed, "a delayed message moved when stored"
            continue
        assert log.bodies[body] <= clocks[pos], "delivered before its time"
        by_tick.setdefault((pos, topic, q), []).append(body)
    for bodies in by_tick.values():
        keys = [(log.bodies[b], *log.place[b]) for b in bodies]
        assert keys == sorted(keys), "a tick moved messages out of (due, log position) order"


def _is_tick(d: bytes) -> bool:
    try:
        DeliverDue.decode(d)
    except Exception:
        return False
    return True


def test_the_test_mutations_break_exactly_what_the_checker_looks_for() -> None:
    log = Log()
    log.send(T0, delay_ms=60_000)
    early = BrokerState("g", mutations={"deliver-at-send"})
    log.apply(early)
    assert early.queue_range("t", 0) == (0, 1) and early.timers.pending == 0
    log.entries.append((EntryType.CONTROL, ForgetPending().encode()))
    honest = BrokerState("g")
    r = log.apply(honest)[-1]
    assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED
    assert honest.timers.pending == 1
    volatile = BrokerState("g", mutations={"volatile-timers"})
    r = log.apply(volatile)[-1]
    assert r == ControlResult("forget_pending", 1) and volatile.timers.pending == 0


# ---------------------------------------------------------------------- spilled runs


def test_memory_stays_flat_far_messages_spill_to_runs_and_come_back_in_time() -> None:
    log = Log()
    for k in range(60):  # 120 messages due 1..60 s ahead, sent over a second
        log.send(T0 + k * 10, n=2, delay_ms=1000 * (60 - k), key=f"k{k}")
    with small_runs():
        s = BrokerState("g")
        log.apply(s)
        assert s.timers.pending == 120
        assert s.timers.in_memory <= 8 + 2 and s.timers.runs >= 5  # the rest on "disk"
        runs = {n for n in s.chunk_store.names() if n.startswith("timers-")}
        assert len(runs) == s.timers.runs
        assert s.pinned_index() == 3  # the first entry's messages are in a run
        # a replica restored from a snapshot reads the runs' numbers, not their records
        snap = s.snapshot()
        copy = BrokerState.restore("g", snap, chunk_store=s.chunk_store)
        assert copy.snapshot() == snap
        for t in range(T0, T0 + 62_000, 250):
            log.tick(t)
        log.apply(s, start=62)
        log.apply(copy, start=62)
    assert s.snapshot() == copy.snapshot() and s.timers.pending == 0 and s.timers.runs == 0
    got = queued(s, log=log)
    assert sorted(got) == sorted(log.bodies)
    assert [log.bodies[b] for b in got] == sorted(log.bodies[b] for b in got)  # in due order
    assert s.keys("t", "k0") == [(0, 118), (0, 119)]  # keys came back from the run
    # once a snapshot without them is durable, runs read back are deleted
    s.snapshot_later().saved()
    assert not {n for n in s.chunk_store.names() if n.startswith("timers-")}


def test_a_missing_or_damaged_run_refuses_the_snapshot() -> None:
    log = Log()
    for k in range(20):
        log.send(T0, delay_ms=60_000 + k)
    with small_runs():
        s = BrokerState("g")
        log.apply(s)
        snap = s.snapshot()
        (name,) = [n for n in s.chunk_store.names() if n.startswith("timers-")][:1]
        damaged = MemoryChunkStore()
        damaged.chunks = dict(s.chunk_store.chunks)  # type: ignore[attr-defined]
        damaged.chunks[name] = b"x" + damaged.chunks[name][1:]
        with pytest.raises(CorruptChunk):
            BrokerState.restore("g", snap, chunk_store=damaged)
        del damaged.chunks[name]
        with pytest.raises(CorruptChunk):
            BrokerState.restore("g", snap, chunk_store=damaged)


def test_a_deleted_topic_created_again_gets_none_of_its_spilled_messages() -> None:
    log = Log()
    for k in range(20):
        log.send(T0, topic="u", delay_ms=60_000 + k)
    kept = log.send(T0, delay_ms=60_000)
    with small_runs():
        s = BrokerState("g")
        log.apply(s)
        assert s.timers.runs and s.timers.pending == 21
        log.entries.append((EntryType.CONTROL, control_delete_topic("u")))
        log.entries.append((EntryType.CONTROL, control_create_topic("u", 1, [0])))
        log.tick(T0 + 70_000)
        log.tick(T0 + 70_000)
        log.apply(s, start=23)
    assert s.timers.pending == 0 and s.timers.dropped == 20
    assert s.queue_range("u", 0) == (0, 0) and queued(s, log=log) == kept
