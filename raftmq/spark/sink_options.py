"""The options and input columns of the `raftmq` Spark sink, parsed and checked.

Pure: no Spark session, no network. Everything here is checked on the driver before a
single row is written, so a typo fails the query instead of half of a batch.

Columns (Spark's Kafka sink's, with raftmq's queue, tags and properties):

- ``value`` (required): binary or string (a string is sent as its UTF-8 bytes);
- ``key``: string (RocketMQ's keys; with the default selector it picks the queue);
- ``topic``: string; rows whose topic is null go to the ``topic`` option;
- ``queue``: an integer column naming the queue (null: chosen by key or round robin);
- ``tags``: string; ``properties``: map<string,string>;
- ``deliverAt``: a timestamp: the row becomes a delayed message, in its queue at that
  time, never before (null: at once; a time past: at once; beyond the cluster's
  ``max_delay_s``: the write fails).

The other columns of the `raftmq` source (``offset``, ``timestamp``, ``born_timestamp``,
``msg_id``) are ignored, so a stream read from raftmq can be written back unchanged; any
other column is refused (a misspelt ``tag`` would otherwise be dropped silently).

Options: ``namesrv`` (required); ``topic``; ``deliveryGuarantee`` = ``exactlyOnce`` (the
default) or ``atLeastOnce``; ``queryName`` (required by exactly-once streams: it names
the query's transactional ids and progress records, and must stay the same across
restarts from one checkpoint); ``batchId`` (batch writes: with ``queryName``, a job run
again with the same pair writes nothing twice); ``transactionRows`` (rows per
transaction, at most 10,000, the broker's limit; must not change across restarts of a
query); ``testPauseMs``
(for tests only: a pause before and after each commit, to kill a query in between).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from wire.protocol import RequestError, validate_topic_name

from .options import OptionError

__all__ = [
    "COLUMNS",
    "IGNORED",
    "MAX_TRANSACTION_ROWS",
    "SinkOptions",
    "check_schema",
    "parse_sink_options",
]

MAX_TRANSACTION_ROWS = 10_000  # broker.state.parts.txpart.MAX_TX_MESSAGES
DEFAULT_TRANSACTION_ROWS = 5_000
_QUERY = re.compile(r"[A-Za-z0-9_.-]{1,80}")
_MAX_BATCH = (1 << 62) - 1

COLUMNS = ("value", "key", "topic", "queue", "tags", "properties", "deliverat")
IGNORED = ("offset", "timestamp", "born_timestamp", "msg_id")
_KNOWN = {"namesrv", "topic", "deliveryguarantee", "queryname", "batchid", "transactionrows",
          "testpausems", "checkpointlocation", "path"}

Guarantee = Literal["exactlyOnce", "atLeastOnce"]


@dataclass(frozen=True, slots=True)
class SinkOptions:
    namesrv: tuple[str, ...]
    topic: str | None
    guarantee: Guarantee
    query: str | None  # None: a batch write without queryName (a fresh name per job)
    batch_id: int
    transaction_rows: int
    test_pause_ms: int = 0

    @property
    def exactly_once(self) -> bool:
        return self.guarantee == "exactlyOnce"


def _topic(name: str, value: str) -> str:
    try:
        return validate_topic_name(value)
    except RequestError as exc:
        raise OptionError(f"{name}: {exc.message}") from None


def _int(name: str, text: str, lo: int, hi: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise OptionError(f"{name} must be an integer in {lo}..{hi}, not {text!r}")
    return value


def parse_sink_options(options: Mapping[str, str], *, stream: bool) -> SinkOptions:
    """Check the sink's options (names are case-insensitive, as Spark passes them)."""
    opts = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(opts) - _KNOWN)
    if unknown:
        raise OptionError(f"unknown option(s) {unknown} of the raftmq sink (known: "
                          "namesrv, topic, deliveryGuarantee, queryName, batchId, "
                          "transactionRows)")
    if "path" in opts:
        raise OptionError("the raftmq sink takes no path: name the topic with the 'topic' "
                          "option or a 'topic' column")
    namesrv = tuple(a.strip() for a in opts.get("namesrv", "").split(",") if a.strip())
    if not namesrv:
        raise OptionError("option 'namesrv' is required: the name server address(es), "
                          "e.g. 127.0.0.1:9876")
    topic = _topic("topic", opts["topic"]) if "topic" in opts else None
    word = opts.get("deliveryguarantee", "exactlyOnce")
    guarantee: Guarantee
    if word.lower() == "exactlyonce":
        guarantee = "exactlyOnce"
    elif word.lower() == "atleastonce":
        guarantee = "atLeastOnce"
    else:
        raise OptionError(f"deliveryGuarantee is 'exactlyOnce' (the default) or "
                          f"'atLeastOnce', not {word!r}")
    query = opts.get("queryname")
    if query is not None and not _QUERY.fullmatch(query):
        raise OptionError(f"queryName is 1-80 characters from A-Z a-z 0-9 _ . -, not {query!r}")
    if stream and guarantee == "exactlyOnce" and query is None:
        raise OptionError(
            "option 'queryName' is required for an exactly-once stream: it names the "
            "query's transactions and progress records (Spark does not tell a Python sink "
            "its query id); keep it the same for every restart from one checkpoint, or set "
            "deliveryGuarantee=atLeastOnce")
    if "batchid" in opts:
        if stream:
            raise OptionError("batchId is for batch writes only: a stream's batches are "
                              "numbered by Spark")
        if query is None:
            raise OptionError("batchId needs queryName: the pair names the write")
    batch_id = _int("batchId", opts["batchid"], 0, _MAX_BATCH) if "batchid" in opts else 0
    rows = (_int("transactionRows", opts["transactionrows"], 1, MAX_TRANSACTION_ROWS)
            if "transactionrows" in opts else DEFAULT_TRANSACTION_ROWS)
    pause = _int("testPauseMs", opts["testpausems"], 0, 600_000) if "testpausems" in opts else 0
    return SinkOptions(namesrv=namesrv, topic=topic, guarantee=guarantee, query=query,
                       batch_id=batch_id, transaction_rows=rows, test_pause_ms=pause)


