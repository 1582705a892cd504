"""`raftmq chaos run --workload simple`: the simple-consumer checker on synthetic
histories (each finding caught where it is, nothing found in a valid history), and the
workload on real nodes: a short run under `kill` (a consumer process killed too) is
valid, and `ack-later-delivery` (an ack of an older delivery applied to the current one)
is caught as stale acks accepted, with no fault at all: stalled consumers' late acks
meet messages delivered again meanwhile."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from chaos.cli import EXIT_USAGE, run_main
from chaos.histories import parse_faults
from chaos.recorder import Recorder
from chaos.run import RunOptions, run_chaos
from chaos.simplecheck import CLOCK_SLACK_MS, VIOLATIONS, check_file, check_lines
from tests.chaos.test_run import _recheck, _results

T = "s"
CG = "workers"
MD = 4  # max_deliveries
BACKOFF = [500, 1000, 2000]
BASE = 1_800_000_000_000  # a wall-clock ms; every time below is relative to it


class History:
    """A history in the forms `chaos.simplecheck` reads, built by hand: offsets and
    handles are handed out here as a queue and its group's log would."""

    def __init__(self, path: Path) -> None:
        self.path = path
        ticks = iter(range(1, 1 << 30))  # the checker reads no history time; the queue
        self.rec = Recorder(path, clock=lambda: float(next(ticks)))  # analysis does
        self.ends: dict[int, int] = {}
        self.handle = 100
        self.n = 0

    def process(self) -> str:
        self.n += 1
        return f"p{self.n}"

    def send(self, body: str, *, queue: int = 0, kind: str = "ok",
             always_fail: bool = False) -> int:
        p, key = self.process(), f"{T}/{queue}"
        self.rec.invoke(p, "simple-send", key, {"body": body, "producer": "idempotent",
                                                "always_fail": always_fail})
        offset = self.ends.get(queue, 0)
        if kind == "ok":
            self.ends[queue] = offset + 1
            self.rec.complete(p, "ok", "simple-send", key, {"offset": offset})
        else:
            self.rec.complete(p, kind, "simple-send", key, {"error": "x"})
        return offset

    def receive(self, items: list[tuple[int, int, str, int]], since: float, got: float, *,
                consumer: str = "c1", invisible: int = 1000, kind: str = "ok",
                handle: int | None = None) -> list[int]:
        """Deliveries (queue, offset, body, count) made in one receive; their handles."""
        p = self.process()
        self.rec.invoke(p, "simple-receive", T, {
            "cg": CG, "consumer": consumer, "max": 8, "invisible_ms": invisible,
            "max_deliveries": MD, "since_ms": BASE + since})
        if kind != "ok":
            self.rec.complete(p, kind, "simple-receive", T, {"error": "x"})
            return []
        if handle is None:
            self.handle += 1
            handle = self.handle
        self.rec.complete(p, "ok", "simple-receive", T, {"ms": BASE + got, "messages": [
            [q, o, b, c, handle] for q, o, b, c in items]})
        return [handle] * len(items)

    def settle(self, f: str, offset: int, handle: int, body: str, sent: float,
               outcome: str = "ok", *, queue: int = 0, **extra: Any) -> None:
        p, key = self.process(), f"{T}/{queue}"
        self.rec.invoke(p, f, key, {"cg": CG, "offset": offset, "handle": handle,
                                    "body": body, "sent_ms": BASE + sent, **extra})
        if outcome == "ok":
            self.rec.complete(p, "ok", f, key, {"ms": BASE + sent + 5})
        elif outcome == "stale":
            self.rec.complete(p, "fail", f, key, {"error": "stale", "stale": True})
        elif outcome != "open":
            self.rec.complete(p, outcome, f, key, {"error": "x"})

    def ack(self, offset: int, handle: int, body: str, sent: float, outcome: str = "ok",
            **kw: Any) -> None:
        self.settle("simple-ack", offset, handle, body, sent, outcome, late=False, **kw)

    def nack(self, offset: int, handle: int, body: str, sent: float, outcome: str = "ok",
             delay_ms: int | None = None, **kw: Any) -> None:
        self.settle("simple-nack", offset, handle, body, sent, outcome, delay_ms=delay_ms,
                    backoff_ms=BACKOFF, error="failed", **kw)

    def lost(self, sent: float, *, queue: int = 0) -> None:
        p, key = self.process(), f"{T}/{queue}"
        self.rec.invoke(p, "simple-lost", key, {"cg": CG, "sent_ms": BASE + sent})
        self.rec.complete(p, "info", "simple-lost", key, {"error": "timeout",
                                                          "ms": BASE + sent + 3000})

    def dlq(self, entries: list[tuple[int, str, int]], *, queue: int = 0,
            kind: str = "ok") -> None:
        """The dead letters read at the end: (offset, body, deliveries) each."""
        p = self.process()
        self.rec.invoke(p, "simple-dlq", CG, {"cg": CG, "max_deliveries": MD})
        if kind != "ok":
            self.rec.complete(p, kind, "simple-dlq", CG, {"error": "x"})
            return
        self.rec.complete(p, "ok", "simple-dlq", CG, {"ms": BASE + 99_000, "entries": [
            [f"1:{i + 1}", f"{T}/{queue}", o, b, d, "e"] for i, (o, b, d) in enumerate(entries)]})

    def check(self) -> dict[str, Any]:
        self.rec.close()
        return check_file(self.path)


