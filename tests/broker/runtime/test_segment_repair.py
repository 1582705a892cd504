"""A node started on a middle CommitLog segment cut short repairs it from its peers.

Found by the chaos `truncate-file` nemesis: a middle segment of a stopped node's group
was cut; the node started, and the first repair of an entry from the cut-off tail
raised out of the repair loop and killed the node. Now recovery reports those entries,
the node fetches each from a peer and writes it back where it belongs, and runs on.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import live_cluster, node_status, wait_for
from tests.live_cluster import LiveCluster
from wire.records import OutgoingMessage

pytestmark = pytest.mark.live


def test_a_node_started_on_a_cut_middle_segment_repairs_it_and_runs_on(tmp_path: Path) -> None:
    with live_cluster(tmp_path, groups=1, node_overrides={"segment_size": 4096}) as cluster:
        live = LiveCluster(cluster, "t", 1)
        live.settle()
        live.create_topic()
        for b in range(40):
            msgs = [OutgoingMessage(f"b{b}-m{i}".encode() * 30) for i in range(4)]
            live.produce_batch(0, msgs, pid=0, seq=-1, born_ms=1)
        leader = live.leader("g0")
        victim, other = (i for i in cluster.node_ids if i != leader)
        wait_for(lambda: node_status(cluster, victim, "g0").get("applied", 0)
                 >= node_status(cluster, leader, "g0")["applied"] or None, 30,
                 "the victim caught up")
        cluster.kill(victim, signal.SIGTERM)  # a clean stop: its index vouches for every entry
        segments = sorted((cluster.configs[victim - 1].data / "g0" / "commitlog").glob("0*"))
        assert len(segments) >= 4
        middle = segments[len(segments) // 2]
        os.truncate(middle, middle.stat().st_size // 3)

        assert cluster.restart_and_wait(victim) is None
        wait_for(lambda: (lambda st: st.get("repaired", 0) >= 1 and not st["unrepaired"])(
            node_status(cluster, victim, "g0")) or None, 30, "the cut entries repaired")
        # the repaired replica's acknowledgements alone now let the leader commit
        cluster.kill(other)
        # idempotent: the commit waits on the repaired replica and may outlast the first
        # try, and a resend of a batch already committed must not store it twice
        live.produce_batch(0, [OutgoingMessage(b"after the repair")], pid=77, seq=0, born_ms=1)
        assert cluster.is_running(victim)
        assert live.fetch(0) == live.acked[0]
        st = node_status(cluster, victim, "g0")
        assert not st["unrepaired"], st
        assert cluster.unexpected_exits() == {}
