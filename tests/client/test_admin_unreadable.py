"""Consumer-group views say what they could not read (over real node processes).

Two nodes, each the only replica of one broker group (g0 on node 1, g1 on node 2), and
a consumer group that committed offsets on queues of both. With node 2 killed, g1's
offsets cannot be read: `Admin.group_offsets` and `describe_group` raise
`IncompleteError` naming g1 and carrying what g0 answered, and `raftmq group describe`
prints those rows, says INCOMPLETE and exits 1, where they used to leave g1 out silently.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from raftmq.client import Admin, IncompleteError, PullConsumer
from raftmq.localcluster import LocalCluster
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.live

TOPIC = "t"


def test_offsets_of_an_unreachable_group_are_reported_not_skipped(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=2, groups=2, tick_ms=50,
                      node_overrides={"replication": 1}) as cluster:
        cluster.wait_ready(timeout=60)

        async def commit() -> dict[str, dict[tuple[str, int], int]]:
            async with Admin(cluster.namesrv_addr) as admin:
                await admin.create_topic(TOPIC, 2)  # queue 0 in g0, queue 1 in g1
                async with PullConsumer(cluster.namesrv_addr, "cg") as consumer:
                    await consumer.commit(TOPIC, 0, 0)
                    await consumer.commit(TOPIC, 1, 0)
                return await admin.group_offsets("cg")

        assert anyio.run(commit) == {"cg": {(TOPIC, 0): 0, (TOPIC, 1): 0}}
        cluster.kill(2)

        async def views() -> tuple[IncompleteError, IncompleteError]:
            async with Admin(cluster.namesrv_addr, timeout=1.0) as admin:
                with pytest.raises(IncompleteError) as offsets:
                    await admin.group_offsets("cg")
                with pytest.raises(IncompleteError) as described:
                    await admin.describe_group("cg")
            return offsets.value, described.value

        offsets, described = anyio.run(views)
        assert offsets.unreadable == ["g1"]
        assert offsets.partial == {"cg": {(TOPIC, 0): 0}}
        assert described.unreadable == ["g1"], described
        members, rows = described.partial  # type: ignore[misc]
        assert [(r.topic, r.queue, r.end_offset) for r in rows] == [(TOPIC, 0, 0)]

        env = {**os.environ, "RAFTMQ_NAMESRV": cluster.namesrv_addr}
        proc = subprocess.run([sys.executable, "-m", "raftmq", "group", "describe", "cg"],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert proc.returncode == 1, proc
        assert "INCOMPLETE" in proc.stderr and "g1" in proc.stderr, proc.stderr
        assert TOPIC in proc.stdout, proc.stdout  # g0's row is still shown
        cluster.restart(2)
