"""The `raftmq` Spark source against a real cluster: batch reads with every option, and
streams (admission control, Trigger.AvailableNow, replay of a micro-batch, a leader kill).

One SparkSession (`tests.spark_support.spark`, local[2]) and one 3-node cluster serve the
module; the messages each test reads were sent by the module fixture and are known exactly,
so every test compares whole rows with what was acknowledged.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from raftmq.client.blocking import connect_admin, connect_producer
from raftmq.localcluster import LocalCluster
from raftmq.spark.cluster import read_range
from raftmq.spark.options import QueueRange
from raftmq.spark.schema import columns
from tests.conftest import live_cluster, wait_for
from tests.spark_support import requires_java, spark
from wire.records import OutgoingMessage

pytestmark = [pytest.mark.live, requires_java]

TOPIC = "orders"
OTHER = "orders-eu"
PER_QUEUE = 30
QUEUES = 4


class Sent:
    """What the fixture's cluster acknowledged: (topic, queue, offset) -> message."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.namesrv = cluster.namesrv_addr
        self.rows: dict[tuple[str, int, int], OutgoingMessage] = {}

    def send(self, topic: str, queue: int, msgs: list[OutgoingMessage]) -> None:
        with connect_producer(self.namesrv) as p:
            for m in msgs:
                r = p.send(topic, m, queue=queue)
                self.rows[(topic, r.queue, r.offset)] = m

    def expected(self, topic: str, queues: range | list[int] = range(QUEUES),
                 lo: int = 0, hi: int | None = None) -> set[tuple[Any, ...]]:
        return {
            (t, q, o, m.body, m.key, m.tags, tuple(sorted(m.properties.items())))
            for (t, q, o), m in self.rows.items()
            if t == topic and q in queues and lo <= o < (hi if hi is not None else 1 << 62)
        }


def rows(df: Any) -> set[tuple[Any, ...]]:
    return {
        (r.topic, r.queue, r.offset, bytes(r.value), r.key, r.tags,
         tuple(sorted((r.properties or {}).items())))
        for r in df.collect()
    }


@pytest.fixture(scope="module")
def sent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sent]:
    with live_cluster(tmp_path_factory.mktemp("spark-src"), groups=2) as cluster:
        s = Sent(cluster)
        with connect_admin(s.namesrv) as admin:
            admin.create_topic(TOPIC, QUEUES)
            admin.create_topic(OTHER, 2)
        for q in range(QUEUES):
            s.send(TOPIC, q, [
                OutgoingMessage(f"{q}-{i}".encode() + b"\x00\xff", key=f"k{i % 7}",
                                tags="even" if i % 2 == 0 else "odd",
                                properties={"i": str(i), "q": str(q)})
                for i in range(PER_QUEUE)
            ])
        s.send(OTHER, 1, [OutgoingMessage(f"eu-{i}".encode()) for i in range(5)])
        yield s


def read(sent: Any, schema: str | None = None, **options: str) -> Any:
    reader = spark().read.format("raftmq").option("namesrv", sent.namesrv)
    if schema is not None:
        reader = reader.schema(schema)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


# ---------------------------------------------------------------- batch


def test_a_batch_read_returns_every_committed_message_with_its_fields(sent: Sent) -> None:
    df = read(sent, subscribe=TOPIC)
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "queue", "offset", "timestamp", "born_timestamp", "tags",
        "properties", "msg_id"]
    assert rows(df) == sent.expected(TOPIC)
    one = df.where("queue = 2 AND offset = 3").collect()[0]
    assert one.msg_id.startswith("g") and one.timestamp >= one.born_timestamp
    assert one.timestamp.year >= 2024  # milliseconds since the epoch, not seconds


def test_subscribe_lists_and_patterns_choose_topics(sent: Sent) -> None:
    both = sent.expected(TOPIC) | sent.expected(OTHER, [0, 1])
    assert rows(read(sent, subscribe=f"{TOPIC},{OTHER}")) == both
    assert rows(read(sent, subscribePattern="orders.*")) == both
    assert rows(read(sent, subscribePattern="orders-e.")) == sent.expected(OTHER, [0, 1])


def test_assign_reads_only_the_named_queues(sent: Sent) -> None:
    df = read(sent, assign=json.dumps({TOPIC: [1, 3]}))
    assert rows(df) == sent.expected(TOPIC, [1, 3])


