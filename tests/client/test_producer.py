"""Producer: selection, batching, message ids, and its retry decisions.

The retry tests replace the transport with a script of answers, to check which bytes
the producer sends where after each kind of failure; they say nothing about a node.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

import raftmq.client.producer as producer_module
from raftmq.client.errors import UnavailableError
from raftmq.client.producer import (
    BatchAccumulator,
    PendingSend,
    Producer,
    SendAttempt,
    SendFuture,
    SendNotDoneError,
    as_payload,
    batch_message_ids,
    check_message,
    key_queue,
    make_message,
    pick_round_robin,
    record_size,
)
from raftmq.client.routes import QueueRoute, TopicRoute, clock, parse_route
from transport.connection import ClientClosedError, TransportError
from wire.produce import encode_ok, split_batches
from wire.protocol import MAX_MESSAGE_BYTES, Code, Frame, Op, RequestError
from wire.records import (
    STORED_PREFIX,
    OutgoingMessage,
    decode_record,
    encode_batch,
    walk_batch,
)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---------------------------------------------------------------- selection


def test_key_selection_is_stable_and_in_range() -> None:
    assert key_queue("order-17", 8) == zlib.crc32(b"order-17") % 8
    assert key_queue("order-17", 8) == key_queue("order-17", 8)
    for total in (1, 3, 4, 16):
        assert {key_queue(f"k{i}", total) for i in range(500)} == set(range(total))
    with pytest.raises(ValueError):
        key_queue("k", 0)


def test_round_robin_cycles_and_avoids_failed_queues() -> None:
    queues = [0, 1, 2, 3]
    counter, seen = 0, []
    for _ in range(8):
        q, counter = pick_round_robin(queues, counter)
        seen.append(q)
    assert seen == [0, 1, 2, 3, 0, 1, 2, 3]
    q, counter = pick_round_robin(queues, 1, avoid={1, 2})
    assert (q, counter) == (3, 4)
    q, _ = pick_round_robin(queues, 5, avoid=set(queues))  # all failed: keep rotating
    assert q == 1
    with pytest.raises(ValueError):
        pick_round_robin([], 0)


def test_make_message_and_size_checks() -> None:
    m = make_message("héllo", key="k", tags="T", properties={"a": "b"})
    assert m == OutgoingMessage("héllo".encode(), "k", "T", {"a": "b"})
    base = OutgoingMessage(b"x", key="old", tags="old")
    assert make_message(base, tags="new") == OutgoingMessage(b"x", "old", "new", {})
    assert make_message(base) is base
    with pytest.raises(TypeError):
        make_message(42)  # type: ignore[arg-type]
    check_message(OutgoingMessage(b"x" * MAX_MESSAGE_BYTES))
    with pytest.raises(RequestError) as info:
        check_message(OutgoingMessage(b"x" * (MAX_MESSAGE_BYTES + 1)))
    assert info.value.code == Code.MESSAGE_TOO_LARGE
    assert record_size(m) == len(encode_batch("t", 0, [m])) - len(encode_batch("t", 0, []))


def test_a_bare_body_is_framed_like_a_message_without_key_tags_or_properties() -> None:
    bodies = [b"", b"x", b"y" * 300]
    full = [OutgoingMessage(b) for b in bodies]
    mixed: list[OutgoingMessage | bytes] = [bodies[0], full[1], bodies[2]]
    assert encode_batch("t", 3, bodies, born_ms=5) == encode_batch("t", 3, full, born_ms=5)
    assert encode_batch("t", 3, mixed, born_ms=5) == encode_batch("t", 3, full, born_ms=5)
    assert [record_size(b) for b in bodies] == [record_size(m) for m in full]
    # whatever the caller passed, a message without key, tags or properties is its body
    assert as_payload("hé") == "hé".encode() and as_payload(bytearray(b"ab")) == b"ab"
    assert as_payload(OutgoingMessage(b"z")) == b"z"
    assert as_payload(b"z", key="k") == OutgoingMessage(b"z", key="k")
    assert as_payload(OutgoingMessage(b"z", tags="T")) == OutgoingMessage(b"z", tags="T")
    check_message(b"x" * MAX_MESSAGE_BYTES)
    with pytest.raises(RequestError) as info:
        check_message(b"x" * (MAX_MESSAGE_BYTES + 1))
    assert info.value.code == Code.MESSAGE_TOO_LARGE


# ---------------------------------------------------------------- batching


def _send(n: int, size: int = 10) -> PendingSend:
    msgs = [OutgoingMessage(bytes([i % 256]) * size, key=f"k{i}") for i in range(n)]
    return PendingSend(msgs, sum(record_size(m) for m in msgs), SendFuture())


def test_accumulator_waits_for_linger_or_a_size_bound() -> None:
    acc = BatchAccumulator(linger=0.005, max_messages=4, max_bytes=10_000)
    assert not acc.ready(0.0)
    acc.add(_send(1), now=1.0)
    assert not acc.ready(1.001) and acc.ready(1.005)
    acc.add(_send(2), now=1.002)
    assert acc.deadline == 1.005  # the oldest message sets the deadline
    acc.add(_send(1), now=1.003)
    assert acc.full and acc.ready(1.003)
    batch = acc.take()
    assert [len(s.messages) for s in batch] == [1, 2, 1]
    assert len(acc) == 0 and acc.messages == 0 and acc.bytes == 0

    acc = BatchAccumulator(linger=10, max_messages=1000, max_bytes=300)
    for _ in range(5):
        acc.add(_send(1, size=100), now=0.0)
    assert acc.ready(0.0)  # bytes bound reached long before the linger
    first = acc.take()
    assert len(first) == 2 and sum(s.size for s in first) <= 300
    assert len(acc) == 3


def test_accumulator_never_splits_a_send_and_ships_oversized_alone() -> None:
    acc = BatchAccumulator(linger=0, max_messages=4, max_bytes=1 << 20)
    acc.add(_send(3), 0.0)
    acc.add(_send(3), 0.0)
    acc.add(_send(9), 0.0)
    assert [len(s.messages) for s in acc.take()] == [3]
    assert [len(s.messages) for s in acc.take()] == [3]
    assert [len(s.messages) for s in acc.take()] == [9]
    assert acc.take() == []


def test_accumulated_batch_encodes_to_a_valid_batch() -> None:
    acc = BatchAccumulator(linger=0, max_messages=256, max_bytes=1 << 20)
    sends = [_send(n, size=50 * n) for n in (1, 5, 2)]
    for s in sends:
        acc.add(s, 0.0)
    msgs = [m for s in acc.take() for m in s.messages]
    batch = encode_batch("orders", 3, msgs, pid=7, seq=0, born_ms=99)
    header, refs = walk_batch(batch)
    assert (header.topic, header.queue, header.pid, header.seq, header.n) == ("orders", 3, 7, 0, 8)
    assert [r.key for r in refs] == [m.key for m in msgs]
    assert len(batch) - refs[0].start == acc.bytes + sum(s.size for s in sends)


def test_message_ids_point_at_records_in_the_stored_entry() -> None:
    msgs = [OutgoingMessage(b"a" * i, key=str(i), tags="t") for i in range(1, 6)]
    batch = encode_batch("orders", 0, msgs, born_ms=5)
    ids = batch_message_ids("g2", 77, batch)
    stored = STORED_PREFIX.pack(123456) + batch
    _, refs = walk_batch(batch)
    for i, (mid, ref) in enumerate(zip(ids, refs, strict=True)):
        group, index, start = mid.split(":")
        assert (group, int(index), int(start)) == ("g2", 77, 8 + ref.start)
        msg, _ = decode_record(stored, int(start), topic="orders", queue=0, offset=i,
                               store_ms=0, msg_id=mid)
        assert msg.body == msgs[i].body and msg.key == msgs[i].key


@pytest.mark.anyio
async def test_send_future_outcomes_and_callbacks() -> None:
    fut: SendFuture[int] = SendFuture()
    seen: list[Any] = []
    fut.add_done_callback(lambda f: seen.append(f.result()))
    fut.add_done_callback(lambda f: seen.append(("second", f.result())))
    fut.add_done_callback(lambda f: seen.append("third"))
    with pytest.raises(RuntimeError):
        fut.result()
    fut.set_result(5)
    fut.set_result(6)  # the first outcome sticks
    assert await fut == 5 and seen == [5, ("second", 5), "third"]  # in the order added
    fut.add_done_callback(lambda f: seen.append("late"))
    assert seen[-1] == "late"
    bad: SendFuture[int] = SendFuture()
    bad.set_exception(RequestError(Code.TIMEOUT, "x"))
    assert isinstance(bad.exception(), RequestError)
    with pytest.raises(RequestError):
        await bad


def test_asyncio_takes_a_send_future_for_a_future() -> None:
    """§ issue 28.11: `asyncio.wait([fut])` failed (no `remove_done_callback`) and
    `fut.result(timeout=...)` was a TypeError."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        a: SendFuture[int] = SendFuture()
        b: SendFuture[int] = SendFuture()
        c: SendFuture[int] = SendFuture()
        loop.call_soon(a.set_result, 1)
        done, pending = await asyncio.wait([a, b, c], return_when=asyncio.FIRST_COMPLETED)
        assert done == {a} and pending == {b, c}
        assert b.remove_done_callback(print) == 0  # asyncio.wait took its callbacks back
        with pytest.raises(SendNotDoneError, match="await"):
            b.result(timeout=5)  # never waits: that would stop the loop the send needs
        with pytest.raises(asyncio.InvalidStateError):
            b.exception()
        assert not b.cancel() and not b.cancelled()
        loop.call_soon(b.set_exception, RequestError(Code.MESSAGE_TOO_LARGE, "big"))
        loop.call_soon(c.set_result, 3)
        done, pending = await asyncio.wait([a, b, c])
        assert done == {a, b, c} and not pending
        assert isinstance(b.exception(timeout=1), RequestError) and c.result(timeout=1) == 3
        assert await asyncio.gather(a, c) == [1, 3]
        assert await asyncio.wait_for(a, 10) == 1
        assert sorted([await f for f in asyncio.as_completed([a, c])]) == [1, 3]

    asyncio.run(main())


