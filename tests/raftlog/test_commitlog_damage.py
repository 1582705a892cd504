"""A replica whose CommitLog was damaged below its snapshot, on a real cluster.

Found by the `truncate-file`/`bitflip-file` chaos nemeses: a corrupt entry *header* in
the middle of a log whose index file does not vouch for it (the index is written
lazily, so a young log's index is often empty) ends the log there at recovery, as a
torn tail would. The replica's snapshot then lies beyond its log: the state machine,
ConsumeQueues included, says the messages below are there, but their bodies are gone
from this replica. It used to lead like that and fail a read of those offsets with
INTERNAL (OutOfRange) while two replicas held the messages; now its log is reset to the
snapshot's base and refilled from the leader (`raftlog.core`, "Refilling"), and it may
not lead until it holds every entry its state references.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
import trio

from chaos.disk_faults import stored_entries
from raftlog.snapshot import load_snapshot
from raftmq.client import Admin, Producer, PullConsumer
from raftmq.client.consumer import fetch
from raftmq.localcluster import LocalCluster
from tests.conftest import steady_leaders

MESSAGES = 60


async def _produce(namesrv: str) -> None:
    async with Admin(namesrv) as admin:
        await admin.create_topic("t", 1)
    async with Producer(namesrv) as producer:
        for k in range(MESSAGES):
            await producer.send("t", f"m{k}", queue=0)  # one entry each


async def _lead_and_read(cluster: LocalCluster, node: int) -> list[str]:
    """Move g0's leadership to `node`, then read the queue from offset 0 there."""
    namesrv = cluster.namesrv_addr
    async with Admin(namesrv, timeout=5.0) as admin:
        with trio.fail_after(60):
            while (await trio.to_thread.run_sync(cluster.leaders)).get("g0") != node:
                try:
                    await admin.transfer_leader("g0", node)
                except Exception:  # noqa: BLE001 - retried until it took
                    pass
                await trio.sleep(0.3)
    async with PullConsumer(namesrv, "reader") as consumer:
        res = await fetch(consumer.routes, "t", 0, 0, max_messages=MESSAGES, wait_ms=0)
    return [m.body.decode() for m in res.messages]


@pytest.mark.live
def test_a_leader_whose_log_was_cut_below_its_snapshot_still_serves_every_message(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, nodes=3, groups=1, tick_ms=50,
                      node_overrides={"snapshot_every_entries": 20,
                                      "segment_size": 4096}) as cluster:
        steady_leaders(cluster)  # no hand-over under the plain sends, so no duplicate
        trio.run(_produce, cluster.namesrv_addr)
        leaders = cluster.wait_ready(30.0)
        victim = next(i for i in cluster.node_ids if i != leaders["g0"])
        group_dir = cluster.configs[victim - 1].data / "g0"
        deadline = time.monotonic() + 30
        while True:  # the victim's snapshot covers most of the log
            path = group_dir / "snapshot"
            snap = load_snapshot(str(path)) if path.exists() else None
            if snap is not None and snap.index >= 40:
                break
            assert time.monotonic() < deadline, "no snapshot was taken"
            time.sleep(0.1)
        cluster.kill(victim)
        entries = [e for e in stored_entries(group_dir / "commitlog") if e.index == 5]
        (entry,) = entries
        fd = os.open(entry.file, os.O_RDWR)
        try:  # one flipped bit in the entry's header (its term), then no index to vouch
            old = os.pread(fd, 1, entry.offset + 8)
            os.pwrite(fd, bytes([old[0] ^ 1 << random.Random(0).randrange(8)]), entry.offset + 8)
        finally:
            os.close(fd)
        os.truncate(group_dir / "commitlog" / "index", 0)
        assert cluster.restart_and_wait(victim, 30.0) is None
        cluster.wait_ready(30.0)
        got = trio.run(_lead_and_read, cluster, victim)
        assert cluster.leaders()["g0"] == victim
        assert got == [f"m{k}" for k in range(MESSAGES)]
