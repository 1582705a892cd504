"""A power loss of every node under `fsync = "interval"`, in real node processes: the
nodes are killed together (SIGKILL) and every byte no fsync covered is thrown away
(`chaos.disk_faults.discard_unsynced`, from the fsyncs each node recorded). Losing the
unsynced log is what the policy allows; a group that never comes back is not.

Each node's snapshot was written durably (temp, fsync, rename) while its CommitLog
never was, so every replica restarts with a state ahead of an empty log: refilling, and
no voter holds the entries to refill it from. The group must abandon the refill,
elect, say what was lost (status and metrics, and again after a restart), answer reads
of the lost messages with OFFSET_TOO_SMALL naming where the data starts again, and
accept writes.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from chaos.disk_faults import discard_unsynced
from raftmq.client import PullConsumer
from raftmq.commands.status import cluster_status
from tests.conftest import live_cluster, node_status, wait_for
from tests.live_cluster import LiveCluster, scrape_metrics
from wire.protocol import Code, RequestError
from wire.records import OutgoingMessage

pytestmark = pytest.mark.live

NODES = (1, 2, 3)
OVERRIDES = {
    "fsync": "interval",
    "fsync_interval": 3600.0,  # the CommitLog is never fsynced during the test
    "test_sync_marks": True,
    "snapshot_every_entries": 16,
}


def _produce(live: LiveCluster, batches: int, first: int = 0) -> None:
    for i in range(first, first + batches):
        msgs = [OutgoingMessage(b"m%d-%d" % (i, k), key=f"k{i}") for k in range(4)]
        live.produce_batch(0, msgs, pid=0, seq=-1, born_ms=1)


def _wait_lost_metric(addr: str | None, want: int) -> None:
    assert addr is not None
    key = 'raftmq_refill_lost_entries{group="g0"}'
    wait_for(lambda: scrape_metrics(addr).get(key) == want, 10,
             f"{addr} reporting {want} lost entries in its metrics")


def test_a_group_whose_every_log_was_lost_elects_reports_the_gap_and_accepts_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")  # for the fsync records (test_sync_marks)
    with live_cluster(tmp_path, groups=1, node_overrides=OVERRIDES) as c:
        live = LiveCluster(c, "t", 1)
        live.settle()
        live.create_topic()
        _produce(live, 40)
        # every replica snapshotted past the topic's creation
        wait_for(lambda: all(node_status(c, i, "g0").get("snapshot", 0) > 16 for i in NODES),
                 30, "every replica writing a snapshot")

        c.kill_together(NODES)
        for i in NODES:
            discard_unsynced(c.configs[i - 1].data)
        for i in NODES:
            c.start_node(i)

        leader = live.leader("g0", timeout=60)
        st = wait_for(lambda: node_status(c, leader, "g0") or None, 10, "the leader's status")
        assert not st["refilling"], st
        # the writes acknowledged before the power loss are gone: the reads say so
        with pytest.raises(RequestError) as err:
            live.fetch(0, 0)
        assert err.value.code == Code.OFFSET_TOO_SMALL, err.value
        lo = err.value.extra["min"]
        assert 0 < lo <= 160, err.value.extra

        gaps = [node_status(c, i, "g0").get("refill_gap") for i in NODES]
        assert any(gaps), gaps
        for i, gap in zip(NODES, gaps, strict=True):
            if gap:
                _wait_lost_metric(c.configs[i - 1].metrics, gap[1] - gap[0] + 1)
        status = anyio.run(cluster_status, [c.namesrv_addr], backend="trio")
        shown = {n: m["refill_gap"] for n, m in status["groups"]["g0"]["members"].items()}
        assert shown == {i: gap for i, gap in zip(NODES, gaps, strict=True)}, shown

        # and the group serves on, from where the surviving state ends (offsets the lost
        # writes had are given out again: they were never durable anywhere)
        msgs = [OutgoingMessage(b"after-%d" % k) for k in range(4)]
        base = live.produce_batch(0, msgs, pid=0, seq=-1, born_ms=1)["base"]
        assert base >= lo
        got = live.fetch(0, base)
        assert [got[base + k] for k in range(4)] == [live.acked[0][base + k] for k in range(4)]

        async def consume_from_a_lost_offset() -> int:
            async with PullConsumer(c.namesrv_addr, "c", wait_ms=0) as consumer:
                await consumer.commit("t", 0, 0)
                consumer.assign("t", [0])
                msgs = await consumer.poll(timeout=5.0)
                assert msgs, "the consumer read nothing after skipping ahead"
                return msgs[0].offset

        assert anyio.run(consume_from_a_lost_offset, backend="trio") == lo

        # what was lost is still reported after a restart (status and metrics)
        for i in NODES:
            assert c.restart_and_wait(i) is None
        for i, gap in zip(NODES, gaps, strict=True):
            assert wait_for(lambda i=i: node_status(c, i, "g0") or None, 10,
                            "the status")["refill_gap"] == gap
            if gap:
                _wait_lost_metric(c.configs[i - 1].metrics, gap[1] - gap[0] + 1)
        status = anyio.run(cluster_status, [c.namesrv_addr], backend="trio")
        shown = {n: m["refill_gap"] for n, m in status["groups"]["g0"]["members"].items()}
        assert shown == {i: gap for i, gap in zip(NODES, gaps, strict=True)}, shown
