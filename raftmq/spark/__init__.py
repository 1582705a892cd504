"""raftmq for PySpark: `spark.read.format("raftmq")` and `spark.readStream.format("raftmq")`,
`df.write.format("raftmq")` and `df.writeStream.format("raftmq")` (exactly-once by default).

Register the source once per SparkSession (PySpark finds Python data sources only by
registration)::

    import raftmq.spark; raftmq.spark.register(spark)

Needs the `spark` extra (`pip install 'raftmq[spark]'`: PySpark 4, pyarrow, NumPy) and Java 17.
Options, offsets and the schema are Spark's Kafka source's: see `raftmq.spark.options` and
`raftmq.spark.schema`; the sink's are in `raftmq.spark.sink_options`, its exactly-once
protocol in `raftmq.spark.sink`.
"""

from __future__ import annotations

try:
    import numpy  # noqa: F401
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"raftmq.spark needs PySpark 4, pyarrow and NumPy ({exc}); install them with "
        "pip install 'raftmq[spark]'"
    ) from exc

from .cluster import DataLossError
from .options import OptionError
from .schema import SCHEMA
from .source import RaftmqDataSource, register

__all__ = ["SCHEMA", "DataLossError", "OptionError", "RaftmqDataSource", "register"]
