"""`raftmq bench scale` (`python -m bench.scale`) at a tiny size: the shape of its JSON result
and the sanity of its values (something acknowledged, every shard process accounted for,
latencies ordered). How fast anything is never decides a test here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bench import scale
from raftmq.commands.bench import BENCHMARKS


def test_scale_is_a_benchmark() -> None:
    assert "scale" in BENCHMARKS


def test_layouts_parse_and_label() -> None:
    today = scale.parse_layout("nodes=3")
    assert (today.hosts, today.processes, today.groups) == (None, 3, 3)
    sharded = scale.parse_layout("hosts=3,shards=2")
    assert (sharded.processes, sharded.groups, sharded.label) == (6, 6,
                                                                  "hosts=3,shards=2,groups=6")
    assert scale.parse_layout("hosts=2,groups=4").label == "hosts=2,shards=1,groups=4"
    for bad in ("nodes=3,shards=2", "shards=2", "hosts=x", "cores=4", "nodes=0"):
        with pytest.raises(argparse.ArgumentTypeError):
            scale.parse_layout(bad)


def test_latency_histograms_merge_over_processes() -> None:
    # 10 µs buckets: 1 ms is bucket 100; 100 calls at 1 ms, 100 at 2 ms, then 1 at 50 ms
    a = {"100": 100, "5000": 1}
    b = {"200": 100}
    lat = scale.merge_latency([a, b], ("p50", "p99", "max"))
    assert lat == {"p50": 2.0, "p99": 2.0, "max": 50.0}
    assert scale.merge_latency([], ("p50",)) == {"p50": 0.0}


def test_compare_defaults_to_todays_three_nodes() -> None:
    args = scale.build_parser().parse_args(["--compare"])
    assert args.compare == "nodes=3" and args.hosts == 3 and args.shards == 1
    assert args.api == "batch" and args.batch == 256 and args.size == 100
    with pytest.raises(SystemExit):
        scale.build_parser().parse_args(["--api", "single"])


def _check_run(r: dict[str, Any], processes: int) -> None:
    assert r["acknowledged"] > 0 and r["msgs_per_s"] > 0 and r["errors"] == 0
    lat = r["latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"]
    assert len(r["per_shard"]) == processes == r["nodes"]
    assert all(s["cpu_cores"] >= 0 and s["replicas"] > 0 for s in r["per_shard"])
    assert sorted(g for s in r["per_shard"] for g in s["leads"]) == sorted(
        f"g{k}" for k in range(r["groups"]))
    assert r["node_cpu_cores"] > 0 and r["node_cpu_us_per_msg"] > 0
    assert len(r["producer_cpu_cores"]) == 1
    assert r["machine"]["cpus"] >= 1 and "loadavg_1m" in r["machine"]
    assert r["unexpected_exits"] is None


@pytest.mark.live
def test_bench_scale_batch_against_todays_nodes(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = scale.main(["--hosts", "3", "--shards", "1", "--producers", "1", "--seconds", "2",
                       "--warmup", "0.5", "--in-flight", "1024", "--compare",
                       "--data-dir", str(tmp_path), "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0, result
    assert result["benchmark"] == "scale" and result["api"] == "batch"
    (run,) = result["runs"]
    assert run["layout"] == "hosts=3,shards=1,groups=3" and run["hosts"] == 3
    assert run["latency_of"] == "send_batch call"
    _check_run(run, 3)
    assert {s["host"] for s in run["per_shard"]} == {"h1", "h2", "h3"}
    (other,) = result["compare"]["runs"]
    assert other["layout"] == "nodes=3,groups=3" and other["hosts"] is None
    _check_run(other, 3)
    assert set(result["ratio"]) == {"msgs_per_s", "node_cpu_us_per_msg", "p50_ms", "p99_ms"}
    assert result["ratio"]["msgs_per_s"] > 0


@pytest.mark.live
def test_bench_scale_async_on_two_shards_per_host_at_a_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = scale.main(["--hosts", "3", "--shards", "2", "--producers", "1", "--api", "async",
                       "--seconds", "2", "--warmup", "0.5", "--rate", "2000",
                       "--data-dir", str(tmp_path), "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0, result
    (run,) = result["runs"]
    assert run["layout"] == "hosts=3,shards=2,groups=6" and run["queues"] == 24
    assert run["latency_of"] == "message" and run["rate_cap_msgs_per_s"] == 2000
    _check_run(run, 6)
    # the cap holds: no more than was sent from the go (warmup + seconds), whatever the timing
    assert run["msgs_per_s"] <= 2000 * (0.5 + 2) / 2 + 1
    assert "compare" not in result
