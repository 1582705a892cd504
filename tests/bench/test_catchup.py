"""`raftmq bench catchup` at a tiny size: a replica taken out and added back catches up
from the leader under reads, and the result reports it (shape and sanity only: how much
memory or time it takes never decides a test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import catchup
from raftmq.commands.bench import BENCHMARKS


def test_catchup_is_a_benchmark() -> None:
    assert "catchup" in BENCHMARKS


@pytest.mark.live
def test_a_replica_added_back_catches_up_under_reads(tmp_path: Path) -> None:
    args = catchup.build_parser().parse_args(
        ["--messages", "400", "--in-flight", "2", "--readers", "2", "--timeout", "120",
         "--data-dir", str(tmp_path)])
    r = catchup.run_catchup(args)
    assert r["log_entries"] >= 200 and r["log_bytes"] >= 400 * 500
    assert sorted(r["voters_after"]) == [1, 2, 3] and r["replica"] != r["leader"]
    assert r["catch_up_s"] > 0 and r["reads"] > 0
    assert r["leader_rss_mib"]["peak"] >= r["leader_rss_mib"]["before"] > 0
    assert r["status_ms"]["max"] >= r["status_ms"]["p50"] > 0
    json.dumps(r)


def test_catchup_needs_a_cluster_of_its_own() -> None:
    args = catchup.build_parser().parse_args(["--namesrv", "127.0.0.1:1"])
    with pytest.raises(ValueError, match="starts itself"):
        catchup.run_catchup(args)
