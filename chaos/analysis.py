"""What a `raftmq chaos run` history says: message accounting, linearizability, availability.

`analyze` reads the JSON-lines history a run wrote (client operations and nemesis faults)
and combines three views:

- accounting (`chaos.accounting`): lost, duplicated, unexpected ... messages, per queue;
- linearizability of every queue's log (`QueueLogModel`, strict short reads), one partition
  per queue, within a time limit;
- linearizability of every consumer group's committed offset per queue, when the history
  has ``commit``/``read`` operations keyed ``[group, queue]`` (`ConsumerOffsetModel`);
- availability: after a fault that took away group leaders (the nemesis names them in the
  fault's value as ``"leaders": {group: node}``), how long until an append to a queue of
  that group was acknowledged again;
- liveness: after every fault heals, each group must acknowledge an append invoked after
  the heal within `LIVENESS_BOUND` seconds, and from the start of a fault that leaves a
  connected majority (`MAJORITY_CONNECTED`) each group it took a leader from must within
  the same bound. A group that does not, while no other fault began and appends went
  on for that long, makes the run invalid (``liveness_violations``); ``unavailability_by_fault`` gives, per fault kind, the
  worst time to a write during the fault (from its start, over the groups it took a
  leader from, or every group when it took none) and after its heal.

Verdict. A run is *invalid* when a message was lost, read without being appended
(unexpected), read after a definite failure, read at two offsets by different reads,
acknowledged at an offset other than where it was read or at an offset another message was
acknowledged at, stored out of its producer's order, stored twice by an idempotent
producer, or when the history of some queue or committed offset is not linearizable. A
plain producer that retries after an unknown outcome may store a message twice:
at-least-once delivery allows that, so such duplicates are counted (``duplicated_plain``)
but are no error. For the linearizability check each extra copy becomes one more append of
the same message with unknown outcome, issued when the original was: the retry the SDK
made inside that operation. A search that ran out of time makes the verdict *unknown* (not
valid, but no violation found either). Both searches together take about `check_timeout`
seconds at most: the offsets search gets what the queue search left (at least a second).

Whether a message came from an idempotent producer is read from its id (see
`chaos.workload.message_id`), or from the appending process when the caller names the
idempotent processes.

`Analysis.results` (results.json): ``valid``, ``verdict`` (valid | invalid | unknown),
``problems`` (one line per violation), ``operations`` (counts per f and outcome; offset
reads as ``read-offset``), ``faults`` (injected, per kind), the accounting totals (``lost``,
``duplicated`` (idempotent), ``duplicated_plain``, ``unexpected``, ``failed_but_read``,
``offset_conflicts``, ``ack_mismatches``, ``ack_conflicts``, ``reordered``, ``recovered``,
``unread``), ``drained`` per queue, ``linearizable`` per queue and ``offsets_linearizable``
per ``group:queue`` (true, false, or null when unknown), the checker summaries
(``linearizability``, ``offsets_linearizability``, ``checker_seconds``),
``longest_unavailability`` (seconds; null without leader loss; a group that never came
back counts until the history ends), ``unrecovered_faults``, ``unavailability`` per fault,
``examples`` of each error per queue, and the history's ``first_time``/``last_time``/
``seconds``.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .accounting import ERROR_KINDS, account_queue_history
from .histories import (
    Fault,
    HistoryRecord,
    parse_faults,
    parse_jsonl,
    records_to_operations,
)
from .linearizability import CheckInfo, CheckResult, check_operations
from .model import INFINITY, UNKNOWN, Operation
from .models import (
    ConsumerOffsetModel,
    QueueLogModel,
    drop_unobserved_commits,
    pin_read_appends,
)
from .workload import is_idempotent_message

__all__ = ["INVALIDATING", "Analysis", "Unavailability", "analyze"]

INVALIDATING = ERROR_KINDS  # "duplicated" counts idempotent producers only, once split
"""Accounting totals that make a run invalid when not zero."""

_EXAMPLES = 20  # items of each error list kept in results.json
LIVENESS_BOUND = 20.0
"""Seconds after a fault's heal, or from the start of a fault that leaves a connected
majority, within which every group must acknowledge a write."""
MAJORITY_CONNECTED = frozenset({
    "kill", "pause", "partition-node", "partition-halves", "bridge", "majority-ring",
    "corrupt", "leader-transfer", "delay", "loss", "truncate-file", "bitflip-file",
    "snapshot-corrupt",
})
"""Fault kinds after which a majority of every group still talks and serves clients
(`crash-unsynced` too when its scope is one node); `partition-clients` and `disk-full`
are not among them: the nodes that lost their clients or their disk may keep leading."""


@dataclass(frozen=True, slots=True)
class Unavailability:
    """For one fault that took group leaders away: seconds from the fault's start to the
    first acknowledged append to each group (None: never, within the history)."""

    f: str
    start: float
    end: float
    leaders: dict[str, Any]
    groups: dict[str, float | None]

    @property
    def recovered(self) -> bool:
        return all(v is not None for v in self.groups.values())

    def longest(self, horizon: float) -> float:
        """The slowest group's recovery; a group that never recovered counts until
        `horizon` (the end of the history), a lower bound."""
        return max(
            (horizon - self.start if v is None else v for v in self.groups.values()),
            default=0.0,
        )

    def to_dict(self, origin: float, horizon: float) -> dict[str, Any]:
        return {
            "f": self.f,
            "at": round(self.start - origin, 3),
            "duration": None if math.isinf(self.end) else round(self.end - self.start, 3),
            "leaders": self.leaders,
            "groups": {g: None if v is None else round(v, 3) for g, v in self.groups.items()},
            "recovered": self.recovered,
            "longest": round(self.longest(horizon), 3),
        }


@dataclass
class Analysis:
    """Everything `analyze` found; `results` is what results.json holds."""

    results: dict[str, Any]
    model: QueueLogModel
    info: CheckInfo
    accounting: dict[str, Any]
    """`account_queue_history`'s dict, with totals split into idempotent (``duplicated``)
    and plain (``duplicated_plain``) duplicates and ``valid`` recomputed accordingly."""
    faults: list[Fault]
    unavailability: list[Unavailability]
    verdict: str  # "valid" | "invalid" | "unknown"
    offsets_model: ConsumerOffsetModel
    offsets_info: CheckInfo
    """The committed-offset check (no partitions when the history has no offset operations)."""

    @property
    def valid(self) -> bool:
        return self.verdict == "valid"

    @property
    def report_faults(self) -> list[tuple[float, float, str]]:
        """(start, end, name) per fault for `chaos.report`; a fault never healed ends with
        the history."""
        last = self.results.get("last_time", 0.0)
        return [
            (f.start, last if math.isinf(f.end) else f.end, _fault_name(f)) for f in self.faults
        ]

    def write_report(self, path: str | Path, *, title: str = "raftmq chaos run") -> Path:
        """The HTML report: timeline of the queue operations with faults, and accounting.

        When only the committed offsets are not linearizable, their check is shown instead,
        since that is where the failure to explain is."""
        from .report import write_report

        model: Any = self.model
        info = self.info
        if (
            info.result is not CheckResult.ILLEGAL
            and self.offsets_info.result is CheckResult.ILLEGAL
        ):
            model, info = self.offsets_model, self.offsets_info
            title += " (consumer offsets)"
        return write_report(
            path, model, info, title=title, faults=self.report_faults,
            accounting=self.accounting,
            unavailability=self.results.get("unavailability_by_fault"),
        )


def analyze(
    history_path: str | Path,
    *,
    queue_groups: dict[str, str],
    check_timeout: float,
    idempotent_processes: Collection[int] | None = None,
    liveness_bound: float = LIVENESS_BOUND,
) -> Analysis:
    """Account, check and measure a run's history (see the module docstring).

    `queue_groups` maps queue keys to the Raft group hosting them (for availability);
    `check_timeout` bounds the linearizability search in seconds.
    """
    path = Path(history_path)
    everything = parse_jsonl(path)
    records = [r for r in everything if r.f in ("append", "read") and not _offset_key(r.key)]
    offset_records = [r for r in everything if r.f in ("commit", "read") and _offset_key(r.key)]
    faults = parse_faults(path)

    accounting = account_queue_history(records)
    senders = {(r.key, r.value): r for r in records if r.f == "append"}

    def idempotent(key: Any, msg: Any) -> bool:
        if idempotent_processes is None:
            return is_idempotent_message(msg)
        sender = senders.get((key, msg))
        return sender is not None and sender.process in idempotent_processes

    # Split duplicates by the sender's promise.
    plain_copies: list[tuple[HistoryRecord, int]] = []
    dup_idem: dict[str, dict[str, list[int]]] = {}
    dup_plain: dict[str, dict[str, list[int]]] = {}
    for key, queue in accounting["queues"].items():
        for msg, offsets in queue["duplicated"].items():
            if idempotent(key, msg):
                dup_idem.setdefault(key, {})[msg] = offsets
            else:
                dup_plain.setdefault(key, {})[msg] = offsets
                sender = senders.get((key, msg))
                if sender is not None:
                    plain_copies.append((sender, len(offsets) - 1))
    totals = dict(accounting["totals"])
    totals["duplicated"] = sum(len(d) for d in dup_idem.values())
    totals["duplicated_plain"] = sum(len(d) for d in dup_plain.values())
    accounting = {**accounting, "totals": totals}
    accounting["valid"] = all(totals.get(kind, 0) == 0 for kind in INVALIDATING)

    model = QueueLogModel()
    ops = records_to_operations(records, "queue-log")
    for sender, extra in plain_copies:
        ops += [
            Operation(sender.process, ("append", sender.key, sender.value), sender.call,
                      UNKNOWN, INFINITY)
        ] * extra
    info = check_operations(model, pin_read_appends(ops), timeout=check_timeout, stop_early=False)
    offsets_model = ConsumerOffsetModel()
    offsets_info = check_operations(
        offsets_model,
        drop_unobserved_commits(records_to_operations(offset_records, "consumer-offset")),
        timeout=max(1.0, check_timeout - info.elapsed),
        stop_early=False,
    )

    times = [r.call for r in records] + [r.return_ for r in records if not math.isinf(r.return_)]
    times += [f.start for f in faults] + [f.end for f in faults if not math.isinf(f.end)]
    origin = min(times, default=0.0)
    last = max(times, default=0.0)
    unavailable = _unavailability(records, faults, queue_groups)
    by_fault, slow = _fault_liveness(records, faults, queue_groups, liveness_bound)

    problems = [f"{kind}: {totals[kind]}" for kind in INVALIDATING if totals.get(kind, 0)]
    problems += slow
    per_queue = {str(p.key): _linearizable(p.result) for p in info.partitions}
    problems += [f"not linearizable: {q}" for q, v in per_queue.items() if v is False]
    per_offset = {_offset_name(p.key): _linearizable(p.result) for p in offsets_info.partitions}
    problems += [
        f"committed offset not linearizable: {k}" for k, v in per_offset.items() if v is False
    ]
    if problems:
        verdict = "invalid"
    elif CheckResult.UNKNOWN in (info.result, offsets_info.result):
        verdict = "unknown"
    else:
        verdict = "valid"

    results: dict[str, Any] = {
        "valid": verdict == "valid",
        "verdict": verdict,
        "problems": problems,
        "operations": _outcomes(records + offset_records),
        "faults": dict(sorted(Counter(f.f for f in faults).items())),
        **{kind: totals.get(kind, 0) for kind in INVALIDATING},
        "duplicated_plain": totals["duplicated_plain"],
        "recovered": totals.get("recovered", 0),
        "unread": totals.get("unread", 0),
        "drained": {q: report["drained"] for q, report in accounting["queues"].items()},
        "linearizable": per_queue,
        "linearizability": info.to_dict(model),
        "offsets_linearizable": per_offset,
        "offsets_linearizability": offsets_info.to_dict(offsets_model),
        "checker_seconds": round(info.elapsed + offsets_info.elapsed, 3),
        "longest_unavailability": (
            round(max(u.longest(last) for u in unavailable), 3) if unavailable else None
        ),
        "unrecovered_faults": sum(1 for u in unavailable if not u.recovered),
        "unavailability": [u.to_dict(origin, last) for u in unavailable],
        "unavailability_by_fault": by_fault,
        "liveness_bound": liveness_bound,
        "liveness_violations": slow,
        "examples": _examples(accounting["queues"], dup_idem, dup_plain),
        "first_time": origin,
        "last_time": last,
        "seconds": round(last - origin, 3),
    }
    return Analysis(
        results, model, info, accounting, faults, unavailable, verdict, offsets_model,
        offsets_info,
    )


def _linearizable(result: CheckResult) -> bool | None:
    """True, False, or None when the search ran out of time."""
    return None if result is CheckResult.UNKNOWN else result is CheckResult.OK


def _offset_key(key: Any) -> bool:
    """Consumer-offset operations are keyed ``[group, queue]``; queue operations by queue."""
    return isinstance(key, tuple)


def _offset_name(key: Any) -> str:
    return ":".join(str(k) for k in key) if isinstance(key, tuple) else str(key)


def _outcomes(records: Sequence[HistoryRecord]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in records:
        name = "read-offset" if r.f == "read" and _offset_key(r.key) else r.f
        by = out.setdefault(name, {"ok": 0, "fail": 0, "info": 0})
        by[r.status] = by.get(r.status, 0) + 1
    return out


def _unavailability(
    records: Sequence[HistoryRecord],
    faults: Sequence[Fault],
    queue_groups: dict[str, str],
) -> list[Unavailability]:
    """Per fault with leaders: time to the first acknowledged append to each of their groups.

    Only appends invoked at or after the fault's start count, so an acknowledgement already
    on its way when the leader went away is not taken for a recovered group.
    """
    acks: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r.f == "append" and r.status == "ok":
            group = queue_groups.get(str(r.key))
            if group is not None:
                acks.setdefault(group, []).append((r.call, r.return_))
    index: dict[str, tuple[list[float], list[float]]] = {}
    for group, pairs in acks.items():
        pairs.sort()
        suffix_min = [0.0] * len(pairs)
        best = INFINITY
        for i in range(len(pairs) - 1, -1, -1):
            best = min(best, pairs[i][1])
            suffix_min[i] = best
        index[group] = ([c for c, _ in pairs], suffix_min)

    out = []
    for fault in faults:
        value = fault.start_value
        leaders = value.get("leaders") if isinstance(value, dict) else None
        if not isinstance(leaders, dict) or not leaders:
            continue
        groups: dict[str, float | None] = {}
        for group in sorted(leaders):
            calls, suffix_min = index.get(str(group), ([], []))
            i = bisect.bisect_left(calls, fault.start)
            groups[str(group)] = suffix_min[i] - fault.start if i < len(calls) else None
        out.append(Unavailability(fault.f, fault.start, fault.end, dict(leaders), groups))
    return out


def _first_ack_after(
    index: dict[str, tuple[list[float], list[float]]], group: str, t: float
) -> float | None:
    """When the first append to `group` invoked at or after `t` was acknowledged."""
    calls, suffix_min = index.get(group, ([], []))
    i = bisect.bisect_left(calls, t)
    return suffix_min[i] if i < len(calls) else None


def _fault_liveness(
    records: Sequence[HistoryRecord],
    faults: Sequence[Fault],
    queue_groups: dict[str, str],
    bound: float,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per fault kind: count and worst seconds to a write during and after the fault;
    and one problem line per group that accepted no write within `bound` seconds of a
    heal (judged only when no other fault began and appends went on that long)."""
    acks: dict[str, list[tuple[float, float]]] = {}
    last_call = -INFINITY
    for r in records:
        if r.f == "append":
            last_call = max(last_call, r.call)
            group = queue_groups.get(str(r.key))
            if r.status == "ok" and group is not None:
                acks.setdefault(group, []).append((r.call, r.return_))
    index: dict[str, tuple[list[float], list[float]]] = {}
    for group, pairs in acks.items():
        pairs.sort()
        suffix = [0.0] * len(pairs)
        best = INFINITY
        for i in range(len(pairs) - 1, -1, -1):
            best = min(best, pairs[i][1])
            suffix[i] = best
        index[group] = ([c for c, _ in pairs], suffix)
    every = sorted(set(queue_groups.values()))
    starts = sorted(f.start for f in faults)
    table: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for fault in faults:
        row = table.setdefault(fault.f, {"faults": 0, "worst_during": None,
                                         "worst_after_heal": None, "unrecovered": 0})
        row["faults"] += 1
        value = fault.start_value
        leaders = value.get("leaders") if isinstance(value, dict) else None
        hit = sorted(str(g) for g in leaders) if isinstance(leaders, dict) and leaders else every
        later = starts[bisect.bisect_right(starts, fault.start):]
        window = min(later[:1] + [last_call]) - fault.start
        majority = fault.f in MAJORITY_CONNECTED or (
            fault.f == "crash-unsynced" and isinstance(value, dict) and value.get("scope") == "one")
        for group in hit:
            t = _first_ack_after(index, group, fault.start)
            if t is not None:
                row["worst_during"] = round(max(row["worst_during"] or 0.0, t - fault.start), 3)
            if majority and (t is None or t - fault.start > bound) and window >= bound:
                row["unrecovered"] += 1
                problems.append(
                    f"liveness: group {group} accepted no write within {bound:g} s of the "
                    f"start of {_fault_name(fault)}, with a majority connected"
                )
        if math.isinf(fault.end):
            row["unrecovered"] += 1
            continue
        horizon = min([s for s in later if s >= fault.end] + [last_call])
        for group in every:
            t = _first_ack_after(index, group, fault.end)
            took = None if t is None else t - fault.end
            if took is not None:
                row["worst_after_heal"] = round(max(row["worst_after_heal"] or 0.0, took), 3)
            if (took is None or took > bound) and horizon - fault.end >= bound:
                row["unrecovered"] += 1
                problems.append(
                    f"liveness: group {group} accepted no write within {bound:g} s after "
                    f"{_fault_name(fault)} healed"
                    + ("" if took is None else f" (first after {took:.1f} s)")
                )
    return dict(sorted(table.items())), problems


def _examples(
    queues: dict[str, Any],
    dup_idem: dict[str, dict[str, list[int]]],
    dup_plain: dict[str, dict[str, list[int]]],
) -> dict[str, dict[str, Any]]:
    """A few items of every non-empty error list per queue, to start an investigation."""
    out: dict[str, dict[str, Any]] = {}
    for key, report in queues.items():
        items: dict[str, Any] = {}
        for kind in INVALIDATING:
            if kind == "duplicated":
                continue
            value = report.get(kind)
            if value:
                items[kind] = value[:_EXAMPLES]
        for name, dups in (("duplicated", dup_idem), ("duplicated_plain", dup_plain)):
            if dups.get(key):
                items[name] = dict(list(dups[key].items())[:_EXAMPLES])
        if items:
            out[key] = items
    return out


def _fault_name(fault: Fault) -> str:
    value = fault.value
    if isinstance(value, dict):
        nodes = value.get("nodes") or value.get("node")
        if nodes is not None:
            return f"{fault.f} {nodes}"
    return fault.f
