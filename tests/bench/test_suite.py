"""The cluster benchmarks (`bench.e2e`, `bench.consume`, `bench.topics`, `bench.failover`,
and `bench.produce`'s result contract), each run once at a tiny size; produce, e2e and
topics once more with the batch api (`--api batch`, `Producer.send_batch`).

One cluster of real processes serves the whole module: the benchmarks reach it through
`--namesrv`, except failover, which is handed the `LocalCluster` itself because it kills
and restarts nodes (it runs last and leaves the preferred leaders back in place). Only
the shape of each JSON result and the sanity of its values are checked (counts add up,
latencies and rates are positive): how fast anything is never decides a test here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import ack, consume, delay, e2e, failover, filter, produce, topics, trace
from bench.common import (
    Acks,
    Pacer,
    batch_producer_options,
    batch_tasks,
    latency_ms,
    percentile,
    send_batches,
)
from raftmq.commands.bench import BENCHMARKS
from raftmq.commands.bench import main as bench_main
from raftmq.localcluster import LocalCluster

READY_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("bench") / "cluster")
    c.start()
    try:
        c.wait_ready(timeout=READY_TIMEOUT)
        c.wait_preferred_leaders()
        yield c
    finally:
        c.stop()


def _run(capsys: pytest.CaptureFixture[str], main: Any, argv: list[str]) -> dict[str, Any]:
    """Run a benchmark's `main(argv)`; its exit code and its one JSON line."""
    code = main(argv)
    out = capsys.readouterr().out.strip().splitlines()
    result: dict[str, Any] = json.loads(out[-1])
    result["_exit"] = code
    return result


def _positive_latencies(lat: dict[str, float]) -> None:
    assert set(lat) >= {"p50", "p99"}
    assert 0 < lat["p50"] <= lat["p99"]


# ------------------------------------------------------------------ pure helpers


def test_percentile_and_latency_summary() -> None:
    values = [i / 1000 for i in range(1, 1001)]  # 1 ms ... 1000 ms
    assert percentile([], 99) == 0.0
    assert percentile(values, 50) == 0.501
    assert latency_ms(values, ("p50", "p99", "max")) == {"p50": 501.0, "p99": 991.0,
                                                          "max": 1000.0}


def test_pacer_releases_at_its_rate() -> None:
    import anyio

    async def count(rate: float, seconds: float) -> int:
        pacer = Pacer(rate)
        released = 0
        with anyio.move_on_after(seconds):
            while True:
                released += await pacer.due()
        return released

    # never ahead of schedule (one send is due at the start)
    assert 1 <= anyio.run(count, 1000.0, 0.2) <= 1000 * 0.2 + 1 + 1000 * 0.05


def test_batch_window_is_whole_calls() -> None:
    assert batch_tasks(8192, 256) == 32
    assert batch_tasks(256, 32) == 8
    assert batch_tasks(100, 256) == 1          # a window smaller than a batch: one call
    assert batch_tasks(8192, 256, batches=5) == 5  # never more calls than batches
    opts = batch_producer_options(32, 8)
    assert opts["linger_ms"] == 0 and opts["batch_max_messages"] == 32
    assert opts["max_in_flight"] >= 8 and opts["max_pending"] >= 8 * 32


class _FakeProducer:
    """Records `send_batch` calls; the calls to `fail_queue` raise."""

    def __init__(self, fail_queue: int | None = None) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.fail_queue = fail_queue
        self.active = self.peak = 0

    async def send_batch(self, topic: str, messages: list[bytes], *, queue: int) -> list[Any]:
        import anyio

        self.calls.append((topic, queue, len(messages)))
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await anyio.sleep(0.001)
        finally:
            self.active -= 1
        if queue == self.fail_queue:
            raise RuntimeError("nack")
        return [None] * len(messages)