def _is_int(t: DataType) -> bool:
    return isinstance(t, ByteType | ShortType | IntegerType | LongType)


_WANT: dict[str, tuple[str, object]] = {
    "value": ("binary or string", lambda t: isinstance(t, BinaryType | StringType)),
    "key": ("string", lambda t: isinstance(t, StringType)),
    "topic": ("string", lambda t: isinstance(t, StringType)),
    "queue": ("an integer type", _is_int),
    "tags": ("string", lambda t: isinstance(t, StringType)),
    "properties": ("map<string,string>", lambda t: isinstance(t, MapType)
                   and isinstance(t.keyType, StringType)
                   and isinstance(t.valueType, StringType)),
    "deliverat": ("a timestamp", lambda t: isinstance(t, TimestampType | TimestampNTZType)),
}


def check_schema(schema: StructType, opts: SinkOptions) -> tuple[str, ...]:
    """The sink's columns present in `schema` (in `COLUMNS` order), or an `OptionError`
    naming what is wrong: a missing `value`, a column of the wrong type, an unknown
    column, or no topic at all (neither column nor option)."""
    fields = {f.name.lower(): f for f in schema.fields}
    if "value" not in fields:
        raise OptionError(f"the raftmq sink needs a 'value' column (binary or string); the "
                          f"data has {[f.name for f in schema.fields]}")
    unknown = [f.name for f in schema.fields if f.name.lower() not in (*COLUMNS, *IGNORED)]
    if unknown:
        raise OptionError(f"unknown column(s) {unknown} for the raftmq sink: it writes "
                          f"{list(COLUMNS)} (and ignores {list(IGNORED)})")
    for name, (what, ok) in _WANT.items():
        f = fields.get(name)
        if f is not None and not ok(f.dataType):  # type: ignore[operator]
            raise OptionError(f"column {f.name!r} must be {what}, not "
                              f"{f.dataType.simpleString()}")
    if "topic" not in fields and opts.topic is None:
        raise OptionError("no topic to write to: set the 'topic' option or add a 'topic' "
                          "column")
    return tuple(fields[c].name for c in COLUMNS if c in fields)
