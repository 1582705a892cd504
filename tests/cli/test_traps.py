"""The `raftmq` command's traps, run as a user runs it: subprocesses against a real cluster
(and, for `raftmq dev`, the dev cluster itself).

* one default name-server address everywhere, and `$NAMESRV_ADDR` as well as
  `$RAFTMQ_NAMESRV`;
* `send` reads bodies from stdin or a file, whole or one per line, beyond the size an
  argument may have; `consume` cuts long bodies on a terminal unless `--full`;
* the small wrongs: `message key` without a match says so, `topic create --queues 0`
  blames itself, `node --help` explains `--log-level`, `sim --help` names `raftmq sim`,
  `lag` of a group that never committed says so;
* `raftmq dev` restarts a node that died, saying so and where its log is, and says what
  it stopped when it ends.
"""

from __future__ import annotations

import base64
import json
import os
import pty
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import NAMESRV_PORT_OFFSET
from raftmq.localcluster import LocalCluster
from tests.live_cluster import free_port_base
from tests.paths import REPO_ROOT as ROOT
from transport.blocking import request
from wire.protocol import DEFAULT_NAMESRV, Op, RequestError

pytestmark = pytest.mark.live  # every test here starts a cluster

ENV_NAMES = ("RAFTMQ_NAMESRV", "NAMESRV_ADDR")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cli-traps"), nodes=3, groups=3,
                      tick_ms=50) as c:
        c.wait_ready(timeout=60)
        yield c
        assert c.unexpected_exits() == {}


def raftmq(*args: str, env: dict[str, str] | None = None, stdin: bytes | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    full.update(env or {})
    proc = subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True,
                          env=full, cwd=ROOT, timeout=timeout, input=stdin)
    return subprocess.CompletedProcess(proc.args, proc.returncode,
                                       proc.stdout.decode(errors="replace"),
                                       proc.stderr.decode(errors="replace"))


def at(cluster: LocalCluster) -> dict[str, str]:
    return {"RAFTMQ_NAMESRV": cluster.namesrv_addr}


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# ------------------------------------------------------------------ 11. one default


def test_one_default_name_server_address_and_namesrv_addr(cluster: LocalCluster) -> None:
    assert DEFAULT_NAMESRV.endswith(f":{7100 + NAMESRV_PORT_OFFSET}")  # `raftmq dev`'s
    for cmd in (["namesrv"], ["send"], ["topic", "list"], ["dev"]):
        text = " ".join(raftmq(*cmd, "--help").stdout.split())
        expected = "7100" if cmd == ["dev"] else DEFAULT_NAMESRV
        assert expected in text, (cmd, text)
        assert "9876" not in text, (cmd, text)
    # RocketMQ's variable works as well as ours
    out = ok(raftmq("topic", "create", "envtopic", "--queues", "2", "--exist-ok", "--json",
                    env={"NAMESRV_ADDR": cluster.namesrv_addr}))
    assert json.loads(out)["topic"] == "envtopic"


# ------------------------------------------------------------------ 12. send input


def test_send_reads_stdin_and_files_beyond_argument_limits(
        cluster: LocalCluster, tmp_path: Path) -> None:
    ok(raftmq("topic", "create", "bodies", "--queues", "3", "--exist-ok", env=at(cluster)))
    big = random.Random(1).randbytes(3 << 20)  # more than one argument may hold
    sent = json.loads(ok(raftmq("send", "--topic", "bodies", "--json", "-", stdin=big,
                                env=at(cluster))))
    lines = tmp_path / "lines.txt"
    lines.write_text("first\nsecond\n\nthird\n")
    by_line = [json.loads(x) for x in ok(raftmq(
        "send", "--topic", "bodies", "--file", str(lines), "--lines", "--json",
        env=at(cluster))).splitlines()]
    assert len(by_line) == 3

    got = [json.loads(x) for x in ok(raftmq(
        "consume", "--group", "bodies-cg", "--topic", "bodies", "--json", "--timeout", "1",
        env=at(cluster))).splitlines()]
    by_id = {m["msg_id"]: m for m in got}
    stored = by_id[sent["msg_id"]]
    assert stored["body_encoding"] == "base64"
    assert base64.b64decode(stored["body"]) == big
    assert sorted(by_id[r["msg_id"]]["body"] for r in by_line) == ["first", "second", "third"]

    assert raftmq("send", "--topic", "bodies", "--file", str(tmp_path / "none"),
                  env=at(cluster)).returncode == 2


