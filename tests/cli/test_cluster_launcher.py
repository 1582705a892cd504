"""The process harness: blocking RPC, configs on disk, name server and node processes.

Most tests run the real name server with stand-in nodes (a short script that registers the
groups it prefers to lead and then sleeps), so readiness, kill/restart, pause/resume and
clean shutdown are checked in well under a second each without Raft. The last test runs
real nodes.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config import load_config
from raftmq.localcluster import (
    PORT_BASE_SPAN,
    PORT_BLOCK,
    ClusterError,
    LocalCluster,
    free_port_base,
    free_ports,
)
from transport.blocking import Connection, request
from wire.protocol import Code, FrameDecoder, RequestError, encode_frame


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ------------------------------------------------------------------ blocking RPC


class _Echo(socketserver.BaseRequestHandler):
    """Answers each frame by its `op`: 1 echoes, 2 fails NOT_LEADER, 3 stays silent,
    4 answers a stale id first, 5 hangs up."""

    def handle(self) -> None:
        dec = FrameDecoder()
        while data := self.request.recv(65536):
            dec.feed(data)
            while (f := dec.next_frame()) is not None:
                rid, op = f.header["id"], f.header.get("op")
                if op == 1:
                    self.request.sendall(encode_frame({"id": rid, "code": 0, "x": 1}, f.body))
                elif op == 2:
                    self.request.sendall(encode_frame(
                        {"id": rid, "code": int(Code.NOT_LEADER), "msg": "ask 2",
                         "leader": "127.0.0.1:7102"}))
                elif op == 4:
                    self.request.sendall(encode_frame({"id": -5, "code": 0}, b"stale")
                                         + encode_frame({"id": rid, "code": 0}, b"fresh"))
                elif op == 5:
                    return


@pytest.fixture
def echo_server() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_request_returns_header_and_body(echo_server: str) -> None:
    header, body = request(echo_server, {"op": 1}, b"payload")
    assert header["x"] == 1 and header["code"] == 0 and body == b"payload"
    with Connection(echo_server) as conn:
        assert conn.request({"op": 1}, b"a")[1] == b"a"
        assert conn.request({"op": 4})[1] == b"fresh"  # answers to other ids are skipped
        assert conn.request({"op": 1, "id": 77})[0]["id"] == 77


def test_request_raises_request_error_with_extra_fields(echo_server: str) -> None:
    with pytest.raises(RequestError) as info:
        request(echo_server, {"op": 2})
    assert info.value.code is Code.NOT_LEADER and info.value.retriable
    assert info.value.message == "ask 2"
    assert info.value.extra["leader"] == "127.0.0.1:7102"


def test_request_raises_os_errors_for_connection_trouble(echo_server: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        request(echo_server, {"op": 3}, timeout=0.2)
    assert time.monotonic() - t0 < 2
    with pytest.raises(ConnectionError):
        request(echo_server, {"op": 5})
    (port,) = free_ports(1)
    with pytest.raises(OSError):
        request(f"127.0.0.1:{port}", {"op": 1}, timeout=1)


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(7)
    assert len(set(ports)) == 7
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_free_ports_stay_out_of_the_ephemeral_range() -> None:
    """A restarted node re-binds its port; an outgoing connection's local port (always
    from the ephemeral range) must not be able to take it in between."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(p < low for p in free_ports(50))


def test_free_ports_never_hand_out_a_port_twice() -> None:
    """Ports handed out are bound only later (a chaos run picks its nodes' ports, then the
    cluster picks the name server's): until the process's whole block has gone round, no
    port is handed out again, by `free_ports` or inside a `free_port_base` span."""
    ports = [p for _ in range(20) for p in free_ports(10)]
    base = free_port_base()
    ports += [*range(base, base + PORT_BASE_SPAN), *free_ports(10)]
    # a span that does not fit before the block's end starts at its beginning
    assert len(ports) + PORT_BASE_SPAN <= PORT_BLOCK
    assert len(set(ports)) == len(ports)


PICKER = """
import sys
from raftmq.localcluster import PORT_BASE_SPAN, free_port_base, free_ports
base = free_port_base()
print(*free_ports(int(sys.argv[1])), *range(base, base + PORT_BASE_SPAN), flush=True)
sys.stdin.read()  # holds its ports until told to go
"""


