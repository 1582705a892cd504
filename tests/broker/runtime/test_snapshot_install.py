"""A replica that installed the leader's snapshot serves every retained message once it
leads; so does one that compacted its own log and restarted.

The state machine's ConsumeQueues point at CommitLog entries from the retention horizon
on, including entries at or below the snapshot's index. A replica caught up by
InstallSnapshot must therefore hold those entries too, or FETCH, GET_MESSAGE and
QUERY_KEY of acknowledged, never-retained messages fail once it becomes the leader.

The nodes run with small segments (16 KiB), a retention check every 0.2 s deleting
segments older than a second, and a snapshot every 16 applied entries. Once production
stops, retention deletes every segment but the active one and then has nothing left to
do, so the horizon stays put: the messages in the active segment below the snapshot's
index are the ones at stake.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import live_cluster, node_status, wait_for
from tests.live_cluster import LiveCluster
from transport.blocking import request
from wire.protocol import Code, Op, RequestError
from wire.records import OutgoingMessage, iter_records, message_id

pytestmark = pytest.mark.live

OVERRIDES = {
    "segment_size": 16 << 10,
    "retention_check_interval": 0.2,
    "snapshot_every_entries": 16,
    "retention_hours": 1 / 3600,
}
BATCHES = 40
PER_BATCH = 8


@contextmanager
def cluster(base: Path) -> Iterator[LiveCluster]:
    with live_cluster(base, groups=1, node_overrides=OVERRIDES) as c:
        live = LiveCluster(c, "t", 1)
        live.settle()
        live.create_topic()
        yield live


def produce(live: LiveCluster, batches: int, first_seq: int = 0) -> None:
    for i in range(first_seq, first_seq + batches):
        msgs = [OutgoingMessage(bytes([i % 256]) * 512, key=f"k{i}") for _ in range(PER_BATCH)]
        live.produce_batch(0, msgs, pid=0, seq=-1, born_ms=1)


def ask(live: LiveCluster, node: int, header: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """One request to `node` itself (no redirect, no retry)."""
    return request(live.addr(node), header, timeout=10.0)


def read_all(live: LiveCluster, node: int, lo: int) -> dict[int, tuple[bytes, str]]:
    """Every record from `lo` to the end, read from `node`: offset -> (bytes, message id)."""
    out: dict[int, tuple[bytes, str]] = {}
    offset = lo
    while True:
        h, body = ask(live, node, {"op": int(Op.FETCH), "topic": "t", "queue": 0,
                                   "offset": offset, "max": 64, "max_bytes": 8 << 20,
                                   "wait_ms": 0})
        for (start, size), meta in zip(iter_records(body), h["msgs"], strict=True):
            out[meta[0]] = (body[start : start + size], message_id(h["g"], meta[1], meta[2]))
        if h["next"] >= h["end"]:
            return out
        offset = h["next"]


def horizon(live: LiveCluster) -> int:
    """The queue's earliest retained offset, once retention has deleted every segment but
    the active one on every replica (it then stays put while nothing is produced)."""

    def settled() -> int | None:
        firsts = {n: node_status(live.cluster, n, "g0") for n in live.cluster.node_ids}
        # a replica still applying (or rebuilding its state) may not list the topic yet
        if any(not st or "t" not in st.get("queues", {}) for st in firsts.values()):
            return None
        los = {st["queues"]["t"][0][0] for st in firsts.values()}
        segs = {n: len(segments(live, n)) for n in firsts}
        if len(los) == 1 and all(k == 1 for k in segs.values()):
            (lo,) = los
            return lo or None
        return None

    return wait_for(settled, 60, "retention settling on one segment per replica")


def segments(live: LiveCluster, node: int) -> list[str]:
    d = live.cluster.configs[node - 1].data / "g0" / "commitlog"
    return sorted(p.name for p in d.iterdir() if p.name.isdigit())


def lead(live: LiveCluster, node: int) -> None:
    """Make `node` the leader of g0 (asking the current leader to hand over)."""

    def leading() -> bool:
        current = live.leader("g0")
        if current == node:
            return True
        try:
            ask(live, current, {"op": int(Op.TRANSFER_LEADER), "g": "g0", "to": node})
        except (OSError, RequestError):
            pass
        return False

    wait_for(leading, 60, f"node {node} taking over g0", interval=0.5)


def serving(live: LiveCluster, node: int, lo: int) -> None:
    """Until `node` leads g0 and is ready to serve reads: a leader elected a moment ago
    refuses them (NOT_LEADER, not ready) while it applies what came before its term, and
    on a busy machine an election may move the leadership meanwhile (it is asked back)."""

    def ready() -> bool:
        try:
            ask(live, node, {"op": int(Op.FETCH), "topic": "t", "queue": 0, "offset": lo,
                             "max": 1, "wait_ms": 0})
            return True
        except RequestError as exc:
            if exc.code != Code.NOT_LEADER:
                raise
        if live.leader("g0") != node:
            lead(live, node)
        return False

    wait_for(ready, 60, f"node {node} serving reads of g0", interval=0.2)


def check_everything_readable(live: LiveCluster, node: int, lo: int) -> None:
    """`node` leads g0 and serves every acknowledged message from `lo` on: FETCH,
    GET_MESSAGE by id, and QUERY_KEY."""
    serving(live, node, lo)
    got = read_all(live, node, lo)
    acked = live.acked[0]
    assert sorted(got) == [o for o in sorted(acked) if o >= lo]
    assert all(got[o][0] == acked[o] for o in got)
    for offset, (record, mid) in got.items():
        h, body = ask(live, node, {"op": int(Op.GET_MESSAGE), "msg_id": mid})
        assert h["msgs"][0][0] == offset and body == record, (offset, mid)
    for seq in sorted({o // PER_BATCH for o in got}):
        h, body = ask(live, node, {"op": int(Op.QUERY_KEY), "topic": "t", "key": f"k{seq}"})
        offsets = sorted(m[2] for m in h["msgs"])
        assert offsets == [o for o in range(seq * PER_BATCH, (seq + 1) * PER_BATCH)
                           if o >= lo], (seq, h)


def test_a_replica_caught_up_by_a_snapshot_serves_every_retained_message_as_leader(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path) as live:
        c = live.cluster
        produce(live, BATCHES)
        lo = horizon(live)
        # the group's preferred leader loses its disk: once caught up it takes the
        # group back by itself, as it would in production
        victim = c.groups[0].preferred_leader or 1
        st = node_status(c, victim, "g0")
        assert st["first"] > 1 and st["snapshot"] >= st["first"], st  # a gap to refill
        c.kill(victim)
        shutil.rmtree(c.configs[victim - 1].data / "g0")
        leader = live.leader("g0")
        assert leader != victim
        c.start_node(victim)
        want = node_status(c, leader, "g0")["applied"]
        caught = wait_for(lambda: (s := node_status(c, victim, "g0")).get("applied", -1) >= want
                          and s, 60, f"node {victim} catching up")
        assert caught["snapshot"] > 0, caught  # it was caught up by InstallSnapshot
        # its log starts where the leader's does, not after the snapshot
        assert caught["first"] == node_status(c, leader, "g0")["first"] <= caught["snapshot"]

        lead(live, victim)
        check_everything_readable(live, victim, lo)

        # and so it does after a restart from what it installed and refilled
        first = node_status(c, victim, "g0")["first"]
        c.kill(victim)
        c.start_node(victim)
        lead(live, victim)
        assert node_status(c, victim, "g0")["first"] == first
        check_everything_readable(live, victim, lo)
        live.assert_nodes_healthy()


def test_a_replica_that_compacted_its_own_log_serves_every_retained_message_after_a_restart(
    tmp_path: Path,
) -> None:
    with cluster(tmp_path) as live:
        c = live.cluster
        produce(live, BATCHES)
        lo = horizon(live)
        node = c.groups[0].preferred_leader or 1
        st = node_status(c, node, "g0")
        assert st["first"] > 1 and st["snapshot"] >= st["first"], st  # it compacted

        c.kill(node)
        c.start_node(node)
        lead(live, node)
        after = node_status(c, node, "g0")
        assert after["first"] == st["first"], (st, after)  # nothing more was deleted
        check_everything_readable(live, node, lo)
        live.assert_nodes_healthy()
