"""What the `raftmq` Spark source asks the cluster: which queues a query reads and their
bounds (on the driver), and the messages of one offset range (on an executor).

Everything goes through the SDK's public read path (`raftmq.client.consumer.fetch` and
`queue_bounds`), so it finds leaders, follows NOT_LEADER and retries the way every client
does. FETCH serves committed messages only, so a read never sees a write a failover could
take back; and since committed offsets never change, reading a range twice gives the same
rows (what Spark's retries and micro-batch replays rely on).
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections.abc import Generator

import anyio
import pyarrow as pa
from anyio.from_thread import start_blocking_portal

from raftmq.client import Admin
from raftmq.client.consumer import fetch_answer, queue_bounds
from raftmq.client.routes import Routes
from transport.connection import is_retriable
from wire.protocol import Code, RequestError

from .arrow_fetch import fetch_to_batch
from .options import Offsets, OptionError, QueueRange, SourceOptions, Times, times_for
from .schema import ALL_COLUMNS, Columns

__all__ = ["DataLossError", "discover", "offsets_at_times", "read_range"]

log = logging.getLogger("raftmq.spark")

FETCH_COUNT = 1024  # the broker's most messages per FETCH (broker.doors.service.MAX_FETCH_COUNT)
FETCH_BYTES = 8 << 20  # the broker's most bytes per FETCH
_BOUNDS_CONCURRENCY = 32
_RETRY_PAUSE = 0.1

Bounds = dict[tuple[str, int], tuple[int, int]]


class DataLossError(RuntimeError):
    """Offsets a query must read are gone (removed by retention, or their topic deleted)
    and `failOnDataLoss` is true."""


def data_loss_message(topic: str, queue: int, start: int, stop: int, why: str) -> str:
    return (f"{topic} queue {queue}: offsets {start}..{stop - 1} {why}; set failOnDataLoss "
            "to false to skip what is gone and read on")


async def _queues(admin: Admin, opts: SourceOptions) -> list[tuple[str, int]]:
    routes = admin.routes
    if opts.assign is not None:
        out: list[tuple[str, int]] = []
        for topic, queues in sorted(opts.assign.items()):
            total = (await routes.route(topic, refresh=True)).total
            missing = [q for q in queues if q >= total]
            if missing:
                raise OptionError(f"assign: {topic!r} has queues 0..{total - 1}, not {missing}")
            out.extend((topic, q) for q in queues)
        return out
    if opts.subscribe is not None:
        topics = list(opts.subscribe)
    else:
        topics = [t for t in await admin.list_topics() if opts.matches(t)]
    out = []
    for topic in sorted(topics):
        try:
            route = await routes.route(topic, refresh=True)
        except RequestError as exc:
            if exc.code != Code.UNKNOWN_TOPIC:
                raise
            log.warning("raftmq source: topic %r does not exist (yet): nothing to read", topic)
            continue
        out.extend((topic, q) for q in range(route.total))
    return out


async def _discover(opts: SourceOptions) -> Bounds:
    async with Admin(list(opts.namesrv)) as admin:
        queues = await _queues(admin, opts)
        bounds: Bounds = {}
        limiter = anyio.CapacityLimiter(_BOUNDS_CONCURRENCY)

        async def one(topic: str, queue: int) -> None:
            # a queue whose group is electing a leader answers once it has one
            deadline = time.monotonic() + opts.fetch_timeout
            while True:
                try:
                    async with limiter:
                        bounds[(topic, queue)] = await queue_bounds(admin.routes, topic, queue)
                    return
                except RequestError as exc:
                    if not is_retriable(exc) or time.monotonic() > deadline:
                        raise
                await anyio.sleep(_RETRY_PAUSE)

        async with anyio.create_task_group() as tg:
            for topic, queue in queues:
                tg.start_soon(one, topic, queue)
        return dict(sorted(bounds.items()))


def discover(opts: SourceOptions) -> Bounds:
    """(topic, queue) -> (min, end) of every queue the options select, asked of the
    queues' leaders now (a blocking call, for the driver)."""
    return anyio.run(_discover, opts)


async def _offsets_for_times(namesrv: tuple[str, ...], times: dict[tuple[str, int], int]
                             ) -> dict[tuple[str, int], int]:
    async with Admin(list(namesrv)) as admin:
        return await admin.offsets_for_times(times)


def offsets_at_times(opts: SourceOptions, bounds: Bounds, times: Times, *, ending: bool
                     ) -> Offsets:
    """The offsets a query starts (`ending` false) or ends at for store `times`, once,
    on the driver, with the nodes' time index: the first offset stored at or after the
    time. A queue `times` leaves out starts at its earliest offset or ends at `bounds`'
    end; an end is kept within `bounds`. A start with nothing stored at or after its time
    fails the query (`startingOffsetsByTimestampStrategy` error) or is the queue's end
    (latest)."""
    name = "endingTimestamp" if ending else "startingTimestamp"
    wanted = times_for(times, bounds, name)
    found = anyio.run(_offsets_for_times, opts.namesrv, wanted) if wanted else {}
    out: Offsets = {}
    for (topic, q), (lo, hi) in sorted(bounds.items()):
        off = found.get((topic, q))
        if off is None:
            off = hi if ending else lo
        elif ending:
            off = min(off, hi)
        elif off >= hi and opts.missing_start == "error":
            raise OptionError(f"{name}: {topic!r} queue {q} has no message stored at or "
                              f"after {wanted[(topic, q)]} (set "
                              "startingOffsetsByTimestampStrategy to latest to start such "
                              "a queue at its end)")
        out.setdefault(topic, {})[q] = off
    return out


