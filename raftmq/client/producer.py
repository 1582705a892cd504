"""The producer: queue selection, batching per group, retries and idempotence.

Messages sent close together share PRODUCE requests. A send joins its queue's pending
sends in the accumulator of the queue's group (`raftmq.client.accumulator`): the sends
for every queue of a group collect in one place, and one sender task per group drains
them into multi-batch requests (one batch per queue, or up to `max_in_flight` of them),
at most `REQUESTS_IN_FLIGHT` at a time, so a producer feeding 10,000 queues keeps no
more tasks or timers than one feeding a single queue. A request leaves as soon as a
request slot is free, after waiting up to `linger_ms` for company (0 by default:
messages that arrive while earlier requests are in flight form the next one anyway) or
at once when a size bound is reached. Keyless round-robin sends stick to one queue until
its batch has left, so a burst makes full batches, not one per queue. The batch bytes
built here are stored by the leader as they are, so a message id can be computed from
the batch layout, the Raft index and the shift the leader returns.

Order per queue: a queue's batches are in one request at a time. The requests of a
group in flight may be served in either order, and a failed one is retried after the
others, so a queue with a batch in flight sends nothing more until that batch is
stored, failed for good, or back at the front of its queue for a retry.

Retries follow RocketMQ: a send that fails with a retriable error is tried again up to
`retries` more times, after refreshing the route; while its group has no leader (an
election, or a leadership transfer under way), it goes on being retried for up to `routes.LEADER_WAIT` seconds from its
first failure. Learning of a newer leader (a NOT_LEADER hint of a newer term, the route
naming another leader) is not a failure: the send goes there at once, without counting
an attempt or finishing its backoff; and when the leader's connection fails, another
replica is asked at once who leads now (see `raftmq.client.routes`). A round-robin send
of a non-idempotent producer moves to a queue of another group ("avoid the failed
broker").
An idempotent producer instead resends the same bytes (same producer id and sequence) to
the same queue, and the state machine drops the copy if the first try was written.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
import zlib
from collections import deque
from collections.abc import (
    Awaitable,
    Callable,
    Container,
    Coroutine,
    Generator,
    Iterable,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import anyio
import anyio.abc

from transport.connection import DEFAULT_TIMEOUT, ClientClosedError, ConnectionPool, is_retriable
from wire.produce import MAX_BATCHES, decode_outcome
from wire.protocol import (
    DEFAULT_MAX_FRAME,
    MAX_MESSAGE_BYTES,
    Code,
    Op,
    RaftMQError,
    RequestError,
    frame_limit,
    validate_topic_name,
)
from wire.records import (
    MESSAGE_GROUP_PROPERTY,
    EncodedBatch,
    OutgoingMessage,
    encode_batch,
    message_group_problem,
    message_id,
    record_size,
    tag_problem,
)
from wire.requests import ProduceRequest

from .accumulator import BatchAccumulator, GroupAccumulator, QueueBuffer
from .delays import NO_DUE, Due, due_fields
from .errors import (
    OutcomeUnknownError,
    TransactionError,
    UnavailableError,
    as_sdk_error,
    close_stack,
    give_up,
    may_have_applied,
)
from .groupclient import default_client_id
from .lifecycle import StartClose
from .routes import (
    LEADER_WAIT,
    Routes,
    TopicRoute,
    backoff_delay,
    clock,
    electing,
    normalize_addresses,
    open_routes,
)
from .trace import Tracer

if TYPE_CHECKING:
    from .transactions import (
        CheckListener,
        HalfHandle,
        HalfMessages,
        LocalTransaction,
        Transaction,
        TransactionalSends,
        TransactionResult,
    )

__all__ = [
    "DELIVERY_TIMEOUT",
    "BatchAccumulator",
    "PendingSend",
    "Payload",
    "Producer",
    "QueueSelector",
    "SendAttempt",
    "SendFuture",
    "SendNotDoneError",
    "SendResult",
    "as_payload",
    "batch_message_ids",
    "key_queue",
    "make_message",
    "new_producer_id",
    "pick_round_robin",
    "record_size",
]

log = logging.getLogger("raftmq.client.producer")

T = TypeVar("T")

QueueSelector = Callable[[int, OutgoingMessage], int]
"""A custom selector: (total queues of the topic, message) -> queue id."""

Payload = OutgoingMessage | bytes
"""A message on its way to a batch: a plain body (the common case: no key, tags or
properties) stays bytes, which spares an object per message on the send path."""

DELIVERY_TIMEOUT = 30.0
"""Default bound, in seconds, on a whole send (Kafka's `delivery.timeout.ms`): above the
attempts at the default `send_timeout` plus an election's `LEADER_WAIT`, so it only
bounds what used to be unbounded."""
MIN_REQUEST_TIMEOUT = 0.05  # a last try just before the delivery deadline still gets this
FAULT_WINDOW = 5.0  # seconds a failed group is avoided by round-robin selection
MAX_BATCH_BYTES = DEFAULT_MAX_FRAME - (1 << 20)  # leave room for the frame header
REQUESTS_IN_FLIGHT = 4
"""PRODUCE requests one producer keeps in flight to one group (Kafka's
max.in.flight.requests.per.connection is 5): each carries every batch of that group ready
when it leaves, so batches for thousands of queues share a few requests."""
REQUEST_COMPANY = 512
"""While a group has requests out, the next waits for this many queues with something to
send (or a full batch, or a retry): a request costs every replica an entry, however few
batches it holds (`GroupAccumulator.worth_another`)."""
QUEUE_PLACES_KEPT = 1 << 16
"""Queues' places kept while idle, for the next send to them (Kafka's accumulator keeps a
place per partition ever sent to); beyond this many, an emptied one is forgotten."""
MAX_REDIRECTS = 5  # redirects to a newer leader one batch follows without counting them

QueueKey = tuple[str, int, bool, Due]  # topic, queue, movable, when due
"""A stream of batches: (topic, queue, movable). Sends that may move to another queue
on a retry (keyless round robin of a plain producer) never share a batch with sends
that must stay."""


@dataclass(frozen=True, slots=True)
class SendResult:
    """A message acknowledged as committed. `msg_id` is None (and `offset` -1) only for
    an idempotent resend the state machine recognised without remembering where the
    first copy went."""

    msg_id: str | None
    topic: str
    queue: int
    offset: int
    group: str
    dup: bool = False


@dataclass(frozen=True, slots=True)
class SendAttempt:
    """One PRODUCE request about to leave: the first send of a batch, or a retry or
    redirect of it. Each may store the batch, so whoever must account for copies (the
    chaos workload) observes them with `Producer(on_attempt=...)`. `attempt` counts the
    requests of this batch from 1."""

    topic: str
    queue: int
    group: str
    addr: str
    attempt: int
    messages: Sequence[Payload]


_Callback = Callable[["SendFuture[T]"], Any]
_NOT_DONE = ("the send is not finished yet: await the future (`await fut`, or "
             "`await fut.wait(timeout)`) rather than calling result() on it")


class SendNotDoneError(RuntimeError, asyncio.InvalidStateError):
    """`result()` or `exception()` of a send still under way: await the future instead.
    A `RuntimeError`, and asyncio's `InvalidStateError` as an asyncio future raises."""


