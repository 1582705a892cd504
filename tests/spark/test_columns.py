"""A user-given schema narrows the `raftmq` source: `schema.columns` checks it and
`arrow_fetch.fetch_to_batch` builds only its columns, in its order, with its types.

The narrowed batches are compared with the full decode (itself checked against the SDK's
per-message decode in tests/spark/test_arrow_fetch.py), column by column.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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

from raftmq.spark.arrow_fetch import fetch_to_batch
from raftmq.spark.schema import ALL_COLUMNS, SCHEMA, SchemaError, columns
from tests.spark.test_arrow_fetch import GROUP, QUEUE, TOPIC, Answer, answer, arrow, batches
from wire.protocol import Code, RequestError
from wire.records import OutgoingMessage

NAMES = SCHEMA.fieldNames()


def schema(*fields: tuple[str, Any]) -> StructType:
    return StructType([StructField(name, type_) for name, type_ in fields])


def narrow(ans: Answer, s: StructType, **kwargs: Any) -> pa.RecordBatch:
    header, body = ans
    return fetch_to_batch(TOPIC, QUEUE, GROUP, header, body, columns=columns(s), **kwargs)


# ---------------------------------------------------------------- the schema's checks


def test_no_schema_or_the_full_one_reads_every_column() -> None:
    assert columns(None) is ALL_COLUMNS
    assert columns(SCHEMA) is ALL_COLUMNS
    assert ALL_COLUMNS.names == tuple(NAMES)


def test_a_subset_in_any_order_keeps_the_users_names_and_types() -> None:
    got = columns(schema(("Offset", LongType()), ("queue", IntegerType()),
                         ("value", StringType()), ("key", BinaryType())))
    assert got.names == ("offset", "queue", "value", "key")
    assert got.arrow.names == ["Offset", "queue", "value", "key"]
    assert got.arrow.types == [pa.int64(), pa.int32(), pa.string(), pa.binary()]


@pytest.mark.parametrize(("fields", "message"), [
    ([("queue", IntegerType()), ("partition", IntegerType())], "no column 'partition'"),
    ([("queue", LongType())], "column 'queue' is BIGINT, not INT"),
    ([("offset", IntegerType())], "column 'offset' is INT, not BIGINT"),
    ([("timestamp", LongType())], "column 'timestamp' is BIGINT, not TIMESTAMP"),
    ([("value", IntegerType())], "column 'value' is INT, not BINARY or STRING"),
    ([("properties", MapType(StringType(), BinaryType()))],
     "column 'properties' is MAP<STRING,BINARY>, not MAP<STRING,STRING>"),
    ([("queue", IntegerType()), ("QUEUE", IntegerType())], "'QUEUE' is in the schema twice"),
    ([], "names no column"),
])
def test_a_bad_schema_is_refused_naming_the_column_and_what_is_allowed(
        fields: list[tuple[str, Any]], message: str) -> None:
    with pytest.raises(SchemaError, match=message) as err:
        columns(schema(*fields))
    if fields and "twice" not in message:  # the allowed set, so the user can fix it
        assert ("key STRING/BINARY, value BINARY/STRING, topic STRING, queue INT, offset "
                "BIGINT, timestamp TIMESTAMP, born_timestamp TIMESTAMP, tags STRING, "
                "properties MAP<STRING,STRING>, msg_id STRING") in str(err.value)


# ---------------------------------------------------------------- narrowed batches


@settings(max_examples=150, deadline=None)
@given(batches, st.lists(st.sampled_from(NAMES), min_size=1, unique=True))
def test_any_subset_reads_the_same_values_as_the_full_batch(
        bs: list[list[OutgoingMessage | bytes]], names: list[str]) -> None:
    ans = answer(bs)
    full = arrow(ans)
    s = StructType([SCHEMA[name] for name in names])
    got = narrow(ans, s)
    assert got.schema.names == names
    assert got.to_pydict() == full.select(names).to_pydict()


def test_columns_made_from_the_header_do_not_read_the_body() -> None:
    header, body = answer([[OutgoingMessage(b"v%d" % i, key="k") for i in range(20)]])
    garbage = b"\xff" * len(body)  # no record in it could be decoded
    s = schema(("msg_id", StringType()), ("queue", IntegerType()), ("offset", LongType()),
               ("timestamp", TimestampType()), ("topic", StringType()))
    got = narrow((header, garbage), s)
    assert got.to_pydict() == arrow((header, body)).select(s.fieldNames()).to_pydict()
    for body_column in ("value", "key", "tags", "properties", "born_timestamp"):
        with pytest.raises(RequestError) as err:
            narrow((header, garbage), StructType([SCHEMA["offset"], SCHEMA[body_column]]))
        assert err.value.code == Code.MALFORMED


def test_tags_and_end_select_rows_even_when_tags_is_not_a_column() -> None:
    msgs = [OutgoingMessage(b"%d" % i, tags=["TagA", "TagB", ""][i % 3]) for i in range(30)]
    ans = answer([msgs])
    full = arrow(ans, tags=["TagA"], end=60).select(["offset", "value"]).to_pydict()
    got = narrow(ans, schema(("offset", LongType()), ("value", BinaryType())),
                 tags=["TagA"], end=60)
    assert got.to_pydict() == full and 0 < got.num_rows < 30
    assert narrow(ans, schema(("offset", LongType())), end=40).num_rows == 0


def test_no_messages_is_an_empty_batch_of_the_narrow_schema() -> None:
    s = schema(("queue", IntegerType()))
    got = fetch_to_batch(TOPIC, QUEUE, GROUP, {"next": 3, "msgs": []}, b"",
                         columns=columns(s))
    assert got.num_rows == 0 and got.schema == columns(s).arrow


def test_value_as_text_and_key_as_bytes() -> None:
    ans = answer([[OutgoingMessage("тело".encode(), key="ключ"), b"plain"]])
    got = narrow(ans, schema(("value", StringType()), ("key", BinaryType())))
    assert got.to_pydict() == {"value": ["тело", "plain"], "key": ["ключ".encode(), b""]}
    assert narrow(answer([[b"a", b"b"]]), schema(("key", BinaryType()))).to_pydict() == {
        "key": [b"", b""]}


def test_value_as_text_refuses_a_body_that_is_not_utf8() -> None:
    ans = answer([[b"fine", b"\xff\xfe"]], first=70)
    with pytest.raises(ValueError, match=r"offsets 70\.\.71 is not UTF-8 text; read `value` "
                                         r"as BINARY"):
        narrow(ans, schema(("value", StringType())))
    assert narrow(ans, schema(("value", BinaryType()))).column(0).to_pylist() == [
        b"fine", b"\xff\xfe"]
