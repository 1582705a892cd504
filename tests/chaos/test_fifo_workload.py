"""`raftmq chaos run --workload fifo`: the FIFO checker on synthetic histories (each
finding caught where it is, nothing found in a valid history, within the clock slack),
and the workload on real nodes: a short run under `kill` (a consumer process killed
too) is valid, and `fifo-ignore-inflight` (a group's next message handed out while one
is in flight) is caught as out of order, with no fault at all."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from chaos import simplecheck
from chaos.cli import run_main
from chaos.fifocheck import VIOLATIONS, check_file, check_lines
from chaos.histories import parse_faults
from chaos.run import RunOptions, run_chaos
from tests.chaos.test_run import _recheck, _results
from tests.chaos.test_simple_workload import History, T


class FifoHistory(History):
    """`History` with sends of FIFO message groups: each group numbered from 1."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.seqs: dict[str, int] = {}

    def fifo(self, group: str, *, queue: int = 0, kind: str = "ok") -> tuple[int, str]:
        """Send the group's next message: (offset, body)."""
        seq = self.seqs[group] = self.seqs.get(group, 0) + 1
        body = f"{group}-{seq}"
        p, key = self.process(), f"{T}/{queue}"
        self.rec.invoke(p, "simple-send", key, {"body": body, "producer": "idempotent",
                                                "always_fail": False, "group": group,
                                                "seq": seq})
        offset = self.ends.get(queue, 0)
        self.ends[queue] = offset + 1
        if kind == "ok":
            self.rec.complete(p, "ok", "simple-send", key, {"offset": offset})
        else:
            self.rec.complete(p, kind, "simple-send", key, {"error": "x"})
        return offset, body

    def both(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the FIFO verdict, the simple-consumer verdict) of the history."""
        self.rec.close()
        return check_file(self.path), simplecheck.check_file(self.path)


@pytest.fixture
def h(tmp_path: Path) -> FifoHistory:
    return FifoHistory(tmp_path / "history.jsonl")


def only(result: dict[str, Any], **kinds: int) -> dict[str, list[Any]]:
    """`result` found just `kinds` (kind=count); its examples."""
    assert {k: result[k] for k in VIOLATIONS if result[k]} == kinds, result
    assert result["problems"] == [f"{k}: {n}" for k, n in kinds.items()], result
    assert not result["valid"]
    return result["examples"]


def test_a_valid_history_of_groups_in_order_and_in_parallel(h: FifoHistory) -> None:
    """One group in order through an ack, a nack and redelivery to another consumer, a
    timed-out delivery redelivered, an ack within the clock slack of the next delivery;
    another group in flight at the same time throughout; the dead letter of a group
    frees its next message once its last delivery timed out."""
    a1, b1 = h.fifo("a"), h.fifo("b")
    a2, b2 = h.fifo("a"), h.fifo("b")
    a3 = h.fifo("a")
    c1, c2 = h.fifo("c", queue=1), h.fifo("c", queue=1)
    [x, _] = h.receive([(0, a1[0], a1[1], 1), (0, b1[0], b1[1], 1)], 0, 10)
    h.ack(a1[0], x, a1[1], 20)
    [y] = h.receive([(0, a2[0], a2[1], 1)], 15, 25, consumer="c2")  # 5 ms before: slack
    h.nack(a2[0], y, a2[1], 30, delay_ms=100)
    h.ack(b1[0], x, b1[1], 40)
    [z, _] = h.receive([(0, a2[0], a2[1], 2), (0, b2[0], b2[1], 1)], 200, 210,
                       consumer="c3")
    h.ack(a2[0], z, a2[1], 220)
    [w] = h.receive([(0, a3[0], a3[1], 1)], 230, 240)
    [v] = h.receive([(0, a3[0], a3[1], 2)], 1300, 1310, consumer="c2")  # w timed out
    h.ack(a3[0], v, a3[1], 1320)
    h.ack(b2[0], z, b2[1], 1330)
    # c's first message: delivered up to max_deliveries times, buried by a receive
    t = 0.0
    for n in range(1, 5):
        h.receive([(1, c1[0], c1[1], n)], t, t + 10, invisible=500)
        t += 600
    [u] = h.receive([(1, c2[0], c2[1], 1)], t, t + 10)
    h.ack(c2[0], u, c2[1], t + 20, queue=1)
    h.dlq([(c1[0], c1[1], 4)], queue=1)
    fifo, simple = h.both()
    assert fifo["valid"] and simple["valid"], (fifo, simple)
    assert fifo["message_groups"] == 3 and fifo["messages"] == 7, fifo
    assert fifo["deliveries"] == 12 and fifo["largest_group"] == 3, fifo


def test_a_later_message_handed_out_while_an_earlier_one_timed_out_unacked(
        h: FifoHistory) -> None:
    """The earlier message's invisible time ran out, but it is still the group's to
    redeliver first: the next one handed out meanwhile is out of order."""
    a1, a2 = h.fifo("g"), h.fifo("g")
    [x] = h.receive([(0, a1[0], a1[1], 1)], 0, 10, invisible=1000)
    [y] = h.receive([(0, a2[0], a2[1], 1)], 1500, 1510, consumer="c2")
    h.ack(a1[0], x, a1[1], 1600)  # a late ack, taken: nobody had it again
    h.ack(a2[0], y, a2[1], 1700)
    h.dlq([])
    fifo, simple = h.both()
    assert simple["valid"], simple
    [ex] = only(fifo, out_of_order=1)["out_of_order"]
    assert ex["group"] == "g" and ex["delivered"]["seq"] == 2 and ex["earlier"]["seq"] == 1
    assert ex["why"] == "settled later" and ex["early_ms"] == 90.0


def test_an_earlier_message_delivered_after_a_later_one(h: FifoHistory) -> None:
    """Handles order the receives of a queue exactly: the second message went out first,
    whatever the clocks say."""
    a1, a2 = h.fifo("g"), h.fifo("g")
    [y] = h.receive([(0, a2[0], a2[1], 1)], 0, 10)
    h.ack(a2[0], y, a2[1], 20)
    [x] = h.receive([(0, a1[0], a1[1], 1)], 30, 40)
    h.ack(a1[0], x, a1[1], 50)
    h.dlq([])
    fifo, _ = h.both()
    [ex] = only(fifo, out_of_order=1)["out_of_order"]
    assert ex["why"] == "delivered after it" and ex["earlier_handle"] == x


def test_a_later_message_delivered_while_an_earlier_one_is_never_settled(
        h: FifoHistory) -> None:
    a1, a2 = h.fifo("g"), h.fifo("g")
    [y] = h.receive([(0, a2[0], a2[1], 1)], 0, 10)
    h.ack(a2[0], y, a2[1], 20)
    h.dlq([])
    fifo, simple = h.both()
    [ex] = only(fifo, out_of_order=1)["out_of_order"]
    assert ex["why"] == "never settled" and ex["earlier"]["offset"] == a1[0]
    assert simple["lost"] == 1  # and the first one is lost, simplecheck's to say


def test_without_the_dead_letters_read_an_unsettled_message_is_not_judged(
        h: FifoHistory) -> None:
    """It may be a dead letter, buried by a receive nobody saw the answer of."""
    h.fifo("g")  # never delivered
    a2 = h.fifo("g")
    [y] = h.receive([(0, a2[0], a2[1], 1)], 0, 10)
    h.ack(a2[0], y, a2[1], 20)
    h.dlq([], kind="info")
    fifo, _ = h.both()
    assert fifo["valid"] and not fifo["dlq_read"] and fifo["messages"] == 2, fifo


def test_two_messages_of_a_group_in_flight_at_once(h: FifoHistory) -> None:
    """An ack of unknown outcome of the first delivery may have settled the first
    message early (so nothing is out of order for sure), but it was delivered again and
    held when the second went out: the group was in two consumers' hands."""
    a1, a2 = h.fifo("g"), h.fifo("g")
    [x] = h.receive([(0, a1[0], a1[1], 1)], 0, 10, invisible=1000)
    h.ack(a1[0], x, a1[1], 20, "info")
    [x2] = h.receive([(0, a1[0], a1[1], 2)], 1100, 1110, consumer="c2", invisible=1000)
    [y] = h.receive([(0, a2[0], a2[1], 1)], 1200, 1210, consumer="c3")
    h.ack(a1[0], x2, a1[1], 1300)
    h.ack(a2[0], y, a2[1], 1400)
    h.dlq([])
    fifo, simple = h.both()
    assert simple["valid"], simple
    [ex] = only(fifo, group_double_holding=1)["group_double_holding"]
    assert ex["consumers"] == ["c2", "c3"] and ex["handles"] == [x2, y]
    assert ex["held"]["seq"] == 1 and ex["handed"]["seq"] == 2 and ex["early_ms"] == 90.0  # until its ack


