"""Long histories: the reductions that keep the queue-log check linear, checked against the
unreduced search, and the analysis of synthetic histories of several lengths."""

from __future__ import annotations

import random
from typing import Any

import pytest

from chaos.linearizability import CheckResult, check_operations
from chaos.model import INFINITY, UNKNOWN, Operation
from chaos.models import (
    LogState,
    QueueLogModel,
    drop_unseen_appends,
    pin_read_appends,
    quiescent_segments,
)


def _random_queue_history(rng: random.Random, corrupt: bool) -> list[Operation]:
    """A small concurrent queue history from a correct log, with timed-out appends (some
    took effect, some not) and often a final drain; `corrupt` then damages one output."""
    log: list[str] = []
    ops: list[Operation] = []
    clients = rng.randint(2, 4)
    t = 0.0
    pending: list[tuple[int, tuple, float, Any, float]] = []
    for k in range(rng.randint(3, 12)):
        client = k % clients
        call = t + rng.random()
        ret = call + rng.random() * 2
        lin = call + (ret - call) * rng.random()
        if rng.random() < 0.55:
            msg = f"m{k}"
            timed_out = rng.random() < 0.35
            effect = not timed_out or rng.random() < 0.5
            pending.append((client, ("append", "q", msg), call, (lin, effect), INFINITY
                            if timed_out else ret))
        else:
            pending.append((client, ("read", "q", rng.randint(0, 4), rng.randint(1, 4)), call,
                            (lin, True), ret))
        t += rng.random() * 0.7
    # apply effects in linearization-point order
    outputs: dict[int, Any] = {}
    for i in sorted(range(len(pending)), key=lambda i: pending[i][3][0]):
        _client, inp, _call, (_lin, effect), _ret = pending[i]
        if inp[0] == "append":
            if effect:
                outputs[i] = len(log)
                log.append(inp[2])
        else:
            outputs[i] = tuple(log[inp[2] : inp[2] + inp[3]])
    for i, (client, inp, call, _x, ret) in enumerate(pending):
        out = outputs.get(i, UNKNOWN) if ret != INFINITY else UNKNOWN
        ops.append(Operation(client, inp, call, out, ret))
    if rng.random() < 0.7:  # a drain after everything
        start = t + 10
        for offset in range(0, len(log) + 1, 3):
            ops.append(Operation(9, ("read", "q", offset, 3), start, tuple(log[offset:offset + 3]),
                                 start + 0.5))
            start += 1
    if corrupt and ops:
        i = rng.randrange(len(ops))
        op = ops[i]
        if op.input[0] == "append" and isinstance(op.output, int):
            ops[i] = Operation(op.client_id, op.input, op.call, op.output + rng.choice((-1, 1)),
                               op.return_)
        elif op.input[0] == "read" and isinstance(op.output, tuple) and op.output:
            ops[i] = Operation(op.client_id, op.input, op.call, op.output[:-1], op.return_)
    return ops


def _verdict(ops: list[Operation]) -> CheckResult:
    return check_operations(QueueLogModel(), ops).result


@pytest.mark.parametrize("corrupt", [False, True])
def test_dropping_unseen_appends_keeps_every_verdict(corrupt: bool) -> None:
    rng = random.Random(11 + corrupt)
    verdicts = {CheckResult.OK: 0, CheckResult.ILLEGAL: 0}
    dropped_some = 0
    for _ in range(1500):
        ops = pin_read_appends(_random_queue_history(rng, corrupt))
        reduced = drop_unseen_appends(ops)
        dropped_some += len(reduced) < len(ops)
        full = _verdict(ops)
        assert _verdict(reduced) is full, ops
        verdicts[full] += 1
    assert dropped_some > 100
    if corrupt:
        assert verdicts[CheckResult.ILLEGAL] > 200  # the comparison covers illegal histories
    else:
        assert verdicts == {CheckResult.OK: 1500, CheckResult.ILLEGAL: 0}


def _segmented_verdict(ops: list[Operation]) -> CheckResult:
    results = set()
    for initial, segment in quiescent_segments(ops):
        results.add(check_operations(QueueLogModel(initial=initial), segment).result)
    if CheckResult.ILLEGAL in results:
        return CheckResult.ILLEGAL
    return CheckResult.OK if results <= {CheckResult.OK} else CheckResult.UNKNOWN