@pytest.fixture
def h(tmp_path: Path) -> History:
    return History(tmp_path / "history.jsonl")


def only(result: dict[str, Any], kind: str, n: int = 1) -> dict[str, Any]:
    """`result` found `n` of `kind` and nothing else."""
    assert result[kind] == n, result
    assert result["problems"] == [f"{kind}: {n}"], result
    assert not result["valid"]
    return result["examples"][kind][0]


def test_a_valid_history_of_every_way_to_settle(h: History) -> None:
    o1 = h.send("a")
    [h1] = h.receive([(0, o1, "a", 1)], 0, 10)
    h.ack(o1, h1, "a", 20)
    # nacked, then delivered again after the backoff and acked
    o2 = h.send("b")
    [h2] = h.receive([(0, o2, "b", 1)], 100, 110)
    h.nack(o2, h2, "b", 120)
    [h2b] = h.receive([(0, o2, "b", 2)], 620, 630, consumer="c2")
    h.ack(o2, h2b, "b", 640)
    # always fails: four deliveries (time-outs and nacks), then a dead letter
    o3 = h.send("c", always_fail=True)
    t = 1000.0
    for count in range(1, MD + 1):
        [hc] = h.receive([(0, o3, "c", count)], t, t + 5)
        if count % 2:
            h.nack(o3, hc, "c", t + 10, delay_ms=0)
        t += 1100
    # poison: to the dead letters at its first delivery
    o4 = h.send("d")
    [h4] = h.receive([(0, o4, "d", 1)], 6000, 6010)
    h.settle("simple-dead", o4, h4, "d", 6020, error="poison")
    # stalled past its invisible time: delivered again elsewhere, the late ack is stale
    o5 = h.send("e")
    [h5] = h.receive([(0, o5, "e", 1)], 7000, 7010)
    [h5b] = h.receive([(0, o5, "e", 2)], 8010, 8020, consumer="c2")
    h.settle("simple-ack", o5, h5, "e", 8500, "stale", late=True)
    h.ack(o5, h5b, "e", 8600)
    # stalled, nobody received it since: the late ack is taken
    o6 = h.send("f")
    [h6] = h.receive([(0, o6, "f", 1)], 9000, 9010)
    h.settle("simple-ack", o6, h6, "f", 10_500, late=True)
    # more time asked, then shortened, then delivered again once that ran out
    o7 = h.send("g")
    [h7] = h.receive([(0, o7, "g", 1)], 11_000, 11_005, invisible=3000)
    h.settle("simple-change", o7, h7, "g", 11_100, invisible_ms=200)
    [h7b] = h.receive([(0, o7, "g", 2)], 11_400, 11_410)
    h.ack(o7, h7b, "g", 11_420)
    # its first delivery's answer was lost (the request timed out): first seen as 2
    o8 = h.send("h")
    h.lost(12_000)
    [h8] = h.receive([(0, o8, "h", 2)], 13_100, 13_110)
    h.ack(o8, h8, "h", 13_120)
    # a receive that raised: any number of deliveries may be unseen
    o9 = h.send("i")
    h.receive([], 14_000, 0, kind="info")
    [h9] = h.receive([(0, o9, "i", 3)], 16_000, 16_010)
    # its last ack's outcome is unknown: it may have been taken
    h.ack(o9, h9, "i", 16_020, "info")
    # a failed send never delivered; one of unknown outcome that was stored and acked
    h.send("j", kind="fail")
    h.send("k", kind="info")
    [hk] = h.receive([(0, 9, "k", 1)], 17_000, 17_010)
    h.ack(9, hk, "k", 17_020)
    h.dlq([(o3, "c", MD), (o4, "d", 1)])
    r = h.check()
    assert r["valid"], r
    assert all(r[kind] == 0 for kind in VIOLATIONS)
    m = r["messages"]
    assert (m["sent"], m["acknowledged"], m["always_fail"], m["delivered"]) == (11, 9, 1, 10)
    assert m["dead_letters"] == 2 and m["max_deliveries_reached"] == 1 and m["acked"] == 7
    assert r["late_acks"] == {"ok": 1, "stale": 1} and r["dlq_read"] is True
    assert (r["lost_requests"], r["unknown_receives"]) == (1, 1)
    assert r["settled"]["ack"] == {"info": 1, "ok": 7, "stale": 1}


