"""The transactional checker (`chaos.txcheck`) on synthetic histories: each violation it
names is found where it is, and nothing is found in histories that are valid, including
those whose outcomes are unknown.

Histories are written with the run's own `Recorder` (a hand-driven clock), so they have
the exact shape a run writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos.recorder import Recorder
from chaos.txcheck import VIOLATIONS, check_file, check_lines

T, IN, OUT = "tx", "tx-in", "tx-out"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class History:
    """A history under construction; `check` runs the checker over it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rec = Recorder(path, clock=Clock())
        self.next_process = 100
        self.bodies: dict[str, list[str]] = {}  # queue -> bodies in offset order

    def process(self) -> int:
        self.next_process += 1
        return self.next_process

    def init(self, tid: str, epoch: int, p: int | None = None) -> None:
        p = self.process() if p is None else p
        self.rec.invoke(p, "tx-init", tid, None)
        self.rec.complete(p, "ok", "tx-init", tid, {"epoch": epoch})

    def txn_open(self, p: int, txid: str, sends: list[tuple[str, int, str]], *,
                 tid: str = "t1", epoch: int = 0, n: int = 0, plan: str = "commit",
                 inputs: list[Any] | None = None, offsets: Any = None) -> None:
        value: dict[str, Any] = {"id": txid, "epoch": epoch, "n": n, "plan": plan,
                                 "sends": [list(s) for s in sends]}
        if inputs is not None:
            value["inputs"] = inputs
            value["offsets"] = offsets
        self.rec.invoke(p, "txn", tid, value)

    def commit_sent(self, p: int, tid: str = "t1") -> None:
        self.rec.attempt(p, "txn", tid, {"commit": True})

    def txn_end(self, p: int, kind: str, outcome: str | None = None, tid: str = "t1") -> None:
        value = {"outcome": outcome} if kind == "ok" else {"error": "x"}
        self.rec.complete(p, kind, "txn", tid, value)

    def txn(self, txid: str, sends: list[tuple[str, int, str]], kind: str = "ok",
            outcome: str | None = "commit", *, commit: bool = True, **kw: Any) -> int:
        p = self.process()
        self.txn_open(p, txid, sends, **kw)
        if commit:
            self.commit_sent(p, kw.get("tid", "t1"))
        self.txn_end(p, kind, outcome, kw.get("tid", "t1"))
        return p

    def read(self, topic: str, queue: int, offset: int, bodies: list[str], *,
             f: str = "tx-read", n: int = 64) -> None:
        p = self.process()
        key = f"{topic}/{queue}"
        self.rec.invoke(p, f, key, {"offset": offset, "n": n})
        self.rec.complete(p, "ok", f, key, bodies)

    def store(self, topic: str, queue: int, *bodies: str) -> None:
        """The cluster commits `bodies` to that queue (seen by the drain)."""
        self.bodies.setdefault(f"{topic}/{queue}", []).extend(bodies)

    def drain(self, *queues: tuple[str, int]) -> None:
        for topic, queue in queues:
            held = self.bodies.get(f"{topic}/{queue}", [])
            self.read(topic, queue, 0, held[:2], f="tx-drain", n=2)
            if len(held) >= 2:
                self.read(topic, queue, 2, held[2:], f="tx-drain", n=len(held) + 1)

    def half(self, hid: str, body: str, *, local: str, plan: str, kind: str = "ok",
             outcome: str | None = None, queue: int = 0, end: bool = True) -> int:
        p = self.process()
        key = f"{T}/{queue}"
        self.rec.invoke(p, "half", key, {"id": hid, "topic": T, "queue": queue, "body": body,
                                         "local": local, "plan": plan})
        if end and plan != "crash":
            self.rec.attempt(p, "half", key, None)
        if kind == "ok":
            self.rec.complete(p, "ok", "half", key, {"outcome": outcome or plan,
                                                       "txid": f"x-{hid}"})
        else:
            self.rec.complete(p, kind, "half", key, {"error": "x"})
        return p

    def check(self, body: str, answer: str) -> None:
        p = self.process()
        self.rec.invoke(p, "check", f"{T}/0", {"body": body, "txid": "?", "checks": 1})
        self.rec.complete(p, "ok", "check", f"{T}/0", {"answer": answer})

    def status(self, body: str, commit: bool | None, source: str | None) -> None:
        p = self.process()
        self.rec.invoke(p, "half-status", "x", {"body": body})
        self.rec.complete(p, "ok", "half-status", "x", {"commit": commit, "source": source})

    def pipe_in(self, queue: int, body: str, offset: int) -> None:
        p = self.process()
        key = f"{IN}/{queue}"
        self.rec.invoke(p, "pipe-in", key, {"body": body})
        self.rec.complete(p, "ok", "pipe-in", key, {"offset": offset})
        self.store(IN, queue, body)

    def pipe_offsets(self, group: str, offsets: dict[str, int | None]) -> None:
        p = self.process()
        self.rec.invoke(p, "pipe-offsets", group, None)
        self.rec.complete(p, "ok", "pipe-offsets", group, offsets)

    def check_it(self) -> dict[str, Any]:
        self.rec.close()
        return check_file(self.path)


