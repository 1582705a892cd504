"""Broker state machine: offsets, idempotence, control ops, retention, filtering, snapshots."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.consumequeue import CQ_RECORD, ConsumeQueue
from broker.state.statemachine import (
    DEDUP_WINDOW,
    KEY_HISTORY,
    MAX_CLIENTS,
    MAX_QUEUES,
    REQUEST_WINDOW,
    ApplyResult,
    BrokerState,
    ControlResult,
    ErrorResult,
    ProduceResult,
    Retain,
    TopicConfig,
    control_create_topic,
    control_delete_topic,
    control_offsets,
)
from raftlog.types import Entry, EntryType
from wire.protocol import Code, RequestError
from wire.records import STORED_PREFIX, OutgoingMessage, decode_record, encode_batch, tag_hash


class Feed:
    """Applies entries with consecutive indexes, the way a replica sees the log."""

    def __init__(self, state: BrokerState | None = None) -> None:
        self.state = state or BrokerState("g1")
        self.index = self.state.applied_index

    def entry(self, type_: EntryType, data: bytes = b"") -> ApplyResult:
        self.index += 1
        return self.state.apply(Entry(self.index, 1, type_, data))

    def control(self, data: bytes) -> ApplyResult:
        return self.entry(EntryType.CONTROL, data)

    def raw_control(self, obj: Any) -> ApplyResult:
        return self.control(msgpack.packb(obj, use_bin_type=True))

    def produce(
        self,
        topic: str,
        queue: int,
        n: int = 1,
        *,
        pid: int = 0,
        seq: int = -1,
        key: str = "",
        tags: str = "",
        body: bytes | None = None,
        store_ms: int = 1000,
    ) -> ApplyResult:
        msgs = [
            OutgoingMessage(body if body is not None else f"m{i}".encode(), key=key, tags=tags)
            for i in range(n)
        ]
        batch = encode_batch(topic, queue, msgs, pid=pid, seq=seq)
        return self.entry(EntryType.MESSAGES, STORED_PREFIX.pack(store_ms) + batch)


def with_topic(topic: str = "t", queues: int = 4, hosted: tuple[int, ...] = (0, 1, 2, 3)) -> Feed:
    f = Feed()
    assert f.control(control_create_topic(topic, queues, hosted)) == ControlResult("create_topic", 1)
    return f


def legacy_snapshot(snapshot: bytes) -> dict[str, Any]:
    """A version 3 snapshot in the flat map of version 2 (what earlier releases wrote)."""
    d = msgpack.unpackb(snapshot, raw=False, strict_map_key=False)
    parts = {name: section for name, _, section in d["parts"]}
    queues = parts["queues"]
    # queues section version 2 -> 1: every record inline (small states have no chunks),
    # and the key index: per (topic, key) the newest KEY_HISTORY keyed records in log order
    flat, found = [], []
    for t, q, lo, _end, head, head_keys, refs, tail, tail_keys in queues["queues"]:
        assert not refs
        records = head + tail
        flat.append([t, q, lo, records])
        for o, k in head_keys + tail_keys:
            index, start = struct.unpack_from(">QI", records, (o - lo) * 28)
            found.append((t, index, start, o * MAX_QUEUES + q, k))
    # producers' section version 1: no shift (its entries held one batch each)
    producers = [[pid, t, q, last, [r[:4] for r in recent]]
                 for pid, t, q, last, recent in parts["producers"]]
    index_: dict[tuple[str, str], list[int]] = {}
    for t, _i, _s, packed, k in sorted(found):
        index_.setdefault((t, k), []).append(packed)
    keys = [[t, k, slots[-KEY_HISTORY:]] for (t, k), slots in sorted(index_.items())]
    return {"v": 2, "group": d["group"], "applied": d["applied"], "retained": parts["horizon"],
            "counters": queues["counters"], "topics": parts["catalog"],
            "queues": flat, "offsets": parts["offsets"],
            "producers": producers, "keys": keys, "clients": parts["requests"]}


def assert_no_change(make: Any, bad: bytes, type_: EntryType, **kw: Any) -> ApplyResult:
    """Applying `bad` must leave the same state as a NOOP at the same index."""
    a, b = make(**kw), make(**kw)
    result = a.entry(type_, bad)
    b.entry(EntryType.NOOP)
    assert a.state.snapshot() == b.state.snapshot()
    return result


# ---------------------------------------------------------------------- produce


def test_noop_and_config_do_nothing_but_advance_the_applied_index() -> None:
    f = Feed()
    assert f.entry(EntryType.NOOP) is None
    assert f.entry(EntryType.CONFIG, b"whatever") is None
    assert f.state.applied_index == 2
    assert f.state.topics() == {}


def test_produce_to_unknown_topic_or_queue_is_refused() -> None:
    f = with_topic(queues=4, hosted=(0, 2))
    r = f.produce("nope", 0)
    assert isinstance(r, ErrorResult) and r.code == Code.UNKNOWN_TOPIC
    r = f.produce("t", 1)  # exists in the topic but hosted elsewhere
    assert isinstance(r, ErrorResult) and r.code == Code.UNKNOWN_QUEUE
    r = f.produce("t", 7)
    assert isinstance(r, ErrorResult) and r.code == Code.UNKNOWN_QUEUE
    assert f.state.applied_index == f.index == 4
    assert f.state.queue_range("t", 0) == (0, 0)
    assert f.state.messages_applied == 0
    with pytest.raises(RequestError) as e:
        f.state.queue_range("t", 1)
    assert e.value.code == Code.UNKNOWN_QUEUE
    with pytest.raises(RequestError) as e:
        f.state.queue_range("nope", 0)
    assert e.value.code == Code.UNKNOWN_TOPIC


def test_offsets_are_assigned_in_log_order_per_queue() -> None:
    f = with_topic()
    assert f.produce("t", 0, 3) == ProduceResult(0, 3, 2, False)
    assert f.produce("t", 1, 2) == ProduceResult(0, 2, 3, False)
    assert f.produce("t", 0, 1) == ProduceResult(3, 1, 4, False)
    assert f.produce("t", 1, 4) == ProduceResult(2, 4, 5, False)
    assert f.state.queue_range("t", 0) == (0, 4)
    assert f.state.queue_range("t", 1) == (0, 6)
    assert f.state.queue_range("t", 2) == (0, 0)
    assert f.state.messages_applied == 10
    entries, nxt = f.state.lookup("t", 0, 0, 100, 1 << 20)
    assert [e.offset for e in entries] == [0, 1, 2, 3] and nxt == 4
    assert [e.index for e in entries] == [2, 2, 2, 4]


def test_consume_queue_entries_locate_the_stored_record() -> None:
    f = with_topic()
    data = STORED_PREFIX.pack(777) + encode_batch(
        "t", 2, [OutgoingMessage(b"hello", key="k"), OutgoingMessage(b"world", tags="x")]
    )
    f.entry(EntryType.MESSAGES, data)
    entries, _ = f.state.lookup("t", 2, 0, 10, 1 << 20)
    bodies = []
    for e in entries:
        msg, after = decode_record(
            data, e.start, topic="t", queue=2, offset=e.offset, store_ms=e.store_ms, msg_id=""
        )
        assert after == e.start + e.size and e.store_ms == 777
        bodies.append(msg.body)
    assert bodies == [b"hello", b"world"]
    assert entries[1].tag_hash == tag_hash("x") and entries[0].tag_hash == 0
    assert f.state.bytes_applied == sum(e.size for e in entries)


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"\x00" * 7,
        STORED_PREFIX.pack(1),
        STORED_PREFIX.pack(1) + b"garbage!garbage!",
        STORED_PREFIX.pack(1) + encode_batch("t", 0, [OutgoingMessage(b"abc")])[:-1],
        STORED_PREFIX.pack(1) + encode_batch("t", 0, [OutgoingMessage(b"abc")]) + b"\x00",
        STORED_PREFIX.pack(1)
        + encode_batch("t", 0, [OutgoingMessage(b"a")], pid=5, seq=-1),  # pid needs a seq
    ],
)
def test_malformed_batches_are_refused_without_change(bad: bytes) -> None:
    r = assert_no_change(with_topic, bad, EntryType.MESSAGES)
    assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED


def test_header_count_mismatch_is_malformed() -> None:
    batch = bytearray(encode_batch("t", 0, [OutgoingMessage(b"a"), OutgoingMessage(b"b")]))
    batch = batch.replace(b"\xa1n\x02", b"\xa1n\x03")  # header n: 2 -> 3
    r = assert_no_change(with_topic, STORED_PREFIX.pack(1) + bytes(batch), EntryType.MESSAGES)
    assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED


def test_too_large_message_is_refused_whole() -> None:
    def make() -> Feed:
        f = Feed(BrokerState("g1", max_message_bytes=10))
        f.control(control_create_topic("t", 1, [0]))
        return f

    batch = encode_batch("t", 0, [OutgoingMessage(b"ok"), OutgoingMessage(b"x" * 11)])
    r = assert_no_change(make, STORED_PREFIX.pack(1) + batch, EntryType.MESSAGES)
    assert isinstance(r, ErrorResult) and r.code == Code.MESSAGE_TOO_LARGE
    assert make().produce("t", 0, body=b"x" * 10) == ProduceResult(0, 1, 2)


# ---------------------------------------------------------------------- idempotence


def test_idempotent_duplicates_return_the_remembered_result() -> None:
    f = with_topic()
    first = f.produce("t", 0, 2, pid=9, seq=0)
    assert first == ProduceResult(0, 2, 2, False)
    again = f.produce("t", 0, 2, pid=9, seq=0)
    assert again == ProduceResult(0, 2, 2, True)
    assert f.state.queue_range("t", 0) == (0, 2)
    assert f.produce("t", 0, 1, pid=9, seq=1) == ProduceResult(2, 1, 4, False)
    assert f.produce("t", 0, 2, pid=9, seq=0) == ProduceResult(0, 2, 2, True)
    # Another queue, another producer, or no pid: independent.
    assert f.produce("t", 1, 1, pid=9, seq=0) == ProduceResult(0, 1, 6, False)
    assert f.produce("t", 0, 1, pid=10, seq=0) == ProduceResult(3, 1, 7, False)
    assert f.produce("t", 0, 1) == ProduceResult(4, 1, 8, False)
    assert f.produce("t", 0, 1) == ProduceResult(5, 1, 9, False)


def test_sequence_gap_is_refused_and_changes_nothing() -> None:
    def make() -> Feed:
        f = with_topic()
        f.produce("t", 0, pid=3, seq=4)  # an unseen producer may start anywhere
        return f

    gap = STORED_PREFIX.pack(1) + encode_batch("t", 0, [OutgoingMessage(b"x")], pid=3, seq=6)
    r = assert_no_change(make, gap, EntryType.MESSAGES)
    assert isinstance(r, ErrorResult) and r.code == Code.SEQUENCE_GAP and r.code.retriable
    f = make()
    assert f.produce("t", 0, pid=3, seq=5) == ProduceResult(1, 1, 3, False)
    assert f.produce("t", 0, pid=3, seq=6) == ProduceResult(2, 1, 4, False)


def test_duplicates_older_than_the_window_are_recognised_but_not_resolved() -> None:
    f = with_topic()
    results = [f.produce("t", 0, pid=1, seq=s) for s in range(DEDUP_WINDOW + 3)]
    assert f.state.queue_range("t", 0) == (0, DEDUP_WINDOW + 3)
    old = f.produce("t", 0, pid=1, seq=1)
    assert old == ProduceResult(-1, 1, -1, True)
    oldest_kept = 3
    r = f.produce("t", 0, pid=1, seq=oldest_kept)
    assert isinstance(r, ProduceResult) and r.dup
    assert r == ProduceResult(
        results[oldest_kept].base_offset, 1, results[oldest_kept].index, True  # type: ignore[union-attr]
    )
    assert f.state.queue_range("t", 0) == (0, DEDUP_WINDOW + 3)


# ---------------------------------------------------------------------- control ops


def test_create_topic_is_idempotent_and_conflicts_are_refused() -> None:
    f = with_topic("t", 4, (0, 1))
    assert f.control(control_create_topic("t", 4, [1, 0])) == ControlResult("create_topic", 0)
    r = f.control(control_create_topic("t", 4, [0, 1, 2]))
    assert isinstance(r, ErrorResult) and r.code == Code.TOPIC_EXISTS
    r = f.control(control_create_topic("t", 8, [0, 1]))
    assert isinstance(r, ErrorResult) and r.code == Code.TOPIC_EXISTS
    assert f.state.topics() == {"t": TopicConfig("t", 4, (0, 1))}


@pytest.mark.parametrize(
    ("obj", "code"),
    [
        ({"op": "create_topic", "topic": "bad name", "queues": 1, "hosted": [0]}, Code.INVALID_NAME),
        ({"op": "create_topic", "topic": "", "queues": 1, "hosted": [0]}, Code.INVALID_NAME),
        ({"op": "create_topic", "topic": 5, "queues": 1, "hosted": [0]}, Code.INVALID_NAME),
        ({"op": "create_topic", "topic": "x", "queues": 0, "hosted": [0]}, Code.MALFORMED),
        ({"op": "create_topic", "topic": "x", "queues": 1025, "hosted": [0]}, Code.MALFORMED),
        ({"op": "create_topic", "topic": "x", "queues": True, "hosted": [0]}, Code.MALFORMED),
        ({"op": "create_topic", "topic": "x", "queues": 2, "hosted": [2]}, Code.MALFORMED),
        ({"op": "create_topic", "topic": "x", "queues": 2, "hosted": [0, 0]}, Code.MALFORMED),
        ({"op": "create_topic", "topic": "x", "queues": 2, "hosted": []}, Code.MALFORMED),
        ({"op": "create_topic", "topic": "x", "queues": 2, "hosted": "0"}, Code.MALFORMED),
        ({"op": "create_topic", "topic": "x", "queues": 2}, Code.MALFORMED),
        ({"op": "delete_topic", "topic": "nope"}, Code.UNKNOWN_TOPIC),
        ({"op": "delete_topic"}, Code.MALFORMED),
        ({"op": "offsets", "cg": "bad cg", "offsets": []}, Code.INVALID_NAME),
        ({"op": "offsets", "cg": "cg", "offsets": [["t", 0]]}, Code.MALFORMED),
        ({"op": "offsets", "cg": "cg", "offsets": [["t", 0, 1], ["t", 0, -1]]}, Code.MALFORMED),
        ({"op": "offsets", "cg": "cg", "offsets": [["t", 0, 1], [1, 0, 1]]}, Code.MALFORMED),
        ({"op": "offsets", "cg": "cg", "offsets": {"t": 1}}, Code.MALFORMED),
        ({"op": "offsets", "cg": "cg", "offsets": [["t", 0, 1], None]}, Code.MALFORMED),
        ({"op": "retain", "min_index": -1}, Code.MALFORMED),
        ({"op": "retain", "min_index": "3"}, Code.MALFORMED),
        ({"op": "frobnicate"}, Code.MALFORMED),
        ({}, Code.MALFORMED),
        ([1, 2], Code.MALFORMED),
        ({1: 2}, Code.MALFORMED),
        ("create_topic", Code.MALFORMED),
    ],
)
def test_bad_control_entries_are_refused_without_change(obj: Any, code: Code) -> None:
    r = assert_no_change(with_topic, msgpack.packb(obj, use_bin_type=True), EntryType.CONTROL)
    assert isinstance(r, ErrorResult) and r.code == code


@pytest.mark.parametrize("bad", [b"", b"\xc1", b"\x81", b"\x80\x00", b"\xff" * 5])
def test_undecodable_control_entries_are_malformed(bad: bytes) -> None:
    r = assert_no_change(with_topic, bad, EntryType.CONTROL)
    assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED


def test_consumer_offsets_last_write_wins_and_unknown_queues_are_skipped() -> None:
    f = with_topic("t", 4, (0, 1))
    r = f.control(control_offsets("cg", [("t", 0, 5), ("t", 1, 7), ("t", 3, 1), ("x", 0, 1)]))
    assert r == ControlResult("offsets", 2, 2)
    assert f.control(control_offsets("cg", [("t", 0, 3)])) == ControlResult("offsets", 1, 0)
    f.control(control_offsets("other", [("t", 0, 9)]))
    assert f.state.consumer_offset("cg", "t", 0) == 3
    assert f.state.consumer_offset("cg", "t", 1) == 7
    assert f.state.consumer_offset("cg", "t", 3) is None
    assert f.state.consumer_offsets("cg") == {("cg", "t", 0): 3, ("cg", "t", 1): 7}
    assert len(f.state.consumer_offsets()) == 3


def test_delete_topic_forgets_queues_offsets_keys_and_producers() -> None:
    f = with_topic("t", 2, (0, 1))
    f.control(control_create_topic("u", 1, [0]))
    f.produce("t", 0, 3, key="k", pid=4, seq=10)
    f.produce("u", 0, 1, key="k")
    f.control(control_offsets("cg", [("t", 0, 3), ("u", 0, 1)]))
    assert f.control(control_delete_topic("t")) == ControlResult("delete_topic", 1)
    assert "t" not in f.state.topics()
    assert f.state.consumer_offsets() == {("cg", "u", 0): 1}
    assert f.state.keys("u", "k") == [(0, 0)]
    with pytest.raises(RequestError) as e:
        f.state.keys("t", "k")
    assert e.value.code == Code.UNKNOWN_TOPIC
    f.control(control_create_topic("t", 1, [0]))
    assert f.state.queue_range("t", 0) == (0, 0)
    assert f.state.keys("t", "k") == []
    # The producer's sequence history went with the topic.
    assert f.produce("t", 0, pid=4, seq=0) == ProduceResult(0, 1, f.index, False)


# ---------------------------------------------------------------------- retention


def test_retention_moves_the_minimum_and_reads_below_it_fail() -> None:
    f = with_topic("t", 2, (0, 1))
    for _ in range(3):  # indexes 2..7, alternating queues
        f.produce("t", 0, 2, key="a")
        f.produce("t", 1, 1, key="a")
    r = f.control(Retain(4).encode())  # drops index 2 (q0: 2 msgs) and 3 (q1: 1 msg)
    assert r == ControlResult("retain", 3)
    assert f.state.retained_index == 4
    assert f.state.queue_range("t", 0) == (2, 6)
    assert f.state.queue_range("t", 1) == (1, 3)
    for call in (
        lambda: f.state.lookup("t", 0, 1, 10, 1000),
        lambda: f.state.entry_of("t", 0, 0),
    ):
        with pytest.raises(RequestError) as e:
            call()
        assert e.value.code == Code.OFFSET_TOO_SMALL
    entries, nxt = f.state.lookup("t", 0, 2, 10, 1 << 20)
    assert [e.offset for e in entries] == [2, 3, 4, 5] and entries[0].index == 4
    assert f.state.keys("t", "a") == [(0, 2), (0, 3), (1, 1), (0, 4), (0, 5), (1, 2)]
    # Going back is a no-op; retaining past everything empties the queues, offsets continue.
    assert f.control(Retain(2).encode()) == ControlResult("retain", 0)
    assert f.state.queue_range("t", 0) == (2, 6)
    f.control(Retain(100).encode())
    assert f.state.queue_range("t", 0) == (6, 6)
    assert f.state.keys("t", "a") == []
    assert f.produce("t", 0) == ProduceResult(6, 1, f.index, False)
    assert f.state.lookup("t", 0, 6, 10, 100)[0][0].offset == 6


def test_retention_forgets_producers_idle_since_before_the_horizon() -> None:
    f = with_topic("t", 1, (0,))
    f.produce("t", 0, pid=1, seq=0)  # index 2
    f.produce("t", 0, pid=2, seq=0)  # index 3
    f.control(Retain(3).encode())
    assert f.produce("t", 0, pid=1, seq=0) == ProduceResult(2, 1, 5, False)  # forgotten
    assert f.produce("t", 0, pid=2, seq=0) == ProduceResult(1, 1, 3, True)  # remembered


# ---------------------------------------------------------------------- reads


def test_lookup_bounds() -> None:
    f = with_topic("t", 1, (0,))
    for i in range(10):
        f.produce("t", 0, body=b"x" * (10 * (i + 1)))
    st_ = f.state
    sizes = [e.size for e in st_.lookup("t", 0, 0, 100, 1 << 20)[0]]
    assert len(sizes) == 10
    entries, nxt = st_.lookup("t", 0, 0, 3, 1 << 20)
    assert [e.offset for e in entries] == [0, 1, 2] and nxt == 3
    entries, nxt = st_.lookup("t", 0, 2, 100, sizes[2] + sizes[3] + sizes[4] - 1)
    assert [e.offset for e in entries] == [2, 3] and nxt == 4
    entries, nxt = st_.lookup("t", 0, 9, 100, 1)  # one oversized entry still comes back
    assert [e.offset for e in entries] == [9] and nxt == 10
    assert st_.lookup("t", 0, 10, 5, 100) == ([], 10)
    with pytest.raises(RequestError) as e:
        st_.lookup("t", 0, 11, 5, 100)
    assert e.value.code == Code.OFFSET_TOO_LARGE
    with pytest.raises(RequestError) as e:
        st_.entry_of("t", 0, 10)
    assert e.value.code == Code.OFFSET_TOO_LARGE
    with pytest.raises(RequestError) as e:
        st_.lookup("t", 0, 0, 0, 100)
    assert e.value.code == Code.MALFORMED


def test_tag_filtering_skips_other_tags_within_a_scan_bound() -> None:
    f = with_topic("t", 1, (0,))
    for i in range(30):
        f.produce("t", 0, tags="A" if i % 3 == 0 else "B")
    a, b = tag_hash("A"), tag_hash("B")
    entries, nxt = f.state.lookup("t", 0, 0, 4, 1 << 20, {a})
    assert [e.offset for e in entries] == [0, 3, 6, 9] and nxt == 10
    assert all(e.tag_hash == a for e in entries)
    entries, nxt = f.state.lookup("t", 0, 1, 100, 1 << 20, {a, b})
    assert len(entries) == 29 and nxt == 30
    entries, nxt = f.state.lookup("t", 0, 0, 100, 1 << 20, None)
    assert len(entries) == 30
    entries, nxt = f.state.lookup("t", 0, 0, 100, 1 << 20, {tag_hash("C")})
    assert entries == [] and nxt == 30
    cq = ConsumeQueue()
    for i in range(5000):
        cq.append(i + 1, 8, 10, b if i < 4000 else a, 0)
    entries, nxt = cq.read(0, 1, 1 << 20, {a})  # scans at most max(10, 1000)
    assert entries == [] and nxt == 1000
    entries, nxt = cq.read(3990, 2, 1 << 20, {a}, max_scan=50)
    assert [e.offset for e in entries] == [4000, 4001] and nxt == 4002


def test_key_index_keeps_the_newest_per_key() -> None:
    f = with_topic("t", 2, (0, 1))
    f.produce("t", 0, 2, key="order-1")
    f.produce("t", 1, 1, key="order-1")
    f.produce("t", 1, 1, key="order-2")
    f.produce("t", 1, 1)
    assert f.state.keys("t", "order-1") == [(0, 0), (0, 1), (1, 0)]
    assert f.state.keys("t", "order-2") == [(1, 1)]
    assert f.state.keys("t", "none") == []
    f.produce("t", 0, KEY_HISTORY + 5, key="hot")
    hot = f.state.keys("t", "hot")
    assert len(hot) == KEY_HISTORY and hot[0] == (0, 7) and hot[-1] == (0, KEY_HISTORY + 6)


def test_message_ids_resolve_through_locate() -> None:
    f = with_topic("t", 1, (0,))
    f.produce("t", 0, 3)
    f.produce("t", 0, 2)  # index 3: offsets 3, 4
    starts = {(e.index, e.start): e.offset for e in f.state.lookup("t", 0, 0, 10, 1 << 20)[0]}
    assert len(starts) == 5
    for (index, start), offset in starts.items():
        assert f.state.locate("t", 0, index, start) == offset
    second = sorted(s for i, s in starts if i == 3)[1]
    for index, start in ((3, second + 1), (3, second - 1), (4, second), (9, 0), (1, 0),
                         (3, -1)):
        with pytest.raises(RequestError) as e:
            f.state.locate("t", 0, index, start)
        assert e.value.code == Code.NOT_FOUND
    assert f.state.entry_of("t", 0, 4).index == 3


def test_replayed_entries_are_ignored() -> None:
    f = with_topic("t", 1, (0,))
    f.produce("t", 0)
    before = f.state.snapshot()
    batch = STORED_PREFIX.pack(1) + encode_batch("t", 0, [OutgoingMessage(b"x")])
    assert f.state.apply(Entry(2, 1, EntryType.MESSAGES, batch)) is None
    assert f.state.snapshot() == before


# ---------------------------------------------------------------------- consume queue


def test_consume_queue_is_compact_and_searchable() -> None:
    cq = ConsumeQueue()
    for i in range(1000):
        assert cq.append(10 + i // 4, i, 1, 0, 0) == i
    assert len(cq.records()) == 1000 * CQ_RECORD.size == 28_000
    assert cq.first_offset_at_or_after_index(0) == 0
    assert cq.first_offset_at_or_after_index(11) == 4
    assert cq.first_offset_at_or_after_index(10 + 999 // 4 + 1) == 1000
    assert cq.drop_before(402) == 402
    assert (cq.min_offset, cq.end_offset, len(cq)) == (402, 1000, 598)
    assert cq.first_offset_at_or_after_index(11) == 402
    assert cq.first_offset_at_or_after_index(111) == 404
    assert cq.drop_before(100) == 0 and cq.min_offset == 402
    assert cq.get(402).start == 402
    copy = ConsumeQueue(cq.min_offset, cq.records())
    assert copy.get(999) == cq.get(999)
    assert cq.drop_before(5000) == 598 and cq.min_offset == cq.end_offset == 1000
    with pytest.raises(ValueError):
        ConsumeQueue(0, b"\x00" * 27)


def test_a_retried_offset_commit_never_rolls_back_a_later_one() -> None:
    """The chaos-found bug: commit(710) by one client is committed by a new leader, another
    client commits 716, then the first client's retry of 710 arrives. It must change
    nothing and answer as the first copy did."""
    f = with_topic("t", 1, (0,))
    first = f.control(control_offsets("cg", [("t", 0, 710)], req=(4, 1)))
    assert first == ControlResult("offsets", 1, 0)
    assert f.control(control_offsets("cg", [("t", 0, 716)], req=(3, 1))) == first
    retry = f.control(control_offsets("cg", [("t", 0, 710)], req=(4, 1)))
    assert retry == ControlResult("offsets", 1, 0, dup=True)
    assert f.state.consumer_offset("cg", "t", 0) == 716
    # the same client's next request is new, and a commit without an id always applies
    f.control(control_offsets("cg", [("t", 0, 720)], req=(4, 2)))
    assert f.state.consumer_offset("cg", "t", 0) == 720
    f.control(control_offsets("cg", [("t", 0, 1)]))
    assert f.state.consumer_offset("cg", "t", 0) == 1


def test_request_ids_survive_snapshots_and_old_snapshots_restore() -> None:
    f = with_topic("t", 1, (0,))
    f.control(control_offsets("cg", [("t", 0, 5)], req=(9, 1)))
    restored = Feed(BrokerState.restore("g1", f.state.snapshot()))
    restored.control(control_offsets("cg", [("t", 0, 6)], req=(8, 1)))
    assert restored.control(control_offsets("cg", [("t", 0, 5)], req=(9, 1))).dup  # type: ignore[union-attr]
    assert restored.state.consumer_offset("cg", "t", 0) == 6
    # a version 1 snapshot (before request ids) still restores, with no clients known
    old = legacy_snapshot(f.state.snapshot())
    old["v"] = 1
    del old["clients"]
    legacy = BrokerState.restore("g1", msgpack.packb(old, use_bin_type=True))
    assert legacy.consumer_offset("cg", "t", 0) == 5


def test_requests_older_than_the_window_are_refused_not_reapplied() -> None:
    f = with_topic("t", 1, (0,))
    for seq in range(1, REQUEST_WINDOW + 2):
        f.control(control_offsets("cg", [("t", 0, seq)], req=(1, seq)))
    r = f.control(control_offsets("cg", [("t", 0, 1)], req=(1, 1)))  # forgotten by now
    assert isinstance(r, ErrorResult) and r.code == Code.STALE_REQUEST
    assert f.state.consumer_offset("cg", "t", 0) == REQUEST_WINDOW + 1
    stale = control_offsets("cg", [("t", 0, 1)], req=(1, 1))

    def full() -> Feed:
        g = with_topic("t", 1, (0,))
        for seq in range(1, REQUEST_WINDOW + 2):
            g.control(control_offsets("cg", [("t", 0, seq)], req=(1, seq)))
        return g

    assert_no_change(full, stale, EntryType.CONTROL)
    # still remembered: answered as a duplicate
    r = f.control(control_offsets("cg", [("t", 0, 3)], req=(1, REQUEST_WINDOW)))
    assert isinstance(r, ControlResult) and r.dup


def test_a_refused_request_changes_nothing_so_its_retry_can_apply() -> None:
    bad = msgpack.packb({"op": "offsets", "cg": "bad name!", "offsets": [], "req": [5, 1]})
    r = assert_no_change(lambda: with_topic("t", 1, (0,)), bad, EntryType.CONTROL)
    assert isinstance(r, ErrorResult)
    f = with_topic("t", 1, (0,))
    f.control(bad)
    ok = f.control(control_offsets("cg", [("t", 0, 2)], req=(5, 1)))
    assert ok == ControlResult("offsets", 1, 0)


@pytest.mark.parametrize("req", [[0, 1], [1, -1], [1], "x", [1, 2, 3], [True, 1], [1, "2"], [-3, 1]])
def test_malformed_request_ids_are_refused(req: Any) -> None:
    r = assert_no_change(
        lambda: with_topic("t", 1, (0,)),
        msgpack.packb({"op": "offsets", "cg": "cg", "offsets": [["t", 0, 1]], "req": req}),
        EntryType.CONTROL,
    )
    assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED


def test_clients_are_forgotten_past_retention_and_beyond_the_cap(monkeypatch) -> None:
    f = with_topic("t", 1, (0,))
    f.control(control_offsets("cg", [("t", 0, 1)], req=(1, 1)))
    f.control(Retain(f.index + 1).encode())  # client 1 silent since before the horizon
    assert f.control(control_offsets("cg", [("t", 0, 2)], req=(1, 1))) == ControlResult(
        "offsets", 1, 0)
    monkeypatch.setattr("broker.state.parts.requests.MAX_CLIENTS", 2)
    for cid in (2, 3):
        f.control(control_offsets("cg", [("t", 0, cid)], req=(cid, 1)))
    # client 1 was the least recently seen of three: forgotten, so its request applies again
    assert not f.control(control_offsets("cg", [("t", 0, 9)], req=(1, 1))).dup  # type: ignore[union-attr]
    assert f.control(control_offsets("cg", [("t", 0, 9)], req=(3, 1))).dup  # type: ignore[union-attr]
    assert MAX_CLIENTS > 1000


# ---------------------------------------------------------------------- snapshots


def test_snapshot_round_trip_and_group_check() -> None:
    f = with_topic("t", 2, (0, 1))
    f.produce("t", 0, 3, key="k", tags="a", pid=5, seq=0)
    f.control(control_offsets("cg", [("t", 0, 2)]))
    f.control(Retain(3).encode())
    snap = f.state.snapshot()
    r = BrokerState.restore("g1", snap)
    assert r.snapshot() == snap
    assert r.applied_index == f.state.applied_index and r.retained_index == 3
    assert r.topics() == f.state.topics()
    assert r.messages_applied == 3 and r.bytes_applied == f.state.bytes_applied
    with pytest.raises(ValueError):
        BrokerState.restore("g2", snap)
    for bad in (b"", b"\x80", msgpack.packb({"v": 99}), snap[:-3]):
        with pytest.raises(ValueError):
            BrokerState.restore("g1", bad)


TOPICS = ["a", "b", "zz"]


def _raw(**fields: Any) -> bytes:
    """A CONTROL entry's map packed as is: the ops below may carry fields apply must
    refuse, which a record (or its encoder) would not even let be made."""
    data: bytes = msgpack.packb(fields, use_bin_type=True)
    return data


def _op_entry(op: tuple[Any, ...]) -> tuple[EntryType, bytes]:
    kind = op[0]
    if kind == "create":
        _, topic, total, hosted = op
        return EntryType.CONTROL, _raw(op="create_topic", topic=topic, queues=total,
                                       hosted=sorted(hosted))
    if kind == "delete":
        return EntryType.CONTROL, _raw(op="delete_topic", topic=op[1])
    if kind == "produce":
        _, topic, queue, n, pid, seq, key, tags, store_ms = op
        msgs = [OutgoingMessage(b"v" * i, key=key, tags=tags) for i in range(n)]
        batch = encode_batch(topic, queue, msgs, pid=pid, seq=seq)
        return EntryType.MESSAGES, STORED_PREFIX.pack(store_ms) + batch
    if kind == "offsets":
        entry = {"op": "offsets", "cg": op[1], "offsets": [[t, q, o] for t, q, o in op[2]]}
        if op[3] is not None:
            entry["req"] = list(op[3])
        return EntryType.CONTROL, _raw(**entry)
    if kind == "retain":
        return EntryType.CONTROL, _raw(op="retain", min_index=op[1])
    if kind == "garbage":
        return op[1], op[2]
    return EntryType.NOOP, b""


_produce = st.tuples(
    st.just("produce"),
    st.sampled_from(TOPICS),
    st.integers(0, 2),
    st.integers(1, 3),
    st.sampled_from([0, 1, 1, 2]),
    st.sampled_from([-1, 0, 0, 1, 1, 2, 3]),
    st.sampled_from(["", "k1", "k2"]),
    st.sampled_from(["", "A", "B"]),
    st.integers(0, 2**40),
)
ops = st.one_of(
    _produce,
    _produce,
    _produce,
    st.tuples(
        st.just("create"),
        st.sampled_from(TOPICS),
        st.integers(1, 3),
        st.sampled_from([[0], [1], [0, 1], [0, 1, 2], [2]]),
    ),
    st.tuples(st.just("delete"), st.sampled_from(TOPICS)),
    st.tuples(
        st.just("offsets"),
        st.sampled_from(["cg1", "cg2", "bad cg"]),
        st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 3), st.integers(0, 20)),
                 max_size=3),
        st.sampled_from([None, (1, 1), (1, 2), (2, 1)]),  # retries share a request id
    ),
    st.tuples(st.just("retain"), st.integers(0, 40)),
    st.tuples(
        st.just("garbage"),
        st.sampled_from([EntryType.MESSAGES, EntryType.CONTROL, EntryType.CONFIG]),
        st.binary(max_size=40),
    ),
    st.tuples(st.just("noop")),
)
# Most histories start with topics in place, so produces mostly land.
PRELUDE = [("create", "a", 2, [0, 1]), ("create", "b", 1, [0])]


def _run(state: BrokerState, entries: list[tuple[EntryType, bytes]], start: int) -> list[Any]:
    return [state.apply(Entry(start + i, 1, t, d)) for i, (t, d) in enumerate(entries)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=40), st.data())
def test_replicas_agree_and_snapshots_resume_exactly(
    op_list: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    entries = [_op_entry(op) for op in PRELUDE + op_list]
    a, b = BrokerState("g"), BrokerState("g")
    ra, rb = _run(a, entries, 1), _run(b, entries, 1)
    assert ra == rb
    final = a.snapshot()
    assert final == b.snapshot()
    assert BrokerState.restore("g", final).snapshot() == final

    cut = data.draw(st.integers(0, len(entries)), label="cut")
    first = BrokerState("g")
    _run(first, entries[:cut], 1)
    resumed = BrokerState.restore("g", first.snapshot())
    assert _run(resumed, entries[cut:], cut + 1) == ra[cut:]
    assert resumed.snapshot() == final
    # the same state written by the release before parts (version 2) resumes the same way
    legacy = BrokerState.restore("g", msgpack.packb(legacy_snapshot(first.snapshot()),
                                                    use_bin_type=True))
    assert _run(legacy, entries[cut:], cut + 1) == ra[cut:]
    assert legacy.snapshot() == final

    # Every queue's invariants hold after any history.
    for (topic, config) in a.topics().items():
        for q in config.hosted:
            lo, end = a.queue_range(topic, q)
            assert 0 <= lo <= end
            entries_, nxt = a.lookup(topic, q, lo, 1000, 1 << 30)
            assert [e.offset for e in entries_] == list(range(lo, end)) and nxt == end


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([EntryType.MESSAGES, EntryType.CONTROL]), st.binary(max_size=200))
def test_apply_is_total_on_arbitrary_bytes(type_: EntryType, data: bytes) -> None:
    f = with_topic("t", 1, (0,))
    r = f.entry(type_, data)
    assert r is None or isinstance(r, ErrorResult | ProduceResult | ControlResult)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_apply_is_total_on_corrupted_batches(data: st.DataObject) -> None:
    batch = STORED_PREFIX.pack(1) + encode_batch(
        "t", 0, [OutgoingMessage(b"body", key="k", tags="A", properties={"p": "q"})] * 2,
        pid=3, seq=0,
    )
    raw = bytearray(batch)
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        pos = data.draw(st.integers(0, len(raw) - 1), label="pos")
        raw[pos] = data.draw(st.integers(0, 255), label="byte")
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    f = with_topic("t", 1, (0,))
    r = f.entry(EntryType.MESSAGES, bytes(raw[:cut]))
    assert r is None or isinstance(r, ErrorResult | ProduceResult)
    lo, end = f.state.queue_range("t", 0)
    assert f.state.lookup("t", 0, lo, 10, 1 << 20)[1] == end
