"""`raftmq chaos run --workload txn` end to end: the transactional workload on real nodes
comes out valid, and each deliberate transactional bug makes the run invalid.

- valid: transactions committed and aborted, abandoned and zombie producers, half
  messages ended by their producer and by check-back, and a pipeline whose worker
  process is SIGKILLed and restarted, under `kill`;
- `serve-prepared` (prepared batches appended to their queues at once): readers and
  the drain see messages of aborted transactions and rolled-back halves — caught with no
  fault at all, since a share of transactions abort;
- `no-fencing` (epochs ignored): a zombie producer, its id taken over by a successor
  whose init completed, still commits — the successor's open transaction of the same
  number, taken for its own: a zombie commit;
- `commit-before-durable-prepare` (a participant acknowledges prepared batches before
  they are committed in its group): a partition isolating a group leader that keeps
  acknowledging prepared batches no majority holds; the coordinator commits, and the
  new leader has nothing to make visible — lost committed writes. Each seed makes both
  faults of the run such partitions (as for `ack-before-commit` in
  tests/chaos/test_run.py); a second seed runs only when the first run's partitions
  happened to cut off no leader with a transaction in flight (a busy machine).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from chaos.cli import EXIT_USAGE, run_main
from chaos.histories import parse_faults
from chaos.nemesis import LEADER_BIAS
from chaos.run import RunOptions, nemesis_plan, run_chaos
from tests.chaos.test_run import _recheck, _results

TXN_SECONDS = float(os.environ.get("CHAOS_TXN_SECONDS", "15"))

# mutation: (nemeses, seeds tried in turn until one run is invalid, violations of which
# at least one must be found). A partition catches commit-before-durable-prepare only when
# a transaction sends to the cut-off leader inside its window: each of these seeds cuts a
# leader off twice and caught it in every run on a loaded 2-core machine, yet CI once saw
# two such seeds in a row miss (21 and 12), so four are tried.
CAUGHT_BY: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "serve-prepared": ("none", "1", ("aborted_reads", "uncommitted_reads",
                                     "half_rolled_back_reads", "half_early_reads")),
    "no-fencing": ("none", "1", ("zombie_commits",)),
    "forget-epochs": ("none", "1,2", ("epochs_reused",)),
    "commit-before-durable-prepare": ("partition-node", "12,30,24,8", ("lost_committed", "torn")),
}




def test_txn_workload_needs_nodes_the_harness_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('namesrv = "127.0.0.1:1"\n[nodes.1]\nagent = "127.0.0.1:2"\n')
    out = tmp_path / "out"
    assert run_main(["--out", str(out), "--workload", "txn", "--cluster", str(cluster),
                     "--nemesis", "kill"]) == EXIT_USAGE
    assert "--workload txn needs nodes the harness starts" in capsys.readouterr().err


def test_commit_before_durable_prepare_run_isolates_a_leader_twice() -> None:
    """Two partitions, each of a node that leads a group (the fault's first draw sends
    it to a leader), both over before the load ends: two windows in which a leader cut
    off from its peers acknowledges prepared batches."""
    nemesis, seeds, _kinds = CAUGHT_BY["commit-before-durable-prepare"]
    for seed in seeds.split(","):
        steps = nemesis_plan(RunOptions(out=Path("unused"), time=TXN_SECONDS, seed=int(seed),
                                        nemesis=tuple(nemesis.split(","))))
        assert len(steps) == 2, steps
        for step in steps:
            assert step.kind == "partition-node" and step.end < TXN_SECONDS, steps
            assert random.Random(step.seed).random() < LEADER_BIAS, step


@pytest.mark.live
def test_txn_smoke_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = run_main(["--out", str(out), "--workload", "txn", "--time", str(TXN_SECONDS),
                     "--seed", "3", "--nemesis", "kill", "--drain-timeout", "40", "--json"])
    results = _results(out)
    tx = results["transactions"]
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] is True and tx["valid"] is True
    # every kind of outcome happened, so the checks above were not vacuous
    assert tx["transactions"]["committed"] > 0 and tx["transactions"]["aborted"] > 0, tx
    assert tx["halves"].get("commit", 0) > 0 and tx["halves"].get("rollback", 0) > 0, tx
    assert tx["checks"]["answered"] > 0, tx  # check-back decided halves
    assert tx["pipeline"]["inputs_committed"] > 0, tx
    load = results["run"]["tx_load"]
    assert load["pipeline_starts"] >= 2  # killed and restarted
    assert load.get("zombie", 0) > 0  # zombies tried to commit after being fenced
    assert load.get("killed-before-add", 0) > 0  # prepared data the coordinator never heard of
    assert tx["undrained_queues"] == []
    assert {f.f for f in parse_faults(out / "history.jsonl")} == {"kill"}
    assert (out / "report.html").read_text().count("Transactions") >= 1
    _recheck(out, 0, capsys)


@pytest.mark.parametrize("mutation", sorted(CAUGHT_BY))
@pytest.mark.live
def test_a_transactional_bug_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    mutation: str,
) -> None:
    nemesis, seeds, kinds = CAUGHT_BY[mutation]
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")
    for seed in seeds.split(","):
        out = tmp_path / f"run-{seed}"
        results = run_chaos(RunOptions(
            out=out, workload="txn", time=TXN_SECONDS, seed=int(seed),
            nemesis=() if nemesis == "none" else tuple(nemesis.split(",")),
            mutations=(mutation,), check_timeout=20, drain_timeout=30,
        ))
        if results["verdict"] == "invalid":
            break
    tx = results["transactions"]
    assert results["verdict"] == "invalid", json.dumps(results, indent=1)[:4000]
    assert tx["valid"] is False
    assert any(tx[k] for k in kinds), json.dumps(tx, indent=1)[:4000]
    assert any(p.startswith("transactions: ") for p in results["problems"])
    if nemesis != "none":  # the planned partitions did cut group leaders off
        faults = parse_faults(out / "history.jsonl")
        assert faults and all(f.f == "partition-node" and f.value["leaders"] for f in faults)
    html = (out / "report.html").read_text()
    assert "Transactions" in html and "invalid" in html
    _recheck(out, 1, capsys)


def test_human_summary_names_the_transactional_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from chaos.cli import _print_run

    monkeypatch.setenv("COLUMNS", "400")  # one table row a line

    _print_run({
        "valid": False, "verdict": "invalid", "problems": ["transactions: zombie_commits: 1"],
        "operations": {}, "faults": {}, "linearizable": {},
        "transactions": {"transactions": {"committed": 7, "aborted": 2, "unknown": 1},
                         "halves": {"commit": 3, "rollback": 4}, "checks": {"answered": 5},
                         "pipeline": {"inputs_committed": 9}},
        "options": {"seed": 5, "time": 30.0, "nemesis": [], "nodes": 3, "groups": 3,
                    "workload": "txn", "mutations": ["no-fencing"]},
    }, tmp_path)
    out = " ".join(capsys.readouterr().out.split())
    for text in ("INVALID", "transactions: zombie_commits: 1", "7 committed, 2 aborted",
                 "half messages 3 commit, 4 rollback", "5 check-backs answered",
                 "pipeline inputs committed 9",
                 "--nemesis none --nodes 3 --groups 3 --workload txn --mutation no-fencing"):
        assert text in out, (text, out)


@pytest.mark.chaos
@pytest.mark.live
def test_long_txn_run_with_every_nemesis(tmp_path: Path) -> None:
    """Opt-in (`pytest -m chaos`): the issue's five minutes of `--workload txn
    --nemesis all` (CHAOS_SECONDS, CHAOS_SEED, CHAOS_OUT as for the queue workload's)."""
    out = Path(os.environ.get("CHAOS_OUT", tmp_path / "run"))
    code = run_main([
        "--out", str(out), "--workload", "txn", "--time", os.environ.get("CHAOS_SECONDS", "300"),
        "--seed", os.environ.get("CHAOS_SEED", "11"), "--nemesis", "all", "--json",
    ])
    results = _results(out)
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["transactions"]["transactions"]["committed"] > 0


def _line(process: object, kind: str, f: str, key: object, value: object, t: float) -> str:
    return json.dumps({"process": process, "type": kind, "f": f, "key": key, "value": value,
                       "time": t})


def test_the_run_verdict_includes_the_transactional_one(tmp_path: Path) -> None:
    """Queue operations and transactional records in one history (`--workload all`):
    the queue analysis reads its own, `chaos.txcheck` the others, and a transactional
    violation makes the run invalid with its problem named."""
    from chaos.analysis import analyze_run

    def history(drained: list[str]) -> Path:
        lines = [
            _line(1, "invoke", "append", "q/0", "p1-0", 1.0),
            _line(1, "ok", "append", "q/0", {"offset": 0}, 2.0),
            _line(7, "invoke", "txn", "t", {"id": "a", "epoch": 0, "n": 0, "plan": "commit",
                                            "sends": [["tx", 0, "a.0"], ["tx", 0, "a.1"]]}, 3.0),
            _line(7, "attempt", "txn", "t", {"commit": True}, 4.0),
            _line(2, "invoke", "read", "q/0", {"offset": 0, "n": 8}, 4.5),  # interleaved
            _line(7, "ok", "txn", "t", {"outcome": "commit"}, 5.0),
            _line(2, "ok", "read", "q/0", ["p1-0"], 5.5),
            _line(3, "invoke", "tx-drain", "tx/0", {"offset": 0, "n": 8}, 6.0),
            _line(3, "ok", "tx-drain", "tx/0", drained, 7.0),
        ]
        path = tmp_path / f"h{len(drained)}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        return path

    facts = {"queue_groups": {"q/0": "g0"}, "drained": True, "unexpected_exits": {}}
    good = analyze_run(history(["a.0", "a.1"]), facts, check_timeout=5).results
    assert good["verdict"] == "valid", good["problems"]
    assert good["transactions"]["transactions"]["committed"] == 1
    assert good["operations"]["append"]["ok"] == 1 and good["linearizable"] == {"q/0": True}
    bad = analyze_run(history(["a.0"]), facts, check_timeout=5).results
    assert bad["verdict"] == "invalid"
    assert "transactions: lost_committed: 1" in bad["problems"]
    assert "transactions: torn: 1" in bad["problems"]


def test_a_queue_history_has_no_transactions_section(tmp_path: Path) -> None:
    from chaos.analysis import analyze_run

    path = tmp_path / "h.jsonl"
    path.write_text(_line(1, "invoke", "append", "q/0", "p1-0", 1.0) + "\n"
                    + _line(1, "ok", "append", "q/0", {"offset": 0}, 2.0) + "\n")
    results = analyze_run(path, None, check_timeout=5).results
    assert "transactions" not in results


def test_worker_lines_are_forwarded_at_their_own_time(tmp_path: Path) -> None:
    """The pipeline worker's stdout lines go into the history under the process the
    harness gave it, at the time the worker wrote them; a torn line (the worker was
    killed mid-write) or a line that is no record is dropped."""
    import random

    from chaos.recorder import Recorder
    from chaos.txworkload import TxWorkload

    with Recorder(tmp_path / "h.jsonl", clock=lambda: 1000.0) as rec:
        load = TxWorkload("127.0.0.1:1", "c", 1, recorder=rec, rng=random.Random(1))
        load._forward(42, b'{"type":"invoke","f":"tx-init","key":"w","value":null,"time":5.5}')
        load._forward(42, b'{"type":"ok","f":"tx-init","key":"w","value":{"epoch":3},"ti')
        load._forward(42, b'{"type":"hello","f":"x","time":6}')
        load._forward(42, b'garbage')
    lines = [json.loads(x) for x in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert lines == [{"type": "invoke", "f": "tx-init", "key": "w", "value": None,
                      "time": 5.5, "process": 42}]


def test_report_shows_the_transactional_verdict() -> None:
    """A transactional violation opens the report, with its examples; a valid verdict is
    shown after the queue sections."""
    from chaos.linearizability import CheckInfo, CheckResult
    from chaos.models import QueueLogModel
    from chaos.report import render_html
    from chaos.txcheck import check_lines

    empty = CheckInfo(CheckResult.OK, [], 0.0, False, 0)
    valid = check_lines([])
    page = render_html(QueueLogModel(), empty, transactions=valid)
    assert page.index("<h2>Timeline") < page.index("<h2>Transactions")
    bad = {**valid, "valid": False, "zombie_commits": 1,
           "examples": {"zombie_commits": [{"id": "k7", "fenced_by": 3}]}}
    page = render_html(QueueLogModel(), empty, transactions=bad)
    assert page.index("<h2>Transactions") < page.index("<h2>Timeline")
    assert "zombie_commits: 1" in page and "fenced_by" in page and "invalid" in page