@pytest.mark.parametrize("tasks, targets", [(8, 12), (24, 12), (5, 3)])
def test_send_batches_spreads_calls_over_every_target(tasks: int, targets: int) -> None:
    import anyio

    fake = _FakeProducer()
    acks = Acks()
    where = [("t", q) for q in range(targets)]
    anyio.run(send_batches, fake, where, [b"x"] * 4, 60, tasks, acks)  # type: ignore[arg-type]
    assert len(fake.calls) == 60 and fake.peak == min(tasks, 60)
    per_queue = [sum(1 for _, q, _ in fake.calls if q == i) for i in range(targets)]
    assert per_queue == [60 // targets] * targets   # round robin: every queue, evenly
    assert acks.acknowledged == 240 and acks.errors == 0  # each message of each call


def test_send_batches_counts_every_message_of_a_failed_call() -> None:
    import anyio

    fake = _FakeProducer(fail_queue=1)
    acks = Acks()
    anyio.run(send_batches, fake, [("t", 0), ("t", 1)], [b"x"] * 3, 4, 2,  # type: ignore[arg-type]
              acks)
    assert acks.errors == 6 and acks.acknowledged == 6
    assert acks.first_error == "RuntimeError('nack')"
    assert len(set(acks.latencies)) <= 2  # a call's messages share its latency


def test_topics_batch_targets_cycle_over_topics_then_queues() -> None:
    assert topics.batch_targets(["a", "b", "c"], 2) == [
        ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1)]


def test_every_benchmark_is_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(BENCHMARKS) >= {"produce", "e2e", "consume", "topics", "failover"}
    assert bench_main([]) == 2
    usage = capsys.readouterr().err
    assert all(name in usage for name in ("e2e", "consume", "topics", "failover"))


# ------------------------------------------------------------------ against the cluster


