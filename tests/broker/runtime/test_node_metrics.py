"""A live node's Prometheus endpoint reflects its groups and its traffic."""

from __future__ import annotations

import time

import pytest

from raftmq.localcluster import LocalCluster
from tests.live_cluster import scrape_metrics as _scrape
from transport.blocking import request
from wire.protocol import Op
from wire.records import OutgoingMessage, encode_batch

pytestmark = pytest.mark.live


def test_metrics_show_roles_indexes_traffic_and_lag(tmp_path):
    with LocalCluster(tmp_path, nodes=3, groups=3) as cluster:
        cluster.wait_ready(timeout=60)
        deadline = time.monotonic() + 30
        while cluster.leaders() != {"g0": 1, "g1": 2, "g2": 3}:  # preferred leaders settle
            assert time.monotonic() < deadline, cluster.leaders()
            time.sleep(0.1)
        node = 1
        addr = cluster.node_addr(node)
        request(addr, {"op": Op.CREATE_TOPIC, "g": "g0", "topic": "mt", "queues": 1,
                       "hosted": [0]})
        batch = encode_batch("mt", 0, [OutgoingMessage(b"m" * 100)] * 10)
        for _ in range(5):
            request(addr, {"op": Op.PRODUCE, "g": "g0"}, batch)
        request(addr, {"op": Op.FETCH, "topic": "mt", "queue": 0, "offset": 0, "max": 20,
                       "wait_ms": 0})
        request(addr, {"op": Op.COMMIT_OFFSET, "cg": "readers", "offsets": [["mt", 0, 20]]})
        metrics_addr = cluster.configs[node - 1].metrics
        assert metrics_addr is not None
        deadline = time.monotonic() + 10
        while True:  # gauges refresh every second
            m = _scrape(metrics_addr)
            lag = m.get('raftmq_consumer_lag{cg="readers",group="g0",queue="0",topic="mt"}')
            if lag is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert lag == 30.0
        assert m['raftmq_raft_role{group="g0"}'] == 2.0  # leader
        assert m['raftmq_produce_messages_total{group="g0"}'] == 50.0
        assert m['raftmq_fetch_messages_total{group="g0"}'] == 20.0
        assert m['raftmq_raft_commit_index{group="g0"}'] >= 7  # NOOP, topic, 5 batches
        # the leader counts itself toward a commit only once its own fsync covers it
        assert m['raftmq_raft_durable_index{group="g0"}'] >= m['raftmq_raft_commit_index{group="g0"}']
        assert m['raftmq_fsync_seconds_count{group="g0"}'] > 0
        follower = next(n for n in cluster.node_ids if n != node)
        deadline = time.monotonic() + 10
        while True:  # its gauges may still show a role it had before the last refresh
            fm = _scrape(cluster.configs[follower - 1].metrics or "")
            if fm.get('raftmq_raft_role{group="g0"}') == 0.0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert fm['raftmq_raft_role{group="g0"}'] == 0.0