@pytest.fixture
def h(tmp_path: Path) -> History:
    return History(tmp_path / "history.jsonl")


def _only(result: dict[str, Any], *kinds: str) -> None:
    """Exactly `kinds` among the violations are non-zero (and every record was read)."""
    assert result["malformed"] == 0, result["problems"]
    found = {k for k in VIOLATIONS if result[k]}
    assert found == set(kinds), (found, result["examples"])
    assert result["valid"] is (not kinds)
    for kind in kinds:
        assert f"{kind}: {result[kind]}" in result["problems"]


def _valid_kafka(h: History) -> None:
    """Committed, aborted, unknown (committed and not), abandoned: all as they should."""
    h.init("t1", 0)
    h.read(T, 0, 0, [])  # nothing visible before any commit
    h.txn("a", [(T, 0, "a.0"), (T, 1, "a.1"), (T, 0, "a.2")])
    h.store(T, 0, "a.0", "a.2")
    h.store(T, 1, "a.1")
    h.read(T, 0, 0, ["a.0", "a.2"])  # after the commit was sent
    h.txn("b", [(T, 0, "b.0"), (T, 1, "b.1")], "ok", "abort", commit=False, n=1)
    h.txn("c", [(T, 0, "c.0"), (T, 1, "c.1")], "info", n=2)  # unknown, committed
    h.store(T, 1, "c.1")
    h.store(T, 0, "c.0")
    h.txn("d", [(T, 0, "d.0"), (T, 2, "d.1")], "info", n=3)  # unknown, aborted
    h.txn("e", [(T, 1, "e.0")], "fail", commit=False, plan="abandon", n=4)
    h.txn("f", [(T, 2, "f.0")], "fail", n=5)  # commit refused: certainly aborted
    h.init("t1", 1)  # a new producer for the id: fences epoch 0 from here on


def test_a_valid_history_of_every_outcome_has_no_violation(h: History) -> None:
    _valid_kafka(h)
    h.drain((T, 0), (T, 1), (T, 2))
    result = h.check_it()
    _only(result)
    assert result["transactions"] == {"committed": 1, "aborted": 3, "unknown": 2}
    assert result["undrained_queues"] == [] and result["malformed"] == 0


def test_lost_committed_message(h: History) -> None:
    _valid_kafka(h)
    h.bodies["tx/1"].remove("a.1")
    h.drain((T, 0), (T, 1), (T, 2))
    result = h.check_it()
    _only(result, "lost_committed", "torn")
    assert result["examples"]["lost_committed"][0]["body"] == "a.1"


def test_aborted_read_during_the_run_and_in_the_drain(h: History) -> None:
    _valid_kafka(h)
    h.read(T, 1, 3, ["b.1"])  # an aborted transaction's message served
    h.drain((T, 0), (T, 1), (T, 2))
    result = h.check_it()
    _only(result, "aborted_reads")
    assert [e["body"] for e in result["examples"]["aborted_reads"]] == ["b.1"]


def test_aborted_message_in_the_drain(h: History) -> None:
    _valid_kafka(h)
    h.store(T, 2, "f.0")
    h.drain((T, 0), (T, 1), (T, 2))
    _only(h.check_it(), "aborted_reads")


