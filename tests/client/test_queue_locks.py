"""Queue locks on a real cluster (LOCK, UNLOCK, LOCKS and fenced commits): one holder per
queue, the lease renewed by its holder and free to another once it ran out, only the
holder unlocks, and a commit for a queue another client holds is refused LOCK_LOST while
plain commits of unlocked queues go on as ever."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anyio
import pytest

from raftmq.client import Admin, LockLostError, Producer
from raftmq.client.queuelocks import group_locks, held_by, lock_queue, unlock_queue
from raftmq.client.reads import commit_offsets, query_offset
from raftmq.client.routes import open_routes
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster
from transport.blocking import request
from wire.protocol import Code, Op, RequestError

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("locks")) as c:
        yield c


def test_locks_lease_fence_commits_and_list(cluster: LocalCluster) -> None:
    topic, cg = f"t-{uuid.uuid4().hex[:6]}", f"cg-{uuid.uuid4().hex[:6]}"

    async def main() -> None:
        async with Admin(cluster.namesrv_addr) as admin:
            await admin.create_topic(topic, 3)
        async with Producer(cluster.namesrv_addr) as producer:
            for q in range(3):
                for i in range(10):
                    await producer.send(topic, b"m%d" % i, queue=q)
        stack, routes, _tg = await open_routes(None, [cluster.namesrv_addr], 3.0)
        async with stack:
            assert await lock_queue(routes, cg, topic, 0, "a", 1500) is not None
            assert await lock_queue(routes, cg, topic, 0, "b", 1500) is None
            assert await lock_queue(routes, cg, topic, 1, "b", 60_000) is not None
            locks = await group_locks(routes, cg)
            assert held_by(locks, "a") == [(topic, 0)] and held_by(locks, "b") == [(topic, 1)]
            # fenced: b may not commit a's queue; a may; nobody's queue 2 takes any commit
            with pytest.raises(LockLostError):
                await commit_offsets(routes, cg, {(topic, 0): 5}, client="b")
            with pytest.raises(LockLostError):
                await commit_offsets(routes, cg, {(topic, 0): 5})
            await commit_offsets(routes, cg, {(topic, 0): 5}, client="a")
            await commit_offsets(routes, cg, {(topic, 2): 7})
            assert await query_offset(routes, cg, topic, 0) == 5
            # only the holder unlocks
            assert not await unlock_queue(routes, cg, topic, 1, "a")
            assert await unlock_queue(routes, cg, topic, 1, "b")
            # a's lease runs out unrenewed: b takes the queue, and a's commit is refused
            with anyio.fail_after(30):
                while await lock_queue(routes, cg, topic, 0, "b", 60_000) is None:
                    await anyio.sleep(0.2)
            with pytest.raises(LockLostError):
                await commit_offsets(routes, cg, {(topic, 0): 9}, client="a")
            assert await query_offset(routes, cg, topic, 0) == 5
            live = [lk for lk in await group_locks(routes, cg) if lk.live]
            assert [(lk.queue, lk.client) for lk in live] == [(0, "b")]

    anyio.run(main, backend="trio")


def test_bad_lock_requests_are_refused(cluster: LocalCluster) -> None:
    addr = cluster.node_addr(1)
    for header, code in [
        ({"cg": "g", "topic": "nope", "queues": [0], "client": "a"}, Code.UNKNOWN_TOPIC),
        ({"cg": "g", "topic": "t", "queues": ["x"], "client": "a"}, Code.MALFORMED),
        ({"cg": "g", "topic": "t", "queues": [0], "client": ""}, Code.MALFORMED),
        ({"cg": "g", "topic": "t", "queues": [0], "client": "a", "lease_ms": 1},
         Code.MALFORMED),
    ]:
        with pytest.raises(RequestError) as info:
            request(addr, {"op": int(Op.LOCK), **header})
        assert info.value.code == code, (header, info.value)
