"""`raftmq consume --orderly` and `raftmq group locks` end to end over real processes: an
orderly run prints exactly --count messages in offset order and commits them, a second
run goes on from there; the locks a live consumer holds are listed with their lease."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest

from raftmq.client import Admin, Message, Producer, PushConsumer
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("ordered-cli")) as c:
        yield c


def raftmq(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTMQ_NAMESRV", "NAMESRV_ADDR")}
    env["RAFTMQ_NAMESRV"] = cluster.namesrv_addr
    return subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=90)


def _send(cluster: LocalCluster, topic: str, n: int) -> None:
    async def main() -> None:
        async with Admin(cluster.namesrv_addr) as admin:
            await admin.create_topic(topic, 2)
        async with Producer(cluster.namesrv_addr) as producer:
            for i in range(n):
                await producer.send(topic, f"m{i}".encode(), queue=i % 2)
    anyio.run(main)


def test_consume_orderly_prints_exactly_count_in_order_and_goes_on(cluster: LocalCluster
                                                                   ) -> None:
    _send(cluster, "cli-ordered", 10)
    args = ("consume", "--orderly", "--group", "cli-o", "--topic", "cli-ordered",
            "--timeout", "3", "--json")
    first = raftmq(cluster, *args, "--count", "4")
    assert first.returncode == 0, first.stderr
    second = raftmq(cluster, *args)
    assert second.returncode == 0, second.stderr
    rows = [json.loads(line) for out in (first.stdout, second.stdout)
            for line in out.splitlines()]
    assert len(first.stdout.splitlines()) == 4 and "4 message(s)" in first.stderr
    assert sorted(r["body"] for r in rows) == sorted(f"m{i}" for i in range(10))
    for q in (0, 1):
        offsets = [r["offset"] for r in rows if r["queue"] == q]
        assert offsets == list(range(5)), (q, offsets)


def test_group_locks_lists_holders_and_their_lease(cluster: LocalCluster) -> None:
    _send(cluster, "cli-locks", 2)

    async def main() -> None:
        async def handle(msgs: list[Message]) -> bool:
            return True

        async with PushConsumer(cluster.namesrv_addr, "cli-l", ["cli-locks"], handle,
                                client_id="holder", rebalance_interval=0.2) as c:
            with anyio.fail_after(60):
                while len(c.assignment()) < 2:
                    await anyio.sleep(0.05)
            out = await anyio.to_thread.run_sync(
                lambda: raftmq(cluster, "group", "locks", "cli-l", "--json"))
            assert out.returncode == 0, out.stderr
            locks = json.loads(out.stdout)["locks"]
            assert [(lk["topic"], lk["queue"], lk["client"], lk["live"]) for lk in locks] == [
                ("cli-locks", 0, "holder", True), ("cli-locks", 1, "holder", True)]
            table = await anyio.to_thread.run_sync(
                lambda: raftmq(cluster, "group", "locks", "cli-l"))
            assert "holder" in table.stdout and "yes" in table.stdout
        empty = await anyio.to_thread.run_sync(
            lambda: raftmq(cluster, "group", "locks", "cli-l", "--json"))
        assert [lk for lk in json.loads(empty.stdout)["locks"] if lk["live"]] == []

    anyio.run(main)
