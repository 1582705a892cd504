"""The simple consumer: receive messages, settle each one (RocketMQ 5's SimpleConsumer,
Kafka's share groups).

Several simple consumers of one group may read the same queues at once: there is no
assignment and no rebalance. A `receive` hands out messages nobody in the group holds;
each stays invisible to the group's other receives for the invisible time, and the
consumer settles it: `ack` (done), `nack` (visible again after a delay or the group's
backoff), `change_invisible` (more time) or `dead_letter` (poison: to `%DLQ%<group>` at
once). One that is not settled in time is delivered again, with its delivery count up
by one; after `max_deliveries` deliveries it goes to the dead letters instead.

The state behind it (what is in flight, delivery counts, the handle of each delivery) is
replicated through the queue's Raft log (`broker.state.parts.receipts`): at-least-once,
with a delivery count that survives failover. A receipt names one delivery; once the
message was delivered again, that receipt's ack is refused (`StaleReceiptError`) and is
never applied to the newer delivery.

Acks of one queue made within `ack_linger` seconds of each other go in one request; each
`ack` returns once its ack is committed.

Filters: `receive(topic, selector=MessageSelector.by_sql(...))` (or `subscriptions=` at
construction; a tag subscription works too) makes the node hand out only the messages the
selector matches; the others are passed for the consumer group for good, as a FETCH
advances past them. A consumer group's consumers should use one selector per topic: the
messages one of them passes are passed for all.

FIFO message groups: messages sent with a `message_group` (the `__SHARDINGKEY` property)
are handed out one at a time per group, in the order they were stored in their queue:
the next one of a group only once the one before was acked or dead-lettered (a nack or an
expired invisible time delivers the same one again first). Different groups, and messages
without one, go out in parallel to the group's consumers (`ReceivedMessage.message_group`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import anyio
import anyio.abc

from transport.connection import ConnectionPool
from wire.protocol import Code, Op, RequestError, validate_group_name, validate_topic_name
from wire.records import (
    MESSAGE_GROUP_PROPERTY,
    Message,
    decode_record,
    iter_records,
    message_id,
)
from wire.requests import (
    AckAnswer,
    AckRequest,
    ChangeInvisibleRequest,
    NackAnswer,
    NackRequest,
    ReceiveAnswer,
    ReceiveRequest,
    SendBackAnswer,
    SendBackRequest,
)

from .errors import ClientClosedError, OutcomeUnknownError, StaleReceiptError
from .groupclient import ClientBase, checked_client_id
from .reads import FETCH_GRACE, MessageSelector, Selector, selector_of
from .trace import Tracer

__all__ = ["DEFAULT_BACKOFF", "Receipt", "ReceivedMessage", "SimpleConsumer"]

log = logging.getLogger("raftmq.client.simple")

DEFAULT_BACKOFF: tuple[float, ...] = (10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540,
                                      600, 1200, 1800, 3600, 7200)
"""Seconds a nacked message waits, by how many times it was delivered (the last repeats):
RocketMQ's retry levels."""
ACK_LINGER = 0.002  # seconds acks of one queue wait for company before they go


@dataclass(frozen=True, slots=True)
class Receipt:
    """One delivery of one message: what `ack`, `nack` and `change_invisible` send back.
    `group` is the broker group holding the queue, `handle` the delivery's."""

    group: str
    consumer_group: str
    topic: str
    queue: int
    offset: int
    handle: int


@dataclass(frozen=True, slots=True)
class ReceivedMessage(Message):
    """A message as a simple consumer receives it: `deliveries` (1 the first time) and
    the `receipt` of this delivery."""

    deliveries: int
    receipt: Receipt

    @property
    def message_group(self) -> str | None:
        """The message's FIFO message group, None when it was sent without one."""
        return self.properties.get(MESSAGE_GROUP_PROPERTY)


