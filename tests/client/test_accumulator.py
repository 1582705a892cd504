"""The producer's per-group accumulator (`raftmq.client.accumulator`): when a group's
pending sends leave, how a request takes them queue by queue, and how a queue with a
batch out is held back so its batches keep their order."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from raftmq.client.accumulator import GroupAccumulator, QueueBuffer


@dataclass
class Send:
    name: str
    n: int = 1
    size: int = 10

    @property
    def messages(self) -> list[str]:
        return [self.name] * self.n


@dataclass
class Made:
    """A batch made earlier (back for a retry, or moved here)."""

    name: str
    nbytes: int = 10


Q = QueueBuffer[Send, Made]
G = GroupAccumulator[Send, Made]


def _group(linger: float = 0.0, per_queue: int = 1, max_batches: int = 100,
           max_bytes: int = 10_000) -> G:
    return GroupAccumulator("g", linger=linger, batches_per_queue=per_queue,
                            max_batches=max_batches, max_bytes=max_bytes)


def _queue(g: G, key: str, max_messages: int = 4, max_bytes: int = 1000) -> Q:
    q: Q = QueueBuffer(g.linger, max_messages, max_bytes, key=key)
    q.group = g
    return q


def _names(taken: list) -> list[tuple[str, list[str], list[list[str]]]]:
    return [(t.queue.key, [m.name for m in t.formed], [[s.name for s in b] for b in t.new])
            for t in taken]


def test_sends_for_many_queues_leave_together_queue_by_queue_in_arrival_order() -> None:
    g = _group()
    qs = {k: _queue(g, k) for k in "abc"}
    assert g.add(qs["b"], Send("b1"), 0.0)  # the group became ready: wake its sender
    assert not g.add(qs["a"], Send("a1"), 0.0)  # already ready: no second wake-up
    g.add(qs["b"], Send("b2"), 0.0)
    g.add(qs["c"], Send("c1"), 0.0)
    assert _names(g.drain()) == [("b", [], [["b1", "b2"]]), ("a", [], [["a1"]]),
                                 ("c", [], [["c1"]])]
    assert len(g) == 0 and not g.ready(0.0) and all(q.busy for q in qs.values())


def test_a_busy_queue_is_not_drained_again_until_released() -> None:
    g = _group()
    a, b = _queue(g, "a"), _queue(g, "b")
    g.add(a, Send("a1"), 0.0)
    assert _names(g.drain()) == [("a", [], [["a1"]])]
    g.add(a, Send("a2"), 0.0)  # a's batch is out: a2 waits
    g.add(b, Send("b1"), 0.0)
    assert _names(g.drain()) == [("b", [], [["b1"]])]
    assert g.drain() == [] and not g.ready(0.0)
    assert g.release(a, 0.0)  # ready again: wake the sender
    assert _names(g.drain()) == [("a", [], [["a2"]])]


def test_a_retry_goes_before_the_newer_sends_of_its_queue() -> None:
    g = _group(per_queue=3)
    a = _queue(g, "a", max_messages=1)
    g.add(a, Send("a1"), 0.0)
    g.drain()
    g.add(a, Send("a2"), 0.0)
    g.add(a, Send("a3"), 0.0)
    g.requeue(a, [Made("a1-again")], front=True)  # while a is still held
    assert g.drain() == []  # not before its holder releases it
    g.requeue(a, [Made("moved-here")], front=False)  # a batch moved from another queue
    g.release(a, 0.0)
    assert _names(g.drain()) == [("a", ["a1-again", "moved-here"], [["a2"]])]
    g.release(a, 0.0)
    assert _names(g.drain()) == [("a", [], [["a3"]])]


def test_several_batches_of_a_queue_ride_in_one_request_in_order() -> None:
    g = _group(per_queue=2)
    a = _queue(g, "a", max_messages=2)
    for i in range(5):
        g.add(a, Send(f"a{i}"), 0.0)
    assert _names(g.drain()) == [("a", [], [["a0", "a1"], ["a2", "a3"]])]
    g.release(a, 0.0)
    assert _names(g.drain()) == [("a", [], [["a4"]])]


def test_linger_holds_the_group_until_the_oldest_send_waited_or_a_queue_is_full() -> None:
    g = _group(linger=0.5)
    a, b = _queue(g, "a", max_messages=3), _queue(g, "b", max_messages=3)
    assert g.add(a, Send("a1"), 1.0) and not g.ready(1.0)  # wake up to linger
    assert g.deadline == 1.5
    assert not g.add(b, Send("b1"), 1.2)  # still lingering: nothing new to wake for
    assert g.deadline == 1.5  # the oldest send sets it
    assert not g.ready(1.4) and g.ready(1.5)
    g.add(b, Send("b2"), 1.3)
    assert g.add(b, Send("b3"), 1.3)  # b is full: the group goes at once
    assert g.ready(1.3)
    assert _names(g.drain()) == [("a", [], [["a1"]]), ("b", [], [["b1", "b2", "b3"]])]
    assert g.deadline == float("inf")
    # a retry does not linger
    g.release(a, 2.0)
    g.requeue(a, [Made("again")], front=True)
    assert g.ready(2.0)


def test_a_request_stays_within_its_batch_and_byte_bounds() -> None:
    g = _group(max_batches=3)
    qs = [_queue(g, f"q{i}") for i in range(5)]
    for q in qs:
        g.add(q, Send(q.key), 0.0)
    assert [t.queue.key for t in g.drain()] == ["q0", "q1", "q2"]
    assert g.ready(0.0)  # the rest goes with the next request, not after a linger
    assert [t.queue.key for t in g.drain()] == ["q3", "q4"]

    g = _group(max_bytes=25)
    qs = [_queue(g, f"q{i}") for i in range(3)]
    for q in qs:
        g.add(q, Send(q.key, size=10), 0.0)
    assert [t.queue.key for t in g.drain()] == ["q0", "q1"]
    assert [t.queue.key for t in g.drain()] == ["q2"]
    assert not qs[2].pending and qs[2].busy

    # a batch too large for any request still goes, alone
    g = _group(max_bytes=25)
    big, small = _queue(g, "big"), _queue(g, "small")
    g.add(small, Send("s", size=10), 0.0)
    g.add(big, Send("b", size=100), 0.0)
    assert [t.queue.key for t in g.drain()] == ["small"]
    assert big.messages == 1 and big.bytes == 100  # put back whole
    assert [t.queue.key for t in g.drain()] == ["big"]


def test_a_queue_held_elsewhere_accumulates_without_making_the_group_ready() -> None:
    g = _group()
    a = _queue(g, "a")
    a.busy = True  # e.g. its group was being looked up
    assert not g.add(a, Send("a1"), 0.0)
    assert len(g) == 0 and a.messages == 1
    assert g.release(a, 0.0)
    assert _names(g.drain()) == [("a", [], [["a1"]])]


def test_an_emptied_queue_is_not_sendable_when_released() -> None:
    g = _group()
    a = _queue(g, "a")
    g.add(a, Send("a1"), 0.0)
    g.drain()
    assert not g.release(a, 0.0) and a.empty and len(g) == 0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        _group(per_queue=0)
    with pytest.raises(ValueError):
        _group(max_batches=0)


def test_while_requests_are_out_another_waits_for_company() -> None:
    """A request out already: the next is worth sending only with `company` queues, a
    full batch or a retry, and the add that makes it so wakes the sender."""
    g = GroupAccumulator[Send, Made]("g", linger=0.0, batches_per_queue=1, max_batches=100,
                                     max_bytes=10_000, company=3)
    qs = {k: _queue(g, k) for k in "abcd"}
    assert g.add(qs["a"], Send("a1"), 0.0)  # ready: with nothing out, it leaves at once
    assert not g.worth_another()
    assert not g.add(qs["b"], Send("b1"), 0.0)
    assert g.add(qs["c"], Send("c1"), 0.0)  # the third queue: company, wake the sender
    assert g.worth_another()
    assert not g.add(qs["d"], Send("d1"), 0.0)
    g.drain()
    assert not g.worth_another()
    full = _queue(g, "e", max_messages=2)
    assert g.add(full, Send("e1"), 0.0)  # ready again (was empty)
    assert not g.worth_another()
    assert g.add(full, Send("e2"), 0.0)  # its batch is full: worth a request alone
    assert g.worth_another()
    g.drain()
    g.requeue(qs["a"], [Made("a1")], front=True)  # a retry is worth one too
    assert g.release(qs["a"], 0.0) and g.worth_another()


def test_company_of_one_is_every_ready_queue() -> None:
    g = _group()
    q = _queue(g, "a")
    assert not g.worth_another()
    g.add(q, Send("a1"), 0.0)
    assert g.worth_another()
