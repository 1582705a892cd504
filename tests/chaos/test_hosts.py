"""Chaos on hosts of several shards (`raftmq chaos run --hosts H --shards S`).

The pure parts: node faults choose their targets over hosts (`pick_on_hosts`), so a
minority of hosts never takes a majority of a group however its shards are taken;
partitions drawn over hosts expand to their shards (`topology.on_hosts`); a membership
change never re-creates a replica on another replica's host (`host_clash`). Then the
options, and a short live run of `kill-host` and `partition-host` on 3 hosts x 2 shards
that must be valid (CHAOS_HOSTS_SECONDS, default 30).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config import cluster_configs
from chaos.cli import _repeat_command, default_groups, run_main
from chaos.histories import parse_faults
from chaos.nemesis import NEMESES, host_clash, minority_hosts, pick_on_hosts
from chaos.run import RunOptions
from chaos.topology import (
    bridge,
    halves,
    isolate,
    majority,
    majority_ring,
    on_hosts,
    pairs_between,
)

HOSTS_SECONDS = float(os.environ.get("CHAOS_HOSTS_SECONDS", "30"))


def _layout(hosts: int, shards: int, groups: int) -> tuple[list[tuple[str, list[int]]],
                                                           dict[str, tuple[int, ...]]]:
    """The hosts (in node order) and group replicas `LocalCluster` would start."""
    cfg = cluster_configs("/nonexistent/chaos-hosts", hosts=hosts, shards=shards,
                          groups=groups)[0]
    by_host: dict[str, list[int]] = {}
    for n in sorted(cfg.peers):
        by_host.setdefault(cfg.host_of(n), []).append(n)
    return list(by_host.items()), {g.id: g.replicas for g in cfg.groups}


layouts = st.tuples(st.integers(3, 7), st.integers(1, 4), st.integers(1, 9))


@settings(max_examples=300, deadline=None)
@given(layouts, st.integers(0, 2**64 - 1), st.sampled_from(["one", "some"]),
       st.floats(0.0, 1.0), st.data())
def test_a_node_fault_takes_shards_of_a_minority_of_hosts_and_no_group_majority(
    layout: tuple[int, int, int], seed: int, shards: str, bias: float, data: st.DataObject
) -> None:
    n_hosts, n_shards, n_groups = layout
    hosts, groups = _layout(n_hosts, n_shards, n_groups)
    nodes = [n for _, ns in hosts for n in ns]
    live = data.draw(st.sets(st.sampled_from(nodes)), label="live")
    leading = data.draw(st.lists(st.sampled_from(nodes), max_size=n_groups), label="leaders")
    rng = random.Random(seed)
    count = minority_hosts(rng, n_hosts)
    assert 1 <= count <= max(1, (n_hosts - 1) // 2)
    picked = pick_on_hosts(rng, hosts, live, leading, count, bias, shards)
    assert set(picked) <= live and len(set(picked)) == len(picked)
    assert bool(picked) == bool(live)
    hit = {h for h, ns in hosts if set(ns) & set(picked)}
    assert len(hit) <= count and (not picked or len(hit) < majority(n_hosts))
    if shards == "one":
        assert len(picked) == len(hit)  # one shard of each
    for g, replicas in groups.items():
        lost = set(replicas) & set(picked)
        assert len(lost) <= count, (g, replicas, picked)
        if n_hosts <= 4:  # one host at most: never a majority of a 3-replica group
            assert len(lost) < majority(len(replicas)), (g, replicas, picked)


@settings(max_examples=200, deadline=None)
@given(layouts, st.integers(0, 2**64 - 1), st.sampled_from(["one", "majority", "all"]))
def test_a_power_loss_takes_every_live_shard_of_the_hosts_it_hits(
    layout: tuple[int, int, int], seed: int, scope: str
) -> None:
    hosts, _ = _layout(*layout)
    count = {"one": 1, "majority": majority(len(hosts)), "all": len(hosts)}[scope]
    picked = pick_on_hosts(random.Random(seed), hosts, [n for _, ns in hosts for n in ns],
                           [], count, 0.75, "all")
    hit = [ns for _, ns in hosts if set(ns) & set(picked)]
    assert len(hit) == count and sorted(n for ns in hit for n in ns) == picked


def _old_pick(rng: random.Random, live: list[int], leading: list[int], count: int,
              bias: float) -> list[int]:
    """`Nemesis._pick` before hosts, to show that seeds keep their targets."""
    if not live or count < 1:
        return []
    leaders = sorted(set(leading) & set(live))
    first = rng.choice(leaders) if leaders and rng.random() < bias else rng.choice(live)
    rest = [i for i in live if i != first]
    return sorted([first, *rng.sample(rest, min(count - 1, len(rest)))])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([3, 5]), st.integers(0, 2**64 - 1), st.integers(1, 3),
       st.sampled_from(["one", "some", "all"]), st.data())
def test_with_a_host_per_node_the_targets_and_draws_are_those_of_before(
    n: int, seed: int, count: int, shards: str, data: st.DataObject
) -> None:
    nodes = list(range(1, n + 1))
    live = sorted(data.draw(st.sets(st.sampled_from(nodes)), label="live"))
    leading = data.draw(st.lists(st.sampled_from(nodes), max_size=3), label="leaders")
    a, b = random.Random(seed), random.Random(seed)
    hosts = [(f"n{i}", [i]) for i in nodes]
    assert pick_on_hosts(a, hosts, live, leading, count, 0.75, shards) == _old_pick(
        b, live, leading, count, 0.75)
    assert a.random() == b.random()  # and the generator is left where it was


def test_the_first_target_is_a_leader_and_its_host_keeps_it() -> None:
    hosts = [("h1", [1, 2]), ("h2", [3, 4]), ("h3", [5, 6])]
    for seed in range(50):
        got = pick_on_hosts(random.Random(seed), hosts, range(1, 7), [4], 1, 1.0, "some")
        assert 4 in got and set(got) <= {3, 4}
    with pytest.raises(ValueError, match="shards"):
        pick_on_hosts(random.Random(0), hosts, [1], [], 1, 0.5, "most")


SHAPES = {"halves": halves, "bridge": bridge, "majority-ring": majority_ring,
          "isolate": isolate}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(SHAPES)), st.integers(3, 7), st.integers(1, 4),
       st.integers(0, 2**32))
def test_a_shape_over_hosts_cuts_whole_hosts_and_never_a_host_inside(
    kind: str, n_hosts: int, n_shards: int, seed: int
) -> None:
    hosts, groups = _layout(n_hosts, n_shards, 9)
    over = SHAPES[kind](range(1, n_hosts + 1), random.Random(seed))
    shape = on_hosts(over, hosts)
    shards = {k: ns for k, (_, ns) in enumerate(hosts, 1)}
    assert shape.nodes == tuple(n for _, ns in hosts for n in ns)
    for _, ns in hosts:  # a host's shards share a machine: they always talk
        assert not pairs_between(ns, ns) & shape.blocked
    expected = set()
    for a, b in (sorted(p) for p in over.blocked):
        expected |= pairs_between(shards[a], shards[b])
    assert shape.blocked == expected
    assert shape.cut_off == {n for k in over.cut_off for n in shards[k]}
    for replicas in groups.values():  # the hosts still connected hold a group majority
        if len(over.cut_off) < majority(n_hosts) and n_hosts == 3:
            assert len(set(replicas) - shape.cut_off) >= majority(len(replicas))
    value = shape.to_json()
    assert value["hosts"] == [list(ns) for _, ns in hosts]
    assert "hosts" not in over.to_json()


def test_isolating_a_host_cuts_its_shards_together() -> None:
    hosts = [("h1", [1, 2]), ("h2", [3, 4]), ("h3", [5, 6])]
    shape = on_hosts(isolate([1, 2, 3], random.Random(0), 2), hosts)
    assert shape.cut_off == {3, 4}
    assert shape.blocked == pairs_between([3, 4], [1, 2, 5, 6])
    assert shape.description == "isolate 2 over hosts 1=h1[1, 2], 2=h2[3, 4], 3=h3[5, 6]"
    with pytest.raises(ValueError, match="hosts 1..3"):
        on_hosts(isolate([1, 2, 3, 4], random.Random(0), 2), hosts)


def test_a_replica_comes_back_only_where_no_other_replica_is() -> None:
    host_of: Mapping[int, str] = {1: "h1", 2: "h1", 3: "h2", 4: "h2", 5: "h3", 6: "h3"}
    voters: Sequence[int] = (1, 3, 5)
    assert host_clash(host_of, voters, 1, 1) is None  # re-created on its own node
    assert host_clash(host_of, voters, 1, 2) is None  # moved within its host
    assert host_clash(host_of, voters, 1, 4) == 3  # onto the host of another replica
    assert host_clash({}, voters, 1, 2) is None  # without hosts, each node its own


def test_the_host_nemeses_are_in_all_and_the_layout_is_an_option(tmp_path: Path) -> None:
    assert {"kill-host", "partition-host"} <= set(NEMESES)
    opts = RunOptions(out=tmp_path, hosts=3, shards=2)
    opts.validate()
    assert opts.nodes == 6 and opts.layout == "3 hosts x 2 shards"
    assert RunOptions(out=tmp_path).layout == "3 nodes"
    assert _repeat_command({"seed": 4, "time": 30.0, "nemesis": ["kill-host"], "nodes": 6,
                            "hosts": 3, "shards": 2, "groups": 3}) == (
        "raftmq chaos run --seed 4 --time 30.0 --nemesis kill-host --hosts 3 --shards 2 "
        "--groups 3")


def test_a_run_on_hosts_has_a_group_led_by_each_shard_unless_told() -> None:
    assert default_groups(None, None) == 3
    assert default_groups(3, None) == 3 and default_groups(3, 1) == 3
    assert default_groups(3, 2) == 6 and default_groups(5, 4) == 20


@pytest.mark.live
def test_smoke_kill_host_and_partition_host_on_3_hosts_of_2_shards_is_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = run_main([
        "--out", str(out), "--time", str(HOSTS_SECONDS), "--seed", "3", "--hosts", "3",
        "--shards", "2", "--groups", "3", "--nemesis", "kill-host,partition-host",
        "--drain-timeout", "60", "--json",
    ])
    results = json.loads((out / "results.json").read_text())
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] is True and results["lost"] == 0
    assert results["operations"]["append"]["ok"] > 0
    assert results["run"]["layout"]["hosts"] == {"h1": [1, 2], "h2": [3, 4], "h3": [5, 6]}
    assert results["options"]["hosts"] == 3 and results["options"]["shards"] == 2
    faults = parse_faults(out / "history.jsonl")
    kinds = {f.f for f in faults}
    assert {"kill-host", "partition-host"} <= kinds, faults
    hosts = results["run"]["layout"]["hosts"]
    for f in faults:  # always every shard of one host
        assert f.value["nodes"] in hosts.values(), f
        if f.f == "kill-host":
            assert f.value["nodes"] == hosts[f.value["host"]]
            assert "discarded" in f.value  # a power loss: unsynced writes thrown away
        else:
            assert f.value["cut_off"] == f.value["nodes"]


@pytest.mark.live
def test_security_on_shards_settles_on_the_nodes_that_hold_the_metadata_group(
    tmp_path: Path,
) -> None:
    """Users and ACLs live in the metadata group, which only some shards host: the final
    reads wait for those to agree (the others answer UNKNOWN_GROUP and are left out), so
    the run settles and the last change is judged against replicas that applied it, not
    read a moment after it was acknowledged."""
    out = tmp_path / "run"
    code = run_main([
        "--out", str(out), "--workload", "security", "--time", "10", "--seed", "5",
        "--hosts", "3", "--shards", "2", "--groups", "3", "--nemesis", "kill-host",
        "--drain-timeout", "60", "--json",
    ])
    results = json.loads((out / "results.json").read_text())
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] is True and results["security"]["valid"] is True
    assert results["run"]["security_converged"] is True  # both settles, shards and all
    holders = results["security"]["final_nodes"]
    assert 0 < len(holders) < 6, holders  # some shards hold no metadata replica
