"""Linearizability checking: Wing & Gong's search with Lowe's cache, as Porcupine does it.

The history of each partition becomes a doubly linked list of call and return entries sorted by
time (calls before returns at equal times, so touching operations count as concurrent). The
search walks the list: at a call it tries to linearize the operation now (the model must accept
its output), lifting the call and its return out of the list; at a return it has run into an
operation that should already have taken effect, so it backtracks. A set of (linearized
operations, model state) pairs already explored prunes the search; the bitset is a Python int.

Partitions (P-compositionality) are searched in round-robin slices, so one easy illegal
partition is found quickly even next to a hard one, the search stops at the first illegal
partition, and a deadline turns an unfinished search into UNKNOWN instead of hanging. So does a
memory budget: a search whose cache of explored configurations outgrows ``max_cached`` is
given up (UNKNOWN, with that reason) rather than taking the machine's memory.

Beyond Porcupine, four prunings keep chaos histories (many concurrent reads, many timed-out
writes) from exploding; each keeps the verdict exact:

- A read-only operation (``Model.is_read_only``) that is legal when reached is linearized at
  once and never tried later instead: moving it earlier, to a point where it was already
  called and legal, cannot break a linearization, since it changes nothing.
- An operation the model calls doomed (``Model.doomed``: no later state accepts it) ends the
  branch at once, since every operation must eventually take effect.
- Operations pending forever are tried only after the others have been tried, so a branch
  that is already doomed is recognised before it is extended with them.
- Operations pending forever with equal (prepared) inputs are interchangeable and are only
  linearized in call order (``Model.prepare`` may erase unobservable details to make more of
  them equal).
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from itertools import repeat
from typing import Any

from .model import INFINITY, UNKNOWN, Event, Model, Operation, events_to_operations

__all__ = [
    "CheckInfo",
    "CheckResult",
    "PartitionResult",
    "check_events",
    "check_operations",
]

_TAIL = 20  # linearized operations shown before the failing one in JSON summaries
_SLICE = 2048  # search steps per partition between deadline checks and partition switches


class CheckResult(Enum):
    OK = "ok"
    ILLEGAL = "illegal"
    UNKNOWN = "unknown"

    @property
    def verdict(self) -> str:
        return {"ok": "linearizable", "illegal": "not-linearizable", "unknown": "unknown"}[
            self.value
        ]


@dataclass(slots=True)
class PartitionResult:
    """Outcome for one independent sub-history; operation numbers index ``operations``."""

    index: int
    key: Hashable
    operations: list[Operation]
    result: CheckResult
    linearization: tuple[int, ...] = ()
    """Longest linearizable prefix found (a complete linearization when OK)."""
    failing: int | None = None
    """For ILLEGAL: an operation that cannot take effect in the state after the longest
    prefix although it must (its return comes next, or no later state could accept it)."""
    partials: list[tuple[int, ...]] | None = None
    """With ``compute_partial``: for every operation, the longest prefix that contains it
    (deduplicated), as Porcupine's visualisation shows them."""
    steps: int = 0
    dropped: int = 0
    """Read-only operations with unknown output, legal anywhere and left out of the search."""
    reason: str | None = None
    """For UNKNOWN: why the search did not finish (time limit or memory budget)."""

    def states(self, model: Model) -> list[Any]:
        """Model state after each operation of ``linearization``, starting from ``init``."""
        state = model.init()
        out = []
        for i in self.linearization:
            op = self.operations[i]
            ok, state = model.step(state, op.input, op.output)
            out.append(state)
        return out


@dataclass(slots=True)
class CheckInfo:
    """Overall verdict plus what the report and the CLI need to explain it."""

    result: CheckResult
    partitions: list[PartitionResult]
    elapsed: float
    timed_out: bool = False
    steps: int = field(default=0)
    counted: int | None = None
    """Operations checked, when ``partitions`` keep only some of theirs (a long history's
    analysis keeps a window of each passing partition for its report)."""

    @property
    def operations(self) -> int:
        if self.counted is not None:
            return self.counted
        return sum(len(p.operations) for p in self.partitions)

    @property
    def first_failure(self) -> PartitionResult | None:
        for p in self.partitions:
            if p.result is CheckResult.ILLEGAL:
                return p
        return None

    def to_dict(self, model: Model) -> dict[str, Any]:
        """JSON-able summary: verdict, counts, timing and the first failure explained."""
        counts = {r.value: 0 for r in CheckResult}
        for p in self.partitions:
            counts[p.result.value] += 1
        out: dict[str, Any] = {
            "verdict": self.result.verdict,
            "result": self.result.value,
            "operations": self.operations,
            "partitions": len(self.partitions),
            "partition_results": counts,
            "elapsed": round(self.elapsed, 6),
            "timed_out": self.timed_out,
            "steps": self.steps,
            "first_failure": None,
        }
        failure = self.first_failure
        if failure is not None:
            out["first_failure"] = describe_failure(model, failure)
        return out


