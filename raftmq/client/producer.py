"""The producer: queue selection, per-queue batching, retries and idempotence.

Messages sent close together to the same queue share one PRODUCE request: each queue
has an accumulator and one sender task that ships batches in order. A batch leaves when
the queue may have another batch in flight, after waiting up to `linger_ms` for company
(0 by default: messages that arrive while earlier batches are in flight form the next
one anyway) or as soon as a size bound is reached. Keyless round-robin sends stick to one
queue until its batch has left, so a burst makes full batches, not one per queue. The
batch bytes built here are stored by the leader as they are, so a message id can be
computed from the batch layout and the Raft index the leader returns.

Retries follow RocketMQ: a send that fails with a retriable error is tried again up to
`retries` more times, after refreshing the route. Learning of a newer leader (a
NOT_LEADER hint of a newer term, the route naming another leader) is not a failure: the
send goes there at once, without counting an attempt or finishing its backoff; and when
the leader's connection fails, another replica is asked at once who leads now (see
`raftmq.client.routes`). A round-robin send of a
non-idempotent producer moves to a queue of another group ("avoid the failed broker").
An idempotent producer instead resends the same bytes (same producer id and sequence) to
the same queue, and the state machine drops the copy if the first try was written.
"""

from __future__ import annotations

import logging
import random
import time
import zlib
from collections import deque
from collections.abc import Callable, Container, Generator, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from broker.produce_wire import MAX_BATCHES, decode_outcome
from broker.protocol import (
    DEFAULT_MAX_FRAME,
    MAX_MESSAGE_BYTES,
    Code,
    Op,
    RequestError,
    frame_limit,
    validate_topic_name,
)
from broker.records import (
    EncodedBatch,
    OutgoingMessage,
    encode_batch,
    record_size,
)
from transport.connection import DEFAULT_TIMEOUT, ClientClosedError, ConnectionPool, is_retriable

from .errors import close_stack, give_up, may_have_applied
from .routes import (
    Routes,
    TopicRoute,
    backoff_delay,
    clock,
    normalize_addresses,
    open_routes,
)

