"""Reading raftmq from PySpark: batch and streaming rows per second through the `raftmq` source.

Fills a topic of `--queues` queues with `--messages` messages of `--size` bytes, then on a
local SparkSession (`--master`, `local[2]` by default: this is a 2-core machine):

- batch: `spark.read.format("raftmq")...load()` with `count()`, then with
  `groupBy("queue").count()`: rows/s of each (wall time of the action, planning included);
- streaming: `readStream` of the same topic from earliest with `Trigger.AvailableNow` and
  `maxOffsetsPerTrigger` into the `noop` sink: rows/s end to end and the micro-batch
  latency (each trigger's `triggerExecution` time) percentiles;
- exactly-once streaming write: `--write-messages` messages of a second topic read as a
  stream and written to a third through the `raftmq` sink (exactly-once, the default):
  rows/s end to end, and a check that the output holds exactly that many.

The session starts before the clock does (a JVM takes seconds to start); the figures
include Spark's Python workers, the FETCHes and the Arrow batches handed to the JVM.

A small read of every queue runs before the clocks start (`warm_up_s`: Spark's Python
workers and the JVM's first code paths), so `count()` is not charged them. The batch
figures are also given with narrow user-given schemas (`narrow`: `.schema("queue INT")`
and `.schema("queue INT, offset LONG, value BINARY")`), where the source builds and Spark
converts only those columns.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import anyio

from .common import Target, add_cluster_args, emit, percentile, positive_int, run_on_target

__all__ = ["build_parser", "main"]

BATCH_TARGET = 300_000  # rows/s of the batch read (issue 15)
NARROW_SCHEMAS = ("queue INT", "queue INT, offset LONG, value BINARY")
WARM_UP_ROWS = 2048  # per queue: two FETCHes
FILL_BATCH = 512


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench spark", description=__doc__.split("\n\n")[0])
    add_cluster_args(p)
    p.add_argument("--messages", type=positive_int, default=1_000_000)
    p.add_argument("--size", type=positive_int, default=100, help="message body bytes")
    p.add_argument("--queues", type=positive_int, default=8)
    p.add_argument("--master", default="local[2]", help="Spark master")
    p.add_argument("--max-per-trigger", type=positive_int, default=200_000,
                   help="the stream's maxOffsetsPerTrigger")
    p.add_argument("--write-messages", type=positive_int, default=200_000,
                   help="messages the exactly-once streaming write copies")
    return p


async def fill(namesrv: str, topic: str, queues: int, messages: int, size: int) -> float:
    """Send `messages` to `topic` in batches spread over its queues; seconds it took."""
    from raftmq.client import Admin, Producer

    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, queues)
    body = b"x" * size
    t0 = time.perf_counter()
    async with Producer(namesrv) as producer:
        async def queue_task(q: int) -> None:
            n = messages // queues + (1 if q < messages % queues else 0)
            for i in range(0, n, FILL_BATCH):
                await producer.send_batch(topic, [body] * min(FILL_BATCH, n - i), queue=q)

        async with anyio.create_task_group() as tg:
            for q in range(queues):
                tg.start_soon(queue_task, q)
    return time.perf_counter() - t0


def spark_session(master: str) -> Any:
    from pyspark.sql import SparkSession

    from raftmq.spark import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName("raftmq-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    register(spark)
    return spark


def warm_up(spark: Any, namesrv: str, topic: str) -> float:
    """Read the first `WARM_UP_ROWS` of every queue of `topic` (a count and a group-by),
    so the timed actions after it do not pay for starting Spark's Python workers and
    the JVM's first code paths; seconds it took."""
    from raftmq.client import Admin

    async def ends() -> dict[str, int]:
        async with Admin(namesrv) as admin:
            info = await admin.describe_topic(topic)
            return {str(q.queue): min(WARM_UP_ROWS, q.end_offset or 0) for q in info.queues}

    t0 = time.perf_counter()
    df = (spark.read.format("raftmq").option("namesrv", namesrv).option("subscribe", topic)
          .option("endingOffsets", json.dumps({topic: anyio.run(ends)})).load())
    df.count()
    df.groupBy("queue").count().collect()
    return time.perf_counter() - t0


def measure_narrow(spark: Any, namesrv: str, topic: str, expected: int) -> dict[str, Any]:
    """`count()` and `groupBy("queue").count()` rows/s with each of `NARROW_SCHEMAS`."""
    out: dict[str, Any] = {}
    for schema in NARROW_SCHEMAS:
        df = (spark.read.format("raftmq").schema(schema).option("namesrv", namesrv)
              .option("subscribe", topic).load())
        t0 = time.perf_counter()
        counted = df.count()
        count_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        grouped = sum(r["count"] for r in df.groupBy("queue").count().collect())
        group_s = time.perf_counter() - t0
        if not counted == grouped == expected:
            raise RuntimeError(f"schema {schema!r}: count {counted}, groupBy {grouped}, "
                               f"not {expected}")
        out[schema] = {"count_rows_per_s": round(counted / count_s),
                       "group_by_rows_per_s": round(grouped / group_s),
                       "count_s": round(count_s, 3), "group_by_s": round(group_s, 3)}
    return out


