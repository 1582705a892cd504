"""`raftmq chaos run` end to end: real nodes, real faults, and proof that it can fail.

The default suite runs a short smoke (kill + partition, about a minute) that must come
out valid, and runs the same harness against nodes with a deliberate bug
(`ack-before-commit`, `skip-fsync` under power loss, `skip-read-barrier` against a stale
leader) that must come out invalid: each with a seed whose first fault exposes the bug,
so it is caught by construction.
Longer runs with every nemesis are opt-in: `pytest -m chaos` (CHAOS_SECONDS, default 300).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from chaos.cli import EXIT_USAGE, check_main, run_main
from chaos.histories import parse_faults, parse_jsonl
from chaos.nemesis import LEADER_BIAS
from chaos.run import RunOptions, nemesis_plan, run_chaos

SMOKE_SECONDS = float(os.environ.get("CHAOS_SMOKE_SECONDS", "45"))
DUPLICATE_SECONDS = 6.0  # thousands of batches: the mutation stores every 8th twice
# results.json keys that differ between two checks of one history (times, options, the
# run's own facts): every other key must be equal
_TIMING = ("analysis_seconds", "checker_seconds", "linearizability", "offsets_linearizability",
           "options", "run")
# the deliberate-bug runs need only their first fault, over within 13 s of the start
MISBEHAVING_SECONDS = float(os.environ.get("CHAOS_MISBEHAVING_SECONDS", "20"))


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def _check_outputs(out: Path) -> dict:
    results = _results(out)
    assert (out / "report.html").stat().st_size > 1000
    records = parse_jsonl(out / "history.jsonl")
    assert records, "the history holds operations"
    assert results["operations"]["append"]["ok"] > 0
    return results


def _recheck(out: Path, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    """`raftmq chaos check DIR` on the saved run: the run's exit code and findings."""
    capsys.readouterr()
    assert check_main([str(out), "--json"]) == code
    rechecked = json.loads(capsys.readouterr().out)
    for key, value in _results(out).items():
        if key not in _TIMING:
            assert rechecked[key] == value, key


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nemesis", "kill,flood"], "unknown nemesis"),
        (["--nodes", "4"], "invalid choice"),
        (["--time", "0"], "positive"),
        (["--workload", "bank"], "invalid choice"),
        (["--mutation", "eat-data"], "unknown mutation"),
        (["--hosts", "3", "--nodes", "5"], "exclude each other"),
        (["--shards", "2"], "--shards needs --hosts"),
        (["--hosts", "2", "--shards", "2"], "--hosts must be 3"),
        (["--hosts", "3", "--shards", "9"], "--shards must be 1"),
    ],
)
def test_bad_options_exit_3_and_start_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "out"
    assert run_main(["--out", str(out), *argv]) == EXIT_USAGE
    assert message in capsys.readouterr().err
    assert not (out / "cluster").exists()


def test_the_drain_may_take_longer_in_a_longer_run(tmp_path: Path) -> None:
    """The drain reads every queue from its start: its default time grows with --time."""
    assert RunOptions(out=tmp_path, time=60).drain_seconds == 120.0
    assert RunOptions(out=tmp_path, time=7200).drain_seconds == 360.0
    assert RunOptions(out=tmp_path, time=7200, drain_timeout=30).drain_seconds == 30.0
    with pytest.raises(ValueError, match="positive"):
        RunOptions(out=tmp_path, drain_timeout=0).validate()


def test_mutations_need_the_explicit_test_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ALLOW_MUTATIONS_ENV, raising=False)
    assert run_main(["--out", str(tmp_path), "--mutation", "skip-fsync"]) == EXIT_USAGE
    assert ALLOW_MUTATIONS_ENV in capsys.readouterr().err


