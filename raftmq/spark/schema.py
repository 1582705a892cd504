"""The rows of the `raftmq` Spark source: the Spark schema and the Arrow batches built to it.

Spark checks every Arrow batch a Python data source yields against the Arrow form of the
declared schema, so both come from one place here. A fetched batch of messages becomes
one Arrow record batch, column by column (no Python tuple per row).

A user may give a narrower schema (`spark.read.format("raftmq").schema("queue INT, offset
LONG")`): any of the columns below, in any order. PySpark's Python data sources cannot
prune columns by themselves, so this is how a query says what it needs; `columns` checks
it and the reader then builds only those columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
from pyspark.sql.types import DataType as SparkType

from wire.records import Message

__all__ = ["ALL_COLUMNS", "ARROW_SCHEMA", "SCHEMA", "Columns", "SchemaError", "columns",
           "messages_to_batch"]

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


class SchemaError(ValueError):
    """A user-given schema asks for a column the source does not have, or with a type it
    cannot give (the caller's fault; said before anything is read)."""


# the Spark types a user may give each column: the documented one first (keys are text,
# yet may be read as bytes; a value may be read as text when every body is UTF-8)
_ALLOWED: dict[str, tuple[SparkType, ...]] = {
    f.name: (f.dataType,) for f in SCHEMA.fields}
_ALLOWED["key"] = (StringType(), BinaryType())
_ALLOWED["value"] = (BinaryType(), StringType())


def _same_type(given: SparkType, allowed: SparkType) -> bool:
    if isinstance(allowed, MapType):  # whatever nullability the user wrote for the values
        return (isinstance(given, MapType) and given.keyType == allowed.keyType
                and given.valueType == allowed.valueType)
    return given == allowed


@dataclass(frozen=True)
class Columns:
    """What a read yields: the source's columns (`names`, lower case) in the order the
    user gave them, and the Arrow schema of the batches (the user's names and types)."""

    names: tuple[str, ...]
    arrow: pa.Schema

    def __post_init__(self) -> None:
        assert len(self.names) == len(self.arrow)


ALL_COLUMNS = Columns(tuple(SCHEMA.fieldNames()), ARROW_SCHEMA)


def columns(schema: StructType | None) -> Columns:
    """The columns of a user-given `schema` (all of them for None or the full schema): a
    `SchemaError` naming the column and what is allowed for an unknown column, a repeated
    one or a type the source cannot give."""
    if schema is None or schema == SCHEMA:
        return ALL_COLUMNS
    allowed = ", ".join(f"{n} {'/'.join(t.simpleString().upper() for t in ts)}"
                        for n, ts in _ALLOWED.items())
    if not schema.fields:
        raise SchemaError(f"raftmq source: the schema names no column; it may have any of "
                          f"{allowed}")
    names: list[str] = []
    for f in schema.fields:
        name = f.name.lower()  # (Spark resolves names case-insensitively by default)
        if name not in _ALLOWED:
            raise SchemaError(f"raftmq source: no column {f.name!r}; the schema may have any "
                              f"of {allowed}")
        if name in names:
            raise SchemaError(f"raftmq source: column {f.name!r} is in the schema twice")
        if not any(_same_type(f.dataType, t) for t in _ALLOWED[name]):
            want = " or ".join(t.simpleString().upper() for t in _ALLOWED[name])
            raise SchemaError(f"raftmq source: column {f.name!r} is "
                              f"{f.dataType.simpleString().upper()}, not {want}; the schema "
                              f"may have any of {allowed}")
        names.append(name)
    return Columns(tuple(names), to_arrow_schema(schema, timezone="UTC"))


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