async def _fetch_from(routes: Routes, r: QueueRange, offset: int, fail_on_data_loss: bool,
                      timeout: float, tags: tuple[str, ...] | None,
                      columns: Columns = ALL_COLUMNS,
                      sql: str | None = None) -> tuple[pa.RecordBatch | None, int]:
    """The next messages of `r` at `offset` as a record batch (decoded straight from the
    answer, `fetch_to_batch`), and where to continue. Waits out a new leader that has not
    applied up to `r.end` yet (the range was committed, so it will); a start removed by
    retention is a `DataLossError` or a skip to the earliest offset."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            group, h, body = await fetch_answer(
                routes, r.topic, r.queue, offset, max_messages=min(FETCH_COUNT, r.end - offset),
                max_bytes=FETCH_BYTES, wait_ms=0, tags=tags, sql=sql)
            rows = h.get("msgs") or []
            nxt = int(h.get("next", int(rows[-1][0]) + 1 if rows else offset))
            if rows or nxt > offset:  # (a tag or SQL92 filter may skip without a match)
                return fetch_to_batch(r.topic, r.queue, group, h, body, tags=tags,
                                      end=r.end, columns=columns), nxt
        except RequestError as exc:
            if exc.code == Code.OFFSET_TOO_SMALL and "min" in exc.extra:
                lo = min(int(exc.extra["min"]), r.end)
                msg = data_loss_message(r.topic, r.queue, offset, lo,
                                        "were removed by retention")
                if fail_on_data_loss:
                    raise DataLossError(msg) from None
                log.warning("raftmq source: skipping: %s", msg)
                return None, lo
            if exc.code == Code.UNKNOWN_TOPIC:
                msg = data_loss_message(r.topic, r.queue, offset, r.end,
                                        "are gone with their topic")
                if fail_on_data_loss:
                    raise DataLossError(msg) from None
                log.warning("raftmq source: skipping: %s", msg)
                return None, r.end
            if exc.code != Code.OFFSET_TOO_LARGE and not is_retriable(exc):
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{r.topic} queue {r.queue}: no message at committed offset "
                               f"{offset} (of {r.start}..{r.end - 1}) within {timeout:g} s")
        await anyio.sleep(_RETRY_PAUSE)


READ_AHEAD = 2  # decoded FETCH answers waiting for Spark's thread, at most
_HAND_OVER_POLL = 0.05  # s: how often a hand-over blocked on a full queue looks for a stop
_TAKE_POLL = 1.0  # s: how often Spark's thread, waiting for a batch, checks the task is alive


def read_range(r: QueueRange, namesrv: tuple[str, ...], *, fail_on_data_loss: bool,
               timeout: float, tags: tuple[str, ...] | None = None,
               columns: Columns = ALL_COLUMNS,
               sql: str | None = None) -> Generator[pa.RecordBatch, None, None]:
    """The messages of `r` as Arrow record batches of `columns`, one per FETCH (only those
    SQL92 filter `sql` matches, decided on the broker, when given), in offset order.

    One task on the client's own event-loop thread fetches and decodes the range and
    queues the batches, up to `READ_AHEAD` of them, while Spark's thread takes them from the
    queue: that thread never calls into the loop per batch (starting each FETCH from it
    was a blocking round trip to the loop thread, costing a Spark worker about as much CPU
    as the FETCH itself)."""
    _freeze_survivors()
    ready: queue.Queue[pa.RecordBatch | BaseException | None] = queue.Queue(READ_AHEAD)
    stopped = threading.Event()

    def put_blocking(item: pa.RecordBatch | BaseException | None) -> bool:
        while not stopped.is_set():
            try:
                ready.put(item, timeout=_HAND_OVER_POLL)
                return True
            except queue.Full:
                pass
        return False

    async def hand_over(item: pa.RecordBatch | BaseException | None) -> bool:
        """Queue `item` for Spark's thread, waiting (in a worker thread) while the queue
        is full; false once the reader stopped."""
        try:
            ready.put_nowait(item)
            return True
        except queue.Full:
            return await anyio.to_thread.run_sync(put_blocking, item)

    async def produce(routes: Routes) -> None:
        offset = r.start
        try:
            while offset < r.end:
                batch, offset = await _fetch_from(routes, r, offset, fail_on_data_loss,
                                                  timeout, tags, columns, sql)
                if batch is not None and batch.num_rows and not await hand_over(batch):
                    return
        except Exception as exc:  # raised again in Spark's thread, where it fails the task
            await hand_over(exc)
            return
        await hand_over(None)

    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Admin(list(namesrv))) as admin:
            task = portal.start_task_soon(produce, admin.routes)
            try:
                while True:
                    try:
                        item = ready.get(timeout=_TAKE_POLL)
                    except queue.Empty:
                        # the task hands over an end or an error before it finishes, so
                        # finished with nothing queued, it was cancelled (the loop closed)
                        if task.done() and ready.empty():
                            task.result()
                            raise RuntimeError(f"{r.topic} queue {r.queue}: the read "
                                               "stopped before its end") from None
                        continue
                    if item is None:
                        break
                    if isinstance(item, BaseException):
                        raise item
                    yield item
            finally:  # (also when the reader stopped early: a LIMIT, a failure)
                stopped.set()
                task.cancel()


def _freeze_survivors() -> None:
    """Move every object alive now out of the cyclic garbage collector's sight
    (`gc.freeze`).

    PySpark's worker runs a full `gc.collect()` after each task it is reused for, and
    with pyarrow, PySpark and the client loaded that walks some 75,000 objects: about 40 ms
    a task, 0.3 µs a row of a 125,000-message partition. A read starts right after such a
    collection, so what is alive then is what the worker keeps (modules, classes); frozen,
    it is skipped by every later collection. Reference counting still frees those objects;
    only a cycle among them that becomes garbage would stay."""
    gc.freeze()