@pytest.mark.live
def test_smoke_kill_partition_and_stale_leader_is_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = run_main([
        "--out", str(out), "--time", str(SMOKE_SECONDS), "--seed", "1",
        "--nemesis", "kill,partition-node,partition-halves,stale-leader", "--json",
    ])
    results = _check_outputs(out)
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] is True
    assert results["lost"] == 0 and results["unexpected"] == 0
    assert all(results["linearizable"].values())
    faults = parse_faults(out / "history.jsonl")
    assert {f.f for f in faults} & {"kill"}, faults
    assert {f.f for f in faults} & {"partition-node", "partition-halves"}, faults
    # reads aimed at a stopped, cut-off leader were made, and none of them was stale
    assert any(f.f == "stale-leader" and f.value["probed"] for f in faults), faults
    assert results["attempts"] > 0 and results["duplicated_unretried"] == 0
    # admin state changed under the faults and every change held (chaos.workload, admin)
    ops = results["operations"]
    for f in ("topic-create", "topic-grow", "topic-delete", "topic-read", "delete-group"):
        assert ops[f]["ok"] > 0, (f, ops)
    # (a write whose outcome was unknown moves the admin on to a topic of a new name)
    topics = results["topics_linearizable"]
    assert "topic:chaos-admin" in topics and all(v is True for v in topics.values()), results
    _recheck(out, 0, capsys)


# Each bug is caught by construction: the seed makes the run's *first* fault the one that
# exposes it, a few seconds in, however slowly a loaded machine gets through the rest.
# - ack-before-commit: a partition isolating a group leader (the fault's first draw picks
#   a leader, `Nemesis._pick`); producers keep writing to it, it acknowledges at once,
#   and none of it can commit: acknowledged messages are lost.
# - skip-fsync: a power loss of every node at once: nothing was ever fsynced, so every
#   acknowledged message is lost. Every replica's snapshot survives it (written durably
#   by its own code path) while every log is empty: the group abandons the refill no
#   replica can supply (`raftlog.core`), serves on, and the drain finds the loss.
# - skip-read-barrier: `stale-leader` is its only nemesis, so every seed opens with it:
#   reads of offsets the new leader acknowledged wait at the stopped old leader, which
#   answers them, once resumed, with the end of its own older log.
CAUGHT_BY = {  # mutation: (nemeses, seed, the first fault's kind and scope)
    "ack-before-commit": ("partition-node,kill", "1", "partition-node", None),
    "skip-fsync": ("crash-unsynced", "2", "crash-unsynced", "all"),
    "skip-read-barrier": ("stale-leader", "3", "stale-leader", None),
}
# skip-fsync: every group snapshots within its first entries, so the power loss always
# finds each replica's state ahead of its (lost) log: the refill no replica can supply.
SNAPSHOT_EVERY = {"skip-fsync": 16}


@pytest.mark.parametrize("mutation", sorted(CAUGHT_BY))
def test_the_misbehaving_runs_open_with_the_fault_that_exposes_them(mutation: str) -> None:
    nemesis, seed, kind, scope = CAUGHT_BY[mutation]
    steps = nemesis_plan(RunOptions(out=Path("unused"), time=MISBEHAVING_SECONDS,
                                    seed=int(seed), nemesis=tuple(nemesis.split(","))))
    first = steps[0]
    assert (first.kind, first.scope) == (kind, scope), steps
    assert first.end < MISBEHAVING_SECONDS, first
    if kind == "partition-node":  # its first draw sends it to a current group leader
        assert random.Random(first.seed).random() < LEADER_BIAS, first


