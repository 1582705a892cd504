"""Message trace over real node processes: traced producers and consumers (push, pull,
simple; asyncio, trio and the blocking facade) report each message's steps, the leader
storing it writes them to the trace topic, and `Admin.trace` / `raftmq trace` show one
message's life; untraced clients leave no records; bad reports are refused and change
nothing.

Traced clients report on close (and every `TRACE_INTERVAL` before), so each test reads
the records once the clients are closed: no waiting on time.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import anyio
import pytest

from raftmq.client import Admin, Message, Producer, PullConsumer, PushConsumer, SimpleConsumer
from raftmq.client.blocking import BlockingAdmin, BlockingProducer, BlockingSimpleConsumer
from raftmq.commands import topic as topic_cmd
from raftmq.commands import trace as trace_cmd
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster, wait_for
from transport.blocking import request
from wire.protocol import Code, Op, RequestError
from wire.trace import TRACE_TOPIC, TraceRecord

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("trace"), groups=2) as c:
        yield c


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kinds(records: list[TraceRecord]) -> list[str]:
    return [r.kind for r in records]


async def send_traced(cluster: LocalCluster, topic: str, n: int, *, trace: bool = True
                      ) -> list[str]:
    """Create `topic` (4 queues over both groups) and send `n` messages; their ids."""
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, 4)
    async with Producer(cluster.namesrv_addr, trace=trace) as producer:
        results = [await producer.send(topic, f"m{i}", key=f"k{i}") for i in range(n)]
    return [r.msg_id for r in results if r.msg_id is not None]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_push_and_simple_consumers_trace_each_step(cluster: LocalCluster,
                                                   backend: str) -> None:
    topic, push_group, simple_group = fresh("traced"), fresh("push"), fresh("simple")
    n = 6

    async def main() -> dict[str, list[TraceRecord]]:
        ids = await send_traced(cluster, topic, n)
        assert len(ids) == n
        seen: list[Message] = []
        done = anyio.Event()

        async def handle(msgs: list[Message]) -> None:
            seen.extend(msgs)
            if len({m.msg_id for m in seen}) >= n:
                done.set()

        async with PushConsumer(cluster.namesrv_addr, push_group, [topic], handle,
                                trace=True, client_id="pusher") as push:
            with anyio.fail_after(60):
                await done.wait()
            await push.commit_now()
        got: list[Message] = []
        async with SimpleConsumer(cluster.namesrv_addr, simple_group, trace=True,
                                  client_id="simple-1") as simple:
            with anyio.fail_after(60):
                while len(got) < n:
                    for m in await simple.receive(topic, n, wait=1):
                        await simple.ack(m)
                        got.append(m)
        async with Admin(cluster.namesrv_addr) as admin:
            return {msg_id: await admin.trace(msg_id) for msg_id in ids}

    traces = anyio.run(main, backend=backend)
    for msg_id, records in traces.items():
        assert kinds(records)[:2] == ["sent", "stored"], (msg_id, records)
        sent, stored = records[0], records[1]
        group, index, _start = msg_id.split(":")
        assert (stored.group, stored.index) == (group, int(index))
        assert (sent.topic, sent.queue, sent.offset) == (stored.topic, stored.queue,
                                                         stored.offset)
        assert sent.ms <= stored.ms + 5_000 and stored.ms > 0
        by = {(r.kind, r.cg, r.client) for r in records[2:]}
        assert by == {("delivered", push_group, "pusher"), ("acked", push_group, "pusher"),
                      ("delivered", simple_group, "simple-1"),
                      ("acked", simple_group, "simple-1")}, records
        push_ack = next(r for r in records if r.kind == "acked" and r.cg == push_group)
        assert push_ack.committed > stored.offset
        simple_ack = next(r for r in records if r.kind == "acked" and r.cg == simple_group)
        assert simple_ack.committed == -1
        assert all(r.msg_id == msg_id for r in records)


def test_a_pull_consumer_traces_polls_and_commits(cluster: LocalCluster) -> None:
    topic, group = fresh("pulled"), fresh("pull")

    async def main() -> tuple[list[str], dict[str, list[TraceRecord]]]:
        ids = await send_traced(cluster, topic, 4)
        async with PullConsumer(cluster.namesrv_addr, group, trace=True,
                                client_id="puller") as consumer:
            consumer.assign(topic)
            got: list[Message] = []
            with anyio.fail_after(60):
                while len(got) < len(ids):
                    got += await consumer.poll(1.0)
            first = got[0]
            await consumer.commit(first.topic, first.queue, first.offset + 1)
        async with Admin(cluster.namesrv_addr) as admin:
            return [first.msg_id], {i: await admin.trace(i) for i in ids}

    (acked,), traces = anyio.run(main)
    for msg_id, records in traces.items():
        expected = ["sent", "stored", "delivered"] + (["acked"] if msg_id == acked else [])
        assert kinds(records) == expected, records


def test_untraced_clients_leave_no_records(cluster: LocalCluster) -> None:
    topic = fresh("plain")
    ids = anyio.run(lambda: send_traced(cluster, topic, 2, trace=False))
    with BlockingAdmin(cluster.namesrv_addr) as admin:
        assert [admin.trace(i) for i in ids] == [[], []]


def test_the_blocking_facade_traces_and_the_cli_shows_the_life(
        cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = fresh("blocking"), fresh("bsimple")
    with BlockingAdmin(cluster.namesrv_addr) as admin:
        admin.create_topic(topic, 2)
    with BlockingProducer(cluster.namesrv_addr, trace=True) as producer:
        msg_id = producer.send(topic, "hello").msg_id
    assert msg_id is not None
    with BlockingSimpleConsumer(cluster.namesrv_addr, group, trace=True,
                                client_id="bclient") as simple:
        msgs = simple.receive(topic, 1, wait=10)
        assert [m.msg_id for m in msgs] == [msg_id]
        simple.ack(msgs[0])
    ns = ["--namesrv", cluster.namesrv_addr]
    assert trace_cmd.main([msg_id, "--json", *ns]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["kind"] for r in rows] == ["sent", "stored", "delivered", "acked"]
    assert rows[2]["client"] == "bclient" and rows[2]["cg"] == group
    assert all(r["msg_id"] == msg_id and r["time"] for r in rows)
    assert trace_cmd.main([msg_id, *ns]) == 0
    table = capsys.readouterr().out
    for word in ("sent", "stored", "delivered", "acked", "bclient", msg_id.split(":")[0]):
        assert word in table
    # the trace topic is the cluster's own: hidden from `topic list` unless --all
    assert topic_cmd.main(["list", "--json", *ns]) == 0
    assert TRACE_TOPIC not in json.loads(capsys.readouterr().out)
    assert topic_cmd.main(["list", "--all", "--json", *ns]) == 0
    assert TRACE_TOPIC in json.loads(capsys.readouterr().out)


def test_bad_reports_and_ids_are_refused_clearly(
        cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic = fresh("bad")
    anyio.run(lambda: send_traced(cluster, topic, 1))
    leader = cluster.node_addr(cluster.leaders()["g0"] or 1)
    good = {"op": int(Op.TRACE), "g": "g0", "topic": topic, "role": "producer",
            "client": "c", "slot": 0, "slots": 2, "events": [["sent", 0, 0, 1, -1]]}
    for change, code in (
        ({"events": [["delivered", 0, 0, 1, -1]]}, Code.MALFORMED),  # not a producer's step
        ({"events": [["sent", 0, -1, 1, -1]]}, Code.MALFORMED),
        ({"events": []}, Code.MALFORMED),
        ({"events": "x"}, Code.MALFORMED),
        ({"slot": 2}, Code.MALFORMED),
        ({"role": "consumer", "events": [["acked", 0, 0, 1, 3]]}, Code.MALFORMED),  # no cg
        ({"role": "auditor"}, Code.MALFORMED),
        ({"topic": fresh("nosuch")}, Code.UNKNOWN_TOPIC),
    ):
        with pytest.raises(RequestError) as info:
            request(leader, {**good, **change})
        assert info.value.code == code, (change, info.value)
    # an offset the group does not hold is counted missing, not recorded
    answer, _ = request(leader, {**good, "events": [["sent", 0, 10**9, 1, -1]]})
    assert (answer["written"], answer["missing"]) == (0, 1)
    with pytest.raises(SystemExit) as exit_info:
        trace_cmd.main(["not-an-id", "--namesrv", cluster.namesrv_addr])
    assert exit_info.value.code == 2
    assert "bad message id" in capsys.readouterr().err
    assert trace_cmd.main(["g0:999999:8", "--namesrv", cluster.namesrv_addr]) == 1
    assert "no trace records" in capsys.readouterr().err


def test_a_life_recorded_across_a_leader_failover(cluster: LocalCluster) -> None:
    """Sent and stored by one leader, delivered and acked after its group moved to
    another: the new leader appends to the same trace queue, and the old records stay."""
    topic, group = fresh("moved"), fresh("after")
    ids = anyio.run(lambda: send_traced(cluster, topic, 4))
    old = cluster.leaders()["g0"]
    assert old is not None
    cluster.kill(old)
    try:
        wait_for(lambda: cluster.leaders().get("g0") not in (None, old), 30, "a new leader")

        async def consume_and_read() -> dict[str, list[TraceRecord]]:
            async with SimpleConsumer(cluster.namesrv_addr, group, trace=True,
                                      client_id="late") as simple:
                got: list[Message] = []
                with anyio.fail_after(60):
                    while len(got) < len(ids):
                        for m in await simple.receive(topic, len(ids), wait=1):
                            await simple.ack(m)
                            got.append(m)
            async with Admin(cluster.namesrv_addr) as admin:
                return {i: await admin.trace(i) for i in ids}

        traces = anyio.run(consume_and_read)
    finally:
        cluster.restart_and_wait(old)
        cluster.wait_preferred_leaders(timeout=60)
    for msg_id, records in traces.items():
        assert kinds(records) == ["sent", "stored", "delivered", "acked"], (msg_id, records)
        assert {r.client for r in records[2:]} == {"late"}
