"""The push consumer, built on the pull side: handlers run concurrently, an `OffsetWindow`
per queue commits only the lowest unfinished offset (at least once, never a skip).

A message whose handler failed is retried by the broker by default (`retry="broker"`):
it is sent back to the consumer group's replicated receipts (SEND_BACK) and the offset
moves on; the consumer that owns its queue receives it again after the backoff, with
its delivery count (a retries-only receive), and after `max_reconsume_times` retries it
is a dead letter. With `retry="local"` (and always in broadcast mode) failed messages are
retried in place, in memory, holding back their key's later messages.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from transport.connection import ConnectionPool, is_retriable
from wire.protocol import Code, RequestError, validate_group_name, validate_topic_name
from wire.records import Message
from wire.requests import HeartbeatRequest

from .allocation import strategy_of
from .errors import LockLostError, PoisonMessage, StaleReceiptError
from .groupclient import (
    GroupClient,
    QueuesCallback,
    call_back,
    check_isolation,
    checked_client_id,
    is_async_callable,
)
from .localoffsets import LocalOffsets, default_offsets_dir
from .offsetwindow import OffsetWindow
from .pull import StartFrom
from .queuelocks import lock_queue, unlock_queue
from .reads import (
    LONG_POLL_MS,
    PULL_BATCH,
    MessageSelector,
    Selector,
    commit_offsets,
    fetch,
    out_of_range_offset,
    query_offset,
    queue_bounds,
    selector_of,
)
from .routes import backoff_delay
from .simple import DEFAULT_BACKOFF, ReceivedMessage, SimpleConsumer
from .trace import Tracer

log = logging.getLogger("raftmq.client.consumer")

FLOW_CONTROL_DELAY = 0.05  # RocketMQ's pause before re-checking a queue over its threshold
LOCK_RETRY = 0.5  # seconds between tries to lock a queue another client still holds
# RocketMQ's lock timings: the broker's lease (60 s, `queue_lock_lease_ms`), renewed every
# 20 s; a client that could not renew for 30 s stops handling the queue by itself, a
# margin against a clock skew between a failed-over leader and the client
LOCK_RENEW_INTERVAL = 20.0
LOCK_LOCAL_EXPIRY = 30.0
# `release-before-commit` (a test mutation): how long the final commit of a released queue
# waits after its premature unlock, as a slow commit would, so a next owner can start
RELEASE_BEFORE_COMMIT_PAUSE = 3.0
Handler = Callable[[list[Message]], Any]


@dataclass(eq=False)
class _QueueState:
    topic: str
    queue: int
    selector: MessageSelector
    offset: int
    window: OffsetWindow
    committed: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    retry_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    released: bool = False
    running: int = 0
    queued: int = 0  # works handed to the workers and not picked up yet
    idle: anyio.Event | None = None
    # message key -> this queue's unfinished works holding it, oldest first: a work runs
    # only at the head of each of its keys' lines (see `PushConsumer._submit`)
    lines: dict[str, deque[_Work]] = field(default_factory=dict)
    # the queue lock (clustering): this client may handle the queue's messages until
    # `lock_until` (its clock), a margin below the broker's lease; renewed at `renewed`
    lock_until: float = math.inf
    renewed: float = 0.0
    # orderly: the messages pulled and not handed to the handler yet, in offset order;
    # the handler's calls run one at a time in `consume_scope`
    pending: deque[Message] = field(default_factory=deque)
    wake: anyio.Event = field(default_factory=anyio.Event)
    consume_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    holding: Held | None = None  # orderly, on_exhausted="hold": what blocks the queue
    renewing: bool = False  # a renewal of its lock is under way
    unlocked: bool = False  # released, and its lock let go of

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.queue)


@dataclass(frozen=True, slots=True)
class Held:
    """A queue an orderly consumer holds at a message its handler kept failing
    (`on_exhausted="hold"`): nothing after it is handled until the handler succeeds."""

    topic: str
    queue: int
    offset: int
    attempts: int
    error: str


@dataclass(slots=True)
class _Work:
    state: _QueueState
    messages: list[Message]
    attempt: int = 0

    @property
    def keys(self) -> set[str]:
        return {m.key for m in self.messages if m.key}


class PushConsumer(GroupClient):
    """Calls `handler` for every message of `topics`; use `async with` or `await run()`.

    The handler receives a list of messages (at most `consume_batch`, default 1) and
    may be a plain or an async function; plain ones run in worker threads. It fails by
    raising or returning False; raising `PoisonMessage` sends its messages to the
    group's dead letters at once.

    Failed messages, `retry="broker"` (the default in clustering mode): each is sent back
    to the broker, where the group's replicated receipts hold it (so a crash of this
    consumer forgets nothing), and the offset moves on; the consumer owning its queue
    receives it again after `retry_backoff` (RocketMQ's 10 s, 30 s, 1 m, ... 2 h by
    delivery count), the message then carrying `deliveries` (2, 3, ...); after
    `max_reconsume_times` retries (16) it goes to the dead letters (`raftmq dlq`). A
    retried message is held for `retry_invisible` seconds while its handler runs. If
    the broker cannot take it back now, it is retried here in the meantime.
    `retry="local"` (always in broadcast mode): redelivered in place after a backoff, up
    to `max_reconsume_times`, then passed to `on_give_up` (plain or async; awaited); the
    offset passes a message only once the handler or `on_give_up` completed on it: with
    no `on_give_up`, or one that raises, it is retried (backoff capped at 60 s).
    Up to `consume_concurrency` handler calls run at once; a queue stops being pulled
    while more than `per_queue_threshold` of its messages are unfinished.

    Order: messages with the same key are handled one at a time in their queue's order
    (other keys go on). With local retries that includes retries: while a message waits
    for its redelivery, the later messages of its key wait behind it. With broker
    retries a failed message is retried later, after its key's later messages (as
    RocketMQ's concurrent consumer does): use `retry="local"` when a key's order must
    hold through failures. Keyless messages have no order among themselves. (A producer
    sends one key to one queue, so this is the key's send order.)

    `mode="clustering"` shares the queues among the group's consumers (`strategy`
    "average" or "round_robin", recomputed from the clients seen by heartbeats as soon
    as a node reports that the group's members changed, and every `rebalance_interval`) and commits offsets through the log every `commit_interval`
    and when a queue is released. `mode="broadcast"` reads every queue in every
    consumer and keeps its offsets in a file of its own on this host, in `offsets_dir`
    (default `$RAFTMQ_OFFSETS_DIR` or `~/.raftmq/offsets`), so a restart goes on where it
    stopped; two live broadcast consumers of one group need different directories.

    `topics` is a list, or a mapping topic -> tags to filter on: None or "*" (all
    messages), "TagA", "TagA || TagB" or a list of tags (see `parse_tags`), or a
    `MessageSelector` (`MessageSelector.by_sql("a > 5")`: a SQL92 filter the node
    decides, compiled here, so a bad one raises `FilterError` naming the position). The
    messages a filter leaves out are never handed to the handler; the committed offset
    moves past them. `topics` keeps topic -> tags, `selectors` topic -> selector.
    `isolation` is "read_committed", the only level served (`check_isolation`).

    Queue locks (clustering mode): a consumer reads a queue only while it holds the
    queue's lock on the broker, a lease of `lock_lease` seconds (None: the node's
    `queue_lock_lease_ms`, 60 s) renewed every `lock_renew_interval` (20 s). A queue
    newly assigned starts once its previous owner let go of it (or its lease ran out);
    a queue leaving the assignment stops being pulled, its running handlers finish, its
    offset is committed, and only then is its lock released. So a rebalance without
    failures hands no message to two consumers. A consumer that could not renew a lock
    for `lock_local_expiry` seconds (30 s, below the lease) stops handling that queue by
    itself. Broadcast consumers take no locks.

    `orderly=True` (RocketMQ's orderly consumption): each queue's messages are handed
    to the handler one call at a time (`consume_batch` messages at most), in offset
    order, queues in parallel. A call that fails is made again with the same messages
    after `suspend` seconds, never skipped; after `max_attempts` calls the messages go to
    the group's dead letters (`on_exhausted="dlq"`), or stay and block their queue
    (`on_exhausted="hold"`, logged and listed by `held()`) until the handler takes them.
    `retry`, `max_reconsume_times` and `on_give_up` are the concurrent consumer's.

    `on_assign(queues)` runs when queues start (their locks held, nothing handled yet),
    `on_revoke(queues)` when they stop: the consumer hands them nothing more, and their
    final commit is done (or given up: a queue whose lock this consumer can no longer
    count on is not committed, its next owner handles the uncommitted messages again),
    before their locks are released. Plain callbacks run in a worker thread, async ones
    are awaited; one that raises is logged.
    """

    def __init__(
        self,
        namesrv: Sequence[str] | str,
        group: str,
        topics: Sequence[str] | Mapping[str, Selector],
        handler: Handler,
        *,
        mode: Literal["clustering", "broadcast"] = "clustering",
        strategy: Literal["average", "round_robin"] | Callable[..., list[Any]] = "average",
        pull_batch: int = PULL_BATCH,
        per_queue_threshold: int = 1000,
        consume_batch: int = 1,
        consume_concurrency: int = 20,
        commit_interval: float = 5.0,
        heartbeat_interval: float = 10.0,
        rebalance_interval: float = 10.0,
        start_from: StartFrom = "first",
        long_poll_ms: int = LONG_POLL_MS,
        max_reconsume_times: int = 16,
        reconsume_delay: float = 1.0,
        on_give_up: Callable[[list[Message]], Any] | None = None,
        retry: Literal["broker", "local"] = "broker",
        retry_backoff: Sequence[float] = DEFAULT_BACKOFF,
        retry_invisible: float = 60.0,
        shutdown_timeout: float = 5.0,
        client_id: str | None = None,
        timeout: float = 3.0,
        pool: ConnectionPool | None = None,
        isolation: str = "read_committed",
        offsets_dir: str | os.PathLike[str] | None = None,
        trace: bool = False,
        orderly: bool = False,
        suspend: float = 1.0,
        max_attempts: int = 16,
        on_exhausted: Literal["dlq", "hold"] = "dlq",
        lock_lease: float | None = None,
        lock_renew_interval: float = LOCK_RENEW_INTERVAL,
        lock_local_expiry: float = LOCK_LOCAL_EXPIRY,
        on_assign: QueuesCallback | None = None,
        on_revoke: QueuesCallback | None = None,
    ) -> None:
        super().__init__(namesrv, pool, timeout)
        self.isolation = check_isolation(isolation)
        self.group = validate_group_name(group)
        self._offset_file = LocalOffsets(
            offsets_dir if offsets_dir is not None else default_offsets_dir(), self.group
        ) if mode == "broadcast" else None
        if isinstance(topics, Mapping):
            self.selectors = {t: selector_of(v) for t, v in topics.items()}
        elif isinstance(topics, str):
            raise ValueError(f"topics is a list of topics or a mapping topic -> tags, not "
                             f"the string {topics!r}")
        else:
            self.selectors = dict.fromkeys(topics, MessageSelector())
        self.topics = {t: sel.tag_list for t, sel in self.selectors.items()}
        if not self.topics:
            raise ValueError("subscribe to at least one topic")
        for t in self.topics:
            validate_topic_name(t)
        if mode not in ("clustering", "broadcast"):
            raise ValueError("mode is 'clustering' or 'broadcast'")
        self._allocate = strategy_of(strategy)
        if start_from not in ("first", "last"):
            raise ValueError("start_from is 'first' or 'last'")
        if min(pull_batch, per_queue_threshold, consume_batch, consume_concurrency) < 1:
            raise ValueError("batch sizes, threshold and concurrency must be >= 1")
        if retry not in ("broker", "local"):
            raise ValueError("retry is 'broker' or 'local'")
        # broadcast consumers each read every queue: a group's shared retries are not theirs
        self.retry = retry if mode == "clustering" else "local"
        self.retry_backoff = tuple(retry_backoff)
        self.retry_invisible = retry_invisible
        self._retries: SimpleConsumer | None = None
        self.handler = handler
        self.mode = mode
        self.pull_batch = pull_batch
        self.per_queue_threshold = per_queue_threshold
        self.consume_batch = consume_batch
        self.consume_concurrency = consume_concurrency
        self.commit_interval = commit_interval
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self.start_from = start_from
        self.long_poll_ms = long_poll_ms
        self.max_reconsume_times = max_reconsume_times
        self.reconsume_delay = reconsume_delay
        self.on_give_up = on_give_up
        self.shutdown_timeout = shutdown_timeout
        self.client_id = checked_client_id(client_id)
        if trace:
            self.tracer = Tracer("consumer", self.client_id, self.group, commits=True)
        self._handler_is_async = is_async_callable(handler)
        if on_exhausted not in ("dlq", "hold"):
            raise ValueError("on_exhausted is 'dlq' or 'hold'")
        if max_attempts < 1 or suspend < 0:
            raise ValueError("max_attempts must be >= 1 and suspend >= 0")
        if lock_lease is not None and not 0.1 <= lock_lease <= 3600:
            raise ValueError("lock_lease is 0.1 .. 3600 seconds (None: the node's)")
        if not 0 < lock_renew_interval < lock_local_expiry:
            raise ValueError("lock_renew_interval must be > 0 and below lock_local_expiry")
        if lock_lease is not None and lock_local_expiry >= lock_lease:
            raise ValueError("lock_local_expiry must be below lock_lease: the consumer "
                             "stops before the broker hands the queue on")
        self.orderly = orderly
        self.suspend = suspend
        self.max_attempts = max_attempts
        # broadcast consumers have no dead letters of their own: they hold
        self.on_exhausted = on_exhausted if mode == "clustering" else "hold"
        self.lock_lease = lock_lease
        self.lock_renew_interval = lock_renew_interval
        self.lock_local_expiry = lock_local_expiry
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        # Deliberately wrong (chaos tests only, `release-before-commit`): a released
        # queue's lock is let go of before its offset is committed.
        self.release_before_commit = False
        self._wanted: set[tuple[str, int]] = set()  # the assignment rebalance computed
        self._taking: set[tuple[str, int]] = set()  # queues waiting for their lock
        self._control_tg: anyio.abc.TaskGroup | None = None
        self._states: dict[tuple[str, int], _QueueState] = {}
        self._local_offsets: dict[tuple[str, int], int] = {}
        self._rebalance_lock: anyio.Lock | None = None
        self._work_send: MemoryObjectSendStream[_Work] | None = None
        self._control: anyio.CancelScope | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._resumed: anyio.Event | None = None  # unset while paused

    @property
    def clustering(self) -> bool:
        return self.mode == "clustering"

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> PushConsumer:
        if self._offset_file is not None:
            self._local_offsets = await anyio.to_thread.run_sync(self._offset_file.open)
        try:
            await self._open()
        except BaseException:
            if self._offset_file is not None:
                self._offset_file.close()
            raise
        assert self._tg is not None and self._stack is not None
        if self.retry == "broker" or (self.orderly and self.clustering):
            # orderly: only for the dead letters of messages that failed `max_attempts`
            self._retries = await self._stack.enter_async_context(SimpleConsumer(
                self.namesrv, self.group, invisible=self.retry_invisible,
                max_deliveries=(self.max_reconsume_times + 1 if self.max_reconsume_times >= 0
                                else 1000),
                backoff=self.retry_backoff, timeout=self.timeout, client_id=self.client_id))
        self._rebalance_lock = anyio.Lock()
        self._limiter = anyio.CapacityLimiter(self.consume_concurrency)
        send, receive = anyio.create_memory_object_stream[_Work](float("inf"))
        self._work_send = send
        for _ in range(0 if self.orderly else self.consume_concurrency):
            self._tg.start_soon(self._worker, receive.clone())
        receive.close()
        self._control = anyio.CancelScope()
        self._tg.start_soon(self._control_loops, self._control)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            if self._control is not None:
                self._control.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.shutdown_timeout * 2):
                await self._release_all()
                if self.clustering:
                    await self._heartbeat(leaving=True)
        finally:
            if self._work_send is not None:
                self._work_send.close()
            if self._offset_file is not None:
                self._offset_file.close()
        return await self._close(exc_type, exc, tb)

    async def run(self) -> None:
        """Consume until cancelled."""
        async with self:
            await anyio.sleep_forever()

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, queue) pairs this consumer currently reads."""
        return sorted(self._states)

    def pause(self) -> None:
        """Hand the handler no more messages until `resume()` (RocketMQ's `suspend`):
        calls already running finish, nothing more is pulled, and offsets stay where the
        finished messages put them. Heartbeats and rebalancing go on, so the consumer
        keeps its queues; a queue it loses meanwhile is released as usual."""
        if self._resumed is None or self._resumed.is_set():
            self._resumed = anyio.Event()

    def resume(self) -> None:
        """Go on after `pause()`."""
        if self._resumed is not None:
            self._resumed.set()

    @property
    def paused(self) -> bool:
        return self._resumed is not None and not self._resumed.is_set()

    async def _unpaused(self) -> None:
        while self._resumed is not None and not self._resumed.is_set():
            await self._resumed.wait()

    def offsets(self) -> dict[tuple[str, int], int]:
        """The committable offset of every queue read (the lowest unfinished one)."""
        return {k: st.window.committable() for k, st in sorted(self._states.items())}

    # ------------------------------------------------------------ membership

    async def _control_loops(self, scope: anyio.CancelScope) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                self._control_tg = tg
                if self.clustering:
                    await self._heartbeat()
                    tg.start_soon(self._every, self.heartbeat_interval, self._heartbeat)
                    tg.start_soon(self._watch_members, tg)
                    tg.start_soon(self._keep_locks)
                tg.start_soon(self._rebalance_loop)
                tg.start_soon(self._every, self.commit_interval, self.commit_now, False)

    async def _rebalance_loop(self) -> None:
        """Rebalance now, then as soon as a node says the group's members changed
        (`_watch_node`), and every `rebalance_interval` in any case."""
        while True:
            self._members_changed = anyio.Event()
            try:
                await self.rebalance()
            except Exception as exc:
                log.warning("%s: rebalance failed: %s", self.client_id, exc)
            with anyio.move_on_after(self.rebalance_interval):
                await self._members_changed.wait()

    async def _every(
        self, period: float, fn: Callable[[], Awaitable[Any]], immediately: bool = False
    ) -> None:
        if not immediately:
            await anyio.sleep(period)
        while True:
            try:
                await fn()
            except Exception as exc:
                log.warning("%s: %s failed: %s", self.client_id, getattr(fn, "__name__", fn), exc)
            await anyio.sleep(period)

    async def _heartbeat(self, leaving: bool = False) -> None:
        """Tell every node this client is alive (ttl 0 when leaving, so it drops us now)."""
        beat = HeartbeatRequest(cg=self.group, client=self.client_id,
                                topics=tuple(sorted(self.topics)),
                                ttl_ms=int(self.heartbeat_interval * 3000))
        if leaving:
            await self._beats.leave(self.routes, beat, self.timeout)
        else:
            await self._beats.beat(self.routes, beat, self.timeout)

    async def rebalance(self) -> None:
        """Recompute this consumer's queues now; release lost ones before taking new ones
        (so the previous owner's final commit is in before a new owner reads). In
        clustering mode a new queue starts once its lock is held (`_take`)."""
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            clients = await self.clients() if self.clustering else [self.client_id]
            desired, known = await self._desired(self.topics, clients, share=self.clustering)
            current = set(self._states)
            lost = {k for k in current - desired
                    if k[0] in known and not self._states[k].released}
            self._wanted = desired | {k for k in current if k[0] not in known}
            gained = sorted(desired - current - self._taking)
            if lost or gained:
                log.info("%s: rebalance among %d clients: -%s +%s", self.client_id,
                         len(clients), sorted(lost), gained)
            if lost:
                await self._release([self._states[k] for k in lost])
            for topic, queue in gained:
                if self.clustering:
                    assert self._control_tg is not None
                    self._taking.add((topic, queue))
                    self._control_tg.start_soon(self._take, topic, queue)
                    continue
                try:
                    await self._acquire(topic, queue)
                except RequestError as exc:
                    log.warning("%s: cannot start %s:%d yet: %s", self.client_id, topic, queue, exc)

    async def _take(self, topic: str, queue: int) -> None:
        """Lock a newly assigned queue, then start it; while another client holds the
        lock (the previous owner finishing, or a crashed one's lease running out), try
        again every `LOCK_RETRY` seconds, for as long as the queue stays assigned. A take
        that ends without starting the queue (unassigned meanwhile, or the consumer
        closing) lets go of the lock it may have got: a LOCK whose answer never came
        may still have been applied."""
        key = (topic, queue)
        assert self._rebalance_lock is not None
        failures = 0
        waited = asked_for = False
        try:
            while key in self._wanted:
                asked = anyio.current_time()
                asked_for = True
                try:
                    expiry = await lock_queue(self.routes, self.group, topic, queue,
                                              self.client_id, self._lease_ms)
                except RequestError as exc:
                    failures += 1
                    log.log(logging.DEBUG if is_retriable(exc) else logging.WARNING,
                            "%s: locking %s:%d: %s", self.client_id, topic, queue, exc)
                    await anyio.sleep(backoff_delay(failures, base=0.1, cap=5.0))
                    continue
                if expiry is None:
                    if not waited:
                        log.info("%s: %s:%d is still locked by another client: waiting",
                                 self.client_id, topic, queue)
                        waited = True
                    await anyio.sleep(LOCK_RETRY)
                    continue
                async with self._rebalance_lock:
                    if key not in self._wanted or key in self._states:
                        break
                    try:
                        await self._acquire(topic, queue, locked_at=asked)
                        return
                    except RequestError as exc:
                        failures += 1
                        log.warning("%s: cannot start %s:%d yet: %s", self.client_id, topic,
                                    queue, exc)
                await anyio.sleep(backoff_delay(failures, base=0.1, cap=5.0))
        finally:
            self._taking.discard(key)
            if asked_for and key not in self._states:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeout):
                    await self._unlock(topic, queue)

    @property
    def _lease_ms(self) -> int | None:
        return None if self.lock_lease is None else int(self.lock_lease * 1000)

    async def _unlock(self, topic: str, queue: int) -> None:
        try:
            await unlock_queue(self.routes, self.group, topic, queue, self.client_id)
        except RequestError as exc:
            log.warning("%s: unlocking %s:%d failed (its lease runs out by itself): %s",
                        self.client_id, topic, queue, exc)

    async def _keep_locks(self) -> None:
        """Renew the lock of every queue read, every `lock_renew_interval`; a queue whose
        lock went to another client, or that could not be renewed for
        `lock_local_expiry`, is let go of (`_lose`). Renewals run on their own, so one
        that hangs in a failover delays neither the others nor letting go of a queue
        whose lock ran out (its `on_revoke` comes soon after)."""
        tick = min(0.5, self.lock_renew_interval / 2)
        assert self._control_tg is not None
        while True:
            await anyio.sleep(tick)
            now = anyio.current_time()
            for st in list(self._states.values()):
                if st.released:
                    continue
                if now >= st.lock_until:
                    log.warning("%s: the lock of %s:%d was not renewed for %.3g s: stopping "
                                "it", self.client_id, st.topic, st.queue,
                                self.lock_local_expiry)
                    self._lose(st)
                elif now - st.renewed >= self.lock_renew_interval and not st.renewing:
                    st.renewing = True
                    self._control_tg.start_soon(self._renew, st)

    async def _renew(self, st: _QueueState) -> None:
        try:
            await self._renew_once(st)
        finally:
            st.renewing = False

    async def _renew_once(self, st: _QueueState) -> None:
        asked = anyio.current_time()
        try:
            expiry = await lock_queue(self.routes, self.group, st.topic, st.queue,
                                      self.client_id, self._lease_ms)
        except RequestError as exc:
            log.log(logging.DEBUG if is_retriable(exc) else logging.WARNING,
                    "%s: renewing the lock of %s:%d: %s", self.client_id, st.topic,
                    st.queue, exc)
            return  # tried again at the next tick
        if expiry is None:
            log.warning("%s: the lock of %s:%d is another client's now: stopping it",
                        self.client_id, st.topic, st.queue)
            self._lose(st)
            return
        if st.unlocked:  # applied after the release's unlock: let go of it again
            await self._unlock(st.topic, st.queue)
            return
        st.renewed = asked
        st.lock_until = asked + self.lock_local_expiry

    def _lose(self, st: _QueueState) -> None:
        """Stop reading a queue whose lock this client may not count on any more, as a
        rebalance releases it; the next rebalance takes it again if it is still ours."""
        if st.released:
            return
        st.lock_until = -math.inf  # no new handler call from now on
        try:
            assert self._control_tg is not None
            self._control_tg.start_soon(self._release_lost, st)
        except RuntimeError:
            pass  # closing: every queue is being released anyway

    async def _release_lost(self, st: _QueueState) -> None:
        """Release one queue at once, not behind a rebalance stuck in a failover (which
        leaves a queue being released alone)."""
        if self._states.get(st.key) is st and not st.released:
            with anyio.CancelScope(shield=True):  # closing must not cut its on_revoke
                await self._release([st])

    def _may_handle(self, st: _QueueState) -> bool:
        return not st.released and anyio.current_time() < st.lock_until

    async def _acquire(self, topic: str, queue: int, locked_at: float | None = None) -> None:
        assert self._tg is not None
        if self.clustering:
            committed = await query_offset(self.routes, self.group, topic, queue)
        else:
            committed = self._local_offsets.get((topic, queue), -1)
        start = committed
        if start < 0:
            lo, end = await queue_bounds(self.routes, topic, queue)
            start = lo if self.start_from == "first" else end
        st = _QueueState(topic, queue, self.selectors[topic], start, OffsetWindow(start),
                         committed)
        if locked_at is not None:
            st.renewed = locked_at
            st.lock_until = locked_at + self.lock_local_expiry
        self._states[st.key] = st
        await self._call_back(self.on_assign, [st.key])
        self._tg.start_soon(self._pull_loop, st)
        if self.orderly:
            self._tg.start_soon(self._orderly_loop, st)
        elif self._retries is not None:
            self._tg.start_soon(self._retry_loop, st)

    async def _release(self, states: Sequence[_QueueState]) -> None:
        """Stop pulling, let running handlers finish (up to `shutdown_timeout`), commit,
        and only then let go of the locks: the next owner starts after what was handled
        here is committed. A queue whose handler is still running keeps its lock (its
        lease runs out) so that no other consumer handles it meanwhile, and so does one
        whose final commit failed. The final commit is given up when a queue's lock may
        be another client's by then (`lock_until`): its next owner starts from the last
        commit anyway, and `on_revoke` must not come after that owner started."""
        for st in states:
            st.released = True
            st.scope.cancel()
            st.retry_scope.cancel()
            st.wake.set()
        with anyio.move_on_after(self.shutdown_timeout):
            for st in states:
                if st.running or st.queued:
                    st.idle = anyio.Event()
                    await st.idle.wait()
        idle = [st for st in states if not st.running and not st.queued]
        for st in states:
            st.consume_scope.cancel()
        if self.clustering and self.release_before_commit:
            for st in idle:  # the deliberate mutation: the next owner may start too early
                st.unlocked = True
                await self._unlock(st.topic, st.queue)
            await anyio.sleep(RELEASE_BEFORE_COMMIT_PAUSE)
        committed = await self._final_commit(states)
        for st in states:
            if self._states.get(st.key) is st:
                del self._states[st.key]
        await self._call_back(self.on_revoke, sorted(st.key for st in states))
        if self.clustering and not self.release_before_commit:
            for st in idle:
                if st.key in committed:
                    st.unlocked = True
                    await self._unlock(st.topic, st.queue)

    async def _final_commit(self, states: Sequence[_QueueState]) -> set[tuple[str, int]]:
        """Commit released queues while their locks are surely still this client's; the
        queues whose offsets are committed (or had nothing new)."""
        now = anyio.current_time()
        valid = [st for st in states if st.lock_until > now]
        done: set[tuple[str, int]] = set()
        if not valid:
            return done
        with anyio.move_on_after(min(st.lock_until for st in valid) - now):
            try:
                await self._commit(valid, losing=False)
                done.update(st.key for st in valid)
            except LockLostError:
                for st in valid:  # one queue's lost lock must not keep the others locked
                    try:
                        await self._commit([st], losing=False)
                        done.add(st.key)
                    except Exception as exc:
                        log.warning("%s: final commit of %s:%d failed: %s", self.client_id,
                                    st.topic, st.queue, exc)
            except Exception as exc:
                log.warning("%s: final commit of released queues failed: %s",
                            self.client_id, exc)
        return done

    async def _call_back(self, fn: QueuesCallback | None, queues: list[tuple[str, int]]
                         ) -> None:
        if fn is None or not queues:
            return
        try:
            await call_back(fn, queues)
        except Exception:
            log.exception("%s: %s(%s) failed", self.client_id,
                          getattr(fn, "__name__", fn), queues)

    async def _release_all(self) -> None:
        if self._rebalance_lock is None:
            return
        self._wanted = set()
        async with self._rebalance_lock:
            await self._release([st for st in self._states.values() if not st.released])

    # ------------------------------------------------------------ offsets

    async def commit_now(self) -> None:
        """Commit every owned queue's committable offset that moved since the last commit."""
        await self._commit(list(self._states.values()))

    async def _commit(self, states: Sequence[_QueueState], *, losing: bool = True) -> None:
        """Commit what moved. A commit refused because another client holds a queue's
        lock now (LOCK_LOST: this one's lease ran out) commits nothing for it; with
        `losing` each queue is then committed alone and those refused are let go of."""
        todo = {st.key: (st, st.window.committable()) for st in states}
        todo = {k: v for k, v in todo.items() if v[1] > v[0].committed}
        if not todo:
            return
        if self.clustering:
            try:
                await commit_offsets(self.routes, self.group,
                                     {k: off for k, (_, off) in todo.items()},
                                     client=self.client_id)
            except LockLostError:
                if not losing or len(todo) == 1:
                    for st, _ in todo.values():
                        if losing:
                            self._lose(st)
                    raise
                for st, _ in todo.values():
                    try:
                        await self._commit([st], losing=True)
                    except LockLostError as exc:
                        log.warning("%s: %s", self.client_id, exc)
                return
        else:
            assert self._offset_file is not None
            offsets = {**self._local_offsets, **{k: off for k, (_, off) in todo.items()}}
            await anyio.to_thread.run_sync(self._offset_file.save, offsets)
            self._local_offsets = offsets
        for st, off in todo.values():
            st.committed = max(st.committed, off)
        if self.tracer is not None:
            self.tracer.committed({k: off for k, (_, off) in todo.items()})

    # ------------------------------------------------------------ pulling and consuming

    async def _pull_loop(self, st: _QueueState) -> None:
        assert self._work_send is not None
        failures = 0
        with st.scope:
            while not st.released:
                if self.paused:
                    await self._unpaused()
                    continue
                if len(st.window) > self.per_queue_threshold:
                    await anyio.sleep(FLOW_CONTROL_DELAY)
                    continue
                try:
                    res = await fetch(
                        self.routes, st.topic, st.queue, st.offset,
                        max_messages=self.pull_batch, wait_ms=self.long_poll_ms,
                        tags=st.selector.tag_list, sql=st.selector.sql,
                    )
                except Exception as exc:
                    if not isinstance(exc, RequestError):
                        log.exception("%s: pull %s:%d", self.client_id, st.topic, st.queue)
                        exc = RequestError(Code.INTERNAL, repr(exc))
                    jump = out_of_range_offset(exc, st.topic, st.queue, st.offset)
                    if jump is not None:
                        # messages still in flight were below the retained range anyway
                        st.offset = jump
                        st.window.reset(jump)
                        continue
                    failures += 1
                    level = logging.DEBUG if is_retriable(exc) else logging.WARNING
                    log.log(level, "%s: pull %s:%d failed: %s", self.client_id, st.topic,
                            st.queue, exc)
                    await anyio.sleep(backoff_delay(failures, base=0.1, cap=5.0))
                    continue
                failures = 0
                if res.next_offset < st.offset:
                    log.warning("%s: %s:%d answered next %d below %d; ignoring", self.client_id,
                                st.topic, st.queue, res.next_offset, st.offset)
                msgs = [m for m in res.messages if m.offset >= st.window.end]
                for m in msgs:
                    st.window.add(m.offset)
                st.window.advance(res.next_offset)
                st.offset = max(st.offset, res.next_offset)
                if self.orderly:
                    st.pending.extend(msgs)
                    st.wake.set()
                    continue
                for i in range(0, len(msgs), self.consume_batch):
                    self._submit(_Work(st, msgs[i : i + self.consume_batch]))

    def _submit(self, work: _Work) -> None:
        """Queue `work` behind the unfinished works of its queue that share a message key
        with it, or hand it to the workers now if none does: one key's messages are
        handled one at a time, in offset order, a retry holding its place."""
        st = work.state
        for k in work.keys:
            st.lines.setdefault(k, deque()).append(work)
        if self._at_head(work):
            self._dispatch(work)

    @staticmethod
    def _at_head(work: _Work) -> bool:
        return all(work.state.lines[k][0] is work for k in work.keys)

    def _dispatch(self, work: _Work, *, retry: bool = False) -> None:
        """Hand `work` to the workers: a released queue's too (what was pulled is handled
        before its offset is committed), but for a retry (it stays unfinished)."""
        if (retry and work.state.released) or self._work_send is None:
            return
        try:
            self._work_send.send_nowait(work)
            work.state.queued += 1
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    @staticmethod
    def _check_idle(st: _QueueState) -> None:
        """Wake a release waiting for the queue to drain: no handler running and no work
        waiting for a worker (works parked for a retry, and those behind them, stay)."""
        if st.running == 0 and st.queued == 0 and st.idle is not None:
            st.idle.set()

    def _done(self, work: _Work) -> None:
        """`work` is finished: the next work of each of its keys may run."""
        st = work.state
        self._finish(st, work.messages)
        nexts: list[_Work] = []
        for k in work.keys:
            line = st.lines[k]
            line.popleft()
            if line:
                nexts.append(line[0])
            else:
                del st.lines[k]
        for nxt in {id(w): w for w in nexts}.values():
            if self._at_head(nxt):
                self._dispatch(nxt)

    async def _worker(self, receive: MemoryObjectReceiveStream[_Work]) -> None:
        async with receive:
            async for work in receive:
                st = work.state
                st.running += 1  # from here until it is done or parked for a retry
                st.queued -= 1
                try:
                    await self._unpaused()
                    # a queue being released drains what was handed out (so its next
                    # owner handles nothing twice); one whose lock was lost does not
                    if anyio.current_time() >= st.lock_until:
                        continue  # unfinished, not committed: its next owner handles it
                    ok, error, poison = await self._invoke(work.messages)
                    sent_back = not ok and await self._send_back(work.messages, error, poison)
                    if ok or sent_back or (0 <= self.max_reconsume_times <= work.attempt
                                           and await self._give_up(work.messages)):
                        self._done(work)
                    elif not st.released:
                        assert self._tg is not None
                        work.attempt += 1  # the same work: it keeps its place in its lines
                        self._tg.start_soon(self._reconsume_later, work)
                finally:
                    st.running -= 1
                    self._check_idle(st)

    # ------------------------------------------------------------ orderly

    def held(self) -> list[Held]:
        """The queues an orderly consumer holds at a message its handler kept failing
        (`on_exhausted="hold"`)."""
        return sorted((st.holding for st in self._states.values() if st.holding is not None),
                      key=lambda h: (h.topic, h.queue))

    async def _orderly_loop(self, st: _QueueState) -> None:
        """Hand the queue's messages to the handler one call at a time, in offset order;
        a failed call is made again after `suspend`, never skipped; after
        `max_attempts` its messages go to the dead letters, or block the queue (hold)."""
        with st.consume_scope:
            while True:
                while not st.pending and not st.released:
                    st.wake = anyio.Event()
                    await st.wake.wait()
                if not self._may_handle(st):
                    return
                msgs = [st.pending[i] for i in range(min(self.consume_batch, len(st.pending)))]
                attempts = 0
                while True:
                    await self._unpaused()  # a paused consumer makes no new call, retries too
                    if not self._may_handle(st):
                        return  # unfinished: not committed, the next owner handles them
                    attempts += 1
                    st.running += 1
                    try:
                        ok, error, poison = await self._invoke(msgs)
                        if not ok and (poison or (attempts >= self.max_attempts
                                                  and self.on_exhausted == "dlq")):
                            ok = await self._send_back(msgs, error, True)
                    finally:
                        st.running -= 1
                        self._check_idle(st)
                    if ok:
                        st.holding = None
                        break
                    if attempts >= self.max_attempts and self.on_exhausted == "hold":
                        if st.holding is None:
                            log.error("%s: %s failed %d times: holding %s:%d at offset %d "
                                      "until the handler takes them (on_exhausted='hold')",
                                      self.client_id, [m.msg_id for m in msgs], attempts,
                                      st.topic, st.queue, msgs[0].offset)
                        st.holding = Held(st.topic, st.queue, msgs[0].offset, attempts, error)
                    await anyio.sleep(self.suspend)
                for _ in msgs:
                    st.pending.popleft()
                self._finish(st, msgs)

    @staticmethod
    def _finish(st: _QueueState, msgs: list[Message]) -> None:
        for m in msgs:
            st.window.done(m.offset)

    async def _give_up(self, msgs: list[Message]) -> bool:
        """Hand messages the handler kept failing to `on_give_up` (awaited when it is a
        coroutine function or returns an awaitable, run in a worker thread when plain);
        whether it ran to completion. Only then may the offset pass them: without an
        `on_give_up`, or when it raises, they stay unfinished and are tried again at the
        capped backoff, holding back their queue's committed offset: nothing is skipped
        that user code has not handled."""
        ids = [m.msg_id for m in msgs]
        if self.on_give_up is None:
            log.error("%s: %s failed %d times and no on_give_up is set: trying again (the "
                      "queue's committed offset stays below them)", self.client_id, ids,
                      self.max_reconsume_times + 1)
            return False
        try:
            if is_async_callable(self.on_give_up):
                await self.on_give_up(msgs)
            else:
                result = await anyio.to_thread.run_sync(self.on_give_up, msgs,
                                                        limiter=self._limiter,
                                                        abandon_on_cancel=True)
                if inspect.isawaitable(result):
                    await result
        except Exception:
            log.exception("%s: on_give_up failed on %s: trying them again", self.client_id, ids)
            return False
        return True

    async def _reconsume_later(self, work: _Work) -> None:
        await anyio.sleep(min(60.0, self.reconsume_delay * 2 ** (work.attempt - 1)))
        self._dispatch(work, retry=True)

    async def _send_back(self, msgs: list[Message], error: str, poison: bool) -> bool:
        """Hand failed messages to the broker's retries; whether all were taken (else
        they are retried here, and sent back again when they fail again)."""
        if self._retries is None:
            return False
        try:
            for m in msgs:  # one at a time: a retried request is applied once
                await self._retries.send_back(m, error=error, dead=poison)
        except Exception as exc:
            log.warning("%s: sending %s back failed (retried here meanwhile): %s",
                        self.client_id, [m.msg_id for m in msgs], exc)
            return False
        return True

    async def _retry_loop(self, st: _QueueState) -> None:
        """Receive the messages of this queue that were sent back and are due again, run
        the handler on them and settle each (ack, nack, or dead letter)."""
        assert self._retries is not None
        failures = 0
        with st.retry_scope:
            while not st.released:
                if self.paused:
                    await self._unpaused()
                    continue
                try:
                    msgs = await self._retries.receive_retries(
                        st.topic, st.queue, max=self.consume_batch,
                        wait=self.long_poll_ms / 1000)
                except Exception as exc:
                    failures += 1
                    log.log(logging.DEBUG if isinstance(exc, RequestError) and is_retriable(exc)
                            else logging.WARNING, "%s: retries of %s:%d: %s", self.client_id,
                            st.topic, st.queue, exc)
                    await anyio.sleep(backoff_delay(failures, base=0.1, cap=5.0))
                    continue
                failures = 0
                if not msgs:
                    continue
                st.running += 1
                try:
                    ok, error, poison = await self._invoke(list(msgs))
                    await self._settle(msgs, ok, error, poison)
                finally:
                    st.running -= 1
                    self._check_idle(st)

    async def _settle(self, msgs: Sequence[ReceivedMessage], ok: bool, error: str,
                      poison: bool) -> None:
        assert self._retries is not None
        for m in msgs:
            try:
                if ok:
                    await self._retries.ack(m)
                elif poison:
                    await self._retries.dead_letter(m, error)
                else:
                    await self._retries.nack(m, error=error)
            except StaleReceiptError:
                pass  # its invisible time ran out meanwhile: it comes again
            except Exception as exc:
                log.warning("%s: settling retry %s failed (it comes again after its "
                            "invisible time): %s", self.client_id, m.msg_id, exc)

    async def _invoke(self, msgs: list[Message]) -> tuple[bool, str, bool]:
        """Run the handler: (it succeeded, the error when not, it raised PoisonMessage)."""
        if self.tracer is not None:
            self.tracer.delivered(msgs)
        try:
            if self._handler_is_async:
                result = await self.handler(msgs)
            else:
                # abandoned when the consumer closes (after `shutdown_timeout`): a stuck
                # handler must not hold the close; its messages stay unfinished, so their
                # offsets are not committed and they are delivered again
                result = await anyio.to_thread.run_sync(self.handler, msgs, limiter=self._limiter,
                                                        abandon_on_cancel=True)
                if inspect.isawaitable(result):
                    result = await result
        except PoisonMessage as exc:
            log.warning("%s: poison %s: %s", self.client_id, [m.msg_id for m in msgs], exc)
            return False, str(exc) or "poison", True
        except Exception as exc:
            log.exception("%s: handler failed on %s", self.client_id, [m.msg_id for m in msgs])
            return False, f"{type(exc).__name__}: {exc}", False
        if result is False:
            return False, "the handler returned False", False
        return True, "", False


