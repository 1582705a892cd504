"""Models: hand-written legal and illegal histories, and properties of generated ones."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from chaos.linearizability import CheckResult, check_operations
from chaos.model import INFINITY, UNKNOWN, Model, Operation
from chaos.models import (
    CasRegisterModel,
    ConsumerOffsetModel,
    KeyValueModel,
    QueueLogModel,
    make_model,
)


def _op(client: int, inp: tuple, call: float, out: Any, ret: float) -> Operation:
    return Operation(client, inp, call, out, ret)


def _check(model: Model, ops: list[Operation]) -> CheckResult:
    return check_operations(model, ops).result


OK, ILLEGAL = CheckResult.OK, CheckResult.ILLEGAL


# -- CAS register ---------------------------------------------------------------------------


def test_register_starts_nil_and_cas_semantics() -> None:
    m = CasRegisterModel()
    assert _check(m, [_op(0, ("read",), 0, None, 1)]) is OK
    assert _check(m, [_op(0, ("read",), 0, 0, 1)]) is ILLEGAL
    seq = [
        _op(0, ("write", 1), 0, None, 1),
        _op(0, ("cas", 1, 2), 2, True, 3),
        _op(0, ("cas", 1, 3), 4, False, 5),
        _op(0, ("read",), 6, 2, 7),
    ]
    assert _check(m, seq) is OK
    assert _check(m, [*seq[:2], _op(0, ("cas", 1, 3), 4, True, 5)]) is ILLEGAL
    assert _check(m, [seq[0], _op(0, ("cas", 1, 2), 2, False, 3)]) is ILLEGAL


def test_register_unknown_cas_may_apply_later() -> None:
    m = CasRegisterModel()
    ops = [
        _op(0, ("write", 1), 0, None, 1),
        _op(1, ("cas", 1, 5), 2, UNKNOWN, INFINITY),
        _op(2, ("read",), 3, 1, 4),
        _op(2, ("read",), 5, 5, 6),
    ]
    assert _check(m, ops) is OK
    ops.append(_op(2, ("read",), 7, 1, 8))  # cannot go back to 1 after 5 was seen
    assert _check(m, ops) is ILLEGAL


# -- key/value ------------------------------------------------------------------------------


def test_kv_put_append_get_per_key() -> None:
    m = KeyValueModel()
    ops = [
        _op(0, ("put", "a", "x"), 0, None, 1),
        _op(0, ("append", "a", "y"), 2, None, 3),
        _op(1, ("get", "b"), 0, "", 1),
        _op(1, ("get", "a"), 4, "xy", 5),
    ]
    assert _check(m, ops) is OK
    assert len(check_operations(m, ops).partitions) == 2
    ops[-1] = _op(1, ("get", "a"), 4, "yx", 5)
    assert _check(m, ops) is ILLEGAL
    assert _check(KeyValueModel(partitioned=False), ops) is ILLEGAL


# -- queue log ------------------------------------------------------------------------------


def _append(
    client: int, msg: str, call: float, offset: Any, ret: float, queue: str = "q"
) -> Operation:
    return _op(client, ("append", queue, msg), call, offset, ret)


def _read(
    client: int, offset: int, n: int, call: float, msgs: Any, ret: float, queue: str = "q"
) -> Operation:
    return _op(
        client, ("read", queue, offset, n), call, msgs if msgs is UNKNOWN else tuple(msgs), ret
    )


def test_queue_log_append_offsets_and_reads() -> None:
    m = QueueLogModel()
    ops = [
        _append(0, "a", 0, 0, 1),
        _append(1, "b", 0.5, 1, 2),
        _read(2, 0, 10, 3, ["a", "b"], 4),
        _read(2, 1, 1, 5, ["b"], 6),
    ]
    assert _check(m, ops) is OK
    assert _check(m, [*ops[:2], _read(2, 0, 10, 3, ["b", "a"], 4)]) is ILLEGAL
    assert _check(m, [_append(0, "a", 0, 1, 1)]) is ILLEGAL  # first offset is 0


def test_queue_log_concurrent_appends_any_order() -> None:
    m = QueueLogModel()
    ops = [_append(0, "a", 0, 1, 5), _append(1, "b", 0, 0, 5), _read(2, 0, 2, 6, ["b", "a"], 7)]
    assert _check(m, ops) is OK


def test_queue_log_short_read_only_at_end() -> None:
    ops = [_append(0, "a", 0, 0, 1), _append(0, "b", 2, 1, 3)]
    # a read of 5 that returns one message although two are there: stale or truncated
    short = [*ops, _read(1, 0, 5, 4, ["a"], 5)]
    assert _check(QueueLogModel(), short) is ILLEGAL
    assert _check(QueueLogModel(short_reads="prefix"), short) is OK
    # concurrent with the second append it may have stopped at the end
    assert (
        _check(QueueLogModel(), [*ops[:1], _append(0, "b", 2, 1, 6), _read(1, 0, 5, 4, ["a"], 5)])
        is OK
    )
    # reading past the end returns nothing
    assert _check(QueueLogModel(), [*ops, _read(1, 7, 5, 4, [], 5)]) is OK
    assert _check(QueueLogModel(), [*ops, _read(1, 0, 1, 4, [], 5)]) is ILLEGAL
    with pytest.raises(ValueError):
        QueueLogModel(short_reads="whatever")


def test_queue_log_timed_out_append_may_land_anywhere_or_never() -> None:
    m = QueueLogModel()
    lost = _append(0, "t", 0, UNKNOWN, INFINITY)
    landed_late = [
        lost,
        _append(1, "b", 1, 0, 2),
        _read(2, 0, 5, 3, ["b"], 4),
        _read(2, 0, 5, 5, ["b", "t"], 6),
    ]
    assert _check(m, landed_late) is OK
    never = [lost, _append(1, "b", 1, 0, 2), _read(2, 0, 5, 3, ["b"], 4)]
    assert _check(m, never) is OK
    first = [lost, _append(1, "b", 1, 1, 2), _read(2, 0, 5, 3, ["t", "b"], 4)]
    assert _check(m, first) is OK
    # it cannot land before its own call
    early = [_append(1, "b", 0, 1, 1), _op(0, ("append", "q", "t"), 2, UNKNOWN, INFINITY)]
    assert _check(m, early) is ILLEGAL


def test_queue_log_read_observing_duplicate() -> None:
    m = QueueLogModel()
    once = [_append(0, "a", 0, 0, 1), _read(1, 0, 5, 2, ["a", "a"], 3)]
    assert _check(m, once) is ILLEGAL  # one append cannot show up twice
    # a producer retry after a timeout legitimately duplicates the message
    retried = [
        _append(0, "a", 0, UNKNOWN, INFINITY),
        _append(0, "a", 1, 1, 2),
        _read(1, 0, 5, 3, ["a", "a"], 4),
    ]
    assert _check(m, retried) is OK


def test_log_state_equality_and_hash() -> None:
    empty = QueueLogModel().init()
    a = empty.append("x").append("y")
    b = empty.append("x").append("y")
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != empty.append("y").append("x") and a != empty.append("x")
    assert len({a, b}) == 1 and a.window(1, 10) == ("y",) and a.window(5, 9) == ()


def test_queue_log_partitions_by_queue() -> None:
    m = QueueLogModel()
    ops = [
        _append(0, "a", 0, 0, 1, queue="q1"),
        _append(0, "b", 0, 0, 1, queue="q2"),
        _read(1, 0, 5, 2, ["b"], 3, queue="q2"),
    ]
    info = check_operations(m, ops)
    assert info.result is OK
    assert [p.key for p in info.partitions] == ["q1", "q2"]


# -- consumer offsets -----------------------------------------------------------------------


def test_consumer_offsets_register() -> None:
    m = ConsumerOffsetModel()
    key = ("group", "q0")
    ops = [
        _op(0, ("read", key), 0, None, 1),
        _op(0, ("commit", key, 10), 2, None, 3),
        _op(1, ("read", key), 4, 10, 5),
        _op(0, ("commit", key, 4), 6, None, 7),  # a reset: offsets may go backwards
        _op(1, ("read", key), 8, 4, 9),
    ]
    assert _check(m, ops) is OK
    assert _check(ConsumerOffsetModel(monotonic=True), ops) is ILLEGAL
    assert _check(m, [*ops[:3], _op(1, ("read", key), 6, 3, 7)]) is ILLEGAL


def test_describe() -> None:
    assert (
        QueueLogModel().describe_operation(("read", "q", 2, 3), ("a",))
        == "read('q', @2, n=3) -> ['a']"
    )
    assert CasRegisterModel().describe_operation(("cas", None, 1), UNKNOWN) == "cas(nil, 1) -> ?"
    log = QueueLogModel().init()
    for m in range(40):
        log = log.append(m)
    assert "more" in QueueLogModel().describe_state(log)
    assert log[3] == 3 and log[-1] == 39 and log[5:8] == (5, 6, 7) and tuple(log)[:2] == (0, 1)
    with pytest.raises(ValueError):
        make_model("nope")


# -- properties -----------------------------------------------------------------------------

_MSGS = st.sampled_from(["a", "b", "c"])
_INPUTS = {
    "cas-register": st.one_of(
        st.just(("read",)),
        st.tuples(st.just("write"), st.integers(0, 3)),
        st.tuples(st.just("cas"), st.one_of(st.none(), st.integers(0, 3)), st.integers(0, 3)),
    ),
    "kv": st.one_of(
        st.tuples(st.just("get"), st.sampled_from("xy")),
        st.tuples(st.sampled_from(["put", "append"]), st.sampled_from("xy"), _MSGS),
    ),
    "queue-log": st.one_of(
        st.tuples(st.just("append"), st.sampled_from(["q1", "q2"]), _MSGS),
        st.tuples(
            st.just("read"), st.sampled_from(["q1", "q2"]), st.integers(0, 4), st.integers(1, 3)
        ),
    ),
    "consumer-offset": st.one_of(
        st.tuples(st.just("commit"), st.sampled_from([("g", 0), ("g", 1)]), st.integers(0, 9)),
        st.tuples(st.just("read"), st.sampled_from([("g", 0), ("g", 1)])),
    ),
}


def _run(model: Model, inputs: list[tuple]) -> tuple[list[Any], list[Any]]:
    """Outputs a correct implementation would give, and the state before each input."""
    states: dict[Any, Any] = {}
    outputs, before = [], []
    for inp in inputs:
        key = model.partition_key(inp)
        state = states.get(key, model.init())
        before.append(state)
        out = _honest_output(model, state, inp)
        ok, states[key] = model.step(state, inp, out)
        assert ok
        outputs.append(out)
    return outputs, before


def _honest_output(model: Model, state: Any, inp: tuple) -> Any:
    if isinstance(model, CasRegisterModel):
        return state if inp[0] == "read" else (state == inp[1] if inp[0] == "cas" else None)
    if isinstance(model, KeyValueModel):
        return state if inp[0] == "get" else None
    if isinstance(model, QueueLogModel):
        return len(state) if inp[0] == "append" else state[inp[2] : inp[2] + inp[3]]
    return state if inp[0] == "read" else None


def _sequential(inputs: list[tuple], outputs: list[Any], slack: list[float]) -> list[Operation]:
    # operation k takes effect at time 10k, inside its interval however wide (overlaps included)
    return [
        _op(k % 3, inp, 10 * k - s, out, 10 * k + s)
        for k, (inp, out, s) in enumerate(zip(inputs, outputs, slack, strict=True))
    ]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(_INPUTS)))
def test_histories_from_the_model_are_linearizable(data: st.DataObject, name: str) -> None:
    model = make_model(name)
    inputs = data.draw(st.lists(_INPUTS[name], min_size=1, max_size=25))
    slack = data.draw(st.lists(st.floats(0, 25), min_size=len(inputs), max_size=len(inputs)))
    outputs, _ = _run(model, inputs)
    assert check_operations(model, _sequential(inputs, outputs, slack)).result is OK


_MUTANTS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(0, 4),
    _MSGS,
    st.tuples(_MSGS),
    st.tuples(_MSGS, _MSGS),
    st.just(""),
)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(_INPUTS)))
def test_one_wrong_output_in_a_sequential_history(data: st.DataObject, name: str) -> None:
    model = make_model(name)
    inputs = data.draw(st.lists(_INPUTS[name], min_size=1, max_size=25))
    outputs, before = _run(model, inputs)
    k = data.draw(st.integers(0, len(inputs) - 1))
    mutant = data.draw(_MUTANTS)
    assume(mutant != outputs[k] or type(mutant) is not type(outputs[k]))
    outputs[k] = mutant
    ops = _sequential(inputs, outputs, [0.0] * len(inputs))
    # strictly sequential: the only order is the given one, so the wrong output decides alone
    accepted, _ = model.step(before[k], inputs[k], mutant)
    assert check_operations(model, ops).result is (OK if accepted else ILLEGAL)
