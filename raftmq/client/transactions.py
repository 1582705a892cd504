"""Transactions from the producer's side, in both models raftmq serves.

Kafka's model (`Producer(transactional_id=...)`): the producer registers its
transactional id with the coordinator group (`wire.txn.coordinator_group`, a hash of
the id over the cluster's groups) and gets an epoch; a later producer with the same id
gets a higher one, which fences this one. Each transaction is numbered within the epoch
(0, 1, 2, ...), and (id, epoch, number) names it exactly. With its first send to a
group the producer tells the coordinator that the group takes part (TX_ADD, beside the
send; TX_END names every group sent to as well, so none is left out); its
batches carry the transaction in their header (they are idempotent like any batch of an
idempotent producer) and stay invisible until the decision; `send_offsets` stores
consumer offsets that apply only with the commit. `commit` waits for every send's
acknowledgement, then asks the coordinator to decide (TX_END): that entry in the
coordinator's log is the commit point, and the coordinator then has each group make
the transaction's records visible.

RocketMQ's model (`Producer(producer_group=..., check_listener=...)`): a half message
is stored invisible (PRODUCE with a `half` header naming a fresh txid); the producer
runs its local transaction and then commits or rolls the half message back (HALF_END).
When it never says, the broker asks a live member of the producer group
(PRODUCER_HEARTBEAT registers one; TX_CHECK is the broker's question, answered by the
`check_listener`) until it gets an answer or gives up and rolls back.
"""

from __future__ import annotations

import enum
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Literal, NoReturn

import anyio

from transport.connection import is_retriable
from wire.protocol import Code, Frame, Op, RequestError, validate_group_name, validate_topic_name
from wire.records import OutgoingMessage, encode_batch
from wire.requests.base import WireType
from wire.requests.transactions import (
    HalfEndAnswer,
    HalfEndRequest,
    ProducerHeartbeatRequest,
    TxAddRequest,
    TxCheckAnswer,
    TxCheckRequest,
    TxEndAnswer,
    TxEndRequest,
    TxInitAnswer,
    TxInitRequest,
    TxOffsetsRequest,
)
from wire.txn import coordinator_group

from .delays import NO_DUE, Due, due_fields
from .errors import (
    OutcomeUnknownError,
    ProducerFencedError,
    TransactionAbortedError,
    TransactionError,
    as_sdk_error,
)
from .producer import (
    Producer,
    SendFuture,
    SendResult,
    _stored_fields,
    as_payload,
    batch_message_ids,
    check_message,
    make_message,
    new_producer_id,
)
from .routes import TopicRoute, backoff_delay, clock, node_addresses

__all__ = [
    "HEARTBEAT_INTERVAL",
    "HEARTBEAT_TTL_MS",
    "CheckListener",
    "CheckRequest",
    "HalfHandle",
    "HalfMessages",
    "LocalTransaction",
    "Transaction",
    "TransactionalSends",
    "TransactionResult",
    "Verdict",
    "decide",
    "verdict",
]

log = logging.getLogger("raftmq.client.transactions")

Verdict = Literal["commit", "rollback", "unknown"]
VERDICTS: tuple[str, ...] = ("commit", "rollback", "unknown")

HEARTBEAT_INTERVAL = 10.0  # seconds between PRODUCER_HEARTBEATs to every node
HEARTBEAT_TTL_MS = 30_000  # a member not heard from for this long is not asked
BUSY_PATIENCE = 30.0  # seconds a coordinator request is retried while it answers BUSY
#                     (the previous transaction of the id is still completing)
MAX_TID = 255
TX_ATTEMPTS = 8
"""Tries of a transaction request (TX_INIT/ADD/OFFSETS/END, HALF_END) before giving up:
more than other requests' 4, so one outlasts a group's election after its leader died
(the backoff grows to 1 s); a redirect to a newer leader is not a try."""
HALF_LANES = 8
"""Half messages one producer has in flight to one queue at most: each lane is a producer
id of its own whose halves go one at a time (idempotent, so a retry is never stored
twice), and a queue's lanes go side by side."""


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """The broker asks whether a half message's local transaction committed."""

    txid: str
    topic: str
    queue: int
    msg_id: str | None
    group: str
    producer_group: str
    checks: int


CheckListener = Callable[[CheckRequest], Any]
"""`fn(CheckRequest) -> "commit" | "rollback" | "unknown"`, plain or async."""