@pytest.mark.parametrize("mutation", sorted(CAUGHT_BY))
@pytest.mark.live
def test_a_misbehaving_node_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    mutation: str
) -> None:
    nemesis, seed, kind, scope = CAUGHT_BY[mutation]
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")
    out = tmp_path / "run"
    run_chaos(RunOptions(
        out=out, time=MISBEHAVING_SECONDS, seed=int(seed), nemesis=tuple(nemesis.split(",")),
        mutations=(mutation,), check_timeout=20, drain_timeout=20,
        snapshot_every_entries=SNAPSHOT_EVERY.get(mutation, 400),
    ))
    results = _check_outputs(out)
    assert results["verdict"] == "invalid", json.dumps(results, indent=1)[:4000]
    assert results["valid"] is False
    # what was acknowledged is gone: lost, or a queue's history impossible (an offset
    # acknowledged for one message reads back as another). Not merely a cluster that
    # never served again: after skip-fsync's power loss each group came back through an
    # abandoned refill (every log was lost) and served reads that show the loss.
    assert results["lost"] > 0 or not all(results["linearizable"].values()), (
        json.dumps(results, indent=1)[:4000])
    if mutation == "skip-fsync":
        logs = "".join(p.read_text(errors="replace") for p in out.rglob("*.log"))
        assert "refill abandoned" in logs
    first = parse_faults(out / "history.jsonl")[0]  # the planned fault did open the run
    assert first.f == kind and (scope is None or first.value["scope"] == scope), first
    if kind in ("partition-node", "stale-leader"):
        assert first.value["leaders"], first  # and it isolated a group leader
    if kind == "stale-leader":  # caught by the reads it aimed at the old leader
        assert first.value["probed"], first
        assert not all(results["linearizable"].values()), json.dumps(results, indent=1)[:4000]
    _recheck(out, 1, capsys)


@pytest.mark.live
def test_a_leader_that_stores_batches_twice_is_caught_with_plain_producers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plain producers may store a message once per request, so only duplicates beyond
    the requests recorded for them are errors. No fault, so no timing decides it: every
    8th batch the leaders accept is stored twice, from one request."""
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")
    out = tmp_path / "run"
    results = run_chaos(RunOptions(
        out=out, time=DUPLICATE_SECONDS, nemesis=(), producers=4, idempotent_producers=0,
        mutations=("duplicate-batch",), check_timeout=20,
    ))
    assert results["verdict"] == "invalid", json.dumps(results, indent=1)[:4000]
    assert results["operations"]["append"]["ok"] > 100
    appends = [r for r in parse_jsonl(out / "history.jsonl") if r.f == "append"]
    assert all(r.value.startswith("p") for r in appends)  # plain producers only
    unretried = results["duplicated_unretried"]
    assert unretried > 0 and results["duplicated"] == 0
    assert f"duplicated_unretried: {unretried}" in results["problems"]
    assert results["lost"] == 0 and results["unexpected"] == 0
    _recheck(out, 1, capsys)


@pytest.mark.chaos
@pytest.mark.live
def test_long_run_with_every_nemesis(tmp_path: Path) -> None:
    seconds = os.environ.get("CHAOS_SECONDS", "300")
    out = Path(os.environ.get("CHAOS_OUT", tmp_path / "run"))
    code = run_main([
        "--out", str(out), "--time", seconds, "--seed", os.environ.get("CHAOS_SEED", "7"),
        "--nemesis", "all", "--json",
    ])
    results = _check_outputs(out)
    assert code == 0, json.dumps(results, indent=1)[:4000]


def test_human_summary_names_the_verdict_and_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from chaos.cli import _print_run

    _print_run({
        "valid": False, "problems": ["lost: 2"],
        "operations": {"append": {"ok": 10, "fail": 0, "info": 1}},
        "faults": {"kill": 2}, "lost": 2, "linearizable": {"t/0": True, "t/1": None},
        "checker_seconds": 0.5, "longest_unavailability": 1.25,
        "options": {"seed": 5, "time": 30.0, "nemesis": ["kill"], "nodes": 3, "groups": 3,
                    "mutations": []},
    }, tmp_path)
    out = capsys.readouterr().out
    for text in ("INVALID", "lost: 2", "append 10 ok/1 info", "kill 2", "1 of 2", "1.25 s",
                 "raftmq chaos run --seed 5 --time 30.0 --nemesis kill"):
        assert text in out, (text, out)