def test_unknown_outcome_read_then_gone_is_an_aborted_read(h: History) -> None:
    _valid_kafka(h)
    h.read(T, 2, 0, ["d.1"])  # seen during the run, but the drain shows d absent
    h.drain((T, 0), (T, 1), (T, 2))
    result = h.check_it()
    assert result["aborted_reads"] == 1 and result["examples"]["aborted_reads"][0]["id"] == "d"


def test_torn_unknown_transaction(h: History) -> None:
    _valid_kafka(h)
    h.store(T, 0, "d.0")  # d.1 never shows: half a transaction
    h.drain((T, 0), (T, 1), (T, 2))
    result = h.check_it()
    _only(result, "torn")
    assert result["examples"]["torn"][0] == {"id": "d", "tid": "t1", "epoch": 0,
                                             "state": "unknown", "visible": 1, "messages": 2}


def test_uncommitted_read_before_the_commit_was_sent(h: History) -> None:
    p = h.process()
    h.txn_open(p, "a", [(T, 0, "a.0")])
    h.read(T, 0, 0, ["a.0"])  # prepared, not committed, yet served
    h.commit_sent(p)
    h.txn_end(p, "ok", "commit")
    h.store(T, 0, "a.0")
    h.drain((T, 0))
    _only(h.check_it(), "uncommitted_reads")


def test_duplicate_message(h: History) -> None:
    _valid_kafka(h)
    h.store(T, 1, "a.1")
    h.drain((T, 0), (T, 1), (T, 2))
    result = h.check_it()
    _only(result, "duplicates")
    assert result["examples"]["duplicates"] == [{"body": "a.1", "offsets": [0, 2]}]


def test_reordered_within_a_queue(h: History) -> None:
    h.txn("a", [(T, 0, "a.0"), (T, 0, "a.1"), (T, 1, "a.2")])
    h.store(T, 0, "a.1", "a.0")
    h.store(T, 1, "a.2")
    h.drain((T, 0), (T, 1))
    result = h.check_it()
    _only(result, "reordered")
    assert result["examples"]["reordered"][0]["body"] == "a.1"


def test_unexpected_message_and_offset_conflict(h: History) -> None:
    h.txn("a", [(T, 0, "a.0")])
    h.store(T, 0, "a.0", "ghost")
    h.read(T, 0, 0, ["a.0", "other"])
    h.drain((T, 0))
    result = h.check_it()
    _only(result, "unexpected", "offset_conflicts")
    assert {e["body"] for e in result["examples"]["unexpected"]} == {"other"}


def test_a_message_read_in_another_queue_is_unexpected(h: History) -> None:
    h.txn("a", [(T, 0, "a.0")])
    h.store(T, 1, "a.0")
    h.drain((T, 0), (T, 1))
    _only(h.check_it(), "unexpected", "lost_committed")


def test_zombie_commit_after_a_newer_init(h: History) -> None:
    h.init("t1", 0)
    old = h.process()
    h.txn_open(old, "z", [(T, 0, "z.0")], plan="zombie")
    h.init("t1", 1)  # the successor took the id: completed before the commit is sent
    h.commit_sent(old)
    h.txn_end(old, "ok", "commit")  # a fenced epoch committed
    h.store(T, 0, "z.0")
    h.drain((T, 0))
    result = h.check_it()
    _only(result, "zombie_commits")
    assert result["examples"]["zombie_commits"][0]["fenced_by"] == 1


def test_a_commit_sent_before_the_newer_init_completed_is_no_zombie(h: History) -> None:
    h.init("t1", 0)
    old, new = h.process(), h.process()
    h.txn_open(old, "z", [(T, 0, "z.0")])
    h.rec.invoke(new, "tx-init", "t1", None)  # under way...
    h.commit_sent(old)  # ...when the commit goes: it may win the race
    h.rec.complete(new, "ok", "tx-init", "t1", {"epoch": 1})
    h.txn_end(old, "ok", "commit")
    h.init("t2", 5)  # another id's epochs say nothing about t1
    h.store(T, 0, "z.0")
    h.drain((T, 0))
    _only(h.check_it())


def test_a_fenced_zombie_that_failed_is_valid(h: History) -> None:
    h.init("t1", 0)
    old = h.process()
    h.txn_open(old, "z", [(T, 0, "z.0")], plan="zombie")
    h.init("t1", 1)
    h.commit_sent(old)
    h.txn_end(old, "fail")
    h.drain((T, 0))
    result = h.check_it()
    _only(result)
    assert result["transactions"]["aborted"] == 1


