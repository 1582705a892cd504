"""Linearizability checker: reference verdicts, timeouts, partitions, and a brute-force oracle."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.histories import load_operations
from chaos.linearizability import CheckResult, check_events, check_operations
from chaos.model import INFINITY, UNKNOWN, Event, EventKind, Model, Operation
from chaos.models import (
    CasRegisterModel,
    ConsumerOffsetModel,
    KeyValueModel,
    QueueLogModel,
    drop_unobserved_commits,
    pin_read_appends,
)
from tests.paths import REPO_ROOT

SHARED = REPO_ROOT.parent / "shared"
PORCUPINE = SHARED / "testdata" / "porcupine"


def _verdicts(sub: str) -> list[tuple[str, str]]:
    path = PORCUPINE / sub / "VERDICTS"
    if not path.exists():
        return []
    return [tuple(line.split()) for line in path.read_text().splitlines() if line.strip()]


_NO_DATA = pytest.mark.skipif(
    not (PORCUPINE / "jepsen" / "VERDICTS").exists(),
    reason=f"Porcupine test histories not found under {PORCUPINE}",
)
_SETS = {
    "jepsen": ("jepsen-log", "cas-register", CasRegisterModel),
    "kv": ("edn-kv", "kv", KeyValueModel),
}
_CASES = [
    pytest.param(sub, name, verdict, id=name) for sub in _SETS for name, verdict in _verdicts(sub)
] or [pytest.param("jepsen", "missing", "linearizable", id="missing")]


@_NO_DATA
@pytest.mark.parametrize(("sub", "name", "verdict"), _CASES)
def test_reference_verdict(sub: str, name: str, verdict: str) -> None:
    fmt, model_name, model_cls = _SETS[sub]
    ops = load_operations(PORCUPINE / sub / name, fmt, model_name)
    info = check_operations(model_cls(), ops)
    assert info.result.verdict == verdict
    if info.result is CheckResult.ILLEGAL:
        failure = info.first_failure
        assert failure is not None and failure.failing is not None
        assert failure.failing not in failure.linearization
        # the reported operation really cannot take effect after the longest prefix
        model = model_cls()
        states = failure.states(model)
        op = failure.operations[failure.failing]
        assert not model.step(states[-1] if states else model.init(), op.input, op.output)[0]


@_NO_DATA
def test_kv_unpartitioned_agrees_on_small_files() -> None:
    for name, verdict in _verdicts("kv"):
        if name.startswith("c01"):
            ops = load_operations(PORCUPINE / "kv" / name, "edn-kv", "kv")
            assert check_operations(KeyValueModel(partitioned=False), ops).result.verdict == verdict


def _op(client: int, inp: tuple, call: float, out: object, ret: float) -> Operation:
    return Operation(client, inp, call, out, ret)


def _hard_history(writers: int) -> list[Operation]:
    """Concurrent writes of unknown outcome, then a read of a value nobody wrote."""
    ops = [_op(i, ("write", i), 0.0, UNKNOWN, INFINITY) for i in range(writers)]
    ops.append(_op(writers, ("read",), 1.0, 999, 2.0))
    return ops


def test_tiny_timeout_is_unknown() -> None:
    info = check_operations(CasRegisterModel(), _hard_history(18), timeout=1e-4)
    assert info.result is CheckResult.UNKNOWN
    assert info.timed_out
    assert info.partitions[0].result is CheckResult.UNKNOWN
    assert (info.partitions[0].reason or "").startswith("time limit: 0.0001 s ran out after")


def test_a_search_over_its_memory_budget_gives_up_with_the_reason() -> None:
    """The cache of explored configurations is what grows: 14 writers cost about 20 MB
    without a budget (ILLEGAL after 2 million steps); within one of 2,000 configurations
    the partition is given up early, UNKNOWN with the reason, and memory stays small."""
    import tracemalloc

    tracemalloc.start()
    try:
        info = check_operations(CasRegisterModel(), _hard_history(14), max_cached=2000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.result is CheckResult.UNKNOWN and not info.timed_out
    reason = info.partitions[0].reason
    assert reason is not None and reason.startswith("memory budget: more than 2000"), reason
    assert peak < 4 << 20, peak
    assert check_operations(CasRegisterModel(), _hard_history(8), max_cached=2000).result is (
        CheckResult.ILLEGAL)  # a search that fits still gets its verdict


def test_hard_history_without_timeout_is_illegal() -> None:
    info = check_operations(CasRegisterModel(), _hard_history(8))
    assert info.result is CheckResult.ILLEGAL
    assert not info.timed_out


def test_illegal_partition_stops_search_of_hard_one() -> None:
    model = KeyValueModel()
    hard = [_op(i, ("put", "hard", f"v{i}"), 0.0, UNKNOWN, INFINITY) for i in range(20)]
    hard.append(_op(99, ("get", "hard"), 1.0, "nobody", 2.0))
    easy = [
        _op(100, ("put", "easy", "a"), 0.0, None, 1.0),
        _op(101, ("get", "easy"), 2.0, "b", 3.0),
    ]
    info = check_operations(model, hard + easy, timeout=30)
    assert info.result is CheckResult.ILLEGAL
    assert info.first_failure is not None and info.first_failure.key == "easy"
    assert not info.timed_out  # stopped by the illegal partition, not by the 30 s limit
    assert {p.key: p.result for p in info.partitions}["hard"] is CheckResult.UNKNOWN


def test_check_all_partitions_without_stop_early() -> None:
    ops = [
        _op(0, ("put", "a", "x"), 0, None, 1),
        _op(1, ("get", "a"), 2, "y", 3),
        _op(2, ("put", "b", "x"), 0, None, 1),
        _op(3, ("get", "b"), 2, "x", 3),
    ]
    info = check_operations(KeyValueModel(), ops, stop_early=False)
    assert [p.result for p in info.partitions] == [CheckResult.ILLEGAL, CheckResult.OK]


def test_event_api_matches_porcupine_register_example() -> None:
    # Porcupine's README example: a write concurrent with two reads, one of which sees it.
    def call(cid: int, value: object, op_id: int) -> Event:
        return Event(cid, EventKind.CALL, value, op_id)

    def ret(cid: int, value: object, op_id: int) -> Event:
        return Event(cid, EventKind.RETURN, value, op_id)

    ok_events = [
        call(0, ("write", 100), 0),
        call(1, ("read",), 1),
        call(2, ("read",), 2),
        ret(2, None, 2),
        ret(1, 100, 1),
        ret(0, None, 0),
    ]
    bad_events = [
        call(0, ("write", 200), 0),
        call(1, ("read",), 1),
        ret(1, 200, 1),
        call(2, ("read",), 2),
        ret(2, None, 2),
        ret(0, None, 0),
    ]
    assert check_events(CasRegisterModel(), ok_events).result is CheckResult.OK
    assert check_events(CasRegisterModel(), bad_events).result is CheckResult.ILLEGAL


def test_touching_intervals_count_as_concurrent() -> None:
    # the read returns at the instant the write is called: either order is allowed
    ops = [_op(0, ("read",), 0.0, 1, 1.0), _op(1, ("write", 1), 1.0, None, 2.0)]
    assert check_operations(CasRegisterModel(), ops).result is CheckResult.OK


def test_complete_linearization_replays_and_partials() -> None:
    ops = [
        _op(0, ("write", 1), 0, None, 10),
        _op(1, ("read",), 1, 1, 2),
        _op(2, ("write", 2), 3, None, 4),
        _op(3, ("read",), 5, 1, 6),
    ]
    info = check_operations(CasRegisterModel(), ops, compute_partial=True)
    part = info.partitions[0]
    assert info.result is CheckResult.ILLEGAL
    assert part.partials
    assert all(len(seq) <= len(ops) for seq in part.partials)
    good = ops[:3]
    info = check_operations(CasRegisterModel(), good, compute_partial=True)
    part = info.partitions[0]
    assert sorted(part.linearization) == [0, 1, 2]
    assert part.states(CasRegisterModel())[-1] == 2
    assert part.partials == [part.linearization]


def test_unknown_reads_are_dropped_from_search() -> None:
    ops = [_op(0, ("write", 1), 0, None, 1), _op(1, ("read",), 2, UNKNOWN, 3)]
    info = check_operations(CasRegisterModel(), ops)
    assert info.result is CheckResult.OK
    assert info.partitions[0].dropped == 1


class _ListLog(Model[list, tuple, object]):
    """Unhashable list states: exercises the model-defined equality/hash cache path."""

    def init(self) -> list:
        return []

    def step(self, state: list, input: tuple, output: object) -> tuple[bool, list]:
        if input[0] == "append":
            return True, [*state, input[1]]
        return output == len(state), state

    def equal(self, a: list, b: list) -> bool:
        return a == b

    def hash(self, state: list) -> int:
        return hash(tuple(state))


def test_model_defined_equality() -> None:
    model = _ListLog()
    assert not model.native_states
    ops = [_op(i, ("append", i), 0, None, 5) for i in range(4)] + [_op(9, ("len",), 6, 4, 7)]
    assert check_operations(model, ops).result is CheckResult.OK
    ops[-1] = _op(9, ("len",), 6, 3, 7)
    assert check_operations(model, ops).result is CheckResult.ILLEGAL


def test_bad_interval_rejected() -> None:
    with pytest.raises(ValueError):
        check_operations(CasRegisterModel(), [_op(0, ("read",), 2.0, None, 1.0)])


# -- brute-force oracle ---------------------------------------------------------------------


def _brute_force(model: Model, ops: list[Operation]) -> bool:
    """Some order of all operations that respects real time is accepted by the model."""
    for perm in itertools.permutations(range(len(ops))):
        pos = {op: k for k, op in enumerate(perm)}
        if any(
            ops[a].return_ < ops[b].call and pos[a] > pos[b]
            for a in range(len(ops))
            for b in range(len(ops))
        ):
            continue
        state = model.init()
        for k in perm:
            ok, state = model.step(state, ops[k].input, ops[k].output)
            if not ok:
                break
        else:
            return True
    return False


def _times(draw: st.DrawFn, *, pending_one_in: int) -> tuple[int, bool, float]:
    """Call time, whether the operation never returns, and its return time."""
    call = draw(st.integers(0, 8))
    pending = draw(st.integers(0, pending_one_in - 1)) == 0
    return call, pending, INFINITY if pending else call + draw(st.integers(0, 4))


@st.composite
def _register_history(draw: st.DrawFn) -> list[Operation]:
    n = draw(st.integers(1, 5))
    ops = []
    for client in range(n):
        call, pending, ret = _times(draw, pending_one_in=6)
        kind = draw(st.sampled_from(["read", "write", "cas"]))
        value = draw(st.sampled_from([None, 1, 2]))
        if kind == "read":
            ops.append(_op(client, ("read",), call, UNKNOWN if pending else value, ret))
        elif kind == "write":
            ops.append(_op(client, ("write", draw(st.sampled_from([1, 2]))), call, None, ret))
        else:
            out = UNKNOWN if pending else draw(st.booleans())
            ops.append(_op(client, ("cas", value, draw(st.sampled_from([1, 2]))), call, out, ret))
    return ops


@settings(max_examples=300, deadline=None)
@given(_register_history())
def test_register_agrees_with_brute_force(ops: list[Operation]) -> None:
    model = CasRegisterModel()
    expected = _brute_force(model, ops)
    assert (check_operations(model, ops).result is CheckResult.OK) == expected


@st.composite
def _queue_history(draw: st.DrawFn) -> list[Operation]:
    n = draw(st.integers(1, 5))
    ops = []
    for client in range(n):
        call, pending, ret = _times(draw, pending_one_in=5)
        if draw(st.booleans()):
            out = UNKNOWN if pending else draw(st.integers(0, 3))
            ops.append(_op(client, ("append", "q", f"m{client}"), call, out, ret))
        else:
            offset = draw(st.integers(0, 2))
            msgs = tuple(draw(st.lists(st.sampled_from([f"m{i}" for i in range(n)]), max_size=2)))
            ops.append(
                _op(client, ("read", "q", offset, 2), call, UNKNOWN if pending else msgs, ret)
            )
    return ops


@settings(max_examples=300, deadline=None)
@given(_queue_history())
def test_queue_log_agrees_with_brute_force(ops: list[Operation]) -> None:
    model = QueueLogModel()
    expected = _brute_force(model, ops)
    assert (check_operations(model, ops).result is CheckResult.OK) == expected


# -- a plain recursive oracle for larger histories ------------------------------------------


def _reference(model: Model, ops: list[Operation]) -> bool:
    """Wing & Gong without any pruning but a memo of failed (done, state) pairs."""
    failed: set[tuple[frozenset[int], object]] = set()

    def search(done: frozenset[int], state: object) -> bool:
        if len(done) == len(ops):
            return True
        if (done, state) in failed:
            return False
        first_return = min(op.return_ for i, op in enumerate(ops) if i not in done)
        for i, op in enumerate(ops):
            if i not in done and op.call <= first_return:
                ok, after = model.step(state, op.input, op.output)
                if ok and search(done | {i}, after):
                    return True
        failed.add((done, state))
        return False

    return search(frozenset(), model.init())


@st.composite
def _recorded_queue_history(draw: st.DrawFn) -> list[Operation]:
    """Operations of a real log (some timed out, some duplicates), maybe with one output broken."""
    rnd = draw(st.randoms(use_true_random=False))
    n = draw(st.integers(1, 10))
    timed = sorted((rnd.uniform(0, 10), c) for c in range(n))
    log: list[str] = []
    ops: list[Operation] = []
    for point, c in timed:
        call, ret = point - rnd.uniform(0, 2), point + rnd.uniform(0, 2)
        if rnd.random() < 0.6:
            msg = f"m{c}" if rnd.random() < 0.8 else "dup"
            if rnd.random() < 0.2:
                if rnd.random() < 0.5:
                    log.append(msg)
                ops.append(_op(c, ("append", "q", msg), call, UNKNOWN, INFINITY))
            else:
                ops.append(_op(c, ("append", "q", msg), call, len(log), ret))
                log.append(msg)
        else:
            offset, count = rnd.randint(0, len(log)), rnd.randint(1, 3)
            ops.append(
                _op(c, ("read", "q", offset, count), call, tuple(log[offset : offset + count]), ret)
            )
    if draw(st.booleans()):
        k = rnd.randrange(len(ops))
        op = ops[k]
        if op.output is not UNKNOWN:
            if op.input[0] == "append":
                broken: object = op.output + rnd.choice([-1, 1])
            else:
                broken = op.output[::-1] if len(op.output) > 1 else (*op.output, "m0")
            ops[k] = _op(op.client_id, op.input, op.call, broken, op.return_)
    return ops


@settings(max_examples=300, deadline=None)
@given(_recorded_queue_history(), st.sampled_from(["end", "prefix"]))
def test_queue_log_agrees_with_reference(ops: list[Operation], short_reads: str) -> None:
    model = QueueLogModel(short_reads)
    info = check_operations(model, ops)
    assert (info.result is CheckResult.OK) == _reference(model, ops)
    failure = info.first_failure
    if failure is not None:
        states = failure.states(model)
        op = failure.operations[failure.failing]
        assert not model.step(states[-1] if states else model.init(), op.input, op.output)[0]


# -- the pruning that keeps realistic histories cheap ---------------------------------------


def test_many_concurrent_reads_cost_no_branching() -> None:
    ops = [_op(0, ("write", 1), 0, None, 1)]
    ops += [_op(c, ("read",), 2, 1, 100) for c in range(1, 200)]  # all before the write of 2
    ops += [_op(999, ("write", 2), 50, None, 51), _op(998, ("read",), 60, 2, 61)]
    info = check_operations(CasRegisterModel(), ops)
    assert info.result is CheckResult.OK
    assert info.steps < 5000
    ops.append(_op(997, ("read",), 70, 1, 71))  # a stale read after 2 was seen
    info = check_operations(CasRegisterModel(), ops)
    assert info.result is CheckResult.ILLEGAL
    assert info.steps < 50000


def test_timed_out_appends_of_unread_messages_are_interchangeable() -> None:
    ops = [_op(100 + i, ("append", "q", f"lost{i}"), i, UNKNOWN, INFINITY) for i in range(40)]
    ops += [_op(1, ("append", "q", f"m{i}"), 50 + 2 * i, i, 51 + 2 * i) for i in range(100)]
    ops.append(_op(2, ("read", "q", 95, 10), 300, tuple(f"m{i}" for i in range(95, 100)), 301))
    info = check_operations(QueueLogModel(), ops, timeout=30)
    assert info.result is CheckResult.OK
    assert info.steps < 20_000  # about 5,000: the 40 unknown appends are not permuted


@settings(max_examples=300, deadline=None)
@given(_recorded_queue_history())
def test_pinning_read_appends_keeps_the_verdict(ops: list[Operation]) -> None:
    model = QueueLogModel()
    pinned = pin_read_appends(ops)
    assert (check_operations(model, pinned).result is CheckResult.OK) == _reference(model, ops)


@st.composite
def _retried_queue_history(draw: st.DrawFn) -> list[Operation]:
    """A real log where timed-out sends were retried: each attempt of a retried message is
    an append of unknown outcome that landed at once or never, between acknowledged
    appends; reads may miss some offsets; maybe one read is broken."""
    rnd = draw(st.randoms(use_true_random=False))
    log: list[str] = []
    ops: list[Operation] = []
    for t in range(draw(st.integers(2, 7))):
        if rnd.random() < 0.6:
            msg = rnd.choice(["r0", "r1"])
            if rnd.random() < 0.7:
                log.append(msg)
            ops.append(_op(int(msg[1]), ("append", "q", msg), t, UNKNOWN, INFINITY))
        else:
            log.append(f"a{t}")
            ops.append(_op(5, ("append", "q", f"a{t}"), t, len(log) - 1, t + 0.5))
    for r in range(draw(st.integers(1, 3))):
        offset, count = rnd.randint(0, len(log)), rnd.randint(1, 4)
        got = tuple(log[offset:offset + count])
        if r == 0 and got and draw(st.booleans()):
            got = got[::-1] if len(got) > 1 else (*got, "r0")
        ops.append(_op(10 + r, ("read", "q", offset, count), 9 + r, got, 9.5 + r))
    return ops


@settings(max_examples=300, deadline=None)
@given(_retried_queue_history())
def test_pinning_retried_copies_keeps_the_verdict(ops: list[Operation]) -> None:
    model = QueueLogModel()
    pinned = pin_read_appends(ops)
    assert (check_operations(model, pinned).result is CheckResult.OK) == _reference(model, ops)


def test_retried_copies_are_pinned_in_call_order_when_each_has_an_offset() -> None:
    ops = [_op(1, ("append", "q", "a"), k, UNKNOWN, INFINITY) for k in (0, 2, 1)]
    ops.append(_op(2, ("append", "q", "b"), 3, 1, 4))
    ops.append(_op(3, ("read", "q", 0, 8), 10, ("a", "b", "a", "a"), 11))
    pinned = pin_read_appends(ops)
    assert [op.output for op in pinned[:3]] == [0, 3, 2]  # called at 0, 2, 1
    assert all(op.pending for op in pinned[:3]) and pinned[3:] == ops[3:]
    # three attempts for two copies: the third may have landed unread, or never
    fewer = [*ops[:3], ops[3], _op(3, ("read", "q", 0, 8), 10, ("a", "b", "a"), 11)]
    assert pin_read_appends(fewer) == fewer


def test_a_recovered_append_is_pinned_where_reads_saw_it() -> None:
    ops = [_op(1, ("append", "q", "a"), 0, UNKNOWN, INFINITY)]
    ops += [_op(2, ("append", "q", f"m{i}"), 1 + i, i, 1.5 + i) for i in range(3)]
    ops.append(_op(3, ("read", "q", 0, 8), 10, ("m0", "m1", "a", "m2"), 11))
    pinned = pin_read_appends(ops)
    assert pinned[0].output == 2 and pinned[0].pending
    assert pinned[1:] == ops[1:]
    # two unknown copies of one message read at two offsets: which is which is not pinned
    ops.append(_op(4, ("append", "q", "a"), 0, UNKNOWN, INFINITY))
    assert pin_read_appends(ops) == ops


@st.composite
def _offset_history(draw: st.DrawFn) -> list[Operation]:
    """Unique commits (some of unknown outcome) and reads of one consumer offset."""
    rnd = draw(st.randoms(use_true_random=False))
    ops: list[Operation] = []
    value: object = None
    for c in range(draw(st.integers(1, 8))):
        call = rnd.uniform(0, 10)
        ret = call + rnd.uniform(0, 2)
        if rnd.random() < 0.5:
            offset = 100 + c
            pending = rnd.random() < 0.4
            if not pending or rnd.random() < 0.5:
                value = offset
            ops.append(_op(c, ("commit", "k", offset), call, None, INFINITY if pending else ret))
        else:
            seen = value if rnd.random() < 0.8 else rnd.choice([None, 100, 101, 102])
            ops.append(_op(c, ("read", "k"), call, seen, ret))
    return ops


@settings(max_examples=300, deadline=None)
@given(_offset_history())
def test_dropping_unobserved_commits_keeps_the_verdict(ops: list[Operation]) -> None:
    model = ConsumerOffsetModel()
    kept = drop_unobserved_commits(ops)
    assert all(op in ops for op in kept)
    assert (check_operations(model, kept).result is CheckResult.OK) == _reference(model, ops)
