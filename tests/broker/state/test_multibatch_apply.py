"""MESSAGES entries holding several batches: how the state machine applies them.

One PRODUCE request for many queues becomes one entry, its batches back to back behind
the store timestamp. Each batch lands in its own queue, is deduplicated on its own and
refused on its own; message ids (entry index, record start) keep resolving; an entry
whose batches cannot be told apart changes nothing; and every replica, fed the same
entries with or without the leader's walk, ends with the same bytes.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.state.statemachine import (
    BatchOutcomes,
    BrokerState,
    ErrorResult,
    ProduceResult,
    control_create_topic,
    control_delete_topic,
)
from raftlog.types import Entry, EntryType
from wire.protocol import Code, RequestError
from wire.records import (
    STORED_PREFIX,
    EncodedBatch,
    OutgoingMessage,
    WalkedEntry,
    decode_record,
    encode_batch,
    walk_entry,
)


def _state() -> BrokerState:
    s = BrokerState("g")
    s.apply(Entry(1, 1, EntryType.CONTROL, control_create_topic("t", 3, [0, 1, 2])))
    s.apply(Entry(2, 1, EntryType.CONTROL, control_create_topic("u", 1, [0])))
    return s


def _entry(index: int, *batches: bytes, store_ms: int = 1000) -> Entry:
    return Entry(index, 1, EntryType.MESSAGES, STORED_PREFIX.pack(store_ms) + b"".join(batches))


def _shifts(*batches: bytes) -> list[int]:
    """Where each batch sits in its entry beyond the first batch's place."""
    out, pos = [], 0
    for b in batches:
        out.append(pos)
        pos += len(b)
    return out


def _read(s: BrokerState, data: bytes, topic: str, queue: int,
          count: int = 100) -> list[tuple[bytes, str]]:
    """(body, key) of the first `count` messages of a queue, read through its
    ConsumeQueue records from `data`, the one entry they all come from."""
    found, _ = s.lookup(topic, queue, 0, count, 1 << 20)
    out = []
    for e in found:
        msg, _ = decode_record(data, e.start, topic=topic, queue=queue, offset=e.offset,
                               store_ms=e.store_ms, msg_id="")
        out.append((msg.body, msg.key))
    return out


def test_each_batch_of_an_entry_lands_in_its_own_queue_with_ids_that_resolve() -> None:
    s = _state()
    batches = [
        encode_batch("t", 0, [OutgoingMessage(b"a0", key="k1"), OutgoingMessage(b"a1")]),
        encode_batch("u", 0, [b"b0"]),
        encode_batch("t", 2, [OutgoingMessage(b"c0", key="k1", tags="T")]),
        encode_batch("t", 0, [b"d0", b"d1", b"d2"]),  # the same queue again, later
    ]
    entry = _entry(3, *batches)
    r = s.apply(entry)
    assert isinstance(r, BatchOutcomes)
    assert r.results == (ProduceResult(0, 2, 3), ProduceResult(0, 1, 3), ProduceResult(0, 1, 3),
                         ProduceResult(2, 3, 3))
    assert [x.shift for x in r.results if isinstance(x, ProduceResult)] == _shifts(*batches)
    data = bytes(entry.data)
    assert _read(s, data, "t", 0) == [(b"a0", "k1"), (b"a1", ""), (b"d0", ""), (b"d1", ""),
                                      (b"d2", "")]
    assert _read(s, data, "u", 0) == [(b"b0", "")]
    assert _read(s, data, "t", 2) == [(b"c0", "k1")]
    assert s.keys("t", "k1") == [(0, 0), (2, 0)]
    assert s.messages_applied == 7
    # a message id is the entry index and the record's start: what a client computes from
    # its batch's own layout plus the shift its outcome gave
    for batch, result in zip(batches, r.results, strict=True):
        assert isinstance(batch, EncodedBatch) and isinstance(result, ProduceResult)
        header = walk_entry(STORED_PREFIX.pack(0) + batch)[0][0]
        for i, start in enumerate(batch.starts):
            offset = s.locate(header.topic, header.queue, 3, start + result.shift)
            assert offset == result.base_offset + i
            e = s.entry_of(header.topic, header.queue, offset)
            assert (e.index, e.start) == (3, start + result.shift)
    with pytest.raises(RequestError) as info:  # a start inside a record is no message
        s.locate("t", 0, 3, batches[0].starts[1] + 1)
    assert info.value.code == Code.NOT_FOUND


def test_a_refused_batch_is_refused_alone_and_the_others_are_stored() -> None:
    s = _state()
    batches = [
        encode_batch("t", 0, [b"ok-1"], pid=9, seq=0),
        encode_batch("t", 0, [b"gap"], pid=9, seq=5),  # sequences 1..4 never came
        encode_batch("t", 7, [b"no such queue"]),
        encode_batch("gone", 0, [b"no such topic"]),
        encode_batch("t", 0, [b"ok-2"], pid=9, seq=1),
    ]
    r = s.apply(_entry(3, *batches))
    assert isinstance(r, BatchOutcomes)
    codes = [x.code if isinstance(x, ErrorResult) else None for x in r.results]
    assert codes == [None, Code.SEQUENCE_GAP, Code.UNKNOWN_QUEUE, Code.UNKNOWN_TOPIC, None]
    assert r.results[0] == ProduceResult(0, 1, 3) and r.results[4] == ProduceResult(1, 1, 3)
    assert s.queue_range("t", 0) == (0, 2)