@pytest.mark.live
def test_produce_result_keys(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    """Other benchmarks and tools read these keys: they stay as they are."""
    r = _run(capsys, produce.main, ["--namesrv", cluster.namesrv_addr, "--messages", "300",
                                    "--queues", "3", "--json"])
    assert r["_exit"] == 0
    assert set(r) - {"_exit"} == {
        "benchmark", "api", "messages", "acknowledged", "errors", "first_error", "size_bytes",
        "seconds", "msgs_per_s", "mb_per_s", "latency_ms", "in_flight_latency_ms", "in_flight",
        "batch_messages",
        "concurrent_batches", "batch_max_messages", "linger_ms", "queues", "cluster",
        "namesrv", "raft_entries", "msgs_per_entry", "fsyncs", "node_cpu_s",
        "node_cpu_us_per_entry", "node_cpu_us_per_msg"}
    assert r["acknowledged"] == 300 and set(r["latency_ms"]) == {"p50", "p99", "p999"}
    # in flight: from the call's return, so never longer than from the call, message by message
    assert set(r["in_flight_latency_ms"]) == {"p50", "p99", "p999"}
    assert all(r["in_flight_latency_ms"][p] <= r["latency_ms"][p] for p in ("p50", "p99"))
    assert r["raft_entries"] > 0 and r["fsyncs"] > 0
    assert r["node_cpu_s"] is None  # an external cluster: its processes are not ours to read
    assert r["api"] == "single" and r["batch_messages"] is r["concurrent_batches"] is None


@pytest.mark.live
def test_produce_batch_api(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, produce.main, ["--namesrv", cluster.namesrv_addr, "--api", "batch",
                                    "--batch", "16", "--in-flight", "64", "--messages", "300",
                                    "--queues", "3", "--json"])
    assert r["_exit"] == 0, r
    assert r["api"] == "batch" and r["batch_messages"] == 16 and r["concurrent_batches"] == 4
    assert r["messages"] == r["acknowledged"] == 19 * 16  # rounded up to whole batches
    assert r["errors"] == 0 and r["first_error"] is None
    assert r["linger_ms"] == 0 and r["batch_max_messages"] == 16
    assert r["msgs_per_s"] > 0
    _positive_latencies(r["latency_ms"])


@pytest.mark.live
def test_e2e(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    # no --rate: the quick max measurement sets it
    r = _run(capsys, e2e.main, ["--namesrv", cluster.namesrv_addr, "--probe-messages", "1000",
                                "--fraction", "0.1", "--duration", "1", "--warmup", "0.3",
                                "--queues", "3", "--json"])
    assert r["_exit"] == 0, r
    assert r["benchmark"] == "e2e" and r["cluster"] == "external"
    assert r["rate_source"] == "0.1 x measured max" and r["max_msgs_per_s"] > 0
    assert r["rate_msgs_per_s"] == pytest.approx(r["max_msgs_per_s"] * 0.1, rel=0.01)
    assert r["acked"] == r["sent"] == r["received"]
    assert r["missing"] == r["errors"] == r["duplicates"] == 0
    _positive_latencies(r["ack_latency_ms"])
    _positive_latencies(r["e2e_latency_ms"])
    assert r["achieved_msgs_per_s"] > 0
    assert set(r["target"]) == {"ack_p99_ms", "met"}


@pytest.mark.live
def test_e2e_batch_api(cluster: LocalCluster, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    probes: list[Any] = []
    real_drive = produce.drive

    async def drive(namesrv: str, topic: str, args: Any) -> dict[str, Any]:
        probes.append(args)
        return await real_drive(namesrv, topic, args)

    monkeypatch.setattr(produce, "drive", drive)
    r = _run(capsys, e2e.main, ["--namesrv", cluster.namesrv_addr, "--api", "batch",
                                "--batch", "8", "--probe-messages", "400", "--fraction", "0.1",
                                "--duration", "1", "--warmup", "0.3", "--queues", "3",
                                "--json"])
    assert r["_exit"] == 0, r
    # the maximum the rate is a share of was measured the same way
    (probe,) = probes
    assert (probe.api, probe.batch, probe.messages) == ("batch", 8, 400)
    assert r["api"] == "batch" and r["batch_messages"] == 8 and r["linger_ms"] == 0
    assert r["rate_msgs_per_s"] == pytest.approx(r["max_msgs_per_s"] * 0.1, rel=0.01)
    rate = r["rate_msgs_per_s"]
    warm = int(rate * 0.3 / 8) * 8
    assert r["sent"] == warm + max(1, int(rate / 8)) * 8  # whole batches
    assert r["acked"] == r["sent"] == r["received"]
    assert r["missing"] == r["errors"] == r["duplicates"] == 0
    _positive_latencies(r["ack_latency_ms"])
    _positive_latencies(r["e2e_latency_ms"])


@pytest.mark.live
@pytest.mark.parametrize("consumer", ["pull", "none"])
def test_e2e_at_a_given_rate(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str], consumer: str
) -> None:
    r = _run(capsys, e2e.main, ["--namesrv", cluster.namesrv_addr, "--rate", "300",
                                "--duration", "1", "--warmup", "0.2", "--queues", "3",
                                "--consumer", consumer, "--json"])
    assert r["_exit"] == 0, r
    assert r["rate_source"] == "given" and r["max_msgs_per_s"] is None
    assert r["consumer"] == consumer and r["errors"] == 0
    assert r["acked"] == r["sent"] == int(300 * 0.2) + 300
    _positive_latencies(r["ack_latency_ms"])
    if consumer == "none":  # acknowledgements only
        assert r["received"] is None and r["missing"] is None and r["e2e_latency_ms"] is None
    else:
        assert r["received"] == r["sent"] and r["missing"] == 0
        _positive_latencies(r["e2e_latency_ms"])


def _node_data(cluster: LocalCluster) -> list[str]:
    return [arg for c in cluster.configs for arg in ("--node-data", str(c.data))]


@pytest.mark.live
def test_consume_hot_and_cold(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, consume.main, ["--namesrv", cluster.namesrv_addr, "--messages", "600",
                                    "--size", "1024", "--queues", "3", "--consumers", "2",
                                    "--cold-method", "fadvise", *_node_data(cluster), "--json"])
    assert r["_exit"] == 0 and r["mode"] == "hot_cold"
    assert r["messages"] == r["fill"]["messages"] == 600
    for phase in (r["hot"], r["cold"]):
        assert phase["messages"] == 600
        assert phase["mb"] == pytest.approx(600 * 1024 / 1e6, abs=0.1)
        assert phase["msgs_per_s"] > 0 and phase["mb_per_s"] > 0
    ev = r["eviction"]
    assert ev["method"] == "fadvise" and ev["files"] > 0
    if ev["resident_mb_before"] is not None:  # mincore answered
        assert ev["resident_mb_after"] <= ev["resident_mb_before"]


@pytest.mark.live
def test_consume_catch_up(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, consume.main, ["--namesrv", cluster.namesrv_addr, "--catch-up",
                                    "--backlog-gb", "0.002", "--size", "4096", "--queues", "3",
                                    "--producer-rate", "200", "--producer-warmup", "0.5",
                                    "--baseline-seconds", "1", "--cold-method", "fadvise",
                                    *_node_data(cluster), "--json"])
    assert r["_exit"] == 0 and r["mode"] == "catch_up"
    built = r["backlog_build"]["messages"]
    assert built == -(-2_000_000 // 4096)
    read = r["catch_up_read"]
    assert read["messages"] >= built  # plus what the producers added before the read
    assert read["mb_per_s"] > 0
    assert r["producers_alone_before"]["msgs_per_s"] > 0
    assert r["producers_alone_after"]["msgs_per_s"] > 0
    # the tiny catch-up may end before the producers report twice: then no rate is given
    assert r["producers_during_catch_up"]["errors"] in (0, None)
    assert r["producer_fraction"] is None or r["producer_fraction"] >= 0
    assert set(r["target"]) == {"read_mb_per_s", "producer_fraction", "met"}


@pytest.mark.live
def test_topics(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, topics.main, ["--namesrv", cluster.namesrv_addr, "--topics", "5,1",
                                   "--messages", "500", "--queues", "2", "--json"])
    assert r["_exit"] == 0 and r["errors"] == 0 and r["failed_phase"] is None
    assert [p["topics"] for p in r["phases"]] == [1, 5]
    assert [p["created"] for p in r["phases"]] == [1, 4]
    for p in r["phases"]:
        assert p["acknowledged"] == 500 and p["msgs_per_s"] > 0
        assert p["create_s"] >= 0 and p["route_s"] >= 0
        assert p["raft_entries"] > 0 and p["msgs_per_entry"] > 0
        _positive_latencies(p["latency_ms"])
    assert r["phases"][0]["ratio_to_one_topic"] == 1.0
    assert r["target"]["met"] is None  # no 10,000-topic phase to judge
    assert r["api"] == "single" and r["batch_messages"] is None


@pytest.mark.live
def test_topics_batch_api(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, topics.main, ["--namesrv", cluster.namesrv_addr, "--topics", "1,3",
                                   "--messages", "95", "--queues", "2", "--api", "batch",
                                   "--batch", "10", "--in-flight", "40", "--json"])
    assert r["_exit"] == 0 and r["errors"] == 0 and r["failed_phase"] is None
    assert r["api"] == "batch" and r["batch_messages"] == 10 and r["concurrent_batches"] == 4
    assert r["messages_per_phase"] == 100  # rounded up to whole batches
    assert [p["topics"] for p in r["phases"]] == [1, 3]
    assert [p["queues_sent_to"] for p in r["phases"]] == [2, 6]  # every queue of every topic
    for p in r["phases"]:
        assert p["acknowledged"] == 100 and p["errors"] == 0 and p["msgs_per_s"] > 0
        # 10 calls of 10 messages; calls to queues of one group may share an entry
        assert p["raft_entries"] > 0 and p["msgs_per_entry"] > 0
        _positive_latencies(p["latency_ms"])


@pytest.mark.live
def test_delay(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, delay.main, ["--namesrv", cluster.namesrv_addr, "--messages", "512",
                                  "--pending", "512", "--due", "512", "--lead", "1",
                                  "--spread", "50", "--spread-rate", "200",
                                  "--spread-delay", "0.5", "--timeout", "60", "--json"])
    assert r["_exit"] == 0 and r["errors"] == 0
    sends = r["sends"]
    assert sends["plain"]["acknowledged"] == sends["delayed"]["acknowledged"] == 512
    assert sends["delayed_vs_plain"] > 0
    # every message read, none early (the warm-up message of each topic comes too)
    assert r["lateness"]["read"] == 51 and r["lateness"]["early"] == 0
    assert r["due_at_once"]["read"] == 513 and r["due_at_once"]["early"] == 0
    assert r["due_at_once"]["delivered_msgs_per_s"] > 0
    assert r["pending"]["messages"] == 512  # an external cluster: no node RSS here
    assert r["pending"]["node_rss_mb_delta"] == []


@pytest.mark.live
def test_filter(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, filter.main, ["--namesrv", cluster.namesrv_addr, "--messages", "1200",
                                   "--batch", "100", "--json"])
    assert r["_exit"] == 0 and r["errors"] == 0 and r["messages"] == 1200
    got = {name: (c["received"], c["scanned"]) for name, c in r["cases"].items()}
    assert got == {"none": (1200, 1200), "all": (1200, 1200), "half": (600, 1200),
                   "one_percent": (12, 1200)}
    assert all(c["vs_none"] > 0 for name, c in r["cases"].items() if name != "none")


@pytest.mark.live
def test_trace(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, trace.main, ["--namesrv", cluster.namesrv_addr, "--messages", "1200",
                                  "--batch", "100", "--json"])
    assert r["_exit"] == 0 and r["errors"] == 0
    off, on = r["cases"]["off"], r["cases"]["on"]
    assert off["consume"]["received"] == on["consume"]["received"] == 1200
    assert off["trace_records"] == 0
    # one record (sent and stored) per message from the producer's reports; delivered
    # and acked steps from the consumer's, together when one report carried both
    assert on["produce"]["trace_records"] == 1200
    assert 1200 <= on["consume"]["trace_records"] <= 2400
    assert 2 <= on["records_per_message"] <= 3
    assert on["produce"]["vs_off"] > 0 and on["consume"]["vs_off"] > 0


@pytest.mark.live
def test_ack(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys, ack.main, ["--namesrv", cluster.namesrv_addr, "--messages", "600",
                                "--batch", "32", "--expire", "50", "--invisible", "0.5",
                                "--retries", "50", "--retry-delay", "0.5", "--json"])
    assert r["_exit"] == 0 and r["early"] == 0
    assert r["pull_commit"]["messages"] == r["receive_ack"]["messages"] == 600
    assert r["receive_ack_vs_pull_commit"] > 0
    assert r["redelivery"]["messages"] == r["retries"]["messages"] == 50
    _positive_latencies(r["redelivery"]["lateness_ms"])
    assert r["retries"]["nacks_per_s"] > 0


@pytest.mark.live
def test_failover_one_kill(cluster: LocalCluster) -> None:
    """Last: it kills a leader and restarts it (the preferred leaders come back)."""
    args = failover.build_parser().parse_args(["--kills", "1", "--rate", "200"])
    r = failover.run_failover(args, cluster)
    assert r["kills"] == r["resumed"] == 1 and r["errors"] == 0
    (sample,) = r["samples"]
    assert sample["group"] == "g0" and sample["killed_node"] in cluster.node_ids
    assert sample["resume_s"] > 0 and sample["new_leader"] != sample["killed_node"]
    assert r["resume_s"]["p50"] == r["resume_s"]["max"] == sample["resume_s"]
    assert r["acked"] > 0
    assert {g.id: g.preferred_leader for g in cluster.groups} == cluster.leaders()
    assert not cluster.unexpected_exits()
    json.dumps(r)  # one JSON object


def test_failover_refuses_an_external_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        failover.main(["--namesrv", "127.0.0.1:1", "--json"])
    assert "starts its own cluster" in capsys.readouterr().err


@pytest.mark.live
def test_cluster_data_dirs_hold_commitlog_files(cluster: LocalCluster) -> None:
    files = consume.commitlog_files([Path(c.data) for c in cluster.configs])
    assert files and all(p.parent.name == "commitlog" for p in files)