def measure(spark: Any, namesrv: str, topic: str, messages: int, max_per_trigger: int,
            checkpoint: str) -> dict[str, Any]:
    warm_up_s = warm_up(spark, namesrv, topic)
    df = spark.read.format("raftmq").option("namesrv", namesrv).option("subscribe", topic).load()
    t0 = time.perf_counter()
    counted = df.count()
    count_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    per_queue = df.groupBy("queue").count().collect()
    group_s = time.perf_counter() - t0
    grouped = sum(r["count"] for r in per_queue)
    narrow = measure_narrow(spark, namesrv, topic, counted)

    stream = (spark.readStream.format("raftmq").option("namesrv", namesrv)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(max_per_trigger)).load())
    t0 = time.perf_counter()
    query = (stream.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    stream_s = time.perf_counter() - t0
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    streamed = sum(p["numInputRows"] for p in progress)
    batch_ms = sorted(float(p["durationMs"]["triggerExecution"]) for p in progress)
    return {
        "rows": {"count": counted, "group_by_queue": grouped, "streamed": streamed,
                 "expected": messages},
        "batch_count_rows_per_s": round(counted / count_s),
        "batch_group_by_rows_per_s": round(grouped / group_s),
        "batch_count_s": round(count_s, 3),
        "batch_group_by_s": round(group_s, 3),
        "batch_target_rows_per_s": BATCH_TARGET,
        "stream_rows_per_s": round(streamed / stream_s),
        "stream_s": round(stream_s, 3),
        "stream_micro_batches": len(progress),
        "stream_micro_batch_ms": {
            "p50": percentile(batch_ms, 50), "max": batch_ms[-1] if batch_ms else None},
        "warm_up_s": round(warm_up_s, 3),
        "narrow": narrow,
    }


def measure_write(spark: Any, namesrv: str, source: str, out: str, messages: int,
                  max_per_trigger: int, checkpoint: str) -> dict[str, Any]:
    """`source` copied to `out` by a stream through the exactly-once sink."""
    from raftmq.client import Admin

    stream = (spark.readStream.format("raftmq").option("namesrv", namesrv)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(max_per_trigger)).load()
              .select("value", "key"))
    t0 = time.perf_counter()
    query = (stream.writeStream.format("raftmq").queryName(f"bench-{out}")
             .option("namesrv", namesrv).option("topic", out)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    write_s = time.perf_counter() - t0

    async def stored() -> int:
        async with Admin(namesrv) as admin:
            info = await admin.describe_topic(out)
            return sum((q.end_offset or 0) - (q.min_offset or 0) for q in info.queues)

    written = anyio.run(stored)
    return {"rows": written, "expected": messages,
            "write_eo_rows_per_s": round(written / write_s), "write_eo_s": round(write_s, 3)}


def _table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"raftmq bench spark: {result['messages']:,} messages of "
                        f"{result['size']} B, {result['master']}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("batch_count_rows_per_s", "batch_group_by_rows_per_s", "stream_rows_per_s",
                "stream_micro_batches", "write_eo_rows_per_s", "fill_s"):
        table.add_row(key, f"{result[key]:,}")
    table.add_row("stream micro-batch ms p50 / max",
                  " / ".join(f"{v:,.0f}" for v in result["stream_micro_batch_ms"].values()
                             if v is not None))
    for schema, figures in result["narrow"].items():
        table.add_row(f"schema {schema!r}: count / groupBy rows/s",
                      f"{figures['count_rows_per_s']:,} / {figures['group_by_rows_per_s']:,}")
    return table


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import tempfile

    from raftmq.client import Admin

    from .common import run_id

    topic = f"spark-bench-{run_id()}"

    async def drive(target: Target, a: argparse.Namespace) -> dict[str, Any]:
        fill_s = await fill(target.namesrv, topic, a.queues, a.messages, a.size)
        await fill(target.namesrv, f"{topic}-w", a.queues, a.write_messages, a.size)
        async with Admin(target.namesrv) as admin:
            await admin.create_topic(f"{topic}-out", a.queues)
        spark = await anyio.to_thread.run_sync(spark_session, a.master)
        with tempfile.TemporaryDirectory(prefix="raftmq-spark-bench-") as cp:
            figures = await anyio.to_thread.run_sync(
                measure, spark, target.namesrv, topic, a.messages, a.max_per_trigger,
                f"{cp}/read")
            write = await anyio.to_thread.run_sync(
                measure_write, spark, target.namesrv, f"{topic}-w", f"{topic}-out",
                a.write_messages, a.max_per_trigger, f"{cp}/write")
        figures["rows"]["written_eo"] = write.pop("rows")
        figures["rows"]["expected_written"] = write.pop("expected")
        return {"benchmark": "spark", "messages": a.messages, "size": a.size,
                "queues": a.queues, "master": a.master, "fill_s": round(fill_s, 3),
                **figures, **write}

    result = run_on_target(args, drive)
    emit(result, args.json, _table)
    rows = result["rows"]
    read_ok = rows["count"] == rows["group_by_queue"] == rows["streamed"] == args.messages
    return 0 if read_ok and rows["written_eo"] == args.write_messages else 1


if __name__ == "__main__":
    sys.exit(main())