def test_one_receive_handing_out_two_messages_of_a_group(h: FifoHistory) -> None:
    """What `fifo-ignore-inflight` does: both are out of order and doubly held."""
    a1, a2 = h.fifo("g"), h.fifo("g")
    [x, _] = h.receive([(0, a1[0], a1[1], 1), (0, a2[0], a2[1], 1)], 0, 10)
    h.ack(a2[0], x, a2[1], 20)
    h.ack(a1[0], x, a1[1], 30)
    h.dlq([])
    fifo, simple = h.both()
    assert simple["valid"], simple
    found = only(fifo, out_of_order=1, group_double_holding=1)
    assert found["group_double_holding"][0]["early_ms"] is None


def test_a_dead_letter_frees_its_group_only_once_its_last_delivery_times_out(
        h: FifoHistory) -> None:
    a1, a2 = h.fifo("g"), h.fifo("g")
    t = 0.0
    for n in range(1, 5):
        h.receive([(0, a1[0], a1[1], n)], t, t + 10, invisible=500)
        t += 600
    [y] = h.receive([(0, a2[0], a2[1], 1)], t - 400, t - 390)  # the last one is held
    h.ack(a2[0], y, a2[1], t)
    h.dlq([(a1[0], a1[1], 4)])
    fifo, _ = h.both()
    found = only(fifo, out_of_order=1, group_double_holding=1)
    assert found["out_of_order"][0]["early_ms"] == 290.0


