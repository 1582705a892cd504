"""The producer's accumulator: the pending sends of every queue of one group, and the
rules for when and how they leave as one PRODUCE request.

A producer spreading messages over thousands of queues must not pay a task, a timer or
a request per queue: the sends for all the queues of one group collect in one
`GroupAccumulator`, which one sender task of the producer drains into multi-batch
requests (Kafka's record accumulator, by group rather than by broker). Pure: no I/O, no
tasks, no clock (callers pass `now`).

- A queue's pending sends form batches of at most `max_messages` messages and
  `max_bytes` bytes (`BatchAccumulator`); a send is never split.
- The group is ready when any queue it may send is full, when the oldest pending send
  has waited `linger` seconds, or at once when a batch is back for a retry.
- While requests of the group are out, another is worth sending only with company
  (`worth_another`): a full batch, a retry, or `company` queues at least. Every request
  costs each replica a Raft entry whatever it holds, so sends spread over thousands of
  queues wait for the answer in flight rather than leave in many thin requests.
- A request takes the sendable queues in the order they became sendable, each with its
  batches waiting to be retried first, then new batches, at most `batches_per_queue` of
  them, within the request's bounds; a queue that does not fit waits for the next.
- A queue with batches in a request is busy until the producer releases it: its batches
  are never in two requests at once, so they cannot reach the log out of order (two
  requests in flight may be served in either order, and a failed one is retried after
  the other). A batch to be retried is put back at the front of its queue before the
  queue is released.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["BatchAccumulator", "GroupAccumulator", "QueueBuffer", "Send", "Taken"]


class Send(Protocol):
    """What the accumulator needs of a send: its messages and their bytes."""

    @property
    def messages(self) -> Sequence[Any]: ...

    @property
    def size(self) -> int: ...


class Formed(Protocol):
    """A batch already made (one being retried or moved to this queue): its bytes."""

    @property
    def nbytes(self) -> int: ...


S = TypeVar("S", bound=Send)
F = TypeVar("F", bound=Formed)


@dataclass(slots=True)
class BatchAccumulator(Generic[S]):
    """Pending sends of one queue and the rule for when they form a batch.

    A batch is due when the oldest pending send has waited `linger` seconds or the
    pending messages reach either size bound. `take` never splits a send and always
    takes at least one, so an oversized send still goes out (alone).
    """

    linger: float
    max_messages: int
    max_bytes: int
    pending: deque[S] = field(default_factory=deque)
    messages: int = 0
    bytes: int = 0
    first_at: float = 0.0

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, send: S, now: float) -> None:
        if not self.pending:
            self.first_at = now
        self.pending.append(send)
        self.messages += len(send.messages)
        self.bytes += send.size

    @property
    def full(self) -> bool:
        return self.messages >= self.max_messages or self.bytes >= self.max_bytes

    @property
    def deadline(self) -> float:
        return self.first_at + self.linger

    def ready(self, now: float) -> bool:
        return bool(self.pending) and (self.full or now >= self.deadline)

    def take(self) -> list[S]:
        out: list[S] = []
        n = size = 0
        while self.pending:
            nxt = self.pending[0]
            if out and (n + len(nxt.messages) > self.max_messages
                        or size + nxt.size > self.max_bytes):
                break
            self.pending.popleft()
            out.append(nxt)
            n += len(nxt.messages)
            size += nxt.size
        self.messages -= n
        self.bytes -= size
        return out


@dataclass(slots=True, eq=False)
class QueueBuffer(BatchAccumulator[S], Generic[S, F]):
    """One queue's place in its group's accumulator: its pending sends, the batches back
    for a retry (`formed`, oldest first, sent before any new batch) and whether a
    request holds it (`busy`). `key` names the queue for the producer."""

    key: Any = None  # hashable
    group: GroupAccumulator[S, F] | None = None
    formed: deque[F] = field(default_factory=deque)
    busy: bool = False

    @property
    def empty(self) -> bool:
        return not self.pending and not self.formed


@dataclass(slots=True)
class Taken(Generic[S, F]):
    """What a request takes of one queue: batches to resend, then new batches (each a
    list of sends), in the queue's order."""

    queue: QueueBuffer[S, F]
    formed: list[F]
    new: list[list[S]]


