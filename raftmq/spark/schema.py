"""The rows of the `raftmq` Spark source: the Spark schema and the Arrow batches built to it.

Spark checks every Arrow batch a Python data source yields against the Arrow form of the
declared schema, so both come from one place here. A fetched batch of messages becomes
one Arrow record batch, column by column (no Python tuple per row).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker.records import Message

__all__ = ["ARROW_SCHEMA", "SCHEMA", "messages_to_batch"]

SCHEMA = StructType([
    StructField("key", StringType()),  # raftmq keys are text (RocketMQ's KEYS)
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("queue", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),  # store time, set by the group's leader
    StructField("born_timestamp", TimestampType()),  # the producer's clock at send
    StructField("tags", StringType()),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("msg_id", StringType()),
])

ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")

_TS = pa.timestamp("us", tz="UTC")
_PROPS = ARROW_SCHEMA.field("properties").type


def messages_to_batch(messages: Sequence[Message]) -> pa.RecordBatch:
    """One Arrow record batch of `messages`, in the column order of `SCHEMA`."""
    arrays = [
        pa.array([m.key for m in messages], pa.string()),
        pa.array([m.body for m in messages], pa.binary()),
        pa.array([m.topic for m in messages], pa.string()),
        pa.array([m.queue for m in messages], pa.int32()),
        pa.array([m.offset for m in messages], pa.int64()),
        pa.array([m.store_ms * 1000 for m in messages], _TS),
        pa.array([m.born_ms * 1000 for m in messages], _TS),
        pa.array([m.tags for m in messages], pa.string()),
        pa.array([list(m.properties.items()) for m in messages], _PROPS),
        pa.array([m.msg_id for m in messages], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
