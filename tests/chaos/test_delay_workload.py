"""`raftmq chaos run --workload delay`: the delayed-message checker on synthetic histories
(each finding caught where it is, nothing found in a valid history), and the workload on
real nodes: a short run under `kill` is valid, and each deliberate bug is caught:

- `deliver-at-send` (a delayed message queued when stored): seen long before it is due
  (`early`), with no fault at all;
- `volatile-timers` (a leader starting its term drops whatever is pending, as an index
  kept in a leader's memory would): acknowledged messages never delivered (`lost`), under
  `leader-transfer`, whose storms start new leader terms in every group.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from chaos.cli import EXIT_USAGE, run_main
from chaos.delaycheck import (
    EARLY_SLACK_MS,
    LATE_BOUND_MS,
    VIOLATIONS,
    check_file,
    check_lines,
    percentile,
)
from chaos.histories import parse_faults
from chaos.recorder import Recorder
from chaos.run import RunOptions, nemesis_plan, run_chaos
from tests.chaos.test_run import _recheck, _results

DELAY_SECONDS = float(os.environ.get("CHAOS_DELAY_SECONDS", "15"))
T = "d"
BASE = 1_800_000_000_000  # a wall-clock ms; every time below is relative to it


class History:
    """A history in the forms `chaos.delaycheck` reads, built by hand: each queue's
    log is kept here, and reads return what it holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rec = Recorder(path, clock=lambda: 0.0)  # the checker reads no history time
        self.logs: dict[int, list[tuple[str, int]]] = {}  # queue -> [(body, store_ms)]
        self.n = 0

    def process(self) -> str:
        self.n += 1
        return f"p{self.n}"

    def send(self, body: str, *, queue: int = 0, kind: str = "ok", delay_ms: int | None = 1000,
             at_ms: int | None = None, producer: str = "idempotent", attempts: int = 0,
             level: int | None = None) -> None:
        p = self.process()
        key = f"{T}/{queue}"
        rule: dict[str, Any] = {"at_ms": at_ms} if at_ms is not None else {"delay_ms": delay_ms}
        if level is not None:
            rule["level"] = level
        self.rec.invoke(p, "delay-send", key, {"body": body, "producer": producer,
                                               "sent_ms": BASE, **rule})
        for _ in range(attempts):
            self.rec.attempt(p, "delay-send", key, None)
        value = ({"msg_id": "m", "offset": -1, "ack_ms": BASE} if kind == "ok"
                 else {"error": "x"})
        self.rec.complete(p, kind, "delay-send", key, value)

    def txn(self, name: str, messages: list[tuple[str, int, int]], *, outcome: str = "commit",
            kind: str = "ok", commit_ms: int | None = BASE) -> None:
        """`messages`: (body, queue, delay_ms)."""
        p = self.process()
        self.rec.invoke(p, "delay-txn", "tid", {
            "id": name, "plan": outcome,
            "messages": [{"body": b, "topic": T, "queue": q, "delay_ms": d}
                         for b, q, d in messages]})
        if commit_ms is not None:
            self.rec.attempt(p, "delay-txn", "tid", {"commit": True, "sent_ms": commit_ms})
        value = {"outcome": outcome, "ack_ms": BASE} if kind == "ok" else {"error": "x"}
        self.rec.complete(p, kind, "delay-txn", "tid", value)

    def store(self, queue: int, body: str, store_ms: int = BASE) -> None:
        self.logs.setdefault(queue, []).append((body, store_ms))

    def read(self, queue: int, offset: int, seen_ms: int, *, f: str = "delay-read",
             n: int = 256) -> None:
        held = self.logs.get(queue, [])[offset:offset + n]
        p = self.process()
        key = f"{T}/{queue}"
        self.rec.invoke(p, f, key, {"offset": offset, "n": n})
        self.rec.complete(p, "ok", f, key, {"seen_ms": seen_ms, "messages": [
            [offset + i, body, store] for i, (body, store) in enumerate(held)]})

    def drain(self, *queues: int, seen_ms: int = BASE + 30_000) -> None:
        for q in queues:
            self.read(q, 0, seen_ms, f="delay-drain")

    def check(self) -> dict[str, Any]:
        self.rec.close()
        return check_file(self.path)


@pytest.fixture
def h(tmp_path: Path) -> History:
    return History(tmp_path / "history.jsonl")


