"""The simple consumer against real node processes: receive and ack, several consumers on
one queue, redelivery after the invisible time with a refused stale ack, nack with a
delay, dead letters after the last delivery and their resend, the blocking twin, and
offset-based consumers reading the same topic unchanged."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import anyio
import pytest

from raftmq.client import (
    Admin,
    BlockingAdmin,
    BlockingSimpleConsumer,
    Producer,
    PullConsumer,
    ReceivedMessage,
    SimpleConsumer,
    StaleReceiptError,
)
from raftmq.localcluster import LocalCluster
from tests.conftest import group_leader, live_cluster, node_status

pytestmark = pytest.mark.live

_names = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("simple"), nodes=3, groups=3) as c:
        yield c
        assert c.unexpected_exits() == {}


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return getattr(request, "param", "trio")


async def _topic(ns: str, queues: int = 1) -> str:
    name = f"simple-{next(_names)}"
    async with Admin(ns) as admin:
        await admin.create_topic(name, queues=queues)
    return name


async def _send(ns: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer(ns) as producer:
        for b in bodies:
            await producer.send(topic, b)


async def _receive_all(c: SimpleConsumer, topic: str, n: int, *, invisible: float = 30.0,
                       timeout: float = 30.0) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    with anyio.fail_after(timeout):
        while len(got) < n:
            got += await c.receive(topic, n - len(got), invisible=invisible, wait=1.0)
    return got


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"], indirect=True)
async def test_receive_and_ack_and_offset_consumers_read_the_topic_unchanged(
        cluster: LocalCluster, anyio_backend: str) -> None:
    ns = cluster.namesrv_addr
    topic = await _topic(ns, queues=3)
    bodies = [b"m%d" % i for i in range(12)]
    await _send(ns, topic, bodies)
    async with SimpleConsumer(ns, "acking") as c:
        got = await _receive_all(c, topic, 12)
        assert sorted(m.body for m in got) == sorted(bodies)
        assert all(m.deliveries == 1 and m.receipt.consumer_group == "acking" for m in got)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:  # together: batched per queue
                for m in got:
                    tg.start_soon(c.ack, m)
        assert await c.receive(topic, 10, wait=0.3) == []
        with pytest.raises(StaleReceiptError):
            await c.ack(got[0])  # acked already
    async with PullConsumer(ns, "by-offsets") as pull:
        pull.assign(topic)
        seen: list[bytes] = []
        with anyio.fail_after(30):
            while len(seen) < 12:
                seen += [m.body for m in await pull.poll(1.0)]
        assert sorted(seen) == sorted(bodies)


@pytest.mark.anyio
async def test_two_consumers_on_one_queue_never_hold_the_same_message(
        cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = await _topic(ns)
    await _send(ns, topic, [b"x%d" % i for i in range(40)])
    held: dict[str, list[int]] = {"a": [], "b": []}

    async def consume(name: str, c: SimpleConsumer) -> None:
        while True:
            msgs = await c.receive(topic, 3, wait=0.5)
            if not msgs:
                return
            held[name] += [m.offset for m in msgs]
            await anyio.sleep(0.01)

    async with SimpleConsumer(ns, "sharing") as a, SimpleConsumer(ns, "sharing") as b:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume, "a", a)
                tg.start_soon(consume, "b", b)
    assert not set(held["a"]) & set(held["b"])
    assert sorted(held["a"] + held["b"]) == list(range(40))
    assert held["a"] and held["b"]  # both took part


@pytest.mark.anyio
async def test_an_expired_delivery_comes_again_and_its_first_receipt_is_refused(
        cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = await _topic(ns)
    await _send(ns, topic, [b"slow"])
    async with SimpleConsumer(ns, "slowpoke") as first, SimpleConsumer(ns, "slowpoke") as other:
        [m1] = await _receive_all(first, topic, 1, invisible=0.5)
        assert m1.deliveries == 1
        assert await other.receive(topic, 1, wait=0) == []  # invisible to the group
        [m2] = await _receive_all(other, topic, 1, invisible=30)
        assert (m2.offset, m2.deliveries, m2.body) == (m1.offset, 2, b"slow")
        assert m2.receipt.handle != m1.receipt.handle
        with pytest.raises(StaleReceiptError):
            await first.ack(m1)
        with pytest.raises(StaleReceiptError):
            await first.change_invisible(m1, 10)
        with pytest.raises(StaleReceiptError):
            await first.nack(m1)
        await other.change_invisible(m2, 60)
        await other.ack(m2)
        assert await first.receive(topic, 1, wait=0.8) == []


@pytest.mark.anyio
async def test_an_idle_receive_waits_without_writing_the_log(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = await _topic(ns)
    async with Admin(ns) as admin:
        gid = (await admin.describe_topic(topic)).queues[0].group
    assert gid is not None
    leader = group_leader(cluster, gid)
    assert leader is not None
    async with SimpleConsumer(ns, "idle") as c:
        before = node_status(cluster, leader, gid)["last"]
        started = anyio.current_time()
        assert await c.receive(topic, 5, wait=1.0) == []
        assert anyio.current_time() - started >= 0.9  # it was held
        assert node_status(cluster, leader, gid)["last"] == before
        # a message sent while a receive waits wakes it
        async with anyio.create_task_group() as tg:
            tg.start_soon(_send, ns, topic, [b"wake"])
            with anyio.fail_after(10):
                [m] = await c.receive(topic, 5, wait=8.0)
        assert m.body == b"wake"
        await c.ack(m)
        # a receive given up early leaves its long polls in flight at the nodes: the
        # next receive's wait still polls every queue until it is over
        with anyio.move_on_after(0.2):
            await c.receive(topic, 5, wait=1.0)

        async def send_later() -> None:
            await anyio.sleep(2.5)  # after the first receive's polls ended
            await _send(ns, topic, [b"later"])

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_later)
            with anyio.fail_after(15):
                [m] = await c.receive(topic, 5, wait=12.0)
        assert m.body == b"later"


@pytest.mark.anyio
async def test_a_nack_with_a_delay_comes_back_after_it(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = await _topic(ns)
    await _send(ns, topic, [b"again"])
    async with SimpleConsumer(ns, "nacking") as c:
        [m] = await _receive_all(c, topic, 1)
        nacked = anyio.current_time()
        await c.nack(m, delay=1.0, error="not now")
        assert await c.receive(topic, 1, wait=0) == []
        [again] = await _receive_all(c, topic, 1)
        assert anyio.current_time() - nacked >= 0.9
        assert (again.offset, again.deliveries) == (m.offset, 2)
        await c.ack(again)


async def _fail_until_dead(c: SimpleConsumer, topic: str, times: int) -> list[int]:
    counts = []
    for _ in range(times):
        [m] = await _receive_all(c, topic, 1)
        counts.append(m.deliveries)
        await c.nack(m, error=f"failed {m.deliveries}")
    return counts


@pytest.mark.anyio
async def test_after_max_deliveries_a_message_is_a_dead_letter_and_a_resend_is_consumed_once(
        cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = await _topic(ns)
    await _send(ns, topic, [b"poison?"])
    async with SimpleConsumer(ns, "dying", max_deliveries=3, backoff=[0.05, 0.1]) as c:
        assert await _fail_until_dead(c, topic, 3) == [1, 2, 3]
        assert await c.receive(topic, 1, wait=0.5) == []
        async with Admin(ns) as admin:
            [dead] = await admin.dlq_list("dying")
            assert (dead.topic, dead.offset, dead.deliveries, dead.error) == (
                topic, 0, 3, "failed 3")
            shown = await admin.dlq_show("dying", dead.id)
            assert shown.message is not None and shown.message.body == b"poison?"
            assert await admin.dlq_resend("dying", [dead.id]) == 1
            assert await admin.dlq_list("dying") == []
        [back] = await _receive_all(c, topic, 1)
        assert (back.body, back.deliveries, back.offset) == (b"poison?", 1, 1)
        await c.ack(back)
        assert await c.receive(topic, 1, wait=0.5) == []
        # poison straight to the dead letters, then purged
        await _send(ns, topic, [b"really poison"])
        [p] = await _receive_all(c, topic, 1)
        await c.dead_letter(p, "cannot parse")
        async with Admin(ns) as admin:
            [dead] = await admin.dlq_list("dying")
            assert (dead.deliveries, dead.error) == (1, "cannot parse")
            assert await admin.dlq_purge("dying", "all") == 1
            assert await admin.dlq_list("dying") == []


@pytest.mark.anyio
async def test_the_default_count_of_sixteen_deliveries(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = await _topic(ns)
    await _send(ns, topic, [b"sixteen"])
    async with SimpleConsumer(ns, "patient", backoff=[0.01]) as c:
        assert await _fail_until_dead(c, topic, 16) == list(range(1, 17))
        assert await c.receive(topic, 1, wait=0.3) == []
    async with Admin(ns) as admin:
        [dead] = await admin.dlq_list("patient")
        assert (dead.deliveries, dead.error) == (16, "failed 16")


def test_the_blocking_twin(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = anyio.run(_topic, ns)
    anyio.run(_send, ns, topic, [b"b1", b"b2"])
    with BlockingSimpleConsumer(ns, "blocking", backoff=[0.05]) as c:
        got: list[ReceivedMessage] = []
        while len(got) < 2:
            got += c.receive(topic, 2, wait=1.0)
        c.ack(got[0])
        c.nack(got[1])
        [again] = c.receive(topic, 1, wait=5.0)
        assert (again.offset, again.deliveries) == (got[1].offset, 2)
        with pytest.raises(StaleReceiptError):
            c.ack(got[1])
        c.dead_letter(again, "no")
    with BlockingAdmin(ns) as admin:
        [dead] = admin.dlq_list("blocking")
        assert dead.offset == got[1].offset and admin.dlq_purge("blocking", [dead.id]) == 1