class GroupAccumulator(Generic[S, F]):
    """The sendable queues of one group, drained into requests (see the module
    docstring)."""

    def __init__(self, group: str, *, linger: float, batches_per_queue: int,
                 max_batches: int, max_bytes: int, company: int = 1) -> None:
        if batches_per_queue < 1 or max_batches < 1 or max_bytes < 1 or company < 1:
            raise ValueError("a request carries at least one batch of one queue")
        self.group = group
        self.company = company
        self.linger = linger
        self.batches_per_queue = batches_per_queue
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        # queues not busy with something to send, in the order they became so
        self.sendable: dict[Any, QueueBuffer[S, F]] = {}
        self._first_at = math.inf  # the oldest pending send among them
        self._due = False  # a full queue or a retry among them: no lingering

    def __len__(self) -> int:
        return len(self.sendable)

    def add(self, queue: QueueBuffer[S, F], send: S, now: float) -> bool:
        """Queue `send` on `queue` (of this group); True when whoever drains the group
        should be woken: it just became ready, or has something to linger on."""
        queue.add(send, now)
        if queue.busy:
            return False
        had = bool(self.sendable)
        was_ready = had and self.ready(now)
        was_worth = self.worth_another()
        self._mark(queue, queue.first_at)
        if queue.full:
            self._due = True
        return (not was_ready and (not had or self.ready(now))
                or not was_worth and self.worth_another())

    def requeue(self, queue: QueueBuffer[S, F], batches: Sequence[F], *, front: bool) -> None:
        """Put made batches on `queue`: a retry goes `front` (before everything it has);
        a batch moved here from another queue goes after the others made. The queue's
        holder releases it afterwards (`release`) if it is busy; a queue not held is
        ready at once (wake whoever drains the group)."""
        if front:
            queue.formed.extendleft(reversed(batches))
        else:
            queue.formed.extend(batches)
        if not queue.busy and batches:
            self._mark(queue, -math.inf)
            self._due = True

    def release(self, queue: QueueBuffer[S, F], now: float) -> bool:
        """A request no longer holds `queue`; True as for `add`."""
        queue.busy = False
        if not queue.pending and not queue.formed:
            return False
        had = bool(self.sendable)
        was_ready = had and self.ready(now)
        was_worth = self.worth_another()
        self._mark(queue, queue.first_at if queue.pending else -math.inf)
        if queue.formed or queue.full:
            self._due = True
        return (not was_ready and (not had or self.ready(now))
                or not was_worth and self.worth_another())

    def _mark(self, queue: QueueBuffer[S, F], first_at: float) -> None:
        if queue.key not in self.sendable:
            self.sendable[queue.key] = queue
        if first_at < self._first_at:
            self._first_at = first_at

    def ready(self, now: float) -> bool:
        """Whether a request should leave now (given a free request slot)."""
        return bool(self.sendable) and (
            self._due or self.linger <= 0 or now >= self._first_at + self.linger)

    def worth_another(self) -> bool:
        """Whether what is ready makes a request worth sending while others of the group
        are out: a full batch or a retry among it, or `company` queues at least."""
        return self._due or len(self.sendable) >= self.company

    @property
    def deadline(self) -> float:
        """When the oldest pending send will have lingered enough (inf if none)."""
        return self._first_at + self.linger

    def drain(self) -> list[Taken[S, F]]:
        """The next request's batches, queue by queue; the queues taken are busy. A
        request always takes something when any queue is sendable, however large."""
        out: list[Taken[S, F]] = []
        batches = nbytes = 0
        sendable = self.sendable
        done: list[Any] = []  # keys of the queues taken, removed once the walk is over
        for key, queue in sendable.items():
            if batches >= self.max_batches:
                break
            taken: Taken[S, F] = Taken(queue, [], [])
            room = min(self.batches_per_queue, self.max_batches - batches)
            while queue.formed and room:
                size = queue.formed[0].nbytes
                if batches and nbytes + size > self.max_bytes:
                    room = 0
                    break
                taken.formed.append(queue.formed.popleft())
                nbytes += size
                batches += 1
                room -= 1
            while queue.pending and room:
                sends = queue.take()
                size = sends[0].size if len(sends) == 1 else sum(s.size for s in sends)
                if batches and nbytes + size > self.max_bytes:  # put back: the next request
                    queue.pending.extendleft(reversed(sends))
                    queue.messages += sum(len(s.messages) for s in sends)
                    queue.bytes += size
                    break
                taken.new.append(sends)
                nbytes += size
                batches += 1
                room -= 1
            if not taken.formed and not taken.new:
                break  # the first queue that does not fit waits for the next request
            done.append(key)
            queue.busy = True
            out.append(taken)
            if nbytes >= self.max_bytes:
                break
        if len(done) == len(sendable):
            sendable.clear()
        else:  # taking keys off the front one by one would rescan the holes they leave
            for key in done:
                del sendable[key]
        if sendable:
            self._due = True  # a full request left: the rest goes with the next one
        else:
            self._first_at = math.inf
            self._due = False
        return out