@pytest.mark.parametrize("corrupt", [False, True])
def test_checking_quiescent_segments_one_by_one_keeps_every_verdict(corrupt: bool) -> None:
    rng = random.Random(21 + corrupt)
    verdicts = {CheckResult.OK: 0, CheckResult.ILLEGAL: 0}
    split = 0
    for _ in range(2000):
        ops = drop_unseen_appends(pin_read_appends(_random_queue_history(rng, corrupt)))
        segments = quiescent_segments(ops)
        assert sorted(op.call for _s, seg in segments for op in seg) == sorted(
            op.call for op in ops)
        split += len(segments) > 1
        full = _verdict(ops)
        assert _segmented_verdict(ops) is full, ops
        verdicts[full] += 1
    assert split > 500  # most histories have quiet moments
    if corrupt:
        assert verdicts[CheckResult.ILLEGAL] > 300
    else:
        assert verdicts == {CheckResult.OK: 2000, CheckResult.ILLEGAL: 0}


def test_no_cut_while_a_pinned_append_may_still_land_or_an_offset_is_unknown() -> None:
    ops = [
        Operation(0, ("append", "q", "a"), 0.0, 0, 1.0),
        Operation(1, ("append", "q", "b"), 0.5, 1, INFINITY),  # pinned, last: may land late
        Operation(2, ("read", "q", 0, 5), 2.0, ("a",), 3.0),  # legal only before b lands
        Operation(2, ("read", "q", 0, 5), 4.0, ("a", "b"), 5.0),
    ]
    assert len(quiescent_segments(ops)) == 1
    assert _verdict(ops) is CheckResult.OK
    acked = [Operation(0, ("append", "q", "a"), 0.0, 0, 1.0),
             Operation(1, ("append", "q", "b"), 1.5, UNKNOWN, 2.0),  # ok without an offset
             Operation(2, ("read", "q", 0, 5), 3.0, ("a", "b"), 4.0)]
    assert [len(seg) for _s, seg in quiescent_segments(acked)] == [1, 2]
    quiet = [Operation(0, ("append", "q", "a"), 0.0, 0, 1.0),
             Operation(1, ("append", "q", "b"), 2.0, 1, 3.0),
             Operation(2, ("read", "q", 0, 5), 4.0, ("a", "b"), 5.0)]
    segments = quiescent_segments(quiet)
    assert [len(seg) for _s, seg in segments] == [1, 1, 1]
    assert [tuple(s) for s, _seg in segments] == [(), ("a",), ("a", "b")]


def test_an_unseen_append_that_fills_an_unread_offset_is_kept() -> None:
    # nobody read offset 0, so the timed-out append may be what sits there: keep it
    ops = [
        Operation(0, ("append", "q", "a"), 0.0, UNKNOWN, INFINITY),
        Operation(1, ("append", "q", "b"), 1.0, 1, 2.0),
        Operation(2, ("read", "q", 1, 5), 3.0, ("b",), 4.0),
    ]
    assert drop_unseen_appends(ops) == ops
    assert _verdict(ops) is CheckResult.OK
    drained = [*ops, Operation(2, ("read", "q", 0, 5), 5.0, ("x", "b"), 6.0)]
    assert drop_unseen_appends(drained) == drained[1:]


def _dead_group_history(pending: int) -> list[Operation]:
    """A queue whose group lost its quorum for good: 40 appends acknowledged and read, then
    `pending` appends that timed out, which nobody read (the drain never got through, so
    none can be left out: the reads do not cover offsets 40 and 41)."""
    ops = [Operation(k % 4, ("append", "q", f"a{k}"), float(k), k, k + 0.5) for k in range(42)]
    ops += [Operation(5, ("read", "q", 0, 40), 42.0, tuple(f"a{k}" for k in range(40)), 42.5)]
    ops += [Operation(k % 8, ("append", "q", f"t{k}"), 43.0 + k, UNKNOWN, INFINITY)
            for k in range(pending)]
    return ops


