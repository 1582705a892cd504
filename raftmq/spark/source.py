"""`spark.read.format("raftmq")` and `spark.readStream.format("raftmq")`: a PySpark Python
Data Source over raftmq queues, with the options and offsets of Spark's Kafka source
(`raftmq.spark.options`). Its writes are `raftmq.spark.sink`'s.

A batch read plans one Spark partition per queue range (more with `minPartitions`); a
stream's offsets are the JSON ``{"topic": {"queue": next offset}}`` Spark checkpoints, so a
restarted query replays a micro-batch from the same immutable offsets and gets the same
rows. Planning asks the queues' leaders for their bounds on the driver; executors fetch
their ranges with the SDK and hand Spark Arrow batches of the user-given schema's columns
(`.schema("queue INT, offset LONG")`, checked before anything is read) or of all of them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import StructType

from .cluster import (
    Bounds,
    DataLossError,
    data_loss_message,
    discover,
    offsets_at_times,
    read_range,
)
from .options import (
    Offsets,
    OptionError,
    QueueRange,
    SourceOptions,
    admit,
    offsets_to_json,
    parse_offsets_dict,
    parse_options,
    resolve,
    split_ranges,
)
from .schema import ALL_COLUMNS, SCHEMA, Columns, columns

try:  # PySpark >= 4.2: read limits (admission control) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - PySpark 4.0 / 4.1
    ReadAllAvailable = ReadLimit = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in: this PySpark has no Trigger.AvailableNow for Python sources."""

__all__ = ["RaftmqDataSource", "RangePartition", "register"]

log = logging.getLogger("raftmq.spark")


class RangePartition(InputPartition):
    """One Spark task's work: a range of one queue."""

    def __init__(self, r: QueueRange) -> None:
        super().__init__(r)
        self.range = r


def _check_start(r: QueueRange, lo: int, fail_on_data_loss: bool) -> QueueRange:
    """A range whose start retention already removed: an error, or the rest of it."""
    if r.start >= lo:
        return r
    msg = data_loss_message(r.topic, r.queue, r.start, min(lo, r.end), "were removed by retention")
    if fail_on_data_loss:
        raise DataLossError(msg)
    log.warning("raftmq source: skipping: %s", msg)
    return QueueRange(r.topic, r.queue, min(lo, r.end), r.end)


def starting_offsets(opts: SourceOptions, bounds: Bounds) -> Offsets:
    """Where a query starts: at `startingTimestamp` (or `startingOffsetsByTimestamp`),
    mapped to offsets now, when given; else at `startingOffsets`."""
    if opts.starting_times is not None:
        return offsets_at_times(opts, bounds, opts.starting_times, ending=False)
    return resolve(opts.starting, bounds, "startingOffsets")


class RaftmqBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, cols: Columns = ALL_COLUMNS) -> None:
        self.opts = opts
        self.cols = cols

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        bounds = discover(opts)
        start = starting_offsets(opts, bounds)
        end = (resolve(opts.ending, bounds, "endingOffsets") if opts.ending_times is None
               else offsets_at_times(opts, bounds, opts.ending_times, ending=True))
        ranges: list[QueueRange] = []
        for (topic, q), (lo, hi) in bounds.items():
            s, e = start[topic][q], end[topic][q]
            if e > hi:
                raise OptionError(f"endingOffsets: {topic!r} queue {q} ends at {hi} "
                                  f"(committed), not {e}")
            if s > e:
                raise OptionError(f"{topic!r} queue {q}: startingOffsets {s} is after "
                                  f"endingOffsets {e}")
            ranges.append(_check_start(QueueRange(topic, q, s, e), lo, opts.fail_on_data_loss))
        return [RangePartition(r) for r in split_ranges(ranges, opts.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            # no range holds a message (partitions() was empty): Spark still reads one
            # partition of its own making, which has nothing to give
            return
        yield from read_range(partition.range, self.opts.namesrv,
                              fail_on_data_loss=self.opts.fail_on_data_loss,
                              timeout=self.opts.fetch_timeout, tags=self.opts.tags,
                              columns=self.cols, sql=self.opts.sql)


class RaftmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over the queues' committed ends. Queues that appear later (a topic
    grew, or a new topic matches `subscribePattern`) are read from their earliest offset,
    as Spark's Kafka source does with new partitions."""

    def __init__(self, opts: SourceOptions, cols: Columns = ALL_COLUMNS) -> None:
        self.opts = opts
        self.cols = cols
        self._last: Offsets | None = None  # the end last handed out (PySpark < 4.2 only)
        self._target: Offsets | None = None  # Trigger.AvailableNow: the ends at its start

    def _ends(self) -> tuple[Offsets, dict[tuple[str, int], tuple[int, int]]]:
        bounds = discover(self.opts)
        ends: Offsets = {}
        for (topic, q), (_lo, hi) in bounds.items():
            ends.setdefault(topic, {})[q] = hi
        return ends, bounds

    def initialOffset(self) -> dict[str, Any]:
        return offsets_to_json(starting_offsets(self.opts, discover(self.opts)))

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is not None and self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target, _ = self._ends()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None
                     ) -> dict[str, Any]:
        if start is not None:
            begin = parse_offsets_dict(start, "start offset")
        elif self._last is not None:
            begin = self._last
        else:
            begin = parse_offsets_dict(self.initialOffset(), "start offset")
        latest, bounds = self._ends()
        for topic, queues in begin.items():
            for q, off in queues.items():
                if (topic, q) in bounds:
                    continue
                if self.opts.fail_on_data_loss:
                    raise DataLossError(data_loss_message(topic, q, off, off + 1,
                                                          "and after are gone with their queue"))
                log.warning("raftmq source: %s queue %d is gone; no longer read", topic, q)
        if self._target is not None:  # Trigger.AvailableNow: nothing past its start
            latest = {t: {q: min(end, self._target[t][q]) for q, end in qs.items()
                          if q in self._target.get(t, {})}
                      for t, qs in latest.items()}
        full_begin = {t: {q: begin.get(t, {}).get(q, bounds[(t, q)][0]) for q in qs}
                      for t, qs in latest.items()}
        if limit is None:  # PySpark < 4.2 calls latestOffset() with no limit
            max_rows = self.opts.max_offsets_per_trigger
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        else:
            max_rows = None
        end = admit(full_begin, latest, max_rows)
        # a queue's end never goes below its start (a new leader answering behind)
        end = {t: {q: max(o, full_begin[t][q]) for q, o in qs.items()} for t, qs in end.items()}
        self._last = end
        return offsets_to_json(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = parse_offsets_dict(start, "start offset")
        stop = parse_offsets_dict(end, "end offset")
        new = [(t, q) for t, qs in stop.items() for q in qs if q not in begin.get(t, {})]
        lows = {}
        if new:  # queues that appeared in this micro-batch start at their earliest offset
            bounds = discover(self.opts)
            lows = {k: bounds[k][0] if k in bounds else stop[k[0]][k[1]] for k in new}
        ranges = [QueueRange(t, q, begin.get(t, {}).get(q, lows.get((t, q), e)), e)
                  for t, qs in sorted(stop.items()) for q, e in sorted(qs.items())]
        return [RangePartition(r) for r in split_ranges(ranges, self.opts.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        yield from read_range(partition.range, self.opts.namesrv,
                              fail_on_data_loss=self.opts.fail_on_data_loss,
                              timeout=self.opts.fetch_timeout, tags=self.opts.tags,
                              columns=self.cols, sql=self.opts.sql)

    def commit(self, end: dict[str, Any]) -> None:
        self._last = parse_offsets_dict(end, "end offset")


class RaftmqDataSource(DataSource):
    """The `raftmq` format. Register it once per session: `raftmq.spark.register(spark)`."""

    @classmethod
    def name(cls) -> str:
        return "raftmq"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftmqBatchReader(parse_options(self.options, batch=True), columns(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RaftmqStreamReader(parse_options(self.options, batch=False), columns(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .sink import batch_writer  # (the sink: raftmq.spark.sink)

        return batch_writer(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import stream_writer

        return stream_writer(dict(self.options), schema)


def register(spark: Any) -> None:
    """Make `format("raftmq")` known to `spark` (a SparkSession)."""
    spark.dataSource.register(RaftmqDataSource)