def describe_failure(model: Model, part: PartitionResult) -> dict[str, Any]:
    """JSON-able account of an illegal partition: where it fails and what came before."""
    ops = part.operations
    info: dict[str, Any] = {
        "partition": part.index,
        "key": jsonable(part.key),
        "partition_operations": len(ops),
        "longest_prefix": len(part.linearization),
        "linearized_tail": [
            model.describe_operation(ops[i].input, ops[i].output)
            for i in part.linearization[-_TAIL:]
        ],
        "operation": None,
    }
    if part.failing is not None:
        op = ops[part.failing]
        info["operation"] = {
            "index": part.failing,
            "client": op.client_id,
            "call": op.call,
            "return": None if op.pending else op.return_,
            "description": model.describe_operation(op.input, op.output),
        }
        states = part.states(model)
        before = states[-1] if states else model.init()
        info["state_before"] = model.describe_state(before)
        info["why"] = model.explain(before, op.input, op.output)
    return info


def jsonable(value: Any) -> Any:
    """Best-effort conversion of partition keys and values for JSON output."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return repr(value)


class _Keyed:
    """Cache wrapper for states compared with the model's own ``equal``/``hash``."""

    __slots__ = ("state", "h", "model")

    def __init__(self, model: Model, state: Any) -> None:
        self.state = state
        self.h = model.hash(state)
        self.model = model

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Keyed) and self.model.equal(self.state, other.state)


