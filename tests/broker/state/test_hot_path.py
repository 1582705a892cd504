"""The per-entry shortcuts of the produce/apply path keep every outcome unchanged."""

from __future__ import annotations

import pytest

from broker.runtime.metrics import NodeMetrics
from broker.state.statemachine import BrokerState, ProduceResult, control_create_topic
from raftlog.commitlog import CommitLog, EntryDraft, encode_entry
from raftlog.runtime import _GuardedLog
from raftlog.types import Entry, EntryType, EntryUnreadable, Message, MsgType
from raftlog.wire import WireError, message_from_wire, message_to_wire
from wire.records import (
    STORED_PREFIX,
    OutgoingMessage,
    WalkedBatch,
    encode_batch,
    walk_batch,
)


def _state() -> BrokerState:
    s = BrokerState("g")
    s.apply(Entry(1, 1, EntryType.CONTROL, control_create_topic("t", 2, [0, 1])))
    return s


def _data(queue: int = 0, body: bytes = b"hello", store_ms: int = 7) -> bytes:
    return STORED_PREFIX.pack(store_ms) + encode_batch("t", queue, [OutgoingMessage(body, key="k")])


def test_a_walk_handed_back_with_the_entry_applies_exactly_like_a_fresh_walk() -> None:
    a, b = _state(), _state()
    data = _data()
    header, refs = walk_batch(data, STORED_PREFIX.size, a.max_message_bytes)
    ra = a.apply(Entry(2, 1, EntryType.MESSAGES, data), WalkedBatch(header, refs, a.max_message_bytes))
    rb = b.apply(Entry(2, 1, EntryType.MESSAGES, data))
    assert ra == rb == ProduceResult(0, 1, 2)
    assert a.snapshot() == b.snapshot()


def test_a_walk_made_under_another_size_limit_is_not_used() -> None:
    s = _state()
    other = _data(queue=1)
    header, refs = walk_batch(other, STORED_PREFIX.size, s.max_message_bytes)
    stale = WalkedBatch(header, refs, s.max_message_bytes - 1)  # says queue 1
    res = s.apply(Entry(2, 1, EntryType.MESSAGES, _data(queue=0)), stale)
    assert res == ProduceResult(0, 1, 2)  # queue 0, from its own walk, not the stale one
    assert s.queue_range("t", 0) == (0, 1) and s.queue_range("t", 1) == (0, 0)


def test_batch_headers_decoded_once_stay_correct() -> None:
    data = _data()
    h1, _ = walk_batch(data, STORED_PREFIX.size)
    h2, _ = walk_batch(_data(body=b"other"), STORED_PREFIX.size)
    assert h1 is h2  # same header bytes: decoded once
    h3, _ = walk_batch(_data(queue=1), STORED_PREFIX.size)
    assert (h3.topic, h3.queue) == ("t", 1)


def test_encode_batch_says_where_each_record_starts_in_the_stored_entry() -> None:
    msgs = [OutgoingMessage(b"a" * i, key="k" * i, properties={"p": "v"} if i % 2 else {})
            for i in range(1, 6)] + [b"bare"]
    batch = encode_batch("t", 0, msgs)
    _, refs = walk_batch(STORED_PREFIX.pack(1) + batch, STORED_PREFIX.size)
    assert batch.starts == tuple(r.start for r in refs)


def test_a_sealed_draft_is_the_entry_encoded_once() -> None:
    draft = EntryDraft.of(b"payload")
    entry = draft.seal(7, 3, EntryType.MESSAGES)
    plain = Entry(7, 3, EntryType.MESSAGES, b"payload")
    assert entry == plain and bytes(entry.frame or b"") == encode_entry(plain)
    assert encode_entry(entry) is entry.frame  # never encoded again
    with pytest.raises(TypeError):
        entry.frame[0] = 0  # type: ignore[index]  # sealed bytes are read-only


def test_the_wire_carries_the_sealed_frames_and_the_follower_stores_them(tmp_path) -> None:
    sealed = (
        EntryDraft.of(b"abc").seal(5, 2, EntryType.MESSAGES),
        EntryDraft.of(b"").seal(6, 2, EntryType.CONTROL),
    )
    m = Message(MsgType.APPEND, 1, 2, 2, log_index=4, log_term=2, entries=sealed[:1])
    _, body = message_to_wire(m)
    assert body is sealed[0].frame  # the leader's bytes as they are
    m = Message(MsgType.APPEND, 1, 2, 2, log_index=4, log_term=2, entries=sealed, commit=3)
    fields, body = message_to_wire(m)
    assert bytes(body) == b"".join(bytes(e.frame or b"") for e in sealed)
    received = message_from_wire(fields, bytes(body)).entries
    assert received == sealed and all(e.frame is not None for e in received)
    with CommitLog.open(tmp_path, segment_size=1 << 20) as log:
        log.reset_to(4, 2)
        log.append(received)
        assert bytes(log.read_raw(5, 7)) == bytes(body)
    flipped = bytearray(body)
    flipped[-40] ^= 1
    with pytest.raises(WireError):
        message_from_wire(fields, bytes(flipped))


