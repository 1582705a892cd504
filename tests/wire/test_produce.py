"""The multi-batch PRODUCE request's encoding (`wire.produce`), and the outcomes
the state machine gives the batches of one request, each on its own."""

from __future__ import annotations

import pytest

from broker.state.statemachine import BrokerState, ErrorResult, ProduceResult, control_create_topic
from raftlog.types import Entry, EntryType
from raftmq.client.errors import may_have_applied
from wire.produce import (
    MAX_BATCHES,
    decode_outcome,
    encode_error,
    encode_ok,
    split_batches,
)
from wire.protocol import Code, RequestError
from wire.records import STORED_PREFIX, encode_batch


def test_split_batches_cuts_the_body_at_the_given_sizes():
    a = encode_batch("t", 0, [b"one"])
    b = encode_batch("u", 3, [b"two", b"three"])
    parts = split_batches([len(a), len(b)], a + b)
    assert [bytes(p) for p in parts] == [a, b]


@pytest.mark.parametrize("sizes", [
    None, [], "12", [0], [-1, 13], [True], [1.5], [5, 5], [4], [3, 3, 3, 3, 3],
    [1] * (MAX_BATCHES + 1),
])
def test_split_batches_refuses_sizes_that_do_not_describe_the_body(sizes):
    body = b"x" * 12
    with pytest.raises(RequestError) as e:
        split_batches(sizes, body if sizes != [1] * (MAX_BATCHES + 1) else b"x" * len(sizes))
    assert e.value.code == Code.MALFORMED


def test_an_ok_outcome_round_trips_as_the_single_batch_answer_fields():
    assert decode_outcome(encode_ok(7, 3, 42, False, 96)) == {"base": 7, "n": 3, "index": 42,
                                                              "dup": False, "shift": 96}
    # an older node's outcome has no shift: its entries held one batch each
    assert decode_outcome([0, 7, 3, 42, False])["shift"] == 0
    assert decode_outcome(encode_ok(-1, 1, -1, True))["dup"] is True


def test_an_error_outcome_raises_the_batchs_own_error_with_its_fields():
    unknown = RequestError(Code.NOT_LEADER, "lost", leader="127.0.0.1:1", term=4, unknown=True)
    with pytest.raises(RequestError) as e:
        decode_outcome(encode_error(unknown))
    assert e.value.code == Code.NOT_LEADER and e.value.message == "lost"
    assert e.value.extra == {"leader": "127.0.0.1:1", "term": 4, "unknown": True}
    assert may_have_applied(e.value)  # outcome-unknown keeps its meaning per batch
    with pytest.raises(RequestError) as e:
        decode_outcome(encode_error(RequestError(Code.SEQUENCE_GAP, "gap")))
    assert e.value.code == Code.SEQUENCE_GAP and not may_have_applied(e.value)


@pytest.mark.parametrize("outcome", [None, [], "ok", [0, 1, 2], [0, 1, 2, 3, 4, 5, 6],
                                     [-3, "x", {}], [6, "x"], {"base": 1}])
def test_an_outcome_that_is_not_ours_is_malformed(outcome):
    with pytest.raises(RequestError) as e:
        decode_outcome(outcome)
    assert e.value.code == Code.MALFORMED


def test_an_unknown_error_code_reads_as_internal():
    with pytest.raises(RequestError) as e:
        decode_outcome([999, "from a newer node", {}])
    assert e.value.code == Code.INTERNAL


# ---------------------------------------------------------------- state machine outcomes


def _messages(index: int, batch: bytes) -> Entry:
    return Entry(index, 1, EntryType.MESSAGES, STORED_PREFIX.pack(1000) + batch)


def test_the_batches_of_one_request_get_their_own_outcomes_in_the_state_machine():
    """The entries of one proposal are applied one by one: a refused batch (a sequence
    gap, an unknown queue) stores nothing and leaves its neighbours' offsets alone, and
    an idempotent repeat is answered as a duplicate of the first copy."""
    s = BrokerState("g")
    s.apply(Entry(1, 1, EntryType.CONTROL, control_create_topic("t", 2, [0, 1])))
    pid = 77
    batches = [
        encode_batch("t", 0, [b"a", b"b"], pid=pid, seq=0),
        encode_batch("t", 0, [b"c"], pid=pid, seq=2),  # seq 1 went missing: a gap
        encode_batch("t", 5, [b"d"]),  # no such queue
        encode_batch("t", 1, [b"e"], pid=pid, seq=0),  # queues keep their own sequences
        encode_batch("t", 0, [b"a", b"b"], pid=pid, seq=0),  # the first batch again
        encode_batch("t", 0, [b"f"]),
    ]
    results = [s.apply(_messages(2 + i, b)) for i, b in enumerate(batches)]
    assert results[0] == ProduceResult(0, 2, 2)
    assert isinstance(results[1], ErrorResult) and results[1].code == Code.SEQUENCE_GAP
    assert isinstance(results[2], ErrorResult) and results[2].code == Code.UNKNOWN_QUEUE
    assert results[3] == ProduceResult(0, 1, 5)
    assert results[4] == ProduceResult(0, 2, 2, dup=True)
    assert results[5] == ProduceResult(2, 1, 7)
    assert s.queue_range("t", 0) == (0, 3) and s.queue_range("t", 1) == (0, 1)
