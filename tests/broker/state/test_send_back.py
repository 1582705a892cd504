"""A push consumer's failed messages (`SendBack`, `broker.state.parts.receipts`): read by
offset, failed, parked as delivered once and received again only by a retries-only
receive after the backoff, counted on to the dead letters; a retried send-back is
applied once; a retries-only receive never takes new messages."""

from __future__ import annotations

from broker.state.parts.base import ControlResult, ErrorResult
from broker.state.parts.receipts import Ack, Nack, Receive, SendBack
from tests.broker.state.test_receipts import CG, _log
from wire.protocol import Code


def retries(log: object, now: int, max_deliveries: int = 3) -> ControlResult:
    r = log.control(Receive(CG, "t", 0, now, 1000, 32, "push", max_deliveries, 4096,  # type: ignore[attr-defined]
                            True))
    assert isinstance(r, ControlResult), r
    return r


def test_a_message_sent_back_comes_again_after_its_backoff_and_counts_on_to_the_dlq() -> None:
    log = _log(messages=5)
    # a retries-only receive takes nothing new: the push consumer reads by offset
    assert retries(log, 100).items == ()
    r = log.control(SendBack(CG, "t", 0, 2, 1000, (500, 700), 3, "boom"))
    assert r == ControlResult("send_back", 1)
    assert log.receipts.inflight(CG, "t", 0)[2].deliveries == 1
    assert retries(log, 1499).items == ()  # not before its backoff
    (d,) = retries(log, 1500).items
    assert (d.offset, d.deliveries) == (2, 2)
    # failed again: the broker's backoff by delivery count, then the dead letters
    log.control(Nack(CG, "t", 0, ((2, d.handle),), 1600, None, (500, 700), 3, "again"))
    assert retries(log, 2299).items == ()
    (d,) = retries(log, 2300).items
    assert d.deliveries == 3
    log.control(Nack(CG, "t", 0, ((2, d.handle),), 2400, None, (500, 700), 3, "third"))
    assert log.receipts.inflight(CG, "t", 0) == {}
    ((cg, _id, dead),) = list(log.receipts.deadletters.of(CG))
    assert cg == CG and dead.offset == 2 and dead.deliveries == 3 and dead.error == "third"
    # every other offset is untouched: new messages stay the push consumer's to read
    assert retries(log, 9000).items == ()


def test_a_retried_send_back_is_applied_once_and_an_acked_retry_is_done() -> None:
    log = _log(messages=3)
    assert log.control(SendBack(CG, "t", 0, 0, 1000, (10,), 16)).applied == 1
    again = log.control(SendBack(CG, "t", 0, 0, 1005, (10,), 16))
    assert again == ControlResult("send_back", 0, 1)  # in flight already: nothing changes
    (d,) = retries(log, 2000, 16).items
    assert log.control(Ack(CG, "t", 0, ((0, d.handle),))).applied == 1
    assert retries(log, 99_000, 16).items == ()


def test_poison_goes_to_the_dead_letters_at_once_and_bad_offsets_are_refused() -> None:
    log = _log(messages=3)
    r = log.control(SendBack(CG, "t", 0, 1, 1000, (10,), 16, "poison", True))
    assert r.items == (("dead", 1),)
    assert log.receipts.inflight(CG, "t", 0) == {}
    beyond = log.control(SendBack(CG, "t", 0, 3, 1000, (10,), 16))
    assert isinstance(beyond, ErrorResult) and beyond.code == Code.OFFSET_TOO_LARGE
