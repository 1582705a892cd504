"""`raftmq dlq list|show|resend|purge` end to end: a simple consumer group's dead letters
made over real processes, then seen, resent and purged by the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from raftmq.client import Admin, Producer, SimpleConsumer
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.live

TOPIC = "dlq-cli"
GROUP = "cli-workers"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("dlq-cli"), nodes=3, groups=3) as c:
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


def _bury(cluster: LocalCluster, bodies: list[bytes]) -> None:
    """Send `bodies` and have the group declare each poison."""
    async def main() -> None:
        ns = cluster.namesrv_addr
        async with Admin(ns) as admin:
            if TOPIC not in await admin.list_topics():
                await admin.create_topic(TOPIC, queues=2)
        async with Producer(ns) as producer:
            for b in bodies:
                await producer.send(TOPIC, b)
        async with SimpleConsumer(ns, GROUP) as c:
            left = len(bodies)
            with anyio.fail_after(30):
                while left:
                    for m in await c.receive(TOPIC, left, wait=1.0):
                        await c.dead_letter(m, f"bad {m.body.decode()}")
                        left -= 1

    anyio.run(main)


def _receive_all(cluster: LocalCluster, n: int) -> list[bytes]:
    async def main() -> list[bytes]:
        got: list[bytes] = []
        async with SimpleConsumer(cluster.namesrv_addr, GROUP) as c:
            with anyio.fail_after(30):
                while len(got) < n:
                    for m in await c.receive(TOPIC, n, wait=1.0):
                        assert m.deliveries == 1
                        got.append(m.body)
                        await c.ack(m)
            assert await c.receive(TOPIC, 1, wait=0.5) == []
        return got

    return anyio.run(main)


def test_list_show_resend_and_purge(cluster: LocalCluster) -> None:
    _bury(cluster, [b"one", b"two", b"three"])
    listed = js(cluster, "dlq", "list", "--group", GROUP)
    assert listed["dlq"] == f"%DLQ%{GROUP}" and listed["unreadable"] == []
    dead = {d["error"]: d for d in listed["dead"]}
    assert set(dead) == {"bad one", "bad two", "bad three"}
    assert all(d["topic"] == TOPIC and d["deliveries"] == 1 for d in dead.values())

    shown = js(cluster, "dlq", "show", "--group", GROUP, "--id", dead["bad two"]["id"])
    assert shown["message"]["body"] == "two" and shown["msg_id"] == dead["bad two"]["msg_id"]
    table = raftmq(cluster, "dlq", "list", "--group", GROUP)
    assert table.returncode == 0 and dead["bad one"]["id"] in table.stdout

    out = js(cluster, "dlq", "resend", "--group", GROUP, "--id", dead["bad one"]["id"],
             "--id", dead["bad two"]["id"])
    assert out["done"] == 2
    assert sorted(_receive_all(cluster, 2)) == [b"one", b"two"]  # consumed once each
    assert [d["error"] for d in js(cluster, "dlq", "list", "--group", GROUP)["dead"]] == [
        "bad three"]

    assert js(cluster, "dlq", "purge", "--group", GROUP, "--all")["done"] == 1
    assert js(cluster, "dlq", "list", "--group", GROUP)["dead"] == []
    empty = raftmq(cluster, "dlq", "list", "--group", GROUP)
    assert "no dead letters" in empty.stdout


def test_bad_ids_and_usage(cluster: LocalCluster) -> None:
    missing = raftmq(cluster, "dlq", "show", "--group", GROUP, "--id", "g0:999999")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    assert raftmq(cluster, "dlq", "purge", "--group", GROUP).returncode == 2  # no ids
    assert raftmq(cluster, "dlq").returncode == 2
    bad = raftmq(cluster, "dlq", "resend", "--group", GROUP, "--id", "nonsense")
    assert bad.returncode != 0 and "<broker group>:<n>" in bad.stderr