def test_operations_left_open_by_a_killed_process(h: History) -> None:
    """A transaction of a killed process never completes: unknown once its commit was
    sent (either way, but whole), aborted before."""
    p1, p2, p3 = h.process(), h.process(), h.process()
    h.txn_open(p1, "k1", [(T, 0, "k1.0"), (T, 1, "k1.1")])
    h.commit_sent(p1)
    h.txn_open(p2, "k2", [(T, 0, "k2.0")])  # killed before its commit
    h.txn_open(p3, "k3", [(T, 0, "k3.0"), (T, 1, "k3.1")])
    h.commit_sent(p3)
    h.store(T, 0, "k1.0")
    h.store(T, 1, "k1.1")
    h.drain((T, 0), (T, 1))
    result = h.check_it()
    _only(result)
    assert result["transactions"] == {"committed": 0, "aborted": 1, "unknown": 2}


def test_killed_before_commit_but_visible_is_an_aborted_read(h: History) -> None:
    p = h.process()
    h.txn_open(p, "k", [(T, 0, "k.0")])
    h.store(T, 0, "k.0")
    h.drain((T, 0))
    _only(h.check_it(), "aborted_reads")


def test_a_queue_not_drained_is_named_and_loses_nothing(h: History) -> None:
    h.txn("a", [(T, 0, "a.0"), (T, 1, "a.1")])
    h.store(T, 0, "a.0")
    h.drain((T, 0))
    h.read(T, 1, 0, [], f="tx-drain", n=0)  # not short: never reached an end
    result = h.check_it()
    _only(result)
    assert result["undrained_queues"] == ["tx/1"]


def test_a_drain_with_a_gap_is_not_drained(h: History) -> None:
    h.txn("a", [(T, 0, "a.0")])
    h.read(T, 0, 5, [], f="tx-drain")  # a short read far from 0: 0..4 never covered
    result = h.check_it()
    assert result["undrained_queues"] == ["tx/0"] and result["lost_committed"] == 0


# ---------------------------------------------------------------- half messages


def _valid_halves(h: History) -> None:
    h.half("h1", "h1", local="commit", plan="commit", queue=1)
    h.store(T, 1, "h1")
    h.half("h2", "h2", local="rollback", plan="rollback")
    h.half("h3", "h3", local="commit", plan="crash", outcome="prepared")
    h.check("h3", "commit")
    h.store(T, 0, "h3")
    h.read(T, 0, 0, ["h3"])  # after h3's check-back
    h.read(T, 1, 0, ["h1"])  # after h1's end
    h.half("h4", "h4", local="unknown", plan="crash", outcome="prepared")
    h.check("h4", "unknown")  # never decided by the producer: expires, rolled back
    h.half("h5", "h5", local="commit", plan="commit", kind="fail", end=False)
    h.half("h6", "h6", local="commit", plan="crash", kind="info")  # prepare unknown
    h.half("h7", "h7", local="rollback", plan="crash", outcome="prepared")
    h.check("h7", "rollback")
    h.half("h8", "h8", local="commit", plan="crash", outcome="prepared")  # expired
    h.status("h8", False, "expired")


def test_valid_half_messages(h: History) -> None:
    _valid_halves(h)
    h.drain((T, 0), (T, 1))
    result = h.check_it()
    _only(result)
    assert result["halves"] == {"commit": 2, "rollback": 6}  # as the drain found them
    assert result["checks"] == {"answered": 3,
                                "answers": {"commit": 1, "rollback": 1, "unknown": 1}}


def test_half_read_before_its_commit_could_exist(h: History) -> None:
    p = h.process()
    key = f"{T}/0"
    h.rec.invoke(p, "half", key, {"id": "e", "topic": T, "queue": 0, "body": "e",
                                  "local": "commit", "plan": "commit"})
    h.read(T, 0, 0, ["e"])  # served while only prepared
    h.rec.attempt(p, "half", key, None)
    h.rec.complete(p, "ok", "half", key, {"outcome": "commit", "txid": "x"})
    h.store(T, 0, "e")
    h.drain((T, 0))
    _only(h.check_it(), "half_early_reads")


