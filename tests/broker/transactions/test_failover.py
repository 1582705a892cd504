"""A transaction's coordinator loses its leader (kill -9) between the sends and the
commit: the commit goes to the group's new leader, which finds the transaction in its
log, decides it and has every group make its messages visible. Its own cluster: the
test kills and restarts a node."""

from __future__ import annotations

import signal
from functools import partial
from pathlib import Path

import anyio
import pytest

from raftmq.client import Admin, Producer
from tests.conftest import group_leader, live_cluster, wait_for
from tests.live_cluster import drain
from wire.txn import coordinator_group

pytestmark = pytest.mark.live


def test_a_commit_survives_the_death_of_the_coordinators_leader(tmp_path: Path) -> None:
    tid = "failover-tid"
    with live_cluster(tmp_path, groups=3) as cluster:
        coord = coordinator_group(tid, [g.id for g in cluster.groups])
        found = wait_for(lambda: group_leader(cluster, coord), 30, f"a leader of {coord}")
        assert found is not None
        leader: int = found

        async def prepare_then_commit() -> None:
            async with Admin(cluster.namesrv_addr) as admin:
                await admin.create_topic("fo", 3)  # queue q in g{q}
            async with Producer(cluster.namesrv_addr, transactional_id=tid,
                                send_timeout=5.0) as p:
                tx = await p.begin()
                for q in range(3):
                    await tx.send("fo", f"m{q}", queue=q)
                await anyio.to_thread.run_sync(partial(cluster.kill, leader, signal.SIGKILL))
                await tx.commit()
                assert tx.state == "committed"

        anyio.run(prepare_then_commit, backend="trio")
        cluster.restart_and_wait(leader)

        async def read() -> list[bytes]:
            drained = await drain(cluster.namesrv_addr, "fo", "fo-reader")  # to each end
            return sorted(m.body for msgs in drained.values() for m in msgs)

        assert anyio.run(read, backend="trio") == [b"m0", b"m1", b"m2"]
        assert cluster.unexpected_exits() == {}
