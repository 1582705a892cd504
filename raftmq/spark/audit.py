"""`raftmq audit`: reconcile what a chaos run sent with what the cluster stores, on Spark.

Inputs, both read by Spark (nothing is collected to the driver but per-queue totals and
small histograms): the run's ``history.jsonl`` (Spark's JSON reader) and a full read of
the cluster's queues through the `raftmq` source. Per queue it counts, with the same
meanings as the chaos analysis' accounting (`chaos.accounting`), which reads the history's
own reads instead of the cluster, so each checks the other:

- ``attempted`` / ``acknowledged`` / ``failed`` / ``indeterminate``: distinct messages
  appended, by their best outcome (ok over info over fail);
- ``read``: distinct messages stored; ``lost``: acknowledged, not stored;
- ``duplicated``: stored at two or more offsets; ``unexpected``: stored, never appended;
- ``recovered`` / ``failed_but_read``: stored although their append was unknown / failed;
- ``ack_mismatches``: stored, but not at the offset acknowledged; ``ack_conflicts``:
  two messages acknowledged at one offset;
- ``reordered`` (out of order): a process's acknowledged append stored below the one it
  acknowledged before it (its next send started after that acknowledgement).

Latencies (milliseconds, percentiles): send -> ack from the history's invoke and ok
lines; born -> store from each stored message's own timestamps (the producer's clock at
send and the leader's at store, so on one machine this is send -> store); ack -> first
read, when the history's readers saw the message (the history's clock is monotonic and
the cluster's is the wall clock, so store -> consume is measured from the ack, the
nearest instant on the history's clock). Results: ``audit.json`` and ``audit.html``.

With ``--trace`` the result also has ``trace``: what the trace topic's records say of the
traced messages (`raftmq.spark.trace`: steps per kind, messages stored but never handed
to a consumer, handed over but never acknowledged, handed over more than once).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["COUNTS", "ERROR_COUNTS", "audit", "main"]

COUNTS = ("attempted", "acknowledged", "failed", "indeterminate", "read", "lost", "duplicated",
          "unexpected", "recovered", "failed_but_read", "ack_mismatches", "ack_conflicts",
          "reordered")
ERROR_COUNTS = ("lost", "duplicated", "unexpected", "failed_but_read", "ack_mismatches",
                "ack_conflicts", "reordered")
PERCENTILES = (0.5, 0.9, 0.99, 0.999)
_QUEUE_KEY = r"^[^\[].*/[0-9]+$"  # "topic/queue"; consumer-offset keys are JSON lists


def history_frame(spark: Any, path: str) -> Any:
    """The history's client lines with their line order (`id`): JSON values the format
    leaves open (a key may be a list, a value an object) are kept as their JSON text."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    schema = StructType([
        StructField("process", StringType()), StructField("type", StringType()),
        StructField("f", StringType()), StructField("key", StringType()),
        StructField("value", StringType()), StructField("time", DoubleType()),
    ])
    # one file's splits are numbered in file order, so the id is the line order
    # FAILFAST: a line that is not JSON stops the audit instead of vanishing as nulls
    lines = (spark.read.schema(schema).option("mode", "FAILFAST").json(path)
             .withColumn("id", F.monotonically_increasing_id()))
    # a line without a time is ordered by its place in the file, as the chaos parser does
    return lines.withColumn("time", F.coalesce("time", F.col("id").cast("double")))


def operations(lines: Any) -> Any:
    """Queue operations (append and read keyed by a queue) paired with their completion:
    the next non-attempt line of the same process (one operation at a time per process;
    an invoke followed by another invoke, or by nothing, stays unknown)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ops = lines.where((F.col("process") != "nemesis") & F.col("f").isin("append", "read")
                      & (F.col("type") != "attempt") & F.col("key").rlike(_QUEUE_KEY))
    w = Window.partitionBy("process").orderBy("id")
    nxt = F.lead(F.struct("type", "value", "time"), 1).over(w)
    paired = ops.withColumn("next", nxt).where(F.col("type") == "invoke")
    status = (F.when(F.col("next.type").isin("ok", "fail"), F.col("next.type"))
              .otherwise(F.lit("info")))
    return paired.select(
        "process", "f", "key", "id", F.col("value").alias("input"),
        F.col("time").alias("call"), status.alias("status"),
        F.when(status != "info", F.col("next.value")).alias("output"),
        F.when(status != "info", F.col("next.time")).alias("ret"),
    )


def stored_frame(spark: Any, namesrv: str, topics: list[str]) -> Any:
    """Every message the cluster holds in `topics`, keyed like the history."""
    from pyspark.sql import functions as F

    df = (spark.read.format("raftmq").option("namesrv", namesrv)
          .option("subscribe", ",".join(topics)).option("failOnDataLoss", "false").load())
    return df.select(
        F.concat_ws("/", "topic", F.col("queue").cast("string")).alias("key"),
        F.col("value").cast("string").alias("msg"), "offset",
        ((F.col("timestamp").cast("double") - F.col("born_timestamp").cast("double"))
         * 1000).alias("born_to_store_ms"),
    )


def _latencies(frames: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Percentiles and power-of-two histograms ([upper bound ms, count] rows) of the `ms`
    column of each frame, in two Spark jobs over their union."""
    from functools import reduce

    from pyspark.sql import functions as F

    union = reduce(lambda a, b: a.unionByName(b), (
        df.select(F.lit(name).alias("name"), F.col("ms").cast("double").alias("ms"))
        for name, df in frames.items())).where(F.col("ms").isNotNull())
    stats: dict[str, Any] = {name: {"count": 0} for name in frames}
    for row in union.groupBy("name").agg(
            F.count("ms").alias("count"),
            F.percentile_approx("ms", list(PERCENTILES), 10_000).alias("p"),
            F.max("ms").alias("max")).collect():
        out: dict[str, Any] = {"count": int(row["count"])}
        for q, v in zip(PERCENTILES, row["p"], strict=True):
            out[f"p{q * 100:g}"] = round(float(v), 3)
        out["max"] = round(float(row["max"]), 3)
        stats[row["name"]] = out
    bucket = F.pow(F.lit(2.0), F.ceil(F.log2(F.greatest(F.col("ms"), F.lit(0.001)))))
    hist: dict[str, Any] = {name: [] for name in frames}
    for row in union.groupBy("name", bucket.alias("b")).count().orderBy("name", "b").collect():
        hist[row["name"]].append([float(row["b"]), int(row["count"])])
    return stats, hist


