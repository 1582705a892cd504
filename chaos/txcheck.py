"""The transactional checker of a chaos run: what a `--workload txn` history proves.

Pure: `check_lines` takes the JSON lines of a history (any other lines are skipped, so a
run of `--workload all` is checked in the same pass) and returns a JSON-able dict;
`check_file` streams a history file. One pass; memory holds one small entry per
transactional message and per operation still open, never the history itself.

History records
---------------
Written with `chaos.recorder.Recorder` like the queue workload's: an ``invoke`` line,
optionally ``attempt`` lines, then one completion (``ok``, ``fail`` or ``info``) of the
same process. An operation still open at the end of the history (a process killed with
SIGKILL) counts as ``info``. ``"topic/queue"`` names a queue. Bodies are run-unique
strings; every message of these topics is sent by exactly one record below.

``tx-init`` (key = transactional id)
    A producer took the id: ``ok {"epoch": e}`` once the coordinator answered. Used for
    zombies: from the ``ok`` on, epochs below ``e`` of that id can no longer commit. Two
    inits of one id are never granted the same epoch, also when the cluster forgot the
    id in between (``epochs_reused``): a producer of the old epoch would act as the new.

``txn`` (key = transactional id)
    Invoke value ``{"id": run-unique name, "epoch": e, "n": n, "sends": [[topic, queue,
    body], ...] (in send order), "plan": "commit" | "abort" | "abandon" | "zombie",
    "inputs"?: [[topic, queue, offset, body], ...], "offsets"?: {cg: {"topic/queue":
    next offset}}}``. ``inputs`` and ``offsets`` make it a pipeline transaction:
    ``sends[i]`` is the output of ``inputs[i]``. An ``attempt`` line is written just
    before the commit request is sent (its time is when the commit was sent). Outcomes:
    ``ok {"outcome": "commit"}`` (committed), ``ok {"outcome": "abort"}`` (aborted),
    ``fail {"error"}`` (certainly not committed: aborted, fenced, abandoned, or the
    commit was never asked), ``info {"error"}`` (unknown). A transaction with no commit
    attempt is aborted whatever its completion: nothing but its own producer's commit
    can commit it (a timeout or a fencing init aborts it).

``half`` (key = ``"topic/queue"``)
    A RocketMQ half message: invoke value ``{"id", "topic", "queue", "body", "local":
    "commit" | "rollback" | "unknown" (what the check listener answers for it, always),
    "plan": "commit" | "rollback" | "crash" (never ended: check-back decides)}``; an
    ``attempt`` line before the end request; ``ok {"outcome": "commit" | "rollback" |
    "prepared", "txid"}`` ("prepared": stored and left for check-back), ``fail``
    (certainly never stored), ``info`` (unknown: prepare or end; with ``"txid"`` when the
    prepare returned). The listener learns a half only when its prepare returns, so a half
    whose prepare outcome is unknown (``info`` without a txid and no ``attempt``) can
    only be rolled back: check-back gets "unknown" for it until it expires.

``check`` (key = ``"topic/queue"``)
    A check-back the listener answered: invoke value ``{"body", "txid", "checks"}``,
    ``ok {"answer": "commit" | "rollback" | "unknown"}``.

``half-status`` (key = txid)
    After the drain, what the broker says it decided: invoke value ``{"body"}``, ``ok
    {"commit": bool | null, "source": "client" | "check" | "expired" | "operator" |
    null}`` (null: undecided or forgotten). Optional.

``pipe-in`` (key = ``"topic/queue"``)
    A pipeline input produced: invoke value ``{"body"}``, ``ok {"offset": n}``.

``pipe-offsets`` (key = consumer group)
    After the drain, the group's committed offsets: ``ok {"topic/queue": offset | null}``.

``tx-read`` / ``tx-drain`` (key = ``"topic/queue"``)
    A read-committed fetch during the run / after it: invoke value ``{"offset": o, "n":
    n}``, ``ok`` value = the bodies at o, o+1, ... (shorter than n: the end of the
    queue). Failed reads say nothing. A queue is drained when ``tx-drain`` reads covered
    every offset from 0 up to a short answer.

What is checked
---------------
A transaction is *committed* (``ok commit``), *aborted* (``ok abort``, ``fail``, or no
commit attempt) or *unknown* (a commit attempt, then ``info`` or never completed).
Counted violations (`VIOLATIONS`):

- ``lost_committed``: a message of a committed transaction absent from the drained queue;
- ``aborted_reads``: any read (during the run or in the drain) of a message of an aborted
  transaction, or of an unknown one that the drain shows absent;
- ``uncommitted_reads``: a read that returned before the transaction's commit was sent;
- ``torn``: after the drain, a transaction visible only in part (unknown outcomes must be
  all or nothing);
- ``duplicates``: a message at two offsets; ``offset_conflicts``: two bodies read at one
  offset; ``unexpected``: a body nobody sent to that queue;
- ``reordered``: two messages of one transaction in one queue in the other order;
- ``zombie_commits``: a commit acknowledged to epoch e of an id after an init of that id
  with a higher epoch had completed before the commit was sent;
- ``epochs_reused``: two inits of one id answered with the same epoch;
- ``half_early_reads``: a half message read before a commit of it could exist (the end
  request, or a check-back answering commit); ``half_rolled_back_reads``: a half that
  ended rolled back (acknowledged, never stored, or whose every possible outcome is a
  rollback) read; ``half_lost``: a half acknowledged committed (or reported committed
  by the broker) absent from the drain; ``half_wrong_decision``: a half decided by
  check-back other than its local transaction said, or delivered when the broker says
  rolled back;
- pipeline (``pipeline_missing``, ``pipeline_duplicated``, ``pipeline_uncommitted``,
  ``pipeline_offsets_regressed``): every input below the group's final committed offset
  has its output present exactly once, none at or above it has one, and the committed
  offset is not below what a committed pipeline transaction committed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import entrychecks

__all__ = ["Checker", "TX_OPS", "VIOLATIONS", "check_file", "check_lines", "check_records"]

TX_OPS = frozenset({
    "tx-init", "txn", "half", "check", "half-status", "pipe-in", "pipe-offsets", "tx-read",
    "tx-drain",
})
VIOLATIONS = (
    "lost_committed",
    "aborted_reads",
    "uncommitted_reads",
    "torn",
    "duplicates",
    "offset_conflicts",
    "unexpected",
    "reordered",
    "zombie_commits",
    "epochs_reused",
    "half_early_reads",
    "half_rolled_back_reads",
    "half_lost",
    "half_wrong_decision",
    "pipeline_missing",
    "pipeline_duplicated",
    "pipeline_uncommitted",
    "pipeline_offsets_regressed",
)
_EXAMPLES = 20
COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"


@dataclass(slots=True)
class _Op:
    f: str
    key: Any
    value: Any
    call: float
    attempts: list[float] = field(default_factory=list)


@dataclass(slots=True)
class _Txn:
    id: str
    tid: str
    epoch: int
    sends: list[tuple[str, str]]  # (queue key, body) in send order
    plan: str
    status: str = "open"  # ok | fail | info | open
    outcome: str | None = None  # commit | abort (ok only)
    commit_sent: float = math.inf  # the first commit attempt
    acked: float = math.inf  # return time of an ok
    inputs: list[tuple[str, int, str]] | None = None  # (queue key, offset, body)
    offsets: dict[str, int] | None = None  # queue key -> next offset (one group)
    group: str | None = None

    @property
    def state(self) -> str:
        if self.status == "ok":
            return COMMITTED if self.outcome == "commit" else ABORTED
        if self.status == "fail" or math.isinf(self.commit_sent):
            return ABORTED
        return UNKNOWN


@dataclass(slots=True)
class _Half:
    id: str
    queue: str
    body: str
    local: str
    plan: str
    status: str = "open"
    outcome: str | None = None
    txid: str | None = None
    end_sent: float = math.inf
    commit_answered: float = math.inf  # first check-back answering commit
    broker: tuple[bool | None, str | None] | None = None  # half-status


@dataclass(slots=True)
class _Queue:
    at: dict[int, str] = field(default_factory=dict)  # offset -> first body read there
    drain: dict[int, int] = field(default_factory=dict)  # drain read offset -> count read
    end: int | None = None  # offset where a short drain read stopped


class Checker:
    """Fed one history entry at a time (`chaos.entrychecks`), judged by `result`."""

    def __init__(self) -> None:
        self.open: dict[Any, _Op] = {}
        self.inits: dict[str, list[tuple[float, int]]] = {}  # tid -> (ok time, epoch)
        self.txns: list[_Txn] = []
        self.halves: list[_Half] = []
        self.half_by_body: dict[str, _Half] = {}
        self.owner: dict[str, tuple[str, Any]] = {}  # body -> (queue, owner: _Txn/_Half/None)
        self.queues: dict[str, _Queue] = {}
        self.first_read: dict[str, float] = {}  # body -> earliest return of a run read
        self.conflicts: list[dict[str, Any]] = []
        self.pipe_offsets: dict[str, dict[str, int | None]] = {}
        self.checks = 0
        self.check_answers: dict[str, int] = {}
        self.malformed: list[str] = []
        self._zombies: dict[str, tuple[list[int], list[float], list[int]]] = {}

    # ------------------------------------------------------------ intake

    def line(self, entry: Any, where: str) -> None:
        head = entrychecks.entry_head(entry)
        if head is None:
            return
        process, kind, f = head
        t = entry.get("time")
        t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0
        if kind == "invoke":
            self.open.pop(process, None)  # an op left open by a new invoke stays unknown
            if f in TX_OPS:
                self.open[process] = _Op(f, entry.get("key"), entry.get("value"), t)
                try:
                    self._invoked(self.open[process])
                except (TypeError, ValueError, KeyError) as exc:
                    self.malformed.append(f"{where}: {f} {exc}")
                    self.open.pop(process, None)
            return
        op = self.open.get(process)
        if op is None or op.f != f:
            return
        if kind == "attempt":
            op.attempts.append(t)
            return
        if kind not in ("ok", "fail", "info"):
            return
        del self.open[process]
        try:
            self._completed(op, kind, entry.get("value"), t)
        except (TypeError, ValueError, KeyError) as exc:
            self.malformed.append(f"{where}: {f} {exc}")

    def _invoked(self, op: _Op) -> None:
        v = op.value
        if op.f == "txn":
            sends = [(f"{topic}/{int(q)}", str(body)) for topic, q, body in v["sends"]]
            txn = _Txn(str(v["id"]), str(op.key), int(v["epoch"]), sends, str(v.get("plan")))
            if v.get("inputs") is not None:
                txn.inputs = [(f"{t}/{int(q)}", int(o), str(b)) for t, q, o, b in v["inputs"]]
                if len(txn.inputs) != len(sends):
                    raise ValueError("a pipeline transaction has one send per input")
            for group, offs in (v.get("offsets") or {}).items():
                txn.group, txn.offsets = str(group), {str(k): int(o) for k, o in offs.items()}
            for queue, body in sends:
                self._own(body, queue, txn)
            op.value = txn
        elif op.f == "half":
            queue = f"{v['topic']}/{int(v['queue'])}"
            half = _Half(str(v["id"]), queue, str(v["body"]), str(v["local"]), str(v["plan"]))
            self._own(half.body, queue, half)
            self.half_by_body[half.body] = half
            op.value = half
        elif op.f == "pipe-in":
            self._own(str(v["body"]), str(op.key), None)

    def _own(self, body: str, queue: str, owner: Any) -> None:
        if body in self.owner:
            raise ValueError(f"body {body!r} sent twice")
        self.owner[body] = (queue, owner)

    def _completed(self, op: _Op, kind: str, result: Any, t: float) -> None:
        f = op.f
        if f == "tx-init":
            if kind == "ok":
                self.inits.setdefault(str(op.key), []).append((t, int(result["epoch"])))
        elif f == "txn":
            self._end_txn(op, kind, result, t)
        elif f == "half":
            self._end_half(op, kind, result)
        elif f == "check":
            if kind == "ok":
                self.checks += 1
                answer = str(result["answer"])
                self.check_answers[answer] = self.check_answers.get(answer, 0) + 1
                half = self.half_by_body.get(str(op.value["body"]))
                if half is not None and answer == "commit":
                    half.commit_answered = min(half.commit_answered, op.call)
        elif f == "half-status":
            half = self.half_by_body.get(str(op.value["body"]))
            if kind == "ok" and half is not None:
                commit = result.get("commit")
                half.broker = (None if commit is None else bool(commit), result.get("source"))
        elif f == "pipe-offsets":
            if kind == "ok":
                self.pipe_offsets[str(op.key)] = {
                    str(k): (None if o is None else int(o)) for k, o in result.items()}
        elif f in ("tx-read", "tx-drain") and kind == "ok":
            self._read(f, str(op.key), int(op.value["offset"]), int(op.value["n"]),
                       [str(b) for b in result], t)

    def _end_txn(self, op: _Op, kind: str, result: Any, t: float) -> None:
        txn: _Txn = op.value
        txn.status = kind
        if op.attempts:
            txn.commit_sent = op.attempts[0]
        if kind == "ok":
            txn.outcome = str(result["outcome"])
            txn.acked = t
            if txn.outcome not in ("commit", "abort"):
                raise ValueError(f"outcome {txn.outcome!r}")
        self.txns.append(txn)

    def _end_half(self, op: _Op, kind: str, result: Any) -> None:
        half: _Half = op.value
        half.status = kind
        if op.attempts:
            half.end_sent = op.attempts[0]
        if kind == "ok":
            half.outcome = str(result["outcome"])
        if isinstance(result, dict) and result.get("txid") is not None:
            half.txid = str(result["txid"])  # the prepare returned: the listener knows it
        self.halves.append(half)

    def _read(self, f: str, queue: str, offset: int, n: int, bodies: list[str], t: float) -> None:
        q = self.queues.setdefault(queue, _Queue())
        for i, body in enumerate(bodies):
            seen = q.at.setdefault(offset + i, body)
            if seen != body and len(self.conflicts) < 10 * _EXAMPLES:
                self.conflicts.append({"queue": queue, "offset": offset + i,
                                       "bodies": [seen, body]})
            if f == "tx-read" and t < self.first_read.get(body, math.inf):
                self.first_read[body] = t
        if f == "tx-drain":
            q.drain[offset] = max(q.drain.get(offset, 0), len(bodies))
            if len(bodies) < n:
                end = offset + len(bodies)
                q.end = end if q.end is None else min(q.end, end)

    def finish(self) -> None:
        for op in list(self.open.values()):  # never completed: unknown
            if op.f == "txn":
                self._end_txn(op, "info", None, math.inf)
            elif op.f == "half":
                self._end_half(op, "info", None)
        self.open.clear()

    # ------------------------------------------------------------ verdict

    def _fenced_before(self, txn: _Txn) -> int | None:
        """The epoch of an init of `txn`'s id above its own that completed before its
        commit was sent, if any (`_zombie_index` answers it in log time)."""
        index = self._zombies.get(txn.tid)
        if index is None:
            return None
        epochs, earliest, epoch_of = index
        i = bisect.bisect_right(epochs, txn.epoch)
        if i < len(epochs) and earliest[i] < txn.commit_sent:
            return epoch_of[i]
        return None

    def _zombie_index(self) -> None:
        """Per id: init epochs in order and, from each on, the earliest completion (and
        the epoch that completed then)."""
        self._zombies = {}
        for tid, inits in self.inits.items():
            inits.sort(key=lambda pair: pair[1])
            epochs = [e for _t, e in inits]
            earliest = [0.0] * len(inits)
            epoch_of = [0] * len(inits)
            best, best_epoch = math.inf, 0
            for i in range(len(inits) - 1, -1, -1):
                if inits[i][0] < best:
                    best, best_epoch = inits[i]
                earliest[i], epoch_of[i] = best, best_epoch
            self._zombies[tid] = (epochs, earliest, epoch_of)

    def drained(self, queue: str) -> int | None:
        """The drained end of `queue`, or None when the drain did not cover it."""
        q = self.queues.get(queue)
        if q is None or q.end is None:
            return None
        covered = 0
        for offset in sorted(q.drain):
            if offset > covered:
                return None
            covered = max(covered, offset + q.drain[offset])
        return q.end if covered >= q.end else None

    def result(self) -> dict[str, Any]:
        self.finish()
        self._zombie_index()
        found: dict[str, list[Any]] = {kind: [] for kind in VIOLATIONS}
        found["offset_conflicts"] = list(self.conflicts)
        ends = {queue: self.drained(queue) for queue in self.queues}
        # body -> offsets where it lies, within the drained part of its queue
        where: dict[str, list[int]] = {}
        for queue, q in self.queues.items():
            end = ends[queue]
            for offset, body in q.at.items():
                owner = self.owner.get(body)
                if owner is None or owner[0] != queue:
                    found["unexpected"].append({"queue": queue, "offset": offset, "body": body})
                    continue
                if end is not None and offset < end:
                    where.setdefault(body, []).append(offset)
        for body, offsets in where.items():
            if len(offsets) > 1:
                found["duplicates"].append({"body": body, "offsets": sorted(offsets)})

        def present(queue: str, body: str) -> bool | None:
            return None if ends.get(queue) is None else body in where

        def read_at_all(queue: str, body: str) -> bool:
            return body in self.first_read or (present(queue, body) is True)

        states = {COMMITTED: 0, ABORTED: 0, UNKNOWN: 0}
        for txn in self.txns:
            state = txn.state
            states[state] += 1
            seen = [present(queue, body) for queue, body in txn.sends]
            known = [s for s in seen if s is not None]
            visible = sum(1 for s in known if s)
            name = {"id": txn.id, "tid": txn.tid, "epoch": txn.epoch, "state": state}
            if state == COMMITTED:
                for (queue, body), s in zip(txn.sends, seen, strict=True):
                    if s is False:
                        found["lost_committed"].append({**name, "queue": queue, "body": body})
            elif state == ABORTED or (len(known) == len(seen) and visible == 0):
                for queue, body in txn.sends:
                    if read_at_all(queue, body):
                        found["aborted_reads"].append({**name, "queue": queue, "body": body})
            if 0 < visible < len(seen) == len(known) and state != ABORTED:
                found["torn"].append({**name, "visible": visible, "messages": len(seen)})
            for queue, body in txn.sends:
                t = self.first_read.get(body)
                if t is not None and t < txn.commit_sent and state != ABORTED:
                    found["uncommitted_reads"].append({**name, "queue": queue, "body": body})
            last: dict[str, int] = {}
            for queue, body in txn.sends:
                spots = where.get(body)
                if not spots:
                    continue
                if queue in last and min(spots) < last[queue]:
                    found["reordered"].append({**name, "queue": queue, "body": body})
                last[queue] = max(last.get(queue, -1), min(spots))
            if state == COMMITTED and self._fenced_before(txn) is not None:
                found["zombie_commits"].append({**name, "fenced_by": self._fenced_before(txn)})
        for tid, inits in sorted(self.inits.items()):
            granted: dict[int, int] = {}
            for _t, epoch in inits:
                granted[epoch] = granted.get(epoch, 0) + 1
            found["epochs_reused"] += [{"tid": tid, "epoch": e, "inits": n}
                                       for e, n in sorted(granted.items()) if n > 1]
        halves = self._halves(found, present, read_at_all)
        pipeline = self._pipeline(found, where, ends)
        counts = {kind: len(items) for kind, items in found.items()}
        problems = [f"{kind}: {n}" for kind, n in counts.items() if n]
        problems += [f"malformed transactional record: {m}" for m in self.malformed[:_EXAMPLES]]
        undrained = sorted(q for q, e in ends.items() if e is None)
        return {
            "valid": not problems,
            "problems": problems,
            **counts,
            "transactions": states,
            "halves": halves,
            "checks": {"answered": self.checks, "answers": dict(sorted(self.check_answers.items()))},
            "pipeline": pipeline,
            "messages": len(self.owner),
            "undrained_queues": undrained,
            "malformed": len(self.malformed),
            "examples": {kind: items[:_EXAMPLES] for kind, items in found.items() if items},
        }

    def _halves(self, found: dict[str, list[Any]], present: Any, read_at_all: Any) -> dict[str, int]:
        tally: dict[str, int] = {}
        for h in self.halves:
            if h.status == "ok" and h.outcome in ("commit", "rollback"):
                ends = {h.outcome}
            elif h.status == "fail":
                ends = {"rollback"}  # never stored
            else:
                # check-back answers `local` for a half the listener knows, that is one
                # whose prepare returned (a txid, or an end request sent after it); for any
                # other it answers unknown, so expiry (or a refused prepare) rolls it back
                ends = {"rollback"}
                registered = h.txid is not None or not math.isinf(h.end_sent)
                if registered and (h.local == "commit" or h.plan == "commit"):
                    ends.add("commit")
            if h.broker is not None and h.broker[0] is not None and h.status != "fail":
                said = "commit" if h.broker[0] else "rollback"
                if (h.broker[1] == "check" and said != h.local) or said not in ends:
                    found["half_wrong_decision"].append(
                        {"id": h.id, "body": h.body, "local": h.local, "plan": h.plan,
                         "decided": said, "source": h.broker[1]})
                ends = {said}
            name = {"id": h.id, "body": h.body, "queue": h.queue, "ends": "/".join(sorted(ends))}
            shown = present(h.queue, h.body)
            if len(ends) == 2 and shown is False and h.body in self.first_read:
                ends = {"rollback"}  # it was visible, then gone: lost or rolled back
            fate = ("unresolved" if shown is None else "commit" if shown else "rollback")
            tally[fate] = tally.get(fate, 0) + 1
            if ends == {"commit"} and shown is False:
                found["half_lost"].append(name)
            elif ends == {"rollback"} and read_at_all(h.queue, h.body):
                found["half_rolled_back_reads"].append(name)
            first = self.first_read.get(h.body)
            could = min(h.end_sent if "commit" in (h.plan, h.outcome) else math.inf,
                        h.commit_answered)
            if first is not None and first < could and "commit" in ends:
                found["half_early_reads"].append(name)
        return dict(sorted(tally.items()))

    def _pipeline(self, found: dict[str, list[Any]], where: dict[str, list[int]],
                  ends: dict[str, int | None]) -> dict[str, Any]:
        outputs: dict[tuple[str, int], set[str]] = {}  # input (queue, offset) -> output bodies
        committed_to: dict[tuple[str, str], int] = {}  # (group, queue) -> highest committed
        txns = 0
        for txn in self.txns:
            if txn.inputs is None:
                continue
            txns += 1
            for (queue, offset, _body), (_q, out) in zip(txn.inputs, txn.sends, strict=True):
                outputs.setdefault((queue, offset), set()).add(out)
            if txn.state == COMMITTED and txn.offsets and txn.group is not None:
                for queue, offset in txn.offsets.items():
                    slot = (txn.group, queue)
                    committed_to[slot] = max(committed_to.get(slot, 0), offset)
        for (group, queue), offset in committed_to.items():
            final = self.pipe_offsets.get(group, {}).get(queue)
            if group in self.pipe_offsets and (final is None or final < offset):
                found["pipeline_offsets_regressed"].append(
                    {"group": group, "queue": queue, "committed": offset, "final": final})
        processed = 0
        for group, offsets in self.pipe_offsets.items():
            for queue, final in offsets.items():
                end = ends.get(queue)
                if end is None:
                    continue  # the input queue was not drained: nothing to compare with
                for offset in range(end):
                    outs = outputs.get((queue, offset), set())
                    if any(ends.get(self.owner[o][0]) is None for o in outs):
                        continue  # an output queue was not drained
                    copies = sum(len(where.get(o, ())) for o in outs)
                    name = {"group": group, "queue": queue, "offset": offset,
                            "input": self.queues[queue].at.get(offset)}
                    if final is not None and offset < final:
                        processed += 1
                        if copies == 0:
                            found["pipeline_missing"].append(name)
                        elif copies > 1:
                            found["pipeline_duplicated"].append({**name, "copies": copies})
                    elif copies:
                        found["pipeline_uncommitted"].append({**name, "copies": copies})
        return {"transactions": txns, "inputs_committed": processed,
                "groups": {g: dict(sorted(o.items())) for g, o in self.pipe_offsets.items()}}


def check_records(entries: Iterable[Any]) -> dict[str, Any]:
    """The verdict over history entries (decoded JSON objects), in history order."""
    return entrychecks.check_records(Checker(), entries)


def check_lines(lines: Iterable[str]) -> dict[str, Any]:
    """The verdict over the JSON lines of a history; lines that are not JSON are skipped
    (the queue analysis reports them)."""
    return entrychecks.check_lines(Checker(), lines)


def check_file(path: str | Path) -> dict[str, Any]:
    """`check_lines` over a history file, read as it is walked."""
    return entrychecks.check_file(Checker(), path)
