"""`df.write.format("raftmq")` and `df.writeStream.format("raftmq")`: a PySpark Python
Data Source sink, exactly-once by default (`raftmq.spark.sink_options` has the columns
and options).

Exactly-once protocol
---------------------
Spark runs a (micro-)batch as one task per partition on the executors, then calls the
driver-side `commit(messages, batch_id)` with what each task returned, or `abort` when a
task failed for good. A task may run more than once (a retry after a failure, a
speculative copy beside a slow one), and after a crash a restarted query replays its
last micro-batch, whose offsets it logged before running it, under the same batch id and
with the same input. The sink makes every write of rows idempotent per (query, batch id,
partition), so a rerun writes nothing a finished run wrote:

1. A task of partition p of batch b of query Q uses the transactional id
   ``raftmq-spark-Q-p``. Registering it (TX_INIT, the first `begin`) fences every other
   producer of the id: an earlier attempt's open transaction is aborted then, and an
   attempt still running can no longer send or commit.
2. Only then it reads its progress: the partition has a one-queue topic of its own,
   ``raftmq-spark.Q.p`` (made on first use), holding one progress message per
   transaction it committed, ``{"batch": b, "chunks": n}``, and the committed offset of
   consumer group ``raftmq-spark.Q.p`` there names the last of them. Offsets sent in a
   transaction apply only with its commit, and a query of them waits while such a
   transaction is undecided, so this is what committed, nothing else.
3. It cuts its rows into chunks of `transactionRows` (a transaction holds at most
   10,000 messages) and writes each chunk in one transaction together with the progress
   message (b, chunk + 1) and the offset pointing at it (`Transaction.send_offsets`; the
   partition's queue takes nothing else, so that message's offset is known before it is
   stored). Chunks the progress says are done (same batch) are skipped. Progress of a
   later batch is an error: Spark never replays an older batch, so another query (or a
   fresh checkpoint) uses the same `queryName`.
4. The task returns a `SinkCommit` naming what it wrote and skipped; the driver's
   `commit` only checks and logs them. Everything the protocol needs is in the cluster
   and in the commit messages, none in the writer object (Spark makes a new one for each
   commit), and the driver has nothing left to decide: a chunk's rows become visible when
   its transaction commits.

What happens when
- a task fails and is retried: the retry fences the failed attempt (aborting its open
  transaction), skips the chunks that attempt committed and writes the rest;
- a task runs speculatively twice: whichever registers the id last fences the other; if
  the other committed first, the progress record says so and its rows are skipped, else
  its transaction is aborted and cannot commit. Either way each chunk commits once;
- the driver crashes between the tasks' commits and Spark's batch commit (or Spark
  aborts the batch): the committed chunks stay; the restarted query replays the batch
  with the same id and the same input, every task finds its progress and writes only
  what was not committed;
- the query (or an executor) is killed mid-transaction: its open transaction is never
  visible; the next attempt's TX_INIT aborts it (else its timeout does).

Limits: a replay must split the batch into the same partitions with the same rows in the
same order (true of a replayable source read through a deterministic plan: raftmq, Kafka,
files; not of a non-deterministic repartition); a batch is visible per chunk, not all at
once (a reader may see part of a micro-batch before Spark records it done); `queryName`
and `transactionRows` must stay the same across restarts of one query, and two queries
must not share a `queryName`.

At-least-once (``deliveryGuarantee=atLeastOnce``): a plain idempotent producer, no
transactions and no progress records; a retried task or a replayed batch sends its rows
again, so they may be stored twice.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from raftmq.client import Admin, Producer
from raftmq.client.consumer import fetch
from raftmq.client.routes import TopicRoute
from wire.protocol import Code, RequestError
from wire.records import OutgoingMessage

from .options import OptionError
from .sink_options import SinkOptions, check_schema, parse_sink_options

try:  # PySpark >= 4.1: a stream writer handed Arrow batches
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - PySpark 4.0: rows
    from pyspark.sql.datasource import (  # type: ignore[assignment]
        DataSourceStreamWriter as _StreamWriterBase,
    )

__all__ = ["RaftmqBatchWriter", "RaftmqStreamWriter", "SinkCommit", "SinkError",
           "batch_writer", "stream_writer"]

log = logging.getLogger("raftmq.spark")

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark's local property for a micro-batch's tasks
MAX_PENDING_SENDS = 4096  # at-least-once: acknowledgements awaited once this many are out


class SinkError(ValueError):
    """A row the sink cannot write (a null value, an unknown topic or queue)."""


@dataclass(frozen=True, slots=True)
class SinkCommit(WriterCommitMessage):
    """What one task did, for the driver's `commit`/`abort`: everything it needs."""

    query: str
    batch_id: int
    partition: int
    attempt: int
    written: int  # rows this attempt committed (at-least-once: sent and acknowledged)
    skipped: int  # rows an earlier run had committed already
    transactions: tuple[tuple[str, int, int], ...] = field(default=())  # (tid, epoch, n)


