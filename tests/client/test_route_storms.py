"""A leader change costs a client of many topics one question to the name servers, not one
per topic (over real node processes): the routes of a group whose leader moved stay
usable (no queue moved), and the new leader is learned from the old one's hint or one
CLUSTER request. Refetching every route of the group on the send path made a producer of
10,000 topics stall for seconds after each election."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest

from raftmq.client import Admin, Producer, PullConsumer
from tests.conftest import live_cluster
from wire.protocol import Op

pytestmark = pytest.mark.live

TOPICS = 150


def _count_name_server_requests(client: Any) -> Counter[int]:
    asked: Counter[int] = Counter()
    routes = client.routes if hasattr(client, "routes") else client._routes
    real = routes.namesrv_request

    async def counted(op: Op, *args: Any, **kwargs: Any) -> Any:
        asked[int(op)] += 1
        return await real(op, *args, **kwargs)

    routes.namesrv_request = counted
    return asked


def test_a_producer_of_many_topics_asks_no_route_again_after_its_leaders_move(
        tmp_path: Path) -> None:
    names = [f"storm-{i}" for i in range(TOPICS)]

    async def run(cluster: Any) -> None:
        async with Admin(cluster.namesrv_addr, timeout=10.0) as admin:
            limiter = anyio.CapacityLimiter(16)

            async def create(name: str) -> None:
                async with limiter:
                    await admin.create_topic(name, queues=3, exist_ok=True)

            async with anyio.create_task_group() as tg:
                for name in names:
                    tg.start_soon(create, name)
            async with Producer(cluster.namesrv_addr, send_timeout=10.0, retries=8) as p:
                asked = _count_name_server_requests(p)
                for name in names:  # learns every route
                    await p.send(name, b"before")
                assert asked[int(Op.ROUTE)] >= TOPICS
                asked.clear()
                # every group's leadership moves (each topic has a queue in every group)
                for g in cluster.groups:
                    members = await admin.group_members(g.id)
                    to = next(v for v in members.voters if v != members.leader)
                    await admin.transfer_leader(g.id, to, prefer=False)
                for name in names:
                    for q in range(3):
                        await p.send(name, b"after", queue=q)
                # one lookup of a route that went past its refresh period is allowed;
                # one per topic is the storm this guards against
                assert asked[int(Op.ROUTE)] <= 3, dict(asked)
                assert asked[int(Op.CLUSTER)] <= 6, dict(asked)
            async with PullConsumer(cluster.namesrv_addr, "storm-check",
                                    start_from="first", wait_ms=0) as c:
                got = 0
                for q in range(3):
                    got += len((await c.pull(names[-1], q, 0, max=16, wait_ms=0)).messages)
                assert got == 4  # "before" once, "after" on each of its three queues

    with live_cluster(tmp_path, groups=3) as cluster:
        anyio.run(run, cluster)
