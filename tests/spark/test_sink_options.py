"""The sink's pure parts: options, the columns' check, rows to messages, chunk cuts and
the progress rule. No Spark session, no cluster."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (  # noqa: E402
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from raftmq.spark.options import OptionError  # noqa: E402
from raftmq.spark.sink import Progress, SinkError, chunks, to_messages  # noqa: E402
from raftmq.spark.sink_options import check_schema, parse_sink_options  # noqa: E402

NS = {"namesrv": "127.0.0.1:9876"}


def test_defaults_are_exactly_once_with_the_broker_sized_transactions() -> None:
    o = parse_sink_options({**NS, "topic": "t", "queryName": "q"}, stream=True)
    assert o.exactly_once and o.query == "q" and o.transaction_rows == 5000
    assert o.topic == "t" and o.namesrv == ("127.0.0.1:9876",)
    alo = parse_sink_options({**NS, "DELIVERYGUARANTEE": "atleastonce"}, stream=True)
    assert not alo.exactly_once and alo.query is None  # no query name needed


@pytest.mark.parametrize("options, stream, error", [
    ({}, False, "'namesrv' is required"),
    ({**NS}, True, "'queryName' is required"),
    ({**NS, "queryName": "a b"}, True, "queryName is 1-80 characters"),
    ({**NS, "deliveryGuarantee": "maybe"}, False, "deliveryGuarantee is"),
    ({**NS, "topic": "bad topic"}, False, "topic: invalid topic name"),
    ({**NS, "transactionRows": "0"}, False, "transactionRows must be an integer in 1..10000"),
    ({**NS, "transactionRows": "10001"}, False, "transactionRows must be"),
    ({**NS, "queryName": "q", "batchId": "1"}, True, "batchId is for batch writes only"),
    ({**NS, "batchId": "1"}, False, "batchId needs queryName"),
    ({**NS, "queryName": "q", "batchId": "-1"}, False, "batchId must be an integer"),
    ({**NS, "subscribe": "t"}, False, "unknown option(s) ['subscribe']"),
    ({**NS, "path": "/x"}, False, "takes no path"),
])
def test_bad_options_are_refused(options: dict[str, str], stream: bool, error: str) -> None:
    with pytest.raises(OptionError) as info:
        parse_sink_options(options, stream=stream)
    assert error in str(info.value)


def _schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(n, t) for n, t in fields])  # type: ignore[arg-type]


def test_the_schema_check_names_what_is_wrong() -> None:
    o = parse_sink_options({**NS, "topic": "t"}, stream=False)
    cols = check_schema(_schema(("properties", MapType(StringType(), StringType())),
                                ("value", StringType()), ("queue", LongType()),
                                ("offset", LongType()), ("msg_id", StringType())), o)
    assert cols == ("value", "queue", "properties")  # the source's extra columns ignored
    no_topic = parse_sink_options(NS, stream=False)
    with pytest.raises(OptionError, match="no topic to write to"):
        check_schema(_schema(("value", BinaryType())), no_topic)
    assert check_schema(_schema(("value", BinaryType()), ("topic", StringType())),
                        no_topic) == ("value", "topic")
    with pytest.raises(OptionError, match="column 'key' must be string, not int"):
        check_schema(_schema(("value", BinaryType()), ("key", IntegerType())), o)


def test_rows_become_messages_and_bad_rows_are_named() -> None:
    batch = pa.RecordBatch.from_pydict({
        "value": pa.array([b"a", b"b"]), "key": pa.array(["k", None]),
        "queue": pa.array([1, None], pa.int32()),
        "properties": pa.array([[("x", "1")], None], pa.map_(pa.string(), pa.string())),
    })
    out = list(to_messages([batch], ("value", "key", "queue", "properties")))
    assert [(t, q, m.body, m.key, m.properties, at) for t, q, m, at in out] == [
        (None, 1, b"a", "k", {"x": "1"}, None), (None, None, b"b", "", {}, None)]
    bad = pa.RecordBatch.from_pydict({"value": pa.array([b"a", None])})
    with pytest.raises(SinkError, match="row 1 of this partition has a null 'value'"):
        list(to_messages([bad], ("value",)))


def test_a_deliver_at_column_makes_delayed_messages_in_utc() -> None:
    o = parse_sink_options({**NS, "topic": "t"}, stream=False)
    cols = check_schema(_schema(("value", BinaryType()), ("deliverAt", TimestampType())), o)
    assert cols == ("value", "deliverAt")  # the schema's own spelling, to read it by
    with pytest.raises(OptionError, match="column 'deliverAt' must be a timestamp"):
        check_schema(_schema(("value", BinaryType()), ("deliverAt", StringType())), o)
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    batch = pa.RecordBatch.from_pydict({
        "value": pa.array([b"a", b"b"]),
        "deliverAt": pa.array([when.replace(tzinfo=None), None], pa.timestamp("us")),
    })
    out = list(to_messages([batch], cols))
    assert [(m.body, at) for _t, _q, m, at in out] == [(b"a", when), (b"b", None)]


def test_chunks_cut_the_same_rows_the_same_way_and_progress_counts_them() -> None:
    rows = iter(range(23))
    assert [len(c) for c in chunks(rows, 10)] == [10, 10, 3]  # type: ignore[arg-type]
    p = Progress(batch_id=7, chunks=2)
    assert p.done(7, 0) and p.done(7, 1) and not p.done(7, 2)
    assert not p.done(8, 0)  # a new batch starts from its first chunk