def test_crashed_half_read_before_check_back_answered(h: History) -> None:
    h.half("c", "c", local="commit", plan="crash", outcome="prepared")
    h.read(T, 0, 0, ["c"])
    h.check("c", "commit")
    h.store(T, 0, "c")
    h.drain((T, 0))
    _only(h.check_it(), "half_early_reads")


@pytest.mark.parametrize("which", ["h2", "h4", "h5", "h7", "h8"])
def test_rolled_back_half_delivered(h: History, which: str) -> None:
    _valid_halves(h)
    h.store(T, 0, which)
    h.drain((T, 0), (T, 1))
    result = h.check_it()
    _only(result, "half_rolled_back_reads")
    assert result["examples"]["half_rolled_back_reads"][0]["body"] == which


def test_committed_half_lost(h: History) -> None:
    _valid_halves(h)
    h.bodies["tx/1"].remove("h1")
    h.drain((T, 0), (T, 1))
    result = h.check_it()
    _only(result, "half_lost")
    assert result["examples"]["half_lost"][0]["body"] == "h1"


def test_check_back_decided_against_the_local_transaction(h: History) -> None:
    h.half("w", "w", local="commit", plan="crash", outcome="prepared")
    h.status("w", False, "check")  # the broker rolled back what the listener said commit
    h.drain((T, 0))
    _only(h.check_it(), "half_wrong_decision")


def test_broker_says_committed_but_the_drain_lacks_it(h: History) -> None:
    h.half("u", "u", local="commit", plan="commit", kind="info")  # the end's answer lost
    h.status("u", True, "check")
    h.drain((T, 0))
    _only(h.check_it(), "half_lost")


@pytest.mark.parametrize("plan", ["commit", "crash"])
def test_a_half_whose_prepare_is_unknown_is_only_rolled_back(h: History, plan: str) -> None:
    """The listener learns a half only when its prepare returns: one whose prepare's
    answer was lost is answered "unknown" at every check-back and expires, so a commit
    of it is wrong although its local transaction said commit."""
    h.half("z", "z", local="commit", plan=plan, kind="info", end=False)
    h.store(T, 0, "z")
    h.drain((T, 0))
    result = h.check_it()
    _only(result, "half_rolled_back_reads")
    assert result["examples"]["half_rolled_back_reads"][0]["body"] == "z"


def test_a_half_whose_prepare_returned_may_be_committed_by_check_back(h: History) -> None:
    p = h.process()
    key = f"{T}/0"
    h.rec.invoke(p, "half", key, {"id": "y", "topic": T, "queue": 0, "body": "y",
                                  "local": "commit", "plan": "commit"})
    # the prepare returned (its txid is known), then the run was cancelled before the end
    h.rec.complete(p, "info", "half", key, {"error": "cancelled", "txid": "x-y"})
    h.check("y", "commit")
    h.store(T, 0, "y")
    h.drain((T, 0))
    _only(h.check_it())


def test_unknown_half_visible_then_gone(h: History) -> None:
    h.half("g", "g", local="commit", plan="crash", kind="info")
    h.check("g", "commit")
    h.read(T, 0, 0, ["g"])
    h.drain((T, 0))
    _only(h.check_it(), "half_rolled_back_reads")


# ---------------------------------------------------------------- pipeline


def _pipeline(h: History, *, final: int | None = 3, skip_output: int | None = None,
              twice: int | None = None) -> None:
    """Inputs 0..3 on tx-in/0; a first worker commits 0-1, is killed in the middle of 2-3
    after its commit was sent (unknown, here aborted), and its successor commits 2. Each
    attempt at an input makes an output of its own (``o:<input>@<transaction>``)."""
    for i in range(4):
        h.pipe_in(0, f"i{i}", i)
    offsets = {"pg": {f"{IN}/0": 2}}
    h.txn("p0", [(OUT, 0, "o:i0"), (OUT, 0, "o:i1")], tid="w", plan="commit",
          inputs=[[IN, 0, 0, "i0"], [IN, 0, 1, "i1"]], offsets=offsets)
    h.store(OUT, 0, *(f"o:i{i}" for i in (0, 1) if i != skip_output))
    k = h.process()
    h.txn_open(k, "p1", [(OUT, 0, "o:i2@p1"), (OUT, 0, "o:i3@p1")], tid="w", n=1,
               inputs=[[IN, 0, 2, "i2"], [IN, 0, 3, "i3"]], offsets={"pg": {f"{IN}/0": 4}})
    h.commit_sent(k, "w")  # then SIGKILL: never completed; here, it did not commit
    h.init("w", 1)
    h.txn("p2", [(OUT, 0, "o:i2@p2")], tid="w", epoch=1, inputs=[[IN, 0, 2, "i2"]],
          offsets={"pg": {f"{IN}/0": 3}})
    h.store(OUT, 0, *(f"o:i{i}@p2" for i in (2,) if i != skip_output))
    if twice is not None:  # the killed worker's output of that input committed as well
        h.store(OUT, 0, f"o:i{twice}@p1")
    h.pipe_offsets("pg", {f"{IN}/0": final})
    h.drain((IN, 0), (OUT, 0))


