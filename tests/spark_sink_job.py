"""A streaming query the sink's kill-and-restart test runs in a process of its own (so
killing it kills its JVM and Python workers too): every message of a raftmq topic,
copied to another with the `raftmq` sink, until the input is used up
(Trigger.AvailableNow).

    python -m tests.spark_sink_job NAMESRV SOURCE OUT CHECKPOINT QUERY GUARANTEE PAUSE_MS
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    namesrv, source, out, checkpoint, name, guarantee, pause_ms = argv
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import raftmq.spark

    spark = (SparkSession.builder.master("local[2]").appName("raftmq-sink-job")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "512m")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    raftmq.spark.register(spark)
    rows = (spark.readStream.format("raftmq").option("namesrv", namesrv)
            .option("subscribe", source).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "120").load()
            .selectExpr("value", "key"))
    query = (rows.writeStream.format("raftmq").option("namesrv", namesrv)
             .option("topic", out).option("queryName", name)
             .option("deliveryGuarantee", guarantee).option("transactionRows", "10")
             .option("testPauseMs", pause_ms)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