__all__ = [
    "BatchAccumulator",
    "PendingSend",
    "Payload",
    "Producer",
    "QueueSelector",
    "SendAttempt",
    "SendFuture",
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

FAULT_WINDOW = 5.0  # seconds a failed group is avoided by round-robin selection
IDLE_EXIT = 0.1
"""Seconds a queue's sender task outlives its last batch. Short, because a producer
spreading calls over 10,000 topics touches 40,000 queues: idle senders that lingered for
long each held a task, a timer and their events, and the heap they made slowed the whole
client (measured: p99 0.9 s instead of 0.2 s). Starting a sender again costs far less."""
MAX_BATCH_BYTES = DEFAULT_MAX_FRAME - (1 << 20)  # leave room for the frame header
REQUESTS_IN_FLIGHT = 4
"""PRODUCE requests one producer keeps in flight to one group (Kafka's
max.in.flight.requests.per.connection is 5): each carries every batch of that group ready
when it leaves, so batches for thousands of queues share a few requests."""


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


class SendFuture(Generic[T]):
    """The outcome of an asynchronous send; `await` it, or poll `done()`/`result()`.

    Works under any anyio backend (it is not an asyncio future). Callbacks added with
    `add_done_callback` run in the event loop as soon as the outcome is known, with the
    future as their argument. One is made per message, so it allocates nothing more
    until someone awaits it or adds a second callback.
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

    def result(self) -> T:
        """The result; raises the send's error, or `RuntimeError` while still pending."""
        if not self._done:
            raise RuntimeError("the send is not finished yet")
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def exception(self) -> BaseException | None:
        if not self._done:
            raise RuntimeError("the send is not finished yet")
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

    async def wait(self) -> T:
        if not self._done:
            if self._event is None:
                self._event = anyio.Event()
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
) -> OutgoingMessage:
    """Normalise what a caller passed to `send` into an `OutgoingMessage`.

    A str body is UTF-8 encoded; explicit key/tags/properties override the message's own.
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
    if isinstance(msg, OutgoingMessage) and msg.properties:
        for k, v in msg.properties.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("message properties map str to str")


def as_payload(
    message: OutgoingMessage | bytes | bytearray | memoryview | str,
    *,
    key: str | None = None,
    tags: str | None = None,
    properties: dict[str, str] | None = None,
) -> Payload:
    """What a send puts in a batch: the body alone when there is no key, tags or
    properties (the common case, one object fewer per message), else the message."""
    if type(message) is bytes and key is None and tags is None and properties is None:
        return message
    msg = make_message(message, key=key, tags=tags, properties=properties)
    if type(msg.body) is bytes and not (msg.key or msg.tags or msg.properties):
        return msg.body
    return msg


def key_queue(key: str, total: int) -> int:
    """Stable sharding: the same key always lands on the same queue (CRC-32 mod total),
    in every process and Python version (unlike `hash`)."""
    if total <= 0:
        raise ValueError("a topic has at least one queue")
    return zlib.crc32(key.encode()) % total


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
    window), run once before the future completes.
    """

    messages: list[Payload]
    size: int
    future: SendFuture[Any]
    single: bool = False
    settled: Callable[[], None] | None = None
    resolved: bool = False

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
class BatchAccumulator:
    """Pending sends of one queue and the rule for when they form a batch.

    A batch is due when the oldest pending send has waited `linger` seconds or the
    pending messages reach either size bound. `take` never splits a send and always
    takes at least one, so an oversized send still goes out (alone).
    """

    linger: float
    max_messages: int
    max_bytes: int
    pending: deque[PendingSend] = field(default_factory=deque)
    messages: int = 0
    bytes: int = 0
    first_at: float = 0.0

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, send: PendingSend, now: float) -> None:
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

    def take(self) -> list[PendingSend]:
        out: list[PendingSend] = []
        n = size = 0
        while self.pending:
            nxt = self.pending[0]
            if out and (n + len(nxt.messages) > self.max_messages or size + nxt.size > self.max_bytes):
                break
            self.pending.popleft()
            out.append(nxt)
            n += len(nxt.messages)
            size += nxt.size
        self.messages -= n
        self.bytes -= size
        return out

    def fail_all(self, error: BaseException) -> None:
        while self.pending:
            self.pending.popleft().resolve(None, error)
        self.messages = self.bytes = 0


# ---------------------------------------------------------------- producer


@dataclass(slots=True)
class _Sequence:
    pid: int
    next_seq: int = 0


class _QueueSender:
    """The accumulator and sender task of one (topic, queue, movable) stream."""

    def __init__(self, topic: str, queue: int, movable: bool, acc: BatchAccumulator,
                 max_in_flight: int) -> None:
        self.topic = topic
        self.queue = queue
        self.movable = movable
        self.acc = acc
        self.wakeup = anyio.Event()
        self.slots = anyio.Semaphore(max_in_flight)
        self.max_in_flight = max_in_flight

    def wake(self) -> None:
        self.wakeup.set()

    @property
    def idle(self) -> bool:
        return not self.acc.pending and self.slots.value == self.max_in_flight


class _BatchWait:
    """One encoded batch waiting in an outbox, and its outcome once answered."""

    __slots__ = ("batch", "event", "fields", "error")

    def __init__(self, batch: EncodedBatch) -> None:
        self.batch = batch
        self.event = anyio.Event()
        self.fields: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def settle(self, fields: dict[str, Any] | None, error: BaseException | None) -> None:
        if not self.event.is_set():
            self.fields, self.error = fields, error
            self.event.set()


