"""The operator's tools end to end over real processes: `raftmq topic update|delete` and
`raftmq group list|describe|reset-offsets|delete`, run as subprocesses against a name
server and three nodes (groups g0..g2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from raftmq.client import Producer, PullConsumer, RequestError
from raftmq.localcluster import LocalCluster
from tests.live_cluster import poll_for
from tests.paths import REPO_ROOT as ROOT
from transport.blocking import request
from wire.protocol import Code, Op

pytestmark = pytest.mark.live  # every test here starts a cluster



@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("admin"), nodes=3, groups=3, tick_ms=50) as c:
        c.wait_ready(timeout=60)
        yield c
        assert c.unexpected_exits() == {}


def raftmq(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTMQ_NAMESRV", "NAMESRV_ADDR")}
    env["RAFTMQ_NAMESRV"] = cluster.namesrv_addr
    return subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60)


def js(cluster: LocalCluster, *args: str) -> Any:
    proc = raftmq(cluster, *args, "--json")
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stderr}"
    return json.loads(proc.stdout)


def send(cluster: LocalCluster, topic: str, per_queue: dict[int, int]) -> None:
    async def main() -> None:
        async with Producer(cluster.namesrv_addr) as producer:
            for q, n in per_queue.items():
                await producer.send_batch(topic, [f"{q}-{i}" for i in range(n)], queue=q)

    anyio.run(main)


def committed(cluster: LocalCluster, group: str) -> dict[int, int]:
    info = js(cluster, "group", "describe", group)
    return {r["queue"]: r["committed"] for r in info["queues"]}


def join(cluster: LocalCluster, group: str, client: str, ttl_ms: int) -> None:
    """What a consumer's heartbeat does: be a live member of `group` on every node."""
    for node in cluster.node_ids:
        request(cluster.node_addr(node), {"op": int(Op.HEARTBEAT), "cg": group,
                                          "client": client, "topics": [], "ttl_ms": ttl_ms})


def test_topic_update_adds_queues_and_delete_removes_the_topic(cluster: LocalCluster) -> None:
    js(cluster, "topic", "create", "grow", "--queues", "3")
    send(cluster, "grow", {0: 2, 1: 2, 2: 2})
    out = js(cluster, "topic", "update", "grow", "--queues", "5")
    assert sorted(q for qs in out["added"].values() for q in qs) == [3, 4]
    info = js(cluster, "topic", "describe", "grow")
    assert info["total"] == 5
    assert [q["end_offset"] for q in info["queues"]] == [2, 2, 2, 0, 0]
    send(cluster, "grow", {4: 1})
    shrink = raftmq(cluster, "topic", "update", "grow", "--queues", "4")
    assert shrink.returncode == 2 and "can only be added" in shrink.stderr
    assert js(cluster, "topic", "describe", "grow")["total"] == 5  # unchanged

    got = raftmq(cluster, "consume", "--group", "all", "--topic", "grow", "--timeout", "1",
                 "--json")
    assert got.returncode == 0 and len(got.stdout.splitlines()) == 7

    out = js(cluster, "topic", "delete", "grow")
    assert out["deleted_from"] == ["g0", "g1", "g2"]
    assert "grow" not in js(cluster, "topic", "list")
    with pytest.raises(RequestError) as info_err:
        send(cluster, "grow", {0: 1})
    assert info_err.value.code == Code.UNKNOWN_TOPIC
    again = raftmq(cluster, "topic", "delete", "grow")
    assert again.returncode == 1 and "UNKNOWN_TOPIC" in again.stderr
    js(cluster, "topic", "create", "grow", "--queues", "2")  # a new topic, from offset 0
    assert [q["end_offset"] for q in js(cluster, "topic", "describe", "grow")["queues"]] == [0, 0]
    assert committed(cluster, "all") == {}  # the old topic's offsets went with it