def test_lost_acknowledged_messages_never_acked_nor_dead(h: History) -> None:
    h.send("a")
    o = h.send("b")
    [hb] = h.receive([(0, o, "b", 1)], 0, 10)
    h.ack(o, hb, "b", 20, "stale")  # refused: not taken
    h.send("c", kind="info")  # unknown: not judged
    h.dlq([])
    r = h.check()
    assert r["lost"] == 2 and r["problems"] == ["lost: 2"], r
    assert [x["body"] for x in r["examples"]["lost"]] == ["a", "b"]


def test_without_the_dead_letters_read_nothing_is_judged_lost(h: History) -> None:
    h.send("a")
    h.dlq([], kind="info")
    r = h.check()
    assert r["valid"] and r["dlq_read"] is False, r


def test_a_message_delivered_again_after_its_ack_was_answered(h: History) -> None:
    o = h.send("a")
    [h1] = h.receive([(0, o, "a", 1)], 0, 10)
    h.ack(o, h1, "a", 20)
    [h2] = h.receive([(0, o, "a", 2)], 2000, 2010)
    h.ack(o, h2, "a", 2020, "stale")
    h.dlq([])
    found = only(h.check(), "acked_then_delivered")
    assert (found["acked_handle"], found["later_handle"]) == (h1, h2)


def test_a_stale_ack_accepted_after_a_later_delivery(h: History) -> None:
    """The ack-later-delivery mutation's trace: the first holder's late ack is answered
    ok although the message was delivered again before it."""
    o = h.send("a")
    [h1] = h.receive([(0, o, "a", 1)], 0, 10)
    [h2] = h.receive([(0, o, "a", 2)], 1100, 1110, consumer="c2")
    h.settle("simple-ack", o, h1, "a", 1500, late=True)
    h.ack(o, h2, "a", 1600, "stale")
    h.dlq([])
    found = only(h.check(), "stale_acks_accepted")
    assert (found["acked_handle"], found["later_handle"], found["later_count"]) == (h1, h2, 2)


def test_two_consumers_holding_a_message_at_once(h: History) -> None:
    o = h.send("a")
    [h1] = h.receive([(0, o, "a", 1)], 0, 10, invisible=2000)
    [h2] = h.receive([(0, o, "a", 2)], 1000, 1010, consumer="c2")
    h.ack(o, h2, "a", 1020)
    h.dlq([])
    found = only(h.check(), "double_holding")
    assert found["handles"] == [h1, h2] and found["consumers"] == ["c1", "c2"]
    assert found["early_ms"] == 2000 - 1010