def test_appends_pending_after_everything_else_cost_one_step_each_at_most() -> None:
    """Appends of unknown outcome left after the last operation that returned all go last
    at once: linearizing them one by one walked every entry still listed each time, so a
    group that lost its quorum (116,000 of them in a two-hour run) never finished."""
    ops = drop_unseen_appends(pin_read_appends(_dead_group_history(3000)))
    assert len(ops) == 3043
    model = QueueLogModel()
    info = check_operations(model, ops)
    assert info.result is CheckResult.OK
    assert info.steps < 10 * len(ops), info.steps  # quadratic: about 4.5 million
    part = info.partitions[0]
    assert sorted(part.linearization) == list(range(len(ops)))  # complete, and it replays
    state = model.init()
    for i in part.linearization:
        ok, state = model.step(state, ops[i].input, ops[i].output)
        assert ok
    # an append pinned to an offset is no free one: it still has to fit, and here cannot
    stale = [*ops, Operation(9, ("append", "q", "a0"), 50.0, 0, INFINITY)]
    assert check_operations(model, stale).result is CheckResult.ILLEGAL
    late = [*ops[:43], Operation(9, ("append", "q", "x"), 50.0, 42, INFINITY), *ops[43:]]
    assert check_operations(model, late).result is CheckResult.OK


def test_log_state_reads_any_offset() -> None:
    messages = [f"m{i}" for i in range(1000)]
    state = LogState.of(messages)
    rng = random.Random(3)
    for _ in range(300):
        a = rng.randrange(1001)
        b = rng.randrange(a, 1002)
        assert state.window(a, b) == tuple(messages[a:b])
    assert state[999] == "m999" and state[0] == "m0" and list(state)[:3] == messages[:3]


FACTS = {
    "queue_groups": {f"chaos/{q}": f"g{q % 3}" for q in range(6)},
    "unexpected_exits": {},
    "drained": True,
}


def test_a_synthetic_history_is_valid_and_each_corruption_is_caught(tmp_path: Any) -> None:
    from chaos.analysis import analyze_run
    from chaos.synthetic import write_history

    expected = {
        None: [],
        "lost": ["lost:"],
        "duplicate": ["duplicated_unretried:"],
        "stale": ["not linearizable"],
    }
    for corrupt, problems in expected.items():
        path = tmp_path / f"{corrupt}.jsonl"
        write_history(path, seconds=6, seed=2, corrupt=corrupt, fault_every=2.0)
        results = analyze_run(path, FACTS, check_timeout=60).results
        for problem in problems:
            assert any(p.startswith(problem) for p in results["problems"]), (corrupt, results)
        assert results["verdict"] == ("valid" if corrupt is None else "invalid"), results
        assert results["faults"] == {"kill": 2} and results["operations"]["append"]["info"] > 0


def test_a_queue_whose_search_outgrows_its_memory_budget_has_no_verdict_and_says_why(
    tmp_path: Any,
) -> None:
    from chaos.analysis import CONFIGURATION_BYTES, analyze_run
    from chaos.synthetic import write_history

    path = tmp_path / "history.jsonl"
    write_history(path, seconds=4, seed=3, fault_every=2.0)
    assert analyze_run(path, FACTS, check_timeout=60).results["verdict"] == "valid"
    results = analyze_run(path, FACTS, check_timeout=60,
                          search_memory=50 * CONFIGURATION_BYTES).results
    assert results["verdict"] == "unknown" and not results["problems"], results["problems"]
    assert set(results["linearizable"].values()) == {None}
    assert set(results["unknown"]) == set(results["linearizable"]), results["unknown"]
    assert all("memory budget: more than 50 configurations" in reason
               for reason in results["unknown"].values()), results["unknown"]
    late = analyze_run(path, FACTS, check_timeout=1e-9).results  # and out of time
    assert late["verdict"] == "unknown" and set(late["unknown"]) == set(late["linearizable"])
    assert all("time limit" in reason for reason in late["unknown"].values()), late["unknown"]