def test_the_run_verdict_and_report_include_the_fifo_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos.analysis import analyze_run
    from chaos.cli import _print_run
    from chaos.linearizability import CheckInfo, CheckResult
    from chaos.models import QueueLogModel
    from chaos.report import render_html

    def history(in_order: bool) -> Path:
        h = FifoHistory(tmp_path / f"h-{in_order}.jsonl")
        a1, a2 = h.fifo("g"), h.fifo("g")
        [x] = h.receive([(0, a1[0], a1[1], 1)], 0, 10)
        h.ack(a1[0], x, a1[1], 20 if in_order else 60)
        [y] = h.receive([(0, a2[0], a2[1], 1)], 25, 30)
        h.ack(a2[0], y, a2[1], 50)
        h.dlq([])
        h.rec.close()
        return h.path

    facts = {"queue_groups": {}, "drained": True, "unexpected_exits": {}}
    good = analyze_run(history(True), facts, check_timeout=5).results
    assert good["verdict"] == "valid", good["problems"]
    assert good["fifo"]["message_groups"] == 1 and good["simple"]["valid"]
    bad = analyze_run(history(False), facts, check_timeout=5).results
    assert bad["verdict"] == "invalid" and bad["simple"]["valid"]
    assert "fifo: out_of_order: 1" in bad["problems"]
    plain = tmp_path / "plain.jsonl"
    h = History(plain)
    h.send("x")
    h.rec.close()
    assert "fifo" not in analyze_run(plain, facts, check_timeout=5).results

    empty = CheckInfo(CheckResult.OK, [], 0.0, False, 0)
    page = render_html(QueueLogModel(), empty, fifo=good["fifo"])
    assert page.index("<h2>Timeline") < page.index("<h2>FIFO message groups")
    page = render_html(QueueLogModel(), empty, fifo=bad["fifo"])
    assert page.index("<h2>FIFO message groups") < page.index("<h2>Timeline")
    assert "out_of_order: 1" in page and "settled later" in page
    monkeypatch.setenv("COLUMNS", "400")
    _print_run({**bad, "operations": {}, "faults": {}, "linearizable": {}}, tmp_path)
    out = " ".join(capsys.readouterr().out.split())
    assert "1 groups, 2 messages, 2 deliveries; out_of_order 1, group_double_holding 1" in out, out


def test_an_empty_history_is_valid() -> None:
    result = check_lines([])
    assert result["valid"] and result["message_groups"] == 0 and not result["dlq_read"]


# ------------------------------------------------------------------ live runs

FIFO_SECONDS = float(os.environ.get("CHAOS_FIFO_SECONDS", "12"))


@pytest.mark.live
def test_fifo_smoke_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = run_main(["--out", str(out), "--workload", "fifo", "--time", str(FIFO_SECONDS),
                     "--seed", "3", "--nemesis", "kill", "--drain-timeout", "40", "--json"])
    results = _results(out)
    f, s = results["fifo"], results["simple"]
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] is True and f["valid"] is True and s["valid"] is True
    # groups went through redeliveries and dead letters, so the checks were not vacuous
    assert f["message_groups"] >= 8 and f["largest_group"] >= 3, f
    assert s["messages"]["redeliveries"] > 0 and s["messages"]["dead_letters"] > 0, s
    assert f["deliveries"] == s["messages"]["deliveries"] and f["dlq_read"] is True
    assert results["run"]["fifo_load"]["worker_starts"] >= 2  # a consumer was killed
    assert {f.f for f in parse_faults(out / "history.jsonl")} == {"kill"}
    assert "FIFO message groups" in (out / "report.html").read_text()
    _recheck(out, 0, capsys)


@pytest.mark.live
def test_a_group_handed_out_while_in_flight_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """`fifo-ignore-inflight`: with no fault at all, a group's messages go out side by
    side, to one consumer or several."""
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")
    out = tmp_path / "run"
    results = run_chaos(RunOptions(
        out=out, workload="fifo", time=FIFO_SECONDS, seed=1, nemesis=(),
        mutations=("fifo-ignore-inflight",), check_timeout=20, drain_timeout=40,
    ))
    f = results["fifo"]
    assert results["verdict"] == "invalid", json.dumps(results, indent=1)[:4000]
    # (doubly held too, when the next message comes while the first is held unexpired:
    # a few times a run, not every run)
    assert f["valid"] is False and f["out_of_order"] > 0, json.dumps(f, indent=1)[:4000]
    assert f"fifo: out_of_order: {f['out_of_order']}" in results["problems"]
    html = (out / "report.html").read_text()
    assert "FIFO message groups" in html and "invalid" in html
    _recheck(out, 1, capsys)
