"""The nemeses after the faults that lost data in other systems, each in a short
`raftmq chaos run` of real nodes: it acts (visible in the history and in the nodes), the
run stays valid, and the unavailability table has a row for it.

`disk-full` needs root and a loop device (`SmallDisk.supported`); without them its tests
are skipped. Its chaos run is opt-in (`-m chaos`); the short deterministic test below
fills one node's disk and frees it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from broker.config import ALLOW_MUTATIONS_ENV
from chaos.disk_faults import SmallDisk
from chaos.histories import parse_faults
from chaos.nemesis import NEMESES
from chaos.run import RunOptions, parse_list, run_chaos
from raftlog.commitlog import CommitLog
from raftmq.client import Admin, Producer, PullConsumer
from raftmq.commands.status import _render as render_status
from raftmq.commands.status import cluster_status
from raftmq.localcluster import LocalCluster
from tests.conftest import group_leader, node_status, wait_for
from wire.protocol import RequestError

SECONDS = float(os.environ.get("CHAOS_NEMESES_SECONDS", "30"))
NO_SMALL_DISK = SmallDisk.supported(Path(tempfile.gettempdir()))  # None: disk-full can run


def _run(out: Path, nemesis: tuple[str, ...], seed: int, **kw: object) -> dict:
    opts = RunOptions(out=out, time=SECONDS, nemesis=nemesis, seed=seed, drain_timeout=30.0,
                      **kw)  # type: ignore[arg-type]
    results = run_chaos(opts)
    assert (out / "report.html").read_text().count("Unavailability per fault") == 1
    return results


def test_all_names_every_new_nemesis() -> None:
    new = {"delay", "loss", "partition-clients", "truncate-file", "bitflip-file",
           "snapshot-corrupt", "disk-full", "membership"}
    assert new <= set(parse_list("all", NEMESES, "nemesis"))

@pytest.mark.live

def test_network_nemeses_act_and_the_run_is_valid(tmp_path: Path) -> None:
    kinds = ("delay", "loss", "partition-clients")
    results = _run(tmp_path, kinds, seed=1)
    assert results["valid"], json.dumps(results["problems"])
    faults = {f.f: f for f in parse_faults(tmp_path / "history.jsonl")}
    assert set(faults) == set(kinds)
    links = ["raft 1->2", "raft 1->3", "raft 2->3", "clients->1", "clients->2", "clients->3"]
    assert faults["delay"].value["links"] == links and faults["delay"].value["delay"] == 0.1
    assert faults["loss"].value["lost_chunks"] > 0  # counted by the proxies it passed
    cut = faults["partition-clients"].value["nodes"]
    assert len(cut) == 1
    assert set(results["unavailability_by_fault"]) == set(kinds)

@pytest.mark.live
def test_damaged_file_nemeses_are_repaired_or_refused_and_lose_nothing(tmp_path: Path) -> None:
    kinds = ("truncate-file", "bitflip-file", "snapshot-corrupt")
    results = _run(tmp_path, kinds, seed=1, snapshot_every_entries=100)
    faults = parse_faults(tmp_path / "history.jsonl")
    assert {f.f for f in faults} == set(kinds)
    logs = tmp_path / "cluster" / "logs"
    rebuilt: set[int] = set()  # nodes that set a damaged snapshot aside, rebuilding
    for f in faults:
        (node,) = f.value["nodes"]
        damaged = f.value["damaged"][str(node)]
        if damaged is None:
            # with snapshots every 100 entries there is a file, unless an earlier fault's
            # snapshot was set aside and the node has not yet applied far enough past the
            # leader's snapshot it installed to write a new one
            assert f.f == "snapshot-corrupt" and node in rebuilt, f
            continue
        if f.f == "snapshot-corrupt":
            assert damaged["kind"] in ("snapshot", "chunk")
        assert damaged["how"] == {"truncate-file": "truncate", "bitflip-file": "bitflip"}.get(
            f.f, damaged["how"])
        outcome = f.value["outcome"][str(node)]
        assert outcome in ("started", "refused")
        if outcome == "started" and damaged["kind"] in ("snapshot", "chunk"):
            rebuilt.add(node)  # a damaged snapshot: set aside, the leader's installed
        if outcome == "refused":  # the node said why, and came back once restored
            assert "corrupt" in f.value["refusals"][str(node)]
        assert (logs / f"n{node}.log").read_text().count("group opened") >= 2
    assert set(results["unavailability_by_fault"]) == set(kinds)
    assert results["lost"] == 0 and results["unexpected"] == 0
    assert all(v is not False for v in results["linearizable"].values())
    # a replica whose log was cut below its snapshot refills before it may lead
    # (test_commitlog_damage.py), so the final drain reaches the end of every queue
    assert results["valid"], json.dumps(results["problems"])


@pytest.mark.live
@pytest.mark.chaos
@pytest.mark.skipif(NO_SMALL_DISK is not None, reason=f"disk-full cannot run: {NO_SMALL_DISK}")
def test_disk_full_fills_one_node_and_frees_it(tmp_path: Path) -> None:
    results = _run(tmp_path, ("disk-full",), seed=2, disk_size=64 << 20)
    (fault, *_) = parse_faults(tmp_path / "history.jsonl")
    assert fault.f == "disk-full"
    (node,) = fault.value["nodes"]
    assert fault.value["free_after"] < 64 << 10 < fault.value["ballast"]
    assert fault.value["free_after_heal"] > 32 << 20
    assert "No space left on device" in (tmp_path / "cluster" / "logs" / f"n{node}.log").read_text()
    assert "disk-full" in results["unavailability_by_fault"]
    assert results["lost"] == 0 and results["unexpected"] == 0


async def _produce(namesrv: str, prefix: str, n: int) -> list[bytes]:
    """Send `n` messages one by one; returns those acknowledged, in order. A send that
    fails (refused, or its outcome unknown while a leader's disk is full) is not."""
    acked = []
    async with Admin(namesrv) as admin:
        await admin.create_topic("t", 1, exist_ok=True)
    async with Producer(namesrv) as producer:
        for k in range(n):
            try:
                await producer.send("t", f"{prefix}{k}", queue=0)
            except RequestError:
                continue
            acked.append(f"{prefix}{k}".encode())
    return acked


async def _read_queue(namesrv: str) -> list[bytes]:
    """Every message of t/0, from the first offset to the end."""
    out: list[bytes] = []
    async with PullConsumer(namesrv, "disk-full-check", wait_ms=0) as consumer:
        offset = 0
        while True:
            res = await consumer.pull("t", 0, offset)
            out += [bytes(m.body) for m in res.messages]
            if res.next_offset >= res.end_offset:
                return out
            offset = res.next_offset


@contextlib.contextmanager
def _node_1_on_a_small_disk(
    tmp_path: Path, *, sync_marks: bool = False,
) -> Iterator[tuple[LocalCluster, SmallDisk]]:
    """A ready 3-node, 1-group cluster whose node 1 keeps its data on a 64 MiB file
    system of its own (`sync_marks`: every node records its fsyncs, as under chaos);
    on the way out node 1's CommitLog is checked for torn entries (the cluster stopped
    cleanly) and the file system goes."""
    marks = {"node_overrides": {"test_sync_marks": True},
             "env": {ALLOW_MUTATIONS_ENV: "1"}} if sync_marks else {}
    cluster = LocalCluster(tmp_path / "c", nodes=3, groups=1, tick_ms=50,
                           **marks)  # type: ignore[arg-type]
    disk = SmallDisk(cluster.configs[0].data, tmp_path / "n1.img", 64 << 20)
    disk.mount()
    try:
        with cluster:
            cluster.wait_ready(30.0)
            yield cluster, disk
            assert cluster.unexpected_exits() == {}
        lg = CommitLog.open(cluster.configs[0].group_dir("g0"))
        try:
            assert lg.verify() == [] and lg.recovery.truncated_from_index is None
        finally:
            lg.close()
    finally:
        disk.unmount()


def _node_1_caught_up(cluster: LocalCluster) -> bool:
    leader = group_leader(cluster, "g0")
    if leader is None:
        return False
    commit = node_status(cluster, leader, "g0").get("commit", 0)
    s1 = node_status(cluster, 1, "g0")
    return not s1.get("disk_full", True) and s1.get("applied", -1) >= commit


@pytest.mark.live
@pytest.mark.skipif(NO_SMALL_DISK is not None, reason=f"disk-full cannot run: {NO_SMALL_DISK}")
def test_a_node_whose_disk_is_full_refuses_writes_and_catches_up_once_space_is_freed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """While node 1's file system is full, its group writes and acknowledges nothing
    there (the node says why, `raftmq status` shows it, and it stays up) and the other
    two carry on; nothing acknowledged is lost; once space is freed node 1 catches up by
    itself, without a restart, and its CommitLog holds no torn entry."""
    with _node_1_on_a_small_disk(tmp_path) as (cluster, disk):
        namesrv = cluster.namesrv_addr
        acked = trio.run(_produce, namesrv, "a", 5)
        assert len(acked) == 5
        disk.fill()
        during = trio.run(_produce, namesrv, "b", 20)
        assert during, "nodes 2 and 3 acknowledged nothing while node 1's disk was full"
        acked += during
        log1 = cluster.base_dir / "logs" / "n1.log"
        wait_for(lambda: "disk full: the group writes and acknowledges nothing"
                 in log1.read_text(), 30.0, "node 1 says its disk is full")
        shown = trio.run(cluster_status, [namesrv])
        assert shown["groups"]["g0"]["members"][1]["disk_full"] is True
        render_status(shown)
        assert "g0: node 1's disk is full" in capsys.readouterr().out
        disk.free()
        after = trio.run(_produce, namesrv, "c", 5)
        assert after
        acked += after
        wait_for(lambda: _node_1_caught_up(cluster), 60.0,
                 "node 1 catches up once space is freed")
        got = trio.run(_read_queue, namesrv)
        assert set(acked) <= set(got), "an acknowledged message was lost"
        assert [m for m in dict.fromkeys(got) if m in set(acked)] == acked


@pytest.mark.live
@pytest.mark.skipif(NO_SMALL_DISK is not None, reason=f"disk-full cannot run: {NO_SMALL_DISK}")
@pytest.mark.parametrize("sync_marks", [False, True], ids=["plain", "recording-fsyncs"])
def test_a_node_started_on_a_full_disk_waits_for_space_and_then_serves(
    tmp_path: Path, sync_marks: bool,
) -> None:
    """A node restarted while its disk is full cannot finish recovery (it rewrites its
    index, here removed) but waits for space, still running, instead of exiting; once
    space is freed it opens its group, catches up and nothing acknowledged is lost.
    Under chaos (`sync_marks`) the record of its fsyncs, rewritten first, waits too."""
    with _node_1_on_a_small_disk(tmp_path, sync_marks=sync_marks) as (cluster, disk):
        namesrv = cluster.namesrv_addr
        acked = trio.run(_produce, namesrv, "a", 20)
        assert len(acked) == 20
        cluster.kill(1)
        (cluster.configs[0].group_dir("g0") / "commitlog" / "index").unlink()  # rebuilt at open
        disk.fill()
        log1 = cluster.base_dir / "logs" / "n1.log"
        cluster.restart(1)
        first = "starting the record of fsyncs" if sync_marks else "opening the group"
        wait_for(lambda: f"disk full while {first}" in log1.read_text(), 30.0,
                 "node 1 says it waits for space while starting")
        acked += trio.run(_produce, namesrv, "b", 5)  # nodes 2 and 3 carry on
        assert cluster.is_running(1), "node 1 exited on a full disk:\n" + log1.read_text()
        disk.free()
        back = "fsyncs recorded" if sync_marks else "the group opened"
        wait_for(lambda: f"disk space is back: {back}" in log1.read_text(), 30.0,
                 "node 1 goes on once space is freed")
        cluster.wait_ready(30.0)
        wait_for(lambda: _node_1_caught_up(cluster), 60.0, "node 1 catches up")
        got = trio.run(_read_queue, namesrv)
        assert set(acked) <= set(got), "an acknowledged message was lost"


@pytest.mark.live
def test_membership_nemesis_removes_adds_and_replaces_a_disk_and_the_run_is_valid(
        tmp_path: Path) -> None:
    results = _run(tmp_path, ("membership",), seed=1)
    assert results["valid"], json.dumps(results["problems"])
    faults = [f for f in parse_faults(tmp_path / "history.jsonl") if f.f == "membership"
              and "skipped" not in f.value and f.value["action"] != "restore"]
    actions = [f.value["action"] for f in faults]
    assert actions[:2] == ["remove-add", "replace-disk"], actions  # they take turns
    logs = tmp_path / "cluster" / "logs"
    for f in faults:
        # a step cut short (a connection to the node being re-created lost) is finished
        # by the heal, which records the groups it added the node back to
        healed = f.value.get("added", {})
        for error in f.value.get("errors", []):
            group = error.split()[1].rstrip(":")
            assert f.value["nodes"][0] in healed.get(group, []), f.value
        (node,) = f.value["nodes"]
        log = (logs / f"n{node}.log").read_text()
        if f.value["action"] == "remove-add":
            (group,) = f.value["groups"]
            assert node not in f.value["removed"][group]
            assert node in f.value["added"][group]
            assert "stopped hosting a replica and deleted its data" in log
        else:
            assert f.value["wiped"] > 0
            assert f.value["groups"] and all(
                node in f.value["replaced"].get(g, healed.get(g, [])) for g in f.value["groups"])
        assert "hosting a new replica" in log  # the node built it empty, then caught up
    assert "membership" in results["unavailability_by_fault"]