def test_consume_cuts_long_bodies_on_a_terminal_unless_full(cluster: LocalCluster) -> None:
    ok(raftmq("topic", "create", "long", "--queues", "1", "--exist-ok", env=at(cluster)))
    ok(raftmq("send", "--topic", "long", "L" * 5000, env=at(cluster)))

    def on_a_terminal(*args: str) -> str:
        leader, follower = pty.openpty()
        env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
        env.update(at(cluster), COLUMNS="200")
        proc = subprocess.Popen([sys.executable, "-m", "raftmq", *args], stdout=follower,
                                stderr=subprocess.PIPE, env=env, cwd=ROOT)
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=60)
        os.close(leader)
        assert proc.returncode == 0
        return b"".join(chunks).decode(errors="replace")

    cut = on_a_terminal("consume", "--group", "t1", "--topic", "long", "--timeout", "1")
    assert "L" * 200 in cut and "L" * 201 not in cut and "--full" in cut
    full = on_a_terminal("consume", "--group", "t2", "--topic", "long", "--timeout", "1",
                         "--full")
    assert "L" * 5000 in full.replace("\r\n", "").replace("\n", "")


# ------------------------------------------------------------------ 13. small wrongs


def test_help_and_exit_codes_say_what_happened(cluster: LocalCluster) -> None:
    ok(raftmq("topic", "create", "keyless", "--queues", "2", "--exist-ok", env=at(cluster)))
    none = raftmq("message", "key", "--topic", "keyless", "nobody", env=at(cluster))
    assert none.returncode == 1 and "no message with key 'nobody'" in none.stderr

    zero = raftmq("topic", "create", "zero", "--queues", "0", env=at(cluster))
    assert zero.returncode == 2
    assert "usage: raftmq topic create" in zero.stderr
    assert "raftmq topic create: error: argument --queues" in zero.stderr

    node_help = " ".join(raftmq("node", "--help").stdout.split())
    assert re.search(r"--log-level LEVEL\s+DEBUG, INFO", node_help), node_help
    sim_help = raftmq("sim", "--help").stdout
    assert sim_help.startswith("usage: raftmq sim") and "python -m" not in sim_help

    lag = raftmq("lag", "--group", "never-seen", "--topic", "keyless", env=at(cluster))
    assert lag.returncode == 0
    assert "has committed no offset" in lag.stderr
    lag_json = json.loads(ok(raftmq("lag", "--group", "never-seen", "--topic", "keyless",
                                    "--json", env=at(cluster))))
    assert lag_json["never_committed"] is True


# ------------------------------------------------------------------ 14. raftmq dev


def _children(pid: int) -> dict[int, str]:
    """Child processes of `pid`: pid -> command line."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(
                    b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return out


def test_dev_restarts_a_node_that_died_and_says_what_it_stopped(tmp_path: Path) -> None:
    base = free_port_base()
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftmq", "dev", "--data", str(tmp_path / "dev"),
         "--port-base", str(base)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def wait_for(pattern: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(lines):
                if re.search(pattern, line):
                    return line
            assert proc.poll() is None, "".join(lines)
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(lines)}")

    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ready ")
        nodes = {p: c for p, c in _children(proc.pid).items() if "node.toml" in c or
                 " node " in c}
        victim = next(p for p, c in nodes.items() if "n2" in c)
        os.kill(victim, signal.SIGKILL)
        died = wait_for(r"n2 exited with code -9; restarting it in 1 s")
        assert str(tmp_path / "dev") in died and "n2" in died.split("its log:")[1]
        again = wait_for(r"restarted n2 \(pid \d+\)")
        new_pid = int(re.search(r"pid (\d+)", again).group(1))  # type: ignore[union-attr]
        assert new_pid != victim
        deadline = time.monotonic() + 30
        while True:  # the restarted node serves at its own address again
            try:
                h, _ = request(f"127.0.0.1:{base + 2}", {"op": int(Op.STATUS)}, timeout=2.0)
                assert h["node"] == 2
                break
            except (OSError, RequestError):
                assert time.monotonic() < deadline
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        reader.join(timeout=10)
        stopped = next(line for line in lines if "raftmq dev: stopped" in line)
        for name in ("namesrv", "n1", "n2", "n3"):
            assert f"{name} (pid" in stopped
        assert f"n2 (pid {new_pid})" in stopped
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
