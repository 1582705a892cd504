"""Finding messages by time over real node processes: OFFSET_FOR_TIME through
`Admin.offsets_for_times` (asyncio, trio, blocking), after a leader failover, with bad
input, and the commands built on it (`raftmq message query`, `raftmq group reset-offsets
--to-time`).

Store times are the leader's clock at apply time, so each test reads them back (FETCH)
and computes the expected offsets itself: the first offset whose store time, or an
earlier one's, reaches the time asked for.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import anyio
import pytest

from raftmq.client import Admin, Message, Producer, PullConsumer
from raftmq.client.blocking import BlockingAdmin
from raftmq.commands import group as group_cmd
from raftmq.commands import message as message_cmd
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster, wait_for
from transport.blocking import request
from wire.protocol import Code, Op, RequestError

pytestmark = pytest.mark.live

QUEUES = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("time"), groups=1) as c:
        yield c


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def stored(cluster: LocalCluster, topic: str, rounds: int) -> list[Message]:
    """Create `topic` and send `rounds` rounds of one message per queue, a few ms apart
    so store times differ; every message as FETCH reads it back (with its store time)."""
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, QUEUES)
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(rounds):
            for q in range(QUEUES):
                await producer.send(topic, f"m{i}", key=f"k{i}", tags="T", queue=q)
            await anyio.sleep(0.003)
    return await read_all(cluster, topic)


async def read_all(cluster: LocalCluster, topic: str) -> list[Message]:
    out: list[Message] = []
    async with PullConsumer(cluster.namesrv_addr, fresh("reader")) as consumer:
        for q in range(QUEUES):
            offset = 0
            while True:
                res = await consumer.pull(topic, q, offset, max=256, wait_ms=0)
                out += res.messages
                if res.next_offset >= res.end_offset:
                    break
                offset = res.next_offset
    return out


def expected(msgs: list[Message], topic: str, ms: int) -> dict[tuple[str, int], int]:
    """Per queue: the first offset whose running maximum of store times reaches `ms`."""
    out = {}
    for q in range(QUEUES):
        mine = sorted((m for m in msgs if m.queue == q), key=lambda m: m.offset)
        top, found = -1, len(mine)
        for m in mine:
            top = max(top, m.store_ms)
            if top >= ms:
                found = m.offset
                break
        out[(topic, q)] = found
    return out


def probes(msgs: list[Message]) -> list[int]:
    times = sorted({m.store_ms for m in msgs})
    return [0, times[0] - 1, *times, times[-1] + 1, 1 << 50]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_known_store_times_give_the_expected_offsets(cluster: LocalCluster,
                                                     backend: str) -> None:
    topic = fresh("times")

    async def main() -> None:
        msgs = await stored(cluster, topic, 20)
        async with Admin(cluster.namesrv_addr) as admin:
            for ms in probes(msgs):
                got = await admin.offsets_for_times({(topic, q): ms for q in range(QUEUES)})
                assert got == expected(msgs, topic, ms), ms

    anyio.run(main, backend=backend)


def test_the_blocking_admin_answers_the_same(cluster: LocalCluster) -> None:
    topic = fresh("blocking")
    msgs = anyio.run(stored, cluster, topic, 5)
    with BlockingAdmin(cluster.namesrv_addr) as admin:
        for ms in probes(msgs):
            assert admin.offsets_for_times({(topic, 0): ms, (topic, 1): ms}) == \
                expected(msgs, topic, ms)


def test_after_a_leader_failover_the_new_leader_answers_for_every_message(
        cluster: LocalCluster) -> None:
    topic = fresh("failover")
    before = anyio.run(stored, cluster, topic, 8)
    old = cluster.leaders()["g0"]
    assert old is not None
    cluster.kill(old)
    try:
        wait_for(lambda: cluster.leaders().get("g0") not in (None, old), 30, "a new leader")

        async def more_and_check() -> None:
            async with Producer(cluster.namesrv_addr) as producer:
                for q in range(QUEUES):
                    await producer.send(topic, b"after", queue=q)
            msgs = await read_all(cluster, topic)
            assert len(msgs) == len(before) + QUEUES
            async with Admin(cluster.namesrv_addr) as admin:
                for ms in probes(msgs):
                    got = await admin.offsets_for_times({(topic, q): ms
                                                         for q in range(QUEUES)})
                    assert got == expected(msgs, topic, ms), ms

        anyio.run(more_and_check)
    finally:
        cluster.restart_and_wait(old)
        cluster.wait_preferred_leaders(timeout=60)


def test_bad_input_is_refused_clearly(cluster: LocalCluster) -> None:
    topic = fresh("bad")
    anyio.run(stored, cluster, topic, 1)

    async def main() -> None:
        async with Admin(cluster.namesrv_addr) as admin:
            with pytest.raises(RequestError) as info:
                await admin.offsets_for_times({(topic, 0): -1})
            assert info.value.code == Code.MALFORMED and "-1" in info.value.message
            with pytest.raises(RequestError) as info:
                await admin.offsets_for_times({(topic, 0): "soon"})  # type: ignore[dict-item]
            assert info.value.code == Code.MALFORMED
            with pytest.raises(RequestError) as info:
                await admin.offsets_for_times({(fresh("nosuch"), 0): 0})
            assert info.value.code == Code.UNKNOWN_TOPIC

    anyio.run(main)
    leader = cluster.node_addr(cluster.leaders()["g0"] or 1)
    for ms, why in ((-5, "ms must be epoch milliseconds"), ("x", "'ms'"), (None, "'ms'")):
        header = {"op": int(Op.OFFSET_FOR_TIME), "topic": topic, "queue": 0, "ms": ms}
        with pytest.raises(RequestError) as info:
            request(leader, header)
        assert info.value.code == Code.MALFORMED and why in info.value.message, info.value
    with pytest.raises(RequestError) as info:
        request(leader, {"op": int(Op.OFFSET_FOR_TIME), "topic": topic, "queue": 7, "ms": 0})
    assert info.value.code == Code.UNKNOWN_QUEUE


def test_message_query_lists_the_messages_stored_in_a_window(
        cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic = fresh("query")
    msgs = anyio.run(stored, cluster, topic, 10)
    times = sorted({m.store_ms for m in msgs})
    lo, hi = times[2], times[-2]
    ns = ["--namesrv", cluster.namesrv_addr]
    capsys.readouterr()
    assert message_cmd.main(["query", "--topic", topic, "--from", str(lo), "--to", str(hi),
                             "--json", *ns]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = {(m.queue, m.offset) for m in msgs
            if expected(msgs, topic, lo)[(topic, m.queue)] <= m.offset
            < expected(msgs, topic, hi)[(topic, m.queue)]}
    assert {(r["queue"], r["offset"]) for r in rows} == want and want
    assert all(lo <= r["store_ms"] < hi and r["tags"] == "T" and r["size"] > 0
               for r in rows)
    assert message_cmd.main(["query", "--topic", topic, "--from=-1h", *ns]) == 0
    out = capsys.readouterr().out
    assert f"{len(msgs)} message(s) of {topic}" in out and msgs[0].msg_id in out
    with pytest.raises(SystemExit) as exit_info:
        message_cmd.main(["query", "--topic", topic, "--from", "yesterday", *ns])
    assert exit_info.value.code == 2
    assert "ISO 8601" in capsys.readouterr().err


def test_group_reset_offsets_to_a_time(cluster: LocalCluster,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = fresh("reset"), fresh("cg")
    msgs = anyio.run(stored, cluster, topic, 6)
    ms = sorted({m.store_ms for m in msgs})[3]
    ns = ["--namesrv", cluster.namesrv_addr]
    assert group_cmd.main(["reset-offsets", group, "--topic", topic, "--to-time", str(ms),
                           "--json", *ns]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert {(topic, int(q)): v["new"] for q, v in plan["queues"].items()} == \
        expected(msgs, topic, ms)

    async def committed() -> dict[tuple[str, int], int]:
        async with Admin(cluster.namesrv_addr) as admin:
            return {(topic, q): await admin.committed_offset(group, topic, q)
                    for q in range(QUEUES)}

    assert anyio.run(committed) == expected(msgs, topic, ms)
    with pytest.raises(SystemExit):
        group_cmd.main(["reset-offsets", group, "--topic", topic, "--to", "earliest",
                        "--to-time=-1m", *ns])
