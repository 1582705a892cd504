"""A node that cannot start says why, in a line, not a traceback (real node processes).

On damaged files: it does not serve from a snapshot, ConsumeQueue chunk or CommitLog it
cannot trust (the file nemeses of `raftmq chaos run` rely on that); the operator reads
why, what to do about it, and exit status 3. On a port another process holds: which
address, from which config key, and exit status 2, like any other config error.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from broker.config import NodeConfig
from broker.node import DAMAGED_DATA_EXIT
from broker.state.statemachine import BrokerState, control_create_topic
from raftlog.commitlog import CommitLog
from raftlog.snapshot import Snapshot, save_snapshot
from raftlog.types import Entry, EntryType, Membership
from raftmq.localcluster import free_ports
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.live

CONFIG = """\
node_id = 1
listen = "127.0.0.1:{port}"
data = "{data}"
[peers]
1 = "127.0.0.1:{port}"
2 = "127.0.0.1:7102"
3 = "127.0.0.1:7103"
[[groups]]
id = "g0"
replicas = {replicas}
"""


def _node_with_snapshot(tmp_path: Path, replicas: tuple[int, ...] = (1, 2, 3),
                        ) -> tuple[Path, Path]:
    """A node config whose group g0 has a snapshot on disk and a log that begins after it,
    as an install or retention leaves it: (config, snapshot file). The snapshot is then
    the only local copy of entries 1-5. (With peers, a damaged one is rebuilt from the
    leader; alone, over a log that still begins at entry 1, from the log:
    tests/raftlog/test_snapshot_rebuild.py.)"""
    data = tmp_path / "data"
    (port,) = free_ports(1)
    text = CONFIG.format(data=data, port=port, replicas=list(replicas))
    config = tmp_path / "n1.toml"
    config.write_text(text)
    group_dir = Path(NodeConfig.from_dict(tomllib.loads(text), env={}).group_dir("g0"))
    group_dir.mkdir(parents=True)
    state = BrokerState("g0")
    state.apply(Entry(5, 1, EntryType.CONTROL, control_create_topic("t", 1, [0])))
    snapshot = group_dir / "snapshot"
    save_snapshot(snapshot, Snapshot(5, 1, state.snapshot(), Membership(frozenset(replicas))))
    log = CommitLog.open(group_dir)
    log.reset_to(5, 1)
    log.close()
    return config, snapshot


def _start(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftmq", "node", "--config", str(config)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_a_node_on_a_damaged_snapshot_refuses_to_start_and_says_what_to_do(
        tmp_path: Path) -> None:
    """Alone in its group, no peer can send the state the snapshot held."""
    config, snapshot = _node_with_snapshot(tmp_path, replicas=(1,))
    good = snapshot.read_bytes()
    snapshot.write_bytes(good[: len(good) // 2])  # cut short, as `truncate-file` does

    proc = _start(config)

    assert proc.returncode == DAMAGED_DATA_EXIT, proc.stderr
    said = [line for line in proc.stderr.splitlines() if not line.startswith("{")]  # not logs
    assert said[0].startswith(f"raftmq node: refusing to start: corrupt snapshot {snapshot}")
    assert "replace-replica" in said[1] and "backup" in said[1], said
    assert len(said) == 2, said  # no traceback
    assert snapshot.read_bytes() == good[: len(good) // 2]  # nothing was changed


def test_a_node_with_peers_starts_on_a_damaged_snapshot_and_waits_for_their_state(
        tmp_path: Path) -> None:
    """In a group with peers the same damage is not refused: the node starts, keeps the
    log as it is, and its group waits for a leader's snapshot (none comes here)."""
    config, snapshot = _node_with_snapshot(tmp_path)
    good = snapshot.read_bytes()
    snapshot.write_bytes(good[: len(good) // 2])
    proc = subprocess.Popen([sys.executable, "-m", "raftmq", "node", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ready ")
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "from a leader's snapshot, over the log as it is" in err
    assert (snapshot.parent / "snapshot.damaged").read_bytes() == good[: len(good) // 2]


def test_a_node_whose_data_is_whole_is_not_taken_for_damaged(tmp_path: Path) -> None:
    """The same node with its snapshot intact starts (and is stopped by the test)."""
    config, _snapshot = _node_with_snapshot(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "raftmq", "node", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=ROOT)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ready ")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_a_node_whose_port_is_taken_says_so(tmp_path: Path) -> None:
    config, _snapshot = _node_with_snapshot(tmp_path)
    listen = tomllib.loads(config.read_text())["listen"]
    host, port = listen.rsplit(":", 1)
    with socket.socket() as holder:
        holder.bind((host, int(port)))
        holder.listen()
        proc = _start(config)
    assert proc.returncode == 2, proc.stderr
    said = [line for line in proc.stderr.splitlines() if not line.startswith("{")]
    assert said == [f"raftmq node: cannot listen on {listen} (config key 'listen'): Address "
                    "already in use -- another process holds the port, or the address is "
                    "not this host's"], said


def test_a_node_told_to_wait_for_its_port_starts_once_the_holder_lets_go(
        tmp_path: Path) -> None:
    """`listen_retry_s`: a restart whose port a stranger took meanwhile (a harness on a
    shared host) waits for it, saying so, and starts once it is free."""
    config, _snapshot = _node_with_snapshot(tmp_path)
    config.write_text("listen_retry_s = 30.0\n" + config.read_text())
    listen = tomllib.loads(config.read_text())["listen"]
    host, port = listen.rsplit(":", 1)
    holder = socket.socket()
    holder.bind((host, int(port)))
    holder.listen()
    proc = subprocess.Popen([sys.executable, "-m", "raftmq", "node", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT)
    try:
        assert proc.stdout is not None
        lines = iter(proc.stdout.readline, "")
        assert any("port held by another process" in line for line in lines)
        assert proc.poll() is None
        holder.close()
        assert any(line.startswith("ready ") for line in lines)
    finally:
        holder.close()
        proc.terminate()
        proc.wait(30)


def test_a_metrics_endpoint_off_loopback_needs_saying_so(tmp_path: Path) -> None:
    """The metrics endpoint is plain HTTP without a login: a config that would serve it
    on every interface is refused at start (exit status 2, saying why and how), before
    anything listens; `metrics_public = true` says it may."""
    (port, mport) = free_ports(2)
    text = f'metrics = "0.0.0.0:{mport}"\n' + CONFIG.format(data=tmp_path / "data", port=port, replicas=[1, 2, 3])
    config = tmp_path / "n1.toml"
    config.write_text(text)

    proc = _start(config)

    assert proc.returncode == 2, proc.stderr
    assert "not a loopback address" in proc.stderr and "metrics_public" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    public = NodeConfig.from_dict({**tomllib.loads(text), "metrics_public": True}, env={})
    assert public.metrics == f"0.0.0.0:{mport}" and public.metrics_public


def test_logins_on_the_built_in_cluster_secret_are_refused(tmp_path: Path) -> None:
    """The built-in cluster secret is public: with it, anyone could do the peer handshake
    (and read the users' verifiers with READ_RAW), and compute the made-up salt of any
    name, telling stored users from unknown ones. A node with `authenticate = true` and
    no cluster_secret of its own is refused at start (exit status 2, saying why)."""
    (port,) = free_ports(1)
    text = "authenticate = true\n" + CONFIG.format(data=tmp_path / "data", port=port, replicas=[1, 2, 3])
    config = tmp_path / "n1.toml"
    config.write_text(text)

    proc = _start(config)

    assert proc.returncode == 2, proc.stderr
    assert "needs a cluster_secret of its own" in proc.stderr, proc.stderr
    own = NodeConfig.from_dict({**tomllib.loads(text), "cluster_secret": "x" * 24}, env={})
    assert own.authenticate
