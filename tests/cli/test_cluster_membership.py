"""`raftmq cluster` over real node processes: leadership moved for good, replicas added,
removed and replaced (a dead node's disk among them) while a producer runs, and the bad
requests that must change nothing."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from broker.runtime.hosted import HOSTED_FILE
from raftmq.client import Admin, GroupMembers, Producer
from raftmq.localcluster import LocalCluster
from tests.live_cluster import SendLog, check_log, drain, produce_until
from transport.blocking import request
from wire.protocol import Code, Op, RequestError

pytestmark = pytest.mark.live

TOPIC = "replicated"
WAIT = 60.0


def _status(cluster: LocalCluster, node: int) -> dict[str, Any]:
    h, _ = request(cluster.node_addr(node), {"op": int(Op.STATUS)}, timeout=5.0)
    return h


def _wait(what: str, check: Any, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except (OSError, RequestError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout} s (last: {last!r})")
        time.sleep(0.05)


def _leader(cluster: LocalCluster, gid: str) -> int:
    def find() -> int | None:
        best: tuple[int, int] | None = None
        for n in cluster.node_ids:
            if not cluster.is_running(n):
                continue
            try:
                st = _status(cluster, n)["groups"].get(gid)
            except (OSError, RequestError):
                continue
            if st and st["role"] == "leader" and (best is None or st["term"] > best[0]):
                best = (st["term"], n)
        return None if best is None else best[1]
    leader: int = _wait(f"a leader of {gid}", find)
    return leader


def _members(cluster: LocalCluster, gid: str) -> GroupMembers:
    async def ask() -> GroupMembers:
        async with Admin(cluster.namesrv_addr, timeout=5.0) as admin:
            return await admin.group_members(gid)
    return anyio.run(ask)


def _restart_empty(cluster: LocalCluster, node: int) -> None:
    """Node `node` lost its disk: wipe its data and start it with `join` (hosting nothing)."""
    cluster.kill(node)
    cfg = cluster.configs[node - 1]
    shutil.rmtree(cfg.data)
    cfg.data.mkdir()
    cluster.configs[node - 1] = dataclasses.replace(cfg, join=True)
    cluster.write_configs()
    cluster.start_node(node)


@pytest.fixture
def cluster4(tmp_path: Path) -> Iterator[LocalCluster]:
    """Four nodes, one group g0 on nodes 1-3: node 4 is a spare."""
    with LocalCluster(tmp_path, nodes=4, groups=1, tick_ms=50) as c:
        c.wait_ready(timeout=60)
        c.wait_preferred_leaders(timeout=60)  # node 1 leads: no hand-back still to come
        yield c


async def _under_load(cluster: LocalCluster, change: Any) -> SendLog:
    """Run `change(admin)` while a producer sends to TOPIC; every message it acknowledged
    must then be readable, each once, in a gapless queue."""
    log = SendLog("p")
    async with Admin(cluster.namesrv_addr, timeout=5.0) as admin:
        await admin.create_topic(TOPIC, queues=2, exist_ok=True)
        stop = anyio.Event()
        async with Producer(cluster.namesrv_addr, send_timeout=5.0, retries=5) as producer:
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce_until, producer, TOPIC, log, stop)
                await anyio.sleep(0.5)
                await change(admin)
                await anyio.sleep(0.5)
                stop.set()
    queues = await drain(cluster.namesrv_addr, TOPIC, "checker")
    check_log(queues)
    stored = {m.body.decode() for msgs in queues.values() for m in msgs}
    lost = sorted(set(log.acked) - stored)
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
    assert len(log.acked) > 50, "the producer should have kept sending throughout"
    return log


def test_transfer_leader_moves_leadership_for_good(cluster4: LocalCluster) -> None:
    c = cluster4
    to = 2  # not node 1, the configured preferred leader, which leads now

    async def move() -> None:
        async with Admin(c.namesrv_addr, timeout=5.0) as admin:
            with pytest.raises(RequestError) as exc:
                await admin.transfer_leader("g9", to)
            assert exc.value.code == Code.UNKNOWN_GROUP
            for stranger in (4, 99):  # a node of the cluster but no voter; no node at all
                with pytest.raises(RequestError) as exc:
                    await admin.transfer_leader("g0", stranger)
                assert exc.value.code == Code.NOT_A_MEMBER, exc.value
            assert (await admin.group_members("g0")).preferred == 1  # unchanged by those
            await admin.transfer_leader("g0", to)

    anyio.run(move)
    _wait(f"node {to} leading g0", lambda: _leader(c, "g0") == to)
    assert _members(c, "g0").preferred == to
    # The preference is in the log: the leader elected while `to` is down hands
    # leadership back to `to` once it is back, not to the config's node 1.
    c.kill(to)
    _wait("another leader", lambda: _leader(c, "g0") != to)
    c.start_node(to)
    _wait(f"node {to} leading g0 again", lambda: _leader(c, "g0") == to)


def test_replace_a_dead_nodes_disk_under_load(cluster4: LocalCluster) -> None:
    c = cluster4
    victim = 3

    unrouted: list[str] = []

    async def replace(admin: Admin) -> None:
        await anyio.to_thread.run_sync(_restart_empty, c, victim)
        await anyio.to_thread.run_sync(lambda: _wait(
            "the empty node serving", lambda: _status(c, victim)["groups"] == {}))
        done = anyio.Event()

        async def watch_route() -> None:
            """The topic stays routed while the new replica catches up: the name server
            trusts the table of the member that applied most, so a replica installing a
            snapshot must not report the snapshot's index beside its empty table."""
            while not done.is_set():
                try:
                    await admin.routes.namesrv_request(Op.ROUTE, {"topic": TOPIC})
                except RequestError as exc:
                    if exc.code == Code.UNKNOWN_TOPIC:
                        unrouted.append(exc.message)
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_route)
            m = await admin.replace_replica("g0", victim, victim)
            await anyio.sleep(1.0)  # the replica's registrations after its catch-up too
            done.set()
        assert m.voters == (1, 2, 3) and m.learners == ()

    _ = anyio.run(_under_load, c, replace)
    assert not unrouted, f"{len(unrouted)} ROUTE answers lost the topic: {unrouted[0]}"
    st = _status(c, victim)["groups"]["g0"]
    assert st["voters"] == [1, 2, 3]
    # The node hosts g0 now whatever its config says (join = true hosts nothing): a
    # restart comes back with it, from the hosted list.
    c.kill(victim)
    c.start_node(victim)
    _wait("g0 back on the restarted node", lambda: "g0" in _status(c, victim)["groups"])
    assert (c.configs[victim - 1].data / HOSTED_FILE).exists()