def test_a_group_that_lost_its_quorum_for_good_is_checked_in_linear_steps(
    tmp_path: Any,
) -> None:
    """Group g0 dies 5 s into a 30 s history: its queues collect about 650 timed-out
    appends each that nobody read and that cannot be left out (the drain never read those
    queues). Every queue still gets a verdict, the search's steps stay within a few per
    operation (about 440,000 when each of those appends was linearized on its own), and
    the run is invalid for what happened: its drain did not finish."""
    from chaos.analysis import analyze_run
    from chaos.synthetic import write_history

    path = tmp_path / "history.jsonl"
    facts = write_history(path, seconds=30, seed=4, dead_after=5.0)
    del facts["lines"]
    results = analyze_run(path, facts, check_timeout=600).results
    assert results["operations"]["append"]["info"] > 1000
    assert set(results["linearizable"].values()) == {True}, results["unknown"]
    lin = results["linearizability"]
    assert lin["steps"] < 3 * lin["operations"], lin
    assert results["verdict"] == "invalid"
    assert results["problems"] == ["the final drain did not reach the end of every queue"]
    phases = results["analysis_seconds"]  # where the time went, for long runs' figures
    assert {"spill", "parse", "operations", "accounting", "queue_search", "offsets_search",
            "availability", "total"} <= set(phases), phases
    assert sum(v for k, v in phases.items() if k != "total") <= phases["total"]