def test_group_list_describe_reset_and_delete(cluster: LocalCluster) -> None:
    js(cluster, "topic", "create", "orders", "--queues", "3")
    send(cluster, "orders", {0: 3, 1: 3, 2: 3})
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    send(cluster, "orders", {0: 2, 1: 2, 2: 2})
    ok = raftmq(cluster, "consume", "--group", "billing", "--topic", "orders", "--count", "9")
    assert ok.returncode == 0, ok.stderr

    assert "orders" in js(cluster, "group", "list")["billing"]
    info = js(cluster, "group", "describe", "billing")
    assert info["members"] == []
    assert sum(r["lag"] for r in info["queues"]) == 15 - 9
    assert all(r["end"] == 5 for r in info["queues"])
    before = committed(cluster, "billing")

    plan = js(cluster, "group", "reset-offsets", "billing", "--topic", "orders", "--to",
              "earliest", "--dry-run")
    assert plan["dry_run"] and {q["new"] for q in plan["queues"].values()} == {0}
    assert committed(cluster, "billing") == before  # a dry run changes nothing

    js(cluster, "group", "reset-offsets", "billing", "--topic", "orders", "--to", "latest")
    assert committed(cluster, "billing") == {0: 5, 1: 5, 2: 5}
    js(cluster, "group", "reset-offsets", "billing", "--topic", "orders", "--to", "1")
    assert committed(cluster, "billing") == {0: 1, 1: 1, 2: 1}
    js(cluster, "group", "reset-offsets", "billing", "--topic", "orders", "--to",
       f"@{middle_ms}")
    assert committed(cluster, "billing") == {0: 3, 1: 3, 2: 3}  # the second batch's start

    async def read_on() -> list[bytes]:
        async with PullConsumer(cluster.namesrv_addr, "billing") as consumer:
            consumer.assign("orders")
            return sorted(m.body for m in await poll_for(consumer, 6))

    assert anyio.run(read_on) == sorted(f"{q}-{i}".encode() for q in range(3) for i in range(2))

    join(cluster, "billing", "someone@live", ttl_ms=60_000)
    busy = raftmq(cluster, "group", "reset-offsets", "billing", "--topic", "orders", "--to",
                  "earliest")
    assert busy.returncode == 1 and "live member" in busy.stderr
    assert committed(cluster, "billing") == {0: 3, 1: 3, 2: 3}
    refused = raftmq(cluster, "group", "delete", "billing")
    assert refused.returncode == 1 and "live member" in refused.stderr
    assert js(cluster, "group", "describe", "billing")["members"] == ["someone@live"]
    join(cluster, "billing", "someone@live", ttl_ms=0)  # it leaves (nodes keep 0.1 s)
    time.sleep(0.3)

    out = js(cluster, "group", "delete", "billing")
    assert out["deleted_offsets"] == 3
    assert "billing" not in js(cluster, "group", "list")
    assert committed(cluster, "billing") == {}


def test_topics_of_one_group_are_read_at_its_leader(cluster: LocalCluster) -> None:
    """TOPICS with "g": that group's topics only, from its leader after a read barrier
    (what the chaos workload reads topic changes back with); a follower refuses."""
    js(cluster, "topic", "create", "per-group", "--queues", "3")  # one queue in each group
    cluster.wait_preferred_leaders(timeout=120)  # so leadership stays where it is
    leaders = cluster.wait_ready(timeout=60)
    h, _ = request(cluster.node_addr(leaders["g1"]), {"op": int(Op.TOPICS), "g": "g1"})
    assert h["topics"]["per-group"] == {"queues": 3, "hosted": {"g1": [1]}}
    assert all(list(t["hosted"]) == ["g1"] for t in h["topics"].values())
    follower = next(n for n in cluster.node_ids if n != leaders["g1"])
    with pytest.raises(RequestError) as refused:
        request(cluster.node_addr(follower), {"op": int(Op.TOPICS), "g": "g1"})
    assert refused.value.code == Code.NOT_LEADER