@pytest.mark.anyio
async def test_a_send_future_wait_is_bounded_when_asked() -> None:
    fut: SendFuture[int] = SendFuture()
    with pytest.raises(TimeoutError):
        await fut.wait(timeout=0.01)
    fut.set_result(7)
    assert await fut.wait(timeout=0.01) == 7 and fut.result() == 7


# ---------------------------------------------------------------- with a scripted transport


Script = Callable[[str, int, dict[str, Any], bytes], dict[str, Any]]


class ScriptedPool:
    """Stands in for the connection pool: records requests, answers from a function."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.sent: list[tuple[str, int, dict[str, Any], bytes]] = []

    async def request(self, addr: str, op: Any, header: Any = None, body: Any = b"", *,
                      timeout: float = 3.0) -> Frame:
        await anyio.sleep(0)
        header = dict(header or {})
        self.sent.append((addr, int(op), header, bytes(body)))
        return Frame({"id": 1, "code": 0, **self.script(addr, int(op), header, bytes(body))})

    def produced(self) -> list[tuple[str, dict[str, Any], bytes]]:
        return [(a, h, b) for a, op, h, b in self.sent if op == Op.PRODUCE]


ROUTE = {
    "total": 4,
    "queues": [[0, "g1", "n1:1"], [1, "g2", "n2:1"], [2, "g1", "n1:1"], [3, "g2", "n2:1"]],
    "replicas": {"g1": ["n1:1", "n2:1", "n3:1"], "g2": ["n1:1", "n2:1", "n3:1"]},
}


def ok_produce(base: int = 0, index: int = 9, dup: bool = False) -> Script:
    """Every batch stored at `base` by entry `index`; a multi-batch request's batches
    one after the other in that entry, as a leader stores them."""
    def answer(addr: str, op: int, h: dict[str, Any], body: bytes) -> dict[str, Any]:
        if op == Op.ROUTE:
            return ROUTE
        if "sizes" not in h:
            header, _ = walk_batch(body)
            return {"base": base, "n": header.n, "index": index, "dup": dup}
        results, shift = [], 0
        for part in split_batches(h["sizes"], body):
            results.append(encode_ok(base, walk_batch(part)[0].n, index, dup, shift))
            shift += len(part)
        return {"results": results}

    return answer


@asynccontextmanager
async def scripted(script: Script, **kwargs: Any) -> AsyncIterator[tuple[Producer, ScriptedPool]]:
    """An open producer whose route is known and whose requests go to `script`."""
    kwargs.setdefault("linger_ms", 0)
    async with Producer("ns:1", **kwargs) as producer:
        pool = ScriptedPool(script)
        routes = producer._routes
        assert routes is not None
        routes.pool = pool  # type: ignore[assignment]
        now = clock()
        route = parse_route("orders", ROUTE, now)
        routes._topics["orders"] = route
        routes.learn_route(route, now)
        yield producer, pool


def fail_first(n: int, error: Callable[[], RequestError], then: Script) -> Script:
    count = [0]

    def answer(addr: str, op: int, h: dict[str, Any], body: bytes) -> dict[str, Any]:
        if op == Op.PRODUCE:
            count[0] += 1
            if count[0] <= n:
                raise error()
        return then(addr, op, h, body)

    return answer


@pytest.mark.anyio
async def test_flush_and_close_do_not_wait_out_the_linger() -> None:
    """A flush (and leaving the block, which flushes) sends what lingers at once: it
    used to wait `linger_ms` out, and leaving the block gave up on such sends after its
    bound and failed them unsent. The bounds below end a hang; they measure nothing."""
    with anyio.fail_after(30):
        async with scripted(ok_produce(base=7), linger_ms=600_000) as (producer, pool):
            fut = await producer.send_async("orders", b"lingering", queue=1)
            await producer.flush()
            assert fut.result().offset == 7 and len(pool.produced()) == 1
            late = await producer.send_async("orders", b"left for the block's end", queue=1)
    assert late.result().offset == 7 and len(pool.produced()) == 2


@pytest.mark.anyio
async def test_a_send_whose_delivery_timeout_ends_before_it_leaves_is_never_sent() -> None:
    """A send waiting behind its queue's batch in flight, past its `delivery_timeout`,
    fails with `UnavailableError` (nothing was sent) instead of being sent late; the
    batch in flight is answered after its own deadline (a slow node)."""
    slow, out = anyio.Event(), anyio.Event()

    class SlowFirstAnswer(ScriptedPool):
        async def request(self, addr: str, op: Any, header: Any = None, body: Any = b"", *,
                          timeout: float = 3.0) -> Frame:
            if int(op) == Op.PRODUCE and not out.is_set():
                out.set()
                await slow.wait()
            return await super().request(addr, op, header, body, timeout=timeout)

    async with scripted(ok_produce(base=3), delivery_timeout=0.5) as (producer, pool):
        slow_pool = SlowFirstAnswer(pool.script)
        assert producer._routes is not None
        producer._routes.pool = slow_pool  # type: ignore[assignment]
        first = await producer.send_async("orders", b"first", queue=1)
        await out.wait()  # the first's request is out: its queue is busy
        second = await producer.send_async("orders", b"second", queue=1)
        await anyio.sleep(1.0)  # past the second's delivery timeout, behind the first
        slow.set()
        with anyio.fail_after(30):
            await producer.flush()
    assert first.result().offset == 3
    assert isinstance(second.exception(), UnavailableError), second.exception()
    assert [b"second" in body for _, _, body in slow_pool.produced()] == [False]


@pytest.mark.anyio
async def test_concurrent_sends_to_a_queue_share_one_request() -> None:
    async with scripted(ok_produce(base=100), linger_ms=200) as (producer, pool):
        futs = [await producer.send_async("orders", f"m{i}", queue=1) for i in range(20)]
        results = [await f for f in futs]
    produced = pool.produced()
    assert len(produced) == 1
    addr, header, body = produced[0]
    assert addr == "n2:1" and header == {"g": "g2"}
    batch_header, refs = walk_batch(body)
    assert batch_header.n == 20 and batch_header.queue == 1 and batch_header.seq == -1
    assert [r.offset for r in results] == list(range(100, 120))
    # ids name each record's place in the stored entry, behind the store timestamp
    assert [r.msg_id for r in results] == [f"g2:9:{STORED_PREFIX.size + r.start}" for r in refs]


@pytest.mark.anyio
async def test_round_robin_moves_on_by_batch_not_by_message() -> None:
    """A burst of keyless sends fills one queue's batch instead of one batch per queue;
    the next burst, after that batch has left, goes to the next queue."""
    async with scripted(ok_produce()) as (producer, pool):
        first = [await producer.send_async("orders", f"a{i}".encode()) for i in range(12)]
        results = [await f for f in first]
        second = [await producer.send_async("orders", f"b{i}".encode()) for i in range(12)]
        results += [await f for f in second]
    queues = [walk_batch(b)[0].queue for _, _, b in pool.produced()]
    sizes = [walk_batch(b)[0].n for _, _, b in pool.produced()]
    assert sizes == [12, 12]  # round robin per message would have made 4 batches of 3
    assert {r.queue for r in results[:12]} == {queues[0]}
    assert {r.queue for r in results[12:]} == {queues[1]} and queues[1] == (queues[0] + 1) % 4
    # over many bursts every queue gets its turn
    async with scripted(ok_produce()) as (producer, pool):
        for _ in range(8):
            futs = [await producer.send_async("orders", b"x") for _ in range(5)]
            for f in futs:
                await f
    assert {walk_batch(b)[0].queue for _, _, b in pool.produced()} == {0, 1, 2, 3}


@pytest.mark.anyio
async def test_idle_queue_places_are_kept_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producer_module, "QUEUE_PLACES_KEPT", 10)
    async with wide(100, 2, ok_produce()) as (producer, _pool):
        for f in [await producer.send_async("wide", b"x", queue=k) for k in range(100)]:
            await f
        assert len(producer._queues) == 10
        for f in [await producer.send_async("wide", b"y", queue=k) for k in range(100)]:
            await f  # kept places or new ones alike
        assert len(producer._queues) == 10


@pytest.mark.anyio
async def test_a_kept_queue_place_follows_its_queue_to_another_group() -> None:
    async with wide(4, 2, ok_produce()) as (producer, pool):
        await producer.send("wide", b"a", queue=1)
        routes = producer._routes
        assert routes is not None
        moved = _wide_route(4, 2)
        moved["queues"] = [[q, f"g{(q + 1) % 2}", f"n{(q + 1) % 2}:1"] for q in range(4)]
        route = parse_route("wide", moved, clock())
        routes._topics["wide"] = route
        routes.learn_route(route, clock())
        result = await producer.send("wide", b"b", queue=1)
    assert [h["g"] for _, h, _ in pool.produced()] == ["g1", "g0"]
    assert result.group == "g0"


def _wide_route(queues: int, groups: int) -> dict[str, Any]:
    """A route of `queues` queues spread round robin over `groups` groups."""
    return {
        "total": queues,
        "queues": [[q, f"g{q % groups}", f"n{q % groups}:1"] for q in range(queues)],
        "replicas": {f"g{g}": [f"n{g}:1"] for g in range(groups)},
    }


@asynccontextmanager
async def wide(queues: int, groups: int, script: Script,
               **kwargs: Any) -> AsyncIterator[tuple[Producer, ScriptedPool]]:
    """`scripted`, with topic "wide" routed over `queues` queues in `groups` groups."""
    async with scripted(script, **kwargs) as (producer, pool):
        routes = producer._routes
        assert routes is not None
        now = clock()
        route = parse_route("wide", _wide_route(queues, groups), now)
        routes._topics["wide"] = route
        routes.learn_route(route, now)
        yield producer, pool


@pytest.mark.anyio
async def test_sends_to_many_queues_of_a_group_share_its_requests() -> None:
    """A send per queue over 1,000 queues makes one request per group, not one per
    queue; every send still gets its own batch's outcome, and once the answers are in
    the queues' places hold nothing (kept for the next sends, up to a bound)."""
    async with wide(1000, 2, ok_produce()) as (producer, pool):
        futs = [await producer.send_async("wide", b"%d" % k, queue=k) for k in range(1000)]
        results = [await f for f in futs]
        assert all(qb.empty and not qb.busy for qb in producer._queues.values())
        assert sorted(producer._groups) == ["g0", "g1"]
    produced = pool.produced()
    assert sorted(h["g"] for _, h, _ in produced) == ["g0", "g1"]
    for _, h, body in produced:
        assert len(h["sizes"]) == 500 and sum(h["sizes"]) == len(body)
    assert [(r.queue, r.group) for r in results] == [(k, f"g{k % 2}") for k in range(1000)]


