"""The internal produce path (`broker.state.parts.moves`): a duty moves stored messages into
another queue of its group exactly once, however often leaders change and restart it,
and every replica applying the same log holds the same queues."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.parts.base import ControlResult, ErrorResult
from broker.state.statemachine import BrokerState, MoveMessage, control_create_topic
from raftlog.types import Entry, EntryType
from wire.protocol import Code
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch

DUTY = "retry-duty"


def _produce(k: int, n: int) -> tuple[EntryType, bytes]:
    msgs = [OutgoingMessage(b"m%d-%d" % (k, i)) for i in range(n)]
    return EntryType.MESSAGES, STORED_PREFIX.pack(1000 + k) + encode_batch("src", 0, msgs)


def _move(offset: int) -> tuple[EntryType, bytes]:
    return EntryType.CONTROL, MoveMessage(DUTY, "src", 0, offset, "dlq", 0).encode()


PRELUDE = [(EntryType.CONTROL, control_create_topic("src", 1, [0])),
           (EntryType.CONTROL, control_create_topic("dlq", 1, [0]))]


def _apply(state: BrokerState, log: list[tuple[EntryType, bytes]], start: int = 1) -> list[Any]:
    return [state.apply(Entry(start + i, 1, t, d)) for i, (t, d) in enumerate(log)]


def _replay(log: list[tuple[EntryType, bytes]], upto: int) -> BrokerState:
    s = BrokerState("g")
    _apply(s, log[:upto])
    return s


def _pending(view: BrokerState, chosen: set[int]) -> list[int]:
    """What the duty, on a leader whose state is `view`, still has to move: the chosen
    offsets of the source queue from where its moves stand, in order."""
    lo = view.moves.next_to_move(DUTY, "src", 0)
    _min, end = view.queue_range("src", 0)
    return [o for o in range(lo, end) if o in chosen]


def _moved_sources(s: BrokerState) -> list[int]:
    """The source offsets of the messages in the destination queue, in its order."""
    src = s.queues.queue("src", 0)
    place = {(e.index, e.start): e.offset
             for e in (src.get(o) for o in range(*s.queue_range("src", 0)))}
    dlq = s.queues.queue("dlq", 0)
    return [place[(e.index, e.start)] for e in (dlq.get(o) for o in range(*s.queue_range("dlq", 0)))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_duty_restarted_on_any_leader_at_any_point_moves_each_message_once(
        data: st.DataObject) -> None:
    log = list(PRELUDE)
    produced = 0
    chosen: set[int] = set()
    terms = data.draw(st.integers(1, 6), label="leader terms")
    for term in range(terms):
        for k in range(data.draw(st.integers(0, 3), label="batches")):
            n = data.draw(st.integers(1, 4))
            log.append(_produce(term * 10 + k, n))
            chosen |= {o for o in range(produced, produced + n)
                       if data.draw(st.booleans(), label=f"move {o}")}
            produced += n
        # A new leader, whose applied state may lag the log (entries still on their
        # way), starts the duty: it proposes a prefix of what its view shows pending
        # before it loses leadership in turn.
        lag = data.draw(st.integers(0, len(log) - len(PRELUDE)), label="view lag")
        view = _replay(log, len(log) - lag)
        pending = _pending(view, chosen)
        stop = data.draw(st.integers(0, len(pending)), label="proposed before it stops")
        log += [_move(o) for o in pending[:stop]]
    # the last leader's view is whole and it runs the duty to the end
    final_view = _replay(log, len(log))
    log += [_move(o) for o in _pending(final_view, chosen)]

    a = _replay(log, len(log))
    assert _moved_sources(a) == sorted(chosen)  # each chosen message once, in order
    assert a.queue_range("src", 0) == (0, produced)  # the source keeps its messages
    # every replica applying the same log agrees, however it got there
    cut = data.draw(st.integers(0, len(log)), label="snapshot at")
    b = BrokerState.restore("g", _replay(log, cut).snapshot())
    _apply(b, log[cut:], cut + 1)
    assert b.snapshot() == a.snapshot()


def test_moves_are_refused_into_unknown_queues_and_past_the_source_end() -> None:
    s = BrokerState("g")
    _apply(s, [*PRELUDE, _produce(0, 2)])
    bad = [MoveMessage(DUTY, "src", 0, 0, "nope", 0), MoveMessage(DUTY, "src", 0, 5, "dlq", 0),
           MoveMessage(DUTY, "src", 3, 0, "dlq", 0)]
    codes = [r.code for r in _apply(s, [(EntryType.CONTROL, m.encode()) for m in bad], 4)
             if isinstance(r, ErrorResult)]
    assert codes == [Code.UNKNOWN_QUEUE, Code.OFFSET_TOO_LARGE, Code.UNKNOWN_QUEUE]
    assert s.moves.next_to_move(DUTY, "src", 0) == 0  # the refusals moved nothing
    r1, r2 = _apply(s, [_move(1), _move(0)], 7)
    assert r1 == ControlResult("move", 1) and r2 == ControlResult("move", 0, 1)
    assert _moved_sources(s) == [1]  # offset 0 was passed over by the duty
