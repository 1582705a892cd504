"""SQL92 filters on the fetch path, over real node processes: the node sends exactly the
messages a filter matches, in offset order, and moves a consumer past the others.

One cluster serves the module; each test has topics and groups of its own. Messages
carry properties `n` (their number) and `kind` ("even"/"odd"), some a tag and a key, so
every filter's answer is known in advance and compared whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import anyio
import pytest

from broker.doors.reads import filter_properties, filter_scan
from raftmq.client import (
    Admin,
    FilterError,
    Message,
    MessageSelector,
    OutgoingMessage,
    Producer,
    PullConsumer,
    PushConsumer,
)
from raftmq.client.blocking import BlockingPullConsumer
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster
from tests.live_cluster import scrape_metrics
from tests.paths import REPO_ROOT
from transport.blocking import request
from wire.protocol import Code, Op, RequestError
from wire.records import encode_batch, iter_records

pytestmark = pytest.mark.live

BOUND = 60.0  # a safety net for event waits, never a measurement
N = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("sql"), groups=1) as c:
        yield c


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def message(i: int) -> OutgoingMessage:
    """Message `i`: tag A on multiples of 3, key k<i> on multiples of 5."""
    return OutgoingMessage(b"m%d" % i, key=f"k{i}" if i % 5 == 0 else "",
                           tags="A" if i % 3 == 0 else ("B" if i % 3 == 1 else ""),
                           properties={"n": str(i), "kind": "odd" if i % 2 else "even"})


async def make_topic(cluster: LocalCluster, topic: str, bodies: list[OutgoingMessage | bytes],
                     queues: int = 1) -> None:
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues)
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(0, len(bodies), 500):
            await producer.send_batch(topic, bodies[i : i + 500], queue=0)


async def pull_all(consumer: PullConsumer, topic: str, **kw: object) -> tuple[list[Message], int]:
    """Everything `pull` gives from offset 0 up to the queue's end, and the pulls taken."""
    got: list[Message] = []
    offset, pulls = 0, 0
    while True:
        res = await consumer.pull(topic, 0, offset, max=16, wait_ms=0, **kw)  # type: ignore[arg-type]
        pulls += 1
        got += res.messages
        assert res.next_offset >= offset
        offset = res.next_offset
        if offset >= res.end_offset:
            return got, pulls


def test_the_properties_a_filter_sees() -> None:
    """TAGS and KEYS come from the record; a property the producer set wins."""
    def props(m: OutgoingMessage) -> dict[str, str]:
        batch = encode_batch("t", 0, [m])
        return filter_properties(b"\0" * 8 + batch, batch.starts[0])

    assert props(OutgoingMessage(b"x")) == {}
    assert props(OutgoingMessage(b"x", key="k", tags="T", properties={"a": "1"})) == {
        "a": "1", "TAGS": "T", "KEYS": "k"}
    assert props(OutgoingMessage(b"x", tags="T", properties={"TAGS": "mine"})) == {
        "TAGS": "mine"}
    assert props(OutgoingMessage(b"x", properties={"KEYS": "p"})) == {"KEYS": "p"}


