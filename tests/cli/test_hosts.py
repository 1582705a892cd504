"""Hosts of several shards over real processes: `raftmq host` runs one machine's shards as
one service; a host killed outright takes every shard with it and nothing acknowledged is
lost; placement never gives a group two replicas on one host, and a change that would is
refused before anything is made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from raftmq.client import Admin, Producer
from raftmq.localcluster import LocalCluster
from tests.live_cluster import SendLog, check_log, drain, produce_until
from wire.protocol import Code, RequestError
from wire.requests import MembershipRequest

pytestmark = pytest.mark.live

TOPIC = "spread"
WAIT = 60.0


class HostProcs:
    """`raftmq host` processes, one per host of a `LocalCluster`'s layout (its name
    server runs as usual; its nodes are the hosts' children)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.logs: dict[str, Path] = {}

    def start(self, host: str) -> None:
        configs = [str(self.cluster.config_path(i)) for i in self.cluster.host_nodes(host)]
        log = self.cluster.base_dir / "logs" / f"host-{host}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.logs[host] = log
        cmd = [sys.executable, "-m", "raftmq", "host"]
        for c in configs:
            cmd += ["--config", c]
        with open(log, "ab") as out:
            self.procs[host] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                                text=True)

    def wait_ready(self, host: str, timeout: float = WAIT) -> None:
        want = f"ready {host} " + ",".join(map(str, self.cluster.host_nodes(host)))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.logs[host].read_text(errors="replace")
            if want in text.splitlines():
                return
            if self.procs[host].poll() is not None:
                raise AssertionError(f"host {host} exited: {text[-2000:]}")
            time.sleep(0.1)
        raise AssertionError(f"host {host} not ready after {timeout} s: "
                             f"{self.logs[host].read_text(errors='replace')[-2000:]}")

    def shard_pids(self, host: str) -> list[int]:
        """The children of host `host`'s process (its shards)."""
        pid = self.procs[host].pid
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[HostProcs]:
    cluster = LocalCluster(tmp_path / "c", hosts=3, shards=2, groups=6, tick_ms=50)
    procs = HostProcs(cluster)
    try:
        cluster.write_configs()
        cluster.start_namesrv()
        for h in cluster.hosts:
            procs.start(h)
        for h in cluster.hosts:
            procs.wait_ready(h)
        _wait_leaders(cluster)
        yield procs
    finally:
        procs.stop()
        cluster.stop()


def _wait_leaders(cluster: LocalCluster) -> None:
    """Every group has a leader, as the name server says (the nodes are the hosts'
    children, not the cluster's, so its own readiness check does not apply)."""
    def led() -> bool:
        try:
            return all(n is not None for n in cluster.leaders(timeout=2.0).values())
        except (OSError, RequestError):
            return False
    _wait("a leader for every group", led)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie not reaped yet counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _wait(what: str, check: object, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout} s")
        time.sleep(0.1)


def test_the_placement_of_three_hosts_of_two_shards(tmp_path: Path) -> None:
    """No group has two replicas on one host; every shard leads one group and holds
    three replicas."""
    c = LocalCluster(tmp_path / "c", hosts=3, shards=2, groups=6)
    assert c.hosts == {"h1": [1, 2], "h2": [3, 4], "h3": [5, 6]}
    for g in c.groups:
        assert len({c.host_of(r) for r in g.replicas}) == 3, g
    assert sorted(g.preferred_leader for g in c.groups) == [1, 2, 3, 4, 5, 6]
    held = [r for g in c.groups for r in g.replicas]
    assert all(held.count(n) == 3 for n in c.node_ids)


def test_a_host_killed_outright_takes_its_shards_and_loses_nothing_acknowledged(
        hosts: HostProcs) -> None:
    c = hosts.cluster
    shards = hosts.shard_pids("h1")
    assert len(shards) == 2, shards
    log = SendLog("p")

    async def run() -> None:
        async with Admin(c.namesrv_addr, timeout=5.0) as admin:
            await admin.create_topic(TOPIC, queues=6, exist_ok=True)
        stop = anyio.Event()
        async with Producer(c.namesrv_addr, send_timeout=5.0, retries=8) as producer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce_until, producer, TOPIC, log, stop)
                await anyio.sleep(1.0)
                hosts.procs["h1"].kill()  # the host process, not its shards
                await anyio.to_thread.run_sync(
                    _wait, "h1's shards gone with it", lambda: all(map(_gone, shards)))
                await anyio.sleep(3.0)  # every group still has two replicas: it goes on
                n = len(log.acked)
                await anyio.sleep(2.0)
                assert len(log.acked) > n, "nothing acknowledged with host h1 down"
                await anyio.to_thread.run_sync(hosts.start, "h1")
                await anyio.to_thread.run_sync(hosts.wait_ready, "h1")
                await anyio.sleep(1.0)
                stop.set()
        queues = await drain(c.namesrv_addr, TOPIC, "checker")
        check_log(queues)
        stored = {m.body.decode() for msgs in queues.values() for m in msgs}
        lost = sorted(set(log.acked) - stored)
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
        assert len(log.acked) > 100

    anyio.run(run)
    shards = hosts.shard_pids("h1")  # the restarted host runs both again
    assert len(shards) == 2, (shards, hosts.logs["h1"].read_text(errors="replace")[-3000:])
    _wait_leaders(c)


def test_a_shard_that_dies_is_started_again_and_sigterm_stops_the_host(
        hosts: HostProcs) -> None:
    first, second = hosts.shard_pids("h2")
    os.kill(first, signal.SIGKILL)
    _wait("the shard started again", lambda: len(hosts.shard_pids("h2")) == 2
          and first not in hosts.shard_pids("h2"))
    assert second in hosts.shard_pids("h2")
    text = hosts.logs["h2"].read_text()
    assert "exited with code -9; starting it again" in text
    pids = hosts.shard_pids("h3")
    hosts.procs["h3"].terminate()
    assert hosts.procs["h3"].wait(30) == 0
    assert all(map(_gone, pids))