def _only(result: dict[str, Any], kind: str, n: int = 1) -> None:
    assert result["valid"] is False
    assert result[kind] == n, result
    assert all(result[k] == 0 for k in VIOLATIONS if k != kind), result
    assert f"{kind}: {n}" in result["problems"]


def test_a_valid_history_of_every_kind_of_send(h: History) -> None:
    h.send("a", delay_ms=2000)
    h.send("lv", delay_ms=5000, level=2, producer="plain", attempts=1)
    h.send("at", at_ms=BASE + 3000, queue=1)
    h.send("past", at_ms=BASE - 1000, queue=1)  # already due when stored
    h.send("gone", kind="fail")  # never stored, never seen
    h.send("maybe", kind="info")  # unknown: either way is fine, here not stored
    h.txn("t1", [("t1.0", 0, 1000), ("t1.1", 1, 4000)], commit_ms=BASE + 2500)
    h.txn("t2", [("t2.0", 1, 500)], outcome="abort", commit_ms=None)
    # each enters its queue when due, and a reader sees it a moment later
    h.store(1, "past", BASE + 40)
    h.read(1, 0, BASE + 45)
    h.store(0, "a", BASE + 10)
    h.read(0, 0, BASE + 2012)  # due at BASE + 2010
    h.store(1, "at", BASE + 30)
    h.read(1, 1, BASE + 3000 + EARLY_SLACK_MS - 5)  # due then, seen then
    h.store(0, "t1.0", BASE + 50)
    h.read(0, 1, BASE + 2600)  # due at BASE + 1050, but committed at BASE + 2500
    h.store(0, "lv", BASE + 20)
    h.read(0, 2, BASE + 5023)  # due at BASE + 5020
    h.store(1, "t1.1", BASE + 60)
    h.read(1, 2, BASE + 4060)
    h.drain(0, 1)
    r = h.check()
    assert r["valid"] is True, r
    assert r["problems"] == [] and r["undrained_queues"] == []
    assert r["messages"] == {"sent": 9, "sends": {"fail": 1, "info": 1, "ok": 4},
                             "acknowledged": 6, "delivered": 6,
                             "by_rule": {"at": 2, "delay": 6, "level": 1}}
    assert r["transactions"] == {"aborted": 1, "committed": 1, "unknown": 0}
    late = r["lateness_ms"]
    assert late["count"] == 6 and late["max"] == 100.0  # t1.0: 100 ms after its commit
    assert late["p50"] == 2.0  # of 0, 0, 2, 3, 5 and 100
    assert r["late_bound_ms"] == LATE_BOUND_MS


def test_early_by_more_than_clock_rounding(h: History) -> None:
    h.send("a", delay_ms=2000)
    h.store(0, "a", BASE)
    h.send("b", at_ms=BASE + 1000)
    h.store(0, "b", BASE)
    h.read(0, 0, BASE + 1000 - EARLY_SLACK_MS)  # b within the slack; a 1,005 ms early
    h.drain(0)
    r = h.check()
    _only(r, "early")
    assert r["examples"]["early"] == [{"body": "a", "queue": "d/0", "rule": "delay",
                                       "delay_ms": 2000, "early_ms": 1005.0}]


def test_a_transactions_message_early_and_before_its_commit(h: History) -> None:
    h.txn("t", [("t.0", 0, 3000)], commit_ms=BASE + 1000)
    h.store(0, "t.0", BASE)
    h.read(0, 0, BASE + 500)  # before the commit was sent, and before its due time
    h.drain(0)
    r = h.check()
    assert r["before_commit"] == 1 and r["early"] == 1 and not r["valid"]
    h2 = History(h.path.with_name("h2.jsonl"))
    h2.txn("t", [("t.0", 0, 300)], commit_ms=BASE + 1000)
    h2.store(0, "t.0", BASE)
    h2.read(0, 0, BASE + 800)  # due, but its commit was not even sent
    h2.drain(0)
    _only(h2.check(), "before_commit")


def test_late_beyond_the_bound(h: History) -> None:
    h.send("a", delay_ms=1000)
    h.store(0, "a", BASE)
    h.send("b", delay_ms=1000)
    h.store(0, "b", BASE)
    h.read(0, 0, BASE + 1000 + LATE_BOUND_MS)  # exactly at the bound: not late
    h.read(0, 1, BASE + 1001 + LATE_BOUND_MS)  # (b again: its first sight counts)
    h.drain(0, seen_ms=BASE + 2 * LATE_BOUND_MS)
    assert h.check()["valid"] is True
    h2 = History(h.path.with_name("h2.jsonl"))
    h2.send("a", delay_ms=1000)
    h2.store(0, "a", BASE)
    h2.drain(0, seen_ms=BASE + 1001 + LATE_BOUND_MS)
    r = h2.check()
    _only(r, "late")
    assert r["lateness_ms"]["max"] == LATE_BOUND_MS + 1