LocalTransaction = Callable[[OutgoingMessage], Any]
"""`fn(message) -> "commit" | "rollback" | "unknown"`, plain or async: the caller's local
transaction, run after the half message is stored."""


@dataclass(frozen=True, slots=True)
class TransactionResult:
    """What `send_in_transaction` did: the half message stored (`send`), its txid, and the
    state it was left in: "commit"/"rollback" (decided by the producer) or "unknown"
    (left to the broker's check-back: the local transaction said so, raised — `error` —
    or the decision could not be delivered)."""

    send: SendResult
    txid: str
    state: Verdict
    error: BaseException | None = None


_VERDICT_NAMES: dict[str, Verdict] = {
    "commit": "commit", "rollback": "rollback", "unknown": "unknown",
    # RocketMQ's LocalTransactionState names, as users coming from it return them
    "commit_message": "commit", "rollback_message": "rollback", "unknow": "unknown",
}


def verdict(value: object) -> Verdict | None:
    """A listener's answer as one of the three verdicts: "commit", "rollback" or
    "unknown" in any case (or RocketMQ's COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW), an
    enum member whose value or name is one of those, or None ("unknown": the listener
    does not know yet). None for anything else (True, 1, ...): not an answer."""
    if value is None:
        return "unknown"
    if isinstance(value, enum.Enum):
        for v in (value.value, value.name):
            if isinstance(v, str) and v.lower() in _VERDICT_NAMES:
                return _VERDICT_NAMES[v.lower()]
        return None
    if isinstance(value, str):
        return _VERDICT_NAMES.get(value.strip().lower())
    return None


async def decide(fn: Callable[[Any], Any], arg: Any,
                 what: str) -> tuple[Verdict, BaseException | None]:
    """Run a listener (async, or plain in a worker thread so it may block on its
    database) and return its verdict; one that raises says "unknown" (and why)."""
    try:
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
                type(fn).__call__):
            value = await fn(arg)
        else:
            value = await anyio.to_thread.run_sync(fn, arg)
            if inspect.isawaitable(value):
                value = await value
    except Exception as exc:
        log.warning("%s raised %r: the answer is 'unknown'", what, exc)
        return "unknown", exc
    answer = verdict(value)
    if answer is None:  # a bug in the listener: said every time, loudly
        log.error("%s answered %r, which is not a verdict: return 'commit', 'rollback' or "
                  "'unknown'; taken as 'unknown' (the broker asks again)", what, value)
        return "unknown", TypeError(f"{what} answered {value!r}, not a verdict")
    return answer, None


def _check_tid(tid: str) -> str:
    if not isinstance(tid, str) or not tid or len(tid) > MAX_TID or not tid.isprintable():
        raise ValueError(f"a transactional id is 1..{MAX_TID} printable characters, not {tid!r}")
    return tid


# ---------------------------------------------------------------- Kafka's model


