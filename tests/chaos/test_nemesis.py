"""The fault scheduler (`chaos.nemesis`): a pure, seeded schedule, and faults on a real
cluster wired through the fault proxies."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config import ALLOW_MUTATIONS_ENV
from chaos.histories import Fault, parse_faults
from chaos.nemesis import CRASH_SCOPES, NEMESES, Cadence, Nemesis, Step, plan, schedule
from chaos.proxy import ProxyNet
from chaos.recorder import Recorder
from raftmq.localcluster import LocalCluster

# ------------------------------------------------------------------ the schedule


def test_a_seed_replays_the_same_schedule() -> None:
    a = plan(random.Random(7), NEMESES, 600)
    assert a == plan(random.Random(7), NEMESES, 600)
    assert a != plan(random.Random(8), NEMESES, 600)
    assert plan(random.Random(7), NEMESES, 120) == [s for s in a if s.end <= 120]
    assert [s.describe() for s in a[:2]] == [s.describe() for s in plan(random.Random(7),
                                                                         NEMESES, 30)[:2]]


@settings(max_examples=50, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**32),
    st.lists(st.sampled_from(NEMESES), min_size=1, max_size=len(NEMESES), unique=True),
)
def test_default_cadence_one_fault_at_a_time(seed: int, enabled: Sequence[str]) -> None:
    cadence = Cadence()
    steps = plan(random.Random(seed), enabled, 300.0, cadence)
    assert 300 / 10 - 2 <= len(steps) <= 300 / 6 + 1  # a fault every 6-10 s (stretched)
    for step in steps:
        assert step.kind in enabled
        assert 2.0 <= step.length <= 8.0 and 0 < step.end <= 300
        assert (step.scope is not None) == (step.kind == "crash-unsynced")
    assert cadence.first[0] <= steps[0].at <= cadence.first[1]
    for before, after in zip(steps, steps[1:], strict=False):
        assert after.at >= before.end + cadence.quiet - 0.01  # healed in between
        assert after.at - before.at >= cadence.gap[0] - 0.01
    # every enabled nemesis occurs once in every round of len(enabled) faults
    k = len(enabled)
    for r in range(len(steps) // k):
        assert sorted(s.kind for s in steps[r * k : (r + 1) * k]) == sorted(enabled)


def test_crash_scopes_rotate() -> None:
    steps = plan(random.Random(3), ["crash-unsynced"], 200)
    scopes = [s.scope for s in steps]
    for r in range(len(scopes) // 3):
        assert sorted(scopes[3 * r : 3 * r + 3]) == sorted(CRASH_SCOPES)  # type: ignore[type-var]


def test_schedule_is_endless_and_refuses_unknown_names() -> None:
    steps = schedule(random.Random(0), ["kill"], Cadence(gap=(1, 1), length=(0.1, 0.1)))
    assert all(isinstance(next(steps), Step) for _ in range(1000))
    with pytest.raises(ValueError, match="unknown nemesis"):
        plan(random.Random(0), ["kill", "flood"], 10)
    with pytest.raises(ValueError, match="no nemesis"):
        plan(random.Random(0), [], 10)


def test_partitions_need_a_proxynet_and_crashes_need_sync_marks(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path)  # not started: the checks happen at construction
    with Recorder(tmp_path / "h.jsonl") as rec:
        with pytest.raises(ValueError, match="need a ProxyNet"):
            Nemesis(cluster, None, rec, rng=random.Random(0), enabled=["bridge"])
        Nemesis(cluster, None, rec, rng=random.Random(0), enabled=["kill", "pause"])
        with pytest.raises(ValueError, match="test_sync_marks"):
            Nemesis(cluster, None, rec, rng=random.Random(0), enabled=["crash-unsynced"])


# ------------------------------------------------------------------ a live cluster


FAST = Cadence(first=(1.0, 1.5), gap=(4.5, 5.0), length=(2.0, 2.5), quiet=1.5)


async def _produce(namesrv: str, n: int) -> None:
    from raftmq.client.admin import Admin
    from raftmq.client.producer import Producer

    async with Admin(namesrv) as admin:
        await admin.create_topic("t", 3)
    async with Producer(namesrv) as producer:
        for k in range(n):
            await producer.send("t", f"m{k}")


async def _stored(namesrv: str, want: int, timeout: float = 15.0) -> int:
    """Messages stored in topic t (sum of queue ends), polled until `want` or `timeout`:
    right after a heal a queue's new leader may not answer yet."""
    from raftmq.client.admin import Admin

    best = 0
    async with Admin(namesrv) as admin:
        with trio.move_on_after(timeout):
            while best < want:
                info = await admin.describe_topic("t")
                best = max(best, sum(q.end_offset or 0 for q in info.queues))
                await trio.sleep(0.2)
    return best


