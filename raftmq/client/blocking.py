"""Blocking wrappers for code without an event loop (scripts, notebooks, threads).

Each wrapper runs its async client in an event loop on a private daemon thread (serving an
anyio blocking portal) and forwards calls to it, so it can be used from any number of
threads. Use them as context managers or call `close()`; the loop thread ends with the
client. A client still open when the interpreter exits is closed then (flushing and
committing as `close()` does, for at most `EXIT_CLOSE_TIMEOUT` seconds, with a
`ResourceWarning`), so a script that forgets `close()` still ends.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from wire.protocol import RequestError
from wire.records import Message, OutgoingMessage
from wire.trace import TraceRecord

from .admin import Admin, DeadLetter, GroupQueue, QueueLag, TopicInfo, TxListing
from .groupclient import QueuesCallback
from .membership import GroupMembers
from .producer import Producer, SendFuture, SendResult
from .pull import PullConsumer
from .push import Held, PushConsumer
from .queuelocks import QueueLock
from .reads import PullResult, Selector
from .simple import Receipt, ReceivedMessage, SimpleConsumer
from .transactions import HalfHandle, Transaction, TransactionResult

__all__ = [
    "EXIT_CLOSE_TIMEOUT",
    "BlockingAdmin",
    "BlockingHalfHandle",
    "BlockingProducer",
    "BlockingPullConsumer",
    "BlockingPushConsumer",
    "BlockingSimpleConsumer",
    "BlockingTransaction",
    "connect_admin",
    "connect_producer",
    "connect_pull_consumer",
    "connect_push_consumer",
    "connect_simple_consumer",
]

C = TypeVar("C")
R = TypeVar("R")

EXIT_CLOSE_TIMEOUT = 10.0
"""How long the interpreter's exit waits for each client left open to close."""

_STOP_TIMEOUT = 5.0  # for the loop to end once its client is out or given up on


class _Loop(Generic[C]):
    """An event loop on a daemon thread holding one entered async client.

    Not `anyio.from_thread.start_blocking_portal`: its context manager, left open, is
    finalised while the interpreter shuts down, when the loop thread can no longer run,
    and waits for that thread forever. This one is stopped by `close()` or by the exit
    hook, both with a bound where asked, and nothing waits on it after that."""

    def __init__(self, client: AbstractAsyncContextManager[C], backend: str,
                 name: str) -> None:
        self.name = name
        self.closed = False
        started: concurrent.futures.Future[BlockingPortal] = concurrent.futures.Future()

        async def serve() -> None:
            async with BlockingPortal() as portal:
                started.set_result(portal)
                await portal.sleep_until_stopped()

        def main() -> None:
            try:
                anyio.run(serve, backend=backend)
            except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
                if not started.done():
                    started.set_exception(exc)

        self._thread = threading.Thread(target=main, daemon=True, name=f"raftmq-{name}")
        self._thread.start()
        self.portal = started.result()
        self._entered: concurrent.futures.Future[C] = concurrent.futures.Future()
        self._leave: anyio.Event | None = None
        self._exc_info: tuple[Any, Any, Any] = (None, None, None)
        self._left = self.portal.start_task_soon(self._hold, client)
        try:
            self.client: C = self._entered.result()
        except BaseException:
            self._stop(cancel=True, timeout=_STOP_TIMEOUT)
            raise

    async def _hold(self, client: AbstractAsyncContextManager[C]) -> None:
        """Enter the client, wait for `close()`, leave it (errors go to `close()`)."""
        self._leave = anyio.Event()
        try:
            value = await client.__aenter__()
        except BaseException as exc:
            self._entered.set_exception(exc)
            return
        self._entered.set_result(value)
        try:
            await self._leave.wait()
        finally:
            await client.__aexit__(*self._exc_info)

    def close(self, timeout: float | None = None) -> bool:
        """Leave the client and stop the loop; False when the client did not finish
        leaving within `timeout` (its remaining work is then cancelled)."""
        if self.closed:
            return True
        self.closed = True
        _OPEN.pop(self, None)
        assert self._leave is not None
        try:
            self.portal.call(self._leave.set)
            self._left.result(timeout)
        except concurrent.futures.TimeoutError:
            self._stop(cancel=True, timeout=_STOP_TIMEOUT)
            return False
        except BaseException:
            self._stop(cancel=True, timeout=_STOP_TIMEOUT)
            raise
        self._stop(cancel=False, timeout=timeout)
        return True

    def _stop(self, cancel: bool, timeout: float | None) -> None:
        try:
            self.portal.call(self.portal.stop, cancel)
        except RuntimeError:  # the loop already ended
            pass
        self._thread.join(timeout)


