"""Transactional ids expire over real node processes: an id idle for
`tx_id_expiration_ms` is forgotten by its coordinator and its fences by the participant,
on every replica and across a full restart, and the id's next producer gets an epoch
above the old one, so a producer of the old epoch stays shut out.

One cluster (three nodes, groups g0 and g1, ids expiring after 4 s of idleness): the id
is coordinated by g0 and writes to a topic of g1, so the two forget separately.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from raftmq.client import Admin, Producer, PullConsumer, TransactionError
from raftmq.localcluster import LocalCluster
from tests.conftest import node_status, steady_leaders, wait_for
from tests.live_cluster import scrape_metrics
from transport.blocking import request
from wire.protocol import Code, Op, RequestError
from wire.records import OutgoingMessage, encode_batch
from wire.txn import coordinator_group

pytestmark = pytest.mark.live

TOPIC = "expiring"  # one queue, in g1
EXPIRATION_MS = 4_000


def tid_coordinated_by(group: str) -> str:
    return next(t for i in range(1000)
                if coordinator_group(t := f"job-{i}", ["g0", "g1"]) == group)


TID = tid_coordinated_by("g0")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    keys = {"tx_id_expiration_ms": EXPIRATION_MS, "tx_tick_ms": 100}
    with LocalCluster(tmp_path_factory.mktemp("txexp"), nodes=3, groups=2, tick_ms=50,
                      node_overrides=keys) as c:
        steady_leaders(c)

        async def create() -> None:
            async with Admin(c.namesrv_addr) as admin:
                await admin.create_topic(TOPIC, queues=1, groups=["g1"])

        anyio.run(create, backend="trio")
        yield c


def commit_one(c: LocalCluster, body: bytes) -> int:
    """A new producer of TID (TX_INIT: a new epoch) commits one message; its epoch."""
    async def main() -> None:
        async with Producer(c.namesrv_addr, transactional_id=TID) as p:
            async with p.transaction() as tx:
                await tx.send(TOPIC, body)

    anyio.run(main, backend="trio")
    return epoch_of(c)


def leader_addr(c: LocalCluster, gid: str) -> str:
    n = wait_for(lambda: c.leaders().get(gid), 60, f"a leader of {gid}")
    return c.node_addr(n)


def epoch_of(c: LocalCluster) -> int:
    h, _ = request(leader_addr(c, "g0"), {"op": int(Op.TX_STATUS), "g": "g0", "tid": TID},
                   timeout=30.0)
    return int(h["epoch"])


def held(c: LocalCluster) -> list[tuple[int, int]]:
    """(ids coordinated in g0, fences kept in g1) on each node."""
    return [(node_status(c, n, "g0").get("tx_ids", -1),
             node_status(c, n, "g1").get("tx_fences", -1)) for n in c.node_ids]


def old_epoch_refused(c: LocalCluster, epoch: int) -> RequestError:
    """A PRODUCE claiming TID at `epoch`: the refusal it gets (the coordinator asked)."""
    batch = encode_batch(TOPIC, 0, [OutgoingMessage(b"zombie")], tx=(TID, epoch, 5))
    with pytest.raises(RequestError) as info:
        request(leader_addr(c, "g1"), {"op": int(Op.PRODUCE), "g": "g1"}, bytes(batch),
                timeout=30.0)
    return info.value


def forgotten(c: LocalCluster) -> bool:
    return held(c) == [(0, 0)] * len(c.node_ids)


def test_an_idle_id_is_forgotten_everywhere_and_comes_back_with_a_higher_epoch(
        cluster: LocalCluster) -> None:
    first = commit_one(cluster, b"one")
    assert (1, 1) in held(cluster)  # the leaders hold the id and its fence
    wait_for(lambda: forgotten(cluster), 60, "the id and its fence forgotten on every node")
    for cfg in cluster.configs:  # the metrics say so too (refreshed every second)
        assert cfg.metrics is not None
        wait_for(lambda m=cfg.metrics: scrape_metrics(m).get('raftmq_tx_ids{group="g0"}') == 0
                 and scrape_metrics(m).get('raftmq_tx_fences{group="g1"}') == 0, 30,
                 "the gauges at zero")
    assert epoch_of(cluster) == -1  # unknown to its coordinator now
    err = old_epoch_refused(cluster, first)
    assert err.code == Code.TX_UNKNOWN and "not initialised" in err.message, err

    second = commit_one(cluster, b"two")
    assert second > first  # above every epoch the id had: its old producer stays out
    err = old_epoch_refused(cluster, first)
    assert err.code == Code.TX_FENCED, err
    wait_for(lambda: forgotten(cluster), 60, "forgotten again")

    cluster.kill_together(cluster.node_ids)
    for i in cluster.node_ids:
        assert cluster.restart_and_wait(i, timeout=60) is None
    steady_leaders(cluster)
    wait_for(lambda: forgotten(cluster), 60, "still forgotten after a full restart")
    third = commit_one(cluster, b"three")
    assert third > second  # the floor was replayed too

    mine = (b"one", b"two", b"three")

    async def read() -> list[bytes]:
        """This test's committed messages, in queue order (the module's other test
        shares the queue, and may have run first)."""
        async with PullConsumer(cluster.namesrv_addr, "readers") as consumer:
            consumer.assign(TOPIC, [0])
            got: list[bytes] = []
            with anyio.fail_after(30):
                while b"three" not in got:
                    got += [m.body for m in await consumer.poll(timeout=1.0)]
            return [b for b in got if b in mine]

    assert anyio.run(read, backend="trio") == list(mine)


def test_a_producer_idle_past_the_expiration_fails_one_transaction_then_registers_again(
        cluster: LocalCluster) -> None:
    """As Kafka's producer does when its id expired: the transaction that finds out fails
    (nothing of it is visible), and the producer registers again (a new, higher epoch)
    before its next one, without being restarted."""
    async def main() -> tuple[int, int]:
        async with Producer(cluster.namesrv_addr, transactional_id=TID) as p:
            async with p.transaction() as tx:
                await tx.send(TOPIC, b"before")
            before = tx.epoch
            await anyio.to_thread.run_sync(
                wait_for, lambda: forgotten(cluster), 60, "the idle id forgotten")
            with pytest.raises(TransactionError) as info:
                async with p.transaction() as tx:
                    await tx.send(TOPIC, b"lost with the expiry")
            assert info.value.code == Code.TX_UNKNOWN and "expired" in info.value.message
            async with p.transaction() as tx:
                await tx.send(TOPIC, b"after")
            return before, tx.epoch

    before, after = anyio.run(main, backend="trio")
    assert after > before
