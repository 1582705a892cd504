"""What a `raftmq chaos run` history says: message accounting, linearizability, availability.

`analyze` reads the JSON-lines history a run wrote (client operations and nemesis faults)
and combines three views:

- accounting (`chaos.accounting`): lost, duplicated, unexpected ... messages, per queue;
- linearizability of every queue's log (`QueueLogModel`, strict short reads), one partition
  per queue, checked one quiescent segment at a time (`quiescent_segments`), within a
  time limit;
- linearizability of every consumer group's committed offset per queue, when the history
  has ``commit``/``delete``/``read`` operations keyed ``[group, queue]``
  (`ConsumerOffsetModel`; a reset of offsets is a commit, a group's deletion a delete);
- linearizability of every topic's configuration, when the history has
  ``create``/``grow``/``delete``/``read`` operations keyed ``topic:<name>``
  (`TopicConfigModel`): a lost or rolled-back topic creation, growth or deletion;
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
producer, stored by a plain producer more often than it was sent, or when the history of
some queue or committed offset is not linearizable. A plain producer that retries after an
unknown outcome may store a message once per request it sent: at-least-once delivery
allows that. The workload records every such request as an ``attempt`` line of the
operation (`chaos.histories`), so a copy is explained only by an attempt of its own: such
duplicates are counted (``duplicated_retried``) but are no error, while a message read at
more offsets than it had attempts (at least one per append that did not fail) was
duplicated by the cluster itself (``duplicated_unretried``, an error). For the
linearizability check each explained extra copy becomes one more append of the same
message with unknown outcome, issued when its attempt was (`queue_operations`). A search
that ran out of time makes the verdict *unknown* (not valid, but no violation found
either). Both searches together take about `check_timeout` seconds at most: the offsets
search gets what the queue search left (at least a second). Memory is bounded too: a
search whose cache of explored configurations would outgrow `search_memory` bytes is
given up, and its key's verdict is unknown as well. ``unknown`` in results.json says,
per queue or committed offset without a verdict, why.

`analyze_run` adds what the harness itself saw (nodes that exited on their own, a drain
that did not finish): it is the verdict of `raftmq chaos run`, and `raftmq chaos check DIR`
recomputes it from the same files with the same code.

Memory follows the largest queue, not the run: `analyze` spills the history into one file
per key and handles one key at a time (see its docstring), so hours-long runs are
checked on one machine.

Whether a message came from an idempotent producer is read from its id (see
`chaos.workload.message_id`), or from the appending process when the caller names the
idempotent processes.

`Analysis.results` (results.json): ``valid``, ``verdict`` (valid | invalid | unknown),
``problems`` (one line per violation), ``operations`` (counts per f and outcome; offset
reads as ``read-offset``), ``faults`` (injected, per kind), the accounting totals (``lost``,
``duplicated`` (idempotent), ``duplicated_plain`` (plain producers: ``duplicated_retried``
with a matching retry, ``duplicated_unretried`` without), ``unexpected``, ``failed_but_read``,
``offset_conflicts``, ``ack_mismatches``, ``ack_conflicts``, ``reordered``, ``recovered``,
``unread``), ``drained`` per queue, ``linearizable`` per queue and ``offsets_linearizable``
per ``group:queue`` (true, false, or null when unknown), ``unknown`` (per queue, committed
offset or topic without a verdict: why the search gave up), the checker summaries
(``linearizability``, ``offsets_linearizability``, ``checker_seconds``,
``checked_segments``), ``analysis_seconds`` (per phase: spill, parse, operations,
accounting, queue_search, offsets_search, topics_search, availability; the spill includes
the transactional check; and total),
``longest_unavailability`` (seconds; null without leader loss; a group that never came
back counts until the history ends), ``unrecovered_faults``, ``unavailability`` per fault,
``examples`` of each error per queue, and the history's ``first_time``/``last_time``/
``seconds``.
"""

from __future__ import annotations

import bisect
import json
import math
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from .accounting import ERROR_KINDS, account_queue_history, combine_accounts
from .authcheck import SEC_OPS
from .authcheck import Checker as SecurityChecker
from .delaycheck import DELAY_OPS
from .delaycheck import Checker as DelayChecker
from .entrychecks import EntryChecker, feed
from .fifocheck import Checker as FifoChecker
from .histories import (
    NEMESIS,
    Fault,
    HistoryRecord,
    parse_faults,
    parse_numbered_jsonl,
    records_to_operations,
)
from .histories import _key as _id
from .linearizability import CheckInfo, CheckResult, PartitionResult, check_operations
from .model import INFINITY, UNKNOWN, Model, Operation
from .models import (
    ConsumerOffsetModel,
    QueueLogModel,
    TopicConfigModel,
    drop_unobserved_commits,
    drop_unseen_appends,
    pin_read_appends,
    quiescent_segments,
)
from .ordercheck import ORDER_OPS
from .ordercheck import Checker as OrderChecker
from .simplecheck import SIMPLE_OPS
from .simplecheck import Checker as SimpleChecker
from .txcheck import TX_OPS
from .txcheck import Checker as TxChecker
from .workload import TOPIC_KEY_PREFIX, TOPIC_OPS, is_idempotent_message

__all__ = [
    "INVALIDATING",
    "Analysis",
    "Unavailability",
    "analyze",
    "analyze_run",
    "offset_operations",
    "queue_operations",
    "split_records",
    "topic_operations",
    "topic_records",
]

INVALIDATING = (*ERROR_KINDS, "duplicated_unretried")
"""Accounting totals that make a run invalid when not zero ("duplicated" counts idempotent
producers only, once split)."""