@pytest.mark.anyio
async def test_a_thousand_queues_cost_no_more_tasks_than_one() -> None:
    """The sends wait in the accumulator of their group: what runs is one sender per
    group and one task per request in flight, however many queues the sends go to."""
    gate = anyio.Event()

    class Held(ScriptedPool):
        waiting = 0

        async def request(self, addr: str, op: Any, header: Any = None, body: Any = b"", *,
                          timeout: float = 3.0) -> Frame:
            if op == Op.PRODUCE:
                self.waiting += 1
                await gate.wait()
            return await super().request(addr, op, header, body, timeout=timeout)

    async def tasks_while_sending_to(queues: int) -> int:
        async with wide(1000, 1, ok_produce()) as (producer, pool):
            held = Held(pool.script)
            assert producer._routes is not None
            producer._routes.pool = held  # type: ignore[assignment]
            futs = [await producer.send_async("wide", b"x", queue=k % queues)
                    for k in range(2000)]
            with anyio.fail_after(5):
                while not held.waiting:
                    await anyio.sleep(0.01)
            await anyio.sleep(0.05)  # anything else that would start, starts
            count = len(anyio.get_running_tasks())
            gate.set()
            for f in futs:
                await f
            return count

    one = await tasks_while_sending_to(1)
    gate = anyio.Event()
    many = await tasks_while_sending_to(1000)
    assert many == one


