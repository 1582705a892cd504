"""`chaos.analysis` on hand-written histories: each scenario is a short script of client
operations (and faults) written through the real `Recorder`, then analysed from the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos.analysis import analyze
from chaos.recorder import Recorder

GROUPS = {"t/0": "g0", "t/1": "g1"}


class Script:
    """Writes a history with explicit times: `at(t)` sets the clock for the next lines."""

    def __init__(self, path: Path) -> None:
        self.now = 0.0
        self.rec = Recorder(path, clock=lambda: self.now)

    def at(self, t: float) -> Recorder:
        self.now = t
        return self.rec

    def append(self, p: int, key: str, msg: str, t0: float, t1: float, offset: int | None,
               outcome: str = "ok", attempts: tuple[float, ...] = ()) -> None:
        self.at(t0).invoke(p, "append", key, msg)
        for t in attempts:  # the requests the SDK sent for it
            self.at(t).attempt(p, "append", key, msg)
        value = {"offset": offset} if outcome == "ok" else None
        self.at(t1).complete(p, outcome, "append", key, value)

    def read(self, p: int, key: str, offset: int, n: int, t0: float, t1: float,
             got: list[str]) -> None:
        self.at(t0).invoke(p, "read", key, {"offset": offset, "n": n})
        self.at(t1).complete(p, "ok", "read", key, got)


def run(path: Path, **kw: Any) -> Any:
    analysis = analyze(path, queue_groups=GROUPS, check_timeout=kw.pop("check_timeout", 10.0), **kw)
    json.dumps(analysis.results)  # results.json must be writable as it is
    return analysis


def test_clean_run_is_valid(tmp_path: Path) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(0, "t/0", "p0-0", 1, 2, 0)
    s.append(2, "t/0", "i2-0", 1.5, 2.5, 1)
    s.read(4, "t/0", 0, 4, 2.2, 2.3, ["p0-0"])  # before i2-0 took effect: fine
    s.append(2, "t/1", "i2-1", 3, 4, 0)
    s.append(0, "t/1", "p0-1", 3.5, 3.6, None, outcome="info")  # unknown, never read
    s.append(1, "t/1", "p1-0", 3.5, 3.6, None, outcome="fail")
    s.read(5, "t/0", 0, 256, 10, 11, ["p0-0", "i2-0"])  # drain
    s.read(6, "t/1", 0, 256, 10, 11, ["i2-1"])
    a = run(h)
    r = a.results
    assert a.valid and r["verdict"] == "valid" and r["problems"] == []
    assert r["lost"] == 0 and r["duplicated"] == 0 and r["unexpected"] == 0
    assert r["linearizable"] == {"t/0": True, "t/1": True}
    assert r["drained"] == {"t/0": True, "t/1": True}
    assert r["operations"] == {
        "append": {"ok": 3, "fail": 1, "info": 1},
        "read": {"ok": 3, "fail": 0, "info": 0},
    }
    assert r["faults"] == {} and r["longest_unavailability"] is None


def test_lost_acknowledged_message_is_invalid(tmp_path: Path) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(0, "t/0", "p0-0", 1, 2, 0)
    s.append(0, "t/0", "p0-1", 3, 4, 1)
    s.read(5, "t/0", 0, 256, 10, 11, ["p0-0"])  # the drain finds the log ends at 1
    r = run(h).results
    assert not r["valid"] and r["verdict"] == "invalid"
    assert r["lost"] == 1 and "lost: 1" in r["problems"]
    assert r["examples"]["t/0"]["lost"] == ["p0-1"]
    assert r["linearizable"]["t/0"] is False


def test_definitely_failed_append_that_was_read_is_invalid(tmp_path: Path) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(0, "t/0", "p0-0", 1, 2, None, outcome="fail")
    s.append(1, "t/0", "p1-0", 1, 2, None, outcome="info")
    s.read(5, "t/0", 0, 256, 10, 11, ["p0-0", "p1-0"])
    r = run(h).results
    assert r["failed_but_read"] == 1 and r["recovered"] == 1 and not r["valid"]


@pytest.mark.parametrize(
    ("msg", "attempts", "valid", "idem", "retried", "unretried"),
    [
        ("i2-0", (), False, 1, 0, 0),  # an idempotent producer promised one copy
        ("p0-0", (1.1, 3.0), True, 0, 1, 0),  # a plain producer's retry: at least once
        ("p0-0", (1.1, 2.0, 3.0), True, 0, 1, 0),  # retried twice, stored twice: fine too
        ("p0-0", (1.1,), False, 0, 0, 1),  # sent once, stored twice: the cluster did it
        ("p0-0", (), False, 0, 0, 1),  # no attempt recorded: one copy per append
    ],
)
def test_duplicates_by_producer_kind_and_attempts(
    tmp_path: Path, msg: str, attempts: tuple[float, ...], valid: bool, idem: int,
    retried: int, unretried: int,
) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    process = int(msg[1])
    # the first try timed out inside the SDK and landed at 0; the last was acknowledged at 1
    s.append(process, "t/0", msg, 1, 5, 1, attempts=attempts)
    s.append(1, "t/0", "p1-0", 6, 7, 2, attempts=(6.1,))
    s.read(5, "t/0", 0, 256, 10, 11, [msg, msg, "p1-0"])
    a = run(h)
    r = a.results
    assert (r["duplicated"], r["duplicated_retried"], r["duplicated_unretried"], r["valid"]) \
        == (idem, retried, unretried, valid)
    assert r["duplicated_plain"] == retried + unretried
    assert r["attempts"] == len(attempts) + 1
    assert a.accounting["totals"]["duplicated"] == idem
    # a retry explains one more copy; nothing explains a copy beyond the attempts
    assert r["linearizable"]["t/0"] is bool(retried)
    if unretried:
        assert "duplicated_unretried: 1" in r["problems"]
        example = r["examples"]["t/0"]["duplicated_unretried"]
        assert example == {msg: {"offsets": [0, 1], "attempts": 1}}
        report = a.write_report(tmp_path / "report.html").read_text()
        assert "<div class=bad>duplicated_unretried: 1</div>" in report


def test_a_second_copy_needs_its_attempt_to_have_been_sent(tmp_path: Path) -> None:
    """Two attempts explain two copies, but only once the second was sent: a read that
    saw both copies before the retry left shows the cluster copied the message itself."""
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(0, "t/0", "p0-0", 1, 5, 1, attempts=(1.1, 3.0))
    s.read(4, "t/0", 0, 4, 2.0, 2.5, ["p0-0", "p0-0"])  # both copies, at 2.5 < 3.0
    s.read(5, "t/0", 0, 256, 10, 11, ["p0-0", "p0-0"])
    r = run(h).results
    assert r["duplicated_retried"] == 1 and r["duplicated_unretried"] == 0  # counts agree
    assert r["linearizable"]["t/0"] is False and not r["valid"]  # the times do not


def test_idempotent_processes_can_be_named_instead_of_read_from_ids(tmp_path: Path) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(7, "t/0", "m-a", 1, 5, 1)
    s.read(5, "t/0", 0, 256, 10, 11, ["m-a", "m-a"])
    assert run(h, idempotent_processes={7}).results["duplicated"] == 1
    assert run(h, idempotent_processes=set()).results["duplicated_plain"] == 1


def test_stale_read_is_not_linearizable(tmp_path: Path) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(0, "t/0", "p0-0", 1, 2, 0)
    s.read(4, "t/0", 0, 4, 3, 4, [])  # began after the append was acknowledged: stale
    s.read(5, "t/0", 0, 256, 10, 11, ["p0-0"])
    a = run(h)
    r = a.results
    assert r["lost"] == 0 and r["drained"]["t/0"]  # the accounting sees nothing wrong
    assert r["linearizable"]["t/0"] is False
    assert not a.valid and "not linearizable: t/0" in r["problems"]
    failure = r["linearizability"]["first_failure"]
    assert failure["key"] == "t/0" and "read" in failure["operation"]["description"]


def test_search_out_of_time_is_unknown_not_valid(tmp_path: Path) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    n = 3000  # more search steps than one slice, so the deadline is looked at
    for i in range(n):
        s.append(0, "t/0", f"p0-{i}", 2 * i, 2 * i + 1, i)
    s.read(5, "t/0", 0, 1024, 3 * n, 3 * n + 1, [f"p0-{i}" for i in range(1024)])
    a = analyze(h, queue_groups=GROUPS, check_timeout=1e-9)
    assert a.verdict == "unknown" and not a.valid and a.results["problems"] == []
    assert a.results["linearizable"]["t/0"] is None


def test_unavailability_after_leader_loss(tmp_path: Path) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(0, "t/0", "p0-0", 0, 1, 0)
    s.at(10).fault_start("kill", {"nodes": [1], "leaders": {"g0": 1}})
    s.append(0, "t/0", "p0-1", 9.5, 10.2, 1)  # in flight at the kill: does not count
    s.append(1, "t/1", "p1-0", 10.5, 10.6, 0)  # another group
    s.append(0, "t/0", "p0-2", 11, 13.5, 2)  # the group is back 3.5 s after the kill
    s.append(0, "t/0", "p0-3", 14, 14.1, 3)
    s.at(15).fault_end("kill", {"nodes": [1]})  # the end's value may drop the leaders
    s.at(20).fault_start("pause", {"nodes": [2], "leaders": {"g0": 2, "g1": 2}})
    s.append(1, "t/1", "p1-1", 20.5, 21, 1)  # g1 back after 1 s; g0 never
    s.at(25).fault_end("pause")
    s.at(26).fault_start("partition", {"halves": [[1], [2, 3]]})  # took no leader
    s.at(27).fault_end("partition")
    s.read(5, "t/0", 0, 256, 30, 31, ["p0-0", "p0-1", "p0-2", "p0-3"])
    s.read(6, "t/1", 0, 256, 30, 31, ["p1-0", "p1-1"])
    a = run(h)
    r = a.results
    assert r["valid"]
    assert r["faults"] == {"kill": 1, "partition": 1, "pause": 1}
    kill, pause = r["unavailability"]
    assert kill["groups"] == {"g0": 3.5} and kill["longest"] == 3.5 and kill["recovered"]
    assert pause["groups"] == {"g0": None, "g1": 1.0} and not pause["recovered"]
    assert pause["longest"] == 11.0  # g0 counted until the history ends, a lower bound
    assert r["longest_unavailability"] == 11.0 and r["unrecovered_faults"] == 1
    assert [name for _s, _e, name in a.report_faults] == ["kill [1]", "pause [2]", "partition"]


def test_without_queue_appends_availability_is_not_measured(tmp_path: Path) -> None:
    """A history with faults but no queue append (a `--workload txn` run) says nothing
    about availability, rather than every fault looking unrecovered to the end."""
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.at(10).fault_start("kill", {"nodes": [1], "leaders": {"g0": 1}})
    s.at(15).fault_end("kill", {"nodes": [1]})
    s.at(60).fault_start("pause", {"nodes": [2], "leaders": {"g1": 2}})
    s.at(61).fault_end("pause")
    r = run(h).results
    assert r["faults"] == {"kill": 1, "pause": 1}
    assert r["unavailability"] == [] and r["longest_unavailability"] is None
    assert r["unrecovered_faults"] == 0 and r["liveness_violations"] == []


@pytest.mark.parametrize("back_after", [3.0, None, 25.0])
def test_a_group_that_accepts_no_write_within_the_bound_after_a_heal_is_invalid(
    tmp_path: Path, back_after: float | None
) -> None:
    """Liveness: a leader cut off that kept acting as leader forever passes every safety
    check; the bound on writes after a heal does not."""
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(0, "t/0", "p0-0", 0, 1, 0)
    s.at(2).fault_start("partition-node", {"nodes": [1], "leaders": {"g0": 1}})
    s.at(5).fault_end("partition-node")
    offset = 1
    for k in range(30):  # g1 keeps accepting writes; g0's fail until `back_after`
        t = 5.5 + k
        s.append(1, "t/1", f"p1-{k}", t, t + 0.1, k)
        if back_after is not None and t >= 5 + back_after:
            s.append(0, "t/0", f"p0-{offset}", t, t + 0.1, offset)
            offset += 1
        else:
            s.append(0, "t/0", f"p0-x{k}", t, t + 0.5, None, outcome="fail")
    s.read(5, "t/0", 0, 256, 40, 41, [f"p0-{i}" for i in range(offset)])
    s.read(6, "t/1", 0, 256, 40, 41, [f"p1-{k}" for k in range(30)])
    r = run(h, liveness_bound=10.0).results
    row = r["unavailability_by_fault"]["partition-node"]
    assert row["faults"] == 1
    assert (row["worst_during"] is None) == (back_after is None)
    if back_after == 3.0:
        assert r["valid"] and r["liveness_violations"] == [] and row["unrecovered"] == 0
        assert row["worst_after_heal"] == pytest.approx(3.6, abs=0.01)
    else:
        assert not r["valid"]
        (problem,) = [p for p in r["liveness_violations"] if "healed" in p]
        assert problem.startswith("liveness: group g0 accepted no write within 10 s after "
                                  "partition-node [1] healed")
        assert problem in r["problems"]
        # and from its start, since a majority stayed connected all along
        assert len(r["liveness_violations"]) == 2 and row["unrecovered"] == 2


def test_without_the_runs_groups_liveness_is_not_judged(tmp_path: Path) -> None:
    """A history re-checked without its results.json cannot tell which group acknowledged
    an append: no group is said to have accepted no write (every one was, before)."""
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(0, "t/0", "p0-0", 0, 1, 0)
    s.at(2).fault_start("partition-node", {"nodes": [1], "leaders": {"g0": 1}})
    s.at(5).fault_end("partition-node")
    for k in range(30):
        s.append(0, "t/0", f"p0-{k + 1}", 5.5 + k, 5.6 + k, k + 1)
    s.read(5, "t/0", 0, 256, 40, 41, [f"p0-{k}" for k in range(31)])
    r = analyze(h, queue_groups={}, check_timeout=10.0, liveness_bound=10.0).results
    assert r["valid"] and r["liveness_violations"] == [], r["problems"]
    judged = run(h, liveness_bound=10.0).results["liveness_violations"]
    assert judged and not any("group g0" in p for p in judged), judged  # g0 came back


def test_while_a_majority_is_connected_a_group_must_accept_writes_within_the_bound(
    tmp_path: Path,
) -> None:
    """A long partition of the leader: the majority must serve writes before it heals."""
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.at(1).fault_start("partition-node", {"nodes": [1], "leaders": {"g0": 1}})
    s.at(1).fault_start("partition-clients", {"nodes": [2], "leaders": {"g1": 2}})
    for k in range(30):  # neither group acknowledges anything for 30 s
        t = 1.5 + k
        s.append(0, "t/0", f"p0-x{k}", t, t + 0.5, None, outcome="fail")
        s.append(1, "t/1", f"p1-x{k}", t, t + 0.5, None, outcome="fail")
    s.at(32).fault_end("partition-node")
    s.at(32).fault_end("partition-clients")
    for k in range(5):
        s.append(0, "t/0", f"p0-{k}", 33 + k, 33.1 + k, k)
        s.append(1, "t/1", f"p1-{k}", 33 + k, 33.1 + k, k)
    s.read(5, "t/0", 0, 256, 40, 41, [f"p0-{k}" for k in range(5)])
    s.read(6, "t/1", 0, 256, 40, 41, [f"p1-{k}" for k in range(5)])
    r = run(h, liveness_bound=10.0).results
    # only the fault that left a connected majority for g0; clients cut from g1's
    # leader are no reason for the nodes to elect another
    assert r["liveness_violations"] == [
        "liveness: group g0 accepted no write within 10 s of the start of partition-node "
        "[1], with a majority connected"
    ]
    assert not r["valid"]


def test_report_renders_with_faults(tmp_path: Path) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.at(0.5).fault_start("kill", {"nodes": [1], "leaders": {"g0": 1}})  # never healed
    s.append(0, "t/0", "p0-0", 1, 2, 0)
    s.read(5, "t/0", 0, 256, 3, 4, ["p0-0"])
    a = run(h)
    assert a.report_faults == [(0.5, 4.0, "kill [1]")]
    out = a.write_report(tmp_path / "report.html")
    text = out.read_text()
    assert "linearizable" in text and "kill [1]" in text
    assert "Unavailability per fault" in text and "<td>kill</td><td>1</td>" in text


@pytest.mark.parametrize("stale", [False, True])
def test_committed_offsets_are_checked_as_registers(tmp_path: Path, stale: bool) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    key = ["cg0", "t/0"]
    s.at(1).invoke(8, "read", key, None)
    s.at(2).complete(8, "ok", "read", key, None)  # nothing committed yet
    s.at(3).invoke(8, "commit", key, 1)
    s.at(4).complete(8, "ok", "commit", key)
    s.at(5).invoke(9, "commit", key, 2)
    s.at(6).complete(9, "info", "commit", key, {"error": "TIMEOUT"})  # may land any time
    s.at(7).invoke(8, "read", key, None)
    s.at(8).complete(8, "ok", "read", key, 2)
    s.at(9).invoke(8, "read", key, None)
    s.at(10).complete(8, "ok", "read", key, 1 if stale else 2)  # went back: stale
    s.append(0, "t/0", "p0-0", 11, 12, 0)
    s.read(5, "t/0", 0, 256, 13, 14, ["p0-0"])
    a = run(h)
    r = a.results
    assert r["operations"]["commit"] == {"ok": 1, "fail": 0, "info": 1}
    assert r["operations"]["read-offset"] == {"ok": 3, "fail": 0, "info": 0}
    assert r["operations"]["read"] == {"ok": 1, "fail": 0, "info": 0}
    assert r["linearizable"] == {"t/0": True}
    assert r["offsets_linearizable"] == {"cg0:t/0": not stale}
    assert a.valid is not stale
    if stale:
        assert r["problems"] == ["committed offset not linearizable: cg0:t/0"]
        text = a.write_report(tmp_path / "report.html").read_text()
        assert "consumer offsets" in text


@pytest.mark.parametrize("read_back", [True, False])
def test_acknowledged_without_offset_must_still_be_in_the_log(
    tmp_path: Path, read_back: bool
) -> None:
    h = tmp_path / "h.jsonl"
    s = Script(h)
    s.append(0, "t/0", "p0-0", 1, 2, 0)
    s.at(3).invoke(2, "append", "t/0", "i2-0")  # a resend recognised without its offset
    s.at(4).complete(2, "ok", "append", "t/0", {"dup": True})
    s.read(5, "t/0", 0, 256, 10, 11, ["p0-0", "i2-0"] if read_back else ["p0-0"])
    r = run(h).results
    assert r["operations"]["append"] == {"ok": 2, "fail": 0, "info": 0}
    assert r["valid"] is read_back
    assert r["lost"] == (0 if read_back else 1)
    assert r["linearizable"]["t/0"] is read_back


@pytest.mark.parametrize("lost", [None, "grow", "delete", "group-delete"])
def test_admin_changes_are_checked_and_a_lost_one_is_invalid(
    tmp_path: Path, lost: str | None
) -> None:
    """A topic created, grown and deleted, and a consumer group deleted: each change
    acknowledged and then not seen by a later read is caught (rolled back, or lost)."""
    h = tmp_path / "h.jsonl"
    s = Script(h)
    topic, key = "topic:adm", ["cg0", "t/0"]

    def op(p: int, t: float, f: str, k: Any, value: Any, result: Any,
           outcome: str = "ok") -> None:
        s.at(t).invoke(p, f, k, value)
        s.at(t + 0.5).complete(p, outcome, f, k, result)

    op(7, 1, "read", topic, None, None)
    op(7, 2, "create", topic, 1, "ok")
    op(7, 3, "create", topic, 2, "exists")  # a refusal says it existed
    op(7, 4, "grow", topic, 3, "ok")
    op(8, 4.2, "grow", topic, 4, {"error": "TIMEOUT"}, "info")  # may land, or never
    op(7, 5, "read", topic, None, 2 if lost == "grow" else 3)  # rolled back to 2?
    op(7, 6, "grow", topic, 2, "refused")  # not below 3
    op(7, 7, "delete", topic, None, "ok")
    op(7, 8, "read", topic, None, 3 if lost == "delete" else None)
    op(7, 9, "delete", topic, None, "missing")
    op(9, 10, "commit", key, 5, None)
    op(9, 11, "delete", key, None, None)  # the consumer group deleted
    op(9, 12, "read", key, None, 5 if lost == "group-delete" else None)
    s.append(0, "t/0", "p0-0", 13, 14, 0)
    s.read(5, "t/0", 0, 256, 15, 16, ["p0-0"])
    a = run(h)
    r = a.results
    assert r["operations"]["topic-grow"] == {"ok": 2, "fail": 0, "info": 1}
    assert r["operations"]["delete-group"] == {"ok": 1, "fail": 0, "info": 0}
    assert r["topics_linearizable"] == {topic: lost not in ("grow", "delete")}
    assert r["offsets_linearizable"] == {"cg0:t/0": lost != "group-delete"}
    assert a.valid is (lost is None), r["problems"]
    if lost in ("grow", "delete"):
        assert r["problems"] == [f"topic config not linearizable: {topic}"]


def test_first_acknowledgement_after_a_time_matches_a_plain_scan() -> None:
    """The availability index (sorted calls, suffix minima of the acknowledgements) answers
    what scanning every acknowledged append would."""
    import random
    from array import array

    from chaos.analysis import _ack_index, _first_ack_after

    rng = random.Random(7)
    pairs = [(c, c + rng.random() * 3) for c in (rng.uniform(0, 50) for _ in range(400))]
    pairs += [(10.0, 11.0), (10.0, 10.5)]  # equal calls
    flat = array("d", [x for pair in pairs for x in pair])
    index = _ack_index({"g0": flat})
    for t in [rng.uniform(-1, 52) for _ in range(300)] + [10.0, 50.0]:
        expected = min((r for c, r in pairs if c >= t), default=None)
        assert _first_ack_after(index, "g0", t) == expected, t
    assert _first_ack_after(index, "g1", 0.0) is None


def _retried_send_read_at_its_first_copy(h: Path) -> Script:
    """A plain producer's send timed out (its first copy landed at 0) and was retried;
    the retry was acknowledged at 2. A read covered 0 and 1, nothing covered 2 yet."""
    s = Script(h)
    s.append(0, "t/0", "p0-0", 1, 5, 2, attempts=(1.1, 3.0))
    s.append(1, "t/0", "p1-0", 1.5, 2, 1, attempts=(1.6,))
    s.read(5, "t/0", 0, 2, 6, 7, ["p0-0", "p1-0"])
    return s


def test_an_acknowledged_offset_no_read_covered_is_unread_not_a_mismatch(
        tmp_path: Path) -> None:
    """The copy read (at 0) is the retry's first; the acknowledged one (at 2) was never
    read, so the acknowledgement is not contradicted: the message counts as unread (which
    `chaos check` turns into an unknown verdict), and the queue is linearizable, one copy
    per attempt."""
    h = tmp_path / "h.jsonl"
    _retried_send_read_at_its_first_copy(h)
    a = run(h)
    r = a.results
    assert r["ack_mismatches"] == 0 and r["unread"] == 1, r["problems"]
    assert r["linearizable"]["t/0"] is True
    assert a.valid and r["problems"] == []


def test_an_acknowledged_offset_past_the_end_a_later_read_saw_is_a_mismatch(
        tmp_path: Path) -> None:
    """The same, but a read called after the acknowledgement came back short at 2: the
    log never reached the offset acknowledged, so the acknowledgement was wrong."""
    h = tmp_path / "h.jsonl"
    s = _retried_send_read_at_its_first_copy(h)
    s.read(6, "t/0", 0, 256, 8, 9, ["p0-0", "p1-0"])
    r = run(h).results
    assert r["ack_mismatches"] == 1 and r["unread"] == 0
    assert r["linearizable"]["t/0"] is False and not r["valid"]
