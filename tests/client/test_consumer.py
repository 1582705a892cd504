"""Consumer pure parts: queue allocation, the sliding offset window, FETCH decoding."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftmq.client.consumer import (
    OffsetWindow,
    PushConsumer,
    allocate_average,
    allocate_round_robin,
    decode_fetch,
)
from raftmq.client.producer import batch_message_ids
from wire.protocol import Code, RequestError
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch, walk_batch

STRATEGIES = [allocate_average, allocate_round_robin]


def clients_of(k: int) -> list[str]:
    return [f"host@{i}@c{i:03d}" for i in range(k)]


@pytest.mark.parametrize("allocate", STRATEGIES)
@given(n=st.integers(0, 70), k=st.integers(1, 25), seed=st.integers(0, 1000))
def test_every_queue_is_assigned_exactly_once_and_balanced(allocate, n, k, seed) -> None:
    queues = list(range(n))
    clients = clients_of(k)
    rng = random.Random(seed)
    # callers may pass queues and clients in any order: the result must not depend on it
    shuffled_q, shuffled_c = queues[:], clients[:]
    rng.shuffle(shuffled_q)
    rng.shuffle(shuffled_c)
    parts = {c: allocate(shuffled_q, shuffled_c, c) for c in clients}
    flat = [q for part in parts.values() for q in part]
    assert sorted(flat) == queues
    sizes = [len(p) for p in parts.values()]
    assert max(sizes) - min(sizes) <= 1
    for c in clients:
        assert parts[c] == allocate(queues, clients, c)


def test_average_gives_contiguous_blocks_like_rocketmq() -> None:
    clients = ["a", "b", "c"]
    assert [allocate_average(range(8), clients, c) for c in clients] == [
        [0, 1, 2], [3, 4, 5], [6, 7]
    ]
    assert [allocate_average(range(2), clients, c) for c in clients] == [[0], [1], []]


def test_round_robin_deals_queues_like_cards() -> None:
    clients = ["a", "b", "c"]
    assert [allocate_round_robin(range(8), clients, c) for c in clients] == [
        [0, 3, 6], [1, 4, 7], [2, 5]
    ]


@pytest.mark.parametrize("allocate", STRATEGIES)
def test_unknown_client_gets_nothing_and_tuples_work(allocate) -> None:
    queues = [("b", 1), ("a", 0), ("a", 1), ("b", 0)]
    assert allocate(queues, ["x", "y"], "z") == []
    got = allocate(queues, ["x", "y"], "x") + allocate(queues, ["x", "y"], "y")
    assert sorted(got) == sorted(queues)
    # duplicate client ids (a client listed by several nodes) count once
    assert allocate(queues, ["x", "x", "y"], "x") == allocate(queues, ["x", "y"], "x")


def test_offset_window_commits_lowest_unfinished() -> None:
    w = OffsetWindow(10)
    assert w.committable() == 10 and len(w) == 0
    for off in (10, 11, 12, 14):  # 13 was filtered out by tag
        w.add(off)
    w.advance(15)
    assert len(w) == 4
    w.done(12)
    w.done(14)
    assert w.committable() == 10
    w.done(10)
    assert w.committable() == 11
    w.done(11)
    assert w.committable() == 15 and len(w) == 0
    w.done(11)  # repeated and unknown completions are harmless
    w.done(99)
    assert w.committable() == 15
    w.advance(20)  # a fetch that returned only filtered messages
    assert w.committable() == 20
    with pytest.raises(ValueError):
        w.add(19)
    w.add(25)
    w.reset(40)
    assert w.committable() == 40 and len(w) == 0
    w.done(25)
    assert w.committable() == 40


@given(
    st.integers(0, 10**6),
    st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=60),
    st.randoms(use_true_random=False),
)
def test_offset_window_matches_a_model(start, steps, rnd) -> None:
    w = OffsetWindow(start)
    nxt = start
    unfinished: set[int] = set()
    for gap, deliver in steps:
        nxt += gap  # skipped offsets (filtered) never block the window
        if deliver:
            w.add(nxt)
            unfinished.add(nxt)
            nxt += 1
        w.advance(nxt)
        if unfinished and rnd.random() < 0.5:
            off = rnd.choice(sorted(unfinished))
            unfinished.discard(off)
            w.done(off)
        assert w.committable() == (min(unfinished) if unfinished else nxt)
        assert len(w) == len(unfinished)


def _fetch_answer(group: str, index: int, base: int, msgs: list[OutgoingMessage]):
    batch = encode_batch("orders", 2, msgs, born_ms=1234)
    stored = STORED_PREFIX.pack(5678) + batch  # what the leader keeps for the entry
    _, refs = walk_batch(batch)
    rows, body = [], b""
    for i, ref in enumerate(refs):
        start = STORED_PREFIX.size + ref.start
        rows.append([base + i, index, start, 5678])
        body += stored[start : start + ref.size]
    return {"g": group, "msgs": rows}, body, batch


def test_decode_fetch_rebuilds_messages_with_the_producer_ids() -> None:
    msgs = [
        OutgoingMessage(b"one", key="k1", tags="TagA", properties={"a": "1"}),
        OutgoingMessage(b"", key="", tags=""),
        OutgoingMessage(b"x" * 5000, key="k3"),
    ]
    header, body, batch = _fetch_answer("g1", 42, 100, msgs)
    out = decode_fetch("orders", 2, "g1", header, body)
    assert [m.body for m in out] == [m.body for m in msgs]
    assert [(m.key, m.tags, m.properties) for m in out] == [
        (m.key, m.tags, m.properties) for m in msgs
    ]
    assert [m.offset for m in out] == [100, 101, 102]
    assert all(m.topic == "orders" and m.queue == 2 for m in out)
    assert all(m.born_ms == 1234 and m.store_ms == 5678 for m in out)
    # consumers see the same ids the producer computed from its own batch
    assert [m.msg_id for m in out] == batch_message_ids("g1", 42, batch)


def test_decode_fetch_refuses_a_body_that_does_not_match_the_rows() -> None:
    header, body, _ = _fetch_answer("g1", 1, 0, [OutgoingMessage(b"a"), OutgoingMessage(b"b")])
    header["msgs"] = header["msgs"][:1]
    with pytest.raises(RequestError) as info:
        decode_fetch("orders", 2, "g1", header, body)
    assert info.value.code == Code.MALFORMED
    assert decode_fetch("orders", 2, "g1", {"msgs": []}, b"") == []


def test_push_consumer_validates_its_arguments() -> None:
    def handler(msgs):
        return None

    with pytest.raises(ValueError):
        PushConsumer("127.0.0.1:9876", "cg", [], handler)
    with pytest.raises(ValueError):
        PushConsumer("127.0.0.1:9876", "cg", ["t"], handler, strategy="sticky")  # type: ignore[arg-type]
    with pytest.raises(RequestError):
        PushConsumer("127.0.0.1:9876", "bad group!", ["t"], handler)
    with pytest.raises(ValueError, match="client_id"):  # what the nodes would refuse
        PushConsumer("127.0.0.1:9876", "cg", ["t"], handler, client_id="c" * 256)
    c = PushConsumer("127.0.0.1:9876", "cg", {"t": ["A", "B"], "u": None}, handler)
    assert c.topics == {"t": ["A", "B"], "u": None}
    assert not c._handler_is_async

    class AsyncHandler:
        async def __call__(self, msgs):
            return True

    async def ahandler(msgs):
        return True

    assert PushConsumer("127.0.0.1:9876", "cg", ["t"], ahandler)._handler_is_async
    assert PushConsumer("127.0.0.1:9876", "cg", ["t"], AsyncHandler())._handler_is_async
