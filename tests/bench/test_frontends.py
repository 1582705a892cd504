"""`raftmq bench http` and `raftmq bench mqtt` once each at a tiny size, against one
cluster of real processes, each starting its own `raftmq console` / `raftmq mqtt`
process as a user would. Only the shape of the JSON result and the sanity of its values
are checked (every message answered, counts add up, rates and latencies positive): how
fast anything is never decides a test here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from raftmq.commands.bench import BENCHMARKS
from raftmq.commands.bench import main as bench_main
from raftmq.localcluster import LocalCluster

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("bench-frontends") / "cluster") as c:
        c.wait_ready(timeout=60.0)
        yield c


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert bench_main(argv) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return result


def _sane(case: dict[str, Any], messages: int, per_request: int) -> None:
    assert case["errors"] == 0, case["first_error"]
    assert case["messages"] == messages and case["messages_per_request"] == per_request
    assert case["msgs_per_s"] > 0
    lat = case["latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]


def test_both_are_subcommands() -> None:
    assert {"http", "mqtt"} <= set(BENCHMARKS)


def test_bench_http_compares_both_protocols(cluster: LocalCluster,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, ["http", "--namesrv", cluster.namesrv_addr, "--messages", "60",
                      "--batch", "8", "--concurrency", "4", "--json"])
    assert r["benchmark"] == "http" and r["errors"] == 0
    for name in ("binary_single", "http_single"):
        _sane(r[name], 60, 1)
    for name in ("binary_batch", "http_batch"):
        _sane(r[name], 64, 8)  # whole batches: 60 rounds up to 8 x 8
    for how in ("single", "batch"):
        assert r["http_vs_binary"][how]["msgs_per_s"] > 0
        assert r["http_vs_binary"][how]["p99_ms"] > 0


def test_bench_mqtt_compares_qos1_with_the_sdk(cluster: LocalCluster,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, ["mqtt", "--namesrv", cluster.namesrv_addr, "--messages", "40",
                      "--clients", "3", "--json"])
    assert r["benchmark"] == "mqtt" and r["errors"] == 0
    for name in ("binary_single", "mqtt_qos1"):
        _sane(r[name], 40, 1)
    assert r["mqtt_vs_binary"]["msgs_per_s"] > 0