@pytest.mark.anyio
async def test_batches_respect_the_message_bound_and_keep_order() -> None:
    async with scripted(ok_produce(), linger_ms=200, batch_max_messages=4) as (producer, pool):
        futs = [await producer.send_async("orders", f"m{i}".encode(), queue=2)
                for i in range(10)]
        for f in futs:
            await f
    bodies = [b for _, _, b in pool.produced()]
    counts = [walk_batch(b)[0].n for b in bodies]
    assert counts == [4, 4, 2]
    keys_in_order = []
    for b in bodies:
        _, refs = walk_batch(b)
        for r in refs:
            msg, _ = decode_record(b, r.start, topic="orders", queue=2, offset=0, store_ms=0,
                                   msg_id="")
            keys_in_order.append(msg.body)
    assert keys_in_order == [f"m{i}".encode() for i in range(10)]


@pytest.mark.anyio
async def test_send_batch_goes_to_one_queue_in_one_request() -> None:
    async with scripted(ok_produce(base=7)) as (producer, pool):
        results = await producer.send_batch("orders", [b"a", b"b", b"c"], queue=3)
    assert [(r.queue, r.offset) for r in results] == [(3, 7), (3, 8), (3, 9)]
    assert len(pool.produced()) == 1


@pytest.mark.anyio
async def test_idempotent_retry_resends_the_same_bytes_to_the_same_queue() -> None:
    script = fail_first(1, lambda: TransportError("lost", sent=True), ok_produce())
    async with scripted(script, idempotent=True) as (producer, pool):
        r1 = await producer.send("orders", b"one", queue=0)
        r2 = await producer.send("orders", b"two", queue=0)
    produced = pool.produced()
    assert len(produced) == 3
    (_, _, first), (_, _, retry), (_, _, second) = produced
    assert first == retry
    h1, h2 = walk_batch(first)[0], walk_batch(second)[0]
    assert h1.pid == producer.pid != 0 and h1.seq == 0 and h1.queue == 0
    assert h2.pid == producer.pid and h2.seq == 1
    assert r1.queue == r2.queue == 0


