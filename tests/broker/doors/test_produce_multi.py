"""Multi-batch PRODUCE over real node processes: one request carries batches for several
queues of a group; each is stored at its own queue with its own offsets, a bad batch is
refused alone, and an idempotent retry of the whole request is deduplicated batch by
batch. The SDK producer, which groups its batches this way, keeps every queue's order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from raftmq.client import Admin, Producer
from raftmq.localcluster import LocalCluster
from tests.conftest import group_leader, live_cluster, wait_for
from tests.live_cluster import drain
from transport.blocking import request
from wire.produce import decode_outcome
from wire.protocol import Code, Op, RequestError
from wire.records import encode_batch

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("multi"), groups=1) as c:
        yield c


def _create(cluster: LocalCluster, topic: str, queues: int) -> None:
    async def main() -> None:
        async with Admin(cluster.namesrv_addr) as admin:
            await admin.create_topic(topic, queues)

    anyio.run(main, backend="trio")


def _produce(cluster: LocalCluster, batches: list[bytes]) -> list[dict[str, Any] | RequestError]:
    """One multi-batch PRODUCE to g0's leader: each batch's fields, or its error."""
    leader = wait_for(lambda: group_leader(cluster, "g0"), 30, "a leader of g0")
    h, _ = request(cluster.node_addr(leader),
                   {"op": int(Op.PRODUCE), "g": "g0", "sizes": [len(b) for b in batches]},
                   b"".join(batches), timeout=20.0)
    out: list[dict[str, Any] | RequestError] = []
    for outcome in h["results"]:
        try:
            out.append(decode_outcome(outcome))
        except RequestError as exc:
            out.append(exc)
    return out


def _stored(cluster: LocalCluster, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """queue -> [(offset, body)] of everything stored in `topic`."""
    async def main() -> dict[int, list[tuple[int, bytes]]]:
        # up to each queue's end, not up to the first empty poll (early on a busy machine)
        return {q: [(m.offset, m.body) for m in msgs]
                for q, msgs in (await drain(cluster.namesrv_addr, topic, f"check-{topic}")
                                ).items() if msgs}

    return anyio.run(main, backend="trio")


def test_each_batch_of_a_request_is_stored_at_its_queue_with_its_offsets(cluster):
    _create(cluster, "multi", 3)
    results = _produce(cluster, [
        encode_batch("multi", 0, [b"a", b"b"]),
        encode_batch("multi", 2, [b"c"]),
        encode_batch("multi", 0, [b"d"]),
        encode_batch("multi", 1, [b"e", b"f", b"g"]),
    ])
    assert all(isinstance(r, dict) for r in results), results
    assert [(r["base"], r["n"], r["dup"]) for r in results] == [  # type: ignore[index]
        (0, 2, False), (0, 1, False), (2, 1, False), (0, 3, False)]
    indexes = {r["index"] for r in results}  # type: ignore[index]
    assert len(indexes) == 1  # one entry holds them all
    shifts = [r["shift"] for r in results]  # type: ignore[index]
    assert shifts[0] == 0 and shifts == sorted(shifts) and len(set(shifts)) == 4
    assert _stored(cluster, "multi") == {
        0: [(0, b"a"), (1, b"b"), (2, b"d")],
        1: [(0, b"e"), (1, b"f"), (2, b"g")],
        2: [(0, b"c")],
    }


def test_a_bad_batch_among_good_ones_is_refused_alone(cluster):
    _create(cluster, "mixed", 2)
    good = encode_batch("mixed", 0, [b"first"])
    results = _produce(cluster, [
        good,
        b"RB" + b"\x00" * 10,  # not a batch
        encode_batch("mixed", 7, [b"no such queue"]),
        encode_batch("nowhere", 0, [b"no such topic"]),
        encode_batch("mixed", 1, [b"second"]),
        encode_batch("mixed", 0, [b"third"]),
    ])
    codes = [r.code if isinstance(r, RequestError) else Code.OK for r in results]
    assert codes == [Code.OK, Code.MALFORMED, Code.UNKNOWN_QUEUE, Code.UNKNOWN_TOPIC,
                     Code.OK, Code.OK]
    assert [(r["base"], r["n"]) for r in results if isinstance(r, dict)] == [
        (0, 1), (0, 1), (1, 1)]
    assert _stored(cluster, "mixed") == {0: [(0, b"first"), (1, b"third")],
                                         1: [(0, b"second")]}


def test_a_request_whose_sizes_do_not_fit_its_body_changes_nothing(cluster):
    _create(cluster, "whole", 1)
    batch = encode_batch("whole", 0, [b"x"])
    leader = wait_for(lambda: group_leader(cluster, "g0"), 30, "a leader of g0")
    with pytest.raises(RequestError) as e:
        request(cluster.node_addr(leader),
                {"op": int(Op.PRODUCE), "g": "g0", "sizes": [len(batch), 5]}, batch)
    assert e.value.code == Code.MALFORMED
    assert _stored(cluster, "whole") == {}


def test_an_idempotent_retry_of_a_multi_batch_request_is_deduplicated_per_batch(cluster):
    _create(cluster, "again", 2)
    pid = 4242
    first = [encode_batch("again", 0, [b"a0", b"a1"], pid=pid, seq=0),
             encode_batch("again", 1, [b"b0"], pid=pid, seq=0)]
    original = _produce(cluster, first)
    # the same request again (its answer was lost), with the next batch of queue 0 and
    # one that skips a sequence on queue 1
    retried = _produce(cluster, [*first,
                                 encode_batch("again", 0, [b"a2"], pid=pid, seq=1),
                                 encode_batch("again", 1, [b"b2"], pid=pid, seq=2)])
    assert all(isinstance(r, dict) and not r["dup"] for r in original), original
    for was, now in zip(original, retried[:2], strict=True):
        assert isinstance(was, dict) and isinstance(now, dict)
        assert now == {**was, "dup": True}
    assert isinstance(retried[2], dict) and (retried[2]["base"], retried[2]["dup"]) == (2, False)
    assert isinstance(retried[3], RequestError) and retried[3].code == Code.SEQUENCE_GAP
    assert _stored(cluster, "again") == {0: [(0, b"a0"), (1, b"a1"), (2, b"a2")],
                                         1: [(0, b"b0")]}


def test_the_producer_spreading_over_many_queues_keeps_each_queues_order(cluster):
    """The SDK groups the batches it has ready for a group into one request; an
    idempotent producer's per-queue sequences and every queue's order survive that."""
    _create(cluster, "spread", 32)

    async def main() -> list[tuple[int, int, str | None]]:
        async with Producer(cluster.namesrv_addr, idempotent=True,
                            selector="round_robin") as producer:
            futs = [await producer.send_async("spread", f"{k}".encode(), queue=k % 32)
                    for k in range(320)]
            return [(r.queue, r.offset, r.msg_id) for r in [await fut for fut in futs]]

    acked = anyio.run(main, backend="trio")
    # each send learnt its own batch's outcome from the shared requests
    assert [(q, o) for q, o, _ in acked] == [(k % 32, k // 32) for k in range(320)]
    stored = _stored(cluster, "spread")
    assert sorted(stored) == list(range(32))
    for q, records in stored.items():
        assert records == [(i, f"{q + 32 * i}".encode()) for i in range(10)]

    async def ids() -> dict[str, bytes]:
        drained = await drain(cluster.namesrv_addr, "spread", "ids")
        return {m.msg_id: m.body for msgs in drained.values() for m in msgs}

    by_id = anyio.run(ids, backend="trio")
    assert [by_id.get(mid or "") for _, _, mid in acked] == [f"{k}".encode() for k in range(320)]


def test_send_batch_puts_each_keyed_message_on_its_keys_queue(cluster: LocalCluster) -> None:
    """`send_batch` keeps the rule "a key keeps its queue": keys alice, bob and carol in
    one batch land where single sends of those keys land; keyless ones go together."""
    from raftmq.client import OutgoingMessage, key_queue

    _create(cluster, "batch-keys", 8)

    async def main() -> None:
        async with Producer(cluster.namesrv_addr) as producer:
            keyed = [OutgoingMessage(f"{k}-{i}".encode(), key=k)
                     for i in range(3) for k in ("alice", "bob", "carol")]
            batch = await producer.send_batch("batch-keys", [*keyed, b"plain-1", b"plain-2"])
            single = await producer.send("batch-keys", b"bob-again", key="bob")
        assert [r.queue for r in batch[:9]] == [key_queue(m.key or "", 8) for m in keyed]
        assert len({key_queue(k, 8) for k in ("alice", "bob", "carol")}) == 3
        assert batch[9].queue == batch[10].queue and batch[10].offset == batch[9].offset + 1
        assert single.queue == key_queue("bob", 8)
        by_queue: dict[int, list[int]] = {}
        for r in batch:
            by_queue.setdefault(r.queue, []).append(r.offset)
        assert all(offs == sorted(offs) for offs in by_queue.values())  # order kept

    anyio.run(main)
