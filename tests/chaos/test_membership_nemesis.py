"""The `membership` nemesis never destroys a majority and heals what it did: the choice
(`membership_blocker`), the heal's next action (`restore_action`), the verdict of a run
the harness left degraded, and on a live cluster a replace-disk whose heal fails (another
voter stopped) being finished by the final heal."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import trio

import chaos.nemesis as nemesis_module
from chaos.analysis import analyze_run
from chaos.histories import parse_faults
from chaos.nemesis import Nemesis, Step, membership_blocker, restore_action
from chaos.recorder import Recorder
from raftmq.client.admin import Admin
from raftmq.client.membership import GroupMembers
from raftmq.localcluster import LocalCluster
from tests.conftest import node_status, steady_leaders

FULL = (1, 2, 3)


def _members(voters: tuple[int, ...] = FULL, learners: tuple[int, ...] = (), leader: int = 1,
             active: tuple[int, ...] = FULL, matches: dict[int, int] | None = None,
             last: int = 100) -> GroupMembers:
    if matches is None:
        matches = {n: last for n in (*voters, *learners) if n != leader}
    return GroupMembers(group="g0", leader=leader, voters=voters, learners=learners,
                        matches=matches, active=active, commit=last, last=last, preferred=1,
                        addresses={}, peers=FULL)


# ------------------------------------------------------------------ the choice


def test_a_change_starts_only_on_a_full_caught_up_group() -> None:
    ok = _members()
    assert membership_blocker("g0", FULL, 2, ok, live=FULL) is None
    assert membership_blocker("g0", FULL, 1, ok, live=(2, 3)) is None  # the target may be down


@pytest.mark.parametrize(("m", "live", "reason"), [
    (None, FULL, "has no leader"),
    (_members(voters=(2, 3), leader=2), FULL, "not its full set"),  # the run that lost g0
    (_members(learners=(4,)), FULL, "not its full set"),
    (_members(), (1, 2), "node 3 of group g0 is down"),
    (_members(active=(1, 2)), FULL, "node 3 of group g0 is not heard from"),
    (_members(matches={2: 10_000, 3: 10}, last=10_000), FULL, "node 3 of group g0 lags"),
])
def test_a_change_that_could_lose_the_majority_is_refused(
        m: GroupMembers | None, live: tuple[int, ...], reason: str) -> None:
    why = membership_blocker("g0", FULL, 2, m, live=live)
    assert why is not None and reason in why, why


# ------------------------------------------------------------------ the heal's next action


def test_the_heal_adds_back_a_removed_node_and_recreates_a_wiped_voter() -> None:
    assert restore_action("add", 2, None) == "wait"
    assert restore_action("add", 2, _members(voters=(1, 3))) == "add"
    assert restore_action("add", 2, _members(voters=(1, 3), learners=(2,))) == "add"
    assert restore_action("add", 2, _members()) == "done"
    # a wiped node still voting holds nothing: it must be removed and added back
    assert restore_action("replace", 2, _members()) == "replace"
    # once out of the group, only the add is left (a learner's catch-up resumed)
    assert restore_action("replace", 2, _members(voters=(1, 3))) == "add"
    assert restore_action("replace", 2, _members(voters=(1, 3), learners=(2,))) == "add"


# ------------------------------------------------------------------ the verdict


FACTS = {"queue_groups": {f"chaos/{q}": f"g{q % 3}" for q in range(6)},
         "unexpected_exits": {}, "drained": False,
         "not_ready": "group g0 has no leader"}


def test_a_cluster_degraded_by_the_harness_is_not_blamed_on_the_product(tmp_path: Path) -> None:
    from chaos.synthetic import write_history

    path = tmp_path / "history.jsonl"
    write_history(path, seconds=3, seed=1, fault_every=2.0)
    blamed = analyze_run(path, FACTS, check_timeout=60).results
    assert blamed["verdict"] == "invalid"  # no leader, no drain: the product's fault
    degraded = ["group g0: add of node 1 not finished"]
    results = analyze_run(path, {**FACTS, "harness_degraded": degraded},
                          check_timeout=60).results
    assert results["verdict"] == "unknown" and not results["valid"], results
    assert any("the harness left the cluster degraded" in p and "g0" in p
               for p in results["problems"]), results["problems"]
    exited = analyze_run(path, {**FACTS, "harness_degraded": degraded,
                                "unexpected_exits": {"n2": -6}}, check_timeout=60).results
    assert exited["verdict"] == "invalid"  # a node dying on its own is still the product's


# ------------------------------------------------------------------ live


async def _voters(namesrv: str, groups: list[str]) -> dict[str, GroupMembers]:
    async with Admin(namesrv) as admin:
        return {g: await admin.group_members(g) for g in groups}


@pytest.mark.live
def test_live_a_failed_replace_disk_is_finished_by_the_heal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replace-disk whose heal cannot finish (another voter is stopped, so the wiped
    node cannot be taken out and added back) leaves its groups pending; once that voter
    is back, the final heal re-creates the replicas: every group has its full voter set
    and the wiped node holds its replicas again."""
    monkeypatch.setattr(nemesis_module, "MEMBERSHIP_TIMEOUT", 5.0)  # the failing heal
    out: dict[str, Any] = {}

    async def main() -> None:
        cluster = LocalCluster(tmp_path / "cluster", tick_ms=50)
        try:
            await trio.to_thread.run_sync(cluster.start)
            await trio.to_thread.run_sync(steady_leaders, cluster)  # leaders in touch
            groups = sorted(g.id for g in cluster.groups)
            with Recorder(tmp_path / "history.jsonl") as rec:
                nemesis = Nemesis(cluster, None, rec, rng=random.Random(1),
                                  enabled=("membership",), ready_timeout=20.0)
                nemesis._membership_turns = 1  # replace-disk's turn
                step = Step(at=0.0, length=1.0, kind="membership", seed=3)
                active = await nemesis._membership(step, random.Random(3))
                assert active is not None and "skipped" not in active.value, active
                (node,) = active.value["nodes"]
                other = next(n for n in cluster.node_ids if n != node)
                await trio.to_thread.run_sync(cluster.pause, other)
                await nemesis._end()  # the step's heal: it cannot finish
                out["after_step"] = list(nemesis.degraded)
                await trio.to_thread.run_sync(cluster.resume, other)
                await nemesis.heal()
                out["after_heal"] = list(nemesis.degraded)
            await trio.to_thread.run_sync(cluster.wait_ready, 30.0)
            out["members"] = await _voters(cluster.namesrv_addr, groups)

            async def settled(g: str) -> dict[str, Any]:
                """`g` as the wiped node reports it once it follows or leads: a hand-back
                of leadership to it finds it campaigning for a moment."""
                st = await trio.to_thread.run_sync(node_status, cluster, node, g)
                with trio.move_on_after(30):
                    while st.get("role") not in ("leader", "follower"):
                        await trio.sleep(0.1)
                        st = await trio.to_thread.run_sync(node_status, cluster, node, g)
                return st

            out["hosted"] = {g: await settled(g) for g in active.value["groups"]}
            out["node"], out["held"] = node, active.value["groups"]
            out["full"] = {g.id: sorted(g.replicas) for g in cluster.groups}
            out["exits"] = {**{e["node"]: e["code"] for e in nemesis.exited},
                            **cluster.unexpected_exits()}
        finally:
            await trio.to_thread.run_sync(cluster.stop)

    trio.run(main)
    node = out["node"]
    assert out["after_step"], "the step's heal was expected to fail with a voter stopped"
    assert out["after_heal"] == [], out["after_heal"]
    assert out["exits"] == {}
    for g, m in out["members"].items():
        assert sorted(m.voters) == out["full"][g] and not m.learners, (g, m)
    for g in out["held"]:  # the wiped node hosts its replicas again, as a voter
        assert node in out["members"][g].voters
        assert out["hosted"][g].get("role") in ("leader", "follower"), out["hosted"][g]
    faults = [f for f in parse_faults(tmp_path / "history.jsonl") if f.f == "membership"]
    assert [f.value["action"] for f in faults] == ["replace-disk", "restore"], faults
    assert faults[0].value.get("pending"), faults[0].value  # recorded as left unfinished
    assert set(faults[1].value["replaced"]) | set(faults[1].value.get("added", {})) == \
        set(out["held"]), faults[1].value
