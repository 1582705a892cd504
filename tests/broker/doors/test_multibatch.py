"""Batches for many queues in one Raft entry, over real node processes.

The producer gathers what it has ready for a group into one PRODUCE request and the
leader stores the request's batches as one entry: the messages of many queues share
one entry index, and every id, key and offset still resolves. An idempotent retry of
such an entry after its leader died unanswered is recognised batch by batch at the new
leader, and a producer that keeps several batches of each queue in flight through a
leader failover still stores every queue in the order it was sent.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from broker.doors.service import CRASH_BEFORE_ANSWER_EXIT
from raftmq.client import Admin, OutgoingMessage, Producer, SendResult
from raftmq.client.producer import SendAttempt
from tests.conftest import group_leader, live_cluster, wait_for
from tests.live_cluster import CrashAskingPool, drain

pytestmark = pytest.mark.live


async def _read_all(namesrv: str, topic: str, cg: str) -> dict[int, list[tuple[int, bytes]]]:
    """queue -> [(offset, body)] of everything stored in `topic`, read up to each queue's
    end (not up to the first empty poll, which a busy machine can give early)."""
    return {q: [(m.offset, m.body) for m in msgs]
            for q, msgs in (await drain(namesrv, topic, cg)).items() if msgs}


def test_many_queues_share_one_entry_and_every_id_and_key_resolves(tmp_path: Path) -> None:
    with live_cluster(tmp_path, groups=1) as cluster:

        async def main() -> None:
            topics = [f"wide-{i}" for i in range(20)]
            async with Admin(cluster.namesrv_addr) as admin:
                for t in topics:
                    await admin.create_topic(t, 4)
            async with Producer(cluster.namesrv_addr) as producer:
                for t in topics:  # routes known, connection open: no send below waits
                    await producer.send(t, b"warm", queue=0)
                futs = [await producer.send_async(
                            topics[k % 20], OutgoingMessage(b"m%d" % k, key=f"k{k % 7}"),
                            queue=(k // 20) % 4)
                        for k in range(160)]
                results: list[SendResult] = [await f for f in futs]
            # one request carried the batches of all 80 queues: one entry holds them
            indexes = {r.msg_id.split(":")[1] for r in results if r.msg_id}
            assert len(indexes) == 1, indexes
            assert len({(r.topic, r.queue) for r in results}) == 80
            async with Admin(cluster.namesrv_addr) as admin:
                for k, r in enumerate(results):
                    assert r.msg_id is not None
                    m = await admin.get_message(r.msg_id)
                    assert (m.topic, m.queue, m.offset, m.body) == (r.topic, r.queue, r.offset,
                                                                    b"m%d" % k)
                found = await admin.query_key(topics[3], "k2")
                want = sorted(b"m%d" % k for k in range(160) if k % 20 == 3 and k % 7 == 2)
                assert sorted(m.body for m in found) == want
            stored = await _read_all(cluster.namesrv_addr, topics[5], "check")
            warm = [b"warm"]
            assert {q: [b for _, b in v] for q, v in stored.items()} == {
                q: (warm if q == 0 else []) + [b"m%d" % (20 * q + 5), b"m%d" % (20 * q + 85)]
                for q in range(4)}

        anyio.run(main, backend="trio")


def test_a_multi_batch_entry_retried_after_its_leader_died_is_deduplicated_batch_by_batch(
    tmp_path: Path,
) -> None:
    """Node 1 commits the first request (batches of 8 queues, one entry) and exits before
    answering; the producer retries those batches at the new leader, which answers each
    as a duplicate of its first copy (same offsets, ids naming the stored records)."""
    with live_cluster(
        tmp_path, groups=1, env={ALLOW_MUTATIONS_ENV: "1"},
        node_overrides={1: {"test_mutations": ["crash-before-answer"]}},
    ) as cluster:
        wait_for(lambda: group_leader(cluster, "g0") == 1, 60, "node 1 leading g0")
        attempts: list[SendAttempt] = []

        async def main() -> tuple[list[SendResult], list[SendResult]]:
            async with Admin(cluster.namesrv_addr) as admin:
                await admin.create_topic("a", 8)
            async with CrashAskingPool() as pool, Producer(
                cluster.namesrv_addr, idempotent=True, retries=10, pool=pool,
                on_attempt=attempts.append,
            ) as producer:
                # one route lookup, on the first send; the others join it unhindered
                first = [await producer.send_async("a", b"a%d" % q, queue=q) for q in range(8)]
                firsts = [await f for f in first]
                later = [await producer.send_async("a", b"a%d-later" % q, queue=q)
                         for q in range(8)]
                laters = [await f for f in later]
            return firsts, laters

        firsts, laters = anyio.run(main, backend="trio")
        assert cluster.unexpected_exits() == {"n1": CRASH_BEFORE_ANSWER_EXIT}
        # the 8 batches went out together to node 1, were stored as one entry, and came
        # back together as repeats of it
        assert [(a.attempt, a.addr) for a in attempts[:8]] == [(1, cluster.node_addr(1))] * 8
        assert all(r.dup for r in firsts), firsts
        assert len({r.msg_id.split(":")[1] for r in firsts if r.msg_id}) == 1
        assert [(r.queue, r.offset) for r in firsts] == [(q, 0) for q in range(8)]
        assert not any(r.dup for r in laters)
        assert [r.offset for r in laters] == [1] * 8

        async def check() -> None:
            async with Admin(cluster.namesrv_addr) as admin:
                for r in firsts + laters:
                    assert r.msg_id is not None
                    m = await admin.get_message(r.msg_id)
                    assert (m.topic, m.queue, m.offset) == (r.topic, r.queue, r.offset)
            stored = await _read_all(cluster.namesrv_addr, "a", "check")
            assert stored == {q: [(0, b"a%d" % q), (1, b"a%d-later" % q)] for q in range(8)}

        anyio.run(check, backend="trio")


def test_each_queue_keeps_its_order_through_a_leader_failover(tmp_path: Path) -> None:
    """A plain producer keeps up to 4 batches of each of 24 queues in flight while the
    leader is killed: sends time out, are retried and redirected. Whatever was stored,
    each queue holds the sends' first copies in the order they were sent, and every
    acknowledged message is there."""
    with live_cluster(tmp_path, groups=1) as cluster:
        acked: dict[tuple[str, int], list[int]] = {}
        sent: dict[tuple[str, int], list[int]] = {}
        stop = threading.Event()
        attempts: list[SendAttempt] = []

        async def produce() -> None:
            async with Admin(cluster.namesrv_addr) as admin:
                for t in ("x", "y", "z"):
                    await admin.create_topic(t, 8)
            async with Producer(cluster.namesrv_addr, max_in_flight=4, batch_max_messages=8,
                                retries=20, send_timeout=2.0,
                                on_attempt=attempts.append) as producer:

                def done(key: tuple[str, int], k: int) -> Any:
                    def cb(fut: Any) -> None:
                        if fut.exception() is None:
                            acked.setdefault(key, []).append(k)
                    return cb

                k = 0
                deadline = time.monotonic() + 20
                while not stop.is_set() and time.monotonic() < deadline:
                    for _ in range(48):
                        t, q = ("x", "y", "z")[k % 3], (k // 3) % 8
                        sent.setdefault((t, q), []).append(k)
                        await producer.send_async(t, b"%d" % k, queue=q, callback=done((t, q), k))
                        k += 1
                    await anyio.sleep(0.005)
                await producer.flush()

        def failover() -> None:
            time.sleep(2.0)
            leader = wait_for(lambda: group_leader(cluster, "g0"), 30, "a leader of g0")
            cluster.kill(leader)
            wait_for(lambda: group_leader(cluster, "g0", among=[n for n in cluster.node_ids
                                                              if n != leader]),
                     60, "a new leader of g0")
            time.sleep(2.0)
            cluster.restart(leader)
            time.sleep(2.0)
            stop.set()

        killer = threading.Thread(target=failover)
        killer.start()
        try:
            anyio.run(produce, backend="trio")
        finally:
            stop.set()
            killer.join()

        async def read() -> dict[str, dict[int, list[tuple[int, bytes]]]]:
            return {t: await _read_all(cluster.namesrv_addr, t, f"order-{t}")
                    for t in ("x", "y", "z")}

        stored = anyio.run(read, backend="trio")
        assert sum(len(v) for v in acked.values()) > 0
        assert any(a.attempt > 1 for a in attempts)  # the failover made batches go again
        for (t, q), ks in sent.items():
            bodies = [int(b) for _, b in stored.get(t, {}).get(q, [])]
            firsts = list(dict.fromkeys(bodies))  # a retried send may be stored twice
            assert firsts == sorted(firsts), (t, q, firsts)  # never out of send order
            assert set(acked.get((t, q), [])) <= set(firsts), (t, q)  # nothing acked lost
            assert set(firsts) <= set(ks)