@pytest.mark.anyio
async def test_idempotent_failure_moves_the_queue_to_a_fresh_producer_id() -> None:
    script = fail_first(3, lambda: RequestError(Code.BUSY, "behind"), ok_produce())
    async with scripted(script, idempotent=True, retries=2) as (producer, pool):
        with pytest.raises(RequestError) as info:
            await producer.send("orders", b"lost?", queue=1)
        assert info.value.code == Code.BUSY
        await producer.send("orders", b"next", queue=1)
    bodies = [walk_batch(b)[0] for _, _, b in pool.produced()]
    assert [(h.pid == producer.pid, h.seq) for h in bodies] == [
        (True, 0), (True, 0), (True, 0), (False, 0)
    ]


@pytest.mark.anyio
async def test_not_leader_hint_is_followed_without_using_a_retry() -> None:
    def answer(addr: str, op: int, h: dict[str, Any], body: bytes) -> dict[str, Any]:
        if op == Op.PRODUCE and addr != "n3:1":
            raise RequestError(Code.NOT_LEADER, "moved", leader="n3:1")
        return ok_produce()(addr, op, h, body)

    async with scripted(answer, retries=0) as (producer, pool):
        result = await producer.send("orders", b"x", queue=0)
    assert [a for a, _, _ in pool.produced()] == ["n1:1", "n3:1"]
    assert result.group == "g1"


@pytest.mark.anyio
async def test_round_robin_retry_avoids_the_failed_group() -> None:
    def answer(addr: str, op: int, h: dict[str, Any], body: bytes) -> dict[str, Any]:
        if op == Op.PRODUCE and h["g"] == "g1":
            raise RequestError(Code.TIMEOUT, "no quorum")
        return ok_produce()(addr, op, h, body)

    async with scripted(answer, retries=2) as (producer, pool):
        results = [await producer.send("orders", f"m{i}") for i in range(6)]
    assert all(r.group == "g2" and r.queue in (1, 3) for r in results)
    for _, h, body in pool.produced():
        assert walk_batch(body)[0].queue in ((0, 2) if h["g"] == "g1" else (1, 3))