def test_lost_acknowledged_and_committed_messages(h: History) -> None:
    h.send("kept")
    h.store(0, "kept")
    h.send("acked")  # acknowledged, never stored
    h.send("unknown", kind="info")  # may be lost: not judged
    h.txn("t", [("t.0", 1, 100), ("t.1", 1, 100)])  # committed, neither delivered
    h.txn("u", [("u.0", 1, 100)], kind="info")  # commit unknown
    h.drain(0, 1)
    r = h.check()
    _only(r, "lost", 3)
    assert sorted(x["body"] for x in r["examples"]["lost"]) == ["acked", "t.0", "t.1"]


def test_an_undrained_queue_proves_nothing_lost(h: History) -> None:
    h.send("acked", queue=2)
    h.drain(0)
    r = h.check()
    assert r["valid"] is True and r["undrained_queues"] == ["d/2"]


def test_a_drain_that_read_on_covers_the_later_end(h: History) -> None:
    """The drain reads on from the end it reached while acknowledged messages miss: the
    queue is drained to the later end."""
    h.send("a")
    h.send("b")
    h.store(0, "a")
    h.read(0, 0, BASE + 5000, f="delay-drain")  # ends at 1: b is missing
    h.store(0, "b")
    h.read(0, 1, BASE + 6000, f="delay-drain")  # b, and the end at 2
    assert h.check()["valid"] is True


def test_duplicates_beyond_the_requests_that_carried_them(h: History) -> None:
    h.send("retried", producer="plain", attempts=2)  # two requests: two copies allowed
    h.send("once", producer="plain", attempts=1)
    h.send("idem", attempts=0)
    for body in ("retried", "retried", "once", "once", "idem", "idem"):
        h.store(0, body)
    h.drain(0)
    r = h.check()
    _only(r, "duplicated", 2)
    assert {x["body"]: x["offsets"] for x in r["examples"]["duplicated"]} == {
        "once": [2, 3], "idem": [4, 5]}


def test_phantoms_a_failed_send_or_an_aborted_transaction_delivered(h: History) -> None:
    h.send("failed", kind="fail")
    h.txn("ab", [("ab.0", 0, 100)], outcome="abort", commit_ms=None)
    h.txn("nc", [("nc.0", 0, 100)], kind="fail", commit_ms=None)  # no commit asked
    h.txn("refused", [("refused.0", 0, 100)], kind="fail")  # commit refused
    for body in ("failed", "ab.0", "nc.0", "refused.0"):
        h.store(0, body)
    h.drain(0)
    r = h.check()
    _only(r, "phantom", 4)


def test_unexpected_bodies_and_offset_conflicts(h: History) -> None:
    h.send("a")
    h.store(0, "a")
    h.store(0, "stranger")
    h.drain(0)
    h.logs[0][0] = ("other", BASE)  # a second read finds another body at offset 0
    h.read(0, 0, BASE + 40_000)
    r = h.check()
    assert r["unexpected"] == 2 and r["offset_conflicts"] == 1 and not r["valid"], r


def test_malformed_records_make_the_verdict_invalid(h: History) -> None:
    h.rec.invoke("x", "delay-send", "d/0", {"body": "a", "producer": "plain"})  # no rule
    h.rec.complete("x", "ok", "delay-send", "d/0", {})
    h.rec.invoke("y", "delay-send", "d/0", {"body": "b", "producer": "plain",
                                            "delay_ms": 1, "at_ms": 2})  # two rules
    r = h.check()
    assert r["valid"] is False and r["malformed"] == 2, r


def test_an_open_send_is_unknown_and_other_lines_are_skipped(h: History) -> None:
    h.rec.invoke("x", "delay-send", "d/0", {"body": "a", "producer": "plain",
                                            "delay_ms": 100})
    lines = ["not json", json.dumps({"process": 1, "type": "invoke", "f": "append",
                                     "key": "q/0", "value": "p1-0", "time": 1})]
    h.rec.close()
    r = check_lines([*h.path.read_text().splitlines(), *lines])
    assert r["valid"] is True and r["messages"]["sends"] == {"info": 1}


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None


