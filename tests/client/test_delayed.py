"""Delayed messages over real processes: stored when sent, in their queue when due, never
before, exactly once, across a leader kill and a whole-cluster power loss; bad delays are
refused and store nothing; a transaction's delayed messages wait for both its commit and
their time; `raftmq send --delay` works from the shell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from raftmq.client import Admin, Message, Producer, PullConsumer, RequestError
from raftmq.client.blocking import BlockingProducer
from raftmq.localcluster import LocalCluster
from tests.conftest import node_status, wait_for
from tests.live_cluster import assert_no_unexpected_exits, leader_of, wait_new_leader
from tests.paths import REPO_ROOT
from wire.protocol import Code

pytestmark = pytest.mark.live

TOPIC = "later"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "c", nodes=3, groups=1, tick_ms=50) as c:
        c.wait_ready(timeout=60)

        async def create() -> None:
            async with Admin(c.namesrv_addr) as admin:
                await admin.create_topic(TOPIC, queues=2, groups=["g0"])

        anyio.run(create)
        yield c


def now_ms() -> int:
    return int(time.time() * 1000)


async def watch(namesrv: str, want: int, timeout: float,
                during: float = 0.0) -> dict[bytes, tuple[int, Message]]:
    """Poll both queues from offset 0 every 20 ms until `want` messages were seen (then
    `during` seconds more, to see any duplicate): body -> (first seen ms, message).
    Raises on a body seen twice."""
    seen: dict[bytes, tuple[int, Message]] = {}
    offsets = [0, 0]
    deadline = time.monotonic() + timeout
    extra_until: float | None = None
    async with PullConsumer(namesrv, "watcher", start_from="first", wait_ms=0) as c:
        while time.monotonic() < deadline:
            for q in (0, 1):
                try:
                    res = await c.pull(TOPIC, q, offsets[q], max=256, wait_ms=0)
                except RequestError as exc:
                    if exc.retriable or exc.code in (Code.OFFSET_TOO_LARGE,
                                                     Code.UNKNOWN_TOPIC):
                        continue  # a failover, or restarted nodes not registered yet
                    raise
                t = now_ms()
                for m in res.messages:
                    assert m.body not in seen, f"{m.body!r} delivered twice"
                    seen[m.body] = (t, m)
                offsets[q] = res.next_offset
            if len(seen) >= want:
                if extra_until is None:
                    extra_until = time.monotonic() + during
                if time.monotonic() >= extra_until:
                    break
            await anyio.sleep(0.02)
    return seen


def assert_on_time(seen: dict[bytes, tuple[int, Message]], due: dict[bytes, int],
                   late_bound_ms: int) -> None:
    assert set(seen) == set(due), (sorted(set(due) - set(seen)), sorted(set(seen) - set(due)))
    for body, (t, _msg) in seen.items():
        assert t >= due[body], f"{body!r} seen {due[body] - t} ms before it was due"
        assert t - due[body] <= late_bound_ms, f"{body!r} {t - due[body]} ms late"


def test_a_delayed_message_crosses_a_leader_kill_and_arrives_on_time_once(
        cluster: LocalCluster) -> None:
    async def main() -> None:
        due: dict[bytes, int] = {}
        async with Producer(cluster.namesrv_addr) as p:
            for i, delay in enumerate((2.0, 3.5, 5.0)):
                before = now_ms()
                r = await p.send(TOPIC, b"d%d" % i, delay=delay, queue=i % 2)
                assert r.offset == -1 and r.msg_id  # stored, in no queue yet
                due[b"d%d" % i] = before + int(delay * 1000)  # due no earlier than this
            at = datetime.now(UTC) + timedelta(seconds=4)
            await p.send(TOPIC, b"at", deliver_at=at)
            due[b"at"] = int(at.timestamp() * 1000)
            await p.send(TOPIC, b"plain")
        old = leader_of(cluster, "g0")
        cluster.kill(old)  # the leader that stored them goes before any is due
        wait_new_leader(cluster, "g0", old, timeout=30)
        seen = await watch(cluster.namesrv_addr, 5, timeout=60, during=2.0)
        assert seen.pop(b"plain")  # the plain one, at once
        # generous lateness: an election and a loaded test machine, not a speed target
        assert_on_time(seen, due, late_bound_ms=20_000)
        # each was stored when sent: its store time is the send's, not its delivery's
        for body, (_t, m) in seen.items():
            assert m.store_ms < due[body]

    anyio.run(main)
    assert_no_unexpected_exits(cluster)


def test_a_delayed_message_survives_a_whole_cluster_power_loss(cluster: LocalCluster) -> None:
    due: dict[bytes, int] = {}
    with BlockingProducer(cluster.namesrv_addr) as p:
        # due well after the checks below, which take seconds on a loaded machine: until
        # the power goes, every one of them is still pending
        for i in range(20):
            before = now_ms()
            p.send(TOPIC, b"p%d" % i, delay=20 + i * 0.1)
            due[b"p%d" % i] = before + 20_000 + i * 100
        before = now_ms()
        p.send_batch(TOPIC, [b"b0", b"b1"], delay_level=4)  # 30 s
        due.update({b"b0": before + 30_000, b"b1": before + 30_000})
    # every replica holds what is pending (and says so), not only the leader
    wait_for(lambda: [node_status(cluster, n, "g0").get("delayed_pending")
                      for n in cluster.node_ids] == [len(due)] * 3, 10, "every replica pending")
    status = subprocess.run([sys.executable, "-m", "raftmq", "status", "--json"],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
                            env={**os.environ, "RAFTMQ_NAMESRV": cluster.namesrv_addr})
    assert json.loads(status.stdout)["groups"]["g0"]["delayed_pending"] == len(due)
    cluster.kill_together(cluster.node_ids)
    for i in cluster.node_ids:
        cluster.start_node(i)
    cluster.wait_ready(timeout=60)
    seen = anyio.run(watch, cluster.namesrv_addr, len(due), 90, 2.0)
    assert_on_time(seen, due, late_bound_ms=60_000)


def test_bad_delays_are_refused_and_store_nothing(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Producer(cluster.namesrv_addr) as p:
            for kwargs in ({"delay": -1}, {"delay": float("nan")}, {"delay_level": 19},
                           {"delay_level": 0}, {"delay": 1, "delay_level": 1},
                           {"deliver_at": datetime.now()}):  # naive: a guess
                with pytest.raises(ValueError):
                    await p.send(TOPIC, b"x", **kwargs)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await p.send(TOPIC, b"x", delay="10")  # type: ignore[arg-type]
            with pytest.raises(RequestError) as e:
                await p.send(TOPIC, b"too-far", delay=31 * 86400)
            assert e.value.code == Code.MALFORMED and "maximum delay" in str(e.value)
            with pytest.raises(RequestError):
                await p.send(TOPIC, b"too-far", deliver_at=time.time() + 40 * 86400)
            await p.send(TOPIC, b"ok", delay=0.2)
        seen = await watch(cluster.namesrv_addr, 1, timeout=30, during=1.0)
        assert set(seen) == {b"ok"}

    anyio.run(main)


def test_a_transactions_delayed_messages_wait_for_the_commit_and_their_time(
        cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Producer(cluster.namesrv_addr, transactional_id="delayer") as p:
            async with p.transaction() as tx:
                before = now_ms()
                await tx.send(TOPIC, b"tx-later", delay=2, queue=0)
                await tx.send(TOPIC, b"tx-now", queue=1)
            with pytest.raises(RuntimeError):
                async with p.transaction() as tx:
                    await tx.send(TOPIC, b"tx-aborted", delay=0.5, queue=0)
                    raise RuntimeError("abort it")
        async with Producer(cluster.namesrv_addr, producer_group="delayers") as p:
            half_before = now_ms()
            result = await p.send_in_transaction(TOPIC, b"half-later", delay=1.5,
                                                 local_transaction=lambda _m: "commit")
            assert result.state == "commit"
            rolled = await p.prepare(TOPIC, b"half-rolled-back", delay=0.5)
            await rolled.rollback()
        seen = await watch(cluster.namesrv_addr, 3, timeout=30, during=1.5)
        assert set(seen) == {b"tx-later", b"tx-now", b"half-later"}
        assert seen[b"tx-later"][0] >= before + 2000
        assert seen[b"half-later"][0] >= half_before + 1500

    anyio.run(main)


def test_raftmq_send_delay_from_the_shell(cluster: LocalCluster) -> None:
    env = {**os.environ, "RAFTMQ_NAMESRV": cluster.namesrv_addr}
    before = now_ms()
    out = subprocess.run([sys.executable, "-m", "raftmq", "send", "--topic", TOPIC,
                          "--delay", "1500ms", "shell-later"], capture_output=True,
                         text=True, env=env, cwd=REPO_ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "delayed" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "raftmq", "send", "--topic", TOPIC,
                          "--delay", "soon", "x"], capture_output=True, text=True, env=env,
                         cwd=REPO_ROOT, timeout=60)
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    seen = anyio.run(watch, cluster.namesrv_addr, 1, 30, 0.5)
    assert set(seen) == {b"shell-later"} and seen[b"shell-later"][0] >= before + 1500


def test_delayed_messages_spilled_to_files_survive_restarts_snapshots_and_arrive_once(
        tmp_path: Path) -> None:
    """Nodes that keep 40 pending messages in memory and spill those due over 3 s ahead:
    300 delayed messages go mostly to files, snapshots (every 40 entries) reference the
    files, a follower restarted from its snapshot and the leader killed still deliver
    each one on time, once."""
    small = {"timer_memory_records": 40, "timer_spill_horizon_s": 3.0,
             "snapshot_every_entries": 40}
    with LocalCluster(tmp_path / "c", nodes=3, groups=1, tick_ms=50,
                      node_overrides=small) as c:
        c.wait_ready(timeout=60)

        async def setup_and_send() -> dict[bytes, int]:
            async with Admin(c.namesrv_addr) as admin:
                await admin.create_topic(TOPIC, queues=2, groups=["g0"])
            due: dict[bytes, int] = {}
            # due from 25 s after the first send, however long 300 sends take on a loaded
            # machine: all of them are pending at once before any falls due
            start = now_ms() + 25_000
            async with Producer(c.namesrv_addr) as p:
                for i in range(300):
                    at_ms = start + (i % 60) * 100  # 25.0 .. 30.9 s after the start
                    await p.send(TOPIC, b"s%d" % i, deliver_at=at_ms / 1000,
                                 key=f"key-{i}")
                    due[b"s%d" % i] = at_ms
            return due

        due = anyio.run(setup_and_send)
        status = wait_for(lambda: [node_status(c, n, "g0") for n in c.node_ids]
                          if all(node_status(c, n, "g0").get("delayed_pending") == 300
                                 for n in c.node_ids) else None, 20, "all pending")
        for st in status:  # most of them are in files, on every replica
            assert st["delayed_runs"] >= 1 and st["delayed_in_memory"] < 300, st
        leader = leader_of(c, "g0")
        follower = next(n for n in c.node_ids if n != leader)
        assert c.restart_and_wait(follower, timeout=60) is None
        c.kill(leader)
        wait_new_leader(c, "g0", leader, timeout=30)
        c.restart(leader)
        seen = anyio.run(watch, c.namesrv_addr, 300, 120, 2.0)
        assert_on_time(seen, due, late_bound_ms=60_000)
        assert_no_unexpected_exits(c)