def test_a_replica_on_a_host_that_holds_one_is_refused_and_nothing_is_made(
        hosts: HostProcs) -> None:
    c = hosts.cluster
    g = c.groups[0]  # replicas on h1, h2, h3
    on_h1 = next(r for r in g.replicas if c.host_of(r) == "h1")
    other = next(n for n in c.host_nodes("h1") if n != on_h1)

    async def run() -> None:
        async with Admin(c.namesrv_addr, timeout=5.0) as admin:
            with pytest.raises(RequestError) as err:
                await admin.add_replica(g.id, other)
            assert err.value.code == Code.MEMBERSHIP_REFUSED
            assert "at most one replica per host" in err.value.message
            assert "'h1'" in err.value.message
            m = await admin.group_members(g.id)
            assert sorted(m.voters) == sorted(g.replicas) and not m.learners
            assert not (c.configs[other - 1].data / g.id).exists(), "a replica was made"
            # the leader refuses it too, asked directly (not through the SDK's check)
            req = MembershipRequest(g=g.id, action="add-learner", node=other)
            with pytest.raises(RequestError) as err:
                await admin.routes.call_group(g.id, req.OP, req.header())
            assert err.value.code == Code.MEMBERSHIP_REFUSED
            assert f"where node {on_h1} holds a replica" in err.value.message
            assert sorted((await admin.group_members(g.id)).voters) == sorted(g.replicas)
            assert m.hosts[on_h1] == "h1"
            # the same move as a replacement of the replica on that host is allowed
            m = await admin.replace_replica(g.id, on_h1, other)
            assert other in m.voters and on_h1 not in m.voters

    anyio.run(run)


def test_configs_of_two_hosts_are_refused_by_one_host_process(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path / "c", hosts=3, shards=2, groups=3)
    c.write_configs()
    out = subprocess.run([sys.executable, "-m", "raftmq", "host", "--config",
                          str(c.config_path(1)), "--config", str(c.config_path(3))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "runs on host 'h2'" in out.stderr and "its own shards only" in out.stderr


# ------------------------------------------------------------------ a deployment


def test_a_cluster_deployed_from_raftmq_layout_runs_with_one_host_command_per_machine(
        tmp_path: Path) -> None:
    """What the deployment section says, on three loopback addresses standing for three
    machines: `raftmq layout` writes a folder per host, a name server starts, and each
    host runs `raftmq host --config FOLDER`; messages go in and come back."""
    from tests.live_cluster import free_port_base

    base = free_port_base()
    namesrv = f"127.0.0.1:{base + 76}"
    out = tmp_path / "layout"
    made = subprocess.run(
        [sys.executable, "-m", "raftmq", "layout", "--host", "h1=127.0.0.1",
         "--host", "h2=127.0.0.2", "--host", "h3=127.0.0.3", "--shards", "2",
         "--namesrv", namesrv, "--port", str(base + 1), "--metrics-port", str(base + 101),
         "--data", str(tmp_path / "data"), "--out", str(out)],
        capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in out.iterdir()) == ["h1", "h2", "h3"]
    assert sorted(p.name for p in (out / "h2").iterdir()) == ["n3.toml", "n4.toml"]
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        with open(logs / "namesrv.log", "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "raftmq", "namesrv", "--listen", namesrv],
                stdout=log, stderr=subprocess.STDOUT))
        for h in ("h1", "h2", "h3"):
            with open(logs / f"{h}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "raftmq", "host", "--config", str(out / h)],
                    stdout=log, stderr=subprocess.STDOUT))
        for h, nodes in (("h1", "1,2"), ("h2", "3,4"), ("h3", "5,6")):
            _wait(f"host {h} ready", lambda h=h, nodes=nodes: f"ready {h} {nodes}" in
                  (logs / f"{h}.log").read_text(errors="replace").splitlines())

        async def run() -> None:
            async with Admin(namesrv, timeout=10.0) as admin:
                with anyio.fail_after(WAIT):
                    while True:
                        info = await admin.describe_cluster(topics=False)
                        groups = info.get("groups") or {}
                        if len(groups) == 6 and all(g.get("leader") for g in groups.values()):
                            break
                        await anyio.sleep(0.2)
                assert {int(n): v["host"] for n, v in info["nodes"].items()} == {
                    1: "h1", 2: "h1", 3: "h2", 4: "h2", 5: "h3", 6: "h3"}
                await admin.create_topic("deployed", queues=6)
            async with Producer(namesrv, send_timeout=10.0, retries=8) as p:
                for q in range(6):
                    await p.send("deployed", f"m{q}".encode(), queue=q)
            queues = await drain(namesrv, "deployed", "reader")
            assert sorted(m.body for msgs in queues.values() for m in msgs) == [
                f"m{q}".encode() for q in range(6)]

        anyio.run(run)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_layout_refuses_what_it_cannot_place_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "layout"
    common = ["--namesrv", "127.0.0.1:7176", "--out", str(out), "--shards", "2"]
    for hosts, message in (
        (["a=10.0.0.1", "b=10.0.0.2"], "replication 3 needs 3 hosts"),
        (["a=10.0.0.1", "a=10.0.0.2", "c=10.0.0.3"], "host 'a' is given twice"),
        (["a=10.0.0.1", "b=10.0.0.1", "c=10.0.0.3"], "address '10.0.0.1' is given twice"),
    ):
        argv = [a for h in hosts for a in ("--host", h)]
        done = subprocess.run([sys.executable, "-m", "raftmq", "layout", *argv, *common],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert not out.exists()