def _line(process: object, kind: str, f: str, key: object, value: object, t: float) -> str:
    return json.dumps({"process": process, "type": kind, "f": f, "key": key, "value": value,
                       "time": t})


def test_the_run_verdict_includes_the_delay_one(tmp_path: Path) -> None:
    """Queue operations and delayed-message records in one history (`--workload all`):
    the queue analysis reads its own, `chaos.delaycheck` the others, and a delayed
    message's violation makes the run invalid with its problem named."""
    from chaos.analysis import analyze_run

    def history(seen_ms: int) -> Path:
        lines = [
            _line(1, "invoke", "append", "q/0", "p1-0", 1.0),
            _line("s", "invoke", "delay-send", "d/0",
                  {"body": "a", "producer": "plain", "sent_ms": BASE, "delay_ms": 1000}, 1.5),
            _line("s", "attempt", "delay-send", "d/0", None, 1.6),
            _line(1, "ok", "append", "q/0", {"offset": 0}, 2.0),
            _line("s", "ok", "delay-send", "d/0", {"msg_id": "m", "offset": -1,
                                                   "ack_ms": BASE}, 2.5),
            _line(2, "invoke", "read", "q/0", {"offset": 0, "n": 8}, 4.5),
            _line(2, "ok", "read", "q/0", ["p1-0"], 5.5),
            _line("r", "invoke", "delay-drain", "d/0", {"offset": 0, "n": 8}, 6.0),
            _line("r", "ok", "delay-drain", "d/0",
                  {"seen_ms": seen_ms, "messages": [[0, "a", BASE]]}, 7.0),
        ]
        path = tmp_path / f"h{seen_ms}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        return path

    facts = {"queue_groups": {"q/0": "g0"}, "drained": True, "unexpected_exits": {}}
    good = analyze_run(history(BASE + 1500), facts, check_timeout=5).results
    assert good["verdict"] == "valid", good["problems"]
    assert good["delays"]["messages"]["delivered"] == 1
    assert good["delays"]["lateness_ms"]["p50"] == 500.0
    assert good["operations"]["append"]["ok"] == 1 and good["linearizable"] == {"q/0": True}
    bad = analyze_run(history(BASE + 900), facts, check_timeout=5).results
    assert bad["verdict"] == "invalid"
    assert "delays: early: 1" in bad["problems"]


def test_a_queue_history_has_no_delays_section(tmp_path: Path) -> None:
    from chaos.analysis import analyze_run

    path = tmp_path / "h.jsonl"
    path.write_text(_line(1, "invoke", "append", "q/0", "p1-0", 1.0) + "\n"
                    + _line(1, "ok", "append", "q/0", {"offset": 0}, 2.0) + "\n")
    assert "delays" not in analyze_run(path, None, check_timeout=5).results


def test_report_and_summary_show_the_delay_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from chaos.cli import _print_run
    from chaos.linearizability import CheckInfo, CheckResult
    from chaos.models import QueueLogModel
    from chaos.report import render_html

    empty = CheckInfo(CheckResult.OK, [], 0.0, False, 0)
    valid = check_lines([])
    page = render_html(QueueLogModel(), empty, delays=valid)
    assert page.index("<h2>Timeline") < page.index("<h2>Delayed messages")
    bad = {**valid, "valid": False, "early": 1, "lateness_ms": {"count": 3, "p50": 12.0,
                                                               "p99": 480.0, "max": 480.0},
           "examples": {"early": [{"body": "x", "early_ms": 900.0}]}}
    page = render_html(QueueLogModel(), empty, delays=bad)
    assert page.index("<h2>Delayed messages") < page.index("<h2>Timeline")
    assert "early: 1" in page and "early_ms" in page and "p99 480 ms" in page

    monkeypatch.setenv("COLUMNS", "400")
    _print_run({"valid": False, "verdict": "invalid", "problems": ["delays: early: 1"],
                "operations": {}, "faults": {}, "linearizable": {},
                "delays": {**bad, "messages": {"sent": 9, "acknowledged": 8, "delivered": 7}}},
               tmp_path)
    out = " ".join(capsys.readouterr().out.split())
    for text in ("delays: early: 1", "9 sent, 8 acknowledged, 7 delivered",
                 "p50/p99/max 12/480/480 ms", "early 1, late 0, lost 0"):
        assert text in out, (text, out)


def test_delay_workload_needs_nodes_the_harness_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('namesrv = "127.0.0.1:1"\n[nodes.1]\nagent = "127.0.0.1:2"\n')
    assert run_main(["--out", str(tmp_path / "out"), "--workload", "delay", "--cluster",
                     str(cluster), "--nemesis", "kill"]) == EXIT_USAGE
    assert "--workload delay needs nodes the harness starts" in capsys.readouterr().err