class SendFuture(Generic[T]):
    """The outcome of an asynchronous send; `await` it, or poll `done()`/`result()`.

    Works under any anyio backend. It has the interface of an asyncio future that
    cannot be cancelled (a message handed over is sent: `cancel()` returns False), so
    `asyncio.wait`, `asyncio.gather`, `asyncio.wait_for` and `asyncio.as_completed`
    take it; under trio, `await` it (`await fut.wait(timeout)` bounds the wait). Neither
    `result()` nor `exception()` waits: like an asyncio future's, they raise
    `SendNotDoneError` while the send is under way (`result(timeout=...)` is
    `concurrent.futures`' blocking call, which would stop the event loop the send needs:
    it is taken and does not wait; the blocking producer's `send_async` returns a
    `concurrent.futures.Future`, whose `result(timeout)` waits).

    Callbacks added with `add_done_callback` run in the event loop as soon as the
    outcome is known, with the future as their argument. One is made per message, so it
    allocates nothing more until someone awaits it or adds a second callback.
    """

    __slots__ = ("_callbacks", "_done", "_error", "_event", "_result")

    def __init__(self) -> None:
        self._event: anyio.Event | None = None  # made only if someone awaits: most don't
        self._done = False
        self._result: T | None = None
        self._error: BaseException | None = None
        self._callbacks: _Callback[T] | list[_Callback[T]] | None = None

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        """False: a send cannot be cancelled (asyncio's future interface)."""
        return False

    def cancel(self, msg: Any = None) -> bool:
        """A message handed over is sent, so this cancels nothing and returns False (as
        `concurrent.futures.Future.cancel` does for a call already running)."""
        return False

    def result(self, timeout: float | None = None) -> T:
        """The result; raises the send's error, or `SendNotDoneError` while pending.

        Never waits, whatever `timeout` says (it is taken so that code written for
        `concurrent.futures` gets this answer rather than a TypeError): waiting here would
        stop the event loop the send needs. `await fut.wait(timeout)` waits."""
        if not self._done:
            raise SendNotDoneError(_NOT_DONE)
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The send's error (None if it succeeded); never waits, as `result`."""
        if not self._done:
            raise SendNotDoneError(_NOT_DONE)
        return self._error

    def add_done_callback(self, fn: Callable[[SendFuture[T]], Any]) -> None:
        if self._done:
            self._run_callback(fn)
        elif self._callbacks is None:
            self._callbacks = fn
        elif isinstance(self._callbacks, list):
            self._callbacks.append(fn)
        else:
            self._callbacks = [self._callbacks, fn]

    def remove_done_callback(self, fn: Callable[[SendFuture[T]], Any]) -> int:
        """Remove every registration of `fn`; how many there were (asyncio's interface)."""
        callbacks = self._callbacks
        if callbacks is None:
            return 0
        if not isinstance(callbacks, list):
            if callbacks == fn:
                self._callbacks = None
                return 1
            return 0
        kept = [cb for cb in callbacks if cb != fn]
        self._callbacks = kept or None
        return len(callbacks) - len(kept)

    async def wait(self, timeout: float | None = None) -> T:
        """The result, once the send is done; `TimeoutError` after `timeout` seconds
        (the send goes on: its outcome is this future's, later)."""
        if not self._done:
            if self._event is None:
                self._event = anyio.Event()
            if timeout is None:
                await self._event.wait()
            else:
                with anyio.fail_after(timeout):
                    await self._event.wait()
        return self.result()

    def __await__(self) -> Generator[Any, None, T]:
        return self.wait().__await__()

    def set_result(self, result: T) -> None:
        if not self._done:
            self._result = result
            self._finish()

    def set_exception(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self._finish()

    def _finish(self) -> None:
        self._done = True
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, None
        if isinstance(callbacks, list):
            for fn in callbacks:
                self._run_callback(fn)
        elif callbacks is not None:
            self._run_callback(callbacks)

    def _run_callback(self, fn: Callable[[SendFuture[T]], Any]) -> None:
        try:
            fn(self)
        except Exception:
            log.exception("send callback %r failed", fn)


# ---------------------------------------------------------------- pure helpers


def make_message(
    message: OutgoingMessage | bytes | bytearray | memoryview | str,
    *,
    key: str | None = None,
    tags: str | None = None,
    properties: dict[str, str] | None = None,
    message_group: str | None = None,
) -> OutgoingMessage:
    """Normalise what a caller passed to `send` into an `OutgoingMessage`.

    A str body is UTF-8 encoded; explicit key/tags/properties override the message's own.
    `message_group` goes in as the `MESSAGE_GROUP_PROPERTY` property (FIFO message groups
    on the simple consumer), over the properties'.
    """
    if isinstance(message, OutgoingMessage):
        msg = message
    elif isinstance(message, str):
        msg = OutgoingMessage(message.encode())
    elif isinstance(message, (bytes, bytearray, memoryview)):
        msg = OutgoingMessage(bytes(message))
    else:
        raise TypeError(f"a message is bytes, str or OutgoingMessage, not {type(message).__name__}")
    changes: dict[str, Any] = {}
    if key is not None:
        changes["key"] = key
    if tags is not None:
        changes["tags"] = tags
    if properties is not None:
        changes["properties"] = dict(properties)
    if message_group is not None:
        if (problem := message_group_problem(message_group)) is not None:
            raise ValueError(problem)
        changes["properties"] = {**changes.get("properties", msg.properties),
                                 MESSAGE_GROUP_PROPERTY: message_group}
    return replace(msg, **changes) if changes else msg


def check_message(msg: Payload, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
    """Refuse before sending what the broker would refuse, with the same code."""
    body = msg if isinstance(msg, bytes) else msg.body
    if not isinstance(body, bytes):
        raise TypeError("OutgoingMessage.body must be bytes")
    if len(body) > max_bytes:
        raise RequestError(
            Code.MESSAGE_TOO_LARGE,
            f"message body of {len(body)} bytes exceeds the limit of {max_bytes}",
        )
    if isinstance(msg, OutgoingMessage):
        _check_fields(msg)


def _check_fields(msg: OutgoingMessage) -> None:
    """A key, tag and properties the broker can store and a subscription can select:
    a TypeError or ValueError here, before anything is sent."""
    if not isinstance(msg.key, str):
        raise TypeError(f"a message key is a str, not {type(msg.key).__name__}")
    if not isinstance(msg.tags, str):
        raise TypeError(f"a message's tag is one str, not {type(msg.tags).__name__} "
                        "(a message carries one tag; subscriptions select several)")
    if msg.tags and (problem := tag_problem(msg.tags)) is not None:
        raise ValueError(problem)
    if msg.properties:
        if not isinstance(msg.properties, dict):
            raise TypeError("message properties are a dict of str to str")
        for k, v in msg.properties.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("message properties map str to str")
        group = msg.properties.get(MESSAGE_GROUP_PROPERTY)
        if group is not None and (problem := message_group_problem(group)) is not None:
            raise ValueError(problem)


def as_payload(
    message: OutgoingMessage | bytes | bytearray | memoryview | str,
    *,
    key: str | None = None,
    tags: str | None = None,
    properties: dict[str, str] | None = None,
    message_group: str | None = None,
) -> Payload:
    """What a send puts in a batch: the body alone when there is no key, tags or
    properties (the common case, one object fewer per message), else the message."""
    if (type(message) is bytes and key is None and tags is None and properties is None
            and message_group is None):
        return message
    msg = make_message(message, key=key, tags=tags, properties=properties,
                       message_group=message_group)
    if type(msg.body) is bytes and not (msg.key or msg.tags or msg.properties):
        return msg.body
    return msg


def key_queue(key: str, total: int) -> int:
    """Stable sharding: the same key always lands on the same queue (CRC-32 mod total),
    in every process and Python version (unlike `hash`)."""
    if total <= 0:
        raise ValueError("a topic has at least one queue")
    return zlib.crc32(key.encode()) % total


def _message_group(msg: Payload) -> str | None:
    """The FIFO message group `msg` carries, if any."""
    if type(msg) is bytes or not isinstance(msg, OutgoingMessage) or not msg.properties:
        return None
    return msg.properties.get(MESSAGE_GROUP_PROPERTY) or None


def pick_round_robin(
    queues: Sequence[int], counter: int, avoid: Container[int] = ()
) -> tuple[int, int]:
    """The next queue in turn that is not in `avoid` (any, if all are).

    Returns (queue, next counter) so the caller keeps the rotation state.
    """
    n = len(queues)
    if n == 0:
        raise ValueError("no queues to choose from")
    for i in range(n):
        q = queues[(counter + i) % n]
        if q not in avoid:
            return q, counter + i + 1
    return queues[counter % n], counter + 1


def new_producer_id() -> int:
    """A random non-zero 63-bit producer id (0 means "not idempotent" on the wire)."""
    return random.getrandbits(63) or 1


def batch_message_ids(group: str, index: int, batch: EncodedBatch, shift: int = 0) -> list[str]:
    """Ids of a stored batch's messages: group, entry index, and where each record
    starts in the entry (`encode_batch` says where for the entry's first batch; a batch
    stored further into its entry is `shift` bytes on, as its outcome says)."""
    prefix = f"{group}:{index}:"
    return [f"{prefix}{start + shift}" for start in batch.starts]


@dataclass(slots=True)
class PendingSend:
    """Messages from one send call; they travel in one batch, never split.

    `future` gets the outcome: the first message's result for a single-message send
    (`single`), else the list. `settled` is the producer's own bookkeeping (its pending
    window), run once before the future completes. `deadline` (client clock) is when
    its delivery timeout ends, counted from the hand-over.
    """

    messages: list[Payload]
    size: int
    future: SendFuture[Any]
    single: bool = False
    settled: Callable[[], None] | None = None
    resolved: bool = False
    deadline: float = math.inf

    def resolve(self, results: list[SendResult] | None, error: BaseException | None) -> None:
        if self.resolved:
            return
        self.resolved = True
        if self.settled is not None:
            self.settled()
        if error is not None:
            self.future.set_exception(error)
        else:
            assert results is not None
            self.future.set_result(results[0] if self.single else results)


@dataclass(slots=True)
class _Sequence:
    pid: int
    next_seq: int = 0


class _Batch:
    """A batch as sent: the sends it carries, its bytes, and what its tries so far say
    (failed attempts, requests made, redirects followed, whether one may have stored
    it, the groups that failed it)."""

    __slots__ = ("attempts", "born", "data", "deadline", "failed_groups", "first_failed",
                 "messages", "movable", "out", "qb", "queue", "redirects", "sends", "sent",
                 "topic", "uncertain")

    def __init__(self, qb: _Queue, topic: str, queue: int, movable: bool,
                 sends: list[PendingSend], messages: list[Payload], data: EncodedBatch,
                 born: int, deadline: float) -> None:
        self.qb = qb  # the queue it is held by (and goes back to for a retry)
        self.topic = topic
        self.queue = queue
        self.movable = movable
        self.sends = sends
        self.messages = messages
        self.data = data
        self.born = born
        self.deadline = deadline  # client clock: no try starts after it, none outlasts it
        self.attempts = 0
        self.sent = 0
        self.redirects = 0
        self.uncertain = False
        self.out = False  # a request carrying it is out, unanswered
        self.failed_groups: set[str] = set()
        self.first_failed: float | None = None  # client clock of its first failed attempt

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def succeed(self, results: list[SendResult]) -> None:
        if len(self.sends) == 1:
            self.sends[0].resolve(results, None)
            return
        i = 0
        for s in self.sends:
            s.resolve(results[i : i + len(s.messages)], None)
            i += len(s.messages)

    def fail(self, error: BaseException) -> None:
        for s in self.sends:
            s.resolve(None, error)


_Stored = tuple[int, int, int, bool, int]
"""A stored batch's outcome: base offset, messages, entry index, dup, shift."""


def _stored_fields(h: Any) -> _Stored:
    """The outcome fields of a stored batch ({base, n, index, dup, shift}, as the
    single-batch answer and `decode_outcome` give them); MALFORMED when they are not."""
    try:
        base, n, index = int(h["base"]), int(h["n"]), int(h["index"])
        shift = int(h.get("shift", 0))
        dup = bool(h.get("dup", False))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise RequestError(Code.MALFORMED, f"bad PRODUCE answer {h!r}") from None
    return base, n, index, dup, shift


_Queue = QueueBuffer[PendingSend, _Batch]
_Group = GroupAccumulator[PendingSend, _Batch]


class _GroupSender:
    """A group's accumulator, the event that wakes its sender task, and its requests in
    flight."""

    __slots__ = ("acc", "idle", "in_flight", "requests", "wakeup")

    def __init__(self, acc: _Group) -> None:
        self.acc = acc
        self.wakeup = anyio.Event()
        self.in_flight = 0
        # requests formed and not yet taken by a worker task, and the events of the
        # workers waiting for one: a task per request cost more than its request
        self.requests: deque[tuple[str | None, list[_Batch], list[_Queue]]] = deque()
        self.idle: list[anyio.Event] = []

    async def wait(self) -> None:
        """Wait until `wakeup` is set. The sender task looks at its state between waits
        and never yields there, so a set it already saw is one that happened before that
        look: the event is replaced only then (a new event per request was a measurable
        share of a producer's CPU at one message in flight)."""
        if self.wakeup.is_set():
            self.wakeup = anyio.Event()
        await self.wakeup.wait()


class SendPath:
    """What the two transaction models (`raftmq.client.transactions`) use of their
    producer: its routes and task group, the one send path of a single message, a batch
    for one queue, and the transaction stamp every batch sent meanwhile carries. Plain
    sends, Kafka-style transactions and half messages thus all go the same way."""

    def __init__(self, producer: Producer) -> None:
        self._p = producer

    def routes(self) -> Routes:
        """The producer's routes (ClientClosedError once it is closed)."""
        return self._p._check_open()

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Run `fn` in the producer's task group (it ends when the producer closes)."""
        tg = self._p._tg
        assert tg is not None
        tg.start_soon(fn)

    def stamp(self, tx: tuple[str, int, int] | None) -> None:
        """Batches sent from now on belong to transaction (tid, epoch, n) (None: to none)."""
        self._p._tx_stamp = tx

    async def choose_queue(self, topic: str, msg: Payload,
                           queue: int | None) -> tuple[TopicRoute, int, bool]:
        """The topic's route, the queue a send goes to, and whether a retry may move it."""
        return await self._p._choose_queue(topic, msg, queue)

    async def send_one(self, topic: str, msg: Payload, queue: int | None,
                       fut: SendFuture[SendResult], *,
                       joining: Callable[[TopicRoute, int], Awaitable[None]] | None = None,
                       due: Due = NO_DUE) -> None:
        """The producer's send of one message (see `Producer._send_one`)."""
        await self._p._send_one(topic, msg, queue, fut, joining=joining, due=due)

    async def send_batch(self, topic: str, q: int, msgs: list[Payload],
                         track: Callable[[SendFuture[list[SendResult]]], None],
                         due: Due = NO_DUE) -> list[SendFuture[list[SendResult]]]:
        """Hand `msgs` (checked) to queue `q`, in as many batches as the size limits
        make; one future per batch, each given to `track` before its batch goes."""
        p = self._p
        futs: list[SendFuture[list[SendResult]]] = []
        for chunk, size in p._chunks(msgs):
            fut: SendFuture[list[SendResult]] = SendFuture()
            futs.append(fut)
            track(fut)
            await p._enqueue(topic, q, False, PendingSend(chunk, size, fut, False,
                                                          p._on_settled), due=due)
        return futs


class Producer(StartClose):
    """Sends messages to topics; use as `async with Producer(namesrv) as p:` (or
    `await p.start()` ... `await p.close()` in one task, see `raftmq.client.lifecycle`).

    `selector` is "key" (the default: a message with a key goes to its key's queue, a
    stable hash of the key, so one key keeps its order on one queue; keyless messages go
    round robin by batch, see the module docstring), "round_robin" (every message, keyed
    or not) or a callable `(total_queues, message) -> queue`. A message of a FIFO message
    group (`message_group=`) goes to its group's queue, the same stable hash of the group,
    whatever the selector but a callable one: a group is in order only within one queue.
    Keyed sends, grouped ones, sends with a callable and sends with an explicit `queue`
    stay on their queue when retried.

    `max_in_flight` is the number of batches one queue may have in flight at once (in
    one request: a queue's batches are never in two requests at once, see the module
    docstring); an idempotent producer always uses 1. `linger_ms` (default 0) trades
    latency for batch size when the load is light; a synchronous `send` waits for it too. Leaving the `async with` block waits (up
    to the send timeout times the attempts) for buffered messages to be acknowledged.

    `delivery_timeout` bounds a whole send (Kafka's `delivery.timeout.ms`, RocketMQ's
    send timeout): the route lookup, waiting for room, every attempt, backoff and
    election wait. `send_timeout` bounds one PRODUCE request (Kafka's
    `request.timeout.ms`); a send makes up to `retries + 1` of them within its delivery
    timeout. See `send` for what reaching it raises.

    `on_attempt`, when given, is called with a `SendAttempt` just before every PRODUCE
    request leaves, retries and redirects included (it must not block or raise).

    Transactions (see `raftmq.client.transactions`): with `transactional_id` the producer
    is idempotent and sends only inside transactions (`begin`, `transaction`), which the
    coordinator aborts when not committed within `transaction_timeout_ms`. With
    `producer_group` it sends half messages (`send_in_transaction`, `prepare`), and with
    a `check_listener` too it answers the broker's check-backs for that group's
    undecided half messages.
    """

    def __init__(
        self,
        namesrv: Sequence[str] | str,
        *,
        idempotent: bool = False,
        linger_ms: float = 0.0,
        batch_max_messages: int = 256,
        batch_max_bytes: int = 1 << 20,
        max_in_flight: int = 1,
        send_timeout: float = DEFAULT_TIMEOUT,
        retries: int = 2,
        delivery_timeout: float = DELIVERY_TIMEOUT,
        selector: Literal["round_robin", "key"] | QueueSelector = "key",
        max_pending: int = 10_000,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        pool: ConnectionPool | None = None,
        on_attempt: Callable[[SendAttempt], None] | None = None,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
        producer_group: str | None = None,
        check_listener: CheckListener | None = None,
        trace: bool = False,
    ) -> None:
        if transactional_id is not None:
            idempotent, max_in_flight = True, 1  # transactional batches are idempotent
        if linger_ms < 0 or send_timeout <= 0 or retries < 0 or delivery_timeout <= 0:
            raise ValueError("linger_ms and retries must not be negative, send_timeout and "
                             "delivery_timeout must be positive")
        if batch_max_messages < 1 or not 0 < batch_max_bytes <= MAX_BATCH_BYTES:
            raise ValueError(
                f"batch_max_messages must be >= 1 and batch_max_bytes in 1..{MAX_BATCH_BYTES}"
            )
        if max_in_flight < 1 or max_pending < 1:
            raise ValueError("max_in_flight and max_pending must be >= 1")
        if idempotent and max_in_flight != 1:
            raise ValueError("an idempotent producer keeps one batch in flight per queue")
        if not callable(selector) and selector not in ("round_robin", "key"):
            raise ValueError(f"unknown selector {selector!r}: 'round_robin', 'key' or a callable")
        self.namesrv = normalize_addresses(namesrv)
        self.idempotent = idempotent
        self.pid = new_producer_id() if idempotent else 0
        self.linger = linger_ms / 1000
        self.batch_max_messages = batch_max_messages
        self.batch_max_bytes = batch_max_bytes
        self.max_in_flight = 1 if idempotent else max_in_flight
        self.send_timeout = send_timeout
        self.retries = retries
        self.delivery_timeout = delivery_timeout
        self.selector = selector
        self.max_pending = max_pending
        self.max_message_bytes = max_message_bytes
        self._pool = pool
        self.on_attempt = on_attempt
        self._routes: Routes | None = None
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._queues: dict[QueueKey, _Queue] = {}  # those with sends or a batch out, and
        # up to QUEUE_PLACES_KEPT idle ones
        self._groups: dict[str, _GroupSender] = {}
        self._seqs: dict[tuple[str, int], _Sequence] = {}
        self._rr: dict[str, int] = {}
        self._sticky: dict[str, int] = {}  # topic -> queue whose batch is filling
        self._faults: dict[str, float] = {}
        self._outstanding = 0
        self._flushing = 0  # flush() calls waiting: no lingering while any does
        self._drained: anyio.Event | None = None
        self._pending_slots: anyio.Semaphore | None = None
        self._closed = False
        self._on_settled = self._settled  # bound once: every message's send carries it
        self._tx_stamp: tuple[str, int, int] | None = None  # (tid, epoch, n) of the open txn
        self.send_path = SendPath(self)  # what the transaction models use
        # message trace (`raftmq.client.trace`): off unless asked for
        self.tracer = Tracer("producer", default_client_id()) if trace else None
        self._txn: TransactionalSends | None = None
        self._halves: HalfMessages | None = None
        if transactional_id is not None or producer_group is not None:
            from .transactions import HalfMessages, TransactionalSends

            if transactional_id is not None:
                self._txn = TransactionalSends(self, transactional_id, transaction_timeout_ms)
            if producer_group is not None:
                self._halves = HalfMessages(self, producer_group, check_listener)
        elif check_listener is not None:
            raise ValueError("a check_listener answers for a producer_group: give one")

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Producer:
        if self._stack is not None:
            raise RuntimeError("a Producer can be entered once")
        self._stack, self._routes, self._tg = await open_routes(
            self._pool, self.namesrv, self.send_timeout,
            max_frame=frame_limit(self.max_message_bytes),  # what nodes with this limit take
        )
        self._pending_slots = anyio.Semaphore(self.max_pending)
        if self.tracer is not None:
            self.tracer.start(self._routes, self._tg)
        if self._halves is not None:
            try:
                await self._halves.start()
            except BaseException:
                self._closed = True
                self._tg.cancel_scope.cancel()
                await self._stack.aclose()
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._stack is not None and self._tg is not None
        try:
            if exc_type is None:
                with anyio.move_on_after(min(self.send_timeout * (self.retries + 1)
                                             + LEADER_WAIT, self.delivery_timeout) + 1):
                    await self.flush()
                    if self.tracer is not None:
                        await self.tracer.flush()
            if self._txn is not None:
                await self._txn.close()
        finally:
            self._closed = True
            closed = ClientClosedError("the producer closed before the message was sent")
            for qb in self._queues.values():
                for send in qb.pending:
                    send.resolve(None, closed)
                for batch in qb.formed:
                    batch.fail(self._closed_error(batch))
            for gs in self._groups.values():  # formed, but no worker took them: never sent
                for _, batches, _ in gs.requests:
                    for batch in batches:
                        batch.fail(self._closed_error(batch))
                gs.requests.clear()
            self._tg.cancel_scope.cancel()
        return await close_stack(self._stack, exc)

    async def flush(self) -> None:
        """Wait until every message handed to the producer so far is acknowledged or
        failed. Nothing lingers meanwhile (`linger_ms`): what is held leaves at once, as
        Kafka's `flush` makes every buffered record sendable."""
        self._flushing += 1
        try:
            for gs in self._groups.values():
                gs.wakeup.set()
            while self._outstanding:
                if self._drained is None:
                    self._drained = anyio.Event()
                await self._drained.wait()
        finally:
            self._flushing -= 1

    def _check_open(self) -> Routes:
        if self._routes is None or self._closed:
            raise ClientClosedError("the producer is not open (use `async with Producer(...)`)")
        return self._routes

    # ------------------------------------------------------------ sending

    async def send(
        self,
        topic: str,
        message: OutgoingMessage | bytes | str,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        message_group: str | None = None,
        queue: int | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
        delay_level: int | None = None,
    ) -> SendResult:
        """Send and wait for the acknowledgement (the message is committed in its group).

        Returns or raises within `delivery_timeout`: past it, `OutcomeUnknownError` once
        the producer held the message (it may still be stored), `UnavailableError` when
        it never did (no route, or no room: nothing was sent). `delay` (seconds after it
        is stored), `deliver_at` (an aware datetime or epoch seconds) or `delay_level`
        (1..18, RocketMQ's) make it a delayed message (`raftmq.client.delays`): stored
        now, in its queue when due (its result's offset is then -1)."""
        fut: SendFuture[SendResult] | None = None
        with anyio.move_on_after(self.delivery_timeout):
            fut = await self.send_async(
                topic, message, key=key, tags=tags, properties=properties,
                message_group=message_group, queue=queue,
                delay=delay, deliver_at=deliver_at, delay_level=delay_level,
            )
            return await fut
        if fut is not None and fut.done():
            return fut.result()
        raise self._expired(topic, handed_over=fut is not None)

    def _expired(self, topic: str, *, handed_over: bool) -> RequestError:
        """What a send that reached its `delivery_timeout` raises."""
        if handed_over:
            return OutcomeUnknownError(
                f"send to {topic}: not acknowledged within delivery_timeout "
                f"{self.delivery_timeout:.3g} s; it may still be stored: check before "
                "sending it again")
        return UnavailableError(
            f"send to {topic}: not handed over within delivery_timeout "
            f"{self.delivery_timeout:.3g} s (no route or no room); nothing was sent")

    async def send_async(
        self,
        topic: str,
        message: OutgoingMessage | bytes | str,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        message_group: str | None = None,
        queue: int | None = None,
        callback: Callable[[SendFuture[SendResult]], Any] | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
        delay_level: int | None = None,
    ) -> SendFuture[SendResult]:
        """Hand the message over and return at once with a future of its `SendResult`.

        Waits only to learn the route (first use of a topic) or when `max_pending` sends
        are already outstanding, for `delivery_timeout` at most (then `UnavailableError`:
        nothing was sent). Bad messages, names and unknown topics raise here.
        """
        if self._txn is not None:
            self._not_transactional()
        due = due_fields(delay, deliver_at, delay_level)
        fut: SendFuture[SendResult] = SendFuture()
        if callback is not None:
            fut.add_done_callback(callback)
        msg = as_payload(message, key=key, tags=tags, properties=properties,
                         message_group=message_group)
        check_message(msg, self.max_message_bytes)
        if self._hand_over_now(topic, msg, queue, fut, due):  # no wait: no timer either
            return fut
        with anyio.move_on_after(self.delivery_timeout):
            await self._send_checked(topic, msg, queue, fut, due=due)
            return fut
        raise self._expired(topic, handed_over=False)

    def _hand_over_now(self, topic: str, msg: Payload, queue: int | None,
                       fut: SendFuture[SendResult], due: Due) -> bool:
        """`_send_one` of a checked message when it needs no wait: its topic's route is
        known and the pending window has room (the common case, per message, which so
        pays no timer). False when it would wait, having handed nothing over."""
        routes = self._check_open()
        assert self._tg is not None and self._pending_slots is not None
        route = routes.usable(topic, self._tg.start_soon)
        if route is None:
            return False
        q, movable = self._queue_for(route, topic, msg, queue)
        try:
            self._pending_slots.acquire_nowait()
        except anyio.WouldBlock:
            return False
        self._place(topic, q, movable,
                    PendingSend([msg], record_size(msg), fut, True, self._on_settled), route, due)
        return True

    async def _send_one(self, topic: str, msg: Payload, queue: int | None,
                        fut: SendFuture[SendResult], *,
                        joining: Callable[[TopicRoute, int], Awaitable[None]] | None = None,
                        due: Due = NO_DUE) -> None:
        """Check a message, choose its queue and hand it over, to complete `fut`: the one
        way a single send goes, plain or within a transaction. A transaction's send
        (`joining`, awaited once the queue is chosen) stays on its queue: a retry may not
        move it to another group the transaction has not joined. `due`: when a delayed
        message falls due (`raftmq.client.delays`)."""
        check_message(msg, self.max_message_bytes)
        await self._send_checked(topic, msg, queue, fut, joining=joining, due=due)

    async def _send_checked(self, topic: str, msg: Payload, queue: int | None,
                            fut: SendFuture[SendResult], *,
                            joining: Callable[[TopicRoute, int], Awaitable[None]] | None = None,
                            due: Due = NO_DUE) -> None:
        """`_send_one` of a message `check_message` has passed already."""
        route, q, movable = await self._choose_queue(topic, msg, queue)
        if joining is not None:
            await joining(route, q)
            movable = False
        await self._enqueue(
            topic, q, movable, PendingSend([msg], record_size(msg), fut, True, self._on_settled),
            route, due,
        )

    async def send_oneway(
        self,
        topic: str,
        message: OutgoingMessage | bytes | str,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        message_group: str | None = None,
        queue: int | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
        delay_level: int | None = None,
    ) -> None:
        """Fire and forget: no acknowledgement is awaited and failures are only logged."""
        await self.send_async(
            topic, message, key=key, tags=tags, properties=properties,
            message_group=message_group, queue=queue,
            callback=_log_oneway_failure, delay=delay, deliver_at=deliver_at,
            delay_level=delay_level,
        )

    async def send_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes | str],
        *,
        queue: int | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
        delay_level: int | None = None,
    ) -> list[SendResult]:
        """Send messages and wait for all acknowledgements; results in the order given.

        Each message goes where `send` would put it: to `queue` when given, else a keyed
        message to its key's queue, a grouped one to its message group's (or the callable
        selector's choice), and the keyless
        ones together to one queue (the selector's choice for the first of them). The
        messages bound for one queue keep their order and go in one PRODUCE request
        (atomically) while within the batch bounds (`batch_max_messages`,
        `batch_max_bytes`); more are split into several requests, each atomic on its own,
        and a batch over several queues is atomic per request only. A delay applies to
        every message of the batch (see `send`).
        """
        if self._txn is not None:
            self._not_transactional()
        due = due_fields(delay, deliver_at, delay_level)
        msgs = [as_payload(m) for m in messages]
        if not msgs:
            return []
        for m in msgs:
            check_message(m, self.max_message_bytes)
        futs: list[tuple[list[int], SendFuture[list[SendResult]]]] = []
        with anyio.move_on_after(self.delivery_timeout):
            return await self._send_batch(topic, msgs, queue, futs, due)
        if futs and all(f.done() for _, f in futs):
            return await self._send_batch_results(len(msgs), futs)
        raise self._expired(topic, handed_over=bool(futs))

    async def _send_batch(
        self, topic: str, msgs: list[Payload], queue: int | None,
        futs: list[tuple[list[int], SendFuture[list[SendResult]]]], due: Due = NO_DUE,
    ) -> list[SendResult]:
        """`send_batch` within its bound; `futs` collects the sends handed over."""
        plan: dict[tuple[int, bool], list[int]] = {}
        keyless: tuple[int, bool] | None = None
        for i, m in enumerate(msgs):
            if queue is None and not self._chooses_own_queue(m):
                if keyless is None:
                    _route, q, movable = await self._choose_queue(topic, m, None)
                    keyless = (q, movable)
                plan.setdefault(keyless, []).append(i)
            else:
                _route, q, movable = await self._choose_queue(topic, m, queue)
                plan.setdefault((q, movable), []).append(i)
        for (q, movable), indexes in plan.items():
            done = 0
            for chunk, size in self._chunks([msgs[i] for i in indexes]):
                fut: SendFuture[list[SendResult]] = SendFuture()
                futs.append((indexes[done:done + len(chunk)], fut))
                done += len(chunk)
                await self._enqueue(topic, q, movable,
                                    PendingSend(chunk, size, fut, False, self._on_settled),
                                    due=due)
        return await self._send_batch_results(len(msgs), futs)

    @staticmethod
    async def _send_batch_results(
        n: int, futs: list[tuple[list[int], SendFuture[list[SendResult]]]],
    ) -> list[SendResult]:
        results: list[SendResult | None] = [None] * n
        for indexes, fut in futs:
            for i, result in zip(indexes, await fut, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def _chooses_own_queue(self, msg: Payload) -> bool:
        """Whether `msg`'s queue is its own (its key's, its message group's, or a callable
        selector's), not the one its keyless neighbours share."""
        return callable(self.selector) or _message_group(msg) is not None or (
            self.selector == "key" and isinstance(msg, OutgoingMessage) and bool(msg.key))

    def _not_transactional(self) -> None:
        raise TransactionError(
            Code.MALFORMED, "a producer with a transactional_id sends inside transactions "
            "only: `async with producer.transaction() as tx: await tx.send(...)`")

    # ------------------------------------------------------------ transactions

    def _transactional(self) -> TransactionalSends:
        if self._txn is None:
            raise ValueError("transactions need Producer(..., transactional_id=...)")
        self._check_open()
        return self._txn

    def _half_messages(self) -> HalfMessages:
        if self._halves is None:
            raise ValueError("half messages need Producer(..., producer_group=...)")
        self._check_open()
        return self._halves

    async def begin(self) -> Transaction:
        """Begin a transaction (registering the transactional id on first use); end it
        with `commit()` or `abort()`."""
        return await self._transactional().begin()

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """`async with producer.transaction() as tx:` commits on leaving the block and
        aborts (then re-raises) on an exception."""
        from .transactions import transaction_scope

        return transaction_scope(self._transactional())

    @property
    def fenced(self) -> bool:
        """Whether a newer producer took this one's transactional id over."""
        return self._txn is not None and self._txn.fenced is not None

    async def send_in_transaction(
        self,
        topic: str,
        message: OutgoingMessage | bytes | str,
        *,
        local_transaction: LocalTransaction,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        message_group: str | None = None,
        queue: int | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
        delay_level: int | None = None,
    ) -> TransactionResult:
        """RocketMQ's transactional send: store a half message, run
        `local_transaction(message)` ("commit" / "rollback" / "unknown", plain or async),
        then commit or roll it back; "unknown" or an exception leaves it to check-back.
        A half message whose storing is in doubt raises `OutcomeUnknownError` with its
        `txid` (the local transaction is not run). A delay (see `send`) counts from when
        the half message is stored; committed, it enters its queue when due."""
        return await self._half_messages().send_in_transaction(
            topic, message, local_transaction, key=key, tags=tags, properties=properties,
            message_group=message_group,
            queue=queue, due=due_fields(delay, deliver_at, delay_level))

    async def prepare(
        self,
        topic: str,
        message: OutgoingMessage | bytes | str,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        message_group: str | None = None,
        queue: int | None = None,
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
        delay_level: int | None = None,
    ) -> HalfHandle:
        """Store a half message and return its handle, to `commit()` or `rollback()`
        later (the broker's check-back decides if neither comes). If it may or may not
        have been stored, `OutcomeUnknownError.txid` names it, to decide or look up. A
        delay (see `send`) makes its message due that long after it is stored."""
        return await self._half_messages().prepare(
            topic, message, key=key, tags=tags, properties=properties,
            message_group=message_group, queue=queue,
            due=due_fields(delay, deliver_at, delay_level))

    def _chunks(self, msgs: list[Payload]) -> list[tuple[list[Payload], int]]:
        """`msgs` cut where a batch bound would be passed, each piece with its bytes."""
        out: list[tuple[list[Payload], int]] = []
        cur: list[Payload] = []
        size = 0
        for m in msgs:
            s = record_size(m)
            if cur and (len(cur) >= self.batch_max_messages or size + s > self.batch_max_bytes):
                out.append((cur, size))
                cur, size = [], 0
            cur.append(m)
            size += s
        out.append((cur, size))
        return out

    async def _fetch_route(self, topic: str) -> TopicRoute:
        """The topic's route when none is cached fresh, retrying only transient failures
        to reach the name servers."""
        routes = self._check_open()
        validate_topic_name(topic)
        attempt = 0
        while True:
            try:
                return await routes.route(topic)
            except RequestError as exc:
                attempt += 1
                if not is_retriable(exc) or attempt > self.retries:
                    raise
                await anyio.sleep(backoff_delay(attempt))

    async def _choose_queue(
        self, topic: str, msg: Payload, queue: int | None
    ) -> tuple[TopicRoute, int, bool]:
        """The topic's route, the queue a send goes to, and whether a retry may move it."""
        routes = self._check_open()
        assert self._tg is not None
        # the per-message fast path, no I/O: a known route, refreshed in the background
        route = routes.usable(topic, self._tg.start_soon)
        if route is None:
            route = await self._fetch_route(topic)
        return (route, *self._queue_for(route, topic, msg, queue))

    def _queue_for(self, route: TopicRoute, topic: str, msg: Payload,
                   queue: int | None) -> tuple[int, bool]:
        """The queue of `route` a send goes to, and whether a retry may move it."""
        if queue is not None:
            return _checked_queue(topic, queue, route.total), False
        if callable(self.selector):
            full = OutgoingMessage(msg) if type(msg) is bytes else msg
            assert isinstance(full, OutgoingMessage)
            return _checked_queue(topic, self.selector(route.total, full), route.total), False
        if (group := _message_group(msg)) is not None:
            return key_queue(group, route.total), False
        if self.selector == "key" and isinstance(msg, OutgoingMessage) and msg.key:
            return key_queue(msg.key, route.total), False
        movable = not self.idempotent
        return self._sticky_queue(route, movable), movable

    def _sticky_queue(self, route: TopicRoute, movable: bool) -> int:
        """Round robin by batch, not by message (Kafka's sticky partitioner): a keyless
        send stays on the queue whose batch is still filling, and the next queue is taken
        once that batch has left. A burst spread message by message over N queues would
        make N batches of 1/N the size, and each batch costs the group a Raft entry."""
        q = self._sticky.get(route.topic)
        if q is not None and not self._faults and q < route.total:
            qb = self._queues.get((route.topic, q, movable, NO_DUE))
            if qb is not None and qb.pending and not qb.full:
                return q
        q = self._round_robin(route)
        self._sticky[route.topic] = q
        return q

    def _round_robin(self, route: TopicRoute, avoid_groups: Iterable[str] = ()) -> int:
        queues = route.queue_ids
        avoid: Container[int] = ()
        if avoid_groups or self._faults:  # the common case has nothing to avoid
            now = clock()
            for failed, until in list(self._faults.items()):
                if until <= now:
                    del self._faults[failed]
            bad = set(self._faults).union(avoid_groups)
            if bad:
                avoid = _QueuesOf(route, bad)
        counter = self._rr.get(route.topic)
        if counter is None:
            counter = random.randrange(len(queues))
        if not avoid and queues:  # what `pick_round_robin` gives with nothing to avoid
            self._rr[route.topic] = counter + 1
            return queues[counter % len(queues)]
        q, self._rr[route.topic] = pick_round_robin(queues, counter, avoid)
        return q

    async def _enqueue(self, topic: str, queue: int, movable: bool, send: PendingSend,
                       route: TopicRoute | None = None, due: Due = NO_DUE) -> None:
        """Take a place in the pending window (waiting only when it is full) and hand the
        send to its queue's place in the accumulator of the queue's group. `route` is the
        topic's route the caller just used, if any: it places a new queue without a second
        lookup unless the send had to wait (the route may have changed meanwhile)."""
        self._check_open()
        assert self._pending_slots is not None and self._tg is not None
        try:  # the common case needs no checkpoint: one per message is most of the cost
            self._pending_slots.acquire_nowait()
        except anyio.WouldBlock:
            await self._pending_slots.acquire()
            self._check_open()
            route = None
        self._place(topic, queue, movable, send, route, due)

    def _place(self, topic: str, queue: int, movable: bool, send: PendingSend,
               route: TopicRoute | None, due: Due) -> None:
        """Hand a send that holds its place in the pending window to its queue's place
        in the accumulator of the queue's group."""
        self._outstanding += 1
        now = clock()
        send.deadline = now + self.delivery_timeout
        key = (topic, queue, movable, due)  # sends due at another time: another batch
        qb = self._queues.get(key)
        if qb is None or (route is not None and qb.group is not None and not qb.busy
                          and qb.empty and qb.group.group != route.group_of(queue)):
            # new, or kept idle while its queue moved to another group: placed afresh
            qb = self._queues[key] = self._new_queue(key, route)
        group = qb.group
        if group is None:  # its group is being looked up: it waits
            qb.add(send, now)
        elif group.add(qb, send, now):
            self._groups[group.group].wakeup.set()

    def _new_queue(self, key: QueueKey, route: TopicRoute | None = None) -> _Queue:
        """A queue's place, in its group's accumulator; one whose group the route does
        not name yet is held (busy) while the route is refreshed (`_find_group`).
        `route` is the topic's route just looked up, if the caller has it."""
        assert self._tg is not None and self._routes is not None
        qb: _Queue = QueueBuffer(self.linger, self.batch_max_messages, self.batch_max_bytes,
                                 key=key)
        if route is None or route.stale:
            route = self._routes.usable(key[0], self._tg.start_soon)
        group = route.group_of(key[1]) if route is not None else None
        if group is None:
            qb.busy = True
            self._tg.start_soon(self._find_group, qb)
        else:
            qb.group = self._sender(group).acc
        return qb

    def _sender(self, group: str) -> _GroupSender:
        gs = self._groups.get(group)
        if gs is None:
            assert self._tg is not None
            gs = self._groups[group] = _GroupSender(GroupAccumulator(
                group, linger=self.linger, batches_per_queue=self.max_in_flight,
                max_batches=MAX_BATCHES, max_bytes=MAX_BATCH_BYTES, company=REQUEST_COMPANY))
            self._tg.start_soon(self._run_group, gs)
        return gs

    async def _find_group(self, qb: _Queue) -> None:
        """Learn the group of a queue its route did not place (a gap while its group's
        registration lapsed), then let it send; its sends fail if that never works out."""
        topic, queue = qb.key[:2]
        attempt = 0
        while True:
            try:
                group = await self._check_open().group_of(topic, queue)
                break
            except RequestError as exc:
                attempt += 1
                if not is_retriable(exc) or attempt > self.retries:
                    error = give_up(exc, f"send to {topic} queue {queue}")
                    while qb.pending:
                        qb.pending.popleft().resolve(None, error)
                    qb.messages = qb.bytes = 0
                    while qb.formed:  # batches moved here
                        b = qb.formed.popleft()
                        b.fail(give_up(exc, f"send to {topic} queue {queue}",
                                       uncertain=b.uncertain))
                    self._release(qb)
                    return
                await anyio.sleep(backoff_delay(attempt))
        qb.group = self._sender(group).acc
        self._release(qb)

    def _release(self, qb: _Queue) -> None:
        """No request holds `qb` any more: it may send again. Empty, it is kept for the
        next send to its queue while fewer than `QUEUE_PLACES_KEPT` are (a producer
        spreading sends over many queues would otherwise make one per message), else
        forgotten."""
        group = qb.group
        if group is None:
            qb.busy = False
        elif group.release(qb, clock()):
            self._groups[group.group].wakeup.set()
        if (qb.empty and not qb.busy and len(self._queues) > QUEUE_PLACES_KEPT
                and self._queues.get(qb.key) is qb):
            del self._queues[qb.key]

    def _settled(self) -> None:
        """A send is acknowledged or failed: free its place in the pending window."""
        assert self._pending_slots is not None
        self._pending_slots.release()
        self._outstanding -= 1
        if self._outstanding == 0 and self._drained is not None:
            self._drained.set()
            self._drained = None

    async def _run_group(self, gs: _GroupSender) -> None:
        """The sender of one group: a request leaves whenever the accumulator is ready
        and none is out, or fewer than `REQUESTS_IN_FLIGHT` are and what is ready is
        worth another (`REQUEST_COMPANY`)."""
        acc = gs.acc
        while True:
            now = clock()
            if gs.in_flight < REQUESTS_IN_FLIGHT and acc.sendable:
                ready = acc.ready(now)
                if self._flushing or ready and (gs.in_flight == 0 or acc.worth_another()):
                    self._start_request(gs)
                    continue
                if ready:  # company for a request, or the answer out: wait
                    await gs.wait()
                    continue
                with anyio.move_on_after(acc.deadline - now):  # lingering
                    await gs.wait()
                continue
            await gs.wait()  # woken by a send, a released queue, an answer

    def _start_request(self, gs: _GroupSender) -> None:
        """Drain the group's accumulator into one request and send it."""
        assert self._tg is not None and self._routes is not None
        born = int(time.time() * 1000)
        now = clock()
        batches: list[_Batch] = []
        queues: list[_Queue] = []
        for taken in gs.acc.drain():
            qb = taken.queue
            queues.append(qb)
            batches += taken.formed
            topic, queue, movable, (delay_ms, deliver_ms) = qb.key
            for sends in taken.new:
                if sends[0].deadline <= now:  # the oldest first: expired ones lead
                    sends = self._expire(topic, sends, now)
                    if not sends:
                        continue
                msgs = sends[0].messages if len(sends) == 1 else [
                    m for s in sends for m in s.messages]
                pid, seq = 0, -1
                if self.idempotent:
                    state = self._sequence(topic, queue)
                    pid, seq = state.pid, state.next_seq
                    state.next_seq += 1
                data = encode_batch(topic, queue, msgs, pid=pid, seq=seq, born_ms=born,
                                    tx=self._tx_stamp,  # the open transaction's, if any
                                    delay_ms=delay_ms, deliver_ms=deliver_ms)
                batches.append(_Batch(qb, topic, queue, movable, sends, msgs, data, born,
                                      sends[0].deadline))  # the oldest send's
        if not batches:  # all expired: nothing to send, the queues are free again
            for qb in queues:
                self._release(qb)
            return
        gs.in_flight += 1
        gs.requests.append((self._routes.target(gs.acc.group), batches, queues))
        if gs.idle:
            gs.idle.pop().set()
        else:
            self._tg.start_soon(self._request_worker, gs)

    async def _request_worker(self, gs: _GroupSender) -> None:
        """Send the group's formed requests one at a time, taking the oldest first; a
        group has as many of these tasks as it ever had requests out at once
        (`REQUESTS_IN_FLIGHT`, and those waiting to retry). A worker writes the request
        it took before it next waits (once connected), so requests leave in the order
        they were formed, as they did from a task spawned per request."""
        while True:
            while gs.requests:
                await self._send_request(gs, *gs.requests.popleft())
            ready = anyio.Event()
            gs.idle.append(ready)
            await ready.wait()

    def _expire(self, topic: str, sends: list[PendingSend], now: float) -> list[PendingSend]:
        """Fail the sends whose delivery timeout ended before they were ever sent
        (`UnavailableError`: nothing of them was sent); the others, to send."""
        keep: list[PendingSend] = []
        for send in sends:
            if send.deadline <= now:
                send.resolve(None, UnavailableError(
                    f"send to {topic}: not sent within delivery_timeout "
                    f"{self.delivery_timeout:.3g} s (its queue was busy or had no leader); "
                    "nothing was sent"))
            else:
                keep.append(send)
        return keep

    def _sequence(self, topic: str, queue: int) -> _Sequence:
        seq = self._seqs.get((topic, queue))
        if seq is None:
            seq = self._seqs[(topic, queue)] = _Sequence(self.pid)
        return seq

    async def _send_request(self, gs: _GroupSender, addr: str | None, batches: list[_Batch],
                            queues: list[_Queue]) -> None:
        """One PRODUCE request for `batches` (of `queues`, which it holds), then each
        batch's fate: acknowledged, failed, or back at the front of its queue for a retry
        (after a backoff, unless a newer leader was learned). The queues are released
        once none of their batches is out."""
        group = gs.acc.group
        held = {id(qb): qb for qb in queues}

        def release(done: Iterable[_Queue]) -> None:
            for qb in done:
                if held.pop(id(qb), None) is not None:
                    self._release(qb)

        try:
            for b in batches:
                b.out = True
            try:
                outcomes = await self._request(group, addr, batches)
            except RequestError as exc:  # the request as a whole: every batch's fate
                outcomes = [exc] * len(batches)
            finally:
                gs.in_flight -= 1
                gs.wakeup.set()
            for b in batches:
                b.out = False
            retry = self._settle(group, batches, outcomes)
            if retry:
                waiting = {id(b.qb) for b, _ in retry}
                release([qb for qb in queues if id(qb) not in waiting])
                await self._retry(group, addr, retry)
            release(queues)
        except Exception as exc:  # not a refusal: the sends fail with it, as they are
            for b in batches:
                b.fail(exc)
            release(queues)
        except BaseException:  # cancelled as the producer closes
            for b in batches:
                b.fail(self._closed_error(b))
            raise

    @staticmethod
    def _closed_error(b: _Batch) -> RaftMQError:
        """What a batch the closing producer abandons fails with: when a request of it
        may be stored (one is out, or an earlier one may have been) its outcome is
        unknown; else it was never sent."""
        if b.out or b.uncertain:
            return OutcomeUnknownError(
                f"send to {b.topic} queue {b.queue}: the producer closed before the answer; "
                "it may have been stored: check before sending it again")
        return ClientClosedError("the producer closed before the message was sent")

    async def _request(self, group: str, addr: str | None,
                       batches: list[_Batch]) -> list[_Stored | RequestError]:
        """Send one PRODUCE request: the single-batch form for one batch (which older
        nodes also take), else the multi-batch form; each batch's outcome fields or its
        own error. Raises what fails the request as a whole."""
        if addr is None:
            raise RequestError(Code.NOT_LEADER, f"no known replica of group {group}",
                               transient=True)
        if self.on_attempt is not None:
            for b in batches:
                b.sent += 1
                self.on_attempt(SendAttempt(b.topic, b.queue, group, addr, b.sent, b.messages))
        pool = self._check_open().pool
        # no request outlasts the delivery timeout of a batch it carries
        timeout = max(MIN_REQUEST_TIMEOUT,
                      min(self.send_timeout, min(b.deadline for b in batches) - clock()))
        if len(batches) == 1:
            frame = await pool.request(addr, Op.PRODUCE, ProduceRequest(g=group).header(),
                                       batches[0].data, timeout=timeout)
            try:
                return [_stored_fields(frame.header)]
            except RequestError as exc:
                return [exc]
        req = ProduceRequest(g=group, sizes=tuple([b.nbytes for b in batches]))
        frame = await pool.request(addr, Op.PRODUCE, req.header(),
                                   b"".join([b.data for b in batches]), timeout=timeout)
        results = frame.header.get("results")
        if not isinstance(results, list) or len(results) != len(batches):
            raise RequestError(Code.MALFORMED, f"bad PRODUCE answer {frame.header!r}")
        out: list[_Stored | RequestError] = []
        add = out.append
        for outcome in results:
            # the common outcome, [0, base, n, index, dup, shift] of ints (dup a bool),
            # read in place: one is read per batch, and a batch may be one message
            if (type(outcome) is list and len(outcome) == 6 and outcome[0] == 0
                    and type(outcome[1]) is int and type(outcome[2]) is int
                    and type(outcome[3]) is int and type(outcome[5]) is int):
                add((outcome[1], outcome[2], outcome[3], bool(outcome[4]), outcome[5]))
                continue
            try:
                add(_stored_fields(decode_outcome(outcome)))
            except RequestError as exc:
                add(exc)
        return out

    def _settle(self, group: str, batches: list[_Batch],
                outcomes: Sequence[_Stored | RequestError]) -> list[tuple[_Batch, RequestError]]:
        """Acknowledge the batches stored and fail those refused for good; the others,
        to retry, in request order with their errors."""
        errors: list[tuple[int, _Batch, RequestError]] = []
        last_stored: dict[int, int] = {}  # id of a queue -> where its last stored batch is
        for i, (b, outcome) in enumerate(zip(batches, outcomes, strict=True)):
            if isinstance(outcome, RequestError):
                errors.append((i, b, outcome))
                continue
            try:
                results = self._results(b.topic, b.queue, group, b.data, outcome)
            except RequestError as exc:
                errors.append((i, b, exc))
                continue
            b.succeed(results)
            if self.tracer is not None:
                self.tracer.add_many(group, b.topic, "sent",
                                     ((r.queue, r.offset) for r in results if r.offset >= 0),
                                     b.born)
            last_stored[id(b.qb)] = i
        retry: list[tuple[_Batch, RequestError]] = []
        for i, b, error in errors:
            b.uncertain = b.uncertain or may_have_applied(error)
            if not is_retriable(error):
                self._give_up(b, error, spent=False)
            elif last_stored.get(id(b.qb), -1) > i:
                # a later batch of its queue is stored: resent now, this one would land
                # after it, so it fails instead (its queue's order is the promise)
                self._give_up(b, error, spent=True)
            else:
                retry.append((b, error))
        return retry

    async def _retry(self, group: str, addr: str | None,
                     items: list[tuple[_Batch, RequestError]]) -> None:
        """Put batches that failed with retriable errors back at the front of their
        queues (or, for a movable batch, on another queue): at once when a newer leader
        was learned, else after a backoff that a new leader ends early. The caller holds
        their queues until this returns, so nothing of theirs overtakes them."""
        routes = self._check_open()
        held = list({id(b.qb): b.qb for b, _ in items}.values())
        exc0 = items[0][1]
        redirect = (addr is not None and routes.on_error(group, addr, exc0)
                    and all(b.redirects < MAX_REDIRECTS for b, _ in items))
        if redirect:
            for b, _ in items:
                b.redirects += 1
            keep = [b for b, _ in items]
        else:
            now = clock()
            if self._faults.get(group, 0.0) <= now:
                # retries of batches already in flight must not extend the window, or a
                # group stays avoided long after its new leader is serving
                self._faults[group] = now + FAULT_WINDOW
            keep = []
            for b, exc in items:
                b.attempts += 1
                b.failed_groups.add(group)
                if b.first_failed is None:
                    b.first_failed = now
                if now >= b.deadline or (b.attempts > self.retries
                                         and not electing(exc, b.first_failed)):
                    self._give_up(b, exc, spent=True)
                else:
                    keep.append(b)
            if keep:
                log.debug("send to group %s failed (%s); retry %d", group, exc0,
                          max(b.attempts for b in keep))
                left = min(b.deadline for b in keep) - now
                await routes.wait_backoff(
                    group, min(left, backoff_delay(max(b.attempts for b in keep))))
        if not redirect and routes.doubted(group):
            await routes.refresh_leaders()  # one CLUSTER for the group's leader, shared
        own: dict[int, list[_Batch]] = {}
        for b in keep:
            if b.movable and not redirect:
                new_queue = await self._other_queue(b.topic, b.queue, b.failed_groups)
                if new_queue != b.queue:
                    self._move(b, new_queue)
                    continue
            own.setdefault(id(b.qb), []).append(b)
        for qb in held:
            mine = own.get(id(qb))
            if mine:
                await self._rehome(qb)
                assert qb.group is not None
                qb.group.requeue(qb, mine, front=True)

    def _move(self, b: _Batch, queue: int) -> None:
        """A movable batch goes to `queue` of its topic (another group's, as a rule): it
        is encoded for that queue and waits there behind the batches made before it."""
        b.queue = queue
        due = b.qb.key[3]
        b.data = encode_batch(b.topic, queue, b.messages, born_ms=b.born, delay_ms=due[0],
                              deliver_ms=due[1])
        key = (b.topic, queue, True, due)
        qb = self._queues.get(key)
        if qb is None:
            qb = self._queues[key] = self._new_queue(key)
        b.qb = qb
        if qb.group is None:
            qb.formed.append(b)  # sent once `_find_group` places the queue
        else:
            qb.group.requeue(qb, [b], front=False)
            self._groups[qb.group.group].wakeup.set()

    async def _rehome(self, qb: _Queue) -> None:
        """A held queue the route now places in another group moves there."""
        topic, queue = qb.key[:2]
        try:
            group = await self._check_open().group_of(topic, queue)
        except RequestError:
            return  # its next request fails and counts, as any other
        if qb.group is None or qb.group.group != group:
            qb.group = self._sender(group).acc

    def _give_up(self, b: _Batch, exc: RequestError, *, spent: bool) -> None:
        """Fail a batch: with its own error when refused outright, else as `give_up`
        says once its retries are `spent` (or one of its tries may have stored it)."""
        self._abandon(b.topic, b.queue)
        if spent or b.uncertain:
            b.fail(give_up(exc, f"send to {b.topic} queue {b.queue}", uncertain=b.uncertain))
        else:
            b.fail(as_sdk_error(exc))

    def _abandon(self, topic: str, queue: int) -> None:
        """After a batch of an idempotent producer fails for good, its outcome may be
        unknown; later batches of the queue use a fresh producer id (sequence 0), so they
        neither wait for nor get confused with the lost one."""
        if self.idempotent:
            self._seqs[(topic, queue)] = _Sequence(new_producer_id())

    async def _other_queue(self, topic: str, queue: int, failed_groups: set[str]) -> int:
        try:
            route = await self._check_open().route(topic)
        except RequestError:
            return queue
        return self._round_robin(route, failed_groups)

    def _results(
        self, topic: str, queue: int, group: str, batch: EncodedBatch, stored: _Stored
    ) -> list[SendResult]:
        base, n, index, dup, shift = stored
        if base >= 0 and n == 1 and len(batch.starts) == 1:  # a batch of one, stored
            return [SendResult(message_id(group, index, batch.starts[0] + shift), topic, queue,
                               base, group, dup)]
        ids = batch_message_ids(group, index, batch, shift)
        if n != len(ids):
            raise RequestError(Code.MALFORMED, f"PRODUCE stored {n} of {len(ids)} messages")
        if base < 0:
            if index >= 0 and (self._txn is not None or not dup):
                # prepared or delayed: stored, in no queue yet (a duplicate outside a
                # transaction with base -1 is one too old to say where it went)
                return [SendResult(mid, topic, queue, -1, group, dup) for mid in ids]
            return [SendResult(None, topic, queue, -1, group, dup) for _ in ids]
        return [SendResult(mid, topic, queue, base + i, group, dup) for i, mid in enumerate(ids)]


class _QueuesOf:
    """The queues of some groups, tested one queue at a time: round robin probes only
    until it finds a good queue, so building the whole set per message would be waste."""

    __slots__ = ("groups", "route")

    def __init__(self, route: TopicRoute, groups: set[str]) -> None:
        self.route = route
        self.groups = groups

    def __contains__(self, queue: object) -> bool:
        return isinstance(queue, int) and self.route.group_of(queue) in self.groups


def _checked_queue(topic: str, queue: int, total: int) -> int:
    if not isinstance(queue, int) or not 0 <= queue < total:
        raise RequestError(
            Code.UNKNOWN_QUEUE, f"queue {queue!r} does not exist: {topic!r} has queues 0..{total - 1}"
        )
    return queue


def _log_oneway_failure(fut: SendFuture[SendResult]) -> None:
    exc = fut.exception()
    if exc is not None:
        log.debug("one-way send failed: %s", exc)

