"""`raftmq bench cpu` (`python -m bench.cpu_per_entry`) at a tiny size: the result has the
CPU of every hop and adds up (shape and sanity only: how much CPU or time anything takes
never decides a test)."""

from __future__ import annotations

import json

import pytest

from bench import cpu_per_entry
from raftmq.commands.bench import BENCHMARKS


def test_cpu_per_entry_is_a_benchmark() -> None:
    assert "cpu" in BENCHMARKS


@pytest.mark.live
def test_one_in_flight_reports_the_cpu_of_every_hop(capsys: pytest.CaptureFixture[str]) -> None:
    assert cpu_per_entry.main(["--messages", "60", "--warmup", "10"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["benchmark"] == "cpu_per_entry" and r["messages"] == 60
    assert r["entries"] >= 60 and r["fsyncs"] >= 60  # one entry each, fsynced on a majority
    assert 0 < r["p50_ms"] <= r["p99_ms"]
    assert r["leader"] is not None and len(r["followers"]) == 2
    hops = [r["client"], r["leader"], *r["followers"].values()]
    for hop in hops:
        assert set(hop) == {"us_per_msg", "main", "other_threads"}
        assert hop["us_per_msg"] == pytest.approx(
            hop["main"]["us_per_msg"] + hop["other_threads"]["us_per_msg"], abs=0.2)
    nodes = [r["leader"], *r["followers"].values()]
    assert r["cluster_us_per_msg"] == pytest.approx(sum(h["us_per_msg"] for h in nodes), abs=0.5)
    assert r["end_to_end_us_per_msg"] == pytest.approx(
        r["cluster_us_per_msg"] + r["client"]["us_per_msg"], abs=0.5)