def test_holding_is_judged_within_the_clock_slack_and_after_nacks_and_changes(
        h: History) -> None:
    o = h.send("a")
    [h1] = h.receive([(0, o, "a", 1)], 0, 10, invisible=1000)
    # the later receive may have been made right at the deadline, give or take the slack
    [h2] = h.receive([(0, o, "a", 2)], 900, 1000 - CLOCK_SLACK_MS)
    # a nack of unknown outcome may have made it visible at once
    h.nack(o, h2, "a", 1100, "info", delay_ms=0)
    [h3] = h.receive([(0, o, "a", 3)], 1150, 1160)
    h.ack(o, h3, "a", 1170)
    h.dlq([])
    assert h.check()["valid"]


def test_delivery_counts_that_repeat_go_back_or_skip(h: History) -> None:
    o = h.send("a")
    [h1] = h.receive([(0, o, "a", 1)], 0, 10)
    h.receive([(0, o, "a", 1)], 1100, 1110)
    h.ack(o, h1, "a", 20, "stale")
    o2 = h.send("b")
    h.receive([(0, o2, "b", 1)], 2000, 2010)
    h.receive([(0, o2, "b", 3)], 3100, 3110)  # no answer was lost: a skip
    o3 = h.send("c")
    h.lost(3500, queue=1)  # another queue's lost request explains nothing here
    h.receive([(0, o3, "c", 2)], 4000, 4010)
    h.dlq([(o, "a", MD), (o2, "b", MD), (o3, "c", MD)])
    r = h.check()
    assert r["delivery_counts"] == 3 and r["problems"] == ["delivery_counts: 3"], r
    assert [x["why"] for x in r["examples"]["delivery_counts"]] == [
        "repeated", "skipped", "skipped"]


def test_a_lost_request_explains_one_missing_delivery_each(h: History) -> None:
    o = h.send("a")
    h.lost(0)
    h.receive([(0, o, "a", 3)], 2000, 2010)  # two missing, one lost request
    h.dlq([(o, "a", MD)])
    found = only(h.check(), "delivery_counts")
    assert found["why"] == "skipped" and found["lost_requests_before"] == 1
    h2 = History(h.path.with_name("h2.jsonl"))
    o = h2.send("a")
    h2.lost(0)
    h2.lost(1000)
    h2.receive([(0, o, "a", 3)], 2000, 2010)
    h2.lost(3000)  # after the delivery was seen: explains nothing before it
    h2.dlq([(o, "a", MD)])
    assert h2.check()["valid"]


def test_dead_letters_wrong(h: History) -> None:
    o1 = h.send("a")  # dead after 2 deliveries with no dead_letter call
    h.receive([(0, o1, "a", 1)], 0, 10)
    h.receive([(0, o1, "a", 2)], 1100, 1110)
    o2 = h.send("b")  # acked and dead
    [hb] = h.receive([(0, o2, "b", 1)], 0, 10)
    h.ack(o2, hb, "b", 20)
    o3 = h.send("c")  # delivered max_deliveries times, its last delivery nacked: not dead
    t = 2000.0
    for count in range(1, MD + 1):
        [hc] = h.receive([(0, o3, "c", count)], t, t + 5)
        t += 1100
    h.nack(o3, hc, "c", t)
    h.ack(o3, hc, "c", t + 10, "stale")
    o4 = h.send("d")  # poisoned at delivery 1, and still delivered once more
    [hd] = h.receive([(0, o4, "d", 1)], 0, 10)
    h.settle("simple-dead", o4, hd, "d", 20, error="poison")
    h.receive([(0, o4, "d", 2)], 1100, 1110)
    h.dlq([(o1, "a", 2), (o2, "b", MD), (o4, "d", 1)])
    r = h.check()
    # c: also lost (neither acked nor dead)
    assert r["dead_letters_wrong"] == 4 and r["lost"] == 1, r
    whys = sorted(x["why"] for x in r["examples"]["dead_letters_wrong"])
    assert whys == ["acked and dead", "delivered after dead_letter",
                    "delivered max_deliveries times, neither acked nor dead",
                    "deliveries"], whys


