"""`raftmq chaos run --workload ordered`: the ordering checker on synthetic histories
(each finding caught where it is, the legitimate re-handlings after a holder stopped
not reported), and the workload on real nodes: a short run under `kill` (consumer
processes killed and closed too) is valid, and `release-before-commit` (a consumer
unlocks a released queue before its final commit) is caught as messages handled twice
while their first holder still held, with no fault at all."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from chaos.cli import run_main
from chaos.histories import parse_faults
from chaos.ordercheck import VIOLATIONS, Handling, Life, check_file, check_lines, check_order
from chaos.recorder import Recorder
from chaos.run import RunOptions, run_chaos
from tests.chaos.test_run import _recheck, _results


def only(result: dict[str, Any], kind: str, n: int = 1) -> dict[str, Any]:
    """`result` found `n` of `kind` and nothing else; its first example."""
    assert result[kind] == n, result
    assert result["problems"] == [f"{kind}: {n}"], result
    assert not result["valid"]
    return result["examples"][kind][0]


def test_a_handover_after_each_holder_stopped_is_valid() -> None:
    lives = [Life("a", 0, 100), Life("b", 150, 300), Life("c", 320, None)]
    handlings = [
        Handling("a", "k", 0, 10, 11), Handling("a", "k", 1, 20, 21),
        Handling("a", "k", 2, 30, None, ok=False),  # failed: retried in place
        Handling("a", "k", 2, 40, 41),
        # a stopped uncommitted at 2: b starts over from the last commit (1)
        Handling("b", "k", 1, 160, 161), Handling("b", "k", 2, 170, 171),
        Handling("b", "k", 3, 180, None, ok=None),  # b died in it: unknown
        Handling("c", "k", 3, 330, 331), Handling("c", "x", 0, 340, 341),
    ]
    r = check_order(handlings, lives, expected=[("k", s) for s in range(4)] + [("x", 0)])
    assert r["valid"], r
    assert all(r[kind] == 0 for kind in VIOLATIONS)
    assert (r["handlings"], r["handled_again"], r["failed_attempts"]) == (8, 3, 1)
    assert (r["unknown_handlings"], r["keys"], r["holders"], r["expected"]) == (1, 2, 3, 5)


def test_handled_again_while_the_first_holder_still_held() -> None:
    """The release-before-commit trace: b takes over while a still holds (a's end comes
    after its late commit), and handles a's uncommitted messages again."""
    lives = [Life("a", 0, 200), Life("b", 150, None)]
    handlings = [Handling("a", "k", 0, 10, 11), Handling("a", "k", 1, 20, 21),
                 Handling("b", "k", 1, 160, 161, detail={"offset": 7})]
    found = only(check_order(handlings, lives), "handled_twice")
    assert (found["holder"], found["earlier_holder"], found["seq"]) == ("b", "a", 1)
    assert found["earlier_holder_end"] == 200 and found["detail"] == {"offset": 7}


def test_out_of_order_by_one_holder_or_by_two_at_once() -> None:
    lives = [Life("a", 0, None)]
    back = [Handling("a", "k", 0, 10, 11), Handling("a", "k", 2, 20, 21),
            Handling("a", "k", 1, 30, 31)]
    found = only(check_order(back, lives), "out_of_order")
    assert (found["seq"], found["earlier_top"]) == (1, 2)
    # two holders at once, each in order: b's start below a's top while a held
    two = [Handling("a", "k", 0, 10, 11), Handling("a", "k", 1, 20, 21),
           Handling("a", "k", 2, 25, 26), Handling("b", "k", 1, 30, 31)]
    r = check_order(two, [Life("a", 0, None), Life("b", 28, None)])
    assert r["handled_twice"] == 1 and r["out_of_order"] == 0, r
    three = [Handling("a", "k", 0, 10, 11), Handling("a", "k", 2, 20, 21),
             Handling("b", "k", 1, 30, 31)]
    found = only(check_order(three, [Life("a", 0, None), Life("b", 28, None)]),
                 "out_of_order")
    assert found["earlier_holder"] == "a"


def test_a_holder_without_a_life_holds_throughout() -> None:
    handlings = [Handling("a", "k", 0, 10, 11), Handling("b", "k", 0, 500, 501)]
    only(check_order(handlings, [Life("b", 400, None)]), "handled_twice")


def test_skipped_and_lost() -> None:
    lives = [Life("a", 0, None)]
    handlings = [Handling("a", "k", 0, 10, 11), Handling("a", "k", 2, 20, 21)]
    # seq 1 was never acknowledged: nothing is missing
    assert check_order(handlings, lives, expected=[("k", 0), ("k", 2)])["valid"]
    r = check_order(handlings, lives, expected=[("k", 0), ("k", 1), ("k", 2)])
    assert (r["skipped"], r["lost"]) == (1, 1), r
    assert r["examples"]["skipped"][0]["missing"] == 1
    assert r["examples"]["lost"][0] == {"key": "k", "seq": 1}