_EXAMPLES = 20  # items of each error list kept in results.json
LIVENESS_BOUND = 20.0
"""Seconds after a fault's heal, or from the start of a fault that leaves a connected
majority, within which every group must acknowledge a write."""
MAJORITY_CONNECTED = frozenset({
    "kill", "pause", "partition-node", "partition-halves", "bridge", "majority-ring",
    "corrupt", "leader-transfer", "delay", "loss", "truncate-file", "bitflip-file",
    "snapshot-corrupt", "stale-leader", "membership", "kill-host", "partition-host",
})
"""Fault kinds after which a majority of every group still talks and serves clients
(`crash-unsynced` too when its scope is one node, or one host: a group keeps at most one
replica per host); `partition-clients` and `disk-full`
are not among them: the nodes that lost their clients or their disk may keep leading."""
_REPORT_OPS = 4000  # operations of each passing partition kept for the report's timeline
SEARCH_MEMORY = 1 << 30
"""Bytes one linearizability search may spend on its cache of explored configurations."""
CONFIGURATION_BYTES = 400
"""What one cached configuration costs, about (its key: two small tuples and a log node)."""


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
    load: tuple[list[tuple[float, float]], list[tuple[float, float]]] = field(
        default_factory=lambda: ([], [])
    )
    """(time, completions per second) and (time, mean latency) of the queue operations."""

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
        throughput, latency = self.load
        return write_report(
            path, model, info, title=title, faults=self.report_faults,
            accounting=self.accounting, throughput=throughput, latency=latency,
            unavailability=self.results.get("unavailability_by_fault"),
            transactions=self.results.get("transactions"),
            security=self.results.get("security"),
            delays=self.results.get("delays"),
            simple=self.results.get("simple"),
            fifo=self.results.get("fifo"),
            ordered=self.results.get("ordered"),
        )