@pytest.mark.anyio
async def test_key_sends_stay_on_their_queue_when_retried() -> None:
    script = fail_first(2, lambda: RequestError(Code.TIMEOUT, "slow"), ok_produce())
    async with scripted(script, selector="key", retries=2) as (producer, pool):
        result = await producer.send("orders", b"x", key="customer-1")
    q = key_queue("customer-1", 4)
    assert result.queue == q
    assert {walk_batch(b)[0].queue for _, _, b in pool.produced()} == {q}


@pytest.mark.anyio
async def test_non_retriable_errors_fail_at_once() -> None:
    script = fail_first(5, lambda: RequestError(Code.UNKNOWN_TOPIC, "gone"), ok_produce())
    async with scripted(script, retries=2) as (producer, pool):
        with pytest.raises(RequestError) as info:
            await producer.send("orders", b"x", queue=0)
    assert info.value.code == Code.UNKNOWN_TOPIC
    assert len(pool.produced()) == 1


@pytest.mark.anyio
async def test_duplicate_without_remembered_position_has_no_id() -> None:
    async with scripted(ok_produce(base=-1, dup=True), idempotent=True) as (producer, _):
        result = await producer.send("orders", b"x", queue=0)
    assert result.dup and result.msg_id is None and result.offset == -1


@pytest.mark.anyio
async def test_custom_selector_and_bad_queues() -> None:
    seen: list[int] = []

    def selector(total: int, msg: OutgoingMessage) -> int:
        seen.append(total)
        return int(msg.key) % total

    async with scripted(ok_produce(), selector=selector) as (producer, _):
        assert (await producer.send("orders", b"x", key="6")).queue == 2
        assert seen == [4]
        with pytest.raises(RequestError) as info:
            await producer.send("orders", b"x", queue=4)
        assert info.value.code == Code.UNKNOWN_QUEUE
        with pytest.raises(RequestError) as info:
            await producer.send("orders", b"x" * (MAX_MESSAGE_BYTES + 1))
        assert info.value.code == Code.MESSAGE_TOO_LARGE
        with pytest.raises(RequestError) as info:
            await producer.send("bad topic!", b"x")
        assert info.value.code == Code.INVALID_NAME


@pytest.mark.anyio
async def test_callbacks_oneway_and_closed_producer() -> None:
    got: list[Any] = []
    async with scripted(ok_produce(), linger_ms=10) as (producer, pool):
        await producer.send_async("orders", b"a", queue=0, callback=lambda f: got.append(f.result()))
        await producer.send_oneway("orders", b"b", queue=0)
    # leaving the block flushed both
    assert len(got) == 1 and got[0].queue == 0
    assert sum(walk_batch(b)[0].n for _, _, b in pool.produced()) == 2
    with pytest.raises(ClientClosedError):
        await producer.send("orders", b"c", queue=0)


def test_producer_argument_checks() -> None:
    with pytest.raises(ValueError):
        Producer("ns:1", idempotent=True, max_in_flight=2)
    with pytest.raises(ValueError):
        Producer("ns:1", selector="sticky")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Producer("ns:1", batch_max_bytes=1 << 30)
    with pytest.raises(ValueError):
        Producer("nameserver")
    assert Producer("ns:1", idempotent=True).pid > 0
    assert Producer("ns:1").pid == 0
    q = QueueRoute(0, "g", None)
    assert TopicRoute("t", 1, {0: q}, {}).group_of(0) == "g"


# ---------------------------------------------------------------- after a leader dies


def _election(state: dict[str, Any]) -> Script:
    """g1's leader n1 is dead (its connection fails); n2 and n3 answer NOT_LEADER without
    a leader until `state["elected"]`, then n3 leads term 6 and n2's hint says so. The
    name servers' route names n3 once `state["registered"]` (by default: once elected)."""

    def answer(addr: str, op: int, h: dict[str, Any], body: bytes) -> dict[str, Any]:
        elected = state.get("elected", False)
        if op == Op.ROUTE:
            registered = state.get("registered", elected)
            leader, term = ("n3:1", 6) if registered else ("n1:1", 5)
            return {**ROUTE, "queues": [[0, "g1", leader], *ROUTE["queues"][1:]],
                    "terms": {"g1": term, "g2": 1}}
        if addr == "n1:1":
            raise TransportError("connection refused", sent=False)
        if elected and addr == "n3:1":
            return ok_produce()(addr, op, h, body)
        raise RequestError(Code.NOT_LEADER, "no", leader="n3:1" if elected else None,
                           term=6 if elected else 5)

    return answer


@pytest.mark.anyio
async def test_a_dead_leaders_connection_sends_the_retry_at_once_to_another_replica() -> None:
    """No attempt is spent on learning the leader is gone: with no retries at all, the
    request still reaches a follower that names the new leader, and then the leader."""
    state = {"elected": True, "registered": False}
    async with scripted(_election(state), retries=0, idempotent=True) as (producer, pool):
        assert producer._routes is not None
        await producer._routes.route("orders", refresh=True)  # n1 leads term 5
        result = await producer.send("orders", b"x", queue=0)
    produced = pool.produced()
    assert [a for a, _, _ in produced] == ["n1:1", "n2:1", "n3:1"]
    assert result.group == "g1" and len({b for _, _, b in produced}) == 1  # same bytes


