"""A push consumer's failed messages are retried by the broker (the default,
`retry="broker"`), over real processes: sent back to the group's replicated receipts, the
offset moves on, the message comes again after the backoff with its delivery count, a
consumer that dies meanwhile forgets nothing (another member gets the retry), after
`max_reconsume_times` retries it is a dead letter with its history, `PoisonMessage`
sends it there at once, and one failing message holds back no other."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from raftmq.client import Admin, Message, PoisonMessage, Producer, PushConsumer
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster

pytestmark = pytest.mark.live

FAST = {"heartbeat_interval": 0.2, "rebalance_interval": 0.2, "commit_interval": 0.2,
        "long_poll_ms": 200}
BOUND = 60.0  # a safety net for event waits, never a measurement
BACKOFF = (0.4, 0.4, 0.4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("push-retries")) as c:
        yield c


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def setup(cluster: LocalCluster, bodies: list[bytes], key: str = "") -> str:
    topic = fresh("retries")
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, 2)
    async with Producer(cluster.namesrv_addr) as p:
        for b in bodies:
            await p.send(topic, b, key=key or None, queue=0)
    return topic


async def until(predicate: Any, what: str) -> None:
    with anyio.fail_after(BOUND):
        while not predicate():
            await anyio.sleep(0.05)


def test_a_failed_message_comes_again_after_its_backoff_counting_deliveries(
        cluster: LocalCluster) -> None:
    seen: list[tuple[bytes, int, float]] = []

    async def handler(msgs: list[Message]) -> bool:
        m = msgs[0]
        deliveries = getattr(m, "deliveries", 1)
        seen.append((m.body, deliveries, time.monotonic()))
        return not (m.body == b"flaky" and deliveries < 3)

    async def main() -> None:
        topic = await setup(cluster, [b"flaky", b"a", b"b"], key="k")
        group = fresh("cg")
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handler,
                                retry_backoff=BACKOFF, **FAST):
            await until(lambda: [s for s in seen if s[0] == b"flaky" and s[1] == 3],
                        "the third delivery")
            await anyio.sleep(1.0)  # nothing more comes: it was acked
        flaky = [s for s in seen if s[0] == b"flaky"]
        assert [d for _b, d, _t in flaky] == [1, 2, 3]
        assert all(b - a >= BACKOFF[0] - 0.05 for a, b in zip(
            [t for *_x, t in flaky], [t for *_x, t in flaky][1:], strict=False))
        # the key's later messages did not wait for the retries (broker retries)
        order = [b for b, _d, _t in seen]
        assert order.index(b"a") < order.index(b"flaky", 1)
        assert Counter(order) == Counter({b"flaky": 3, b"a": 1, b"b": 1})
        async with Admin(cluster.namesrv_addr) as admin:
            committed = await admin.committed_offset(group, topic, 0)
        assert committed == 3  # the offset moved on past the sent-back message

    anyio.run(main)


def test_a_message_that_keeps_failing_is_a_dead_letter_with_its_history(
        cluster: LocalCluster) -> None:
    deliveries: list[int] = []

    async def handler(msgs: list[Message]) -> None:
        if msgs[0].body == b"bad":
            deliveries.append(getattr(msgs[0], "deliveries", 1))
            raise ValueError("cannot parse")

    async def main() -> None:
        topic = await setup(cluster, [b"bad", b"good"])
        group = fresh("cg")
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handler,
                                retry_backoff=BACKOFF, max_reconsume_times=2, **FAST):
            async with Admin(cluster.namesrv_addr) as admin:
                with anyio.fail_after(BOUND):
                    while not await admin.dlq_list(group):
                        await anyio.sleep(0.1)
                (dead,) = await admin.dlq_list(group)
        assert deliveries == [1, 2, 3]
        assert (dead.topic, dead.queue, dead.offset, dead.deliveries) == (topic, 0, 0, 3)
        assert "ValueError: cannot parse" in dead.error

    anyio.run(main)


def test_poison_goes_to_the_dead_letters_at_once(cluster: LocalCluster) -> None:
    calls: list[bytes] = []

    async def handler(msgs: list[Message]) -> None:
        calls.append(msgs[0].body)
        if msgs[0].body == b"poison":
            raise PoisonMessage("schema v0 is not supported")

    async def main() -> None:
        topic = await setup(cluster, [b"poison"])
        group = fresh("cg")
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handler,
                                retry_backoff=BACKOFF, **FAST), Admin(
                                    cluster.namesrv_addr) as admin:
            with anyio.fail_after(BOUND):
                while not await admin.dlq_list(group):
                    await anyio.sleep(0.1)
            (dead,) = await admin.dlq_list(group)
            await anyio.sleep(1.0)
        assert calls == [b"poison"] and dead.deliveries == 1
        assert dead.error == "schema v0 is not supported"

    anyio.run(main)


def test_a_retry_outlives_the_consumer_that_failed_it(cluster: LocalCluster) -> None:
    """The retry state is the broker's: a consumer that sent a message back and is gone
    (closed here before the backoff ran out) leaves it to the next member."""
    later: list[tuple[bytes, int]] = []

    async def failing(msgs: list[Message]) -> bool:
        return msgs[0].body != b"again"

    async def working(msgs: list[Message]) -> None:
        later.append((msgs[0].body, getattr(msgs[0], "deliveries", 1)))

    async def main() -> None:
        topic = await setup(cluster, [b"again"])
        group = fresh("cg")
        async with PushConsumer(cluster.namesrv_addr, group, [topic], failing,
                                retry_backoff=(3.0,), **FAST) as first:
            async with Admin(cluster.namesrv_addr) as admin:
                with anyio.fail_after(BOUND):
                    while await admin.committed_offset(group, topic, 0) < 1:
                        await first.commit_now()
                        await anyio.sleep(0.1)
        async with PushConsumer(cluster.namesrv_addr, group, [topic], working,
                                retry_backoff=(3.0,), **FAST):
            await until(lambda: later, "the retry")
        assert later == [(b"again", 2)]

    anyio.run(main)