def analyze(
    history_path: str | Path,
    *,
    queue_groups: dict[str, str],
    check_timeout: float,
    idempotent_processes: Collection[int] | None = None,
    liveness_bound: float = LIVENESS_BOUND,
    search_memory: int = SEARCH_MEMORY,
) -> Analysis:
    """Account, check and measure a run's history (see the module docstring).

    `queue_groups` maps queue keys to the Raft group hosting them (for availability);
    `check_timeout` bounds the linearizability search in seconds, `search_memory` each
    search's cache in bytes (`CONFIGURATION_BYTES` per explored configuration).

    Memory is bounded by the largest queue's (or committed offset's) history, not by the
    run's: one pass splits the file into one spill file per key (`_spill_by_key`), then
    each key is parsed, accounted and checked alone and freed before the next. Queues and
    committed offsets are independent, so this is the verdict of the whole history at
    once. What outlives a key is small: its accounting report, a window of its operations
    for the report (all of them for the first partition that is not linearizable), and
    per-second load figures.
    """
    path = Path(history_path)
    clock = _Clock()
    with _spill_dir(path) as spill:
        with clock("spill"):  # and the transactional, security, delay, simple, FIFO checks
            faults = parse_faults(path)
            routes, (tx, sec, delays, simple, fifo, ordered) = _spill_by_key(
                path, spill, (TxChecker(), SecurityChecker(), DelayChecker(), SimpleChecker(),
                              FifoChecker(), OrderChecker()))
        analysis = _analyze_spilled(
            routes, faults, queue_groups=queue_groups, check_timeout=check_timeout,
            idempotent_processes=idempotent_processes, liveness_bound=liveness_bound,
            max_cached=max(1, search_memory // CONFIGURATION_BYTES), clock=clock,
        )
    _add_transactions(analysis, tx)
    _add_security(analysis, sec)
    _add_delays(analysis, delays)
    _add_simple(analysis, simple)
    _add_fifo(analysis, fifo)
    _add_ordered(analysis, ordered)
    analysis.results["analysis_seconds"] = clock.summary()
    return analysis


class _Clock:
    """Seconds spent per phase of the analysis (results.json's ``analysis_seconds``), so a
    long run's figures say where its time went."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.monotonic() - began

    def summary(self) -> dict[str, float]:
        out = {phase: round(s, 3) for phase, s in self.seconds.items()}
        out["total"] = round(time.monotonic() - self.started, 3)
        return out


def _add_transactions(analysis: Analysis, tx: dict[str, Any]) -> None:
    """The transactional checker's verdict (`chaos.txcheck`): section ``transactions``,
    for a history with transactional records."""
    _add_section(analysis, "transactions", tx,
                 bool(tx["messages"] or sum(tx["transactions"].values()) or tx["malformed"]))


def _add_security(analysis: Analysis, sec: dict[str, Any]) -> None:
    """The security checker's verdict (`chaos.authcheck`): section ``security``, for a
    history with security records."""
    _add_section(analysis, "security", sec, bool(
        sec["changes"] or sec["logins"] or sec["authz"] or sec["final_nodes"]
        or sec["malformed"] or sec["attacks"] or sec["rss_mib_max"]))


def _add_delays(analysis: Analysis, delays: dict[str, Any]) -> None:
    """The delayed-message checker's verdict (`chaos.delaycheck`): section ``delays``, for
    a history with delayed-message records."""
    _add_section(analysis, "delays", delays,
                 bool(delays["messages"]["sent"] or delays["malformed"]))


def _add_simple(analysis: Analysis, simple: dict[str, Any]) -> None:
    """The simple-consumer checker's verdict (`chaos.simplecheck`): section ``simple``,
    for a history with simple-consumer records."""
    _add_section(analysis, "simple", simple, bool(
        simple["messages"]["sent"] or simple["receives"] or simple["malformed"]))


def _add_fifo(analysis: Analysis, fifo: dict[str, Any]) -> None:
    """The FIFO checker's verdict (`chaos.fifocheck`): section ``fifo``, for a history
    with messages of FIFO message groups."""
    _add_section(analysis, "fifo", fifo, bool(fifo["sent"] or fifo["message_groups"]))


def _add_ordered(analysis: Analysis, ordered: dict[str, Any]) -> None:
    """The ordering checker's verdict (`chaos.ordercheck`): section ``ordered``, for a
    history with ordered-consumption records."""
    _add_section(analysis, "ordered", ordered, bool(
        ordered["keys"] or ordered["holders"] or ordered["malformed"]))


def _add_section(analysis: Analysis, name: str, section: dict[str, Any], present: bool) -> None:
    """Another checker's verdict joins the run's: section `name` of results.json, its
    problems prefixed ``name:``, each one making the run invalid. A history without that
    checker's records gets no section."""
    if not present:
        return
    results = analysis.results
    results[name] = section
    if section["problems"]:
        results["problems"] = [*results["problems"],
                               *(f"{name}: {p}" for p in section["problems"])]
        results["valid"] = False
        results["verdict"] = analysis.verdict = "invalid"


def _analyze_spilled(
    routes: list[tuple[str, Path]],
    faults: list[Fault],
    *,
    queue_groups: dict[str, str],
    check_timeout: float,
    idempotent_processes: Collection[int] | None,
    liveness_bound: float,
    max_cached: int,
    clock: _Clock,
) -> Analysis:
    topic_routes = [(r, f) for r, f in routes if r.startswith(json.dumps(TOPIC_KEY_PREFIX)[:-1])]
    offset_routes = [(r, f) for r, f in routes if r.startswith("[")]
    queue_routes = [(r, f) for r, f in routes
                    if (r, f) not in topic_routes and not r.startswith("[")]
    tally = _Tally(queue_groups, faults)
    queues = _Checks(QueueLogModel(), segmented=True, max_cached=max_cached)
    budget_started = time.monotonic()
    for left, (_route, file) in zip(range(len(queue_routes), 0, -1), queue_routes, strict=True):
        with clock("parse"):
            records, _none = split_records(_parse_spilled(file))  # not a list key: a queue
        if not records:
            continue
        with clock("operations"):
            ops = queue_operations(records)  # first: it checks the values accounting reads
        with clock("accounting"):
            tally.add_queue_records(records, idempotent_processes)
        del records
        remaining = check_timeout - (time.monotonic() - budget_started)
        with clock("queue_search"):
            queues.check(ops, max(1e-3, remaining / left))
        del ops
    info = queues.info()
    model = cast(QueueLogModel, queues.failure_model)
    offsets_model = ConsumerOffsetModel()
    offsets = _Checks(offsets_model, max_cached=max_cached)
    offsets_budget = max(1.0, check_timeout - info.elapsed)
    budget_started = time.monotonic()
    for left, (_route, file) in zip(range(len(offset_routes), 0, -1), offset_routes, strict=True):
        with clock("parse"):
            _none, offset_records = split_records(_parse_spilled(file))  # a list key: offsets
        tally.add_offset_records(offset_records)
        offset_ops = offset_operations(offset_records)
        del offset_records
        remaining = offsets_budget - (time.monotonic() - budget_started)
        with clock("offsets_search"):
            offsets.check(offset_ops, max(1e-3, remaining / left))
        del offset_ops
    topics = _Checks(TopicConfigModel(), max_cached=max_cached)
    for _route, file in topic_routes:  # a few hundred operations: no budget of their own
        with clock("parse"):
            records = topic_records(_parse_spilled(file))
        tally.add_offset_records(records)
        with clock("topics_search"):
            topics.check(topic_operations(records), max(1.0, offsets_budget / 4))
    topics_info = topics.info()
    offsets_info = offsets.info()
    availability_began = time.monotonic()

    accounting = combine_accounts(tally.queues)
    totals = dict(accounting["totals"])
    totals["duplicated"] = sum(len(d) for d in tally.dup_idem.values())
    totals["duplicated_retried"] = sum(len(d) for d in tally.dup_retried.values())
    totals["duplicated_unretried"] = sum(len(d) for d in tally.dup_unretried.values())
    totals["duplicated_plain"] = totals["duplicated_retried"] + totals["duplicated_unretried"]
    accounting = {**accounting, "totals": totals}
    accounting["valid"] = all(totals.get(kind, 0) == 0 for kind in INVALIDATING)

    for f in faults:
        tally.see(f.start, f.end)
    origin = tally.first if tally.first is not None else 0.0
    last = tally.last if tally.last is not None else 0.0
    unavailable = tally.unavailability()
    by_fault, slow = _fault_liveness(
        tally.ack_index(), faults, queue_groups, liveness_bound, tally.last_append_call)
    clock.seconds["availability"] = time.monotonic() - availability_began

    problems = [f"{kind}: {totals[kind]}" for kind in INVALIDATING if totals.get(kind, 0)]
    problems += slow
    per_queue = {str(p.key): _linearizable(p.result) for p in info.partitions}
    problems += [f"not linearizable: {q}" for q, v in per_queue.items() if v is False]
    per_offset = {_offset_name(p.key): _linearizable(p.result) for p in offsets_info.partitions}
    problems += [
        f"committed offset not linearizable: {k}" for k, v in per_offset.items() if v is False
    ]
    per_topic = {str(p.key): _linearizable(p.result) for p in topics_info.partitions}
    problems += [f"topic config not linearizable: {k}" for k, v in per_topic.items() if v is False]
    if problems:
        verdict = "invalid"
    elif CheckResult.UNKNOWN in (info.result, offsets_info.result, topics_info.result):
        verdict = "unknown"
    else:
        verdict = "valid"

    results: dict[str, Any] = {
        "valid": verdict == "valid",
        "verdict": verdict,
        "problems": problems,
        "operations": tally.outcomes,
        "faults": dict(sorted(Counter(f.f for f in faults).items())),
        **{kind: totals.get(kind, 0) for kind in INVALIDATING},
        "duplicated_plain": totals["duplicated_plain"],
        "duplicated_retried": totals["duplicated_retried"],
        "attempts": tally.attempts,
        "recovered": totals.get("recovered", 0),
        "unread": totals.get("unread", 0),
        "drained": {q: report["drained"] for q, report in accounting["queues"].items()},
        "linearizable": per_queue,
        "linearizability": info.to_dict(model),
        "offsets_linearizable": per_offset,
        "offsets_linearizability": offsets_info.to_dict(offsets_model),
        "topics_linearizable": per_topic,
        "unknown": {**queues.reasons, **offsets.reasons, **topics.reasons},
        "checker_seconds": round(info.elapsed + offsets_info.elapsed + topics_info.elapsed, 3),
        "checked_segments": queues.segments,
        "longest_unavailability": (
            round(max(u.longest(last) for u in unavailable), 3) if unavailable else None
        ),
        "unrecovered_faults": sum(1 for u in unavailable if not u.recovered),
        "unavailability": [u.to_dict(origin, last) for u in unavailable],
        "unavailability_by_fault": by_fault,
        "liveness_bound": liveness_bound,
        "liveness_violations": slow,
        "examples": _examples(
            accounting["queues"], tally.dup_idem, tally.dup_retried, tally.dup_unretried,
            tally.allowed,
        ),
        "first_time": origin,
        "last_time": last,
        "seconds": round(last - origin, 3),
    }
    return Analysis(
        results, model, info, accounting, faults, unavailable, verdict, offsets_model,
        offsets_info, tally.load(),
    )


_ORPHAN = "?"  # spill route of lines that belong to no open operation (parsing rejects them)


@contextmanager
def _spill_dir(history: Path) -> Iterator[Path]:
    """A temporary directory beside the history (planned disk space), else the system's."""
    try:
        holder = tempfile.TemporaryDirectory(prefix=".analysis-", dir=history.parent)
    except OSError:
        holder = tempfile.TemporaryDirectory(prefix="raftmq-analysis-")
    with holder as name:
        yield Path(name)


def _spill_by_key(
    history: Path, into: Path, checkers: Sequence[EntryChecker] = (),
) -> tuple[list[tuple[str, Path]], list[dict[str, Any]]]:
    """Copy each operation line of `history` to its key's spill file, as ``N<TAB>line``
    (N: the line's number in the history), and return (key as JSON, file) pairs, with the
    verdict of each of `checkers` (the transactional and security ones, fed every
    decoded line as it goes by, as their `check_file` would: the history is read and
    decoded once).

    A completion or attempt goes where its process's open invoke went, as `parse_jsonl`
    pairs them; lines that pair with nothing (or are not JSON objects) go to a file of
    their own, first in the list, whose parsing raises the error `parse_jsonl` would.
    Nemesis lines are left out (`parse_faults` reads them)."""
    files: dict[str, tuple[Path, IO[str]]] = {}
    open_route: dict[Any, str] = {}

    def sink(route: str) -> IO[str]:
        found = files.get(route)
        if found is None:
            file = into / f"{len(files)}.jsonl"
            found = files[route] = (file, file.open("w", encoding="utf-8"))
        return found[1]

    sink(_ORPHAN)
    skipped: set[Any] = set()  # processes whose open operation is a transactional one

    def entries() -> Iterator[tuple[int, Any]]:
        with history.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                text = line.strip()
                if not text:
                    continue
                route = _ORPHAN
                try:
                    entry = json.loads(text)
                except json.JSONDecodeError:
                    entry = None
                else:
                    yield number, entry
                if isinstance(entry, dict):
                    process, kind = entry.get("process"), entry.get("type")
                    if process == NEMESIS:
                        continue
                    if isinstance(process, (int, str)):
                        if kind == "invoke" and (entry.get("f") in TX_OPS
                                                 or entry.get("f") in SEC_OPS
                                                 or entry.get("f") in DELAY_OPS
                                                 or entry.get("f") in SIMPLE_OPS
                                                 or entry.get("f") in ORDER_OPS):
                            # `chaos.txcheck`/`authcheck`/`delaycheck`/`simplecheck` read these
                            skipped.add(process)
                            open_route.pop(process, None)
                            continue
                        if kind == "invoke":
                            skipped.discard(process)
                            route = open_route[process] = json.dumps(entry.get("key"))
                        elif process in skipped:
                            if kind in ("ok", "fail", "info"):
                                skipped.discard(process)
                            continue
                        else:
                            route = open_route.get(process, _ORPHAN)
                            if kind in ("ok", "fail", "info"):
                                open_route.pop(process, None)
                sink(route).write(f"{number}\t{text}\n")

    try:
        feed(checkers, entries())
    finally:
        for _file, handle in files.values():
            handle.close()
    return ([(route, file) for route, (file, _handle) in files.items()],
            [checker.result() for checker in checkers])


def _parse_spilled(file: Path) -> list[HistoryRecord]:
    def lines() -> Iterator[tuple[int, str, str]]:
        with file.open(encoding="utf-8") as spilled:
            for row in spilled:
                number, _tab, text = row.partition("\t")
                yield int(number), f"line {number}", text.strip()

    return parse_numbered_jsonl(lines())


class _Checks:
    """One model's linearizability checks, one key at a time, combined into one CheckInfo.

    Each key's partition is kept for the report as a window of its first `_REPORT_OPS`
    operations by call time, except the first partition found not linearizable, kept
    whole so the report and results.json can explain it (with `failure_model`, the model
    its segment started from). With `segmented`, each queue is checked one quiescent
    segment at a time (`quiescent_segments`), and its partition is the failing segment."""

    def __init__(self, model: Model, *, segmented: bool = False,
                 max_cached: int | None = None) -> None:
        self.model = model
        self.max_cached = max_cached
        self.reasons: dict[str, str] = {}
        """Why each key without a verdict has none (time limit or memory budget)."""
        self.failure_model = model
        self.segmented = segmented
        self.partitions: list[PartitionResult] = []
        self.elapsed = 0.0
        self.timed_out = False
        self.steps = 0
        self.counted = 0
        self.failure_kept = False
        self.segments = 0

    def check(self, ops: list[Operation], timeout: float) -> None:
        if not self.segmented:
            info = check_operations(self.model, ops, timeout=timeout, stop_early=False,
                                    max_cached=self.max_cached)
            self._add(info.partitions, info, self.model)
            return
        deadline = time.monotonic() + timeout
        segments = quiescent_segments(ops)
        self.segments += len(segments)
        results: list[PartitionResult] = []
        failure: tuple[PartitionResult, Model] | None = None
        steps = dropped = 0
        unknown: str | None = None
        for number, (initial, segment) in enumerate(segments, start=1):
            model = QueueLogModel(initial=initial)
            left = deadline - time.monotonic()
            if left <= 0:
                unknown = unknown or (f"time limit: {timeout:g} s ran out before segment "
                                      f"{number} of {len(segments)}")
                self.timed_out = True
                break
            info = check_operations(model, segment, timeout=left, stop_early=False,
                                    max_cached=self.max_cached)
            self.elapsed += info.elapsed
            self.timed_out |= info.timed_out
            self.steps += info.steps
            steps += info.steps
            for p in info.partitions:
                dropped += p.dropped
                if p.result is CheckResult.ILLEGAL:
                    failure = (p, model)
                elif p.result is CheckResult.UNKNOWN and unknown is None:
                    unknown = (f"segment {number} of {len(segments)} ({len(segment)} "
                               f"operations): {p.reason}")
            if failure is not None:
                break
        self.counted += len(ops)
        if failure is not None:
            part = failure[0]
            part.steps = steps
            results = [part]
        elif ops:
            result = CheckResult.UNKNOWN if unknown is not None else CheckResult.OK
            key = self.model.partition_key(ops[0].input)
            results = [PartitionResult(0, key, ops, result, steps=steps, dropped=dropped,
                                       reason=unknown)]
        self._add(results, None, failure[1] if failure is not None else self.model)

    def _add(self, partitions: list[PartitionResult], info: CheckInfo | None,
             model: Model) -> None:
        if info is not None:
            self.elapsed += info.elapsed
            self.timed_out |= info.timed_out
            self.steps += info.steps
            self.counted += info.operations
        for p in partitions:
            p.index = len(self.partitions)
            if p.result is CheckResult.UNKNOWN:
                self.reasons[_offset_name(p.key)] = p.reason or "not searched to the end"
            if p.result is CheckResult.ILLEGAL and not self.failure_kept:
                self.failure_kept = True
                self.failure_model = model
                self.partitions.append(p)
                continue
            window = sorted(p.operations, key=lambda op: op.call)[:_REPORT_OPS]
            self.partitions.append(PartitionResult(
                p.index, p.key, window, p.result, steps=p.steps, dropped=p.dropped,
                reason=p.reason,
            ))

    def info(self) -> CheckInfo:
        results = {p.result for p in self.partitions}
        if CheckResult.ILLEGAL in results:
            overall = CheckResult.ILLEGAL
        elif results <= {CheckResult.OK}:
            overall = CheckResult.OK
        else:
            overall = CheckResult.UNKNOWN
        return CheckInfo(overall, list(self.partitions), self.elapsed, self.timed_out,
                         self.steps, counted=self.counted)


class _Tally:
    """What the analysis keeps of each key's records once they are freed: accounting
    reports, duplicate splits, operation counts, time bounds, per-group acknowledgements
    (two floats each, for availability) and per-second load."""

    def __init__(self, queue_groups: dict[str, str], faults: Sequence[Fault]) -> None:
        self.queue_groups = queue_groups
        self.faults = faults
        self.queues: dict[str, Any] = {}
        self.dup_idem: dict[str, dict[str, list[int]]] = {}
        self.dup_retried: dict[str, dict[str, list[int]]] = {}
        self.dup_unretried: dict[str, dict[str, list[int]]] = {}
        self.allowed: dict[tuple[str, str], int] = {}  # for unretried duplicates only
        self.outcomes: dict[str, dict[str, int]] = {}
        self.attempts = 0
        self.first: float | None = None
        self.last: float | None = None
        self.acks: dict[str, array[float]] = {}  # group -> call, return, call, return...
        self._ack_index: _AckIndex | None = None
        self.last_append_call = -INFINITY
        self.per_second: dict[int, list[float]] = {}  # second -> [completions, latency sum]

    def see(self, *times: float) -> None:
        for t in times:
            if math.isinf(t):
                continue
            self.first = t if self.first is None else min(self.first, t)
            self.last = t if self.last is None else max(self.last, t)

    def _common(self, records: Sequence[HistoryRecord]) -> None:
        for name, counts in _outcomes(records).items():
            into = self.outcomes.setdefault(name, {"ok": 0, "fail": 0, "info": 0})
            for kind, n in counts.items():
                into[kind] = into.get(kind, 0) + n

    def add_offset_records(self, records: Sequence[HistoryRecord]) -> None:
        self._common(records)

    def add_queue_records(
        self, records: Sequence[HistoryRecord], idempotent_processes: Collection[int] | None,
    ) -> None:
        self._common(records)
        self.attempts += sum(len(r.attempts) for r in records)
        for r in records:
            self.see(r.call, r.return_)  # the history's span: queue operations and faults
            if not math.isinf(r.return_):
                slot = self.per_second.setdefault(int(r.return_), [0, 0.0])
                slot[0] += 1
                slot[1] += r.return_ - r.call
            if r.f == "append":
                self.last_append_call = max(self.last_append_call, r.call)
            if r.f == "append" and r.status == "ok":
                group = self.queue_groups.get(str(r.key))
                if group is not None:
                    self.acks.setdefault(group, array("d")).extend((r.call, r.return_))
        accounting = account_queue_history(records)
        self.queues.update(accounting["queues"])
        senders = {(str(r.key), str(_id(r.value))): r for r in records if r.f == "append"}
        allowed = _allowed_copies(records)
        for key, queue in accounting["queues"].items():
            for msg, offsets in queue["duplicated"].items():
                if idempotent_processes is None:
                    idem = is_idempotent_message(msg)
                else:
                    sender = senders.get((key, msg))
                    idem = sender is not None and sender.process in idempotent_processes
                if idem:
                    self.dup_idem.setdefault(key, {})[msg] = offsets
                elif len(offsets) <= allowed.get((key, msg), 0):
                    self.dup_retried.setdefault(key, {})[msg] = offsets
                else:
                    self.dup_unretried.setdefault(key, {})[msg] = offsets
                    self.allowed[(key, msg)] = allowed.get((key, msg), 0)

    def ack_index(self) -> _AckIndex:
        """`_ack_index` of the acknowledgements, built on first use only."""
        if self._ack_index is None:
            self._ack_index = _ack_index(self.acks)
        return self._ack_index

    def unavailability(self) -> list[Unavailability]:
        """How long each leader loss kept its groups from acknowledging queue appends;
        nothing when the history holds no queue append at all (a `txn`-only run, whose
        availability this measure cannot see: every fault would look unrecovered)."""
        if self.last_append_call == -INFINITY:
            return []
        return _unavailability(self.ack_index(), self.faults)

    def load(self) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
        """(time, completions per second) and (time, mean latency) in at most 60 buckets."""
        if not self.per_second:
            return [], []
        lo, hi = min(self.per_second), max(self.per_second) + 1
        buckets = max(1, min(60, hi - lo))
        width = (hi - lo) / buckets
        counts = [0.0] * buckets
        sums = [0.0] * buckets
        for second, (n, total) in self.per_second.items():
            b = min(buckets - 1, int((second - lo) / width))
            counts[b] += n
            sums[b] += total
        mid = [lo + (b + 0.5) * width for b in range(buckets)]
        throughput = [(mid[b], counts[b] / width) for b in range(buckets)]
        latency = [(mid[b], sums[b] / counts[b]) for b in range(buckets) if counts[b]]
        return throughput, latency


def analyze_run(
    history_path: str | Path,
    facts: Mapping[str, Any] | None,
    *,
    check_timeout: float,
    search_memory: int = SEARCH_MEMORY,
) -> Analysis:
    """The verdict of a `raftmq chaos run`: `analyze`, plus the harness's own findings.

    `facts` is what the run learned besides the history (results.json's ``run``):
    ``queue_groups`` (queue key -> group), ``unexpected_exits`` (nodes that exited without
    the nemesis) and ``drained`` (whether the final drain reached every queue's end). A
    node exiting on its own or an unfinished drain makes the run invalid, unless
    ``harness_degraded`` says the harness left the cluster short of voters: then only
    the history or a node's exit can make it invalid; otherwise it is unknown. None: only the
    history is known (availability is not measured per group, the harness not judged).
    Either way acknowledged messages no read reached make a valid history unknown.
    Malformed facts raise ValueError.
    """
    facts = {} if facts is None else facts
    if not isinstance(facts, Mapping):
        raise ValueError(f"the run's facts must be an object, got {facts!r}")
    groups = facts.get("queue_groups", {})
    if not isinstance(groups, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in groups.items()
    ):
        raise ValueError(f"queue_groups must map queue keys to group names, got {groups!r}")
    analysis = analyze(history_path, queue_groups=groups, check_timeout=check_timeout,
                       search_memory=search_memory)
    if not facts:
        _unread_is_unknown(analysis)
        return analysis
    exits = facts.get("unexpected_exits")
    drained = facts.get("drained", False)
    if not isinstance(drained, bool):
        raise ValueError(f"drained must be true or false, got {drained!r}")
    harness = []
    if exits:
        restarted = facts.get("restarted_after_exit") or []
        again = "".join(f"; {e.get('node')} was started again {e.get('at')} s into the run"
                        for e in restarted if isinstance(e, dict) and e.get("restarted"))
        harness.append(f"nodes exited on their own: {exits}{again}")
    if not drained:
        harness.append("the final drain did not reach the end of every queue")
    if facts.get("not_ready"):
        harness.append(f"not ready after the final heal: {facts['not_ready']}")
    degraded = facts.get("harness_degraded")
    results = analysis.results
    if degraded:
        # The harness itself left groups short of voters (a membership change it could not
        # finish): a group without a leader or an unfinished drain is then its doing, not
        # the product's, and the run proves nothing either way (unknown, unless the
        # history itself shows a violation or a node exited on its own).
        results["valid"] = False
        results["problems"] = [*results.get("problems", []),
                               f"the harness left the cluster degraded: {degraded}",
                               *harness]
        if analysis.verdict != "invalid":
            results["verdict"] = analysis.verdict = "invalid" if exits else "unknown"
    elif harness:
        results["valid"] = False
        results["verdict"] = analysis.verdict = "invalid"
        results["problems"] = [*results.get("problems", []), *harness]
    _unread_is_unknown(analysis)  # after the harness's findings: only a valid one turns
    return analysis


def _unread_is_unknown(analysis: Analysis) -> None:
    """Acknowledged messages no read reached (the queue was not drained to its end: a
    history without its run's facts, or a run stopped early) are neither lost nor kept,
    so a history that shows no violation is unknown, not valid, while any is left."""
    results = analysis.results
    unread = results.get("unread", 0)
    if unread and analysis.verdict == "valid":
        results["valid"] = False
        results["verdict"] = analysis.verdict = "unknown"
        results["unknown"] = {**results.get("unknown", {}), "unread": (
            f"{unread} acknowledged messages were never read back at the offsets "
            "acknowledged (the queues were not drained to their ends): whether they were "
            "kept there is not known")}


def split_records(
    records: Sequence[HistoryRecord],
) -> tuple[list[HistoryRecord], list[HistoryRecord]]:
    """A run's queue operations (``append``/``read`` keyed by a queue) and consumer-offset
    operations (``commit``/``delete``/``read`` keyed ``[group, queue]``); topic-config
    operations (`topic_records`) are left out; any other record raises ValueError, so a
    history of something else is not taken for an empty run."""
    queue: list[HistoryRecord] = []
    offsets: list[HistoryRecord] = []
    for r in records:
        if _topic_key(r.key) and r.f in TOPIC_OPS:
            continue
        if _offset_key(r.key) and r.f in ("commit", "delete", "read"):
            offsets.append(r)
        elif not _offset_key(r.key) and r.f in ("append", "read"):
            queue.append(r)
        else:
            where = f"line {r.line}: " if r.line else ""
            raise ValueError(
                f"{where}{r.f!r} keyed {r.key!r} is neither a queue operation (append or read "
                "keyed by a queue) nor a consumer-offset one (commit, delete or read keyed "
                "[group, queue]) nor a topic-config one (create, grow, delete or read keyed "
                f"{TOPIC_KEY_PREFIX}<topic>)"
            )
    return queue, offsets


def topic_records(records: Sequence[HistoryRecord]) -> list[HistoryRecord]:
    """A run's topic-config operations (keyed ``topic:<name>``)."""
    return [r for r in records if _topic_key(r.key) and r.f in TOPIC_OPS]


def topic_operations(records: Sequence[HistoryRecord]) -> list[Operation]:
    """The topic-config check's operations of a run's topic records."""
    return records_to_operations(records, "topic-config")


def _allowed_copies(records: Sequence[HistoryRecord]) -> dict[tuple[str, str], int]:
    """Copies each appended message may have: one per recorded attempt, and at least one
    per append that did not fail (a history without attempt lines allows one copy)."""
    out: dict[tuple[str, str], int] = {}
    for r in records:
        if r.f == "append" and r.status != "fail":
            slot = (str(r.key), str(_id(r.value)))
            out[slot] = out.get(slot, 0) + max(1, len(r.attempts))
    return out


def queue_operations(records: Sequence[HistoryRecord]) -> list[Operation]:
    """The queue-log check's operations of a run's queue records.

    An append with recorded attempts takes effect no earlier than the request that did
    it: the acknowledged copy comes from the last attempt, an unknown one from the first
    or a later one. Each message read or acknowledged at c > 1 offsets in all was stored
    c times (an acknowledged offset no read covered counts too: the copy read may be a
    retry's earlier one), which only requests of its own can explain: its operation stands
    for one copy, and up to c - 1 more become appends of unknown outcome, issued at the
    operation's earliest other attempts, so each copy has an attempt of its own that came
    no later. Copies beyond the attempts get none, and fail the check. Appends whose offset
    the reads prove are pinned there (`pin_read_appends`), and unknown-outcome appends
    nobody read are left out when the reads cover the queue (`drop_unseen_appends`).
    """
    ops = records_to_operations(records, "queue-log")
    seen: dict[tuple[Any, Any], set[int]] = {}  # (key, message) -> offsets it is stored at
    for op in ops:
        if op.input[0] == "read" and isinstance(op.output, tuple):
            for k, msg in enumerate(op.output):
                seen.setdefault((op.input[1], msg), set()).add(op.input[2] + k)
    for op in ops:
        if op.input[0] == "append" and isinstance(op.output, int) and not op.pending:
            slot = (op.input[1], op.input[2])
            if slot in seen:  # an acknowledged message nobody read needs no copy
                seen[slot].add(op.output)
    sends: dict[tuple[Any, Any], list[Operation]] = {}
    later: dict[tuple[Any, Any], list[float]] = {}
    live = [r for r in records if r.status != "fail"]
    for i, (r, op) in enumerate(zip(live, ops, strict=True)):
        if op.input[0] != "append":
            continue
        if r.attempts:
            sent = r.attempts[-1] if r.status == "ok" else r.attempts[0]
            ops[i] = op = Operation(op.client_id, op.input, max(op.call, sent), op.output,
                                    op.return_)
        slot = (op.input[1], op.input[2])
        if len(seen.get(slot, ())) < 2:
            continue
        sends.setdefault(slot, []).append(op)
        # the acknowledged copy came from the last attempt; an unknown one may be any
        later.setdefault(slot, []).extend(r.attempts[:-1] if r.status == "ok" else r.attempts[1:])
    extra: list[Operation] = []
    for slot, appends in sends.items():
        n = len(seen[slot]) - len(appends)
        sender = appends[0]
        extra += [
            Operation(sender.client_id, sender.input, at, UNKNOWN, INFINITY)
            for at in sorted(later[slot])[: max(0, n)]
        ]
    return drop_unseen_appends(pin_read_appends(ops + extra))


def offset_operations(records: Sequence[HistoryRecord]) -> list[Operation]:
    """The consumer-offset check's operations of a run's offset records."""
    return drop_unobserved_commits(records_to_operations(records, "consumer-offset"))


def _linearizable(result: CheckResult) -> bool | None:
    """True, False, or None when the search ran out of time."""
    return None if result is CheckResult.UNKNOWN else result is CheckResult.OK


def _topic_key(key: Any) -> bool:
    return isinstance(key, str) and key.startswith(TOPIC_KEY_PREFIX)


def _offset_key(key: Any) -> bool:
    """Consumer-offset operations are keyed ``[group, queue]``; queue operations by queue."""
    return isinstance(key, tuple)


def _offset_name(key: Any) -> str:
    return ":".join(str(k) for k in key) if isinstance(key, tuple) else str(key)


def _outcomes(records: Sequence[HistoryRecord]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in records:
        if _topic_key(r.key):
            name = f"topic-{r.f}"
        elif _offset_key(r.key):
            name = {"read": "read-offset", "delete": "delete-group"}.get(r.f, r.f)
        else:
            name = r.f
        by = out.setdefault(name, {"ok": 0, "fail": 0, "info": 0})
        by[r.status] = by.get(r.status, 0) + 1
    return out


def _unavailability(index: _AckIndex, faults: Sequence[Fault]) -> list[Unavailability]:
    """Per fault with leaders: time to the first acknowledged append to each of their groups.

    `index` is `_ack_index` of each group's acknowledged appends. Only appends invoked at
    or after the fault's start count, so an acknowledgement already on its way when the
    leader went away is not taken for a recovered group.
    """
    out = []
    for fault in faults:
        value = fault.start_value
        leaders = value.get("leaders") if isinstance(value, dict) else None
        if not isinstance(leaders, dict) or not leaders:
            continue
        groups: dict[str, float | None] = {}
        for group in sorted(leaders):
            t = _first_ack_after(index, str(group), fault.start)
            groups[str(group)] = None if t is None else t - fault.start
        out.append(Unavailability(fault.f, fault.start, fault.end, dict(leaders), groups))
    return out


_AckIndex = dict[str, tuple["array[float]", "array[float]"]]


def _ack_index(acks: Mapping[str, array[float]]) -> _AckIndex:
    """Per group, its acknowledged appends' calls in order and, for each, the earliest
    acknowledgement among the appends invoked from then on (see `_first_ack_after`).
    `acks` holds each group's acknowledged appends as flat (call, return) pairs; the index
    is two flat arrays too, built once (a two-hour run acknowledges 700,000 appends)."""
    index: _AckIndex = {}
    for group, flat in acks.items():
        calls, returns = flat[0::2], flat[1::2]
        order = sorted(range(len(calls)), key=calls.__getitem__)
        suffix_min = array("d", bytes(8 * len(order)))
        best = INFINITY
        for i in range(len(order) - 1, -1, -1):
            best = min(best, returns[order[i]])
            suffix_min[i] = best
        index[group] = (array("d", (calls[i] for i in order)), suffix_min)
    return index


_NO_ACKS: tuple[array[float], array[float]] = (array("d"), array("d"))


def _first_ack_after(index: _AckIndex, group: str, t: float) -> float | None:
    """When the first append to `group` invoked at or after `t` was acknowledged."""
    calls, suffix_min = index.get(group, _NO_ACKS)
    i = bisect.bisect_left(calls, t)
    return suffix_min[i] if i < len(calls) else None


def _fault_liveness(
    index: _AckIndex,
    faults: Sequence[Fault],
    queue_groups: dict[str, str],
    bound: float,
    last_call: float,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per fault kind: count and worst seconds to a write during and after the fault;
    and one problem line per group that accepted no write within `bound` seconds of a
    heal (judged only when no other fault began and appends went on that long).
    `index` as for `_unavailability`; `last_call` is when the last append was invoked.
    Only groups that `queue_groups` names are judged: the appends of any other group
    (all of them, for a history checked without its run's facts) cannot be told apart."""
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
        hit = (sorted(str(g) for g in leaders if str(g) in every)
               if isinstance(leaders, dict) and leaders else every)
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
    dup_retried: dict[str, dict[str, list[int]]],
    dup_unretried: dict[str, dict[str, list[int]]],
    allowed: dict[tuple[str, str], int],
) -> dict[str, dict[str, Any]]:
    """A few items of every non-empty error list per queue, to start an investigation."""
    out: dict[str, dict[str, Any]] = {}
    for key, report in queues.items():
        items: dict[str, Any] = {}
        for kind in ERROR_KINDS:
            if kind == "duplicated":
                continue
            value = report.get(kind)
            if value:
                items[kind] = value[:_EXAMPLES]
        for name, dups in (("duplicated", dup_idem), ("duplicated_retried", dup_retried)):
            if dups.get(key):
                items[name] = dict(list(dups[key].items())[:_EXAMPLES])
        if dup_unretried.get(key):
            items["duplicated_unretried"] = {
                msg: {"offsets": offsets, "attempts": allowed.get((key, msg), 0)}
                for msg, offsets in list(dup_unretried[key].items())[:_EXAMPLES]
            }
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
