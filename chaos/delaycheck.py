"""The delayed-message checker of a chaos run: what a `--workload delay` history proves.

Pure: `check_lines` takes the JSON lines of a history (lines of other workloads are
skipped, so a run of `--workload all` is checked in the same pass) and returns a JSON-able
dict; `check_file` streams a history file. One pass; memory holds one small entry per
delayed message and its lateness, never the history itself.

Times
-----
A delayed message is due by the wall clock of its group's leader, and its store time
(`Message.store_ms`) is that leader's clock too, so every time this checker compares is a
wall-clock millisecond (epoch) carried in the records' values, taken on the machine that
runs the nodes. The history's own ``time`` (the harness's monotonic clock) is not used.

History records
---------------
Written with `chaos.recorder.Recorder`: an ``invoke`` line, perhaps ``attempt`` lines,
then one completion (``ok``, ``fail`` or ``info``) of the same process; an operation
still open at the end of the history counts as ``info``. ``"topic/queue"`` names a
queue; bodies are run-unique. A message's *rule* is one of ``{"delay_ms": d}`` (due d ms
after its store time; ``"level": n`` beside it when it was sent with ``delay_level=n``)
or ``{"at_ms": a}`` (due at a, ms since the epoch, as the SDK rounds ``deliver_at``).

``delay-send`` (key = ``"topic/queue"``)
    One delayed send by a plain or idempotent producer: invoke value ``{"body",
    "producer": "plain" | "idempotent", "sent_ms", **rule}``. ``attempt`` lines (plain
    producers): one per PRODUCE request that carried it, each of which may store a copy.
    ``ok {"msg_id", "offset", "ack_ms"}`` (stored; the offset is -1 until it is due),
    ``fail {"error"}`` (certainly never stored), ``info {"error"}`` (unknown).

``delay-txn`` (key = transactional id)
    A Kafka-style transaction of delayed messages: invoke value ``{"id", "messages":
    [{"body", "topic", "queue", **rule}, ...], "plan": "commit" | "abort"}``; an
    ``attempt {"commit": true, "sent_ms"}`` line just before the commit request;
    ``ok {"outcome": "commit" | "abort", "ack_ms"}``, ``fail {"error"}`` (not
    committed: aborted, fenced, or no commit asked), ``info {"error"}`` (unknown). A
    transaction without a commit attempt is aborted whatever its completion.

``delay-read`` / ``delay-drain`` (key = ``"topic/queue"``)
    A fetch during the run / after it: invoke value ``{"offset": o, "n": n}``, ``ok
    {"seen_ms": t, "messages": [[offset, body, store_ms], ...]}`` with t the wall clock
    when the answer was in hand. Readers record only reads that returned messages (an
    empty poll says nothing the drain does not); the drain records every read, and an
    answer shorter than n is the end of the queue then. A queue is drained when drain
    reads cover every offset from 0 to the end of one that came back short.

What is checked
---------------
A message's due time is its store time plus its delay, or its ``at_ms``; it is
*delivered* once any read returned it, and *first seen* at the earliest such read's
``seen_ms``. Counted violations (`VIOLATIONS`):

- ``early``: a copy seen before its due time, by more than `EARLY_SLACK_MS` (clock
  rounding: a leader moves it once its own millisecond clock reached the due time, and a
  read returns after that);
- ``late``: first seen more than `LATE_BOUND_MS` after it was due (after the later of its
  due time and its transaction's commit request); lateness below the bound is reported
  (p50, p99, max), not judged;
- ``lost``: acknowledged (a send ``ok``, or a message of a committed transaction) and
  not in its drained queue;
- ``duplicated``: at more offsets than requests that carried it (one for idempotent and
  transactional sends, one per ``attempt`` for plain ones);
- ``phantom``: delivered although its send failed for certain, or its transaction
  aborted;
- ``before_commit``: a message of a transaction that was not aborted seen before its
  commit was sent;
- ``unexpected``: a body nobody sent to that queue; ``offset_conflicts``: two bodies
  read at one offset.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import entrychecks

__all__ = ["DELAY_OPS", "EARLY_SLACK_MS", "LATE_BOUND_MS", "Checker", "VIOLATIONS",
           "check_file", "check_lines", "check_records", "percentile"]

DELAY_OPS = frozenset({"delay-send", "delay-txn", "delay-read", "delay-drain"})
VIOLATIONS = ("early", "late", "lost", "duplicated", "phantom", "before_commit",
              "unexpected", "offset_conflicts")
EARLY_SLACK_MS = 5
"""How much earlier than its due time a message may be seen: clock rounding only."""
LATE_BOUND_MS = 60_000
"""Later than this past its due time is a violation (docs/chaos.md says why 60 s): the
liveness bound of a group after a heal is 20 s, and the worst unavailability the long
all-nemesis runs measured after a heal stayed below a minute."""
_EXAMPLES = 20
COMMITTED, ABORTED, UNKNOWN = "committed", "aborted", "unknown"


@dataclass(slots=True)
class _Txn:
    id: str
    tid: str
    plan: str
    status: str = "open"  # ok | fail | info | open
    outcome: str | None = None
    commit_sent_ms: float = math.inf

    @property
    def state(self) -> str:
        if self.status == "ok":
            return COMMITTED if self.outcome == "commit" else ABORTED
        if self.status == "fail" or math.isinf(self.commit_sent_ms):
            return ABORTED
        return UNKNOWN


@dataclass(slots=True)
class _Msg:
    body: str
    queue: str
    kind: str  # plain | idempotent | txn
    delay_ms: int | None
    at_ms: int | None
    level: int | None = None
    status: str = "open"  # of its send (ok | fail | info | open); a txn's message: "txn"
    attempts: int = 0
    txn: _Txn | None = None
    first_seen: float = math.inf
    first_store: int = 0
    min_margin: float = math.inf  # smallest seen - due over its copies
    offsets: set[int] = field(default_factory=set)

    def due(self, store_ms: int) -> int:
        return self.at_ms if self.at_ms is not None else store_ms + (self.delay_ms or 0)

    def rule(self) -> str:
        return "level" if self.level is not None else "at" if self.at_ms is not None else "delay"

    @property
    def state(self) -> str:
        """committed (acknowledged), aborted (never stored for certain) or unknown."""
        if self.txn is not None:
            return self.txn.state
        return {"ok": COMMITTED, "fail": ABORTED}.get(self.status, UNKNOWN)


@dataclass(slots=True)
class _Queue:
    at: dict[int, str] = field(default_factory=dict)  # offset -> first body read there
    drain: dict[int, int] = field(default_factory=dict)  # drain read offset -> most read
    short_ends: set[int] = field(default_factory=set)  # where short drain reads ended


@dataclass(slots=True)
class _Op:
    f: str
    key: Any
    value: Any
    attempts: list[Any] = field(default_factory=list)


def _rule(v: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(delay_ms, at_ms, level) of a message's rule; ValueError unless it has one."""
    delay, at, level = v.get("delay_ms"), v.get("at_ms"), v.get("level")
    if (delay is None) == (at is None):
        raise ValueError("a delayed message has delay_ms or at_ms, one of them")
    return (None if delay is None else int(delay), None if at is None else int(at),
            None if level is None else int(level))