def test_a_topic_deleted_before_the_entry_applies_refuses_only_its_batches() -> None:
    s = _state()
    s.apply(Entry(3, 1, EntryType.CONTROL, control_delete_topic("u")))
    r = s.apply(_entry(4, encode_batch("u", 0, [b"x"]), encode_batch("t", 1, [b"y"])))
    assert isinstance(r, BatchOutcomes)
    assert isinstance(r.results[0], ErrorResult) and r.results[0].code == Code.UNKNOWN_TOPIC
    assert r.results[1] == ProduceResult(0, 1, 4)


def test_a_duplicate_inside_a_multi_batch_entry_is_skipped_alone_and_answered_as_one() -> None:
    s = _state()
    first = [encode_batch("u", 0, [b"other"]), encode_batch("t", 1, [b"x", b"y"], pid=4, seq=0)]
    r1 = s.apply(_entry(3, *first))
    assert isinstance(r1, BatchOutcomes)
    original = r1.results[1]
    assert isinstance(original, ProduceResult) and original.shift == len(first[0])
    # the retry travels with new batches; the repeat inside the same entry is a duplicate too
    again = [
        encode_batch("t", 2, [b"new"]),
        first[1],  # the retry, at another place in another entry
        encode_batch("t", 1, [b"z"], pid=4, seq=1),  # the next batch of that queue
        encode_batch("t", 1, [b"z"], pid=4, seq=1),  # and its repeat in the same entry
    ]
    r2 = s.apply(_entry(4, *again))
    assert isinstance(r2, BatchOutcomes)
    assert r2.results[0] == ProduceResult(0, 1, 4)
    dup = r2.results[1]
    assert dup == ProduceResult(0, 2, 3, dup=True)
    assert isinstance(dup, ProduceResult) and dup.shift == original.shift  # the first copy's ids
    assert r2.results[2] == ProduceResult(2, 1, 4)
    assert r2.results[3] == ProduceResult(2, 1, 4, dup=True)
    assert s.queue_range("t", 1) == (0, 3)
    data3 = bytes(_entry(3, *first).data)
    assert [b for b, _ in _read(s, data3, "t", 1, count=2)] == [b"x", b"y"]
    # what is remembered survives a snapshot, shift included
    restored = BrokerState.restore("g", s.snapshot())
    r3 = restored.apply(_entry(5, first[1]))
    assert r3 == dup and isinstance(r3, ProduceResult) and r3.shift == original.shift


@pytest.mark.parametrize("tail", [
    b"\x00",  # a byte after the last batch
    b"RB\x01\x00\x00",  # a batch prefix cut short
    encode_batch("t", 1, [b"whole"])[:-1],  # a batch cut short
])
def test_an_entry_whose_batches_cannot_be_told_apart_changes_nothing(tail: bytes) -> None:
    good = encode_batch("t", 0, [b"fine"])
    a, b = _state(), _state()
    r = a.apply(_entry(3, good, encode_batch("u", 0, [b"also fine"]), tail))
    b.apply(Entry(3, 1, EntryType.NOOP, b""))
    assert isinstance(r, ErrorResult) and r.code == Code.MALFORMED
    assert a.snapshot() == b.snapshot()


def test_an_entry_of_one_batch_is_applied_as_before() -> None:
    """Entries written before several batches shared one: a single batch, its own result."""
    s = _state()
    r = s.apply(_entry(3, encode_batch("t", 0, [b"old"], pid=3, seq=0)))
    assert r == ProduceResult(0, 1, 3) and isinstance(r, ProduceResult) and r.shift == 0


def _mixed_entries() -> list[Entry]:
    return [
        _entry(3, encode_batch("t", 0, [b"a"], pid=1, seq=0), encode_batch("t", 1, [b"b"])),
        _entry(4, encode_batch("t", 0, [OutgoingMessage(b"c", key="k")], pid=1, seq=1)),
        _entry(5, encode_batch("u", 0, [b"d"]), encode_batch("t", 0, [b"c"], pid=1, seq=1),
               encode_batch("t", 2, [b"e", b"f"], pid=2, seq=0)),
    ]


def _leader_walk(entry: Entry, s: BrokerState) -> WalkedEntry:
    return WalkedEntry(walk_entry(entry.data, s.max_message_bytes), s.max_message_bytes)


def test_replicas_with_and_without_the_leaders_walk_stay_byte_identical() -> None:
    leader, follower = _state(), _state()
    results: list[tuple[Any, Any]] = []
    for e in _mixed_entries():
        results.append((leader.apply(e, _leader_walk(e, leader)), follower.apply(e)))
    assert [a for a, _ in results] == [b for _, b in results]
    assert leader.snapshot() == follower.snapshot()
    # a replica restored half way and fed the rest agrees too
    half = _state()
    entries = _mixed_entries()
    half.apply(entries[0])
    restored = BrokerState.restore("g", half.snapshot())
    for e in entries[1:]:
        restored.apply(e)
    assert restored.snapshot() == leader.snapshot()


def test_a_stale_walk_from_another_size_limit_is_not_used() -> None:
    s = _state()
    e = _entry(3, encode_batch("t", 0, [b"a"]), encode_batch("t", 1, [b"b"]))
    other = _entry(3, encode_batch("t", 2, [b"a"]), encode_batch("u", 0, [b"b"]))
    stale = WalkedEntry(walk_entry(other.data), s.max_message_bytes - 1)  # says t/2 and u/0
    r = s.apply(e, stale)
    assert isinstance(r, BatchOutcomes)
    assert s.queue_range("t", 0) == (0, 1) and s.queue_range("t", 1) == (0, 1)
    assert s.queue_range("t", 2) == (0, 0)