def test_recreating_the_preferred_leaders_replica_gives_it_leadership_back(
        cluster4: LocalCluster) -> None:
    c = cluster4

    async def recreate() -> GroupMembers:
        async with Admin(c.namesrv_addr, timeout=5.0) as admin:
            return await admin.replace_replica("g0", 1, 1)

    m = anyio.run(recreate)
    assert m.voters == (1, 2, 3) and m.preferred == 1  # moved off it for the change only
    assert "stopped hosting a replica" in c.log_path("n1").read_text()
    _wait("node 1 leading g0 again", lambda: _leader(c, "g0") == 1)


def test_replace_a_dead_node_by_a_fresh_one_under_load(cluster4: LocalCluster) -> None:
    c = cluster4
    dead = _leader(c, "g0")  # the worst case: the leader dies
    seen: dict[str, GroupMembers] = {}

    async def replace(admin: Admin) -> None:
        await anyio.to_thread.run_sync(c.kill, dead)
        seen["after"] = await admin.replace_replica("g0", dead, 4)

    anyio.run(_under_load, c, replace)
    assert seen["after"].voters == tuple(sorted({1, 2, 3, 4} - {dead}))
    assert seen["after"].dropped is False  # it was down: its copy stays until told
    assert _status(c, 4)["groups"]["g0"]["voters"] == list(seen["after"].voters)


def test_add_remove_and_replace_on_a_spare_node_under_load(cluster4: LocalCluster) -> None:
    c = cluster4
    seen: dict[str, GroupMembers] = {}

    async def change(admin: Admin) -> None:
        seen["added"] = await admin.add_replica("g0", 4)
        seen["removed"] = await admin.remove_replica("g0", 4)
        leader = (await admin.group_members("g0")).leader
        seen["replaced"] = await admin.replace_replica("g0", leader, 4)  # the leader's

    anyio.run(_under_load, c, change)
    assert seen["added"].voters == (1, 2, 3, 4)
    assert seen["removed"].voters == (1, 2, 3) and seen["removed"].dropped is True
    old = next(n for n in (1, 2, 3) if n not in seen["replaced"].voters)
    assert sorted(seen["replaced"].voters) == sorted({1, 2, 3, 4} - {old})
    _wait(f"node {old} dropping g0", lambda: "g0" not in _status(c, old)["groups"])
    assert not (c.configs[old - 1].data / "g0").exists()
    assert "g0" in _status(c, 4)["groups"]