def test_phantoms_and_offset_conflicts(h: History) -> None:
    o = h.send("a")
    h.send("f", kind="fail")
    [ha] = h.receive([(0, o, "a", 1)], 0, 10)
    h.ack(o, ha, "a", 20)
    h.receive([(0, o + 1, "f", 1)], 100, 110)  # its send failed for certain
    h.receive([(0, o + 2, "zz", 1)], 200, 210)  # nobody sent it
    h.receive([(1, 0, "a", 1)], 300, 310)  # sent to queue 0, seen in queue 1
    h.receive([(0, o, "b", 2)], 1400, 1410)  # another body at a's offset
    h.dlq([])
    r = h.check()
    assert r["phantoms"] == 3 and r["offset_conflicts"] == 1, r
    assert sorted(x["send"] for x in r["examples"]["phantoms"]) == ["fail", "none", "to s/0"]


def test_malformed_records_make_the_verdict_invalid_and_other_lines_are_skipped(
        h: History) -> None:
    h.rec.invoke("x", "simple-ack", f"{T}/0", {"offset": 1})  # no cg, handle...
    h.rec.invoke("y", "append", f"{T}/0", {"body": "q"})
    h.rec.complete("y", "ok", "append", f"{T}/0", {"offset": 0})
    r = h.check()
    assert not r["valid"] and r["malformed"] == 1 and "malformed" in r["problems"][0], r
    assert check_lines(["not json", "{}", '{"f": "simple-ack"}'])["valid"]


def test_the_run_verdict_includes_the_simple_one(tmp_path: Path) -> None:
    """Queue operations and simple-consumer records in one history (`--workload all`):
    the queue analysis reads its own, `chaos.simplecheck` the others, and a simple
    consumer's violation makes the run invalid with its problem named."""
    from chaos.analysis import analyze_run

    def history(ack: str) -> Path:
        path = tmp_path / f"h-{ack}.jsonl"
        h = History(path)
        h.rec.invoke(1, "append", "q/0", "p1-0")
        h.rec.complete(1, "ok", "append", "q/0", {"offset": 0})
        o = h.send("a")
        [h1] = h.receive([(0, o, "a", 1)], 0, 10)
        [h2] = h.receive([(0, o, "a", 2)], 1100, 1110)
        h.ack(o, h1, "a", 1200, ack)  # the first delivery's late ack
        h.ack(o, h2, "a", 1300)
        h.rec.invoke(2, "read", "q/0", {"offset": 0, "n": 8})
        h.rec.complete(2, "ok", "read", "q/0", ["p1-0"])
        h.dlq([])
        h.rec.close()
        return path

    facts = {"queue_groups": {"q/0": "g0"}, "drained": True, "unexpected_exits": {}}
    good = analyze_run(history("stale"), facts, check_timeout=5).results
    assert good["verdict"] == "valid", good["problems"]
    assert good["simple"]["messages"]["deliveries"] == 2
    assert good["operations"]["append"]["ok"] == 1 and good["linearizable"] == {"q/0": True}
    bad = analyze_run(history("ok"), facts, check_timeout=5).results
    assert bad["verdict"] == "invalid"
    assert "simple: stale_acks_accepted: 1" in bad["problems"]
    queue_only = tmp_path / "q.jsonl"
    with Recorder(queue_only) as rec:
        rec.invoke(1, "append", "q/0", "p1-0")
        rec.complete(1, "ok", "append", "q/0", {"offset": 0})
    assert "simple" not in analyze_run(queue_only, None, check_timeout=5).results


