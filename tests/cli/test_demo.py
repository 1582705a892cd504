"""The `make run` demo: a 3-replica group on real CommitLogs survives a leader crash."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raftlog.demo import LocalGroup

pytestmark = pytest.mark.live


def test_demo_command_reports_identical_committed_logs(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "raftmq.cli", "demo", "--entries", "300", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical" in out.stdout


def test_a_restarted_replica_recovers_its_log_and_term_from_disk(tmp_path):
    group = LocalGroup(tmp_path)
    try:
        group.run_until(lambda: group.leader() is not None)
        group.produce(200, 100, per_round=50)
        leader = group.leader()
        term, last = leader.term, leader.last_index
        group.crash(leader.id)
        group.start(leader.id)
        back = group.nodes[leader.id]
        assert back.term == term and back.last_index == last
        group.run_until(lambda: group.leader() is not None)
        group.produce(100, 100, per_round=50)
        target = group.leader().commit
        group.run_until(lambda: all(group.applied[i] >= target for i in group.ids))
        images = {bytes(group.logs[i].read_raw(1, target + 1)) for i in group.ids}
        assert len(images) == 1
    finally:
        group.close()