def audit(spark: Any, history: str, namesrv: str, *, topics: list[str] | None = None,
          trace: bool = False) -> dict[str, Any]:
    """The audit's JSON-able result (see the module docstring); with `trace`, also what
    the trace topic says of the traced messages (`raftmq.spark.trace.trace_summary`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = time.monotonic()
    lines = history_frame(spark, history)
    ops = operations(lines).cache()
    appends = ops.where(F.col("f") == "append").withColumn("msg", F.col("input"))
    if topics is None:
        topics = sorted(r["t"] for r in ops.select(
            F.regexp_extract("key", r"^(.*)/[0-9]+$", 1).alias("t")).distinct().collect())
    acked_offset = F.coalesce(F.get_json_object("output", "$.offset").cast("long"),
                              F.col("output").cast("long"))
    appends = appends.withColumn(
        "acked", F.when(F.col("status") == "ok", acked_offset))

    # per message: best outcome, first acknowledged offset
    sent = appends.groupBy("key", "msg").agg(
        F.when(F.max(F.when(F.col("status") == "ok", 1)) == 1, "ok")
        .when(F.max(F.when(F.col("status") == "info", 1)) == 1, "info")
        .otherwise("fail").alias("state"),
        F.min_by("acked", F.when(F.col("acked").isNotNull(), F.col("id"))).alias("acked"),
    )
    stored = stored_frame(spark, namesrv, topics).cache()
    where = stored.groupBy("key", "msg").agg(
        F.count("*").alias("copies"), F.collect_set("offset").alias("offsets"),
        F.min("offset").alias("first"),
    )
    joined = sent.join(where, ["key", "msg"], "full_outer")
    is_stored = F.col("copies").isNotNull()
    state = F.col("state")
    per_msg = joined.select(
        "key",
        F.when(state.isNotNull(), 1).alias("attempted"),
        F.when(state == "ok", 1).alias("acknowledged"),
        F.when(state == "fail", 1).alias("failed"),
        F.when(state == "info", 1).alias("indeterminate"),
        F.when(is_stored, 1).alias("read"),
        F.when((state == "ok") & ~is_stored, 1).alias("lost"),
        F.when(F.size("offsets") > 1, 1).alias("duplicated"),
        F.when(is_stored & state.isNull(), 1).alias("unexpected"),
        F.when(is_stored & (state == "info"), 1).alias("recovered"),
        F.when(is_stored & (state == "fail"), 1).alias("failed_but_read"),
        F.when(is_stored & F.col("acked").isNotNull()
               & ~F.array_contains("offsets", F.col("acked")), 1).alias("ack_mismatches"),
    )
    counts = per_msg.groupBy("key").agg(*[F.count(c).alias(c) for c in per_msg.columns[1:]])

    # two messages acknowledged at one offset: each ok after the first one's, not its own
    oks = appends.where(F.col("acked").isNotNull())
    first_at = Window.partitionBy("key", "acked").orderBy("id")
    conflicts = (oks.withColumn("first", F.first("msg").over(first_at))
                 .where(F.col("msg") != F.col("first")).groupBy("key")
                 .agg(F.count("*").alias("ack_conflicts")))

    # a process's successive acknowledged appends to a queue, stored in reverse order
    # (at: where it is stored first, else where its first acknowledgement put it)
    at = (appends.where(F.col("status") == "ok").select("process", "key", "msg", "call", "id",
                                                         "ret")
          .join(sent.select("key", "msg", F.col("acked").alias("msg_acked")), ["key", "msg"])
          .join(where.select("key", "msg", "first"), ["key", "msg"], "left")
          .withColumn("at", F.coalesce("first", "msg_acked")).where(F.col("at").isNotNull()))
    order = Window.partitionBy("process", "key").orderBy("call", "id")
    reordered = (at.withColumn("prev_at", F.lag("at").over(order))
                 .withColumn("prev_ret", F.lag("ret").over(order))
                 .where((F.col("call") >= F.col("prev_ret")) & (F.col("at") < F.col("prev_at")))
                 .groupBy("key").agg(F.count("*").alias("reordered")))

    table = (counts.join(conflicts, "key", "left").join(reordered, "key", "left")
             .fillna(0).orderBy("key").collect())
    queues = {r["key"]: {c: int(r[c]) for c in COUNTS} for r in table}
    totals = {c: sum(q[c] for q in queues.values()) for c in COUNTS}

    # latencies
    send_ack = appends.where(F.col("status") == "ok").select(
        ((F.col("ret") - F.col("call")) * 1000).alias("ms"))
    reads = ops.where((F.col("f") == "read") & (F.col("status") == "ok")).select(
        "key", F.explode(F.from_json("output", "array<string>")).alias("msg"),
        F.col("ret").alias("seen"))
    first_seen = reads.groupBy("key", "msg").agg(F.min("seen").alias("seen"))
    ack_read = (appends.where(F.col("status") == "ok").groupBy("key", "msg")
                .agg(F.min("ret").alias("ack")).join(first_seen, ["key", "msg"])
                .select(((F.col("seen") - F.col("ack")) * 1000).alias("ms")))
    latency, histograms = _latencies({
        "send_to_ack": send_ack, "ack_to_first_read": ack_read,
        "born_to_store": stored.select(F.col("born_to_store_ms").alias("ms")),
    })

    # events over time: appends invoked and acknowledged per second; faults
    per_second = (ops.where(F.col("f") == "append")
                  .select(F.floor("call").alias("s"), "status")
                  .groupBy("s").agg(F.count("*").alias("sent"),
                                    F.count(F.when(F.col("status") == "ok", 1)).alias("acked"))
                  .orderBy("s").collect())
    origin = float(per_second[0]["s"]) if per_second else 0.0
    faults = (lines.where(F.col("process") == "nemesis")
              .select("type", "f", (F.col("time") - origin).alias("t")).orderBy("id").collect())
    ops.unpersist()
    stored.unpersist()
    extra: dict[str, Any] = {}
    if trace:
        from .trace import trace_frame, trace_summary

        extra["trace"] = trace_summary(trace_frame(spark, namesrv))
    return {
        **extra,
        "valid": all(totals[c] == 0 for c in ERROR_COUNTS),
        "totals": totals,
        "queues": queues,
        "latency_ms": latency,
        "histograms_ms": histograms,
        "events_per_second": [[int(r["s"] - origin), int(r["sent"]), int(r["acked"])]
                              for r in per_second],
        "faults": [[r["type"], r["f"], round(float(r["t"]), 3)] for r in faults],
        "inputs": {"history": history, "namesrv": namesrv, "topics": topics},
        "seconds": round(time.monotonic() - started, 3),
    }


def write_outputs(result: dict[str, Any], out: Path) -> tuple[Path, Path]:
    from .audit_report import render_html

    out.mkdir(parents=True, exist_ok=True)
    js = out / "audit.json"
    js.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    html = out / "audit.html"
    html.write_text(render_html(result))
    return js, html


def session(master: str, app: str = "raftmq-audit") -> Any:
    """A SparkSession on `master` with the raftmq source registered, its Python workers
    running this interpreter."""
    import os

    from pyspark.sql import SparkSession

    from .source import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    register(spark)
    return spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="raftmq audit",
        description="Reconcile a chaos run's history.jsonl with a full read of the cluster "
                    "(lost, duplicated, unexpected, out of order; latencies) on Spark.")
    parser.add_argument("history", help="the run's history.jsonl (or a run directory)")
    parser.add_argument("--namesrv", required=True, help="name server of the cluster to read")
    parser.add_argument("--topic", action="append", dest="topics",
                        help="topic to read (repeatable; default: every topic the history names)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where audit.json and audit.html go (default: beside the history)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--trace", action="store_true",
                        help="also account for the trace topic's records (message trace)")
    args = parser.parse_args(argv)
    history = Path(args.history)
    if history.is_dir():
        history = history / "history.jsonl"
    if not history.is_file():
        print(f"raftmq audit: no history file at {history}", file=sys.stderr)
        return 3
    spark = session(args.master)
    result = audit(spark, str(history.resolve()), args.namesrv, topics=args.topics,
                   trace=args.trace)
    js, html = write_outputs(result, args.out or history.parent)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        t = result["totals"]
        print(f"{'valid' if result['valid'] else 'INVALID'}: " + ", ".join(
            f"{c} {t[c]}" for c in COUNTS) + f"\nwrote {js} and {html}")
    return 0 if result["valid"] else 1