def test_report_and_summary_show_the_simple_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from chaos.cli import _print_run
    from chaos.linearizability import CheckInfo, CheckResult
    from chaos.models import QueueLogModel
    from chaos.report import render_html

    empty = CheckInfo(CheckResult.OK, [], 0.0, False, 0)
    valid = check_lines([])
    page = render_html(QueueLogModel(), empty, simple=valid)
    assert page.index("<h2>Timeline") < page.index("<h2>Simple consumers")
    bad = {**valid, "valid": False, "double_holding": 1,
           "examples": {"double_holding": [{"body": "x", "early_ms": 900.0}]}}
    page = render_html(QueueLogModel(), empty, simple=bad)
    assert page.index("<h2>Simple consumers") < page.index("<h2>Timeline")
    assert "double_holding: 1" in page and "early_ms" in page

    monkeypatch.setenv("COLUMNS", "400")
    _print_run({"valid": False, "verdict": "invalid", "problems": ["simple: double_holding: 1"],
                "operations": {}, "faults": {}, "linearizable": {},
                "simple": {**bad, "messages": {"sent": 9, "acknowledged": 8, "deliveries": 12,
                                               "redeliveries": 3, "acked": 6,
                                               "dead_letters": 2}}},
               tmp_path)
    out = " ".join(capsys.readouterr().out.split())
    for text in ("simple: double_holding: 1", "9 sent, 8 acknowledged, 12 deliveries (3 again), "
                 "6 acked, 2 dead letters", "lost 0, acked_then_delivered 0", "double_holding 1"):
        assert text in out, (text, out)


# ------------------------------------------------------------------ live runs

SIMPLE_SECONDS = float(os.environ.get("CHAOS_SIMPLE_SECONDS", "12"))


def test_simple_workload_needs_nodes_the_harness_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('namesrv = "127.0.0.1:1"\n[nodes.1]\nagent = "127.0.0.1:2"\n')
    assert run_main(["--out", str(tmp_path / "out"), "--workload", "simple", "--cluster",
                     str(cluster), "--nemesis", "kill"]) == EXIT_USAGE
    assert "--workload simple needs nodes the harness starts" in capsys.readouterr().err


@pytest.mark.live
def test_simple_smoke_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = run_main(["--out", str(out), "--workload", "simple", "--time", str(SIMPLE_SECONDS),
                     "--seed", "3", "--nemesis", "kill", "--drain-timeout", "40", "--json"])
    results = _results(out)
    s = results["simple"]
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] is True and s["valid"] is True
    msgs = s["messages"]
    # every way to settle happened, so the checks were not vacuous
    assert msgs["acknowledged"] > 50 and msgs["redeliveries"] > 0, msgs
    assert msgs["always_fail"] > 0 and msgs["max_deliveries_reached"] > 0, msgs
    assert msgs["dead_letters"] >= msgs["max_deliveries_reached"], msgs
    settled = s["settled"]
    assert settled["ack"]["ok"] > 0 and settled["nack"]["ok"] > 0, settled
    assert settled["dead"]["ok"] > 0 and settled["change"]["ok"] > 0, settled
    assert sum(s["late_acks"].values()) > 0 and s["dlq_read"] is True, s
    assert results["run"]["simple_load"]["worker_starts"] >= 2  # a consumer was killed
    assert {f.f for f in parse_faults(out / "history.jsonl")} == {"kill"}
    assert "Simple consumers" in (out / "report.html").read_text()
    _recheck(out, 0, capsys)


@pytest.mark.live
def test_an_ack_applied_to_a_later_delivery_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """`ack-later-delivery`: the late acks of stalled consumers, whose messages were
    delivered again meanwhile, are answered ok (`stale_acks_accepted`), with no fault."""
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")
    out = tmp_path / "run"
    results = run_chaos(RunOptions(
        out=out, workload="simple", time=SIMPLE_SECONDS, seed=1, nemesis=(),
        mutations=("ack-later-delivery",), check_timeout=20, drain_timeout=40,
    ))
    s = results["simple"]
    kind = "stale_acks_accepted"
    assert results["verdict"] == "invalid", json.dumps(results, indent=1)[:4000]
    assert s["valid"] is False and s[kind] > 0, json.dumps(s, indent=1)[:4000]
    assert f"simple: {kind}: {s[kind]}" in results["problems"]
    html = (out / "report.html").read_text()
    assert "Simple consumers" in html and "invalid" in html
    _recheck(out, 1, capsys)
