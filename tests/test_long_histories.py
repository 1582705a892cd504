"""Long histories: the reductions that keep the queue-log check linear, checked against the
unreduced search, and the analysis of synthetic histories of several lengths."""

from __future__ import annotations

import random
from typing import Any

import pytest

from chaos.linearizability import CheckResult, check_operations
from chaos.model import INFINITY, UNKNOWN, Operation
from chaos.models import LogState, QueueLogModel, drop_unseen_appends, pin_read_appends


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


def test_log_state_reads_any_offset() -> None:
    messages = [f"m{i}" for i in range(1000)]
    state = LogState.of(messages)
    rng = random.Random(3)
    for _ in range(300):
        a = rng.randrange(1001)
        b = rng.randrange(a, 1002)
        assert state.window(a, b) == tuple(messages[a:b])
    assert state[999] == "m999" and state[0] == "m0" and list(state)[:3] == messages[:3]