def test_starting_and_ending_offsets_bound_each_queue(sent: Sent) -> None:
    df = read(sent, subscribe=TOPIC,
              startingOffsets=json.dumps({TOPIC: {"0": 5, "1": -2, "2": 29}}),
              endingOffsets=json.dumps({TOPIC: {"0": 10, "2": -1, "3": 4}}))
    want = (sent.expected(TOPIC, [0], 5, 10) | sent.expected(TOPIC, [1])
            | sent.expected(TOPIC, [2], 29) | sent.expected(TOPIC, [3], 0, 4))
    assert rows(df) == want
    assert rows(read(sent, subscribe=TOPIC, startingOffsets="earliest",
                     endingOffsets="latest")) == sent.expected(TOPIC)


def test_starting_and_ending_timestamps_map_to_offsets_when_the_query_starts(
        sent: Sent) -> None:
    """Kafka's startingTimestamp/endingTimestamp: each queue from its first message stored
    at or after the start to before its first one at or after the end."""
    stored = {(r.queue, r.offset): r.ms for r in read(sent, subscribe=TOPIC).selectExpr(
        "queue", "offset", "unix_millis(timestamp) AS ms").collect()}
    times = sorted(set(stored.values()))
    lo, hi = times[len(times) // 3], times[2 * len(times) // 3]
    # the fixture filled the queues one after the other: a queue filled before `lo`
    # has nothing stored after it, and starts at its end (else the query would fail)
    df = read(sent, subscribe=TOPIC, startingTimestamp=str(lo), endingTimestamp=str(hi),
              startingOffsetsByTimestampStrategy="latest")
    got = {(r.queue, r.offset) for r in df.collect()}
    # one leader stamped them all, so each queue's store times grow with its offsets
    assert got == {k for k, ms in stored.items() if lo <= ms < hi} and got
    per_queue = read(sent, subscribe=TOPIC, startingOffsetsByTimestamp=json.dumps(
        {TOPIC: {"1": hi}}), endingOffsetsByTimestamp=json.dumps({TOPIC: {"0": lo}}),
        startingOffsetsByTimestampStrategy="latest")
    assert {(r.queue, r.offset) for r in per_queue.collect()} == {
        k for k, ms in stored.items()
        if (k[0] != 1 or ms >= hi) and (k[0] != 0 or ms < lo)}
    late = str(times[-1] + 1)
    with pytest.raises(Exception, match="no message stored at or after"):
        read(sent, subscribe=TOPIC, startingTimestamp=late).collect()
    assert read(sent, subscribe=TOPIC, startingTimestamp=late,
                startingOffsetsByTimestampStrategy="latest").count() == 0


def test_tags_select_messages_on_the_broker(sent: Sent) -> None:
    df = read(sent, subscribe=TOPIC, tags="even")
    assert rows(df) == {r for r in sent.expected(TOPIC) if r[5] == "even"}
    assert rows(read(sent, subscribe=TOPIC, tags="even || odd")) == sent.expected(TOPIC)


def test_a_sql92_filter_selects_messages_on_the_broker(sent: Sent) -> None:
    def props(r: tuple[Any, ...]) -> dict[str, str]:
        return dict(r[6])

    df = read(sent, subscribe=TOPIC, filter="i >= 20 AND q IN ('1', '3')")
    assert rows(df) == {r for r in sent.expected(TOPIC)
                        if int(props(r)["i"]) >= 20 and props(r)["q"] in ("1", "3")}
    both = read(sent, subscribe=TOPIC, tags="odd", filter="i < 9 AND KEYS <> 'k3'")
    assert rows(both) == {r for r in sent.expected(TOPIC)
                          if r[5] == "odd" and int(props(r)["i"]) < 9 and r[4] != "k3"}


def test_min_partitions_splits_queue_ranges_without_changing_the_rows(sent: Sent) -> None:
    plain = read(sent, subscribe=TOPIC)
    split = read(sent, subscribe=TOPIC, minPartitions="9")
    assert plain.rdd.getNumPartitions() == QUEUES
    assert split.rdd.getNumPartitions() >= 9
    assert rows(split) == sent.expected(TOPIC)
    counts = {r.queue: r["count"] for r in split.groupBy("queue").count().collect()}
    assert counts == dict.fromkeys(range(QUEUES), PER_QUEUE)


def test_a_user_given_schema_reads_only_its_columns_in_its_order(sent: Sent) -> None:
    df = read(sent, "offset LONG, queue INT, value BINARY", subscribe=TOPIC)
    assert [f.name for f in df.schema.fields] == ["offset", "queue", "value"]
    assert {(r.queue, r.offset, bytes(r.value)) for r in df.collect()} == {
        (q, o, body) for (_t, q, o, body, *_rest) in sent.expected(TOPIC)}
    counts = read(sent, "queue INT", subscribe=TOPIC).groupBy("queue").count().collect()
    assert {r.queue: r["count"] for r in counts} == dict.fromkeys(range(QUEUES), PER_QUEUE)
    # tags select on a column the schema leaves out; keys may be read as bytes
    tagged = read(sent, "key BINARY, offset LONG, queue INT", subscribe=TOPIC, tags="even")
    assert {(r.queue, r.offset, bytes(r.key)) for r in tagged.collect()} == {
        (q, o, key.encode()) for (_t, q, o, _b, key, tags, _p) in sent.expected(TOPIC)
        if tags == "even"}


def test_messages_sent_in_batches_read_back_whole_with_their_ids(sent: Sent) -> None:
    # a batch's records lie end to end in its entry, and a FETCH answers each run of
    # them as one slice of the entry: every record must come back whole, with its id
    topic = "batched"
    with connect_admin(sent.namesrv) as admin:
        admin.create_topic(topic, 2)
    want: dict[tuple[int, int], tuple[bytes, str, str | None]] = {}
    with connect_producer(sent.namesrv) as p:
        for i, size in enumerate([1, 7, 300, 2, 900, 1, 40]):
            msgs = [OutgoingMessage(f"b{i}-{j}.".encode() * (j % 5 + 1),
                                    key=f"k{j}" if j % 3 else "", tags="t" if j % 2 else "",
                                    properties={"j": str(j)} if j % 4 == 0 else {})
                    for j in range(size)]
            for m, r in zip(msgs, p.send_batch(topic, msgs, queue=i % 2), strict=True):
                want[(r.queue, r.offset)] = (m.body, m.key, r.msg_id)
    df = read(sent, "queue INT, offset LONG, value BINARY, key STRING, msg_id STRING",
              subscribe=topic)
    got = {(r.queue, r.offset): (bytes(r.value), r.key, r.msg_id) for r in df.collect()}
    assert got == want


# ---------------------------------------------------------------- the read loop

LONG = "long-range"  # (not matched by the patterns above)
LONG_COUNT = 2600  # three FETCHes: a FETCH answers at most 1024 messages


@pytest.fixture(scope="module")
def long_range(sent: Sent) -> str:
    """A one-queue topic whose range takes several FETCHes, its bodies their offsets."""
    with connect_admin(sent.namesrv) as admin:
        admin.create_topic(LONG, 1)
    with connect_producer(sent.namesrv) as p:
        for i in range(0, LONG_COUNT, 500):
            p.send_batch(LONG, [str(j).encode() for j in range(i, min(i + 500, LONG_COUNT))],
                         queue=0)
    return LONG


def _read_long(sent: Sent, start: int = 0, end: int = LONG_COUNT,
               timeout: float = 30) -> Generator[pa.RecordBatch, None, None]:
    return read_range(QueueRange(LONG, 0, start, end), (sent.namesrv,),
                      fail_on_data_loss=True, timeout=timeout, columns=columns(None))


def test_a_range_of_several_fetches_reads_back_whole_and_in_order(
        sent: Sent, long_range: str) -> None:
    # the batches are fetched ahead of Spark's thread: none lost, repeated or reordered
    got = read(sent, "offset LONG, value BINARY", subscribe=long_range).collect()
    assert [(r.offset, bytes(r.value)) for r in got] == [
        (i, str(i).encode()) for i in range(LONG_COUNT)]


def test_a_read_stopped_early_ends_at_once_and_leaves_no_thread(
        sent: Sent, long_range: str) -> None:
    threads = threading.active_count()
    reader = _read_long(sent)
    first = next(reader)
    assert first.column("offset")[0].as_py() == 0
    time.sleep(0.5)  # the rest fetched ahead: the hand-over now waits for room
    begun = time.monotonic()
    reader.close()  # as Spark does after a LIMIT
    assert time.monotonic() - begun < 2
    wait_for(lambda: threading.active_count() == threads, 5, "the read's threads to end")


def test_a_read_that_fails_raises_in_the_thread_that_reads(
        sent: Sent, long_range: str) -> None:
    # offsets never committed: each FETCH is refused until the range's timeout
    with pytest.raises(TimeoutError, match="no message at committed offset 2600"):
        list(_read_long(sent, LONG_COUNT, LONG_COUNT + 5, timeout=1))


def test_a_read_spares_the_workers_collections_what_was_alive_before_it(
        sent: Sent, long_range: str) -> None:
    """PySpark's worker runs a full gc.collect() after every task: what the worker held
    when a read started must be frozen, out of those collections' way."""
    class Held:
        pass

    held = Held()
    gc.unfreeze()
    try:
        assert any(o is held for o in gc.get_objects())
        assert sum(b.num_rows for b in _read_long(sent, 0, 10)) == 10
        assert not any(o is held for o in gc.get_objects())
    finally:
        gc.unfreeze()


@pytest.mark.parametrize(("schema", "message"), [
    ("queue INT, partition INT", "no column 'partition'; the schema may have any of key"),
    ("offset INT", "column 'offset' is INT, not BIGINT"),
])
def test_a_bad_schema_is_refused_before_the_cluster_is_asked(schema: str, message: str) -> None:
    nowhere = SimpleNamespace(namesrv="127.0.0.1:9")  # nothing listens: no read could start
    with pytest.raises(Exception, match=message):
        read(nowhere, schema, subscribe=TOPIC).collect()
    with pytest.raises(Exception, match=message):
        (spark().readStream.format("raftmq").schema(schema).option("namesrv", nowhere.namesrv)
         .option("subscribe", TOPIC).load().writeStream.format("noop").start()
         .awaitTermination(120))


# (every malformed option is refused without Spark in tests/spark/test_options.py; these
# are the refusals that need the cluster, and one that shows how Spark reports them)
@pytest.mark.parametrize(("options", "message"), [
    ({"subscribe": TOPIC, "endingOffsets": json.dumps({TOPIC: {"0": 999}})}, "ends at 30"),
    ({"subscribe": TOPIC, "startingOffsets": json.dumps({"nope": {"0": 1}})},
     "does not read"),
    ({"assign": json.dumps({TOPIC: [7]})}, "has queues 0..3"),
])
def test_bad_options_fail_with_a_clear_message(sent: Sent, options: dict[str, str],
                                               message: str) -> None:
    with pytest.raises(Exception, match=message):
        read(sent, **options).collect()


# ---------------------------------------------------------------- streaming


def run_stream(sent: Sent, checkpoint: Path, batches: list[tuple[int, list[Any]]],
               **options: str) -> Any:
    """A query with Trigger.AvailableNow over `options`, each micro-batch's (id, rows)
    appended to `batches`; returns the finished query."""
    reader = spark().readStream.format("raftmq").option("namesrv", sent.namesrv)
    for k, v in options.items():
        reader = reader.option(k, v)

    def each(df: Any, batch_id: int) -> None:
        batches.append((batch_id, sorted(rows(df))))

    query = (reader.load().writeStream.foreachBatch(each)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    return query


def test_max_offsets_per_trigger_caps_each_micro_batch_and_a_replay_reads_the_same_rows(
    sent: Sent, tmp_path: Path
) -> None:
    batches: list[tuple[int, list[Any]]] = []
    run_stream(sent, tmp_path / "cp", batches, subscribe=TOPIC, startingOffsets="earliest",
               maxOffsetsPerTrigger="50")
    sizes = [len(b) for _, b in batches if b]
    assert sum(sizes) == QUEUES * PER_QUEUE and max(sizes) <= 50 and len(sizes) >= 3, sizes
    assert set().union(*(set(b) for _, b in batches)) == sent.expected(TOPIC)
    # forget that the last batch was done: the restarted query runs it again from the
    # offsets in its log, and reads exactly the same rows
    last_id, last_rows = batches[-1]
    for name in (str(last_id), f".{last_id}.crc"):  # the commit and its checksum file
        (tmp_path / "cp" / "commits" / name).unlink(missing_ok=True)
    again: list[tuple[int, list[Any]]] = []
    run_stream(sent, tmp_path / "cp", again, subscribe=TOPIC, startingOffsets="earliest",
               maxOffsetsPerTrigger="50")
    assert again[0] == (last_id, last_rows)


def test_a_stream_with_a_user_given_schema_reads_only_its_columns(
    sent: Sent, tmp_path: Path
) -> None:
    got: list[tuple[Any, ...]] = []
    names: list[list[str]] = []

    def each(df: Any, _batch_id: int) -> None:
        names.append(df.columns)
        got.extend((r.queue, r.offset, r.value) for r in df.collect())

    query = (spark().readStream.format("raftmq").schema("queue INT, offset LONG, value STRING")
             .option("namesrv", sent.namesrv).option("subscribe", OTHER)
             .option("startingOffsets", "earliest").load()
             .writeStream.foreachBatch(each).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    assert names and all(n == ["queue", "offset", "value"] for n in names)
    assert sorted(got) == [(1, i, f"eu-{i}") for i in range(5)]


def test_a_stream_reads_on_across_a_leader_kill(sent: Sent, tmp_path: Path) -> None:
    cluster = sent.cluster
    topic = "stream-kill"
    with connect_admin(sent.namesrv) as admin:
        admin.create_topic(topic, 2)
        victim_group = admin.describe_topic(topic).queues[0].group
    got: list[tuple[Any, ...]] = []
    lock = threading.Lock()

    def each(df: Any, _batch_id: int) -> None:
        batch = [(r.queue, r.offset, bytes(r.value)) for r in df.collect()]
        with lock:
            got.extend(batch)

    query = (spark().readStream.format("raftmq").option("namesrv", sent.namesrv)
             .option("subscribe", topic).option("startingOffsets", "earliest").load()
             .writeStream.foreachBatch(each).trigger(processingTime="500 milliseconds")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    acked: dict[tuple[int, int], bytes] = {}
    try:
        def send(lo: int, hi: int) -> None:
            with connect_producer(sent.namesrv) as p:
                for i in range(lo, hi):
                    body = f"s{i}".encode()
                    r = p.send(topic, body, queue=i % 2)
                    acked[(r.queue, r.offset)] = body

        send(0, 40)
        wait_for(lambda: len(got) >= 10, 120, "the stream's first rows")
        leader = cluster.leaders()[victim_group]
        assert leader is not None
        cluster.kill(leader)
        try:
            send(40, 80)  # the producer rides out the election
            wait_for(lambda: len(got) >= len(acked), 180, "every acknowledged row streamed")
        finally:
            cluster.restart_and_wait(leader)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    assert sorted(got) == sorted((q, o, b) for (q, o), b in acked.items())


def test_a_stream_from_latest_sees_only_new_messages(sent: Sent, tmp_path: Path) -> None:
    topic = "stream-latest"
    with connect_admin(sent.namesrv) as admin:
        admin.create_topic(topic, 1)
    with connect_producer(sent.namesrv) as p:
        p.send(topic, b"old", queue=0)
    got: list[bytes] = []
    query = (spark().readStream.format("raftmq").option("namesrv", sent.namesrv)
             .option("subscribe", topic).load()
             .writeStream.foreachBatch(lambda df, _i: got.extend(bytes(r.value)
                                                                  for r in df.collect()))
             .trigger(processingTime="300 milliseconds")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        wait_for(lambda: query.lastProgress is not None, 120, "the first micro-batch")
        with connect_producer(sent.namesrv) as p:
            p.send(topic, b"new", queue=0)
        wait_for(lambda: got, 120, "the new message")
    finally:
        query.stop()
    assert got == [b"new"]


def test_fail_on_data_loss_fails_or_skips_a_range_retention_removed(tmp_path: Path) -> None:
    from tests.broker.duties.test_retention_in_nodes import (
        BY_DISK,
        cluster_with,
        earliest_offset,
        produce,
    )

    with cluster_with(tmp_path, BY_DISK) as live:  # every closed segment is deleted
        produce(live, 40)  # 320 messages over about ten segments
        lo = wait_for(lambda: earliest_offset(live), 60, "retention deleting a prefix")
        source = SimpleNamespace(namesrv=live.cluster.namesrv_addr)
        wanted = json.dumps({live.topic: {"0": 0}})
        with pytest.raises(Exception, match=r"offsets 0\.\.\d+ were removed by retention"):
            read(source, subscribe=live.topic, startingOffsets=wanted).collect()
        got = read(source, subscribe=live.topic, startingOffsets=wanted,
                   failOnDataLoss="false").select("offset", "value").collect()
        lo = earliest_offset(live)  # (nothing is written now, so it no longer moves)
        assert sorted(r.offset for r in got) == list(range(lo, 320))
        assert all(bytes(r.value) == live.acked[0][r.offset][-512:] for r in got)
