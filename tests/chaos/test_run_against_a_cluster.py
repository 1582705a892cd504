"""`raftmq chaos run --cluster CONFIG` against a cluster started the way a user would: a
name server and one `raftmq chaos agent` per node, each its own process (not
`LocalCluster`); and the agent's own protocol."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import cluster_configs, dump_config
from chaos.agent import Agent, agent_request
from chaos.cli import EXIT_USAGE, check_main, run_main
from chaos.histories import parse_faults
from raftmq.localcluster import free_ports
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.live

RUN_SECONDS = 14.0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _ready(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("ready "):
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"{proc.args} did not get ready")


@pytest.fixture
def user_cluster(tmp_path: Path) -> Iterator[dict[str, object]]:
    """Three nodes under agents and a name server, started as separate processes; yields
    the CONFIG path and the agents' addresses."""
    ports = free_ports(10)
    namesrv = f"127.0.0.1:{ports[0]}"
    configs = cluster_configs(
        tmp_path / "cluster", nodes=3, groups=3, namesrv=[namesrv], listen_ports=ports[1:4],
        metrics_ports=ports[4:7],
    )
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "namesrv", "--listen", namesrv], env=_env(),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
        _ready(procs[-1])
        agents = {}
        for cfg, port in zip(configs, ports[7:10], strict=True):
            cfg.data.mkdir(parents=True, exist_ok=True)
            path = tmp_path / "cluster" / f"n{cfg.node_id}.toml"
            path.write_text(dump_config(cfg))
            agents[cfg.node_id] = f"127.0.0.1:{port}"
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "raftmq", "chaos", "agent", "--listen",
                 agents[cfg.node_id], "--log", str(tmp_path / f"n{cfg.node_id}.log"), "--",
                 sys.executable, "-m", "raftmq", "node", "--config", str(path)],
                env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            ))
            _ready(procs[-1])
        config = tmp_path / "cluster.toml"
        config.write_text(f'namesrv = "{namesrv}"\n' + "".join(
            f'[nodes.{i}]\nagent = "{addr}"\n' for i, addr in agents.items()))
        yield {"config": config, "agents": agents}
    finally:
        for proc in reversed(procs):  # agents stop their nodes on SIGTERM
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_a_chaos_run_against_a_cluster_the_user_started(
    user_cluster: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    agents = user_cluster["agents"]
    assert isinstance(agents, dict)
    before = {i: agent_request(a, "status")["pid"] for i, a in agents.items()}
    out = tmp_path / "run"
    code = run_main([
        "--cluster", str(user_cluster["config"]), "--out", str(out), "--time",
        str(RUN_SECONDS), "--seed", "4", "--nemesis", "kill,pause", "--json",
    ])
    results = json.loads((out / "results.json").read_text())
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] and results["lost"] == 0 and results["operations"]["append"]["ok"]
    assert results["run"]["topic"].startswith("chaos-") and results["run"]["drained"]
    assert not (out / "cluster").exists()  # nothing was started here
    faults = parse_faults(out / "history.jsonl")
    killed = {n for f in faults if f.f == "kill" for n in f.value["nodes"]}
    assert killed, faults  # the schedule of seed 4 kills within the run
    after = {i: agent_request(a, "status") for i, a in agents.items()}
    assert all(s["running"] and not s["paused"] for s in after.values()), after
    for i in killed:  # a real kill: the agent runs a new process for the node
        assert after[i]["pid"] != before[i]
    # the saved run re-checks to the same verdict
    capsys.readouterr()
    assert check_main([str(out), "--json"]) == 0


@pytest.mark.parametrize(
    ("nemesis", "message"),
    [("partition-node", "cannot be applied"), ("crash-unsynced", "cannot be applied")],
)
def test_faults_an_agent_cannot_apply_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nemesis: str, message: str,
) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text('namesrv = "127.0.0.1:1"\n[nodes.1]\nagent = "127.0.0.1:2"\n')
    assert run_main(["--cluster", str(config), "--out", str(tmp_path / "o"),
                     "--nemesis", nemesis]) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_agent_kills_restarts_pauses_and_reports_unasked_exits(tmp_path: Path) -> None:
    agent = Agent([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        agent.start()
        first = agent.status()["pid"]
        assert agent.handle({"op": "pause"}, None)["paused"] is True
        assert agent.handle({"op": "resume"}, None)["paused"] is False
        assert agent.handle({"op": "kill"}, None)["running"] is False
        assert agent.handle({"op": "status"}, None)["exits"] == []  # asked for: not reported
        started = agent.handle({"op": "start"}, None)
        assert started["running"] and started["pid"] != first
        refused = agent.handle({"op": "start"}, None)
        assert refused["ok"] is False and "runs already" in refused["error"]
        os.kill(started["pid"], signal.SIGKILL)  # dies without being asked
        deadline = time.monotonic() + 10
        while agent.status()["running"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.handle({"op": "status"}, None)["exits"] == [-signal.SIGKILL]
        assert agent.handle({"op": "status"}, None)["exits"] == []  # reported once
        assert agent.handle({"op": "status"}, "secret") == {"ok": False, "error": "bad token"}
        assert agent.handle({"op": "fly"}, None)["ok"] is False
    finally:
        agent.kill()