def _history(path: Path, *, twice: bool) -> Path:
    ms = iter(range(1000, 10**6, 10))
    with Recorder(path) as rec:
        rec.invoke("p.k.0", "order-send", "k", {"seq": 0, "queue": 0})
        rec.complete("p.k.0", "ok", "order-send", "k", {"offset": 0})
        rec.invoke("p.k.1", "order-send", "k", {"seq": 1, "queue": 0})
        rec.complete("p.k.1", "ok", "order-send", "k", {"offset": 1})
        rec.invoke("p.k.2", "order-send", "k", {"seq": 2, "queue": 0})
        rec.complete("p.k.2", "info", "order-send", "k", {"error": "timeout"})
        rec.invoke("w1.q0.t1", "order-holder", "w1.q0.t1",
                   {"ms": next(ms), "client": "w1", "queue": 0})
        for n, seq in enumerate((0, 1)):
            rec.invoke(f"w1.h{n}", "order-handle", "k",
                       {"holder": "w1.q0.t1", "seq": seq, "offset": seq, "ms": next(ms)})
            rec.complete(f"w1.h{n}", "ok", "order-handle", "k", {"ms": next(ms)})
        if not twice:
            rec.complete("w1.q0.t1", "ok", "order-holder", "w1.q0.t1", {"ms": next(ms)})
        rec.invoke("w2.q0.t1", "order-holder", "w2.q0.t1",
                   {"ms": next(ms), "client": "w2", "queue": 0})
        rec.invoke("w2.h0", "order-handle", "k",
                   {"holder": "w2.q0.t1", "seq": 1, "offset": 1, "ms": next(ms)})
        rec.complete("w2.h0", "fail", "order-handle", "k", {"ms": next(ms), "error": "x"})
        rec.invoke("w2.h1", "order-handle", "k",
                   {"holder": "w2.q0.t1", "seq": 1, "offset": 1, "ms": next(ms)})
        rec.complete("w2.h1", "ok", "order-handle", "k", {"ms": next(ms)})
        rec.invoke("w2.h2", "order-handle", "k",  # open at the end: unknown
                   {"holder": "w2.q0.t1", "seq": 2, "offset": 2, "ms": next(ms)})
        if twice:
            rec.complete("w1.q0.t1", "ok", "order-holder", "w1.q0.t1", {"ms": next(ms)})
        rec.invoke(1, "append", "q/0", "p1-0")  # the queue workload's: not read here
        rec.complete(1, "ok", "append", "q/0", {"offset": 0})
        rec.invoke(2, "read", "q/0", {"offset": 0, "n": 8})
        rec.complete(2, "ok", "read", "q/0", ["p1-0"])
    return path


def test_history_records(tmp_path: Path) -> None:
    good = check_file(_history(tmp_path / "good.jsonl", twice=False))
    assert good["valid"], good
    assert good["sends"] == {"info": 1, "ok": 2} and good["expected"] == 2
    assert (good["handlings"], good["failed_attempts"], good["unknown_handlings"]) == (4, 1, 1)
    bad = check_file(_history(tmp_path / "bad.jsonl", twice=True))
    found = only(bad, "handled_twice")
    assert (found["holder"], found["earlier_holder"]) == ("w2.q0.t1", "w1.q0.t1")


def test_malformed_records_make_the_verdict_invalid() -> None:
    r = check_lines([
        json.dumps({"process": "x", "type": "invoke", "f": "order-handle", "key": "k",
                    "value": {"seq": 1}}),
        "not json", "{}"])
    assert not r["valid"] and r["malformed"] == 1 and r["problems"] == ["malformed: 1"], r


def test_the_run_verdict_includes_the_ordered_one(tmp_path: Path) -> None:
    from chaos.analysis import analyze_run

    facts = {"queue_groups": {"q/0": "g0"}, "drained": True, "unexpected_exits": {}}
    good = analyze_run(_history(tmp_path / "g.jsonl", twice=False), facts,
                       check_timeout=5).results
    assert good["verdict"] == "valid", good["problems"]
    assert good["ordered"]["handlings"] == 4 and good["linearizable"] == {"q/0": True}
    bad = analyze_run(_history(tmp_path / "b.jsonl", twice=True), facts,
                      check_timeout=5).results
    assert bad["verdict"] == "invalid" and "ordered: handled_twice: 1" in bad["problems"]


# ------------------------------------------------------------------ live runs

ORDERED_SECONDS = float(os.environ.get("CHAOS_ORDERED_SECONDS", "12"))


@pytest.mark.live
def test_ordered_smoke_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = run_main(["--out", str(out), "--workload", "ordered", "--time",
                     str(ORDERED_SECONDS), "--seed", "3", "--nemesis", "kill",
                     "--drain-timeout", "60", "--json"])
    results = _results(out)
    o = results["ordered"]
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] is True and o["valid"] is True
    # consumers came and went, handled again what a stopped one left, failed and retried
    assert o["expected"] > 100 and o["handlings"] >= o["expected"], o
    assert o["holders"] > 6 and o["failed_attempts"] > 0, o
    load = results["run"]["ordered_load"]
    assert load["worker_starts"] > 3 and load["drain-left"] == 0, load
    assert {f.f for f in parse_faults(out / "history.jsonl")} == {"kill"}
    assert "Ordered consumption" in (out / "report.html").read_text()
    _recheck(out, 0, capsys)


@pytest.mark.live
def test_unlocking_before_the_final_commit_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """`release-before-commit`: a queue's next owner takes it before the previous one's
    final commit and handles its uncommitted messages again while it still holds."""
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")
    out = tmp_path / "run"
    results = run_chaos(RunOptions(
        out=out, workload="ordered", time=ORDERED_SECONDS, seed=1, nemesis=(),
        mutations=("release-before-commit",), check_timeout=20, drain_timeout=60,
    ))
    o = results["ordered"]
    assert results["verdict"] == "invalid", json.dumps(results, indent=1)[:4000]
    assert o["valid"] is False and o["handled_twice"] > 0, json.dumps(o, indent=1)[:4000]
    assert f"ordered: handled_twice: {o['handled_twice']}" in results["problems"]
    assert "Ordered consumption" in (out / "report.html").read_text()
    _recheck(out, 1, capsys)