async def _run_nemesis(
    tmp_path: Path, enabled: Sequence[str], seconds: float, seed: int,
    overrides: dict[str | int, Any] | None = None, env: dict[str, str] | None = None,
    produce: int = 0,
) -> tuple[LocalCluster, Nemesis, dict[str, int]]:
    """Start a proxied 3-node cluster, optionally produce `produce` messages, run the
    nemesis for `seconds`, heal, and check that every group has a leader, no node died
    on its own, nothing is left blocked and every produced message is still stored."""
    net = ProxyNet([1, 2, 3])
    async with trio.open_nursery() as nursery:
        await nursery.start(net.serve)
        cluster = LocalCluster(tmp_path / "cluster", tick_ms=50, env=env,
                               node_overrides=net.node_overrides(overrides))
        try:
            await trio.to_thread.run_sync(cluster.start)
            await trio.to_thread.run_sync(cluster.wait_ready, 30.0)
            if produce:
                await _produce(cluster.namesrv_addr, produce)
            with Recorder(tmp_path / "history.jsonl") as rec:
                nemesis = Nemesis(cluster, net, rec, rng=random.Random(seed), enabled=enabled,
                                  cadence=FAST, ready_timeout=20.0)
                await nemesis.run(time.monotonic() + seconds)
                await nemesis.heal()
            leaders = await trio.to_thread.run_sync(cluster.wait_ready, 20.0)
            exits = cluster.unexpected_exits()
            assert exits == {}, "no node exits except by the nemesis' hand"
            assert nemesis.exited == [], "no node exited on its own during the run"
            assert net.blocked_pairs() == set()
            if produce:
                assert await _stored(cluster.namesrv_addr, produce) >= produce
        finally:
            await trio.to_thread.run_sync(cluster.stop)
            nursery.cancel_scope.cancel()
    return cluster, nemesis, leaders


@pytest.mark.live
def test_live_kill_pause_and_isolation_are_recorded_and_healed(tmp_path: Path) -> None:
    enabled = ("kill", "pause", "partition-node")
    out: dict[str, Any] = {}

    async def main() -> None:
        out["cluster"], out["nemesis"], out["leaders"] = await _run_nemesis(
            tmp_path, enabled, 20.0, seed=11)

    trio.run(main)
    cluster, nemesis = out["cluster"], out["nemesis"]
    faults = parse_faults(tmp_path / "history.jsonl")
    assert sorted(f.f for f in faults[:3]) == sorted(enabled), faults  # one round of three
    assert all(f.end > f.start for f in faults), "every fault was healed"
    for f in faults:
        assert isinstance(f.value, dict)
        if f.f in ("kill", "pause", "partition-node"):
            (node,) = f.value["nodes"]
            assert node in cluster.node_ids
            assert all(n == node for n in f.value["leaders"].values())
        if f.f == "partition-node":
            assert len(f.value["blocked"]) == 2 and f.value["cut_off"] == f.value["nodes"]
    assert [h["f"] for h in nemesis.history] == [f.f for f in faults]
    assert all(h["problem"] is None and h["ready_after"] < 20 for h in nemesis.history)
    assert set(out["leaders"]) == {"g0", "g1", "g2"}


@pytest.mark.live
def test_live_leader_transfer_storm_moves_leaders(tmp_path: Path) -> None:
    out: dict[str, Any] = {}

    async def main() -> None:
        _, out["nemesis"], _ = await _run_nemesis(tmp_path, ["leader-transfer"], 5.0, seed=5)

    trio.run(main)
    (fault,) = parse_faults(tmp_path / "history.jsonl")
    transfers = fault.value["transfers"]
    assert fault.f == "leader-transfer" and len(transfers) >= 2
    assert any(t.get("ok") for t in transfers), transfers
    assert all(t["to"] in (1, 2, 3) and t["group"] in ("g0", "g1", "g2") for t in transfers)


@pytest.mark.live
def test_live_power_loss_and_corruption_keep_acknowledged_messages(tmp_path: Path) -> None:
    """A power loss of the whole cluster (crash-unsynced, scope "all" for this seed), then
    a corrupt entry on one node; with fsync=always every acknowledged message survives."""
    out: dict[str, Any] = {}

    async def main() -> None:
        _, out["nemesis"], _ = await _run_nemesis(
            tmp_path, ["crash-unsynced", "corrupt"], 14.0, seed=4, produce=60,
            overrides={"test_sync_marks": True}, env={ALLOW_MUTATIONS_ENV: "1"})

    trio.run(main)
    faults: dict[str, Fault] = {}
    for f in parse_faults(tmp_path / "history.jsonl"):
        faults.setdefault(f.f, f)  # the first of each kind
    assert set(faults) == {"crash-unsynced", "corrupt"}
    crash = faults["crash-unsynced"].value
    assert crash["scope"] == "all" and crash["nodes"] == [1, 2, 3]
    assert sorted(crash["discarded"]) == [str(n) for n in crash["nodes"]]
    corrupt = faults["corrupt"].value
    assert corrupt["corrupted"] is not None and corrupt["corrupted"]["group"] in ("g0", "g1", "g2")


@pytest.mark.live
def test_a_node_that_exits_on_its_own_is_started_again_at_the_heal_and_reported(
    tmp_path: Path,
) -> None:
    """A node dying by no fault's hand (here a SIGKILL the nemesis did not send) is a
    finding: the heal reports it in `exited` and starts the node again, so the cluster is
    whole for what follows."""
    async def main() -> None:
        cluster = LocalCluster(tmp_path / "cluster", tick_ms=50)
        try:
            await trio.to_thread.run_sync(cluster.start)
            await trio.to_thread.run_sync(cluster.wait_ready, 30.0)
            with Recorder(tmp_path / "history.jsonl") as rec:
                nemesis = Nemesis(cluster, None, rec, rng=random.Random(1), enabled=["kill"],
                                  cadence=FAST, ready_timeout=20.0)
                pid = cluster.pid(2)
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                while cluster.is_running(2):
                    await trio.sleep(0.05)
                await nemesis.heal()
            assert [(e["node"], e["code"], e["restarted"]) for e in nemesis.exited] == [
                ("n2", -signal.SIGKILL, True)]
            assert cluster.is_running(2)
            await trio.to_thread.run_sync(cluster.wait_ready, 20.0)
            assert cluster.unexpected_exits() == {}  # reported once, by the nemesis
        finally:
            await trio.to_thread.run_sync(cluster.stop)

    trio.run(main)