@pytest.mark.anyio
async def test_a_backoff_ends_as_soon_as_a_newer_leader_is_learned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("raftmq.client.producer.backoff_delay", lambda attempt: 30.0)
    state: dict[str, Any] = {}
    async with scripted(_election(state), retries=3, idempotent=True) as (producer, pool):
        assert producer._routes is not None
        await producer._routes.route("orders", refresh=True)  # n1 leads term 5
        fut = await producer.send_async("orders", b"x", queue=0)
        with anyio.fail_after(5):  # n1 failed, n2 knew no leader: then a 30 s backoff
            while len(pool.produced()) < 2:
                await anyio.sleep(0.005)
        assert not fut.done() and [a for a, _, _ in pool.produced()] == ["n1:1", "n2:1"]
        state["elected"] = True
        routes = producer._routes
        assert routes is not None
        await routes.route("orders", refresh=True)  # e.g. another request's refresh
        with anyio.fail_after(10.0):  # far below the 30 s backoff it cuts short
            result = await fut
        await producer.send("orders", b"y", queue=0)
    assert result.group == "g1"
    produced = pool.produced()
    assert [a for a, _, _ in produced] == ["n1:1", "n2:1", "n3:1", "n3:1"]
    seqs = [walk_batch(b)[0].seq for _, _, b in produced]
    assert seqs == [0, 0, 0, 1]  # the idempotent sequence stays in order


@pytest.mark.anyio
async def test_a_newer_term_hint_is_followed_at_once_but_failures_still_count() -> None:
    """Once the follower names the term-6 leader the send goes there without a counted
    attempt; repeated failures against the same term still use up the retries."""
    state = {"elected": True, "registered": False}

    def answer(addr: str, op: int, h: dict[str, Any], body: bytes) -> dict[str, Any]:
        if op == Op.PRODUCE and addr == "n3:1":
            raise RequestError(Code.BUSY, "behind")
        return _election(state)(addr, op, h, body)

    async with scripted(answer, retries=1, idempotent=True) as (producer, pool):
        assert producer._routes is not None
        await producer._routes.route("orders", refresh=True)  # n1 leads term 5
        with pytest.raises(RequestError) as info:
            await producer.send("orders", b"x", queue=0)
    assert info.value.code == Code.BUSY
    assert [a for a, _, _ in pool.produced()] == ["n1:1", "n2:1", "n3:1", "n3:1"]


@pytest.mark.anyio
async def test_the_attempt_observer_sees_every_request_that_may_store_a_batch() -> None:
    """First sends, redirects and retries alike: one `SendAttempt` per PRODUCE request,
    seen before it leaves (what the chaos workload needs to explain duplicates)."""
    produce_calls = [0]

    def answer(addr: str, op: int, h: dict[str, Any], body: bytes) -> dict[str, Any]:
        if op == Op.PRODUCE:
            produce_calls[0] += 1
            if produce_calls[0] == 1:
                raise RequestError(Code.NOT_LEADER, "moved", leader="n3:1")  # a redirect
            if produce_calls[0] == 2:
                raise RequestError(Code.TIMEOUT, "slow")  # a counted retry
        return ok_produce()(addr, op, h, body)

    seen: list[tuple[SendAttempt, int]] = []
    async with scripted(answer, retries=2, linger_ms=50) as (producer, pool):
        producer.on_attempt = lambda a: seen.append((a, len(pool.produced())))
        futs = [await producer.send_async("orders", f"m{i}", queue=0) for i in range(3)]
        for f in futs:
            await f
        await producer.send("orders", b"alone", queue=1)
    produced = pool.produced()
    assert len(seen) == len(produced) == 4
    for i, ((attempt, sent_before), (addr, header, body)) in enumerate(
        zip(seen, produced, strict=True)
    ):
        assert sent_before == i  # observed before its request left
        assert (attempt.addr, attempt.group) == (addr, header["g"])
        assert attempt.topic == "orders" and attempt.queue == walk_batch(body)[0].queue
    assert [a.attempt for a, _ in seen] == [1, 2, 3, 1]
    assert [list(a.messages) for a, _ in seen[:3]] == [[b"m0", b"m1", b"m2"]] * 3
    assert list(seen[3][0].messages) == [b"alone"]


# ---------------------------------------------------------------- order per queue


