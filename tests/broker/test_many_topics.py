"""Thousands of topics on a live cluster: creation through `Admin` at bounded concurrency,
routes for all of them, and a restarted name server relearning every table."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from raftmq.client import Admin
from raftmq.localcluster import LocalCluster

pytestmark = pytest.mark.live

TOPICS = 2000
QUEUES = 4
CONCURRENCY = 64


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # a short registration period, so a restarted name server is refilled in seconds
    c = LocalCluster(Path(tmp_path_factory.mktemp("many")) / "cluster",
                     fsync="interval", node_overrides={"register_interval": 1.0})
    c.start()
    try:
        c.wait_ready(timeout=30)
        yield c
    finally:
        c.stop()


def _routed(c: LocalCluster, names: list[str]) -> set[str]:
    """Topics every one of whose queues the name server routes (via CLUSTER's listing)."""
    info = c.cluster_info(timeout=10, topics=True)
    hosted: dict[str, set[int]] = {}
    for g in info["groups"].values():
        for name, t in (g.get("topics") or {}).items():
            hosted.setdefault(name, set()).update(t["hosted"])
    return {n for n in names if hosted.get(n) == set(range(QUEUES))}


@pytest.fixture(scope="module")
def topics(cluster: LocalCluster) -> list[str]:
    """TOPICS topics created through `Admin` at bounded concurrency, each placed whole
    (how fast is `raftmq bench topics`' business)."""
    names = [f"many-{i:05d}" for i in range(TOPICS)]

    async def main() -> None:
        limiter = anyio.CapacityLimiter(CONCURRENCY)
        async with Admin(cluster.namesrv_addr, timeout=10.0) as admin:

            async def create(name: str) -> None:
                async with limiter:
                    placement = await admin.create_topic(name, QUEUES, wait=20.0)
                    assert sorted(q for qs in placement.values() for q in qs) == list(
                        range(QUEUES))

            async with anyio.create_task_group() as tg:
                for name in names:
                    tg.start_soon(create, name)
            # create_topic waited for each route; a fresh client routes them too
            route = await admin.routes.route(names[-1], refresh=True)
            assert route.total == QUEUES and len(route.queues) == QUEUES

    anyio.run(main)
    return names


def test_admin_creates_2000_topics_and_all_are_routed(
    cluster: LocalCluster, topics: list[str]
) -> None:
    assert _routed(cluster, topics) == set(topics)
    # the cluster view for readiness does not list topics, only counts them
    small = cluster.cluster_info(timeout=2, topics=False)
    assert all("topics" not in g and g["topic_count"] == TOPICS for g in small["groups"].values())
    cluster.wait_ready(timeout=5)


def test_a_restarted_name_server_gets_every_table_back(
    cluster: LocalCluster, topics: list[str]
) -> None:
    names = topics
    cluster._terminate("namesrv", signal.SIGTERM, 10.0)
    cluster.start_namesrv()
    # nodes send changes against versions it never saw; it asks for, and gets, whole tables
    deadline = time.monotonic() + 15
    missing = set(names)
    while missing and time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            missing = set(names) - _routed(cluster, names)
        except OSError:
            continue
    assert not missing, f"{len(missing)} topics not routed after the restart"
    cluster.wait_ready(timeout=5)
    assert not cluster.unexpected_exits()