def percentile(values: array[float] | list[float], q: float) -> float | None:
    """The nearest-rank q-th percentile (0 < q <= 100) of `values`, None when empty."""
    if not len(values):
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


class Checker:
    """Fed one history entry at a time (`chaos.entrychecks`), judged by `result`."""

    def __init__(self, *, late_bound_ms: int = LATE_BOUND_MS,
                 early_slack_ms: int = EARLY_SLACK_MS) -> None:
        self.late_bound_ms = late_bound_ms
        self.early_slack_ms = early_slack_ms
        self.open: dict[Any, _Op] = {}
        self.msgs: dict[str, _Msg] = {}
        self.txns: list[_Txn] = []
        self.queues: dict[str, _Queue] = {}
        self.conflicts: list[dict[str, Any]] = []
        self.unexpected: list[dict[str, Any]] = []
        self._strangers: set[tuple[str, int, str]] = set()  # (queue, offset, body) unexpected
        self.malformed: list[str] = []
        self.sends: dict[str, int] = {}  # send outcome -> count

    # ------------------------------------------------------------ intake

    def line(self, entry: Any, where: str) -> None:
        head = entrychecks.entry_head(entry)
        if head is None:
            return
        process, kind, f = head
        if kind == "invoke":
            self.open.pop(process, None)  # an op left open by a new invoke stays unknown
            if f in DELAY_OPS:
                new = self.open[process] = _Op(f, entry.get("key"), entry.get("value"))
                try:
                    self._invoked(new)
                except (TypeError, ValueError, KeyError, AttributeError) as exc:
                    self.malformed.append(f"{where}: {f} {exc}")
                    self.open.pop(process, None)
            return
        op = self.open.get(process)
        if op is None or op.f != f:
            return
        if kind == "attempt":
            op.attempts.append(entry.get("value"))
            return
        if kind not in ("ok", "fail", "info"):
            return
        del self.open[process]
        try:
            self._completed(op, kind, entry.get("value"))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            self.malformed.append(f"{where}: {f} {exc}")

    def _own(self, msg: _Msg) -> None:
        if msg.body in self.msgs:
            raise ValueError(f"body {msg.body!r} sent twice")
        self.msgs[msg.body] = msg

    def _invoked(self, op: _Op) -> None:
        v = op.value
        if op.f == "delay-send":
            delay, at, level = _rule(v)
            kind = str(v["producer"])
            if kind not in ("plain", "idempotent"):
                raise ValueError(f"producer {kind!r}")
            msg = _Msg(str(v["body"]), str(op.key), kind, delay, at, level)
            self._own(msg)
            op.value = msg
        elif op.f == "delay-txn":
            txn = _Txn(str(v["id"]), str(op.key), str(v.get("plan")))
            for m in v["messages"]:
                delay, at, level = _rule(m)
                msg = _Msg(str(m["body"]), f"{m['topic']}/{int(m['queue'])}", "txn", delay, at,
                           level, status="txn", txn=txn)
                self._own(msg)
            op.value = txn
        else:  # a read: its offset and n are used at its completion
            _ = (int(v["offset"]), int(v["n"]))

    def _completed(self, op: _Op, kind: str, result: Any) -> None:
        if op.f == "delay-send":
            msg: _Msg = op.value
            msg.status = kind
            msg.attempts = len(op.attempts)
            self.sends[kind] = self.sends.get(kind, 0) + 1
        elif op.f == "delay-txn":
            self._end_txn(op, kind, result)
        elif kind == "ok":
            self._read(op.f, str(op.key), int(op.value["offset"]), int(op.value["n"]),
                       float(result["seen_ms"]), result["messages"])

    def _end_txn(self, op: _Op, kind: str, result: Any) -> None:
        txn: _Txn = op.value
        txn.status = kind
        for attempt in op.attempts:
            if isinstance(attempt, dict) and attempt.get("sent_ms") is not None:
                txn.commit_sent_ms = min(txn.commit_sent_ms, float(attempt["sent_ms"]))
        if op.attempts and math.isinf(txn.commit_sent_ms):
            raise ValueError("a commit attempt without its sent_ms")
        if kind == "ok":
            txn.outcome = str(result["outcome"])
            if txn.outcome not in ("commit", "abort"):
                raise ValueError(f"outcome {txn.outcome!r}")
        self.txns.append(txn)

    def _read(self, f: str, queue: str, offset: int, n: int, seen: float,
              messages: list[Any]) -> None:
        q = self.queues.setdefault(queue, _Queue())
        for item in messages:
            at, body, store = int(item[0]), str(item[1]), int(item[2])
            first = q.at.setdefault(at, body)
            if first != body and len(self.conflicts) < 10 * _EXAMPLES:
                self.conflicts.append({"queue": queue, "offset": at, "bodies": [first, body]})
            msg = self.msgs.get(body)
            if msg is None or msg.queue != queue:
                if (queue, at, body) not in self._strangers:
                    self._strangers.add((queue, at, body))
                    self.unexpected.append({"queue": queue, "offset": at, "body": body})
                continue
            msg.offsets.add(at)
            msg.min_margin = min(msg.min_margin, seen - msg.due(store))
            if seen < msg.first_seen:
                msg.first_seen, msg.first_store = seen, store
        if f == "delay-drain":
            q.drain[offset] = max(q.drain.get(offset, 0), len(messages))
            if len(messages) < n:
                q.short_ends.add(offset + len(messages))

    def finish(self) -> None:
        for op in list(self.open.values()):  # never completed: unknown
            if op.f == "delay-send":
                self._completed(op, "info", None)
            elif op.f == "delay-txn":
                self._end_txn(op, "info", None)
        self.open.clear()

    # ------------------------------------------------------------ verdict

    def drained(self, queue: str) -> int | None:
        """The end of `queue` as drained, or None when the drain did not cover it: drain
        reads cover every offset from 0 up to where one of them came back short."""
        q = self.queues.get(queue)
        if q is None or not q.short_ends:
            return None
        covered = 0
        end = None
        for offset in sorted(q.drain):
            if offset > covered:
                break
            covered = max(covered, offset + q.drain[offset])
        for e in q.short_ends:
            if e <= covered:
                end = e if end is None else max(end, e)
        return end

    def result(self) -> dict[str, Any]:
        self.finish()
        found: dict[str, list[Any]] = {kind: [] for kind in VIOLATIONS}
        found["offset_conflicts"] = list(self.conflicts)
        found["unexpected"] = list(self.unexpected)  # each (queue, offset, body) once
        queues = sorted({m.queue for m in self.msgs.values()} | set(self.queues))
        ends = {queue: self.drained(queue) for queue in queues}
        lateness: array[float] = array("d")
        by_rule: dict[str, int] = {}
        delivered = acknowledged = 0
        txns = {COMMITTED: 0, ABORTED: 0, UNKNOWN: 0}
        for txn in self.txns:
            txns[txn.state] += 1
        for msg in self.msgs.values():
            by_rule[msg.rule()] = by_rule.get(msg.rule(), 0) + 1
            state = msg.state
            seen = not math.isinf(msg.first_seen)
            name: dict[str, Any] = {"body": msg.body, "queue": msg.queue, "rule": msg.rule()}
            if msg.delay_ms is not None:
                name["delay_ms"] = msg.delay_ms
            else:
                name["at_ms"] = msg.at_ms
            if msg.txn is not None:
                name["txn"] = msg.txn.id
            if state == COMMITTED:
                acknowledged += 1
            end = ends.get(msg.queue)
            if state == COMMITTED and end is not None and not any(o < end for o in msg.offsets):
                found["lost"].append(name)
            if not seen:
                continue
            delivered += 1
            if state == ABORTED:
                found["phantom"].append({**name, "state": msg.status if msg.txn is None
                                         else "aborted transaction"})
            if msg.min_margin < -self.early_slack_ms:
                found["early"].append({**name, "early_ms": round(-msg.min_margin, 1)})
            commit = msg.txn.commit_sent_ms if msg.txn is not None else -math.inf
            if msg.txn is not None and state != ABORTED and msg.first_seen < commit:
                found["before_commit"].append(
                    {**name, "before_commit_ms": round(commit - msg.first_seen, 1)})
            due = max(msg.due(msg.first_store), msg.first_store)
            if state != ABORTED:
                late = msg.first_seen - max(due, commit)
                lateness.append(late)
                if late > self.late_bound_ms:
                    found["late"].append({**name, "late_ms": round(late, 1)})
            allowed = max(1, msg.attempts) if msg.kind == "plain" else 1
            if len(msg.offsets) > allowed:
                found["duplicated"].append({**name, "offsets": sorted(msg.offsets),
                                            "requests": allowed})
        counts = {kind: len(items) for kind, items in found.items()}
        problems = [f"{kind}: {n}" for kind, n in counts.items() if n]
        problems += [f"malformed delayed-message record: {m}"
                     for m in self.malformed[:_EXAMPLES]]

        def ms(v: float | None) -> float | None:
            return None if v is None else round(v, 1)

        return {
            "valid": not problems,
            "problems": problems,
            **counts,
            "messages": {
                "sent": len(self.msgs),
                "sends": dict(sorted(self.sends.items())),
                "acknowledged": acknowledged,
                "delivered": delivered,
                "by_rule": dict(sorted(by_rule.items())),
            },
            "transactions": txns,
            "lateness_ms": {"count": len(lateness), "p50": ms(percentile(lateness, 50)),
                            "p99": ms(percentile(lateness, 99)),
                            "max": ms(max(lateness) if lateness else None)},
            "late_bound_ms": self.late_bound_ms,
            "early_slack_ms": self.early_slack_ms,
            "undrained_queues": sorted(q for q, e in ends.items() if e is None),
            "malformed": len(self.malformed),
            "examples": {kind: items[:_EXAMPLES] for kind, items in found.items() if items},
        }


def check_records(entries: Iterable[Any]) -> dict[str, Any]:
    """The verdict over history entries (decoded JSON objects), in history order."""
    return entrychecks.check_records(Checker(), entries)


def check_lines(lines: Iterable[str]) -> dict[str, Any]:
    """The verdict over the JSON lines of a history; lines that are not JSON, or name
    none of `DELAY_OPS`, are skipped."""
    return entrychecks.check_lines(Checker(), lines, DELAY_OPS)


def check_file(path: str | Path) -> dict[str, Any]:
    """`check_lines` over a history file, read as it is walked."""
    return entrychecks.check_file(Checker(), path, DELAY_OPS)
