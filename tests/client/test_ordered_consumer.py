"""Push consumers with broker-held queue locks on a real cluster: a rebalance while
messages flow (a third consumer joins, one leaves) hands no message to two consumers,
concurrent or orderly; orderly consumers handle each queue in offset order, retry a
failed message in place, and after `max_attempts` send it to the dead letters or hold
the queue at it; a queue whose lock another client holds waits for it.

Consumers run with short intervals (0.2 s) so membership changes settle quickly; every
wait is for an event, bounded only as a safety net.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from raftmq.client import Admin, Message, Producer, PushConsumer
from raftmq.client.blocking import BlockingPushConsumer
from raftmq.client.queuelocks import group_locks, lock_queue
from raftmq.client.reads import query_offset
from raftmq.client.routes import open_routes
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster

pytestmark = pytest.mark.live

QUEUES = 6
KEYS = 12
FAST = {"heartbeat_interval": 0.2, "rebalance_interval": 0.2, "commit_interval": 0.2,
        "long_poll_ms": 200}
BOUND = 90.0  # a safety net for event waits, never a measurement


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("ordered")) as c:
        yield c


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def until(predicate: Any, what: str) -> None:
    with anyio.fail_after(BOUND):
        while not predicate():
            await anyio.sleep(0.05)


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_a_rebalance_while_messages_flow_duplicates_nothing(cluster: LocalCluster,
                                                            orderly: bool) -> None:
    topic, group = fresh("flow"), fresh("cg")
    handled: list[tuple[str, int, int, str, int]] = []  # consumer, queue, offset, key, seq
    total = 360

    def handler(name: str) -> Any:
        async def handle(msgs: list[Message]) -> bool:
            for m in msgs:
                key, seq = m.body.decode().split(":")
                handled.append((name, m.queue, m.offset, key, int(seq)))
            await anyio.sleep(0.002)
            return True
        return handle

    async def produce() -> None:
        async with Producer(cluster.namesrv_addr) as producer:
            for i in range(total):
                key = f"k{i % KEYS}"
                await producer.send(topic, f"{key}:{i // KEYS}".encode(), key=key)
                if i % 5 == 0:
                    await anyio.sleep(0.05)  # a steady flow while consumers come and go

    consumers: dict[str, PushConsumer] = {}
    stops: dict[str, anyio.Event] = {}

    async def run_consumer(name: str) -> None:
        stops[name] = anyio.Event()
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handler(name),
                                client_id=name, orderly=orderly, **FAST) as c:
            consumers[name] = c
            await stops[name].wait()

    async def main() -> None:
        async with Admin(cluster.namesrv_addr) as admin:
            await admin.create_topic(topic, QUEUES)
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_consumer, "A")
            tg.start_soon(run_consumer, "B")
            tg.start_soon(produce)
            await until(lambda: len(handled) >= total // 8, "A and B consuming")
            tg.start_soon(run_consumer, "C")  # joins while messages flow
            await until(lambda: "C" in consumers and consumers["C"].assignment(),
                        "C taking queues")
            await until(lambda: len(handled) >= total // 3, "three consuming")
            stops["A"].set()  # A leaves while messages flow
            await until(lambda: len(handled) >= total, "every message handled")
            await anyio.sleep(0.5)  # anything handled twice would show by now
            await until(lambda: set(consumers["B"].assignment())
                        | set(consumers["C"].assignment())
                        == {(topic, q) for q in range(QUEUES)}, "B and C sharing")
            stops["B"].set()
            stops["C"].set()
        # every consumer let go of its locks when it closed
        stack, routes, _tg = await open_routes(None, [cluster.namesrv_addr], 3.0)
        async with stack:
            assert [lk for lk in await group_locks(routes, group) if lk.live] == []

    anyio.run(main, backend="trio")
    twice = [k for k, n in Counter((q, o) for _, q, o, _, _ in handled).items() if n > 1]
    assert not twice, f"handled twice: {twice}"
    assert len(handled) == total
    if orderly:
        by_queue: dict[int, list[int]] = defaultdict(list)
        by_key: dict[str, list[int]] = defaultdict(list)
        for _, q, o, key, seq in handled:
            by_queue[q].append(o)
            by_key[key].append(seq)
        for q, offsets in by_queue.items():
            assert offsets == sorted(offsets), f"queue {q} out of order"
        for key, seqs in by_key.items():
            assert seqs == list(range(len(seqs))), f"key {key} out of order: {seqs}"


async def _setup(cluster: LocalCluster, bodies: list[bytes]) -> str:
    topic = fresh("one")
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, 1)
    async with Producer(cluster.namesrv_addr) as producer:
        for body in bodies:
            await producer.send(topic, body)
    return topic


def test_orderly_retries_in_place_then_dead_letters(cluster: LocalCluster) -> None:
    group = fresh("cg")
    seen: list[bytes] = []
    fails = {b"flaky": 2, b"poison": 99}

    async def handle(msgs: list[Message]) -> bool:
        (m,) = msgs
        seen.append(m.body)
        if fails.get(m.body, 0) > 0:
            fails[m.body] -= 1
            raise ValueError(f"cannot handle {m.body!r}")
        return True

    async def main() -> None:
        topic = await _setup(cluster, [b"a", b"flaky", b"b", b"poison", b"c"])
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handle, orderly=True,
                                suspend=0.05, max_attempts=3, **FAST):
            await until(lambda: b"c" in seen, "the last message")
            async with Admin(cluster.namesrv_addr) as admin:
                (dead,) = await admin.dlq_list(group)
        assert (dead.topic, dead.offset) == (topic, 3) and "cannot handle" in dead.error

    anyio.run(main)
    # retried in place: nothing after a failing message ran before it succeeded or died
    assert seen == [b"a", b"flaky", b"flaky", b"flaky", b"b", b"poison", b"poison",
                    b"poison", b"c"]


def test_orderly_hold_blocks_the_queue_and_the_blocking_facade_shows_it(
        cluster: LocalCluster) -> None:
    group = fresh("cg")
    seen: list[bytes] = []
    topic = anyio.run(_setup, cluster, [b"a", b"stuck", b"b"])
    healed = False

    def handle(msgs: list[Message]) -> bool:  # plain: runs in a worker thread
        seen.append(msgs[0].body)
        return msgs[0].body != b"stuck" or healed

    with BlockingPushConsumer(cluster.namesrv_addr, group, [topic], handle, orderly=True,
                              suspend=0.05, max_attempts=2, on_exhausted="hold",
                              **FAST) as consumer:
        anyio.run(until, lambda: bool(consumer.held()), "the queue held")
        (held,) = consumer.held()
        assert (held.topic, held.offset, held.attempts >= 2) == (topic, 1, True)
        assert b"b" not in seen
        healed = True
        anyio.run(until, lambda: b"b" in seen, "the queue going on")
        assert consumer.held() == []


def test_a_queue_locked_by_another_client_waits_for_it(cluster: LocalCluster) -> None:
    group = fresh("cg")
    seen: list[bytes] = []

    async def handle(msgs: list[Message]) -> bool:
        seen.extend(m.body for m in msgs)
        return True

    async def main() -> None:
        topic = await _setup(cluster, [b"x"])
        stack, routes, _tg = await open_routes(None, [cluster.namesrv_addr], 3.0)
        async with stack:
            # a crashed owner's lock: held until its lease runs out, 2 s from now
            assert await lock_queue(routes, group, topic, 0, "crashed", 2000) is not None
            async with PushConsumer(cluster.namesrv_addr, group, [topic], handle,
                                    orderly=True, **FAST) as consumer:
                await anyio.sleep(1.0)
                assert seen == [] and consumer.assignment() == []
                await until(lambda: seen == [b"x"], "the lease running out")

    anyio.run(main)


def test_on_revoke_comes_after_the_final_commit_and_before_the_unlock(
        cluster: LocalCluster) -> None:
    group = fresh("cg")
    calls: list[tuple[str, list[tuple[str, int]]]] = []
    seen_at_revoke: list[tuple[int, list[str]]] = []
    locked_at_assign: list[list[str]] = []

    async def handle(msgs: list[Message]) -> bool:
        return True

    async def main() -> None:
        topic = await _setup(cluster, [b"a", b"b", b"c"])
        stack, routes, _tg = await open_routes(None, [cluster.namesrv_addr], 3.0)
        async with stack:
            async def on_assign(queues: list[tuple[str, int]]) -> None:
                calls.append(("assign", queues))
                locked_at_assign.append(
                    [lk.client for lk in await group_locks(routes, group) if lk.live])

            async def on_revoke(queues: list[tuple[str, int]]) -> None:
                calls.append(("revoke", queues))
                seen_at_revoke.append((
                    await query_offset(routes, group, topic, 0),
                    [lk.client for lk in await group_locks(routes, group) if lk.live]))

            async with PushConsumer(cluster.namesrv_addr, group, [topic], handle,
                                    orderly=True, client_id="holder", on_assign=on_assign,
                                    on_revoke=on_revoke, **FAST) as consumer:
                await until(lambda: consumer.offsets().get((topic, 0)) == 3, "all handled")
            assert calls == [("assign", [(topic, 0)]), ("revoke", [(topic, 0)])]
            assert locked_at_assign == [["holder"]]  # held before anything was handled
            # committed, still locked by this consumer; unlocked once it closed
            assert seen_at_revoke == [(3, ["holder"])]
            assert [lk for lk in await group_locks(routes, group) if lk.live] == []

    anyio.run(main)