def test_pull_with_sql_gets_exactly_the_matching_messages_in_offset_order(
        cluster: LocalCluster) -> None:
    topic = fresh("sql-pull")
    cases = {
        "n >= 10 AND kind = 'even'": lambda i: i >= 10 and i % 2 == 0,
        "n BETWEEN 7 AND 9 OR n IN ('41', '42')": lambda i: 7 <= i <= 9 or i in (41, 42),
        "TAGS = 'A'": lambda i: i % 3 == 0,
        "KEYS IS NOT NULL AND n > 20": lambda i: i % 5 == 0 and i > 20,
        "missing = 'x'": lambda i: False,
    }

    async def main() -> None:
        await make_topic(cluster, topic, [message(i) for i in range(N)])
        async with PullConsumer(cluster.namesrv_addr, fresh("cg")) as consumer:
            for expr, want in cases.items():
                got, _ = await pull_all(consumer, topic, sql=expr)
                assert [m.offset for m in got] == [i for i in range(N) if want(i)], expr
                assert [m.body for m in got] == [b"m%d" % i for i in range(N) if want(i)]
                assert all(m.properties["n"] == str(m.offset) for m in got)
            # tags and sql together: both must match
            got, _ = await pull_all(consumer, topic, tags="B", sql="kind = 'odd'")
            assert [m.offset for m in got] == [i for i in range(N) if i % 3 == 1 and i % 2]
            got, _ = await pull_all(consumer, topic,
                                    tags=MessageSelector.by_sql("n < 30", tags="A || B"))
            assert [m.offset for m in got] == [i for i in range(30) if i % 3 != 2]
            # an assignment's selector is what poll and pull use
            consumer.assign(topic, [0], sql="n < 5")
            assert [m.offset for m in (await pull_all(consumer, topic))[0]] == [0, 1, 2, 3, 4]

    anyio.run(main, backend="trio")