def _bodies(pool: ScriptedPool, ok_only: Callable[[int], bool]) -> list[list[bytes]]:
    """The message bodies of each PRODUCE request (whose number `ok_only` accepts), batch
    by batch."""
    out = []
    n = 0
    for _, h, body in pool.produced():
        n += 1
        if not ok_only(n):
            continue
        parts = split_batches(h["sizes"], body) if "sizes" in h else [memoryview(body)]
        for part in parts:
            raw = bytes(part)
            _, refs = walk_batch(raw)
            out.append([decode_record(raw, r.start, topic="", queue=0, offset=0, store_ms=0,
                                      msg_id="")[0].body for r in refs])
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("in_flight", [1, 3])
async def test_a_queue_sends_nothing_newer_while_its_batch_waits_to_be_retried(
    in_flight: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first request fails (the group is behind): while its batch backs off, the
    newer sends of its queue wait; the retry goes first, and the queue's batches reach
    the broker in send order."""
    monkeypatch.setattr("raftmq.client.producer.backoff_delay", lambda attempt: 0.2)
    script = fail_first(1, lambda: RequestError(Code.BUSY, "behind"), ok_produce())
    async with scripted(script, batch_max_messages=2, max_in_flight=in_flight,
                        retries=3) as (producer, pool):
        futs = [await producer.send_async("orders", b"m%d" % i, queue=0) for i in range(12)]
        with anyio.fail_after(5):
            while not pool.produced():
                await anyio.sleep(0.005)
        more = [await producer.send_async("orders", b"m%d" % i, queue=0) for i in range(12, 16)]
        await anyio.sleep(0.1)  # within the backoff: nothing else of queue 0 may leave
        assert len(pool.produced()) == 1
        with anyio.fail_after(10):
            results = [await f for f in futs + more]
    sent = [b for batch in _bodies(pool, lambda n: n > 1) for b in batch]
    assert sent == [b"m%d" % i for i in range(16)]
    first = _bodies(pool, lambda n: n == 1)
    assert first == _bodies(pool, lambda n: n == 2)[: len(first)]  # the retry went first
    assert [r.queue for r in results] == [0] * 16


@pytest.mark.anyio
async def test_a_batch_behind_a_stored_batch_of_its_queue_is_failed_not_resent() -> None:
    """Two batches of one queue in one request: the first refused with a retriable error,
    the second stored. Resending the first would store it after the second, so it fails
    (with its own error) and is not sent again; the second is acknowledged."""
    def answer(addr: str, op: int, h: dict[str, Any], body: bytes) -> dict[str, Any]:
        if op == Op.ROUTE:
            return ROUTE
        first, second = split_batches(h["sizes"], body)
        return {"results": [[int(Code.BUSY), "behind", {}],
                            encode_ok(5, walk_batch(second)[0].n, 9, False, len(first))]}

    async with scripted(answer, batch_max_messages=1, max_in_flight=2, retries=3) as (
            producer, pool):
        a = await producer.send_async("orders", b"a", queue=0)
        b = await producer.send_async("orders", b"b", queue=0)
        with pytest.raises(RequestError) as info:
            await a
        result = await b
    assert info.value.code == Code.BUSY
    # its id names its record where the leader put it: behind the first batch
    shift = len(encode_batch("orders", 0, [b"a"]))
    assert (result.offset, result.msg_id) == (
        5, f"g1:9:{encode_batch('orders', 0, [b'b']).starts[0] + shift}")
    assert len(pool.produced()) == 1


@pytest.mark.anyio
async def test_each_batch_outcome_of_a_multi_batch_answer_is_read_on_its_own() -> None:
    """A multi-batch answer is read outcome by outcome: the common shape, one without a
    shift (an older node: shift 0), one whose fields are numbers in another form, and one
    that is not an outcome of a stored batch (that batch alone fails, MALFORMED)."""
    def answer(addr: str, op: int, h: dict[str, Any], body: bytes) -> dict[str, Any]:
        if op == Op.ROUTE:
            return ROUTE
        a, b, c, d = split_batches(h["sizes"], body)
        return {"results": [
            [0, 5, 1, 9, False],  # no shift
            [0, "6", 1, 9, 1, len(a)],  # a base as text, a dup as 1
            [0, None, 1, 9, False, len(a) + len(b)],
            encode_ok(40, 1, 11, False, len(a) + len(b) + len(c)),
        ]}

    async with scripted(answer, batch_max_messages=1, max_in_flight=2) as (producer, pool):
        futs = [await producer.send_async("orders", m, queue=q)
                for m, q in ((b"a", 0), (b"b", 0), (b"c", 2), (b"d", 2))]
        with anyio.fail_after(5):
            await producer.flush()
    assert len(pool.produced()) == 1
    a, b, c, d = futs
    start = encode_batch("orders", 0, [b"a"]).starts[0]
    size = len(encode_batch("orders", 0, [b"a"]))
    assert (a.result().offset, a.result().msg_id, a.result().dup) == (5, f"g1:9:{start}", False)
    assert (b.result().offset, b.result().msg_id, b.result().dup) == (
        6, f"g1:9:{start + size}", True)
    error = c.exception()
    assert isinstance(error, RequestError) and error.code == Code.MALFORMED
    assert (d.result().offset, d.result().queue, d.result().msg_id) == (
        40, 2, f"g1:11:{start + 3 * size}")


@pytest.mark.anyio
async def test_a_send_rides_out_a_leadership_transfer_past_its_retries() -> None:
    """PROPOSAL_DROPPED ("leadership is moving") is an election in slow motion: the
    send is retried while it lasts (within LEADER_WAIT), not failed after `retries`."""
    script = fail_first(6, lambda: RequestError(Code.PROPOSAL_DROPPED,
                                                "leadership is moving to 2"), ok_produce())
    async with scripted(script, retries=1, idempotent=True) as (producer, pool):
        result = await producer.send("orders", b"x", queue=0)
    assert result.queue == 0 and len(pool.produced()) == 7