def test_valid_pipeline_with_a_killed_worker(h: History) -> None:
    _pipeline(h)
    result = h.check_it()
    _only(result)
    assert result["pipeline"]["transactions"] == 3
    assert result["pipeline"]["inputs_committed"] == 3


def test_pipeline_input_committed_without_its_output(h: History) -> None:
    _pipeline(h, skip_output=1)  # its transaction committed: lost, torn, and missing
    _only(h.check_it(), "pipeline_missing", "lost_committed", "torn")


def test_pipeline_input_transformed_twice(h: History) -> None:
    _pipeline(h, twice=2)
    _only(h.check_it(), "pipeline_duplicated", "torn")


def test_pipeline_output_of_an_input_not_committed(h: History) -> None:
    _pipeline(h, final=2)
    _only(h.check_it(), "pipeline_uncommitted", "pipeline_offsets_regressed")


def test_pipeline_offsets_never_committed(h: History) -> None:
    _pipeline(h, final=None)
    result = h.check_it()
    _only(result, "pipeline_uncommitted", "pipeline_offsets_regressed")
    assert result["pipeline_uncommitted"] == 3


# ---------------------------------------------------------------- the input itself


def test_other_lines_are_ignored_and_bad_records_named() -> None:
    lines = [
        "not json",
        '{"process": "nemesis", "type": "invoke", "f": "kill", "value": {}}',
        '{"process": 1, "type": "invoke", "f": "append", "key": "q", "value": "m"}',
        '{"process": 1, "type": "ok", "f": "append", "key": "q", "value": {"offset": 0}}',
        '{"process": 2, "type": "invoke", "f": "txn", "key": "t", "value": {"id": "a"}}',
        '{"process": 2, "type": "ok", "f": "txn", "key": "t", "value": {"outcome": "commit"}}',
        '{"process": 3, "type": "ok", "f": "txn", "key": "t", "value": {}}',
    ]
    result = check_lines(lines)
    assert result["malformed"] == 1 and result["valid"] is False
    assert "malformed transactional record" in result["problems"][0]
    assert result["transactions"] == {"committed": 0, "aborted": 0, "unknown": 0}


def test_a_body_sent_twice_is_malformed(h: History) -> None:
    h.txn("a", [(T, 0, "same")])
    h.txn("b", [(T, 0, "same")])
    result = h.check_it()
    assert result["malformed"] == 1 and result["valid"] is False


def test_empty_history_is_valid() -> None:
    result = check_lines([])
    _only(result)
    assert result["messages"] == 0


@pytest.mark.parametrize("ended", ["commit", "rollback"])
def test_a_late_check_back_that_flips_a_decision_is_caught(h: History, ended: str) -> None:
    """The listener answers a check-back of a half already ended the opposite way (as the
    workload sometimes does); a broker that applied that answer is caught."""
    h.half("f", "f", local=ended, plan=ended)
    h.check("f", "rollback" if ended == "commit" else "commit")
    if ended == "rollback":
        h.store(T, 0, "f")  # the flipped commit delivered it
    h.drain((T, 0))
    result = h.check_it()
    _only(result, "half_lost" if ended == "commit" else "half_rolled_back_reads")


def test_a_late_opposite_answer_that_changed_nothing_is_valid(h: History) -> None:
    h.half("f", "f", local="commit", plan="commit")
    h.check("f", "rollback")
    h.store(T, 0, "f")
    h.drain((T, 0))
    _only(h.check_it())
