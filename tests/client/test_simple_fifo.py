"""FIFO message groups and filters on the simple consumer, against real node processes:
a message group goes out one message at a time in order while other groups proceed on
other consumers, a nack redelivers the same message first, filtered-out messages are
passed for the consumer group for good (a bad filter is refused, sent raw or not), and
the blocking twins and the CLI carry a message group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from raftmq.client import (
    MESSAGE_GROUP_PROPERTY,
    Admin,
    BlockingProducer,
    BlockingSimpleConsumer,
    FilterError,
    MessageSelector,
    OutgoingMessage,
    Producer,
    ReceivedMessage,
    SimpleConsumer,
    key_queue,
)
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster
from tests.paths import REPO_ROOT
from transport.blocking import request
from wire.protocol import Code, Op, RequestError

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("fifo"), nodes=3, groups=1) as c:
        yield c
        assert c.unexpected_exits() == {}


@pytest.fixture
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return getattr(request, "param", "trio")


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def _topic(ns: str) -> str:
    name = fresh("fifo")
    async with Admin(ns) as admin:
        await admin.create_topic(name, queues=1)
    return name


def _names(msgs: list[ReceivedMessage]) -> list[bytes]:
    return [m.body for m in msgs]


@pytest.mark.anyio
async def test_a_message_group_stays_on_its_queue_whatever_the_selector(
        cluster: LocalCluster) -> None:
    """Without `queue=`, every message of a group goes to its group's queue (the stable
    hash of the group), one by one or in a batch, with the default selector or round
    robin: a group is in order only within one queue."""
    ns = cluster.namesrv_addr
    topic = fresh("fifo-q")
    async with Admin(ns) as admin:
        await admin.create_topic(topic, queues=4)
    groups = [f"order-{k}" for k in range(6)]
    assert len({key_queue(g, 4) for g in groups}) > 1  # the groups spread over queues
    for selector in ("key", "round_robin"):
        async with Producer(ns, selector=selector) as p:  # type: ignore[arg-type]
            for g in groups:
                for n in range(3):
                    r = await p.send(topic, f"{g}-{n}", message_group=g, key=f"k{n}")
                    assert r.queue == key_queue(g, 4), (selector, g, n)
            rs = await p.send_batch(topic, [
                OutgoingMessage(b"x", properties={MESSAGE_GROUP_PROPERTY: g}) for g in groups])
            assert [r.queue for r in rs] == [key_queue(g, 4) for g in groups], selector
    async with Producer(ns, selector=lambda total, m: 3) as p:  # a callable decides
        assert (await p.send(topic, b"y", message_group=groups[0])).queue == 3


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"], indirect=True)
async def test_a_group_goes_one_at_a_time_in_order_and_groups_run_in_parallel(
        cluster: LocalCluster, anyio_backend: str) -> None:
    ns = cluster.namesrv_addr
    topic = await _topic(ns)
    async with Producer(ns) as p:
        for body, group in ((b"a0", "a"), (b"b0", "b"), (b"a1", "a"), (b"x", None),
                            (b"b1", "b"), (b"a2", "a")):
            await p.send(topic, body, message_group=group)
    async with SimpleConsumer(ns, "fifo-cg", backoff=[0.05]) as c1, \
            SimpleConsumer(ns, "fifo-cg", backoff=[0.05]) as c2:
        first = await c1.receive(topic, 10, wait=2.0)
        assert _names(first) == [b"a0", b"b0", b"x"]  # one per group, and the groupless
        assert [m.message_group for m in first] == ["a", "b", None]
        assert await c2.receive(topic, 10, wait=0.5) == []  # a1, b1 wait behind a0, b0
        await c1.ack(first[0])
        [a1] = await c2.receive(topic, 10, wait=2.0)
        assert a1.body == b"a1"  # b is still blocked by b0
        await c2.nack(a1)  # visible again after 0.05 s: a1 again, never a2
        [again] = await c1.receive(topic, 10, wait=5.0)
        assert (again.body, again.deliveries) == (b"a1", 2)
        await c1.ack(again)
        await c1.dead_letter(first[1], "poison")  # b0 to the dead letters frees b
        rest = await c2.receive(topic, 10, wait=2.0)
        assert sorted(_names(rest)) == [b"a2", b"b1"]
        for m in [*rest, first[2]]:
            await c2.ack(m)
        assert await c1.receive(topic, 10, wait=0.3) == []


@pytest.mark.anyio
async def test_filters_pass_messages_for_the_group_for_good(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = await _topic(ns)
    async with Producer(ns) as p:
        for i in range(12):
            await p.send(topic, OutgoingMessage(b"m%d" % i, tags="odd" if i % 2 else "even",
                                                properties={"n": str(i)}))
    async with SimpleConsumer(ns, "sql-cg") as c:
        got: list[ReceivedMessage] = []
        with anyio.fail_after(30):
            while len(got) < 3:
                got += await c.receive(topic, 10, wait=1.0,
                                       selector=MessageSelector.by_sql("n >= 6", tags="odd"))
        assert _names(got) == [b"m7", b"m9", b"m11"]
        # the messages passed are gone for the group, whatever it selects later
        assert await c.receive(topic, 10, wait=0.3, selector="*") == []
        with pytest.raises(FilterError):
            await c.receive(topic, selector=MessageSelector.by_sql("n >"))
    async with SimpleConsumer(ns, "tag-cg", subscriptions={topic: "even"}) as c:
        got = []
        with anyio.fail_after(30):
            while len(got) < 6:
                got += await c.receive(topic, 10, wait=1.0)
        assert _names(got) == [b"m%d" % i for i in range(0, 12, 2)]
    async with SimpleConsumer(ns, "all-cg") as c:  # another group: everything
        got = []
        with anyio.fail_after(30):
            while len(got) < 12:
                got += await c.receive(topic, 12, wait=1.0)
        assert len(got) == 12


def test_a_bad_filter_sent_raw_is_malformed(cluster: LocalCluster) -> None:
    topic = anyio.run(_topic, cluster.namesrv_addr)
    node = cluster.leaders()["g0"]
    assert node is not None
    addr = cluster.node_addr(node)
    base = {"op": int(Op.RECEIVE), "cg": "raw-cg", "topic": topic, "queue": 0, "wait_ms": 0}
    for extra, where in (({"sql": "n >"}, "column 4"),
                         ({"sql": "x" * 4097}, "4096"), ({"tags": "a"}, "tags")):
        with pytest.raises(RequestError) as exc:
            request(addr, {**base, **extra})
        assert exc.value.code == Code.MALFORMED and where in exc.value.message, exc.value


def test_the_blocking_twins_and_the_cli_carry_a_message_group(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = anyio.run(_topic, ns)
    with BlockingProducer(ns) as p:
        p.send(topic, b"g0", message_group="g")
        with pytest.raises(ValueError, match="not empty"):
            p.send(topic, b"bad", message_group="")
        with pytest.raises(ValueError, match="255"):
            p.send(topic, b"bad", message_group="x" * 256)
    out = subprocess.run(
        [sys.executable, "-m", "raftmq", "send", "g1", "--topic", topic, "--message-group",
         "g", "--json", "--namesrv", ns], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["offset"] == 1
    bad = subprocess.run(
        [sys.executable, "-m", "raftmq", "send", "x", "--topic", topic, "--message-group",
         "", "--namesrv", ns], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--message-group" in bad.stderr
    with BlockingSimpleConsumer(ns, "blocking-fifo") as c:
        [m] = c.receive(topic, 10, wait=2.0)
        assert (m.body, m.properties[MESSAGE_GROUP_PROPERTY]) == (b"g0", "g")
        assert c.receive(topic, 10, wait=0.3) == []  # g1 waits behind g0
        c.ack(m)
        [m1] = c.receive(topic, 10, wait=2.0, selector=MessageSelector.by_tag("*"))
        assert (m1.body, m1.message_group) == (b"g1", "g")


def test_status_shows_the_groups_in_flight_and_the_messages_held(
        cluster: LocalCluster) -> None:
    """STATUS (and `raftmq status`): per consumer group, topic and queue, how many
    message groups have a message in flight and how many messages wait behind them."""
    ns = cluster.namesrv_addr
    topic = anyio.run(_topic, ns)
    with BlockingProducer(ns) as p:
        for body, group in ((b"a1", "a"), (b"a2", "a"), (b"a3", "a"), (b"b1", "b")):
            p.send(topic, body, message_group=group)

    def fifo() -> Any:
        out = subprocess.run([sys.executable, "-m", "raftmq", "status", "--json",
                              "--namesrv", ns], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["groups"]["g0"]["fifo"].get("status-fifo")

    with BlockingSimpleConsumer(ns, "status-fifo") as c:
        got = c.receive(topic, 10, wait=2.0)
        assert sorted(_names(got)) == [b"a1", b"b1"]
        assert fifo() == {topic: {"0": [2, 2]}}  # a2, a3 wait behind a1
        for m in got:
            c.ack(m)
        assert fifo() == {topic: {"0": [0, 2]}}
        assert _names(c.receive(topic, 10, wait=2.0)) == [b"a2"]
        assert fifo() == {topic: {"0": [1, 1]}}
    table = subprocess.run([sys.executable, "-m", "raftmq", "status", "--namesrv", ns],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": "200"})
    assert "fifo groups/held" in table.stdout, table.stdout
