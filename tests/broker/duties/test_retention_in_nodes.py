"""Retention, segment rolls and snapshots in real node processes.

The nodes run with small segments (16 KiB), a retention check every 0.2 s and a snapshot
every 16 applied entries, so what production does over days happens in seconds:

* the node's retention loop deletes old segments, by age (`retention_hours`) or because
  the real disk-usage reader reports the file system fuller than `retention_disk_ratio`;
* FETCH below the earliest retained offset answers OFFSET_TOO_SMALL naming it (> 0);
* a consumer whose committed offset was deleted skips ahead to the earliest one;
* a replica whose disk was replaced is caught up by the leader's snapshot over the real
  peer links (InstallSnapshot), then replicates on from there.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from raftmq.client import PullConsumer
from tests.conftest import live_cluster, node_status, wait_for
from tests.live_cluster import LiveCluster
from wire.protocol import Code, Op, RequestError
from wire.records import OutgoingMessage

pytestmark = pytest.mark.live

SMALL = {
    "segment_size": 16 << 10,
    "retention_check_interval": 0.2,
    "snapshot_every_entries": 16,
}
BY_AGE = {**SMALL, "retention_hours": 1 / 3600}  # segments older than a second go
BY_DISK = {**SMALL, "retention_disk_ratio": 1e-9}  # any disk is "too full"


@contextmanager
def cluster_with(base: Path, overrides: dict[str, Any]) -> Iterator[LiveCluster]:
    with live_cluster(base, groups=1, node_overrides=overrides) as c:
        live = LiveCluster(c, "t", 1)
        live.settle()
        live.create_topic()
        yield live


def produce(live: LiveCluster, batches: int, first_seq: int = 0) -> None:
    """`batches` batches of 8 messages of 512 bytes: about one segment every 4 batches."""
    for i in range(first_seq, first_seq + batches):
        msgs = [OutgoingMessage(bytes([i % 256]) * 512, key=f"k{i}") for _ in range(8)]
        live.produce_batch(0, msgs, pid=0, seq=-1, born_ms=1)


def earliest_offset(live: LiveCluster) -> int:
    """The queue's earliest retained offset as FETCH at 0 reports it (0 while nothing
    was deleted)."""
    try:
        live.fetch(0, 0, 1)
    except RequestError as exc:
        assert exc.code == Code.OFFSET_TOO_SMALL, exc
        lo = exc.extra["min"]
        assert isinstance(lo, int) and lo > 0, exc.extra
        return lo
    return 0


def fetch_retained(live: LiveCluster) -> tuple[int, dict[int, Any]]:
    """(earliest offset, what FETCH from it serves). Retention by age goes on deleting
    while the test reads, so a FETCH may find its start gone: then ask again."""
    for _ in range(50):
        lo = earliest_offset(live)
        try:
            return lo, live.fetch(0, lo)
        except RequestError as exc:
            if exc.code != Code.OFFSET_TOO_SMALL:
                raise
    raise AssertionError("retention kept moving past every earliest offset it reported")


def segments(live: LiveCluster, node: int) -> list[str]:
    return sorted(p.name for p in (live.cluster.configs[node - 1].data / "g0" / "commitlog")
                  .iterdir() if p.name.isdigit())


@pytest.mark.parametrize("overrides", [BY_AGE, BY_DISK], ids=["age", "disk-usage"])
def test_the_retention_loop_deletes_segments_and_fetch_says_offset_too_small(
    tmp_path: Path, overrides: dict[str, Any]
) -> None:
    with cluster_with(tmp_path, overrides) as live:
        produce(live, 40)
        leader = live.leader("g0")
        wait_for(lambda: earliest_offset(live), 30, "retention deleting a prefix")
        # whole segments go from the disk (after the state is snapshotted): the first
        # file left starts past position 0
        wait_for(lambda: int(segments(live, leader)[0]) > 0, 30, "segments deleted on disk")
        # what is left is served, from the earliest offset on, intact
        lo, rest = fetch_retained(live)
        assert sorted(rest) == list(range(lo, 320))
        assert all(live.acked[0][o] == rec for o, rec in rest.items())
        live.assert_nodes_healthy()


def test_a_consumer_skips_ahead_and_a_replaced_replica_gets_a_snapshot(tmp_path: Path) -> None:
    with cluster_with(tmp_path, BY_AGE) as live:
        cluster = live.cluster
        produce(live, 40)

        async def consume_from_deleted_offset() -> int:
            async with PullConsumer(cluster.namesrv_addr, "c", wait_ms=0) as consumer:
                await consumer.commit("t", 0, 1)  # committed before retention reached it
                wait_for(lambda: earliest_offset(live) > 1, 30, "retention passing offset 1")
                consumer.assign("t", [0])
                got = await consumer.poll(timeout=5.0)
                assert got, "the consumer read nothing after skipping ahead"
                return got[0].offset

        first = anyio.run(consume_from_deleted_offset, backend="trio")
        assert 1 < first <= earliest_offset(live)  # retention may have moved on since

        # replica 3 loses its disk; the entries it needs are gone from the leader's log
        leader = live.leader("g0")
        victim = next(n for n in (3, 2) if n != leader)
        cluster.kill(victim)
        shutil.rmtree(cluster.configs[victim - 1].data / "g0")
        cluster.start_node(victim)
        want = node_status(cluster, leader, "g0")

        def caught_up() -> dict[str, Any] | None:
            st = node_status(cluster, victim, "g0")
            return st if st.get("applied", -1) >= want["applied"] else None

        st = wait_for(caught_up, 60, f"node {victim} catching up")
        assert st["first"] > 1 and st["snapshot"] > 0, st  # it started from a snapshot
        lead = node_status(cluster, leader, "g0")
        assert st["queues"] == lead["queues"] and st["offsets"] == lead["offsets"], (st, lead)

        # and it replicates on from there
        produce(live, 4, first_seq=40)
        _, end = fetch_retained(live)
        wait_for(lambda: node_status(cluster, victim, "g0").get("queues", {}).get("t", {})
                 .get(0, [0, 0])[1] == max(end) + 1, 30, f"node {victim} replicating on")
        live.assert_nodes_healthy()


def test_a_time_before_the_retention_cut_finds_the_earliest_retained_offset(
        tmp_path: Path) -> None:
    """OFFSET_FOR_TIME below what retention kept answers the earliest retained offset
    (a time older than every message left), and a later time still finds its message."""
    with cluster_with(tmp_path, BY_AGE) as live:
        produce(live, 40)
        wait_for(lambda: earliest_offset(live), 30, "retention deleting a prefix")
        h, _ = live.call_leader("g0", {"op": int(Op.OFFSET_FOR_TIME), "topic": "t",
                                       "queue": 0, "ms": 0})
        assert h["offset"] == h["min"] > 0, h
        h, _ = live.call_leader("g0", {"op": int(Op.OFFSET_FOR_TIME), "topic": "t",
                                       "queue": 0, "ms": 1 << 50})
        assert h["offset"] == h["end"] == 320, h
