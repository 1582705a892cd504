"""The per-entry shortcuts of the produce/apply path keep every outcome unchanged."""

from __future__ import annotations

import pytest

from broker.metrics import NodeMetrics
from broker.records import (
    STORED_PREFIX,
    OutgoingMessage,
    encode_batch,
    walk_batch,
)
from broker.statemachine import BrokerState, ProduceResult, control_create_topic
from raftlog.commitlog import CommitLog, encode_entry
from raftlog.runtime import _GuardedLog
from raftlog.types import Entry, EntryType, Message, MsgType
from raftlog.wire import message_from_wire, message_to_wire


def _state() -> BrokerState:
    s = BrokerState("g")
    s.apply(Entry(1, 1, EntryType.CONTROL, control_create_topic("t", 2, [0, 1])))
    return s


def _data(queue: int = 0, body: bytes = b"hello", store_ms: int = 7) -> bytes:
    return STORED_PREFIX.pack(store_ms) + encode_batch("t", queue, [OutgoingMessage(body, key="k")])


def test_a_prewalked_batch_applies_exactly_like_a_walked_one() -> None:
    a, b = _state(), _state()
    data = _data()
    header, refs = walk_batch(data, STORED_PREFIX.size, a.max_message_bytes)
    key = a.prewalked(data, header, refs, a.max_message_bytes)
    assert key is not None
    ra = a.apply(Entry(2, 1, EntryType.MESSAGES, data))
    rb = b.apply(Entry(2, 1, EntryType.MESSAGES, bytes(bytearray(data))))
    assert ra == rb == ProduceResult(0, 1, 2)
    assert a.snapshot() == b.snapshot()
    a.forget_walk(key)  # harmless after the apply used it


def test_a_walk_is_reused_only_for_the_same_bytes_object_and_limit() -> None:
    s = _state()
    data = _data(queue=0)
    other = _data(queue=1)
    header, refs = walk_batch(other, STORED_PREFIX.size, s.max_message_bytes)
    # a different object (even one with another content) is walked afresh
    key = s.prewalked(other, header, refs, s.max_message_bytes)
    copy = bytes(bytearray(other))
    assert s.apply(Entry(2, 1, EntryType.MESSAGES, copy)) == ProduceResult(0, 1, 2)
    s.forget_walk(key)
    assert s.prewalked(data, header, refs, s.max_message_bytes - 1) is None
    res = s.apply(Entry(3, 1, EntryType.MESSAGES, data))
    assert res == ProduceResult(0, 1, 3)  # queue 0, from its own walk, not the stale one
    assert s.queue_range("t", 1) == (0, 1) and s.queue_range("t", 0) == (0, 1)


def test_batch_headers_decoded_once_stay_correct() -> None:
    data = _data()
    h1, _ = walk_batch(data, STORED_PREFIX.size)
    h2, _ = walk_batch(_data(body=b"other"), STORED_PREFIX.size)
    assert h1 is h2  # same header bytes: decoded once
    h3, _ = walk_batch(_data(queue=1), STORED_PREFIX.size)
    assert (h3.topic, h3.queue) == ("t", 1)


def test_consecutive_appends_of_the_same_entries_share_one_encoding() -> None:
    entries = (Entry(5, 2, EntryType.MESSAGES, b"abc"), Entry(6, 2, EntryType.NOOP, b""))
    m2 = Message(MsgType.APPEND, 1, 2, 2, log_index=4, log_term=2, entries=entries, commit=3)
    m3 = Message(MsgType.APPEND, 1, 3, 2, log_index=4, log_term=2, entries=entries, commit=3)
    _, b2 = message_to_wire(m2)
    _, b3 = message_to_wire(m3)
    assert b2 is b3 and b2 == b"".join(encode_entry(e) for e in entries)
    changed = (Entry(5, 3, EntryType.MESSAGES, b"abd"),)
    m4 = Message(MsgType.APPEND, 1, 2, 3, log_index=4, log_term=2, entries=changed)
    f4, b4 = message_to_wire(m4)
    assert message_from_wire(f4, b4).entries == changed