def test_bad_membership_requests_change_nothing(cluster4: LocalCluster) -> None:
    c = cluster4
    leader = _leader(c, "g0")
    follower = next(n for n in (1, 2, 3) if n != leader)
    other = next(n for n in (1, 2, 3) if n not in (leader, follower))

    async def bad(cases: list[tuple[str, tuple[Any, ...], Code, str]]) -> None:
        async with Admin(c.namesrv_addr, timeout=5.0) as admin:
            for name, args, code, word in cases:
                with pytest.raises(RequestError) as exc:
                    await getattr(admin, name)(*args)
                assert exc.value.code == code, (name, args, exc.value)
                assert word in exc.value.message, (name, args, exc.value)

    anyio.run(bad, [
        ("add_replica", ("g9", 4), Code.UNKNOWN_GROUP, "g9"),
        ("add_replica", ("g0", 99), Code.NOT_A_MEMBER, "99"),
        ("add_replica", ("g0", follower), Code.MEMBERSHIP_REFUSED, "already a voter"),
        ("remove_replica", ("g0", leader), Code.MEMBERSHIP_REFUSED, "transfer-leader"),
        ("replace_replica", ("g0", 4, 1), Code.NOT_A_MEMBER, "not a voter"),
    ])
    for node, header, code in (
        (4, {"op": int(Op.HOST_GROUP), "g": "g9", "voters": [1]}, Code.UNKNOWN_GROUP),
        (4, {"op": int(Op.HOST_GROUP), "g": "g0", "voters": [1, 99]}, Code.MALFORMED),
        (4, {"op": int(Op.HOST_GROUP), "g": "g0", "voters": []}, Code.MALFORMED),
        (leader, {"op": int(Op.MEMBERSHIP), "g": "g0", "action": "grow", "node": 4},
         Code.MALFORMED),
        (leader, {"op": int(Op.MEMBERSHIP), "g": "g0", "action": "remove"}, Code.MALFORMED),
        (leader, {"op": int(Op.DROP_GROUP), "g": "g0"}, Code.MEMBERSHIP_REFUSED),
        (follower, {"op": int(Op.DROP_GROUP), "g": "g0"}, Code.MEMBERSHIP_REFUSED),
    ):
        with pytest.raises(RequestError) as exc:
            request(c.node_addr(node), header, timeout=5.0)
        assert exc.value.code == code, (node, header, exc.value)
    assert _status(c, 4)["groups"] == {}
    assert "g0" in _status(c, leader)["groups"] and "g0" in _status(c, follower)["groups"]
    assert _members(c, "g0").voters == (1, 2, 3)
    # With one voter paused (its connections stay up, it answers nothing), removing
    # another would leave two voters, one unreachable.
    c.pause(other)
    _wait(f"node {leader} no longer hearing from node {other}",
          lambda: other not in _members(c, "g0").active)
    anyio.run(bad, [("remove_replica", ("g0", follower), Code.MEMBERSHIP_REFUSED,
                     "reachable")])
    assert _members(c, "g0").voters == (1, 2, 3)
    assert "g0" in _status(c, follower)["groups"]
    # Both followers down: no leader answers; status says so for g0 and exits 1.
    c.kill(follower)
    proc = subprocess.run([sys.executable, "-m", "raftmq", "cluster", "status", "--json",
                           "--namesrv", c.namesrv_addr], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "error" in json.loads(proc.stdout)["g0"]


def test_a_replica_added_after_retention_is_caught_up_by_the_leaders_snapshot(
        tmp_path: Path) -> None:
    """The leader no longer holds entry 1: the new replica gets its snapshot, then the
    retained entries, and once it leads it serves every retained message."""
    from tests.broker.runtime.test_snapshot_install import (
        BATCHES,
        OVERRIDES,
        check_everything_readable,
        produce,
        segments,
    )
    from tests.conftest import live_cluster, node_status, wait_for
    from tests.live_cluster import LiveCluster

    with live_cluster(tmp_path, nodes=4, groups=1, node_overrides=OVERRIDES) as c:
        live = LiveCluster(c, "t", 1)
        live.settle()
        live.create_topic()
        produce(live, BATCHES)

        def settled() -> int | None:
            sts = [node_status(c, n, "g0") for n in (1, 2, 3)]
            if not all(sts) or any(len(segments(live, n)) != 1 for n in (1, 2, 3)):
                return None
            los = {st["queues"]["t"][0][0] for st in sts}
            firsts = {st["first"] for st in sts}
            return los.pop() if len(los) == 1 and min(firsts) > 1 else None

        lo = wait_for(settled, 60, "retention deleting the head of g0's log")

        async def add() -> GroupMembers:
            async with Admin(c.namesrv_addr, timeout=5.0) as admin:
                return await admin.add_replica("g0", 4)

        assert anyio.run(add).voters == (1, 2, 3, 4)
        assert "installing snapshot" in c.log_path("n4").read_text()

        async def prefer_4() -> None:  # for good: no hand-back while we read from it
            async with Admin(c.namesrv_addr, timeout=5.0) as admin:
                await admin.transfer_leader("g0", 4)

        anyio.run(prefer_4)
        _wait("node 4 leading g0", lambda: _leader(c, "g0") == 4)
        check_everything_readable(live, 4, lo)


def test_a_replace_stopped_half_way_is_finished_by_running_it_again(
        cluster4: LocalCluster) -> None:
    """`replace-replica` and `add-replica` stopped half way (a timeout, a node down) leave
    the group a voter short; the same command run again finishes the job."""
    c = cluster4
    seen: dict[str, GroupMembers] = {}

    async def add_learner(admin: Admin, node: int) -> None:
        # what an add stopped after its learner was logged leaves (the node lost the
        # replica since, or never built it): a learner the node does not host
        await admin.routes.call_group("g0", Op.MEMBERSHIP,
                                      {"g": "g0", "action": "add-learner", "node": node})

    async def steps() -> None:
        async with Admin(c.namesrv_addr, timeout=5.0) as admin:
            await anyio.to_thread.run_sync(_restart_empty, c, 3)
            await anyio.to_thread.run_sync(lambda: _wait(
                "the empty node serving", lambda: _status(c, 3)["groups"] == {}))
            # `replace-replica g0 3 3` stopped after removing node 3 and adding its learner
            await admin.remove_replica("g0", 3)
            await add_learner(admin, 3)
            seen["short"] = await admin.group_members("g0")
            seen["again"] = await admin.replace_replica("g0", 3, 3, catch_up_timeout=WAIT)
            # `replace-replica g0 3 4` whose answer was lost: running it again changes
            # nothing and says the new node votes already (a bad request looks the same)
            seen["moved"] = await admin.replace_replica("g0", 3, 4, catch_up_timeout=WAIT)
            with pytest.raises(RequestError) as again:
                await admin.replace_replica("g0", 3, 4)
            assert again.value.code == Code.NOT_A_MEMBER
            assert "node 4 votes already" in again.value.message
            seen["moved_again"] = await admin.group_members("g0")
            # `add-replica g0 3` stopped at its learner: running it again resumes
            await add_learner(admin, 3)
            seen["added"] = await admin.add_replica("g0", 3, catch_up_timeout=WAIT)

    anyio.run(steps)
    assert seen["short"].voters == (1, 2) and seen["short"].learners == (3,)
    assert seen["again"].voters == (1, 2, 3) and not seen["again"].learners
    assert seen["moved"].voters == (1, 2, 4)
    assert seen["moved_again"].voters == (1, 2, 4)
    assert seen["added"].voters == (1, 2, 3, 4) and not seen["added"].learners
    _wait("node 3 following g0",
          lambda: _status(c, 3)["groups"].get("g0", {}).get("role") == "follower")


def test_replace_replica_outlasts_the_re_created_node_restarting(
        cluster4: LocalCluster) -> None:
    """`raftmq cluster replace-replica g0 3 3` while node 3 is down, started again only
    after the command removed its replica: the command's request to it fails on the way
    (CONNECTION_LOST) and the replace resumes once the node is back, within --timeout,
    instead of failing."""
    c = cluster4
    c.kill(3)
    proc = subprocess.Popen([sys.executable, "-m", "raftmq", "cluster", "replace-replica",
                             "g0", "3", "3", "--timeout", "120", "--json",
                             "--namesrv", c.namesrv_addr],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait("node 3 removed from g0 by the command", lambda: _members(c, "g0").voters == (1, 2))
        time.sleep(2.0)  # its next request, to the node still down, fails meanwhile
        c.start_node(3)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert json.loads(out)["voters"] == [1, 2, 3]
    assert _members(c, "g0").voters == (1, 2, 3)
