"""Trace records on Spark: the trace topic read through the `raftmq` source and decoded
into one row per step of a traced message's life, and the audit's account of them.

    from raftmq.spark.trace import trace_frame, trace_summary
    steps = trace_frame(spark, "127.0.0.1:7176")   # kind, msg_id, topic, queue, ...
    trace_summary(steps)                           # {"messages": ..., "steps": ...}

The rows have the fields of `wire.trace.TraceRecord` (kind, msg_id, topic, queue, offset,
ms, client, cg, group, index, committed), one per step (a record holds the steps one report
brought for one message), and the place of the record holding the step in the trace topic
(trace_queue, trace_offset). Records a retried report wrote twice are dropped
(`distinct`), as `raftmq trace` drops them.
"""

from __future__ import annotations

from typing import Any

import anyio

from raftmq.client import Admin
from wire.protocol import Code, RequestError
from wire.trace import TRACE_TOPIC

__all__ = ["TRACE_SCHEMA", "trace_frame", "trace_summary"]

TRACE_SCHEMA = ("kind string, msg_id string, topic string, queue int, offset long, ms long, "
                "client string, cg string, `group` string, index long, committed long")
#: A record's body: one message's steps from one report (`wire.trace`).
_RECORD_SCHEMA = ("msg_id string, topic string, queue int, offset long, `group` string, "
                  "steps array<struct<kind: string, ms: long, client: string, cg: string, "
                  "index: long, committed: long>>")


def trace_frame(spark: Any, namesrv: str) -> Any:
    """Every step the cluster's trace topic holds, one row each (see the module
    docstring); an empty frame of that shape when nothing was traced yet."""
    from pyspark.sql import functions as F

    if not _routed(namesrv):
        return spark.createDataFrame([], TRACE_SCHEMA + ", trace_queue int, trace_offset long")
    raw = (spark.read.format("raftmq").option("namesrv", namesrv)
           .option("subscribe", TRACE_TOPIC).option("failOnDataLoss", "false").load())
    return (raw.select(F.from_json(F.col("value").cast("string"), _RECORD_SCHEMA).alias("r"),
                       F.col("queue").alias("trace_queue"),
                       F.col("offset").alias("trace_offset"))
            .select("r.*", "trace_queue", "trace_offset")
            .select(F.explode("steps").alias("s"), "msg_id", "topic", "queue", "offset",
                    "group", "trace_queue", "trace_offset")
            .select(F.col("s.kind").alias("kind"), "msg_id", "topic", "queue", "offset",
                    F.col("s.ms").alias("ms"), F.col("s.client").alias("client"),
                    F.col("s.cg").alias("cg"), "group", F.col("s.index").alias("index"),
                    F.col("s.committed").alias("committed"), "trace_queue", "trace_offset")
            .dropDuplicates(list(_FIELDS)))

def _routed(namesrv: str) -> bool:
    """Whether the name servers route the trace topic (it is created on first use)."""
    async def ask() -> bool:
        async with Admin(namesrv) as admin:
            try:
                await admin.routes.route(TRACE_TOPIC, refresh=True)
            except RequestError as exc:
                if exc.code == Code.UNKNOWN_TOPIC:
                    return False
                raise
        return True

    return anyio.run(ask)


_FIELDS = ("kind", "msg_id", "topic", "queue", "offset", "ms", "client", "cg", "group",
           "index", "committed")


def trace_summary(steps: Any) -> dict[str, Any]:
    """What the trace says about the traced messages, counted on Spark:

    - ``messages``: distinct traced messages; ``steps``: records per kind;
    - ``stored_not_delivered``: messages stored (a traced producer sent them) that no
      traced consumer was handed;
    - ``delivered_not_acked``: (message, consumer group) pairs handed over but never
      acknowledged (no commit covering them, no ack);
    - ``delivered_more_than_once``: (message, consumer group) pairs handed over twice or
      more (redeliveries: retries, rebalances, invisible times that ran out).
    """
    from pyspark.sql import functions as F

    kinds = {r["kind"]: int(r["count"]) for r in steps.groupBy("kind").count().collect()}
    per_msg = steps.groupBy("msg_id").agg(
        F.max(F.when(F.col("kind") == "stored", 1).otherwise(0)).alias("stored"),
        F.max(F.when(F.col("kind") == "delivered", 1).otherwise(0)).alias("delivered"))
    per_group = (steps.where(F.col("cg").isNotNull()).groupBy("msg_id", "cg").agg(
        F.sum(F.when(F.col("kind") == "delivered", 1).otherwise(0)).alias("deliveries"),
        F.sum(F.when(F.col("kind") == "acked", 1).otherwise(0)).alias("acks")))
    m = per_msg.agg(F.count("*").alias("messages"),
                    F.sum(F.when((F.col("stored") == 1) & (F.col("delivered") == 0), 1)
                          .otherwise(0)).alias("stored_not_delivered")).collect()[0]
    g = per_group.agg(
        F.sum(F.when((F.col("deliveries") > 0) & (F.col("acks") == 0), 1).otherwise(0))
        .alias("delivered_not_acked"),
        F.sum(F.when(F.col("deliveries") > 1, 1).otherwise(0))
        .alias("delivered_more_than_once")).collect()[0]
    return {
        "messages": int(m["messages"] or 0),
        "steps": {k: kinds.get(k, 0) for k in ("sent", "stored", "delivered", "acked")},
        "stored_not_delivered": int(m["stored_not_delivered"] or 0),
        "delivered_not_acked": int(g["delivered_not_acked"] or 0),
        "delivered_more_than_once": int(g["delivered_more_than_once"] or 0),
    }