class _Rt:
    """What `_GuardedLog` asks of its runtime."""

    def __init__(self) -> None:
        self.unrepaired: set[int] = set()
        self.reported: list[int] = []

    def report_corrupt(self, index: int, reason: str = "") -> None:
        self.reported.append(index)


def _entries(lo: int, hi: int, term: int, tag: bytes = b"") -> list[Entry]:
    return [Entry(i, term, EntryType.MESSAGES, b"e%d" % i + tag) for i in range(lo, hi)]


def test_the_guarded_log_serves_unapplied_entries_from_memory(tmp_path) -> None:
    log = CommitLog.open(tmp_path, segment_size=1 << 20)
    rt = _Rt()
    guard = _GuardedLog(rt, log)  # type: ignore[arg-type]
    first = _entries(1, 6, 1)
    log.store(first)
    guard.remember(first)
    got = guard.entries(1, 6, 1 << 20)
    assert got == first and all(a is b for a, b in zip(got, first, strict=True))
    assert guard.check_next(1)
    # a conflicting suffix replaces what memory holds
    newer = _entries(4, 8, 2, b"new")
    log.store(newer)
    guard.remember(newer)
    assert guard.entries(1, 8, 1 << 20) == first[:3] + newer
    # max_bytes: at least one, then as many as fit
    assert len(guard.entries(1, 8, 1)) == 1
    guard.applied(5)
    got = guard.entries(1, 8, 1 << 20)  # applied ones come from the log again
    assert got == first[:3] + newer
    assert got[0] is not first[0]
    assert guard.entries(6, 8, 1 << 20)[0] is newer[2]  # still in memory
    guard.applied(7)
    assert guard.entries(6, 8, 1 << 20) == newer[2:]
    # an unrepaired entry is never handed out, from memory either
    more = _entries(8, 10, 2)
    log.store(more)
    guard.remember(more)
    rt.unrepaired.add(9)
    assert guard.entries(8, 10, 1 << 20) == more[:1]
    assert not guard.check_next(9)
    log.close()


def test_the_guarded_log_reads_back_what_did_not_fit(tmp_path, monkeypatch) -> None:
    import raftlog.runtime as runtime

    monkeypatch.setattr(runtime, "_RECENT_BYTES", 6)
    log = CommitLog.open(tmp_path, segment_size=1 << 20)
    guard = _GuardedLog(_Rt(), log)  # type: ignore[arg-type]
    batch = _entries(1, 5, 1)
    log.store(batch)
    guard.remember(batch)  # only the first entries are kept
    later = _entries(5, 7, 1)
    log.store(later)
    guard.remember(later)  # not adjacent to what is kept: starts over
    assert guard.entries(1, 7, 1 << 20) == batch + later
    guard.clear()
    assert guard.entries(1, 7, 1 << 20) == batch + later
    log.close()


def test_produce_series_are_cached_per_group_and_dropped_with_it() -> None:
    m = NodeMetrics(1)
    s = m.produce_series("g1")
    assert m.produce_series("g1") is s
    s[0].inc(3)
    assert m.registry.get_sample_value("raftmq_produce_messages_total", {"group": "g1"}) == 3
    f = m.fetch_series("g1")
    assert m.fetch_series("g1") is f
    m.remove_group("g1")
    assert m.produce_series("g1") is not s
    assert m.registry.get_sample_value("raftmq_produce_messages_total", {"group": "g1"}) == 0


@pytest.mark.parametrize("n", [1, 3])
def test_walk_results_do_not_depend_on_the_header_cache(n: int) -> None:
    import broker.records as records

    batch = encode_batch("t", 0, [OutgoingMessage(b"x" * i) for i in range(n)])
    records._HEADERS.clear()
    cold = walk_batch(batch)
    warm = walk_batch(batch)
    assert cold == warm