class _Search:
    """Resumable search over one partition, entries stored in parallel lists.

    Index 0 is the head sentinel, 1..2n the entries in time order, 2n+1 the tail sentinel.
    ``match[e]`` is the return entry of a call entry and 0 for a return entry.

    Each configuration is scanned in two passes up to its first return entry: ``want == 1``
    tries operations that return, ``want == 2`` then those pending forever (``kind`` tells
    them apart); only after both does the search backtrack. Backtracking resumes the pass that
    had picked the popped operation. Jumping to an operation's own return entry with
    ``want == 2`` is how a branch is abandoned early.
    """

    __slots__ = (
        "model",
        "ops",
        "nxt",
        "prv",
        "match",
        "inp",
        "out",
        "slot",
        "jdx",
        "taken",
        "opid",
        "tail",
        "entry",
        "state",
        "lin",
        "lin_p",
        "calls",
        "cache",
        "native",
        "best_len",
        "longest",
        "done",
        "ok",
        "steps",
        "n",
        "twin",
        "ro",
        "doomed",
        "kind",
        "want",
        "has_pending",
        "best_entries",
        "low",
        "blocker",
        "hard_w",
        "hard",
        "inf_from",
    )

    def __init__(
        self, model: Model, ops: Sequence[Operation], include: list[int], compute_partial: bool
    ) -> None:
        inputs = model.prepare(ops)
        items = []
        for j, i in enumerate(include):
            op = ops[i]
            if op.return_ < op.call:
                raise ValueError(f"operation returns before its call: {op!r}")
            items.append((op.call, 0, j))
            items.append((op.return_, 1, j))
        items.sort()
        n = len(include)
        size = 2 * n + 2
        self.n = n
        self.tail = size - 1
        self.nxt = list(range(1, size + 1))
        self.prv = list(range(-1, size - 1))
        self.match = [0] * size
        self.inp: list[Any] = [None] * size
        self.out: list[Any] = [None] * size
        # The linearized set is two bitsets, one over the operations that return (numbered
        # in return order) and one over those pending forever (in call order), each kept as
        # (k, rest): the first k operations of its order are all linearized, ``rest`` holds
        # the operations from k on. Every operation that returned before the search's
        # frontier is linearized, so ``rest`` spans only the operations around the frontier,
        # and a cache key costs a few words instead of one bit per operation of the
        # partition (which made memory grow with the square of the history's length).
        self.slot = [0] * size  # the operation's number in its order
        self.jdx = [0] * size  # the operation's index in ``include``
        self.taken = [False] * size  # call entries currently linearized
        self.opid = [-1] * size
        # Operations pending forever with equal inputs and outputs are interchangeable: any
        # linearization can swap them so that they take effect in call order. ``twin[e]`` is
        # the previous such call entry, which must be linearized before ``e`` may be.
        self.twin = [0] * size
        self.ro = [False] * size
        self.kind = [0] * size  # call entries: 1, or 2 when the operation is pending forever
        # Operations pending forever that the model accepts in any state (``always_legal``)
        # can all go last: once every operation that returns is linearized (the first
        # entry left is a return at +inf, from ``inf_from`` on) and ``hard`` (those pending
        # forever that are not always legal and not yet linearized) is 0, the search is done.
        self.hard_w = [0] * size  # 1 for the call entries ``hard`` counts
        self.hard = 0
        self.inf_from = size - 1
        last_twin: dict[Any, int] = {}
        call_pos = [0] * n
        for pos, (at, kind, j) in enumerate(items, start=1):
            if kind == 1 and at == INFINITY and self.inf_from == size - 1:
                self.inf_from = pos
            if kind == 0:
                call_pos[j] = pos
                op = ops[include[j]]
                self.inp[pos] = inputs[include[j]]
                self.out[pos] = op.output
                self.jdx[pos] = j
                self.ro[pos] = model.is_read_only(self.inp[pos], op.output)
                self.kind[pos] = 2 if op.return_ == INFINITY else 1
                if op.return_ == INFINITY:
                    if not model.always_legal(self.inp[pos], op.output):
                        self.hard_w[pos] = 1
                        self.hard += 1
                    try:
                        key = (self.inp[pos], op.output)
                        self.twin[pos] = last_twin.get(key, 0)
                        last_twin[key] = pos
                    except TypeError:  # unhashable input: no symmetry reduction
                        pass
            else:
                self.match[call_pos[j]] = pos
            self.opid[pos] = include[j]
        returning = sorted(
            (p for p in range(1, size - 1) if self.match[p] and self.kind[p] == 1),
            key=lambda p: (items[self.match[p] - 1][0], p),
        )
        for rank, p in enumerate(returning):
            self.slot[p] = rank
        pending = [p for p in range(1, size - 1) if self.match[p] and self.kind[p] == 2]
        for rank, p in enumerate(pending):
            self.slot[p] = rank
        self.model = model
        self.ops = ops
        self.entry = self.nxt[0]
        self.state = model.init()
        self.lin = (0, 0)  # (k, rest) of the operations that return
        self.lin_p = (0, 0)  # (k, rest) of those pending forever
        self.calls: list[tuple[int, Any, Any, Any]] = []  # (entry, state before, lin, lin_p)
        self.cache: set[tuple[Any, ...]] = set()
        self.native = model.native_states
        self.want = 1
        self.has_pending = 2 in self.kind
        self.doomed = model.doomed if type(model).doomed is not Model.doomed else None
        self.best_entries: list[int] = []  # call entries of the longest prefix found
        self.best_len = 0
        self.blocker: int | None = None
        self.low = 0  # the stack has not dropped below this depth since ``best_entries``
        self.longest: list[tuple[int, ...] | None] | None = [None] * n if compute_partial else None
        self.done = n == 0
        self.ok = True
        self.steps = 0

    def run(self, budget: int) -> bool | None:
        """Advance up to ``budget`` steps; True/False once decided, None if unfinished."""
        if self.done:
            return self.ok
        nxt = self.nxt
        prv = self.prv
        match = self.match
        inp = self.inp
        out = self.out
        slot = self.slot
        taken = self.taken
        tail = self.tail
        step = self.model.step
        calls = self.calls
        push = calls.append
        pop = calls.pop
        cache = self.cache
        seen = cache.add
        native = self.native
        model = self.model
        e = self.entry
        state = self.state
        lin = self.lin
        lin_p = self.lin_p
        best_len = self.best_len
        longest = self.longest
        twin = self.twin
        ro = self.ro
        doomed = self.doomed
        kind = self.kind
        want = self.want
        best = self.best_entries
        low = self.low
        opid = self.opid
        two_passes = self.has_pending
        hard_w = self.hard_w
        hard = self.hard
        inf_from = self.inf_from
        result: bool | None = None
        used = 0
        for _ in repeat(None, budget):
            used += 1
            m = match[e]
            if m:
                if kind[e] != want:
                    e = nxt[e]
                    continue
                t = twin[e]
                if t and not taken[t]:
                    e = nxt[e]
                    continue
                ok, new_state = step(state, inp[e], out[e])
                if ok:
                    j = slot[e]
                    k, rest = lin if kind[e] == 1 else lin_p
                    if j == k:
                        rest |= 1
                        t = (rest ^ (rest + 1)).bit_length() - 1  # trailing ones
                        grown = (k + t, rest >> t)
                    else:
                        grown = (k, rest | (1 << (j - k)))
                    new_lin, new_lin_p = (grown, lin_p) if kind[e] == 1 else (lin, grown)
                    key = (
                        (new_lin, new_lin_p, new_state) if native
                        else (new_lin, new_lin_p, _Keyed(model, new_state))
                    )
                    if key not in cache:
                        seen(key)
                        push((e, state, lin, lin_p))
                        taken[e] = True
                        hard -= hard_w[e]
                        state = new_state
                        lin = new_lin
                        lin_p = new_lin_p
                        p = prv[e]
                        q = nxt[e]
                        nxt[p] = q
                        prv[q] = p
                        p = prv[m]
                        q = nxt[m]
                        nxt[p] = q
                        prv[q] = p
                        e = nxt[0]
                        want = 1
                        if e == tail:
                            result = True
                            break
                        continue
                    if ro[e]:
                        # a legal read-only operation is taken at once, so if that leads to an
                        # explored configuration this one fails too: backtrack
                        e = m
                        want = 2
                        continue
                elif doomed is not None and doomed(state, inp[e], out[e]):
                    e = m  # it can never be linearized from here: backtrack
                    want = 2
                    continue
                e = nxt[e]
            elif want == 1 and two_passes:
                if e >= inf_from and not hard:
                    # only operations pending forever are left, each legal in any state
                    result = True
                    break
                # now the operations pending forever (see the class docstring)
                want = 2
                e = nxt[0]
            else:
                depth = len(calls)
                if not depth:
                    if not best_len:
                        self.blocker = opid[e]
                    result = False
                    break
                if depth > best_len:
                    # the longest prefix so far: only the part above ``low`` changed since.
                    # Nothing extends it, so the entry that stops it is an operation that can
                    # not take effect here: it had to go before its return or is doomed.
                    del best[low:]
                    best.extend([c[0] for c in calls[low:]])
                    best_len = low = depth
                    self.blocker = opid[e]
                if longest is not None:
                    self._record_partial(depth)
                e, state, lin, lin_p = pop()
                taken[e] = False
                hard += hard_w[e]
                if depth <= low:
                    low = depth - 1
                m = match[e]
                p = prv[m]
                q = nxt[m]
                nxt[p] = m
                prv[q] = m
                p = prv[e]
                q = nxt[e]
                nxt[p] = e
                prv[q] = e
                if ro[e]:
                    # a read-only operation is never tried later instead: keep backtracking
                    e = m
                    want = 2
                else:
                    want = kind[e]  # resume the pass that had picked this operation
                    e = q
        self.steps += used
        self.hard = hard
        self.low = low
        self.want = want
        self.entry = e
        self.state = state
        self.lin = lin
        self.lin_p = lin_p
        self.best_len = best_len
        if result is not None:
            self.done = True
            self.ok = result
            if result:
                best[:] = [c[0] for c in calls]
                e = nxt[0]
                while e != tail:  # the operations left to go last, if any
                    if match[e]:
                        best.append(e)
                    e = nxt[e]
                self.best_len = len(best)
                if longest is not None:
                    for j in range(len(longest)):
                        longest[j] = self.best
            self.cache = set()  # free memory as soon as the verdict is known
        return result

    def _record_partial(self, depth: int) -> None:
        longest = self.longest
        assert longest is not None
        opid = self.opid
        seq: tuple[int, ...] | None = None
        for e, *_rest in self.calls:
            j = self.jdx[e]
            current = longest[j]
            if current is None or depth > len(current):
                if seq is None:
                    seq = tuple(opid[c[0]] for c in self.calls)
                longest[j] = seq

    @property
    def best(self) -> tuple[int, ...]:
        """Operations (partition indices) of the longest linearizable prefix found."""
        opid = self.opid
        return tuple(opid[e] for e in self.best_entries[: self.best_len])

    def failing(self) -> int | None:
        """The operation that cannot take effect after the longest prefix (for ILLEGAL)."""
        return self.blocker

    def partials(self) -> list[tuple[int, ...]] | None:
        if self.longest is None:
            return None
        unique = dict.fromkeys(seq for seq in self.longest if seq is not None)
        return list(unique)