def test_delays_near_the_end_of_the_load_fall_due_soon_after_it(tmp_path: Path) -> None:
    """Early on, delays up to 20 s and every level; near the end, nothing due later than
    `TAIL_S` after it (a run need not wait out 20 s delays after the heal)."""
    from chaos.delayworkload import MAX_DELAY_S, TAIL_S, DelayWorkload

    with Recorder(tmp_path / "h.jsonl") as rec:
        load = DelayWorkload("127.0.0.1:1", "c", 3, recorder=rec, rng=random.Random(5))
        load._stop_at = time.monotonic() + 600
        early = [load._rule()[0] for _ in range(400)]
        load._stop_at = time.monotonic() + 1
        late = [load._rule()[0] for _ in range(400)]
    assert {r.get("level") for r in early} == {None, 1, 2, 3}
    delays = [r["delay_ms"] for r in early if "delay_ms" in r]
    assert max(delays) > 15_000 and max(delays) <= MAX_DELAY_S * 1000
    assert any(r["at_ms"] < time.time() * 1000 for r in early if "at_ms" in r)  # past ones
    horizon = (time.time() + 1 + TAIL_S) * 1000 + 50
    for r in late:
        assert r.get("level") in (None, 1)
        assert r.get("delay_ms", 0) <= (1 + TAIL_S) * 1000 + 50
        assert r.get("at_ms", 0) <= horizon


# ------------------------------------------------------------------ live runs

# mutation: (nemeses, seed, the violation that must be found)
CAUGHT_BY = {
    "deliver-at-send": ("none", 1, "early"),
    "volatile-timers": ("leader-transfer", 4, "lost"),
}


def test_the_volatile_timers_run_moves_leaders_while_messages_pend() -> None:
    """The seed's first leader-transfer storm starts within the load, after seconds of
    sends (pending ones among them), so a new leader term drops what is pending."""
    nemesis, seed, _kind = CAUGHT_BY["volatile-timers"]
    steps = nemesis_plan(RunOptions(out=Path("unused"), time=DELAY_SECONDS, seed=seed,
                                    nemesis=(nemesis,)))
    assert steps and steps[0].kind == nemesis
    assert 2.0 <= steps[0].at and steps[0].end < DELAY_SECONDS - 2, steps


@pytest.mark.live
def test_delay_smoke_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = run_main(["--out", str(out), "--workload", "delay", "--time", str(DELAY_SECONDS),
                     "--seed", "3", "--nemesis", "kill", "--drain-timeout", "40", "--json"])
    results = _results(out)
    d = results["delays"]
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] is True and d["valid"] is True
    msgs = d["messages"]
    # every kind of send happened and was delivered, so the checks were not vacuous
    assert msgs["acknowledged"] > 50 and msgs["delivered"] >= msgs["acknowledged"], msgs
    assert set(msgs["by_rule"]) == {"at", "delay", "level"}, msgs
    assert d["transactions"]["committed"] > 0 and d["transactions"]["aborted"] > 0, d
    assert d["lateness_ms"]["count"] == msgs["delivered"]
    assert d["undrained_queues"] == []
    assert {f.f for f in parse_faults(out / "history.jsonl")} == {"kill"}
    assert "Delayed messages" in (out / "report.html").read_text()
    _recheck(out, 0, capsys)


@pytest.mark.parametrize("mutation", sorted(CAUGHT_BY))
@pytest.mark.live
def test_a_delayed_message_bug_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    mutation: str,
) -> None:
    nemesis, seed, kind = CAUGHT_BY[mutation]
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")
    out = tmp_path / "run"
    results = run_chaos(RunOptions(
        out=out, workload="delay", time=DELAY_SECONDS, seed=seed,
        nemesis=() if nemesis == "none" else (nemesis,), mutations=(mutation,),
        check_timeout=20, drain_timeout=40,
    ))
    d = results["delays"]
    assert results["verdict"] == "invalid", json.dumps(results, indent=1)[:4000]
    assert d["valid"] is False and d[kind] > 0, json.dumps(d, indent=1)[:4000]
    assert f"delays: {kind}: {d[kind]}" in results["problems"]
    html = (out / "report.html").read_text()
    assert "Delayed messages" in html and "invalid" in html
    _recheck(out, 1, capsys)
