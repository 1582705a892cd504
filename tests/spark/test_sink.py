"""The `raftmq` Spark sink against a real cluster: batch and streaming writes, every
column, bad input refused before anything is written, a replayed batch id written once,
and a streaming query killed mid-batch (its whole process: driver, JVM and workers) and
restarted from its checkpoint, after which every input row is in the output once.

One SparkSession (`tests.spark_support.spark`, local[2]) and one cluster serve the
module; each test writes to topics of its own and reads what was stored back with the
SDK (FETCH serves committed messages only: read-committed).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from raftmq.client.blocking import connect_admin, connect_producer, connect_pull_consumer
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster
from tests.paths import REPO_ROOT as ROOT
from tests.spark_support import requires_java, spark
from wire.records import Message, OutgoingMessage

pytestmark = [pytest.mark.live, requires_java]



@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("spark-sink"), groups=2) as c:
        yield c


def topic(cluster: LocalCluster, name: str, queues: int = 4) -> str:
    with connect_admin(cluster.namesrv_addr) as admin:
        admin.create_topic(name, queues)
    return name


def stored(cluster: LocalCluster, name: str) -> list[Message]:
    """Every committed message of topic `name`, queue by queue."""
    with connect_admin(cluster.namesrv_addr) as admin:
        queues = admin.describe_topic(name).total
    out: list[Message] = []
    with connect_pull_consumer(cluster.namesrv_addr, "sink-test-reader") as c:
        for q in range(queues):
            offset = 0
            while True:
                r = c.pull(name, q, offset, wait_ms=0)
                out += r.messages
                if r.next_offset >= r.end_offset:
                    break
                offset = r.next_offset
    return out


def bodies(cluster: LocalCluster, name: str) -> Counter[bytes]:
    return Counter(m.body for m in stored(cluster, name))


def write(df: Any, cluster: LocalCluster, **options: str) -> None:
    w = df.write.format("raftmq").mode("append").option("namesrv", cluster.namesrv_addr)
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def values_df(values: list[bytes], partitions: int = 3) -> Any:
    schema = StructType([StructField("value", BinaryType())])
    return spark().createDataFrame([(v,) for v in values], schema).repartition(partitions)


# ---------------------------------------------------------------- batch


def test_a_batch_write_is_read_back_with_every_column(cluster: LocalCluster) -> None:
    a, b = topic(cluster, "sink-cols-a"), topic(cluster, "sink-cols-b", 2)
    schema = StructType([
        StructField("value", BinaryType()), StructField("key", StringType()),
        StructField("topic", StringType()), StructField("queue", IntegerType()),
        StructField("tags", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
    ])
    rows = [(f"v{i}".encode() + b"\x00\xff", f"k{i}", None if i % 2 else b, i % 2,
             "even" if i % 2 == 0 else None, {"i": str(i)} if i % 3 else None)
            for i in range(40)]
    write(spark().createDataFrame(rows, schema).repartition(2), cluster, topic=a)
    got = {(m.topic, m.queue, m.body, m.key, m.tags, tuple(m.properties.items()))
           for m in stored(cluster, a) + stored(cluster, b)}
    want = {(b if i % 2 == 0 else a, i % 2, body, key, tags or "",
             tuple(props.items()) if props else ())
            for i, (body, key, _t, _q, tags, props) in enumerate(rows)}
    assert got == want and len(stored(cluster, a)) + len(stored(cluster, b)) == 40
    # and the raftmq source reads the same back
    back = (spark().read.format("raftmq").option("namesrv", cluster.namesrv_addr)
            .option("subscribe", a).load().collect())
    assert sorted(bytes(r.value) for r in back) == sorted(m.body for m in stored(cluster, a))


def test_string_values_and_keys_pick_queues_like_the_sdk(cluster: LocalCluster) -> None:
    out = topic(cluster, "sink-strings")
    df = spark().createDataFrame([(f"text-{i}", f"key-{i % 5}") for i in range(30)],
                                 "value string, key string")
    write(df, cluster, topic=out)
    msgs = stored(cluster, out)
    assert sorted(m.body for m in msgs) == sorted(f"text-{i}".encode() for i in range(30))
    queue_of_key: dict[str, set[int]] = {}
    for m in msgs:
        queue_of_key.setdefault(m.key, set()).add(m.queue)
    assert all(len(qs) == 1 for qs in queue_of_key.values())  # one key, one queue
    with connect_producer(cluster.namesrv_addr) as p:
        for k, qs in queue_of_key.items():
            assert p.send(out, OutgoingMessage(b"probe", key=k)).queue in qs
    with connect_admin(cluster.namesrv_addr) as admin:  # an unnamed job leaves no progress
        assert [t for t in admin.list_topics() if t.startswith("raftmq-spark.job-")] == []


def test_a_deliver_at_column_writes_delayed_messages(cluster: LocalCluster) -> None:
    out = topic(cluster, "sink-later", 2)
    due = datetime.now(UTC) + timedelta(seconds=8)
    df = spark().createDataFrame([(b"later", due), (b"now", None)],
                                 "value binary, deliverAt timestamp")
    write(df, cluster, topic=out)
    read = bodies(cluster, out)
    if datetime.now(UTC) < due:  # read wholly before its time: the other must wait
        assert read == Counter({b"now": 1})
    else:  # a slow machine wrote past its time: it may be there already, only once
        assert read[b"now"] == 1 and read[b"later"] <= 1
    while datetime.now(UTC) < due + timedelta(seconds=20):
        if bodies(cluster, out)[b"later"]:
            break
        time.sleep(0.1)
    assert datetime.now(UTC) >= due and bodies(cluster, out) == Counter({b"now": 1,
                                                                        b"later": 1})


def test_a_read_dataframe_is_written_back_unchanged(cluster: LocalCluster) -> None:
    src, dst = topic(cluster, "sink-copy-src"), topic(cluster, "sink-copy-dst")
    with connect_producer(cluster.namesrv_addr) as p:
        for i in range(20):
            p.send(src, OutgoingMessage(f"m{i}".encode(), key=f"k{i}", tags="t",
                                        properties={"n": str(i)}), queue=i % 4)
    df = (spark().read.format("raftmq").option("namesrv", cluster.namesrv_addr)
          .option("subscribe", src).load().drop("topic"))
    write(df, cluster, topic=dst)
    key = lambda m: (m.queue, m.body, m.key, m.tags, m.properties)  # noqa: E731
    assert sorted(map(key, stored(cluster, dst))) == sorted(map(key, stored(cluster, src)))


@pytest.mark.parametrize("columns, row, options, error", [
    ("key string", ("k",), {}, "needs a 'value' column"),
    ("value int", (1,), {}, "column 'value' must be binary or string, not int"),
    ("value binary, tag string", (b"x", "t"), {}, "unknown column(s) ['tag']"),
    ("value binary, queue string", (b"x", "1"), {}, "column 'queue' must be an integer type"),
    ("value binary, properties map<string,int>", (b"x", {"a": 1}), {},
     "must be map<string,string>"),
    ("value binary", (b"x",), {"topic": "no-such-topic"}, "topic 'no-such-topic' does not exist"),
    ("value binary", (b"x",), {"topic": None}, "no topic to write to"),
    ("value binary", (b"x",), {"deliveryGuarantee": "twice"},
     "deliveryGuarantee is 'exactlyOnce'"),
    ("value binary", (b"x",), {"transactionRows": "20000"}, "transactionRows must be an integer"),
    ("value binary", (b"x",), {"batchId": "3"}, "batchId needs queryName"),
    ("value binary", (b"x",), {"colour": "red"}, "unknown option(s) ['colour']"),
])
def test_bad_input_is_refused_before_anything_is_written(
        cluster: LocalCluster, columns: str, row: tuple[Any, ...],
        options: dict[str, str | None], error: str) -> None:
    out = "sink-refused"
    with connect_admin(cluster.namesrv_addr) as admin:
        admin.create_topic(out, 4, exist_ok=True)
    spec = {"topic": out, **options}
    df = spark().createDataFrame([row], columns)
    with pytest.raises(Exception) as info:
        write(df, cluster, **{k: v for k, v in spec.items() if v is not None})
    assert error in str(info.value)
    assert stored(cluster, out) == []


@pytest.mark.parametrize("guarantee", ["exactlyOnce", "atLeastOnce"])
def test_bad_rows_are_refused(cluster: LocalCluster, guarantee: str) -> None:
    out = topic(cluster, f"sink-bad-rows-{guarantee}")
    cases = [
        ("value binary, queue int", [(b"a", 1), (b"b", 4)], "has queues 0..3, not 4"),
        ("value binary, topic string", [(b"a", None), (b"b", "nope")],
         "topic 'nope' does not exist"),
        ("value binary", [(b"a",), (None,)], "has a null 'value'"),
    ]
    for columns, rows, error in cases:
        df = spark().createDataFrame(rows, columns).coalesce(1)
        with pytest.raises(Exception) as info:
            write(df, cluster, topic=out, deliveryGuarantee=guarantee)
        assert error in str(info.value)
    if guarantee == "exactlyOnce":  # the task's transaction is aborted: nothing is seen
        assert stored(cluster, out) == []
    else:  # each row is checked before it is sent, and the rows before it are sent
        assert bodies(cluster, out) <= Counter({b"a": 3})


def test_overwrite_is_refused(cluster: LocalCluster) -> None:
    out = topic(cluster, "sink-overwrite")
    with pytest.raises(Exception, match="only appends"):
        (values_df([b"x"]).write.format("raftmq").mode("overwrite")
         .option("namesrv", cluster.namesrv_addr).option("topic", out).save())
    assert stored(cluster, out) == []


def test_a_batch_id_written_again_is_not_written_twice(cluster: LocalCluster) -> None:
    out = topic(cluster, "sink-replay")
    values = [f"r{i}".encode() for i in range(70)]
    opts = {"topic": out, "queryName": "replay-job", "transactionRows": "8"}
    write(values_df(values), cluster, batchId="5", **opts)
    assert bodies(cluster, out) == Counter(values)
    with connect_admin(cluster.namesrv_addr) as admin:  # a named one keeps its progress
        assert {"raftmq-spark.replay-job.0", "raftmq-spark.replay-job.2"} <= set(
            admin.list_topics())
    write(values_df(values), cluster, batchId="5", **opts)  # the same batch again
    assert bodies(cluster, out) == Counter(values)
    write(values_df(values), cluster, batchId="6", **opts)  # the next batch
    assert bodies(cluster, out) == Counter({v: 2 for v in values})
    with pytest.raises(Exception, match="wrote batch 6 already, and this is batch 5"):
        write(values_df(values), cluster, batchId="5", **opts)
    assert bodies(cluster, out) == Counter({v: 2 for v in values})


def test_at_least_once_writes_again_what_it_is_given_again(cluster: LocalCluster) -> None:
    out = topic(cluster, "sink-alo")
    values = [f"a{i}".encode() for i in range(25)]
    for _ in range(2):
        write(values_df(values), cluster, topic=out, deliveryGuarantee="atLeastOnce")
    assert bodies(cluster, out) == Counter({v: 2 for v in values})


# ---------------------------------------------------------------- streams


def fill(cluster: LocalCluster, name: str, n: int, queues: int = 4) -> list[bytes]:
    topic(cluster, name, queues)
    values = [f"{name}-{i}".encode() for i in range(n)]
    with connect_producer(cluster.namesrv_addr) as p:
        for q in range(queues):
            p.send_batch(name, values[q::queues], queue=q)
    assert len(stored(cluster, name)) == n
    return values


def stream(cluster: LocalCluster, src: str, out: str, checkpoint: Path, **options: str) -> None:
    q = (spark().readStream.format("raftmq").option("namesrv", cluster.namesrv_addr)
         .option("subscribe", src).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "40").load().select("value")
         .writeStream.format("raftmq").option("namesrv", cluster.namesrv_addr)
         .option("topic", out).option("checkpointLocation", str(checkpoint)))
    if "queryName" in options:  # Spark's own queryName() reaches the sink as the option
        q = q.queryName(options.pop("queryName"))
    for k, v in options.items():
        q = q.option(k, v)
    query = q.trigger(availableNow=True).start()
    query.awaitTermination(300)
    assert query.exception() is None


def test_a_stream_replaying_its_last_batch_writes_it_once(cluster: LocalCluster,
                                                           tmp_path: Path) -> None:
    values = fill(cluster, "sink-stream-src", 100)
    out = topic(cluster, "sink-stream-out")
    cp = tmp_path / "cp"
    stream(cluster, "sink-stream-src", out, cp, queryName="replayed")
    assert bodies(cluster, out) == Counter(values)
    # forget that the last batch was committed: Spark runs it again, same id, same rows
    commits = sorted((cp / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert len(commits) >= 3
    commits[-1].unlink()
    (cp / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    stream(cluster, "sink-stream-src", out, cp, queryName="replayed")
    assert bodies(cluster, out) == Counter(values)


def test_an_exactly_once_stream_needs_a_query_name(cluster: LocalCluster,
                                                    tmp_path: Path) -> None:
    fill(cluster, "sink-noname-src", 10)
    out = topic(cluster, "sink-noname-out")
    with pytest.raises(Exception, match="'queryName' is required"):
        stream(cluster, "sink-noname-src", out, tmp_path / "cp")
    assert stored(cluster, out) == []


def _start_job(cluster: LocalCluster, src: str, out: str, cp: Path, guarantee: str,
               pause_ms: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark_sink_job", cluster.namesrv_addr, src, out,
         str(cp), "killed", guarantee, str(pause_ms)],
        cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True)  # its own process group: the JVM and workers die with it


def _count(cluster: LocalCluster, out: str) -> int:
    return len(stored(cluster, out))


def kill_and_restart(cluster: LocalCluster, tmp_path: Path, guarantee: str, *, kills: int,
                     seed: int) -> tuple[list[bytes], Counter[bytes], int]:
    """Copy a topic with `tests.spark_sink_job`, SIGKILLing the job's process group
    `kills` times while a micro-batch is being written (just after a transaction of it
    committed, a moment chosen at random), restarting it from its checkpoint each time;
    the input, what the output holds, and how many kills landed before the end."""
    rnd = random.Random(seed)
    src, out = f"sink-kill-src-{guarantee}", f"sink-kill-out-{guarantee}"
    values = fill(cluster, src, 240)
    topic(cluster, out)
    cp, log = tmp_path / "cp", tmp_path / "job.log"
    landed = 0
    for _ in range(kills):
        job = _start_job(cluster, src, out, cp, guarantee, 150, log)
        try:
            seen = _count(cluster, out)
            deadline = time.monotonic() + 240
            while job.poll() is None and time.monotonic() < deadline:
                now = _count(cluster, out)
                if now > seen:  # a transaction just committed: its batch is under way
                    time.sleep(rnd.uniform(0, 0.3))
                    break
                time.sleep(0.05)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                landed += 1
            job.wait()
    job = _start_job(cluster, src, out, cp, guarantee, 0, log)
    try:
        assert job.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return values, bodies(cluster, out), landed


def test_a_stream_killed_mid_batch_and_restarted_writes_every_row_exactly_once(
        cluster: LocalCluster, tmp_path: Path) -> None:
    values, got, landed = kill_and_restart(cluster, tmp_path, "exactlyOnce", kills=2,
                                           seed=15)
    assert landed == 2  # both kills hit a running query
    assert got == Counter(values)


# ---------------------------------------------------------------- the protocol, task by task


def _task(cluster: LocalCluster, out: str, query: str, **options: str) -> Any:
    from raftmq.spark.sink import Task
    from raftmq.spark.sink_options import parse_sink_options

    opts = parse_sink_options({"namesrv": cluster.namesrv_addr, "topic": out,
                               "queryName": query, "transactionRows": "10", **options},
                              stream=True)
    return Task(opts, ("value",), query, batch_id=4, partition=0, attempt=0)


def _batches(values: list[bytes], crash_after: int | None = None) -> Iterator[Any]:
    import pyarrow as pa

    for i in range(0, len(values), 10):
        if crash_after is not None and i >= crash_after:
            raise RuntimeError("the executor is lost")
        yield pa.RecordBatch.from_pydict({"value": pa.array(values[i:i + 10], pa.binary())})


def test_a_task_retried_after_a_crash_writes_only_what_it_had_not_committed(
        cluster: LocalCluster) -> None:
    from raftmq.spark.sink import run_task

    out = topic(cluster, "sink-task-retry")
    values = [f"t{i}".encode() for i in range(25)]
    task = _task(cluster, out, "retried")
    with pytest.raises(RuntimeError, match="executor is lost"):
        run_task(task, _batches(values, crash_after=20))  # two chunks committed, then lost
    assert bodies(cluster, out) == Counter(values[:20])
    again = run_task(task, _batches(values))
    assert (again.skipped, again.written) == (20, 5)
    assert bodies(cluster, out) == Counter(values)


def test_two_attempts_of_one_task_at_once_write_its_rows_once(cluster: LocalCluster) -> None:
    import anyio

    from raftmq.client.errors import ProducerFencedError, TransactionAbortedError
    from raftmq.spark.sink import write_exactly_once

    out = topic(cluster, "sink-speculative")
    values = [f"s{i}".encode() for i in range(30)]
    task = _task(cluster, out, "speculated", testPauseMs="200")
    outcomes: list[Any] = []

    async def attempt(delay: float) -> None:
        await anyio.sleep(delay)
        try:
            outcomes.append(await write_exactly_once(task, list(_batches(values))))
        except (ProducerFencedError, TransactionAbortedError) as exc:
            outcomes.append(exc)

    async def both() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt, 0.0)
            tg.start_soon(attempt, 0.5)  # starts while the first is between its chunks

    anyio.run(both)
    assert bodies(cluster, out) == Counter(values)
    finished = [o for o in outcomes if not isinstance(o, Exception)]
    assert finished and finished[-1].skipped + finished[-1].written == len(values)