_OPEN: dict[_Loop[Any], None] = {}  # in opening order; closed at exit newest first


def _close_left_open() -> None:
    """At interpreter exit: close every client nobody closed, each within
    `EXIT_CLOSE_TIMEOUT` (the loops are daemon threads: nothing waits on them after)."""
    for loop in reversed(list(_OPEN)):
        warnings.warn(f"raftmq: {loop.name} was not closed; closing it at exit",
                      ResourceWarning, stacklevel=1)
        try:
            done = loop.close(EXIT_CLOSE_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - every other client still gets closed
            warnings.warn(f"raftmq: closing {loop.name} at exit failed: {exc!r}",
                          RuntimeWarning, stacklevel=1)
            continue
        if not done:
            warnings.warn(f"raftmq: {loop.name} did not close within {EXIT_CLOSE_TIMEOUT} s "
                          f"at exit; what it had not finished was abandoned",
                          RuntimeWarning, stacklevel=1)


atexit.register(_close_left_open)


class _Blocking(Generic[C]):
    """Owns the loop thread and the async client entered inside it."""

    def __init__(self, client: AbstractAsyncContextManager[C], backend: str) -> None:
        self._loop = _Loop(client, backend, type(self).__name__)
        _OPEN[self._loop] = None
        self._portal: BlockingPortal = self._loop.portal
        self._client: C = self._loop.client

    @property
    def client(self) -> C:
        """The async client, for use from inside the portal's loop only."""
        return self._client

    @property
    def _closed(self) -> bool:
        return self._loop.closed

    def _call(self, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        return self._portal.call(functools.partial(fn, *args, **kwargs))

    def _call_sync(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """Run a plain method on the loop thread, where the client's state lives."""
        return self._call(_sync_call, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Leave the async client (flushing, committing as it does) and stop the thread."""
        self._loop.close()

    def __enter__(self: Any) -> Any:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class BlockingProducer(_Blocking[Producer]):
    """`Producer` for blocking code; takes the same arguments plus `backend`."""

    def __init__(self, namesrv: Sequence[str] | str, *, backend: str = "asyncio",
                 **kwargs: Any) -> None:
        super().__init__(Producer(namesrv, **kwargs), backend)

    def __enter__(self) -> BlockingProducer:
        return self

    def send(self, topic: str, message: OutgoingMessage | bytes | str, **kwargs: Any) -> SendResult:
        """Send and wait for the acknowledgement."""
        return self._call(self._client.send, topic, message, **kwargs)

    def send_async(
        self, topic: str, message: OutgoingMessage | bytes | str, **kwargs: Any
    ) -> concurrent.futures.Future[SendResult]:
        """Hand the message over and return a `concurrent.futures.Future` completed on
        its acknowledgement (or failure).

        As `Producer.send_async`: returns once the producer holds the message (waiting
        only for a route or for room), so messages sent from one thread keep their order
        and `flush()` / `close()` wait for every one; a bad message, name or unknown
        topic raises here."""
        out: concurrent.futures.Future[SendResult] = concurrent.futures.Future()

        def settle(fut: SendFuture[SendResult]) -> None:
            error = fut.exception()
            if error is not None:
                out.set_exception(error)
            else:
                out.set_result(fut.result())

        async def hand_over() -> None:
            fut = await self._client.send_async(topic, message, **kwargs)
            fut.add_done_callback(settle)

        self._call(hand_over)
        return out

    def send_oneway(self, topic: str, message: OutgoingMessage | bytes | str, **kwargs: Any) -> None:
        self._call(self._client.send_oneway, topic, message, **kwargs)

    def send_batch(
        self, topic: str, messages: Sequence[OutgoingMessage | bytes | str], **kwargs: Any,
    ) -> list[SendResult]:
        """Send messages and wait for every acknowledgement (`Producer.send_batch`: its
        keywords, `queue` and the delays, are the same)."""
        return self._call(self._client.send_batch, topic, messages, **kwargs)

    def flush(self) -> None:
        self._call(self._client.flush)

    def begin(self) -> BlockingTransaction:
        """Begin a transaction (needs `transactional_id`); commit or abort it."""
        return BlockingTransaction(self, self._call(self._client.begin))

    @contextmanager
    def transaction(self) -> Iterator[BlockingTransaction]:
        """`with producer.transaction() as tx:` commits on leaving, aborts (and
        re-raises) on an exception."""
        tx = self.begin()
        try:
            yield tx
        except BaseException:
            if tx.state == "open" and not self._client.fenced:
                try:
                    tx.abort()
                except Exception:  # noqa: BLE001 - the block's own error is raised
                    pass
            raise
        if tx.state == "open":
            tx.commit()

    @property
    def fenced(self) -> bool:
        return self._client.fenced

    def send_in_transaction(self, topic: str, message: OutgoingMessage | bytes | str, *,
                            local_transaction: Callable[[OutgoingMessage], Any],
                            **kwargs: Any) -> TransactionResult:
        """Half message, local transaction (a plain one runs in a worker thread), then
        commit or rollback (see `Producer.send_in_transaction`)."""
        return self._call(self._client.send_in_transaction, topic, message,
                          local_transaction=local_transaction, **kwargs)

    def prepare(self, topic: str, message: OutgoingMessage | bytes | str,
                **kwargs: Any) -> BlockingHalfHandle:
        """Store a half message; decide it later with the handle."""
        return BlockingHalfHandle(self, self._call(self._client.prepare, topic, message,
                                                   **kwargs))


class BlockingTransaction:
    """A `Transaction` driven from blocking code."""

    def __init__(self, owner: _Blocking[Any], tx: Transaction) -> None:
        self._owner = owner
        self.tx = tx

    @property
    def state(self) -> str:
        return self.tx.state

    def send(self, topic: str, message: OutgoingMessage | bytes | str,
             **kwargs: Any) -> SendResult:
        return self._owner._call(self.tx.send, topic, message, **kwargs)

    def send_batch(self, topic: str, messages: Sequence[OutgoingMessage | bytes | str],
                   **kwargs: Any) -> list[SendResult]:
        return self._owner._call(self.tx.send_batch, topic, messages, **kwargs)

    def send_offsets(self, consumer_group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        self._owner._call(self.tx.send_offsets, consumer_group, offsets)

    def commit(self) -> None:
        self._owner._call(self.tx.commit)

    def abort(self) -> None:
        self._owner._call(self.tx.abort)


class BlockingHalfHandle:
    """A `HalfHandle` driven from blocking code."""

    def __init__(self, owner: _Blocking[Any], handle: HalfHandle) -> None:
        self._owner = owner
        self.handle = handle
        self.txid = handle.txid
        self.result = handle.result

    def commit(self) -> bool:
        return self._owner._call(self.handle.commit)

    def rollback(self) -> bool:
        return self._owner._call(self.handle.rollback)


class BlockingPullConsumer(_Blocking[PullConsumer]):
    """`PullConsumer` for blocking code; takes the same arguments plus `backend`."""

    def __init__(self, namesrv: Sequence[str] | str, group: str, *, backend: str = "asyncio",
                 **kwargs: Any) -> None:
        super().__init__(PullConsumer(namesrv, group, **kwargs), backend)

    def __enter__(self) -> BlockingPullConsumer:
        return self

    def assign(self, topic: str, queues: Iterable[int] | None = None, *,
               tags: Selector = None, sql: str | None = None) -> None:
        self._call_sync(self._client.assign, topic, queues, tags=tags, sql=sql)

    def unassign(self, topic: str) -> None:
        """Stop reading `topic` (its positions are forgotten)."""
        self._call_sync(self._client.unassign, topic)

    def subscribe(self, topics: Sequence[str] | Mapping[str, Selector], *,
                  on_assign: QueuesCallback | None = None,
                  on_revoke: QueuesCallback | None = None) -> None:
        """Let the group share `topics`' queues (see `PullConsumer.subscribe`); plain
        callbacks run in a worker thread, so they may call this consumer's methods."""
        self._call_sync(self._client.subscribe, topics, on_assign=on_assign,
                        on_revoke=on_revoke)

    def unsubscribe(self) -> None:
        self._call(self._client.unsubscribe)

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, queue) pairs assigned (all of a topic's queues when none were named)."""
        return self._call(self._client.assignment)

    def bounds(self, topic: str, queue: int) -> tuple[int, int]:
        """(earliest retained offset, end offset) of a queue."""
        return self._call(self._client.bounds, topic, queue)

    @property
    def unreadable(self) -> dict[tuple[str, int], RequestError]:
        """Queues the last polls could not read (see `PullConsumer.unreadable`)."""
        return self._call_sync(lambda: dict(self._client.unreadable))

    def pause(self, topic: str, queues: Iterable[int] | None = None) -> None:
        """`poll` skips these queues until `resume` (see `PullConsumer.pause`)."""
        self._call_sync(self._client.pause, topic, queues)

    def resume(self, topic: str, queues: Iterable[int] | None = None) -> None:
        self._call_sync(self._client.resume, topic, queues)

    def paused(self) -> list[tuple[str, int | None]]:
        return self._call_sync(self._client.paused)

    def silent(self) -> list[tuple[str, int]]:
        """Queues not answering yet, not for long enough to be unreadable."""
        return self._call_sync(self._client.silent)

    def poll(self, timeout: float = 1.0, **kwargs: Any) -> list[Message]:
        return self._call(self._client.poll, timeout, **kwargs)

    def pull(self, topic: str, queue: int, offset: int | None = None, **kwargs: Any) -> PullResult:
        return self._call(self._client.pull, topic, queue, offset, **kwargs)

    def commit(self, topic: str, queue: int, offset: int, *,
               timeout: float | None = None) -> None:
        self._call(self._client.commit, topic, queue, offset, timeout=timeout)

    def commit_all(self, *, timeout: float | None = None) -> None:
        self._call(self._client.commit_all, timeout=timeout)

    def committed(self, topic: str, queue: int) -> int:
        return self._call(self._client.committed, topic, queue)

    def position(self, topic: str, queue: int) -> int | None:
        return self._call_sync(self._client.position, topic, queue)

    def seek(self, topic: str, queue: int, offset: int) -> None:
        self._call_sync(self._client.seek, topic, queue, offset)


class BlockingPushConsumer(_Blocking[PushConsumer]):
    """`PushConsumer` consuming on the portal thread until `close()`; a plain handler
    runs in worker threads, so it may block."""

    def __init__(self, namesrv: Sequence[str] | str, group: str, topics: Any, handler: Any, *,
                 backend: str = "asyncio", **kwargs: Any) -> None:
        super().__init__(PushConsumer(namesrv, group, topics, handler, **kwargs), backend)

    def __enter__(self) -> BlockingPushConsumer:
        return self

    def assignment(self) -> list[tuple[str, int]]:
        return self._call_sync(self._client.assignment)

    def rebalance(self) -> None:
        self._call(self._client.rebalance)

    def pause(self) -> None:
        """Hand the handler no more messages until `resume()` (see `PushConsumer.pause`)."""
        self._call_sync(self._client.pause)

    def resume(self) -> None:
        self._call_sync(self._client.resume)

    @property
    def paused(self) -> bool:
        return self._call_sync(lambda: self._client.paused)

    def commit_now(self) -> None:
        self._call(self._client.commit_now)

    def held(self) -> list[Held]:
        """The queues an orderly consumer holds at a failing message (see
        `PushConsumer.held`)."""
        return self._call_sync(self._client.held)


class BlockingSimpleConsumer(_Blocking[SimpleConsumer]):
    """`SimpleConsumer` for blocking code; takes the same arguments plus `backend`. Its
    calls may be made from several threads at once (acks of one queue made together
    still go in one request)."""

    def __init__(self, namesrv: Sequence[str] | str, group: str, *, backend: str = "asyncio",
                 **kwargs: Any) -> None:
        super().__init__(SimpleConsumer(namesrv, group, **kwargs), backend)

    def __enter__(self) -> BlockingSimpleConsumer:
        return self

    def receive(self, topic: str, max: int = 32, *, invisible: float | None = None,
                wait: float | None = None, selector: Selector | None = None
                ) -> list[ReceivedMessage]:
        return self._call(self._client.receive, topic, max, invisible=invisible, wait=wait,
                          selector=selector)

    def ack(self, msg: ReceivedMessage | Receipt) -> None:
        self._call(self._client.ack, msg)

    def nack(self, msg: ReceivedMessage | Receipt, *, delay: float | None = None,
             error: str | None = None) -> None:
        self._call(self._client.nack, msg, delay=delay, error=error)

    def change_invisible(self, msg: ReceivedMessage | Receipt, seconds: float) -> None:
        self._call(self._client.change_invisible, msg, seconds)

    def dead_letter(self, msg: ReceivedMessage | Receipt, error: str) -> None:
        self._call(self._client.dead_letter, msg, error)


class BlockingAdmin(_Blocking[Admin]):
    """`Admin` for blocking code; takes the same arguments plus `backend`."""

    def __init__(self, namesrv: Sequence[str] | str, *, backend: str = "asyncio",
                 **kwargs: Any) -> None:
        super().__init__(Admin(namesrv, **kwargs), backend)

    def __enter__(self) -> BlockingAdmin:
        return self

    def create_topic(self, topic: str, queues: int = 4, groups: Sequence[str] | None = None,
                     **kwargs: Any) -> dict[str, list[int]]:
        return self._call(self._client.create_topic, topic, queues, groups, **kwargs)

    def describe_topic(self, topic: str) -> TopicInfo:
        return self._call(self._client.describe_topic, topic)

    def list_topics(self) -> dict[str, dict[str, Any]]:
        return self._call(self._client.list_topics)

    def describe_cluster(self) -> dict[str, Any]:
        return self._call(self._client.describe_cluster)

    def get_message(self, msg_id: str) -> Message:
        """The message with this id (see `Admin.get_message`)."""
        return self._call(self._client.get_message, msg_id)

    def query_key(self, topic: str, key: str, **kwargs: Any) -> list[Message]:
        """Messages of `topic` with this key (see `Admin.query_key`)."""
        return self._call(self._client.query_key, topic, key, **kwargs)

    def trace(self, msg_id: str) -> list[TraceRecord]:
        """One traced message's trace records (see `Admin.trace`)."""
        return self._call(self._client.trace, msg_id)

    def offsets_for_times(self, times: Mapping[tuple[str, int], int]
                          ) -> dict[tuple[str, int], int]:
        """The first offset stored at or after each time (see `Admin.offsets_for_times`)."""
        return self._call(self._client.offsets_for_times, times)

    def messages_stored_between(self, topic: str, start_ms: int, end_ms: int,
                                **kwargs: Any) -> list[Message]:
        """Messages stored in a window (see `Admin.messages_stored_between`)."""
        return self._call(self._client.messages_stored_between, topic, start_ms, end_ms,
                          **kwargs)

    def committed_offset(self, group: str, topic: str, queue: int) -> int:
        return self._call(self._client.committed_offset, group, topic, queue)

    def consumer_lag(self, group: str, topic: str) -> dict[int, QueueLag]:
        return self._call(self._client.consumer_lag, group, topic)

    def consumers(self, group: str) -> list[str]:
        return self._call(self._client.consumers, group)

    def node_status(self, addr: str) -> dict[str, Any]:
        return self._call(self._client.node_status, addr)

    def transfer_leader(self, group: str, to: int, *, prefer: bool = True) -> None:
        self._call(self._client.transfer_leader, group, to, prefer=prefer)

    def group_members(self, group: str, **kwargs: Any) -> GroupMembers:
        return self._call(self._client.group_members, group, **kwargs)

    def add_replica(self, group: str, node: int, **kwargs: Any) -> GroupMembers:
        return self._call(self._client.add_replica, group, node, **kwargs)

    def remove_replica(self, group: str, node: int) -> GroupMembers:
        return self._call(self._client.remove_replica, group, node)

    def replace_replica(self, group: str, old: int, new: int, **kwargs: Any) -> GroupMembers:
        return self._call(self._client.replace_replica, group, old, new, **kwargs)

    def delete_topic(self, topic: str, **kwargs: Any) -> list[str]:
        return self._call(self._client.delete_topic, topic, **kwargs)

    def add_queues(self, topic: str, queues: int, **kwargs: Any) -> dict[str, list[int]]:
        return self._call(self._client.add_queues, topic, queues, **kwargs)

    def group_offsets(self, group: str | None = None) -> dict[str, dict[tuple[str, int], int]]:
        return self._call(self._client.group_offsets, group)

    def describe_group(self, group: str) -> tuple[list[str], list[GroupQueue]]:
        return self._call(self._client.describe_group, group)

    def queue_locks(self, group: str | None = None) -> list[QueueLock]:
        return self._call(self._client.queue_locks, group)

    def reset_offsets(self, group: str, topic: str, to: str | int, *,
                      dry_run: bool = False) -> dict[int, tuple[int, int]]:
        return self._call(self._client.reset_offsets, group, topic, to, dry_run=dry_run)

    def delete_group(self, group: str) -> int:
        return self._call(self._client.delete_group, group)

    def dlq_list(self, group: str, **kwargs: Any) -> list[DeadLetter]:
        return self._call(self._client.dlq_list, group, **kwargs)

    def dlq_show(self, group: str, id: str) -> DeadLetter:
        return self._call(self._client.dlq_show, group, id)

    def dlq_resend(self, group: str, ids: Sequence[str] | str) -> int:
        return self._call(self._client.dlq_resend, group, ids)

    def dlq_purge(self, group: str, ids: Sequence[str] | str) -> int:
        return self._call(self._client.dlq_purge, group, ids)

    def tx_list(self, id: str | None = None, **kwargs: Any) -> TxListing:
        return self._call(self._client.tx_list, id, **kwargs)

    def tx_show(self, id: str) -> dict[str, list[dict[str, Any]]]:
        return self._call(self._client.tx_show, id)

    def tx_commit(self, txid: str) -> bool:
        return self._call(self._client.tx_commit, txid)

    def tx_rollback(self, txid: str) -> bool:
        return self._call(self._client.tx_rollback, txid)


async def _sync_call(fn: Callable[[], R]) -> R:
    return fn()


def connect_producer(namesrv: Sequence[str] | str, **kwargs: Any) -> BlockingProducer:
    """A blocking producer, open until `close()` (or the end of a `with` block)."""
    return BlockingProducer(namesrv, **kwargs)


def connect_pull_consumer(namesrv: Sequence[str] | str, group: str,
                          **kwargs: Any) -> BlockingPullConsumer:
    return BlockingPullConsumer(namesrv, group, **kwargs)


def connect_push_consumer(namesrv: Sequence[str] | str, group: str, topics: Any, handler: Any,
                          **kwargs: Any) -> BlockingPushConsumer:
    return BlockingPushConsumer(namesrv, group, topics, handler, **kwargs)


def connect_simple_consumer(namesrv: Sequence[str] | str, group: str,
                            **kwargs: Any) -> BlockingSimpleConsumer:
    """A blocking simple consumer, open until `close()` (or the end of a `with` block)."""
    return BlockingSimpleConsumer(namesrv, group, **kwargs)


def connect_admin(namesrv: Sequence[str] | str, **kwargs: Any) -> BlockingAdmin:
    return BlockingAdmin(namesrv, **kwargs)