def check_operations(
    model: Model,
    history: Sequence[Operation],
    *,
    timeout: float | None = None,
    compute_partial: bool = False,
    stop_early: bool = True,
    max_cached: int | None = None,
) -> CheckInfo:
    """Check a history of operations; ``timeout`` seconds bound the search (UNKNOWN after).

    With ``stop_early`` (the default) the search ends at the first illegal partition and the
    partitions not finished by then are reported UNKNOWN. ``max_cached`` bounds each
    partition's cache of explored configurations, which is what a search's memory grows
    with (the rest is proportional to the partition): a partition whose cache outgrows it
    is given up, UNKNOWN, so a hard history costs a verdict, never the machine's memory.
    """
    started = time.monotonic()
    deadline = started + timeout if timeout is not None and timeout > 0 else None
    partitions = model.partition(list(history))
    results: list[PartitionResult] = []
    searches: list[_Search] = []
    for index, ops in enumerate(partitions):
        key = model.partition_key(ops[0].input) if ops else None
        include = [
            i
            for i, op in enumerate(ops)
            if not (op.output is UNKNOWN and model.is_read_only(op.input, op.output))
        ]
        results.append(
            PartitionResult(index, key, ops, CheckResult.UNKNOWN, dropped=len(ops) - len(include))
        )
        searches.append(_Search(model, ops, include, compute_partial))

    active = sorted(range(len(searches)), key=lambda i: searches[i].n)
    illegal = False
    timed_out = False
    while active:
        still: list[int] = []
        for i in active:
            search = searches[i]
            budget = _SLICE
            if max_cached is not None:  # a step caches one configuration at most
                budget = min(budget, max(1, max_cached + 1 - len(search.cache)))
            verdict = search.run(budget)
            if verdict is None:
                if max_cached is not None and len(search.cache) > max_cached:
                    results[i].reason = (
                        f"memory budget: more than {max_cached} configurations explored "
                        f"after {search.steps} steps"
                    )
                    search.cache = set()  # given up: free it now
                    continue
                still.append(i)
            elif not verdict:
                illegal = True
                if stop_early:
                    break
            if deadline is not None and time.monotonic() >= deadline:
                timed_out = True
                break
        if timed_out or (illegal and stop_early):
            break
        active = still
    timed_out = timed_out and not all(s.done for s in searches)

    elapsed = time.monotonic() - started
    for res, search in zip(results, searches, strict=True):
        res.steps = search.steps
        res.linearization = search.best
        if search.done:
            res.result = CheckResult.OK if search.ok else CheckResult.ILLEGAL
            if not search.ok:
                res.failing = search.failing()
        elif res.reason is None:
            res.reason = (
                f"time limit: {timeout:g} s ran out after {search.steps} steps"
                if timed_out and timeout is not None
                else "not searched to the end: another partition is not linearizable"
            )
        res.partials = search.partials()

    if any(r.result is CheckResult.ILLEGAL for r in results):
        overall = CheckResult.ILLEGAL
    elif all(r.result is CheckResult.OK for r in results):
        overall = CheckResult.OK
    else:
        overall = CheckResult.UNKNOWN
    return CheckInfo(overall, results, elapsed, timed_out, sum(r.steps for r in results))


def check_events(
    model: Model,
    events: Sequence[Event],
    *,
    timeout: float | None = None,
    compute_partial: bool = False,
    stop_early: bool = True,
) -> CheckInfo:
    """Check a call/return event history; an event's position stands in for its time."""
    return check_operations(
        model,
        events_to_operations(events),
        timeout=timeout,
        compute_partial=compute_partial,
        stop_early=stop_early,
    )