def test_the_analysis_holds_one_queue_at_a_time(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever the history's length, memory follows its largest queue: when a queue's
    operations are built, the only records alive are that queue's, and when it is
    checked, the only operations alive are its own and the report's small windows of the
    queues before it."""
    import gc

    from chaos import analysis as module
    from chaos.histories import HistoryRecord
    from chaos.model import Operation
    from chaos.synthetic import write_history

    path = tmp_path / "history.jsonl"
    facts = write_history(path, seconds=3, seed=5)
    del facts["lines"]
    monkeypatch.setattr(module, "_REPORT_OPS", 10)
    alive: list[tuple[str, int, int]] = []

    def count(kind: type) -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o) is kind) - before[kind]

    before = {HistoryRecord: 0, Operation: 0}  # whatever earlier tests left alive
    before = {kind: count(kind) for kind in before}

    build = module.queue_operations
    check = module._Checks.check

    def building(records: Any) -> Any:
        alive.append(("records", len(records), count(HistoryRecord)))
        return build(records)

    def checking(self: Any, ops: Any, timeout: float) -> None:
        if self.segmented:
            kept = sum(len(p.operations) for p in self.partitions)
            alive.append(("operations", len(ops) + kept, count(Operation)))
        check(self, ops, timeout)

    monkeypatch.setattr(module, "queue_operations", building)
    monkeypatch.setattr(module._Checks, "check", checking)
    assert module.analyze_run(path, facts, check_timeout=60).results["verdict"] == "valid"
    assert len(alive) == 12, alive  # six queues, each built and checked
    for what, own, live in alive:
        assert live == own, (what, own, live, alive)


def test_operations_of_one_process_over_several_queues_pair_as_in_one_file(
    tmp_path: Any,
) -> None:
    """Spilling per key keeps parse_jsonl's pairing: an invoke left open when its process
    moves on is unknown, and a completion follows its process's open invoke."""
    import json

    from chaos.analysis import analyze
    from chaos.histories import parse_jsonl

    lines = [
        {"process": 1, "type": "invoke", "f": "append", "key": "a", "value": "p1-0", "time": 1},
        {"process": 1, "type": "invoke", "f": "append", "key": "b", "value": "p1-1", "time": 2},
        {"process": 1, "type": "ok", "f": "append", "key": "b", "value": {"offset": 0},
         "time": 3},
        {"process": 2, "type": "invoke", "f": "read", "key": "a", "value": {"offset": 0, "n": 5},
         "time": 4},
        {"process": 2, "type": "ok", "f": "read", "key": "a", "value": ["p1-0"], "time": 5},
        {"process": 2, "type": "invoke", "f": "read", "key": "b", "value": {"offset": 0, "n": 5},
         "time": 6},
        {"process": 2, "type": "ok", "f": "read", "key": "b", "value": ["p1-1"], "time": 7},
    ]
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert [r.status for r in parse_jsonl(path)][:2] == ["info", "ok"]
    results = analyze(path, queue_groups={}, check_timeout=10).results
    assert results["valid"] and results["recovered"] == 1, results
    assert results["operations"]["append"] == {"ok": 1, "fail": 0, "info": 1}
    # a completion with no open invoke is still the clear error it was
    path.write_text(json.dumps(lines[2]) + "\n" + "".join(json.dumps(e) + "\n" for e in lines))
    with pytest.raises(ValueError, match="line 1: ok for process 1 with no pending invoke"):
        analyze(path, queue_groups={}, check_timeout=10)
    assert not list(tmp_path.glob(".analysis-*"))  # spill files are removed


@pytest.mark.slow
def test_memory_of_the_analysis_grows_with_the_largest_queue_not_faster(tmp_path: Any) -> None:
    """Opt-in (-m slow): the analysis of 2 and 8 minutes of synthetic history, each in a
    fresh process; quadrupling the history must not quadruple the memory above a fixed
    base (before the streaming analysis it grew 5-fold from 2 to 4 minutes alone)."""
    from bench.long_analysis import main as bench

    out = tmp_path / "rows.txt"
    import contextlib
    import io
    import json

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        bench(["--seconds", "120,480", "--json", "--dir", str(tmp_path)])
    out.write_text(buffer.getvalue())
    rows = [json.loads(line) for line in buffer.getvalue().splitlines()]
    short, long = (r["after"] for r in rows)
    assert short["verdict"] == long["verdict"] == "valid"
    assert long["peak_rss_mb"] < 2.5 * short["peak_rss_mb"], rows
    assert long["steps"] < 6 * short["steps"], rows  # linear search: 4x the operations
    assert long["report_bytes"] < 1.2 * short["report_bytes"], rows  # a window, not all


@pytest.mark.live  # the analysis runs in a process of its own, for its peak memory
def test_the_long_analysis_benchmark_prints_one_json_row_per_length(
    tmp_path: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from bench.long_analysis import main as bench

    assert bench(["--seconds", "3", "--dead-after", "1", "--json", "--dir", str(tmp_path)]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    after = row["after"]
    assert row["seconds"] == 3 and row["lines"] > 1000
    assert after["verdict"] == "invalid" and after["unknown"] == {}
    assert after["problems"] == ["the final drain did not reach the end of every queue"]
    assert after["peak_rss_mb"] > 0 and after["operations"] > 1000
    assert after["phases"]["total"] > 0 and "queue_search" in after["phases"]


def test_the_report_keeps_a_window_of_each_passing_queue(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from chaos import analysis as module
    from chaos.synthetic import write_history

    path = tmp_path / "history.jsonl"
    write_history(path, seconds=4, seed=3, fault_every=2.0)
    whole = module.analyze_run(path, FACTS, check_timeout=60)
    monkeypatch.setattr(module, "_REPORT_OPS", 50)
    kept = module.analyze_run(path, FACTS, check_timeout=60)
    assert kept.results["linearizability"]["operations"] == (
        whole.results["linearizability"]["operations"])
    assert all(len(p.operations) == 50 for p in kept.info.partitions)
    assert sum(len(p.operations) for p in whole.info.partitions) > 6 * 50
    small = kept.write_report(tmp_path / "small.html").stat().st_size
    assert small < whole.write_report(tmp_path / "whole.html").stat().st_size
    assert kept.load == whole.load and len(kept.load[0]) <= 60


@pytest.mark.parametrize("corrupt", [None, "stale", "lost", "duplicate"])
def test_segmented_and_whole_queue_checks_agree_on_run_shaped_histories(
    tmp_path: Any, corrupt: str | None,
) -> None:
    from chaos.analysis import queue_operations, split_records
    from chaos.histories import parse_jsonl
    from chaos.synthetic import write_history

    path = tmp_path / "history.jsonl"
    write_history(path, seconds=6, seed=2, fault_every=2.0, corrupt=corrupt)
    records, _offsets = split_records(parse_jsonl(path))
    found = set()
    for queue in sorted({r.key for r in records}):
        ops = queue_operations([r for r in records if r.key == queue])
        assert len(quiescent_segments(ops)) > 3
        whole = _verdict(ops)
        assert _segmented_verdict(ops) is whole, queue
        found.add(whole)
    assert (CheckResult.ILLEGAL in found) is (corrupt is not None), found
