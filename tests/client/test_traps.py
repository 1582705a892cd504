"""Traps a new user meets in the SDK and the CLI, each checked against real processes
(a name server and three nodes hosting groups g0..g2 on loopback).

* errors leave `async with Producer/PullConsumer/PushConsumer/Admin` as themselves, not
  wrapped in exception groups, under asyncio and trio, and belong to one hierarchy;
* tag subscriptions ("*", "TagA", "TagA || TagB", lists) select what they say, and
  anything else is refused when subscribing;
* a key chooses its queue by default, in the SDK and in `raftmq send --key`;
* one `poll` returns what every assigned queue has (up to `max_messages`);
* a request larger than a frame is refused with its reason, not retried into a timeout;
* COMMIT_OFFSET beyond a queue's end is refused (OFFSET_TOO_LARGE);
* `raftmq consume --from last` commits where a new group started;
* error codes name the real problem (an unknown group, a queue that does not exist);
* a table piped to a file (`raftmq tx list > file`) is written whole, not cut to 80 columns;
* clients open and close with `start()`/`close()` as well as `async with`; consumers pause.

Faults (a lost quorum) are in `tests/client/test_faults.py`, whose clusters are their own.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from raftmq.client import (
    Admin,
    ClientClosedError,
    Producer,
    PullConsumer,
    PushConsumer,
    SendNotDoneError,
    TransportError,
    UnavailableError,
    key_queue,
)
from raftmq.client.errors import may_have_applied
from raftmq.localcluster import LocalCluster
from tests.paths import REPO_ROOT as ROOT
from transport.blocking import request
from wire.protocol import Code, Op, RaftMQError, RequestError
from wire.records import Message

pytestmark = pytest.mark.live  # every test here starts a cluster

GROUPS = ("g0", "g1", "g2")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("traps"), nodes=3, groups=3, tick_ms=50) as c:
        c.wait_ready(timeout=60)
        yield c
        assert c.unexpected_exits() == {}


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def raftmq(cluster: LocalCluster, *args: str, stdin: str | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTMQ_NAMESRV", "NAMESRV_ADDR")}
    env["RAFTMQ_NAMESRV"] = cluster.namesrv_addr
    return subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout, input=stdin)


async def create(cluster: LocalCluster, topic: str, queues: int) -> None:
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=queues, exist_ok=True)


async def drain(consumer: PullConsumer, want: int, rounds: int = 40) -> list[Message]:
    got: list[Message] = []
    for _ in range(rounds):
        if len(got) >= want:
            break
        got += await consumer.poll(timeout=1.0, max_messages=1000)
    return got


# ------------------------------------------------------------------ 1. errors


@pytest.mark.anyio
async def test_errors_leave_client_blocks_as_themselves(
        cluster: LocalCluster, anyio_backend: str) -> None:
    ns = cluster.namesrv_addr
    await create(cluster, "traps-err", 3)

    # the caller's own error, from each kind of client object
    with pytest.raises(ValueError, match="mine"):
        async with Producer(ns):
            raise ValueError("mine")
    with pytest.raises(ValueError, match="mine"):
        async with PullConsumer(ns, "traps-err-cg"):
            raise ValueError("mine")
    with pytest.raises(ValueError, match="mine"):
        async with Admin(ns):
            raise ValueError("mine")
    with pytest.raises(ValueError, match="mine"):
        async with PushConsumer(ns, "traps-err-push", ["traps-err"], lambda msgs: None,
                                heartbeat_interval=0.5, rebalance_interval=0.5):
            raise ValueError("mine")

    # the SDK's own errors, caught by their class as a user writes it
    caught: list[RequestError] = []
    try:
        async with Producer(ns) as producer:
            await producer.send("traps-no-such-topic", b"x")
    except RequestError as exc:
        caught.append(exc)
    try:
        async with PullConsumer(ns, "traps-err-cg") as consumer:
            consumer.assign("traps-no-such-topic")
            await consumer.poll(timeout=0.1)
    except RequestError as exc:
        caught.append(exc)
    try:
        async with Admin(ns) as admin:
            await admin.query_key("traps-no-such-topic", "k")
    except RequestError as exc:
        caught.append(exc)
    assert [e.code for e in caught] == [Code.UNKNOWN_TOPIC] * 3
    assert all(isinstance(e, RaftMQError) for e in caught)


def test_connection_refused_is_unavailable_not_a_timeout(cluster: LocalCluster) -> None:
    """A name server that is not there: UNAVAILABLE (nothing was sent), never TIMEOUT."""
    async def main() -> None:
        async with Admin("127.0.0.1:1") as admin:
            await admin.list_topics()

    with pytest.raises(UnavailableError) as info:
        anyio.run(main)
    assert info.value.code == Code.UNAVAILABLE and not may_have_applied(info.value)
    assert isinstance(info.value.__cause__, TransportError) and not info.value.__cause__.sent


# ------------------------------------------------------------------ 2. tags


@pytest.mark.anyio
async def test_tag_subscriptions_select_what_they_say(
        cluster: LocalCluster, anyio_backend: str) -> None:
    ns = cluster.namesrv_addr
    topic = f"traps-tags-{anyio_backend}"
    await create(cluster, topic, 3)
    sent = {"TagA": 4, "TagB": 3, "TagC": 2}
    async with Producer(ns) as producer:
        for tag, n in sent.items():
            for i in range(n):
                await producer.send(topic, f"{tag}-{i}", tags=tag)
    total = sum(sent.values())

    async def read(tags: Any, group: str) -> list[str]:
        async with PullConsumer(ns, group) as consumer:
            consumer.assign(topic, tags=tags)
            got = await drain(consumer, total, rounds=3)
        return sorted(m.tags for m in got)

    assert await read("TagA", "cg-a") == ["TagA"] * 4
    assert await read("TagA || TagB", "cg-ab") == ["TagA"] * 4 + ["TagB"] * 3
    assert await read(["TagB", "TagC"], "cg-bc") == ["TagB"] * 3 + ["TagC"] * 2
    assert len(await read("*", "cg-all")) == total

    async with PullConsumer(ns, "cg-bad") as consumer:
        for bad in ("TagA ||", "TagA | TagB", "Tag A", [], [3]):
            with pytest.raises(ValueError):
                consumer.assign(topic, tags=bad)
    with pytest.raises(ValueError):
        PushConsumer(ns, "cg-bad", {topic: "A || "}, lambda msgs: None)

    received: list[str] = []
    done = anyio.Event()

    async def handler(msgs: list[Message]) -> None:
        received.extend(m.tags for m in msgs)
        if len(received) >= 4:
            done.set()

    async with PushConsumer(ns, "cg-push-a", {topic: "TagA"}, handler, mode="broadcast",
                            rebalance_interval=0.5, consume_concurrency=1):
        with anyio.fail_after(60):
            await done.wait()
        await anyio.sleep(0.5)  # anything else would have come with them
    assert received == ["TagA"] * 4


# ------------------------------------------------------------------ 3. keys


@pytest.mark.anyio
async def test_a_key_chooses_its_queue_in_the_sdk_and_the_cli(
        cluster: LocalCluster, anyio_backend: str) -> None:
    topic = f"traps-keys-{anyio_backend}"
    await create(cluster, topic, 6)
    queues = set()
    for _ in range(3):  # three runs, as the user did
        async with Producer(cluster.namesrv_addr) as producer:
            queues.add((await producer.send(topic, b"order", key="customer-7")).queue)
    assert queues == {key_queue("customer-7", 6)}
    out = raftmq(cluster, "send", "--topic", topic, "--key", "customer-7", "--json", "cli order")
    assert out.returncode == 0, out.stderr
    assert f'"queue": {key_queue("customer-7", 6)}' in out.stdout


@pytest.mark.anyio
async def test_send_async_futures_are_what_asyncio_and_trio_code_awaits(
        cluster: LocalCluster, anyio_backend: str) -> None:
    """§ issue 28.11: `asyncio.wait` on the futures of `send_async` failed, and
    `result(timeout=)` was a TypeError. One await hands a message over (its future is
    then the producer's to complete, also when nobody awaits it); `send` is one await."""
    topic = f"traps-futures-{anyio_backend}"
    await create(cluster, topic, 3)
    async with Producer(cluster.namesrv_addr) as producer:
        futs = [await producer.send_async(topic, f"f{i}", key="k") for i in range(10)]
        for fut in futs:
            try:
                fut.result(timeout=5)  # done already, or says to await it
            except SendNotDoneError as exc:
                assert "await" in str(exc)
        if anyio_backend == "asyncio":
            done, pending = await asyncio.wait(futs)  # type: ignore[type-var]
            assert len(done) == 10 and not pending
        else:
            for fut in futs:
                await fut.wait(timeout=60)
        offsets = [f.result().offset for f in futs]
        assert offsets == sorted(offsets) and len(set(offsets)) == 10
        one = await producer.send(topic, b"one await", key="k")
        assert one.offset == offsets[-1] + 1


# ------------------------------------------------------------------ 4. poll


@pytest.mark.anyio
async def test_one_poll_returns_what_every_queue_has(
        cluster: LocalCluster, anyio_backend: str) -> None:
    ns = cluster.namesrv_addr
    topic = f"traps-poll-{anyio_backend}"
    await create(cluster, topic, 6)
    async with Producer(ns) as producer:
        for q in range(6):
            await producer.send_batch(topic, [f"{q}-{i}" for i in range(10)], queue=q)

    async with PullConsumer(ns, f"traps-poll-all-{anyio_backend}") as consumer:
        consumer.assign(topic)
        got = await consumer.poll(timeout=2.0, max_messages=1000)
        assert len(got) == 60
        assert {m.queue for m in got} == set(range(6))
        await consumer.commit_all()

    async with PullConsumer(ns, f"traps-poll-some-{anyio_backend}") as consumer:
        consumer.assign(topic)
        first = await consumer.poll(timeout=2.0, max_messages=25)
        assert len(first) == 25
        assert {m.queue for m in first} == set(range(6))  # queues take turns
        rest = await drain(consumer, 35)
        bodies = sorted(m.body for m in first + rest)
        assert bodies == sorted(f"{q}-{i}".encode() for q in range(6) for i in range(10))


@pytest.mark.anyio
async def test_a_new_group_starts_at_the_first_message_unless_told_last(
        cluster: LocalCluster, anyio_backend: str) -> None:
    """§ issue 28.14, a documented choice pinned: a group with no committed offset starts
    at the first retained message (Kafka and RocketMQ default to the end)."""
    ns = cluster.namesrv_addr
    topic = f"traps-start-{anyio_backend}"
    await create(cluster, topic, 1)
    async with Producer(ns) as producer:
        await producer.send(topic, b"before the group", queue=0)
    for client in (PullConsumer, PushConsumer):
        assert inspect.signature(client).parameters["start_from"].default == "first"
    async with PullConsumer(ns, f"{topic}-default") as consumer:
        consumer.assign(topic)
        assert [m.body for m in await drain(consumer, 1)] == [b"before the group"]
    async with PullConsumer(ns, f"{topic}-last", start_from="last") as consumer:
        consumer.assign(topic)
        assert await consumer.poll(timeout=0.5) == []
        assert consumer.position(topic, 0) == 1


# ------------------------------------------------------------------ 6. oversized frames


@pytest.mark.anyio
async def test_an_oversized_request_reports_the_frame_limit(
        cluster: LocalCluster, anyio_backend: str) -> None:
    """The client's limits raised past the nodes': the node refuses the frame and says
    why before it closes the connection, and that reason is what the send raises (not a
    lost connection, and no retries into a timeout)."""
    await create(cluster, "traps-big", 3)  # nothing is stored: shared by both runs
    async with Producer(cluster.namesrv_addr, max_message_bytes=32 << 20) as producer:
        for _ in range(3):  # the reason must win over the broken pipe every time
            with pytest.raises(RequestError) as info:
                await producer.send("traps-big", b"x" * (17 << 20), queue=0)
            assert not isinstance(info.value, TransportError)
            assert info.value.code == Code.FRAME_TOO_LARGE and not info.value.retriable
            assert "exceeds the limit" in info.value.message
            assert str(16 << 20) in info.value.message  # the node's own limit
            assert (await producer.send("traps-big", b"small", queue=0)).offset >= 0


# ------------------------------------------------------------------ 7. commit bounds


@pytest.mark.anyio
async def test_commit_beyond_the_end_of_a_queue_is_refused(
        cluster: LocalCluster, anyio_backend: str) -> None:
    ns = cluster.namesrv_addr
    topic = f"traps-commit-{anyio_backend}"
    await create(cluster, topic, 3)
    async with Producer(ns) as producer:
        await producer.send_batch(topic, [b"a", b"b", b"c"], queue=1)
    async with PullConsumer(ns, f"traps-commit-cg-{anyio_backend}") as consumer:
        await consumer.commit(topic, 1, 2)
        with pytest.raises(RequestError) as info:
            await consumer.commit(topic, 1, 10**12)
        assert info.value.code == Code.OFFSET_TOO_LARGE
        assert info.value.extra.get("end") == 3
        assert await consumer.committed(topic, 1) == 2  # unchanged
        await consumer.commit(topic, 1, 3)  # the end itself is a real position
        assert await consumer.committed(topic, 1) == 3
    async with Admin(ns) as admin:
        lag = await admin.consumer_lag(f"traps-commit-cg-{anyio_backend}", topic)
    assert lag[1].lag == 0 and lag[1].committed == 3


# ------------------------------------------------------------------ 8. consume --from last


@pytest.mark.anyio
async def test_consume_from_last_commits_where_a_new_group_started(
        cluster: LocalCluster, anyio_backend: str) -> None:
    topic = f"traps-last-{anyio_backend}"
    await create(cluster, topic, 3)
    async with Producer(cluster.namesrv_addr) as producer:
        await producer.send(topic, b"before the group existed")
    first = raftmq(cluster, "consume", "--group", "late", "--topic", topic, "--from", "last",
                   "--timeout", "0.5")
    assert first.returncode == 0, first.stderr
    assert "0 message(s)" in first.stderr
    async with Producer(cluster.namesrv_addr) as producer:
        await producer.send(topic, b"between the runs")
    second = raftmq(cluster, "consume", "--group", "late", "--topic", topic, "--from", "last",
                    "--timeout", "1", "--json")
    assert second.returncode == 0, second.stderr
    assert "between the runs" in second.stdout
    assert "before the group existed" not in second.stdout


# ------------------------------------------------------------------ 9. codes


def test_error_codes_name_the_real_problem(cluster: LocalCluster) -> None:
    out = raftmq(cluster, "message", "get", "g9:5:10")
    assert out.returncode == 1
    assert "UNKNOWN_GROUP" in out.stderr and "g9" in out.stderr, out.stderr

    async def create_and_pull() -> None:
        await create(cluster, "traps-six", 6)
        async with PullConsumer(cluster.namesrv_addr, "cg") as consumer:
            await consumer.pull("traps-six", 99)

    with pytest.raises(RequestError) as info:
        anyio.run(create_and_pull)
    assert info.value.code == Code.UNKNOWN_QUEUE
    assert "no queue 99" in info.value.message and "0..5" in info.value.message

    node = cluster.node_ids[0]
    h, _ = request(cluster.node_addr(node), {"op": int(Op.TOPICS)})
    assert "traps-six" in h["topics"]
    with pytest.raises(RequestError) as info:
        request(cluster.node_addr(node), {"op": int(Op.FETCH), "topic": "traps-six",
                                          "queue": 99, "offset": 0, "wait_ms": 0})
    assert info.value.code == Code.UNKNOWN_QUEUE
    assert "no queue 99" in info.value.message and "0..5" in info.value.message


# ------------------------------------------------------------------ 14. tables in a pipe


def test_a_table_piped_to_a_file_is_not_cut(cluster: LocalCluster) -> None:
    """§ issue 28.14: `raftmq tx list > file` cut every column but the ids to "ha…":
    rich assumes 80 columns when it does not write to a terminal."""
    topic, group = "traps-tx-list-a-topic-with-a-long-name", "traps-a-producer-group-named-at-length"

    async def prepare() -> str:
        await create(cluster, topic, 1)
        async with Producer(cluster.namesrv_addr, producer_group=group,
                            check_listener=lambda request: "unknown") as producer:
            return (await producer.prepare(topic, b"undecided", queue=0)).txid

    txid = anyio.run(prepare)
    try:
        out = raftmq(cluster, "tx", "list")  # stdout is a pipe
        assert out.returncode == 0, out.stderr
        line = next(line for line in out.stdout.splitlines() if txid in line)
        assert topic in line and group in line, out.stdout
        assert "…" not in out.stdout, out.stdout
    finally:
        assert raftmq(cluster, "tx", "rollback", txid).returncode == 0


# ------------------------------------------------------------------ 14. start/close, pause


@pytest.mark.anyio
async def test_clients_start_and_close_without_a_block(
        cluster: LocalCluster, anyio_backend: str) -> None:
    """§ issue 28.14: `start()`/`close()` beside `async with` (for startup and shutdown
    hooks); `close()` leaves as the end of the block does, once."""
    ns = cluster.namesrv_addr
    topic = f"traps-start-close-{anyio_backend}"
    admin = await Admin(ns).start()
    await admin.create_topic(topic, queues=1, exist_ok=True)
    await admin.close()
    producer = await Producer(ns).start()
    fut = await producer.send_async(topic, b"handed over", queue=0)
    await producer.close()  # waits for what it holds, as leaving the block does
    assert fut.result().offset == 0
    await producer.close()  # a second close does nothing
    consumer = await PullConsumer(ns, f"{topic}-group").start()
    consumer.assign(topic)
    assert [m.body for m in await drain(consumer, 1)] == [b"handed over"]
    await consumer.commit_all()
    await consumer.close()
    with pytest.raises(ClientClosedError):
        await consumer.poll(timeout=0.1)
    async with Admin(ns) as check:
        assert await check.committed_offset(f"{topic}-group", topic, 0) == 1


@pytest.mark.anyio
async def test_a_pull_consumer_pauses_queues_and_resumes_them(
        cluster: LocalCluster, anyio_backend: str) -> None:
    """§ issue 28.14: Kafka's `pause`/`resume`: `poll` skips a paused queue and keeps
    its position."""
    ns = cluster.namesrv_addr
    topic = f"traps-pause-pull-{anyio_backend}"
    await create(cluster, topic, 2)
    async with Producer(ns) as producer:
        for q in (0, 1):
            await producer.send(topic, f"queue {q}", queue=q)
    async with PullConsumer(ns, f"{topic}-group") as consumer:
        consumer.assign(topic)
        consumer.pause(topic, [0])
        assert consumer.paused() == [(topic, 0)]
        assert [m.queue for m in await drain(consumer, 1)] == [1]
        assert await consumer.poll(timeout=0.2) == []  # queue 0 still has its message
        consumer.resume(topic)
        assert consumer.paused() == []
        assert [m.body for m in await drain(consumer, 1)] == [b"queue 0"]


@pytest.mark.anyio
async def test_a_push_consumer_pauses_and_resumes(
        cluster: LocalCluster, anyio_backend: str) -> None:
    """§ issue 28.14: RocketMQ's `suspend`/`resume`: while paused the handler is given
    nothing; on resuming it is given what came meanwhile."""
    ns = cluster.namesrv_addr
    topic = f"traps-pause-push-{anyio_backend}"
    await create(cluster, topic, 2)
    handled: list[bytes] = []

    async def handler(msgs: list[Message]) -> None:
        handled.extend(m.body for m in msgs)

    async def until(count: int) -> None:
        with anyio.fail_after(60):
            while len(handled) < count:
                await anyio.sleep(0.05)

    async with Producer(ns) as producer, \
            PushConsumer(ns, f"{topic}-group", [topic], handler, rebalance_interval=1.0) as consumer:
        await producer.send(topic, b"before the pause")
        await until(1)
        consumer.pause()
        assert consumer.paused
        for i in range(3):
            await producer.send(topic, f"while paused {i}")
        await anyio.sleep(2.0)  # time to have pulled and handled them, were it not paused
        assert handled == [b"before the pause"]
        consumer.resume()
        await until(4)
        assert sorted(handled[1:]) == [f"while paused {i}".encode() for i in range(3)]