def _entries(lo: int, hi: int, term: int, tag: bytes = b"") -> list[Entry]:
    return [Entry(i, term, EntryType.MESSAGES, b"e%d" % i + tag) for i in range(lo, hi)]


def test_the_guarded_log_serves_unapplied_entries_from_memory(tmp_path) -> None:
    log = CommitLog.open(tmp_path, segment_size=1 << 20)
    guard = _GuardedLog(log)
    first = _entries(1, 6, 1)
    log.store(first)
    guard.remember(first)
    got = guard.entries(1, 6, 1 << 20)
    assert got == first and all(a is b for a, b in zip(got, first, strict=True))
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
    log.close()


def test_the_guarded_log_reports_a_corrupt_entry_to_the_core(tmp_path) -> None:
    from tests.raftlog.test_commitlog import flip, locate

    log = CommitLog.open(tmp_path, segment_size=1 << 20)
    guard = _GuardedLog(log)
    ents = _entries(1, 6, 1)
    log.store(ents)
    log.sync()
    seg, off = locate(log, 4)
    flip(seg, off + 33)  # the first body byte of entry 4 (behind its 33-byte header)
    assert guard.entries(1, 6, 1 << 20) == ents[:3]  # the good prefix
    with pytest.raises(EntryUnreadable) as info:
        guard.entries(4, 6, 1 << 20)
    assert info.value.index == 4
    log.close()


def test_the_guarded_log_reads_back_what_did_not_fit(tmp_path, monkeypatch) -> None:
    import raftlog.runtime as runtime

    monkeypatch.setattr(runtime, "_RECENT_BYTES", 6)
    log = CommitLog.open(tmp_path, segment_size=1 << 20)
    guard = _GuardedLog(log)
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
    import wire.records as records

    batch = encode_batch("t", 0, [OutgoingMessage(b"x" * i) for i in range(n)])
    records._HEADERS.clear()
    cold = walk_batch(batch)
    warm = walk_batch(batch)
    assert cold == warm


class _Contexts:
    """A state machine that records the context each entry came back with."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, object]] = []

    def apply(self, entry: Entry, context: object = None) -> object:
        if entry.type == EntryType.MESSAGES:
            self.seen.append((bytes(entry.data), context))
        return context


def test_a_proposal_context_comes_back_at_apply_on_the_proposer_only(tmp_path) -> None:
    import trio

    from tests.runtime_harness import Group

    async def main() -> None:
        g = Group(tmp_path, _Contexts)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await g.start(n, i)
            leader = await g.leader()
            ctx = object()
            draft = leader.draft(3)
            draft.data[:] = b"abc"
            assert await leader.propose(draft, context=ctx) is ctx
            assert await leader.propose(b"plain") is None
            with trio.fail_after(5):
                while any(len(m.seen) < 2 for m in g.machines.values()):
                    await trio.sleep(0.01)
            for i, m in g.machines.items():
                want = ctx if g.runtimes[i] is leader else None
                assert m.seen == [(b"abc", want), (b"plain", None)]
            n.cancel_scope.cancel()

    trio.run(main)


def test_an_entry_body_is_crc_checked_once_by_the_leader_and_once_per_follower(
    tmp_path, monkeypatch
) -> None:
    """Issue 12 part 1: the leader seals, the wire and both disks reuse those bytes."""
    import crc32c

    real = crc32c.crc32c
    passes: list[int] = []

    def counting(data, value=0):  # type: ignore[no-untyped-def]
        if len(data) >= 1000:
            passes.append(len(data))
        return real(data, value)

    monkeypatch.setattr(crc32c, "crc32c", counting)
    with (
        CommitLog.open(tmp_path / "leader", segment_size=1 << 20) as leader,
        CommitLog.open(tmp_path / "follower", segment_size=1 << 20) as follower,
    ):
        entry = EntryDraft.of(b"x" * 1000).seal(1, 1, EntryType.MESSAGES)
        assert len(passes) == 1
        leader.append([entry])
        fields, body = message_to_wire(Message(MsgType.APPEND, 1, 2, 1, entries=(entry,)))
        assert len(passes) == 1
        received = message_from_wire(fields, bytes(body)).entries
        assert len(passes) == 2
        follower.append(received)
        assert len(passes) == 2
        assert bytes(follower.read_raw(1, 2, verify=False)) == bytes(leader.read_raw(1, 2))