@dataclass(frozen=True, slots=True)
class Progress:
    """A partition's progress: the first `chunks` chunks of batch `batch_id` committed."""

    batch_id: int
    chunks: int

    def done(self, batch_id: int, chunk: int) -> bool:
        """Whether chunk `chunk` (from 0) of `batch_id` committed already."""
        return self.batch_id == batch_id and chunk < self.chunks


def transactional_id(query: str, partition: int) -> str:
    return f"raftmq-spark-{query}-{partition}"


def progress_topic(query: str, partition: int) -> str:
    """The partition's progress topic; its consumer group has the same name."""
    return f"raftmq-spark.{query}.{partition}"


# ---------------------------------------------------------------- rows


Out = tuple[str | None, int | None, OutgoingMessage, datetime | None]
"""One row to send: topic (None: the `topic` option), queue (None: the producer picks),
the message, and when it is due (None: at once; the `deliverAt` column)."""


def _columns(item: Any, columns: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Each row as {column name in lower case: value} (Spark's names are case-blind)."""
    if isinstance(item, pa.RecordBatch):
        names = item.schema.names
        lists = {c.lower(): item.column(names.index(c)).to_pylist()
                 for c in columns if c in names}
        for i in range(item.num_rows):
            yield {c: v[i] for c, v in lists.items()}
    else:  # a pyspark Row (PySpark 4.0's stream writer)
        yield {c.lower(): item[c] for c in columns}


def to_messages(items: Iterable[Any], columns: tuple[str, ...]) -> Iterator[Out]:
    """The rows (Arrow batches or Rows) as messages, each checked: a null `value`, a
    negative queue or a null property value is a `SinkError`."""
    n = 0
    for item in items:
        for row in _columns(item, columns):
            value = row.get("value")
            if value is None:
                raise SinkError(f"row {n} of this partition has a null 'value'")
            body = value.encode() if isinstance(value, str) else bytes(value)
            props = row.get("properties")
            if isinstance(props, dict):
                props = list(props.items())
            properties = {}
            for k, v in props or ():
                if v is None:
                    raise SinkError(f"row {n}: property {k!r} is null (properties are text)")
                properties[k] = v
            queue = row.get("queue")
            if queue is not None and queue < 0:
                raise SinkError(f"row {n}: queue {queue} is negative")
            at = row.get("deliverat")
            if at is not None and at.tzinfo is None:  # Arrow's UTC timestamps come naive
                at = at.replace(tzinfo=UTC)
            yield row.get("topic"), queue, OutgoingMessage(
                body, key=row.get("key") or "", tags=row.get("tags") or "",
                properties=properties), at
            n += 1


def chunks(rows: Iterator[Out], size: int) -> Iterator[list[Out]]:
    """Consecutive lists of `size` rows (the last may be shorter): the same cuts for the
    same rows, which a replay relies on."""
    chunk: list[Out] = []
    for r in rows:
        chunk.append(r)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class Targets:
    """Checks where rows go (the topic exists, the queue is one of its queues) with
    routes cached per topic."""

    def __init__(self, admin: Admin, default_topic: str | None) -> None:
        self.admin = admin
        self.default = default_topic
        self.routes: dict[str, TopicRoute] = {}

    async def check(self, topic: str | None, queue: int | None) -> str:
        t = topic if topic is not None else self.default
        if t is None:
            raise SinkError("a row has a null 'topic' and there is no 'topic' option")
        route = self.routes.get(t)
        if route is None:
            route = self.routes[t] = await route_of(self.admin, t)
        if queue is not None and queue >= route.total:
            raise SinkError(f"topic {t!r} has queues 0..{route.total - 1}, not {queue}")
        return t


async def route_of(admin: Admin, topic: str) -> TopicRoute:
    try:
        return await admin.routes.route(topic, refresh=True)
    except RequestError as exc:
        if exc.code in (Code.UNKNOWN_TOPIC, Code.INVALID_NAME):
            raise SinkError(f"topic {topic!r} does not exist ({exc.message}); create it "
                            f"first (raftmq topic create {topic} ...)") from None
        raise


# ---------------------------------------------------------------- one task


@dataclass(frozen=True, slots=True)
class Task:
    opts: SinkOptions
    columns: tuple[str, ...]
    query: str
    batch_id: int
    partition: int
    attempt: int


async def _pause(opts: SinkOptions) -> None:
    if opts.test_pause_ms:
        await anyio.sleep(opts.test_pause_ms / 1000)


async def ensure_topic(admin: Admin, topic: str) -> None:
    try:
        await admin.routes.route(topic, refresh=True)
    except RequestError as exc:
        if exc.code != Code.UNKNOWN_TOPIC:
            raise
        await admin.create_topic(topic, 1, exist_ok=True)


async def read_progress(admin: Admin, topic: str) -> tuple[Progress | None, int]:
    """The partition's last committed progress, and the offset its next one takes."""
    at = await admin.committed_offset(topic, topic, 0)
    if at < 0:
        return None, 0
    try:
        res = await fetch(admin.routes, topic, 0, at, max_messages=1, wait_ms=0)
    except RequestError as exc:
        if exc.code != Code.OFFSET_TOO_SMALL:
            raise
        log.warning("raftmq sink: the progress at %s offset %d was removed by retention; "
                    "taken to be of an earlier batch", topic, at)
        return None, at + 1
    if not res.messages or res.messages[0].offset != at:
        raise RuntimeError(f"{topic}: no progress message at committed offset {at}")
    raw = json.loads(res.messages[0].body)
    return Progress(int(raw["batch"]), int(raw["chunks"])), at + 1


async def write_exactly_once(task: Task, items: Iterable[Any]) -> SinkCommit:
    """Steps 1-3 of the protocol (module docstring) for one task."""
    opts = task.opts
    rows = to_messages(items, task.columns)
    first = next(rows, None)
    if first is None:  # nothing to write, and no earlier attempt wrote anything either
        return SinkCommit(task.query, task.batch_id, task.partition, task.attempt, 0, 0)
    rows = _prepend(first, rows)
    tid = transactional_id(task.query, task.partition)
    mark = progress_topic(task.query, task.partition)
    written = skipped = 0
    done: list[tuple[str, int, int]] = []
    async with Admin(list(opts.namesrv)) as admin, \
            Producer(list(opts.namesrv), transactional_id=tid) as producer:
        await ensure_topic(admin, mark)
        targets = Targets(admin, opts.topic)
        tx: Any = await producer.begin()  # registers the id: fences every other attempt
        progress, at = await read_progress(admin, mark)
        if progress is not None and progress.batch_id > task.batch_id:
            raise SinkError(
                f"query {task.query!r} partition {task.partition} wrote batch "
                f"{progress.batch_id} already, and this is batch {task.batch_id}: Spark never "
                "replays a batch older than its last, so another query (or a new checkpoint) "
                "uses this queryName; give each query its own")
        for i, chunk in enumerate(chunks(rows, opts.transaction_rows)):
            if progress is not None and progress.done(task.batch_id, i):
                skipped += len(chunk)
                continue
            sends = [(await targets.check(t, q), q, m, due) for t, q, m, due in chunk]
            tx = tx or await producer.begin()
            try:
                for t, q, m, due in sends:
                    await tx.send_async(t, m, queue=q, deliver_at=due)
                note = json.dumps({"batch": task.batch_id, "chunks": i + 1}).encode()
                await tx.send_async(mark, note, queue=0)
                await tx.send_offsets(mark, {(mark, 0): at})
                await _pause(opts)
                await tx.commit()
            except BaseException:
                if tx.state == "open":
                    with anyio.CancelScope(shield=True):
                        await tx.abort()
                raise
            done.append(tx.id)
            written += len(chunk)
            at += 1
            tx = None
            await _pause(opts)
        if tx is not None:  # every chunk was done already: end the empty transaction
            await tx.commit()
    return SinkCommit(task.query, task.batch_id, task.partition, task.attempt, written,
                      skipped, tuple(done))


async def write_at_least_once(task: Task, items: Iterable[Any]) -> SinkCommit:
    """Every row sent with an idempotent producer and acknowledged before the task ends;
    a rerun sends them again."""
    opts = task.opts
    written = 0
    async with Admin(list(opts.namesrv)) as admin, \
            Producer(list(opts.namesrv), idempotent=True) as producer:
        targets = Targets(admin, opts.topic)
        pending: list[Any] = []
        for t, q, m, due in to_messages(items, task.columns):
            pending.append(await producer.send_async(await targets.check(t, q), m, queue=q,
                                                     deliver_at=due))
            if len(pending) >= MAX_PENDING_SENDS:
                for fut in pending:
                    await fut
                written += len(pending)
                pending = []
                await _pause(opts)
        for fut in pending:
            await fut
        written += len(pending)
        await _pause(opts)
    return SinkCommit(task.query, task.batch_id, task.partition, task.attempt, written, 0)


def _prepend(first: Out, rest: Iterator[Out]) -> Iterator[Out]:
    yield first
    yield from rest


def run_task(task: Task, items: Iterable[Any]) -> SinkCommit:
    fn = write_exactly_once if task.opts.exactly_once else write_at_least_once
    return anyio.run(fn, task, items)


# ---------------------------------------------------------------- the driver's side


async def _prepare(opts: SinkOptions) -> None:
    """Checks against the cluster before any task starts: the `topic` option names a
    topic."""
    async with Admin(list(opts.namesrv)) as admin:
        if opts.topic is not None:
            await route_of(admin, opts.topic)


async def _drop_progress(opts: SinkOptions, query: str) -> None:
    prefix = progress_topic(query, 0)[:-1]
    async with Admin(list(opts.namesrv)) as admin:
        for t in await admin.list_topics():
            if t.startswith(prefix):
                await admin.delete_topic(t)


def _task_context() -> tuple[int, int, TaskContext]:
    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - write() runs in a Spark task
        raise RuntimeError("the raftmq sink's write() runs in a Spark task")
    return ctx.partitionId(), ctx.attemptNumber(), ctx


def _summary(messages: list[Any], batch_id: int) -> tuple[int, int, list[int]]:
    ours = [m for m in messages if isinstance(m, SinkCommit)]
    for m in ours:
        if m.batch_id != batch_id:
            raise RuntimeError(f"a commit message of batch {m.batch_id} came to the commit of "
                               f"batch {batch_id}")
    return (sum(m.written for m in ours), sum(m.skipped for m in ours),
            sorted(m.partition for m in ours))


class _Driver:
    opts: SinkOptions
    query: str

    def _commit(self, messages: list[Any], batch_id: int) -> None:
        written, skipped, parts = _summary(messages, batch_id)
        log.info("raftmq sink %s batch %d: %d rows written, %d already written before "
                 "(partitions %s)", self.query, batch_id, written, skipped, parts)

    def _abort(self, messages: list[Any], batch_id: int) -> None:
        written, _skipped, parts = _summary(messages, batch_id)
        if self.opts.exactly_once:
            log.warning("raftmq sink %s batch %d aborted: partitions %s committed %d rows, "
                        "which a rerun of the batch skips", self.query, batch_id, parts, written)
        else:
            log.warning("raftmq sink %s batch %d aborted after %d rows were sent "
                        "(at-least-once: a rerun sends them again)", self.query, batch_id,
                        written)


class RaftmqBatchWriter(_Driver, DataSourceArrowWriter):
    """`df.write.format("raftmq")`: one task per partition; `batchId` (0 by default)
    stands for Spark's batch id."""

    def __init__(self, opts: SinkOptions, columns: tuple[str, ...]) -> None:
        self.opts = opts
        self.columns = columns
        self.query = opts.query or f"job-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        partition, attempt, _ = _task_context()
        return run_task(Task(self.opts, self.columns, self.query, self.opts.batch_id,
                             partition, attempt), iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._commit(list(messages), self.opts.batch_id)
        self._forget()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort(list(messages), self.opts.batch_id)
        self._forget()

    def _forget(self) -> None:
        """A job without `queryName` can never be run again under its name: its progress
        topics go with it."""
        if self.opts.query is None and self.opts.exactly_once:
            anyio.run(_drop_progress, self.opts, self.query)


class RaftmqStreamWriter(_Driver, _StreamWriterBase):  # type: ignore[misc,valid-type]
    """`df.writeStream.format("raftmq")`: the micro-batch's id comes from the task's
    local properties (Spark sets it for every task of the batch)."""

    def __init__(self, opts: SinkOptions, columns: tuple[str, ...]) -> None:
        self.opts = opts
        self.columns = columns
        self.query = opts.query or "at-least-once"

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        partition, attempt, ctx = _task_context()
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if batch is None:  # pragma: no cover - set by every Spark micro-batch
            raise RuntimeError(f"no {BATCH_ID_PROPERTY} in the task's properties: is this "
                               "a micro-batch query?")
        return run_task(Task(self.opts, self.columns, self.query, int(batch), partition,
                             attempt), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._commit(list(messages), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort(list(messages), batchId)


def batch_writer(options: dict[str, str], schema: StructType, overwrite: bool
                 ) -> RaftmqBatchWriter:
    if overwrite:
        raise OptionError("the raftmq sink only appends (a topic's messages cannot be "
                          "overwritten): use mode('append')")
    opts = parse_sink_options(options, stream=False)
    columns = check_schema(schema, opts)
    anyio.run(_prepare, opts)
    return RaftmqBatchWriter(opts, columns)


def stream_writer(options: dict[str, str], schema: StructType) -> RaftmqStreamWriter:
    """(Complete output mode's `overwrite` appends every batch's rows, as Kafka's sink.)"""
    opts = parse_sink_options(options, stream=True)
    columns = check_schema(schema, opts)
    anyio.run(_prepare, opts)
    return RaftmqStreamWriter(opts, columns)

