"""bench.peers: report shape, ratios, skipping what is not installed, process cleanup, and
one real (small) run of the pysyncobj peer. Nothing here installs anything."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rich.console import Console

import bench.peers.common as common
from bench.peers import PEER_MODULES, all_peers, get_peer
from bench.peers.__main__ import main, run_ours
from bench.peers.common import LoadSpec, PeerError, Procs, drive, run_peer, wait_until
from bench.peers.report import build_report, ours_row, ratio, render

SPEC = LoadSpec(messages=1000, size=100, in_flight=256)


def _row(peer: str, msgs: float, p99: float, **extra: Any) -> dict[str, Any]:
    row = {"peer": peer, "system": peer.upper(), "status": "ok", "version": "1.0",
           "durability": "fsync, majority", "durability_detail": "fsyncs", "notes": "",
           "msgs_per_s": msgs, "mb_per_s": msgs * 100 / 1e6, "p50_ms": p99 / 2,
           "p99_ms": p99, "p999_ms": p99 * 2, "errors": 0}
    row.update(extra)
    return row


def _produce_result(**extra: Any) -> dict[str, Any]:
    result = {"benchmark": "produce", "messages": 1000, "acknowledged": 1000, "errors": 0,
              "first_error": None, "size_bytes": 100, "seconds": 0.5, "msgs_per_s": 2000.0,
              "mb_per_s": 0.2, "latency_ms": {"p50": 10.0, "p99": 20.0, "p999": 30.0},
              "in_flight": 256, "batch_max_messages": 512, "linger_ms": 2.0, "queues": 12,
              "groups": 3, "fsync": "always"}
    result.update(extra)
    return result


def _skipped(peer: str) -> dict[str, Any]:
    return {"peer": peer, "system": peer, "status": "skipped", "durability": "NO fsync",
            "reason": "server binary not found: nats-server",
            "install": "sudo apt-get update && sudo apt-get install -y nats-server"}


# ------------------------------------------------------------------ report and ratios

def test_ratio_is_ours_over_theirs_and_none_without_both_figures() -> None:
    assert ratio(3000.0, 1500.0) == 2.0
    assert ratio(1.0, 3.0) == 0.33
    assert ratio(None, 10.0) is None
    assert ratio(10.0, 0.0) is None
    assert ratio(0.0, 10.0) is None


def test_ours_row_takes_bench_produce_result_as_is() -> None:
    row = ours_row(_produce_result())
    assert row["peer"] == "ours" and row["status"] == "ok"
    assert (row["msgs_per_s"], row["p50_ms"], row["p99_ms"], row["p999_ms"]) == \
        (2000.0, 10.0, 20.0, 30.0)
    assert row["durability"] == "fsync, majority"
    assert row["produce"]["latency_ms"]["p99"] == 20.0  # the raw result travels along
    interval = ours_row(_produce_result(fsync="interval"))
    assert interval["durability"] == "NO fsync"  # page-cache mode is labelled as such
    failed = ours_row(_produce_result(acknowledged=0, errors=5))
    assert failed["status"] == "error"


def test_ours_row_times_the_round_trip_as_the_peers_do() -> None:
    # the peers' workers time one request to its answer: ours is the in-flight latency,
    # not the call-to-ack time that includes waiting for room in the window
    row = ours_row(_produce_result(in_flight_latency_ms={"p50": 1.1, "p99": 1.8,
                                                         "p999": 5.0}))
    assert (row["p50_ms"], row["p99_ms"], row["p999_ms"]) == (1.1, 1.8, 5.0)
    assert row["produce"]["latency_ms"]["p50"] == 10.0  # the call-to-ack figure kept inside


def test_ours_batch_row_is_labelled_with_its_call() -> None:
    row = ours_row(_produce_result(api="batch", batch_messages=32, concurrent_batches=8,
                                   batch_max_messages=32, linger_ms=0.0))
    assert row["system"] == "raftmq (send_batch 32)" and row["api"] == "batch"
    assert "send_batch calls of 32 messages" in row["notes"] and "8 in flight" in row["notes"]
    assert row["durability"] == "fsync, majority"  # same durability label as the other row
    single = ours_row(_produce_result(api="single"))
    assert single["system"] == "raftmq (send_async)" and single["api"] == "single"


def test_report_gives_ratios_only_between_measured_rows() -> None:
    ours = ours_row(_produce_result())
    peers = [_row("nats", 1000.0, 40.0), _skipped("etcd"),
             {"peer": "rabbitmq", "system": "RabbitMQ", "status": "error", "error": "boom"}]
    report = build_report(SPEC, ours, peers, {"cpus": 2, "loadavg_1m": 0.5})
    assert report["peers"][0]["ours_ratio"] == {"msgs_per_s": 2.0, "p99_ms": 0.5}
    assert report["peers"][1]["ours_ratio"] is None
    assert report["peers"][2]["ours_ratio"] is None
    assert report["ours_batch"] is None
    assert all(p["ours_batch_ratio"] is None for p in report["peers"])
    assert "ours_ratio" not in peers[0]  # the input rows are left alone
    # one JSON object with everything, parameters included
    again = json.loads(json.dumps(report))
    assert (again["messages"], again["size_bytes"], again["in_flight"]) == (1000, 100, 256)
    assert again["ours"]["msgs_per_s"] == 2000.0
    assert [p["peer"] for p in again["peers"]] == ["nats", "etcd", "rabbitmq"]
    assert again["machine"]["cpus"] == 2


def _batch_row(msgs: float = 8000.0, p99: float = 10.0) -> dict[str, Any]:
    return ours_row(_produce_result(api="batch", batch_messages=32, concurrent_batches=8,
                                    msgs_per_s=msgs,
                                    latency_ms={"p50": 5.0, "p99": p99, "p999": 12.0}))


def test_report_gives_each_of_our_rows_its_ratios() -> None:
    report = build_report(SPEC, ours_row(_produce_result()), [_row("nats", 1000.0, 40.0)],
                          ours_batch=_batch_row())
    nats = report["peers"][0]
    assert nats["ours_ratio"] == {"msgs_per_s": 2.0, "p99_ms": 0.5}
    assert nats["ours_batch_ratio"] == {"msgs_per_s": 8.0, "p99_ms": 0.25}
    again = json.loads(json.dumps(report))
    assert again["ours"]["system"] == "raftmq (send_async)"
    assert again["ours_batch"]["system"] == "raftmq (send_batch 32)"
    # one of our rows failing leaves the other's ratios
    failed = {"peer": "ours", "system": "raftmq (send_async)", "status": "error", "error": "x"}
    report = build_report(SPEC, failed, [_row("nats", 1000.0, 40.0)], ours_batch=_batch_row())
    assert report["peers"][0]["ours_ratio"] is None
    assert report["peers"][0]["ours_batch_ratio"] == {"msgs_per_s": 8.0, "p99_ms": 0.25}


def test_table_shows_both_of_our_rows_and_both_ratios() -> None:
    report = build_report(SPEC, ours_row(_produce_result()), [_row("nats", 1000.0, 40.0)],
                          ours_batch=_batch_row())
    console = Console(record=True, width=200)
    console.print(render(report))
    text = console.export_text()
    assert "raftmq (send_async)" in text and "raftmq (send_batch 32)" in text
    assert "batch/peer msgs/s" in text
    assert "2.00×" in text and "8.00×" in text and "0.25×" in text
    lines = text.splitlines()
    at = {name: next(i for i, s in enumerate(lines) if name in s)
          for name in ("send_async)", "send_batch 32)", "NATS")}
    assert at["send_async)"] < at["send_batch 32)"] < at["NATS"]  # ours first


def test_run_ours_runs_bench_produce_with_each_api(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.produce

    seen: list[Any] = []

    def run_produce(args: Any) -> dict[str, Any]:
        seen.append(args)
        if args.api == "batch":
            return _produce_result(api="batch", batch_messages=args.batch,
                                   concurrent_batches=args.in_flight // args.batch)
        return _produce_result()

    monkeypatch.setattr(bench.produce, "run_produce", run_produce)
    single = run_ours(SPEC, "always")
    batch = run_ours(SPEC, "always", 32)
    assert [(a.api, a.messages, a.size, a.in_flight) for a in seen] == [
        ("single", 1000, 100, 256), ("batch", 1000, 100, 256)]
    assert seen[1].batch == 32
    assert single["system"] == "raftmq (send_async)"
    assert batch["system"] == "raftmq (send_batch 32)" and batch["status"] == "ok"

    def broken(args: Any) -> dict[str, Any]:
        raise RuntimeError("cluster did not start")

    monkeypatch.setattr(bench.produce, "run_produce", broken)
    failed = run_ours(SPEC, "always", 32)
    assert failed["status"] == "error" and failed["system"] == "raftmq (send_batch 32)"
    assert "cluster did not start" in failed["error"]


def test_report_without_ours_has_no_ratios() -> None:
    report = build_report(SPEC, None, [_row("nats", 1000.0, 40.0)])
    assert report["ours"] is None and report["peers"][0]["ours_ratio"] is None
    failed_ours = {"peer": "ours", "system": "raftmq", "status": "error", "error": "x"}
    report = build_report(SPEC, failed_ours, [_row("nats", 1000.0, 40.0)])
    assert report["peers"][0]["ours_ratio"] is None


def test_table_shows_figures_ratios_durability_and_install_hints() -> None:
    ours = ours_row(_produce_result())
    nats = _row("nats", 1000.0, 40.0, durability="NO fsync",
                durability_detail="acks before fsync", notes="stream leader n1")
    report = build_report(SPEC, ours, [nats, _skipped("etcd"),
                                       {"peer": "rabbitmq", "system": "RabbitMQ",
                                        "status": "error", "error": "node died\nlog line"}],
                          {"cpus": 2, "loadavg_1m": 1.25})
    console = Console(record=True, width=160)
    console.print(render(report))
    text = console.export_text()
    assert "1,000 msgs × 100 B, 256 in flight" in text
    assert "2,000" in text and "1,000" in text            # msgs/s, ours and theirs
    assert "2.00×" in text and "0.50×" in text            # ours/peer msgs/s and p99
    assert "NO fsync" in text and "acks before fsync" in text
    assert "skipped" in text and "sudo apt-get install -y nats-server" in text
    assert "error" in text and "node died" in text
    assert "load average 1.25" in text
    lines = text.splitlines()
    assert next(i for i, s in enumerate(lines) if "raftmq" in s) < \
        next(i for i, s in enumerate(lines) if "NATS" in s)  # ours first


# ------------------------------------------------------------------ what is not installed

@pytest.fixture
def nothing_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PATH and sbin point at an empty directory, and no peer-specific directories exist."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(common, "EXTRA_BIN_DIRS", ())
    real = common.find_binary
    monkeypatch.setattr(common, "find_binary", lambda name, first_dirs=(): real(name, ()))


@pytest.mark.usefixtures("nothing_installed")
@pytest.mark.parametrize("name, package", [("nats", "nats-server"), ("etcd", "etcd-server"),
                                           ("rabbitmq", "rabbitmq-server")])
def test_missing_server_binary_is_skipped_with_the_install_command(name: str,
                                                                   package: str) -> None:
    row = run_peer(get_peer(name), SPEC)
    assert row["status"] == "skipped"
    assert "server binary not found" in row["reason"]
    sudo = "" if os.geteuid() == 0 else "sudo "
    assert f"{sudo}apt-get update && {sudo}apt-get install -y {package}" in row["install"]
    assert row["durability"]  # still says what the peer would have measured


def test_missing_python_client_is_skipped_with_the_pip_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = common.importlib.util.find_spec
    monkeypatch.setattr(common.importlib.util, "find_spec",
                        lambda name, *a: None if name == "pysyncobj" else real(name, *a))
    row = run_peer(get_peer("pysyncobj"), SPEC)
    assert row["status"] == "skipped"
    assert "Python client not installed: pysyncobj" in row["reason"]
    assert "-m pip install pysyncobj==0.3.17" in row["install"]


@pytest.mark.usefixtures("nothing_installed")
def test_cli_prints_one_json_object_and_a_table_when_peers_are_missing(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--only", "nats,etcd", "--skip-ours", "--messages", "10", "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)  # stdout is exactly the JSON object
    assert [p["status"] for p in report["peers"]] == ["skipped", "skipped"]
    assert report["messages"] == 10 and report["ours"] is None and report["ours_batch"] is None
    table = " ".join(err.split())  # rich wraps long cells
    assert "apt-get install -y nats-server" in table and "skipped" in table


def test_cli_rejects_unknown_peers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--only", "nats,kafka"])
    assert "unknown peer(s) kafka" in capsys.readouterr().err


def test_every_registered_peer_has_its_labels() -> None:
    peers = all_peers()
    assert [p.name for p in peers] == list(PEER_MODULES)
    for peer in peers:
        assert peer.system and peer.durability and peer.durability_detail
        assert peer.debian_packages or peer.pip_packages
    assert get_peer("nats").durability == "NO fsync"  # NATS acks do not wait for fsync


# ------------------------------------------------------------------ load and processes

def test_drive_holds_the_window_and_counts_errors() -> None:
    in_flight = 0
    peak = 0
    calls = 0

    async def send(payload: bytes) -> None:
        nonlocal in_flight, peak, calls
        calls += 1
        n = calls
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        if n > 10 and n % 10 == 0:  # the 10 warm-up sends all succeed
            raise RuntimeError("nack")

    stats = asyncio.run(drive(send, LoadSpec(messages=200, size=8, in_flight=16)))
    assert peak == 16
    assert stats.acknowledged + stats.errors == 200
    assert stats.errors == 20 and stats.first_error == "RuntimeError('nack')"
    assert len(stats.latencies) == stats.acknowledged and stats.seconds > 0


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.live
def test_procs_stop_whole_process_groups_even_on_errors(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), Procs(tmp_path, grace=2.0) as procs:
        # a server that forks a helper: the helper must go too
        proc = procs.start("server", ["sh", "-c", "sleep 60 & echo started; wait"])
        wait_until(lambda: "started" in procs.log_path("server").read_text() or None,
                   timeout=5, what="server")
        raise RuntimeError("the bench failed mid-run")
    assert proc.poll() is not None
    assert _alive_in_group(proc.pid) == []  # the helper went with it


class _InterruptedPeer(common.Peer):
    """Starts a server, then is interrupted mid-load as by Ctrl-C."""

    name = "interrupted"
    system = "interrupted"
    durability = durability_detail = "none"
    pids: ClassVar[list[int]] = []

    def start(self, workdir: Path, procs: Procs, spec: LoadSpec) -> None:
        self.pids.append(procs.start("server", ["sh", "-c", "sleep 60 & wait"]).pid)

    def load(self, cluster: Any, spec: LoadSpec) -> common.LoadStats:
        raise KeyboardInterrupt


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.live
def test_ctrl_c_propagates_after_the_servers_are_stopped() -> None:
    peer = _InterruptedPeer()
    with pytest.raises(KeyboardInterrupt):
        run_peer(peer, SPEC)
    assert peer.pids and _alive_in_group(peer.pids[0]) == []


def _alive_in_group(pgid: int, within: float = 3.0) -> list[int]:
    """Processes of group `pgid` still running after `within` s (a SIGKILLed helper takes a
    moment to die; killed orphans may linger as zombies until init reaps them, but hold no
    port or file, so they do not count)."""
    deadline = time.monotonic() + within
    while (alive := _running_in_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _running_in_group(pgid: int) -> list[int]:
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in ("Z", "X"):
            alive.append(int(stat.parent.name))
    return alive


@pytest.mark.live
def test_wait_until_names_what_failed_and_quotes_the_log(tmp_path: Path) -> None:
    with Procs(tmp_path) as procs:
        procs.start("srv", [sys.executable, "-c", "print('listening failed: port taken')"])
        with pytest.raises(PeerError, match="srv exited with status 0") as info:
            wait_until(lambda: None, timeout=5, what="srv health", procs=procs)
        assert "port taken" in str(info.value)
    with pytest.raises(PeerError, match=r"thing: not ready after 0 s \(last: OSError: nope\)"):
        wait_until(lambda: (_ for _ in ()).throw(OSError("nope")), timeout=0.2, what="thing")


@pytest.mark.live
def test_pysyncobj_peer_runs_a_real_three_node_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pysyncobj", reason="pysyncobj comes with the bench extra: "
                                            ".venv/bin/pip install -e '.[bench]'")
    started: list[subprocess.Popen[bytes]] = []
    real_start = Procs.start

    def start(self: Procs, name: str, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        proc = real_start(self, name, argv, **kw)
        started.append(proc)
        return proc

    monkeypatch.setattr(Procs, "start", start)
    row = run_peer(get_peer("pysyncobj"),
                   LoadSpec(messages=300, size=64, in_flight=16, startup_timeout=15,
                            load_timeout=15))
    assert row["status"] == "ok", row.get("error")
    assert row["acknowledged"] == 300 and row["errors"] == 0
    assert row["msgs_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"] <= row["p999_ms"]
    assert row["durability"] == "NO fsync"
    assert len(started) == 3
    for proc in started:  # every node was stopped, with its process group
        assert proc.poll() is not None
        assert _alive_in_group(proc.pid) == []