class TransactionalSends:
    """A producer's transactional id: its epoch and transaction number, the open
    transaction, and the requests to the coordinator. Made by `Producer` when given a
    `transactional_id`; used through `Producer.begin` / `Producer.transaction`."""

    def __init__(self, producer: Producer, tid: str, timeout_ms: int) -> None:
        if not isinstance(timeout_ms, int) or timeout_ms < 1:
            raise ValueError("transaction_timeout_ms is a positive number of milliseconds")
        self.producer = producer
        self.sender = producer.send_path
        self.tid = _check_tid(tid)
        self.timeout_ms = timeout_ms
        self.epoch = -1  # not registered yet (or again: a failure left its state unsure)
        self.n = 0  # the next transaction's number within the epoch
        self.fenced: ProducerFencedError | None = None
        self.current: Transaction | None = None
        self._coordinator: str | None = None
        self._lock = anyio.Lock()

    def check_usable(self) -> None:
        if self.fenced is not None:
            raise ProducerFencedError(
                f"transactional id {self.tid!r} was taken over by a newer producer: this one "
                f"is fenced and can no longer begin, send or commit ({self.fenced.message})")

    def failed(self, exc: RequestError) -> RequestError:
        """Map a refusal to the SDK's type, and remember a fencing for good."""
        err = as_sdk_error(exc)
        if isinstance(err, ProducerFencedError):
            self.fenced = self.fenced or err
        elif exc.code == Code.TX_UNKNOWN:
            # the coordinator does not know this epoch or transaction (the id expired
            # after the cluster's tx_id_expiration_ms idle): register again before the
            # next transaction, which gets a new epoch
            self.epoch = -1
        return err

    def reraise(self, exc: RequestError) -> NoReturn:
        """Raise `exc` as `failed` shapes it: itself when it has the SDK's type already
        (as errors from routed calls and sends do), never chained to itself."""
        err = self.failed(exc)
        if err is exc:
            raise exc
        raise err from exc

    async def coordinator(self, refresh: bool = False) -> str:
        if self._coordinator is None or refresh:
            cluster = await self.sender.routes().cluster()
            groups = sorted(str(g) for g in cluster.get("groups") or {})
            if not groups:
                raise RequestError(Code.UNKNOWN_GROUP, "the name servers know no live group")
            self._coordinator = coordinator_group(self.tid, groups)
        return self._coordinator

    async def call(self, request: Callable[[str], WireType], *, write: bool = True) -> Frame:
        """The request `request(group)` builds for the coordinator group (TX_INIT, TX_ADD,
        TX_END); when the group asked says it is not the
        coordinator (the cluster's groups changed), once more to the one it names. The
        producer's `delivery_timeout` bounds the whole call, retries and waits included
        (past it: `OutcomeUnknownError` for a change, `UnavailableError` for a read)."""
        routes = self.sender.routes()
        deadline = clock() + self.producer.delivery_timeout
        g = await self.coordinator()
        redirected = False
        busy_until = time.monotonic() + BUSY_PATIENCE
        while True:
            try:
                req = request(g)
                return await routes.call_group(g, req.OP, req.header(),
                                               write=write, timeout=self.producer.send_timeout,
                                               attempts=TX_ATTEMPTS, deadline=deadline)
            except RequestError as exc:
                if exc.code == Code.NOT_COORDINATOR and not redirected:
                    redirected = True
                    hint = exc.extra.get("coordinator")
                    g = self._coordinator = (hint if isinstance(hint, str) and hint
                                             else await self.coordinator(refresh=True))
                    continue
                if exc.code == Code.BUSY and time.monotonic() < busy_until:
                    # the previous transaction's markers are still going out
                    await anyio.sleep(0.05)
                    continue
                self.reraise(exc)

    async def init(self) -> None:
        """Register the transactional id (TX_INIT): a new epoch, which fences any older
        producer of the id and aborts its open transaction. Retried while that abort is
        still going out (BUSY)."""
        frame = await self.call(lambda g: TxInitRequest(g=g, tid=self.tid,
                                                        timeout_ms=self.timeout_ms))
        epoch = TxInitAnswer.decode(frame.header).epoch
        self.epoch, self.n = epoch, 0
        self.sender.stamp(None)

    async def begin(self) -> Transaction:
        self.sender.routes()
        self.check_usable()
        async with self._lock:
            if self.current is not None and self.current.state in ("open", "committing",
                                                                   "aborting"):
                raise TransactionError(Code.MALFORMED, "a transaction is already open on "
                                       "this producer: commit or abort it first")
            if self.epoch < 0:
                await self.init()
            tx = Transaction(self, self.epoch, self.n)
            self.current = tx
            self.sender.stamp((self.tid, self.epoch, self.n))
            return tx

    async def close(self) -> None:
        """The producer closes: a transaction still open is aborted (best effort: the
        coordinator aborts it at its timeout otherwise)."""
        tx = self.current
        if tx is None or tx.state != "open" or self.fenced is not None:
            return
        with anyio.move_on_after(self.producer.send_timeout * 2) as scope:
            scope.shield = True
            try:
                await tx.abort()
            except Exception as exc:
                if isinstance(exc, RequestError) and exc.code == Code.TX_FENCED:
                    return  # a newer producer took the id over and aborted it already
                log.warning("aborting transaction %d of %r on close failed: %s",
                            tx.n, self.tid, exc)

    def fenced_ends(self, tx: Transaction, failure: BaseException | None) -> None:
        """A fenced producer's transaction ends with the fencing, whatever else failed."""
        if self.fenced is not None:
            tx.state = "aborted"
            self.finished(tx, started=True, sure=True)
            raise self.fenced from failure

    def finished(self, tx: Transaction, *, started: bool, sure: bool) -> None:
        """`tx` is over: the next one takes the next number if this one reached the
        coordinator; when its outcome is not known the id is registered again first."""
        if self.current is tx:
            self.current = None
            self.sender.stamp(None)
        if not sure:
            self.epoch = -1
        elif started and tx.epoch == self.epoch:
            self.n = tx.n + 1