def _seconds_ms(name: str, seconds: float) -> int:
    if not seconds >= 0:
        raise ValueError(f"{name} must be >= 0 seconds, got {seconds!r}")
    return int(round(seconds * 1000))


class _Waiter:
    __slots__ = ("done", "error", "item")

    def __init__(self, item: tuple[int, int]) -> None:
        self.item = item
        self.done = anyio.Event()
        self.error: BaseException | None = None


class SimpleConsumer(ClientBase):
    """Receives and settles messages one by one; use as `async with`.

    `invisible` (seconds a received message stays invisible to the group, 30 s),
    `max_deliveries` (16), `backoff` (seconds by delivery count, RocketMQ's by default)
    and `inflight_cap` (the group's messages in flight per queue, 4096) are this
    consumer's settings for its group: they travel with each request, so every consumer
    of a group should use the same. `wait` is how long a `receive` waits for a message
    when there is none (15 s). `subscriptions` maps topics to a selector (tags, or a
    `MessageSelector`): only matching messages are handed out (see the module's
    docstring); `receive(..., selector=...)` sets a topic's too."""

    def __init__(
        self,
        namesrv: Sequence[str] | str,
        group: str,
        *,
        invisible: float = 30.0,
        wait: float = 15.0,
        max_deliveries: int = 16,
        backoff: Sequence[float] = DEFAULT_BACKOFF,
        inflight_cap: int = 4096,
        timeout: float = 3.0,
        pool: ConnectionPool | None = None,
        client_id: str | None = None,
        ack_linger: float = ACK_LINGER,
        subscriptions: dict[str, Selector] | None = None,
        trace: bool = False,
    ) -> None:
        super().__init__(namesrv, pool, timeout)
        self._selectors: dict[str, MessageSelector] = {
            validate_topic_name(t): selector_of(sel) for t, sel in (subscriptions or {}).items()}
        self.group = validate_group_name(group)
        self.client_id = checked_client_id(client_id)
        if trace:
            self.tracer = Tracer("consumer", self.client_id, self.group)
        self.invisible_ms = _seconds_ms("invisible", invisible)
        self.wait_ms = _seconds_ms("wait", wait)
        if not 1 <= max_deliveries:
            raise ValueError("max_deliveries must be at least 1")
        self.max_deliveries = max_deliveries
        if not backoff:
            raise ValueError("backoff needs at least one step")
        self.backoff_ms = tuple(_seconds_ms("a backoff step", b) for b in backoff)
        self.inflight_cap = inflight_cap
        self.ack_linger = ack_linger
        self._cursor: dict[str, int] = {}  # topic -> the queue the next sweep starts at
        # long polls that outlived the receive that started them: what they got waits here
        self._buffered: dict[str, list[ReceivedMessage]] = {}
        self._polling: dict[str, set[int]] = {}
        self._wanted: dict[str, float] = {}  # topic -> polls go on until this time
        self._waiting: dict[str, int] = {}  # topic -> receives waiting on its polls
        self._arrived: dict[str, anyio.Event] = {}
        self._acks: dict[tuple[str, int], list[_Waiter]] = {}

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._close(exc_type, exc, tb)

    # ------------------------------------------------------------------ receive

    async def receive(self, topic: str, max: int = 32, *, invisible: float | None = None,
                      wait: float | None = None, selector: Selector | None = None
                      ) -> list[ReceivedMessage]:
        """Up to `max` messages of `topic`'s queues that no consumer of the group holds,
        each invisible to the group for `invisible` seconds (the consumer's by default).
        Waits up to `wait` seconds for one when there is none; [] when none came.
        `selector` (tags or a `MessageSelector`) becomes the topic's filter from now on
        (ValueError or FilterError when bad, before anything is sent)."""
        got = await self._receive(topic, max, invisible, wait, selector)
        if self.tracer is not None:
            self.tracer.delivered(got)
        return got

    async def _receive(self, topic: str, max: int, invisible: float | None,
                       wait: float | None, selector: Selector | None) -> list[ReceivedMessage]:
        validate_topic_name(topic)
        if selector is not None:
            self._selectors[topic] = selector_of(selector)
        if not 1 <= max <= 1024:
            raise ValueError("max must be 1..1024")
        invisible_ms = self.invisible_ms if invisible is None else _seconds_ms(
            "invisible", invisible)
        wait_ms = self.wait_ms if wait is None else _seconds_ms("wait", wait)
        got = self._take(topic, max)
        if got:
            return got
        route = await self.routes.route(topic)
        queues = list(range(route.total))
        start = self._cursor.get(topic, 0) % len(queues) if queues else 0
        order = queues[start:] + queues[:start]
        self._cursor[topic] = start + 1
        for q in order:  # a sweep that waits nowhere
            if len(got) >= max:
                break
            got += await self._receive_one(topic, q, max - len(got), invisible_ms, 0)
        if got or wait_ms == 0:
            return got
        # nothing anywhere: long polls on every queue until the wait is over; what they
        # bring is kept for the next receives when more than `max` came
        deadline = anyio.current_time() + wait_ms / 1000
        before = self._wanted.get(topic, deadline)
        self._wanted[topic] = before if before > deadline else deadline
        self._waiting[topic] = self._waiting.get(topic, 0) + 1
        try:
            arrived = self._arrived.setdefault(topic, anyio.Event())
            assert self._tg is not None
            polling = self._polling.setdefault(topic, set())
            for q in order:
                if q not in polling:  # (one still running polls on till the new deadline)
                    polling.add(q)
                    self._tg.start_soon(self._poll, topic, q, max, invisible_ms)
            with anyio.move_on_at(deadline):
                await arrived.wait()
        finally:
            self._waiting[topic] -= 1
            if not self._waiting[topic]:  # nobody waits: the polls ask no more
                self._wanted[topic] = anyio.current_time()
        return self._take(topic, max)

    def _take(self, topic: str, max: int) -> list[ReceivedMessage]:
        held = self._buffered.get(topic)
        if not held:
            return []
        out, self._buffered[topic] = held[:max], held[max:]
        return out

    async def _poll(self, topic: str, queue: int, max: int, invisible_ms: int) -> None:
        """Long-poll one queue until a receive of the topic is no longer waiting (its
        `_wanted` time) or messages came; a later receive that waits longer extends it."""
        try:
            while True:
                left = self._wanted.get(topic, 0.0) - anyio.current_time()
                if left < 0.001:
                    return
                try:
                    got = await self._receive_one(topic, queue, max, invisible_ms,
                                                  int(left * 1000))
                except RequestError as exc:
                    log.debug("receive from %s/%d failed: %s", topic, queue, exc)
                    await anyio.sleep(min(0.1, left))
                    continue
                if got:
                    self._buffered.setdefault(topic, []).extend(got)
                    self._arrived.pop(topic, anyio.Event()).set()
                    return
        finally:
            self._polling[topic].discard(queue)

    async def receive_retries(self, topic: str, queue: int, max: int = 32, *,
                              invisible: float | None = None, wait: float = 0.0
                              ) -> list[ReceivedMessage]:
        """Up to `max` messages of one queue that were sent back (`send_back`) and are due
        again, never new ones: how a push consumer, which reads new messages by offset,
        gets its retries. Settle them as any received message."""
        validate_topic_name(topic)
        if not 1 <= max <= 1024:
            raise ValueError("max must be 1..1024")
        invisible_ms = self.invisible_ms if invisible is None else _seconds_ms(
            "invisible", invisible)
        return await self._receive_one(topic, queue, max, invisible_ms,
                                       _seconds_ms("wait", wait), retries=True)

    async def send_back(self, msg: Message, *, error: str = "", dead: bool = False) -> bool:
        """Hand a message read by offset (a push consumer's) whose handling failed to the
        group's broker-side retries: it is delivered again (`receive_retries`) after the
        first backoff step, counting deliveries, and goes to the dead letters after
        `max_deliveries`, or at once with `dead` (poison). Returns whether it went to the
        dead letters now. A retry of the request is applied once."""
        rid = self.routes.request_id()
        _, frame = await self.routes.call_queue(
            msg.topic, msg.queue, Op.SEND_BACK,
            lambda g: SendBackRequest(cg=self.group, topic=msg.topic, queue=msg.queue, g=g,
                                      offset=msg.offset, backoff_ms=self.backoff_ms,
                                      max_deliveries=self.max_deliveries, error=error[:1024],
                                      dead=dead, req=rid).header(), write=True)
        return SendBackAnswer.decode(frame.header).dead

    async def _receive_one(self, topic: str, queue: int, max: int, invisible_ms: int,
                           wait_ms: int, *, retries: bool = False) -> list[ReceivedMessage]:
        sel = None if retries else self._selectors.get(topic)
        req = ReceiveRequest(cg=self.group, topic=topic, queue=queue, max=max,
                             invisible_ms=invisible_ms, wait_ms=wait_ms,
                             max_deliveries=self.max_deliveries, cap=self.inflight_cap,
                             client=self.client_id, retries=retries,
                             tags=tuple(sel.tags or ()) if sel is not None else (),
                             sql=sel.sql if sel is not None else None)
        header = req.header()
        group, frame = await self.routes.call_queue(
            topic, queue, Op.RECEIVE, lambda g: {**header, "g": g},
            timeout=wait_ms / 1000 + FETCH_GRACE)
        answer = ReceiveAnswer.decode(frame.header)
        return self._messages(topic, queue, answer.g or group, answer, frame.body)

    def _messages(self, topic: str, queue: int, group: str, answer: ReceiveAnswer,
                  body: bytes) -> list[ReceivedMessage]:
        spans = list(iter_records(body))
        if len(spans) != len(answer.msgs):
            raise RequestError(Code.MALFORMED, f"RECEIVE answer lists {len(answer.msgs)} "
                               f"messages but carries {len(spans)}")
        out = []
        for (offset, index, start, store_ms, deliveries, handle), (pos, _size) in zip(
                answer.msgs, spans, strict=True):
            m, _ = decode_record(body, pos, topic=topic, queue=queue, offset=offset,
                                 store_ms=store_ms, msg_id=message_id(group, index, start))
            out.append(ReceivedMessage(
                m.topic, m.queue, m.offset, m.body, m.key, m.tags, m.properties, m.born_ms,
                m.store_ms, m.msg_id, deliveries,
                Receipt(group, self.group, topic, queue, offset, handle)))
        return out

    # ------------------------------------------------------------------ settle

    def _receipt(self, msg: ReceivedMessage | Receipt) -> Receipt:
        r = msg if isinstance(msg, Receipt) else msg.receipt
        if r.consumer_group != self.group:
            raise ValueError(f"a receipt of consumer group {r.consumer_group!r}, not "
                             f"{self.group!r}")
        return r

    async def ack(self, msg: ReceivedMessage | Receipt) -> None:
        """Done with this delivery: the message is never delivered to the group again.
        Returns once the ack is committed; `StaleReceiptError` when the delivery is no
        longer current (the message was delivered again since, or settled already)."""
        r = self._receipt(msg)
        key = (r.topic, r.queue)
        waiter = _Waiter((r.offset, r.handle))
        pending = self._acks.get(key)
        if pending is None:
            pending = self._acks[key] = []
            assert self._tg is not None
            self._tg.start_soon(self._send_acks, key)
        pending.append(waiter)
        await waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error
        if self.tracer is not None:
            self.tracer.acked(r.group, r.topic, r.queue, r.offset)

    async def _send_acks(self, key: tuple[str, int]) -> None:
        await anyio.sleep(self.ack_linger)
        batch = self._acks.pop(key)
        topic, queue = key
        try:
            for i in range(0, len(batch), 1024):
                await self._ack_batch(topic, queue, batch[i:i + 1024])
        except BaseException:
            for w in batch:  # the consumer closed under them
                if not w.done.is_set():
                    w.error = ClientClosedError("the simple consumer closed before the ack "
                                                "was answered; it may have been applied")
                    w.done.set()
            raise

    async def _ack_batch(self, topic: str, queue: int, batch: list[_Waiter]) -> None:
        items = tuple(w.item for w in batch)
        rid = self.routes.request_id()  # one id for every attempt: applied once
        try:
            _, frame = await self.routes.call_queue(
                topic, queue, Op.ACK,
                lambda g: AckRequest(cg=self.group, topic=topic, queue=queue, g=g,
                                     items=items, req=rid).header(), write=True)
            answer = AckAnswer.decode(frame.header)
        except RequestError as exc:
            for w in batch:
                w.error = exc
                w.done.set()
            return
        stale = set(answer.stale)
        unknown = answer.dup and answer.skipped and answer.acked
        for w in batch:
            if unknown:
                w.error = OutcomeUnknownError(
                    f"the ack of {topic}/{queue} offset {w.item[0]} was sent again after no "
                    f"answer came; its first copy acked {answer.acked} of {len(items)} and "
                    "found the others stale, which is not known")
            elif w.item in stale or (answer.dup and not answer.acked):
                w.error = _stale(topic, queue, w.item)
            w.done.set()

    async def nack(self, msg: ReceivedMessage | Receipt, *, delay: float | None = None,
                   error: str | None = None) -> None:
        """Failed: the message is delivered again after `delay` seconds, or after the
        backoff step of its delivery count; once delivered `max_deliveries` times it goes
        to the dead letters instead, with `error` as its last error."""
        await self._nack(self._receipt(msg), delay, error or "", dead=False)

    async def dead_letter(self, msg: ReceivedMessage | Receipt, error: str) -> None:
        """A message known to be poison: to the group's dead letters now, with `error`."""
        await self._nack(self._receipt(msg), None, error, dead=True)

    async def _nack(self, r: Receipt, delay: float | None, error: str, *, dead: bool) -> None:
        delay_ms = None if delay is None else _seconds_ms("delay", delay)
        rid = self.routes.request_id()
        _, frame = await self.routes.call_queue(
            r.topic, r.queue, Op.NACK,
            lambda g: NackRequest(cg=self.group, topic=r.topic, queue=r.queue, g=g,
                                  items=((r.offset, r.handle),), delay_ms=delay_ms,
                                  backoff_ms=self.backoff_ms,
                                  max_deliveries=self.max_deliveries, error=error,
                                  dead=dead, req=rid).header(), write=True)
        answer = NackAnswer.decode(frame.header)
        if answer.stale or (answer.dup and answer.skipped):
            raise _stale(r.topic, r.queue, (r.offset, r.handle))

    async def change_invisible(self, msg: ReceivedMessage | Receipt, seconds: float) -> None:
        """Keep this delivery invisible for `seconds` from now (more time to finish it);
        `StaleReceiptError` when it is no longer current."""
        r = self._receipt(msg)
        invisible_ms = _seconds_ms("seconds", seconds)
        await self.routes.call_queue(
            r.topic, r.queue, Op.CHANGE_INVISIBLE,
            lambda g: ChangeInvisibleRequest(cg=self.group, topic=r.topic, queue=r.queue,
                                             g=g, offset=r.offset, handle=r.handle,
                                             invisible_ms=invisible_ms).header())


def _stale(topic: str, queue: int, item: tuple[int, int]) -> StaleReceiptError:
    return StaleReceiptError(
        f"the delivery {item[1]} of {topic}/{queue} offset {item[0]} is no longer current: "
        "the message was delivered again (its invisible time ran out), or acked or "
        "dead-lettered already")