def test_a_queue_whose_messages_all_fail_the_filter_is_advanced_past(
        cluster: LocalCluster) -> None:
    """Bare bodies have no properties: `x = 1` matches none. Each fetch looks at a bounded
    number of records and answers at once with `next` past them; at the end it holds
    (long polling) until a matching message arrives."""
    topic = fresh("sql-none")
    total = 2500
    scan = filter_scan(16)

    async def main() -> None:
        await make_topic(cluster, topic, [b"x"] * total)
        async with PullConsumer(cluster.namesrv_addr, fresh("cg")) as consumer:
            first = await consumer.pull(topic, 0, 0, max=16, wait_ms=5000, sql="x = 1")
            assert first.messages == [] and first.next_offset == scan
            got, pulls = await pull_all(consumer, topic, sql="x = 1")
            assert got == [] and pulls == -(-total // scan)
            assert consumer.position(topic, 0) == total

            async def later() -> None:
                await anyio.sleep(0.5)
                async with Producer(cluster.namesrv_addr) as producer:
                    await producer.send_batch(topic, [b"y", OutgoingMessage(
                        b"z", properties={"x": "1"})], queue=0)

            async with anyio.create_task_group() as tg:
                tg.start_soon(later)
                with anyio.fail_after(BOUND):
                    res = await consumer.pull(topic, 0, total, max=16, wait_ms=20_000,
                                              sql="x = 1")
            assert [(m.offset, m.body) for m in res.messages] == [(total + 1, b"z")]
            assert res.next_offset == total + 2

    anyio.run(main, backend="trio")


def test_a_bad_filter_is_refused_by_the_client_before_anything_is_sent(
        cluster: LocalCluster) -> None:
    with pytest.raises(FilterError) as exc:
        MessageSelector.by_sql("a = 1 )")
    assert (exc.value.line, exc.value.column) == (1, 7)
    with pytest.raises(FilterError) as exc:
        PushConsumer(cluster.namesrv_addr, "cg", {"t": MessageSelector(sql="a >\n 'x'")},
                     lambda msgs: None)
    assert (exc.value.line, exc.value.column) == (2, 2)

    async def main() -> None:
        async with PullConsumer(cluster.namesrv_addr, fresh("cg")) as consumer:
            with pytest.raises(FilterError, match="column 5"):
                consumer.assign("t", sql="a > ")
            with pytest.raises(FilterError, match="column 5"):
                await consumer.pull("no-such-topic", 0, 0, sql="a > ")
            with pytest.raises(FilterError):
                consumer.subscribe({"t": MessageSelector.by_sql("a = ")})

    anyio.run(main, backend="trio")
    with BlockingPullConsumer(cluster.namesrv_addr, fresh("cg")) as blocking, \
            pytest.raises(FilterError, match="column 4"):
        blocking.assign("t", sql="a =")  # (column 4: the end)


def test_a_bad_filter_sent_raw_is_malformed_and_nothing_is_read(cluster: LocalCluster) -> None:
    topic = fresh("sql-raw")
    anyio.run(make_topic, cluster, topic, [message(i) for i in range(10)], backend="trio")
    node = cluster.leaders()["g0"]
    assert node is not None
    addr, metrics = cluster.node_addr(node), cluster.configs[node - 1].metrics or ""
    fetched = 'raftmq_fetch_messages_total{group="g0"}'
    filtered = 'raftmq_fetch_filtered_total{group="g0"}'
    before = scrape_metrics(metrics)
    for expr, where in (("n >", "column 4"), ("n = 1 )", "column 7"), ("NOT 1", "column")):
        with pytest.raises(RequestError) as exc:
            request(addr, {"op": int(Op.FETCH), "topic": topic, "queue": 0, "offset": 0,
                           "wait_ms": 0, "sql": expr})
        assert exc.value.code == Code.MALFORMED and where in exc.value.message, exc.value
    after = scrape_metrics(metrics)
    assert after.get(fetched, 0) == before.get(fetched, 0)
    assert after.get(filtered, 0) == before.get(filtered, 0)
    # a good one, raw: the node counts what it left out
    h, body = request(addr, {"op": int(Op.FETCH), "topic": topic, "queue": 0, "offset": 0,
                             "wait_ms": 0, "sql": "kind = 'odd'"})
    assert [row[0] for row in h["msgs"]] == [1, 3, 5, 7, 9] and h["next"] == 10
    assert len(list(iter_records(body))) == 5
    final = scrape_metrics(metrics)
    assert final[filtered] == before.get(filtered, 0) + 5
    assert final[fetched] == before.get(fetched, 0) + 5


def test_a_push_consumer_handles_exactly_the_matching_messages_and_commits_past_the_rest(
        cluster: LocalCluster) -> None:
    topic, group = fresh("sql-push"), fresh("cg")
    want = [i for i in range(N) if i % 2 == 0 and i % 3 == 0]

    async def main() -> None:
        await make_topic(cluster, topic, [message(i) for i in range(N)])
        handled: list[int] = []
        done = anyio.Event()

        async def handler(msgs: list[Message]) -> None:
            handled.extend(m.offset for m in msgs)
            if len(handled) >= len(want):
                done.set()

        selector = MessageSelector.by_sql("kind = 'even' AND TAGS = 'A'")
        async with PushConsumer(cluster.namesrv_addr, group, {topic: selector},
                                handler, commit_interval=0.2, long_poll_ms=200,
                                heartbeat_interval=0.2, rebalance_interval=0.2) as push:
            assert push.topics == {topic: None} and push.selectors == {topic: selector}
            with anyio.fail_after(BOUND):
                await done.wait()
                async with PullConsumer(cluster.namesrv_addr, group) as reader:
                    while await reader.committed(topic, 0) < N:  # past the last (odd) ones
                        await anyio.sleep(0.1)
        assert sorted(handled) == want and len(handled) == len(want)

    anyio.run(main, backend="trio")


def test_consume_command_with_sql(cluster: LocalCluster) -> None:
    topic = fresh("sql-cli")
    anyio.run(make_topic, cluster, topic, [message(i) for i in range(N)], backend="trio")
    env = {**os.environ, "RAFTMQ_NAMESRV": cluster.namesrv_addr}

    def consume(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "raftmq", "consume", "--topic", topic,
                               *args], capture_output=True, text=True, env=env, cwd=REPO_ROOT,
                              timeout=60)

    run = consume("--group", "cli-sql", "--sql", "n > 50 AND kind = 'odd'", "--json",
                  "--timeout", "1")
    assert run.returncode == 0, run.stderr
    assert [json.loads(line)["offset"] for line in run.stdout.splitlines()] == [
        51, 53, 55, 57, 59]
    bad = consume("--group", "cli-sql", "--sql", "n > 'x'")
    assert bad.returncode == 2 and "--sql" in bad.stderr and "column 5" in bad.stderr