TxState = Literal["open", "committing", "aborting", "committed", "aborted", "unknown"]
"""`unknown`: the decision request failed without an answer (`OutcomeUnknownError`); the
coordinator may have taken it. The producer registers again before its next one, which
aborts this one if it is still open."""


class Transaction:
    """One transaction (Kafka's model); from `Producer.begin()` or
    `async with producer.transaction() as tx`. Sends and offsets join it; `commit` makes
    them visible together, `abort` drops them."""

    def __init__(self, owner: TransactionalSends, epoch: int, n: int) -> None:
        self.owner = owner
        self.producer = owner.producer
        self.sender = owner.sender
        self.tid = owner.tid
        self.epoch = epoch
        self.n = n
        self.state: TxState = "open"
        self.groups: set[str] = set()  # participants the coordinator knows of
        self.joined: set[str] = set()  # every group this transaction sent (or will send) to
        self._adding: dict[str, anyio.Event] = {}
        self._wanted: list[str] = []  # groups waiting for the next TX_ADD
        self._adder = False  # a task is sending TX_ADDs for the waiting groups
        self._added_any = False  # a TX_ADD was sent: the coordinator may know this one
        self._futures: list[SendFuture[Any]] = []
        self._error: BaseException | None = None

    def __repr__(self) -> str:
        return f"Transaction({self.tid!r}, epoch={self.epoch}, n={self.n}, {self.state})"

    @property
    def id(self) -> tuple[str, int, int]:
        return self.tid, self.epoch, self.n

    def _check_open(self) -> None:
        self.owner.check_usable()
        if self.state != "open":
            raise TransactionError(
                Code.TX_DECIDED,
                f"transaction {self.n} of {self.tid!r} is {self.state}: begin a new one")

    async def _join(self, group: str, *, wait: bool = True) -> None:
        """Have the coordinator list `group` as a participant. Groups asked for at about
        the same time (sends started together) go in one TX_ADD: one entry in the
        coordinator's log. With `wait=False` (sends) the TX_ADD goes out beside the send
        instead of before it: `commit` waits for it, and TX_END names every group sent to
        anyway, so the decision reaches a group whose TX_ADD did not apply (data of a
        client that dies before TX_END is resolved by the group's orphan check)."""
        self.joined.add(group)
        self._added_any = True
        if not wait:
            if group not in self.groups and group not in self._adding:
                self._adding[group] = anyio.Event()
                self._wanted.append(group)
                if not self._adder:
                    self._adder = True
                    self.sender.spawn(self._add_in_background)
            return
        while group not in self.groups:
            event = self._adding.get(group)
            if event is None:
                event = self._adding[group] = anyio.Event()
                self._wanted.append(group)
                if not self._adder:
                    await self._add_wanted()
                    continue
            await event.wait()
            if group not in self.groups and self._error is not None:
                raise TransactionError(Code.TX_UNKNOWN, f"adding group {group} to the "
                                       f"transaction failed: {self._error}")

    async def _add_in_background(self) -> None:
        """`_add_wanted` beside the sends: a failure is kept for `commit` to see."""
        try:
            await self._add_wanted()
        except Exception:  # noqa: BLE001 - kept in self._error by _add_wanted
            pass

    async def _added(self) -> None:
        """Wait until no TX_ADD of this transaction is in flight."""
        while self._adding:
            await next(iter(self._adding.values())).wait()

    def _add_request(self, groups: tuple[str, ...], coordinator: str) -> TxAddRequest:
        return TxAddRequest(g=coordinator, tid=self.tid, epoch=self.epoch, n=self.n,
                            groups=groups)

    async def _add_wanted(self) -> None:
        """Send TX_ADD for every group waiting to join, until none is."""
        self._adder = True
        try:
            await anyio.sleep(0)  # let sends started together ask for their groups too
            while self._wanted:
                groups, self._wanted = sorted(set(self._wanted)), []
                try:
                    await self.owner.call(partial(self._add_request, tuple(groups)))
                    self.groups.update(groups)
                except BaseException as exc:
                    if isinstance(exc, Exception):
                        self._error = self._error or exc
                    raise
                finally:
                    for g in groups:
                        self._adding.pop(g).set()
        finally:
            self._adder = False
            for g in self._wanted:  # asked for while a failure ended this: asked again
                self._adding.pop(g).set()
            self._wanted = []

    async def _group_of(self, topic: str, queue: int) -> str:
        """The group of a queue the cached route does not place (a registration gap:
        asked again, as the producer does for its own sends)."""
        attempt = 0
        while True:
            try:
                return await self.sender.routes().group_of(topic, queue)
            except RequestError as exc:
                attempt += 1
                if not is_retriable(exc) or attempt > max(self.producer.retries, 5):
                    raise
            await anyio.sleep(backoff_delay(attempt))

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
        delay: float | None = None,
        deliver_at: datetime | float | None = None,
        delay_level: int | None = None,
    ) -> SendFuture[SendResult]:
        """Hand a message to the transaction; the future completes when it is stored
        (invisible until the commit: its `offset` is -1). A delay (as `Producer.send`)
        counts from when it is stored; committed, it enters its queue when due."""
        self._check_open()
        due = due_fields(delay, deliver_at, delay_level)
        fut: SendFuture[SendResult] = SendFuture()

        async def joining(route: TopicRoute, q: int) -> None:
            await self._join(route.group_of(q) or await self._group_of(topic, q), wait=False)
            self._check_open()
            self._futures.append(fut)

        await self.sender.send_one(
            topic, as_payload(message, key=key, tags=tags, properties=properties,
                              message_group=message_group), queue, fut,
            joining=joining, due=due)
        return fut

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
        """Send within the transaction and wait until the message is stored (prepared)."""
        fut = await self.send_async(topic, message, key=key, tags=tags,
                                    properties=properties, message_group=message_group,
                                    queue=queue, delay=delay,
                                    deliver_at=deliver_at, delay_level=delay_level)
        try:
            return await fut
        except RequestError as exc:
            self.owner.reraise(exc)

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
        """Send messages to one queue within the transaction (as `Producer.send_batch`)
        and wait until they are stored."""
        self._check_open()
        due = due_fields(delay, deliver_at, delay_level)
        p = self.producer
        msgs = [as_payload(m) for m in messages]
        if not msgs:
            return []
        for m in msgs:
            check_message(m, p.max_message_bytes)
        route, q, _ = await self.sender.choose_queue(topic, msgs[0], queue)
        await self._join(route.group_of(q) or await self._group_of(topic, q), wait=False)
        self._check_open()
        futs = await self.sender.send_batch(topic, q, msgs, self._futures.append, due)
        results: list[SendResult] = []
        try:
            for fut in futs:
                results += await fut
        except RequestError as exc:
            self.owner.reraise(exc)
        return results

    async def send_offsets(self, consumer_group: str,
                           offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit `consumer_group`'s offsets ({(topic, queue): next offset to consume})
        with this transaction: they take effect only if it commits (the
        consume-transform-produce loop of exactly-once processing)."""
        self._check_open()
        cg = validate_group_name(consumer_group)
        by_group: dict[str, list[tuple[str, int, int]]] = {}
        for (topic, queue), offset in sorted(offsets.items()):
            validate_topic_name(topic)
            if not isinstance(queue, int) or not isinstance(offset, int) or offset < 0 or queue < 0:
                raise ValueError(f"offsets map (topic, queue) to an offset >= 0, not "
                                 f"({topic!r}, {queue!r}) -> {offset!r}")
            by_group.setdefault(await self._group_of(topic, queue), []).append(
                (topic, queue, offset))
        if not by_group:
            return
        routes = self.sender.routes()
        for group, rows in by_group.items():
            await self._join(group)
            self._check_open()
            req = TxOffsetsRequest(g=group, tid=self.tid, epoch=self.epoch, n=self.n, cg=cg,
                                   offsets=tuple(rows))
            try:
                await routes.call_group(group, req.OP, req.header(), write=True,
                                        timeout=self.producer.send_timeout,
                                        attempts=TX_ATTEMPTS)
            except RequestError as exc:
                self._error = self._error or self.owner.failed(exc)
                self.owner.reraise(exc)

    async def _settle(self) -> BaseException | None:
        """Wait for every send and TX_ADD of the transaction; the first failure, if any."""
        first: BaseException | None = None
        for fut in self._futures:
            try:
                await fut
            except Exception as exc:
                if isinstance(exc, RequestError):
                    exc = self.owner.failed(exc)
                first = first or exc
        await self._added()
        return self._error or first

    async def _end(self, commit: bool, wait: bool = True) -> str:
        groups = tuple(sorted(self.joined))
        frame = await self.owner.call(lambda g: TxEndRequest(
            g=g, tid=self.tid, epoch=self.epoch, n=self.n, commit=commit, wait=wait,
            groups=groups))
        return TxEndAnswer.decode(frame.header).state

    async def commit(self, *, wait_visible: bool = True) -> None:
        """Wait for every send's acknowledgement, then commit: on return the messages are
        visible to consumers, or with `wait_visible=False` the commit is decided (it can no
        longer fail or be undone) and they become visible a moment later, the coordinator
        finishing that whatever happens to this producer; the next transaction may start
        meanwhile. Raises
        `TransactionAbortedError` when the transaction was aborted instead (a send failed:
        the cause is chained; its timeout passed; it was fenced), `ProducerFencedError`
        when a newer producer took the transactional id over."""
        self._check_open()
        self.state = "committing"
        failure = await self._settle()
        self.owner.fenced_ends(self, failure)
        if failure is not None:
            await self._abort_after(failure)
        if not self._added_any:  # nothing was sent: nothing to decide
            self.state = "committed"
            self.owner.finished(self, started=False, sure=True)
            return
        try:
            state = await self._end(True, wait_visible)
        except TransactionError as exc:
            self._fail(exc)
            if exc.code == Code.TX_DECIDED:  # the coordinator aborted it (its timeout)
                raise TransactionAbortedError(
                    exc.code, f"transaction {self.n} of {self.tid!r} was aborted, not "
                    f"committed: {exc.message}", **exc.extra) from exc
            raise
        except BaseException as exc:
            self._fail(exc)
            raise
        if state in ("complete_commit", "prepare_commit"):
            self.state = "committed"
            self.owner.finished(self, started=True, sure=True)
            return
        self.state = "aborted"
        self.owner.finished(self, started=True, sure=state in ("complete_abort", "prepare_abort"))
        raise TransactionAbortedError(
            Code.TX_DECIDED, f"transaction {self.n} of {self.tid!r} was aborted, not committed "
            f"(the coordinator says {state or 'nothing'}: its timeout passed or it was fenced)")

    def _fail(self, exc: BaseException) -> None:
        """The decision request failed: refused (the transaction is over, aborted), or
        unanswered (whether it was taken is not known here)."""
        refused = isinstance(exc, TransactionError)
        self.state = "aborted" if refused else "unknown"
        self.owner.finished(self, started=True, sure=isinstance(exc, ProducerFencedError))

    async def _abort_after(self, failure: BaseException) -> None:
        """A send or an offsets request failed: abort and raise why."""
        try:
            await self._decide_abort()
        except RequestError as exc:  # never committed: its timeout or the next
            log.warning("aborting transaction %d of %r after a failed send: %s "
                        "(it is aborted at its timeout)", self.n, self.tid, exc)
            self.state = "aborted"
        raise TransactionAbortedError(
            Code.TX_DECIDED, f"transaction {self.n} of {self.tid!r} was aborted: one of its "
            f"requests failed ({failure})") from failure

    async def _decide_abort(self) -> None:
        self.state = "aborting"
        if not self._added_any:
            self.state = "aborted"
            self.owner.finished(self, started=False, sure=True)
            return
        try:
            await self._end(False)
        except TransactionError as exc:
            if exc.code == Code.TX_UNKNOWN:  # the coordinator never heard of it
                self.state = "aborted"
                self.owner.finished(self, started=False, sure=True)
                return
            self._fail(exc)
            raise
        except BaseException as exc:
            self._fail(exc)
            raise
        self.state = "aborted"
        self.owner.finished(self, started=True, sure=True)

    async def abort(self) -> None:
        """Drop everything of the transaction (after its sends settle: a late batch of
        it would be refused anyway)."""
        self._check_open()
        self.state = "aborting"
        await self._settle()
        self.owner.check_usable()
        await self._decide_abort()


@asynccontextmanager
async def transaction_scope(owner: TransactionalSends) -> AsyncIterator[Transaction]:
    """Begin; commit on a clean exit (unless the block committed or aborted itself),
    abort on an exception, which is then raised as it was."""
    tx = await owner.begin()
    try:
        yield tx
    except BaseException:
        if tx.state == "open" and owner.fenced is None:
            with anyio.CancelScope(shield=True):
                try:
                    await tx.abort()
                except Exception as exc:
                    log.warning("aborting transaction %d of %r failed: %s", tx.n, tx.tid, exc)
        raise
    if tx.state == "open":
        await tx.commit()


# ---------------------------------------------------------------- RocketMQ's model


class _Lane:
    """One producer id's sequence of half messages on one queue: its halves go one at a
    time, so they arrive in sequence order and a retry is recognised as a repeat."""

    __slots__ = ("lock", "next_seq", "pid")

    def __init__(self) -> None:
        self.pid = new_producer_id()
        self.next_seq = 0
        self.lock = anyio.Lock()

    def restart(self) -> None:
        """A half's fate is unknown: the next ones start a new sequence."""
        self.pid, self.next_seq = new_producer_id(), 0


def _free_lane(lanes: list[_Lane], turn: int) -> _Lane:
    """An idle lane, a new one while there are fewer than `HALF_LANES`, else the next in
    turn (to wait for)."""
    for lane in lanes:
        if not lane.lock.locked():
            return lane
    if len(lanes) < HALF_LANES:
        lanes.append(_Lane())
        return lanes[-1]
    return lanes[turn % len(lanes)]


class HalfHandle:
    """A stored half message, waiting for `commit()` or `rollback()` (or for the broker's
    check-back, if neither ever comes)."""

    def __init__(self, halves: HalfMessages, txid: str, result: SendResult) -> None:
        self._halves = halves
        self.txid = txid
        self.result = result
        self.state: Verdict = "unknown"
        #: The last commit()/rollback() found it decided that way already (a retry).
        self.repeated = False

    @property
    def group(self) -> str:
        return self.result.group

    async def commit(self) -> bool:
        """Deliver the half message. Returns True once it is committed (also when an
        earlier call or a check-back had committed it: `repeated` says so); deciding it
        the other way after a rollback raises `TransactionError` (TX_DECIDED)."""
        await self._end(True)
        return True

    async def rollback(self) -> bool:
        """Drop the half message. Returns True once it is rolled back (`repeated`: it
        had been already); after a commit, `TransactionError` (TX_DECIDED)."""
        await self._end(False)
        return True

    async def _end(self, commit: bool) -> None:
        self.repeated = await self._halves.end(self.group, self.txid, commit)
        self.state = "commit" if commit else "rollback"


class HalfMessages:
    """The RocketMQ side of a producer: half messages (idempotent, in up to
    `HALF_LANES` lanes per queue, see `_Lane`), the answers to
    the broker's check-backs and the heartbeats that make them possible."""

    def __init__(self, producer: Producer, producer_group: str,
                 check_listener: CheckListener | None) -> None:
        self.producer = producer
        self.sender = producer.send_path
        self.producer_group = validate_group_name(producer_group)
        self.check_listener = check_listener
        self.client_id = f"{uuid.uuid4().hex[:12]}"
        self._lanes: dict[tuple[str, int], list[_Lane]] = {}
        self._turn = 0
        self.checks_answered = 0

    async def start(self) -> None:
        """Answer check-backs on the producer's connections and heartbeat to every node
        (the first round before returning, so a check can find this producer)."""
        if self.check_listener is None:
            return
        routes = self.sender.routes()
        routes.pool.on_request(Op.TX_CHECK, self._on_check)
        await self.heartbeat()
        self.sender.spawn(self._heartbeats)

    async def heartbeat(self) -> None:
        routes = self.sender.routes()
        try:
            addrs = node_addresses(await routes.cluster())
        except RequestError as exc:
            log.debug("producer heartbeat: no cluster view (%s)", exc)
            return
        header = ProducerHeartbeatRequest(pg=self.producer_group, client=self.client_id,
                                          ttl_ms=HEARTBEAT_TTL_MS).header()

        async def one(addr: str) -> None:
            try:
                await routes.pool.request(addr, Op.PRODUCER_HEARTBEAT, header,
                                          timeout=self.producer.send_timeout)
            except RequestError as exc:
                log.debug("producer heartbeat to %s failed: %s", addr, exc)

        async with anyio.create_task_group() as tg:
            for addr in addrs:
                tg.start_soon(one, addr)

    async def _heartbeats(self) -> None:
        while True:
            await anyio.sleep(HEARTBEAT_INTERVAL)
            await self.heartbeat()

    async def _on_check(self, frame: Frame) -> tuple[dict[str, Any], bytes]:
        check = TxCheckRequest.decode(frame.header)  # the node's question, checked here too
        req = CheckRequest(check.txid, check.topic, check.queue, check.msg_id or None,
                           check.g, check.pg, check.checks)
        if req.producer_group != self.producer_group or self.check_listener is None:
            return TxCheckAnswer(state="unknown").header(), b""
        answer, _ = await decide(self.check_listener, req, "the check listener")
        self.checks_answered += 1
        return TxCheckAnswer(state=answer).header(), b""

    async def prepare(self, topic: str, message: OutgoingMessage | bytes | str, *,
                      key: str | None = None, tags: str | None = None,
                      properties: dict[str, str] | None = None,
                      message_group: str | None = None,
                      queue: int | None = None, due: Due = NO_DUE) -> HalfHandle:
        """Store `message` as a half message (invisible until committed; a delayed one,
        `due`, in its queue once committed and due). When no answer says whether it was
        stored, the `OutcomeUnknownError` raised carries its `txid`."""
        p = self.producer
        routes = self.sender.routes()
        msg = as_payload(message, key=key, tags=tags, properties=properties,
                         message_group=message_group)
        check_message(msg, p.max_message_bytes)
        _route, q, _ = await self.sender.choose_queue(topic, msg, queue)
        txid = uuid.uuid4().hex
        self._turn += 1
        lane = _free_lane(self._lanes.setdefault((topic, q), []), self._turn)
        async with lane.lock:
            data = encode_batch(topic, q, [msg], pid=lane.pid, seq=lane.next_seq,
                                born_ms=_now_ms(), half=(txid, self.producer_group),
                                delay_ms=due[0], deliver_ms=due[1])
            try:
                group, frame = await routes.call_queue(
                    topic, q, Op.PRODUCE, lambda g: {"g": g}, data, write=True,
                    timeout=p.send_timeout, attempts=p.retries + 1)
                base, n, index, dup, shift = _stored_fields(frame.header)
            except OutcomeUnknownError as exc:
                lane.restart()
                exc.txid = txid  # it may be stored: the caller can still decide it
                raise
            except BaseException:
                lane.restart()
                raise
            lane.next_seq += 1
        ids = batch_message_ids(group, index, data, shift) if index >= 0 else [None]
        return HalfHandle(self, txid, SendResult(ids[0], topic, q, -1, group, dup))

    async def end(self, group: str, txid: str, commit: bool) -> bool:
        routes = self.sender.routes()
        req = HalfEndRequest(g=group, txid=txid, commit=commit, pg=self.producer_group)
        frame = await routes.call_group(group, req.OP, req.header(), write=True,
                                        timeout=self.producer.send_timeout,
                                        attempts=TX_ATTEMPTS)
        return HalfEndAnswer.decode(frame.header).dup

    async def send_in_transaction(
        self, topic: str, message: OutgoingMessage | bytes | str,
        local_transaction: LocalTransaction, *, key: str | None = None,
        tags: str | None = None, properties: dict[str, str] | None = None,
        message_group: str | None = None, queue: int | None = None, due: Due = NO_DUE,
    ) -> TransactionResult:
        """Prepare a half message, run `local_transaction(message)`, then commit or roll
        back as it says. "unknown" (or an exception) leaves the decision to the broker's
        check-back; so does a decision that cannot be delivered now."""
        full = make_message(message, key=key, tags=tags, properties=properties,
                            message_group=message_group)
        handle = await self.prepare(topic, full, queue=queue, due=due)
        answer, error = await decide(local_transaction, full, "the local transaction")
        if answer == "unknown":
            return TransactionResult(handle.result, handle.txid, "unknown", error)
        try:
            await handle._end(answer == "commit")
        except TransactionError:
            raise
        except RequestError as exc:  # unreachable now: the check-back will ask
            log.warning("half message %s: %s not delivered (%s); the broker's check-back "
                        "will ask", handle.txid, answer, exc)
            return TransactionResult(handle.result, handle.txid, "unknown", exc)
        return TransactionResult(handle.result, handle.txid, answer)


def _now_ms() -> int:
    return int(time.time() * 1000)