class _Outbox:
    """Batches bound for one group at one address: they leave together, as one
    multi-batch PRODUCE request (`broker.produce_wire`), at most `REQUESTS_IN_FLIGHT`
    requests at a time. A batch that finds a request slot free leaves at once (with
    whatever batches came in the same turn of the event loop); the others gather while
    the requests in flight are answered, so the more queues a producer feeds, the more
    batches each request (one Raft round of the group) carries."""

    def __init__(self) -> None:
        self.pending: deque[_BatchWait] = deque()
        self.wakeup = anyio.Event()
        self.slots = anyio.Semaphore(REQUESTS_IN_FLIGHT)

    @property
    def idle(self) -> bool:
        return not self.pending and self.slots.value == REQUESTS_IN_FLIGHT

    def take(self) -> list[_BatchWait]:
        """The next request's batches: at least one, within the frame and count bounds."""
        out = [self.pending.popleft()]
        size = len(out[0].batch)
        while self.pending and len(out) < MAX_BATCHES:
            nxt = len(self.pending[0].batch)
            if size + nxt > MAX_BATCH_BYTES:
                break
            out.append(self.pending.popleft())
            size += nxt
        return out


class Producer:
    """Sends messages to topics; use as `async with Producer(namesrv) as p:`.

    `selector` is "key" (the default: a message with a key goes to its key's queue, a
    stable hash of the key, so one key keeps its order on one queue; keyless messages go
    round robin by batch, see the module docstring), "round_robin" (every message, keyed
    or not) or a callable `(total_queues, message) -> queue`. Keyed sends, sends with a
    callable and sends with an explicit `queue` stay on their queue when retried.

    `max_in_flight` is the number of batches one queue may have in flight at once; an
    idempotent producer always uses 1, so its batches reach the log in sequence order.
    `linger_ms` (default 0) trades latency for batch size when the load is light; a
    synchronous `send` waits for it too. Leaving the `async with` block waits (up
    to the send timeout times the attempts) for buffered messages to be acknowledged.

    `on_attempt`, when given, is called with a `SendAttempt` just before every PRODUCE
    request leaves, retries and redirects included (it must not block or raise).
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
        selector: Literal["round_robin", "key"] | QueueSelector = "key",
        max_pending: int = 10_000,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        pool: ConnectionPool | None = None,
        on_attempt: Callable[[SendAttempt], None] | None = None,
    ) -> None:
        if linger_ms < 0 or send_timeout <= 0 or retries < 0:
            raise ValueError("linger_ms, send_timeout and retries must not be negative")
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
        self.selector = selector
        self.max_pending = max_pending
        self.max_message_bytes = max_message_bytes
        self._pool = pool
        self.on_attempt = on_attempt
        self._routes: Routes | None = None
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._senders: dict[tuple[str, int, bool], _QueueSender] = {}
        self._outboxes: dict[tuple[str, str], _Outbox] = {}  # (addr, group) -> outbox
        self._seqs: dict[tuple[str, int], _Sequence] = {}
        self._rr: dict[str, int] = {}
        self._sticky: dict[str, int] = {}  # topic -> queue whose batch is filling
        self._faults: dict[str, float] = {}
        self._outstanding = 0
        self._drained: anyio.Event | None = None
        self._pending_slots: anyio.Semaphore | None = None
        self._closed = False
        self._on_settled = self._settled  # bound once: every message's send carries it

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Producer:
        if self._stack is not None:
            raise RuntimeError("a Producer can be entered once")
        self._stack, self._routes, self._tg = await open_routes(
            self._pool, self.namesrv, self.send_timeout,
            max_frame=frame_limit(self.max_message_bytes),  # what nodes with this limit take
        )
        self._pending_slots = anyio.Semaphore(self.max_pending)
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
                with anyio.move_on_after(self.send_timeout * (self.retries + 1) + 1):
                    await self.flush()
        finally:
            self._closed = True
            closed = ClientClosedError("the producer closed before the message was sent")
            for sender in self._senders.values():
                sender.acc.fail_all(closed)
            self._tg.cancel_scope.cancel()
        return await close_stack(self._stack, exc)

    async def flush(self) -> None:
        """Wait until every message handed to the producer so far is acknowledged or failed."""
        while self._outstanding:
            if self._drained is None:
                self._drained = anyio.Event()
            await self._drained.wait()

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
        queue: int | None = None,
    ) -> SendResult:
        """Send and wait for the acknowledgement (the message is committed in its group)."""
        fut = await self.send_async(
            topic, message, key=key, tags=tags, properties=properties, queue=queue
        )
        return await fut

    async def send_async(
        self,
        topic: str,
        message: OutgoingMessage | bytes | str,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        queue: int | None = None,
        callback: Callable[[SendFuture[SendResult]], Any] | None = None,
    ) -> SendFuture[SendResult]:
        """Hand the message over and return at once with a future of its `SendResult`.

        Waits only to learn the route (first use of a topic) or when `max_pending` sends
        are already outstanding. Bad messages, names and unknown topics raise here.
        """
        msg = as_payload(message, key=key, tags=tags, properties=properties)
        check_message(msg, self.max_message_bytes)
        fut: SendFuture[SendResult] = SendFuture()
        if callback is not None:
            fut.add_done_callback(callback)
        q, movable = await self._choose_queue(topic, msg, queue)
        await self._enqueue(
            topic, q, movable, PendingSend([msg], record_size(msg), fut, True, self._on_settled)
        )
        return fut

    async def send_oneway(
        self,
        topic: str,
        message: OutgoingMessage | bytes | str,
        *,
        key: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        queue: int | None = None,
    ) -> None:
        """Fire and forget: no acknowledgement is awaited and failures are only logged."""
        await self.send_async(
            topic, message, key=key, tags=tags, properties=properties, queue=queue,
            callback=_log_oneway_failure,
        )

    async def send_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingMessage | bytes | str],
        *,
        queue: int | None = None,
    ) -> list[SendResult]:
        """Send messages to one queue and wait for all acknowledgements, in order.

        The queue is `queue`, else the selector's choice for the first message. Messages
        within the batch size bounds go in one PRODUCE request (atomically); a larger
        list is split into several.
        """
        msgs = [as_payload(m) for m in messages]
        if not msgs:
            return []
        for m in msgs:
            check_message(m, self.max_message_bytes)
        q, movable = await self._choose_queue(topic, msgs[0], queue)
        futs: list[SendFuture[list[SendResult]]] = []
        for chunk, size in self._chunks(msgs):
            fut: SendFuture[list[SendResult]] = SendFuture()
            futs.append(fut)
            await self._enqueue(topic, q, movable, PendingSend(chunk, size, fut, False, self._on_settled))
        results: list[SendResult] = []
        for fut in futs:
            results += await fut
        return results

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
    ) -> tuple[int, bool]:
        assert self._tg is not None
        # the per-message fast path, no I/O: a known route, refreshed in the background
        route = self._check_open().usable(topic, self._tg.start_soon)
        if route is None:
            route = await self._fetch_route(topic)
        if queue is not None:
            return _checked_queue(topic, queue, route.total), False
        if callable(self.selector):
            full = OutgoingMessage(msg) if type(msg) is bytes else msg
            assert isinstance(full, OutgoingMessage)
            return _checked_queue(topic, self.selector(route.total, full), route.total), False
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
            sender = self._senders.get((route.topic, q, movable))
            if sender is not None and sender.acc.pending and not sender.acc.full:
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
        q, self._rr[route.topic] = pick_round_robin(queues, counter, avoid)
        return q

    async def _enqueue(self, topic: str, queue: int, movable: bool, send: PendingSend) -> None:
        """Take a place in the pending window (waiting only when it is full) and hand the
        send to its queue's accumulator."""
        self._check_open()
        assert self._pending_slots is not None and self._tg is not None
        try:  # the common case needs no checkpoint: one per message is most of the cost
            self._pending_slots.acquire_nowait()
        except anyio.WouldBlock:
            await self._pending_slots.acquire()
            self._check_open()
        self._outstanding += 1
        key = (topic, queue, movable)
        sender = self._senders.get(key)
        if sender is None:
            acc = BatchAccumulator(self.linger, self.batch_max_messages, self.batch_max_bytes)
            sender = _QueueSender(topic, queue, movable, acc, self.max_in_flight)
            self._senders[key] = sender
            self._tg.start_soon(self._run_sender, sender)
        acc = sender.acc
        acc.add(send, clock())
        if len(acc.pending) == 1 or acc.full:
            sender.wake()  # otherwise the sender is already lingering on this batch

    def _settled(self) -> None:
        """A send is acknowledged or failed: free its place in the pending window."""
        assert self._pending_slots is not None
        self._pending_slots.release()
        self._outstanding -= 1
        if self._outstanding == 0 and self._drained is not None:
            self._drained.set()
            self._drained = None

    async def _run_sender(self, sender: _QueueSender) -> None:
        key = (sender.topic, sender.queue, sender.movable)
        try:
            async with anyio.create_task_group() as tg:
                while True:
                    while not sender.acc.pending:
                        # woken by a new send or a finished batch; idle for long: retire
                        sender.wakeup = anyio.Event()
                        if not sender.idle:
                            await sender.wakeup.wait()
                            continue
                        with anyio.move_on_after(IDLE_EXIT):
                            await sender.wakeup.wait()
                        if sender.idle:
                            del self._senders[key]
                            return
                    while not sender.acc.ready(now := clock()):
                        sender.wakeup = anyio.Event()
                        with anyio.move_on_after(sender.acc.deadline - now):
                            await sender.wakeup.wait()
                    await sender.slots.acquire()
                    batch = sender.acc.take()
                    if not batch:
                        sender.slots.release()
                        continue
                    tg.start_soon(self._ship, sender, batch)
        finally:
            sender.acc.fail_all(ClientClosedError("the producer closed before the message was sent"))

    async def _ship(self, sender: _QueueSender, sends: list[PendingSend]) -> None:
        try:
            msgs = [m for s in sends for m in s.messages]
            results = await self._deliver(sender.topic, sender.queue, sender.movable, msgs)
            i = 0
            for s in sends:
                s.resolve(results[i : i + len(s.messages)], None)
                i += len(s.messages)
        except Exception as exc:
            for s in sends:
                s.resolve(None, exc)
        finally:
            sender.slots.release()
            sender.wake()
            for s in sends:
                s.resolve(None, ClientClosedError("the producer closed before the ack"))

    def _sequence(self, topic: str, queue: int) -> _Sequence:
        seq = self._seqs.get((topic, queue))
        if seq is None:
            seq = self._seqs[(topic, queue)] = _Sequence(self.pid)
        return seq

    async def _deliver(
        self, topic: str, queue: int, movable: bool, msgs: list[Payload]
    ) -> list[SendResult]:
        routes = self._check_open()
        pid, seq = 0, -1
        if self.idempotent:
            state = self._sequence(topic, queue)
            pid, seq = state.pid, state.next_seq
            state.next_seq += 1
        born = int(time.time() * 1000)
        batch = encode_batch(topic, queue, msgs, pid=pid, seq=seq, born_ms=born)
        failed_groups: set[str] = set()
        attempt = redirects = sent = 0
        uncertain = False  # an attempt may have been stored: a later refusal cannot undo it
        while True:
            group: str | None = None
            addr: str | None = None
            try:
                group = await routes.group_of(topic, queue)
                addr = routes.target(group)
                if addr is None:
                    raise RequestError(
                        Code.NOT_LEADER, f"no known replica of group {group}", transient=True
                    )
                if self.on_attempt is not None:
                    sent += 1
                    self.on_attempt(SendAttempt(topic, queue, group, addr, sent, msgs))
                fields = await self._post(addr, group, batch)
                return self._results(topic, queue, group, batch, fields)
            except RequestError as exc:
                uncertain = uncertain or may_have_applied(exc)
                if not is_retriable(exc):
                    self._abandon(topic, queue)
                    if uncertain:
                        raise give_up(exc, f"send to {topic} queue {queue}",
                                      uncertain=True) from exc
                    raise
                if group is not None and addr is not None:
                    if routes.on_error(group, addr, exc) and redirects < 5:
                        redirects += 1
                        continue
                if group is not None:
                    failed_groups.add(group)
                    now = clock()
                    if self._faults.get(group, 0.0) <= now:
                        # retries of batches already in flight must not extend the window,
                        # or a group stays avoided long after its new leader is serving
                        self._faults[group] = now + FAULT_WINDOW
                attempt += 1
                if attempt > self.retries:
                    self._abandon(topic, queue)
                    raise give_up(exc, f"send to {topic} queue {queue}",
                                  uncertain=uncertain) from exc
                log.debug("send to %s queue %d failed (%s); retry %d", topic, queue, exc, attempt)
                await routes.wait_backoff(group, backoff_delay(attempt))  # a new leader ends it
                if movable:
                    new_queue = await self._other_queue(topic, queue, failed_groups)
                    if new_queue != queue:
                        queue = new_queue
                        batch = encode_batch(topic, queue, msgs, born_ms=born)

    async def _post(self, addr: str, group: str, batch: EncodedBatch) -> dict[str, Any]:
        """Send `batch` to `group` at `addr` in the next PRODUCE request there, and
        return its outcome's fields (base, n, index, dup), or raise its own error."""
        assert self._tg is not None
        key = (addr, group)
        box = self._outboxes.get(key)
        if box is None:
            box = self._outboxes[key] = _Outbox()
            self._tg.start_soon(self._run_outbox, key, box)
        wait = _BatchWait(batch)
        box.pending.append(wait)
        box.wakeup.set()
        await wait.event.wait()
        if wait.error is not None:
            raise wait.error
        assert wait.fields is not None
        return wait.fields

    async def _run_outbox(self, key: tuple[str, str], box: _Outbox) -> None:
        try:
            async with anyio.create_task_group() as tg:
                while True:
                    if not box.pending:
                        box.wakeup = anyio.Event()
                        with anyio.move_on_after(IDLE_EXIT):
                            await box.wakeup.wait()
                        if box.idle:
                            del self._outboxes[key]
                            return
                        continue
                    await box.slots.acquire()
                    await anyio.lowlevel.checkpoint()  # batches of this turn go along
                    if not box.pending:
                        box.slots.release()
                        continue
                    tg.start_soon(self._send_request, key, box, box.take())
        finally:
            error = ClientClosedError("the producer closed before the batch was sent")
            while box.pending:
                box.pending.popleft().settle(None, error)

    async def _send_request(self, key: tuple[str, str], box: _Outbox,
                            waits: list[_BatchWait]) -> None:
        """One PRODUCE request for `waits`: the single-batch form for one batch (which
        older nodes also take), else the multi-batch form; every batch gets its own
        outcome, and a failure of the request as a whole becomes each batch's."""
        addr, group = key
        routes = self._check_open()
        try:
            if len(waits) == 1:
                frame = await routes.pool.request(
                    addr, Op.PRODUCE, {"g": group}, waits[0].batch, timeout=self.send_timeout)
                waits[0].settle(frame.header, None)
                return
            batches = [w.batch for w in waits]
            frame = await routes.pool.request(
                addr, Op.PRODUCE, {"g": group, "sizes": [len(b) for b in batches]},
                b"".join(batches), timeout=self.send_timeout)
            outcomes = frame.header.get("results")
            if not isinstance(outcomes, list) or len(outcomes) != len(waits):
                raise RequestError(Code.MALFORMED, f"bad PRODUCE answer {frame.header!r}")
            for w, outcome in zip(waits, outcomes, strict=True):
                try:
                    w.settle(decode_outcome(outcome), None)
                except RequestError as exc:
                    w.settle(None, exc)
        except Exception as exc:
            for w in waits:
                w.settle(None, exc)
        finally:
            box.slots.release()
            box.wakeup.set()
            error = ClientClosedError("the producer closed before the ack")
            for w in waits:
                w.settle(None, error)

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
        self, topic: str, queue: int, group: str, batch: EncodedBatch, h: dict[str, Any]
    ) -> list[SendResult]:
        try:
            base, n, index = int(h["base"]), int(h["n"]), int(h["index"])
            shift = int(h.get("shift", 0))
        except (KeyError, TypeError, ValueError):
            raise RequestError(Code.MALFORMED, f"bad PRODUCE answer {h!r}") from None
        dup = bool(h.get("dup", False))
        ids = batch_message_ids(group, index, batch, shift)
        if n != len(ids):
            raise RequestError(Code.MALFORMED, f"PRODUCE stored {n} of {len(ids)} messages")
        if base < 0:
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