@pytest.mark.live
def test_processes_picking_ports_at_once_never_get_the_same_one() -> None:
    """Parallel test workers (and the chaos runs they start) pick ports at the same time;
    each process draws from a block no other process holds, so no two get the same port
    however many they take."""
    pickers = [subprocess.Popen([sys.executable, "-c", PICKER, "200"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        seen = [set(free_ports(200))]
        for proc in pickers:
            assert proc.stdout is not None
            seen.append({int(p) for p in proc.stdout.readline().split()})
    finally:
        for proc in pickers:
            proc.communicate(timeout=30)
    assert [len(s) for s in seen] == [200, 200 + PORT_BASE_SPAN, 200 + PORT_BASE_SPAN]
    assert not seen[0] & seen[1] and not seen[0] & seen[2] and not seen[1] & seen[2]


FILLER = """
import socket
from raftmq.localcluster import PORT_BLOCK, free_port_base
base = free_port_base()
start = base - base % PORT_BLOCK
held = []
for port in range(start, start + PORT_BLOCK, 64):  # a listener every 64 ports: no span fits
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        s.listen()
        held.append(s)
    except OSError:
        s.close()
again = free_port_base()
print(start, again, flush=True)
"""


@pytest.mark.live
def test_a_block_with_no_room_left_makes_way_for_another() -> None:
    """A process whose own clusters hold ports all over its block still gets a span: in
    another block it claims (seen in CI as "no 128 free port(s) in a row")."""
    out = subprocess.run([sys.executable, "-c", FILLER], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    start, again = int(out[0]), int(out[1])
    assert not start <= again < start + PORT_BLOCK


# ------------------------------------------------------------------ configs on disk


def test_configs_are_written_and_readable(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path / "c", port_base=30000, fsync="interval",
                     node_overrides={"segment_size": 1 << 20, 2: {"tick_ms": 7}})
    c.write_configs()
    assert c.namesrv_addr == "127.0.0.1:30076"
    assert [c.node_addr(i) for i in (1, 2, 3)] == [f"127.0.0.1:{30000 + i}" for i in (1, 2, 3)]
    for i in (1, 2, 3):
        cfg = load_config(c.config_path(i))
        assert cfg == c.configs[i - 1]
        assert cfg.data.is_dir() and cfg.namesrv == ("127.0.0.1:30076",)
        assert cfg.fsync == "interval" and cfg.segment_size == 1 << 20
        assert cfg.tick_ms == (7 if i == 2 else 100)
    with pytest.raises(ValueError, match="unknown node"):
        LocalCluster(tmp_path / "d", node_overrides={4: {}})


def test_a_directory_of_another_layout_is_refused(tmp_path: Path) -> None:
    LocalCluster(tmp_path, groups=2).write_configs()
    LocalCluster(tmp_path, groups=2).write_configs()  # new free ports, same cluster: fine
    with pytest.raises(ClusterError, match="holds a different cluster"):
        LocalCluster(tmp_path, groups=3).write_configs()


def test_per_node_listen_and_peers_tables(tmp_path: Path) -> None:
    """Each node may get its own peers table (how chaos proxies are wired in); tables
    must name exactly the cluster's nodes."""
    a, b, c3, x, y, z, extra = (f"127.0.0.1:{p}" for p in free_ports(7))
    tables = {1: {1: x, 2: a, 3: b}, 2: {1: x, 2: y, 3: c3}, 3: {1: x, 2: y, 3: z}}
    c = LocalCluster(tmp_path / "c", node_overrides={
        i: {"listen": f"127.0.0.1:{30000 + i}", "peers": t} for i, t in tables.items()})
    c.write_configs()
    for i in (1, 2, 3):
        assert dict(load_config(c.config_path(i)).peers) == tables[i]
        assert c.node_addr(i) == f"127.0.0.1:{30000 + i}"
    assert [c.client_addr(i) for i in (1, 2, 3)] == [x, y, z]
    with pytest.raises(ValueError, match="peers name nodes"):
        LocalCluster(tmp_path / "d", node_overrides={2: {"peers": {**tables[2], 4: extra}}})


def test_free_ports_layout_uses_distinct_ports(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path)
    addrs = [c.namesrv_addr] + [x for cfg in c.configs for x in (cfg.listen, cfg.metrics)]
    assert len(set(addrs)) == 7


# ------------------------------------------------------------------ processes

FAKE_NODE = """
import signal, sys, time, tomllib
from transport.blocking import request
from wire.protocol import Op

cfg = tomllib.load(open(sys.argv[1], "rb"))
if "--crash" in sys.argv:
    print("stand-in node giving up on purpose", flush=True)
    sys.exit(3)
nid = cfg["node_id"]
peers = {int(n): a for n, a in cfg["peers"].items()}
groups = {
    g["id"]: {"role": "leader" if g["preferred_leader"] == nid else "follower",
              "leader": g["preferred_leader"], "term": 1, "topics": {},
              "replicas": {n: peers[n] for n in g["replicas"]}}
    for g in cfg["groups"] if nid in g["replicas"]
}
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("stand-in node", nid, "up", flush=True)
while True:
    for ns in cfg["namesrv"]:
        try:
            request(ns, {"op": int(Op.REGISTER), "node": nid, "addr": cfg["listen"],
                         "groups": groups}, timeout=1)
        except OSError as exc:
            print("register failed:", exc, flush=True)
    time.sleep(0.1)
"""


class StandInCluster(LocalCluster):
    """The real name server with stand-in nodes; `crash` nodes exit at once."""

    def __init__(self, base_dir: Path, crash: tuple[int, ...] = (), **kw: Any) -> None:
        super().__init__(base_dir, **kw)
        self.script = base_dir / "fake_node.py"
        self.crash = crash

    def node_command(self, i: int) -> list[str]:
        if not self.script.exists():  # rewriting it could let a starting node read it empty
            self.script.write_text(FAKE_NODE)
        cmd = [sys.executable, str(self.script), str(self.config_path(i))]
        return cmd + (["--crash"] if i in self.crash else [])


@pytest.mark.live
def test_namesrv_starts_answers_and_stops(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path)
    c.write_configs()
    addr = c.start_namesrv()
    try:
        assert addr == c.namesrv_addr
        assert c.start_namesrv() == addr  # already running: no second process
        assert c.cluster_info() == {"nodes": {}, "groups": {}}
        assert c.leaders() == {"g0": None, "g1": None, "g2": None}
        with pytest.raises(TimeoutError, match="group g0 has no leader"):
            c.wait_ready(timeout=0.3)
        pids = c.pids()
        assert list(pids) == ["namesrv"]
    finally:
        c.stop()
    assert c.pids() == {} and gone(pids["namesrv"])
    assert "ready " in c.log_path("namesrv").read_text()


@pytest.mark.live
def test_failed_namesrv_start_leaves_nothing_behind(tmp_path: Path) -> None:
    class Broken(LocalCluster):
        def namesrv_command(self) -> list[str]:
            return [sys.executable, "-c", "print('no luck'); raise SystemExit(4)"]

    c = Broken(tmp_path)
    with pytest.raises(ClusterError, match=r"namesrv exited with code 4(.|\n)*no luck"):
        c.start()
    assert c.pids() == {}
    assert not any(c.is_running(i) for i in (1, 2, 3))


@pytest.mark.live
def test_ready_kill_restart_pause_resume_stop(tmp_path: Path) -> None:
    with StandInCluster(tmp_path) as c:
        assert c.wait_ready(timeout=10) == {"g0": 1, "g1": 2, "g2": 3}
        assert c.leaders() == {"g0": 1, "g1": 2, "g2": 3}
        assert sorted(c.cluster_info()["nodes"]) == [1, 2, 3]

        c.pause(1)
        assert c.is_paused(1) and c.is_running(1)
        with pytest.raises(TimeoutError, match="group g0 names leader 1, which is not running"):
            c.wait_ready(timeout=0.3)
        c.resume(1)
        assert not c.is_paused(1)
        c.wait_ready(timeout=5)

        old = c.pid(2)
        assert old is not None
        c.kill(2)
        assert not c.is_running(2) and c.pid(2) is None and gone(old)
        with pytest.raises(TimeoutError, match="g1 names leader 2"):
            c.wait_ready(timeout=0.3)
        c.restart(2)
        assert c.pid(2) not in (None, old)
        c.wait_ready(timeout=5)

        c.pause(3)
        c.kill(3, signal.SIGTERM)  # a paused node still gets to handle SIGTERM
        assert not c.is_running(3) and not c.is_paused(3)
        c.restart(3)
        c.restart(3)  # restarting a running node kills it first
        c.wait_ready(timeout=5)
        c.pause(1)  # stop() must also end paused processes
        pids = c.pids()
        assert len(pids) == 4
    assert c.pids() == {}
    assert all(gone(p) for p in pids.values())


@pytest.mark.live
def test_processes_stop_when_the_test_body_fails(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), StandInCluster(tmp_path) as c:
        pids = c.pids()
        raise RuntimeError("boom")
    assert len(pids) == 4 and all(gone(p) for p in pids.values())


@pytest.mark.live
def test_a_node_that_dies_on_its_own_is_reported(tmp_path: Path) -> None:
    with StandInCluster(tmp_path, crash=(2,)) as c:
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"n2 exited with code 3(.|\n)*on purpose"):
            c.wait_ready(timeout=20)
        assert time.monotonic() - t0 < 10
        assert c.unexpected_exits() == {}  # reported once


@pytest.mark.live
def test_kill_together_and_a_wait_that_leaves_exits_to_the_harness(tmp_path: Path) -> None:
    with StandInCluster(tmp_path, crash=(3,)) as c:
        deadline = time.monotonic() + 30  # a loaded machine may start nodes 1 and 2 slowly
        while set(c.cluster_info()["nodes"]) != {1, 2} and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(TimeoutError, match="g2"):  # the only group left without one
            c.wait_ready(timeout=1.0, raise_on_exit=False)
        deadline = time.monotonic() + 30  # a loaded machine may start node 3 slowly
        while c.is_running(3) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.unexpected_exits() == {"n3": 3}  # still there for whoever checks
        pids = [c.pid(1), c.pid(2)]
        c.kill_together([1, 2])
        assert not c.is_running(1) and not c.is_running(2)
        assert all(p is not None and gone(p) for p in pids)
        assert c.unexpected_exits() == {}  # killed on purpose
        c.restart(1)
        c.restart(2)
        assert c.is_running(1) and c.is_running(2)


@pytest.mark.live
def test_dev_prints_ready_and_stops_cleanly_on_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raftmq import dev

    started: list[LocalCluster] = []
    script = tmp_path / "fake_node.py"
    script.write_text(FAKE_NODE)

    def stand_in(self: LocalCluster, i: int) -> list[str]:
        started.append(self)
        return [sys.executable, str(script), str(self.config_path(i))]

    monkeypatch.setattr(LocalCluster, "node_command", stand_in)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)

    def interrupt_when_ready() -> None:
        # generous: with other test files beside it, a busy 2-core machine may take a
        # while to start the name server; without "ready" no signal is sent (the handler
        # is installed only then) and the test ends at pytest's timeout
        deadline = time.monotonic() + 300
        while "ready" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        if "ready" in out.getvalue():  # only then is dev's handler installed
            os.kill(os.getpid(), signal.SIGTERM)

    base = free_port_base()
    threading.Thread(target=interrupt_when_ready, daemon=True).start()
    rc = dev.main(["--data", str(tmp_path / "dev"), "--port-base", str(base)])
    assert rc == 0
    assert out.getvalue() == f"ready 127.0.0.1:{base + 76}\n"
    assert started and started[0].pids() == {}


# ------------------------------------------------------------------ real nodes


@pytest.mark.live
def test_real_cluster_elects_and_fails_over(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, tick_ms=50) as c:
        leaders = c.wait_ready(timeout=30)
        assert set(leaders) == {"g0", "g1", "g2"}
        old = leaders["g0"]
        c.kill(old)
        after = c.wait_ready(timeout=30)
        assert after["g0"] != old
        c.restart(old)
        c.wait_ready(timeout=30)
        pids = c.pids()
    assert all(gone(p) for p in pids.values())



@pytest.mark.parametrize(("argv", "message"), [
    (["--shards", "2"], "--shards needs --hosts"),
    (["--nodes", "3", "--hosts", "3"], "give one"),
    (["--hosts", "2", "--shards", "2"], "replication 3 needs 3 hosts"),
])
def test_dev_refuses_layouts_it_cannot_run(tmp_path: Path, argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from raftmq import dev

    assert dev.main(["--data", str(tmp_path / "dev"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "dev" / "n1.toml").exists()
