"""Requests sent while their group elects a new leader wait for it (over real node
processes): a send, a topic creation or an operator's `raftmq user` command is retried
for `routes.LEADER_WAIT` seconds while no replica leads, instead of failing after a few
quick tries, which an election outlasts.

Each scenario kills the group's leader and pauses one follower, so the group can elect
nobody until the follower is resumed 3 s later: longer than the few attempts alone
last (about a second), shorter than the wait.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from raftmq.client import Admin, Producer, PullConsumer
from raftmq.client.errors import RequestError
from raftmq.commands import user as user_cmd
from raftmq.localcluster import LocalCluster
from tests.live_cluster import LiveCluster
from wire.protocol import Code, Op

pytestmark = pytest.mark.live  # every test here starts a cluster

TOPIC = "elect"
LEADERLESS = 3.0  # seconds the group has no possible leader


async def _while_leaderless(cluster: LocalCluster, live: LiveCluster,
                            request: Callable[[], Awaitable[None]]) -> None:
    """Kill g0's leader, pause a follower, run `request`, and resume the follower after
    `LEADERLESS` seconds (also when `request` fails)."""
    async with Admin(cluster.namesrv_addr) as admin:
        leader = live.leader("g0")
        await admin.routes.call_group("g0", Op.TOPICS, {"g": "g0"})  # learn g0's leader
    follower = next(i for i in cluster.node_ids if i != leader)
    cluster.kill(leader)
    cluster.pause(follower)

    async def resume_later() -> None:
        try:
            await trio.sleep(LEADERLESS)
        finally:
            cluster.resume(follower)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(resume_later)
        await request()


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_a_send_rides_out_an_election(tmp_path: Path, idempotent: bool) -> None:
    with LocalCluster(tmp_path, groups=1) as cluster:
        cluster.wait_ready(timeout=60)
        live = LiveCluster(cluster, TOPIC, 1)

        async def main() -> None:
            async with Admin(cluster.namesrv_addr) as admin:
                await admin.create_topic(TOPIC, 1, exist_ok=True)
            async with Producer(cluster.namesrv_addr, idempotent=idempotent) as producer:
                await producer.send(TOPIC, b"before", queue=0)
                sent = []

                async def send() -> None:
                    sent.append(await producer.send(TOPIC, b"during", queue=0))

                await _while_leaderless(cluster, live, send)
            async with PullConsumer(cluster.namesrv_addr, "check", wait_ms=0) as consumer:
                got = await consumer.pull(TOPIC, 0, 0, max=10)
            bodies = [m.body for m in got.messages]
            assert bodies[0] == b"before" and bodies[sent[0].offset] == b"during"
            if idempotent:
                assert bodies == [b"before", b"during"]

        trio.run(main)


def test_create_topic_rides_out_an_election(tmp_path: Path) -> None:
    """A topic created while its group elects a new leader is created once the group has
    one, rather than failing with UNAVAILABLE."""
    with LocalCluster(tmp_path, groups=1) as cluster:
        cluster.wait_ready(timeout=60)
        live = LiveCluster(cluster, TOPIC, 1)

        async def main() -> None:
            async with Admin(cluster.namesrv_addr) as admin:
                await _while_leaderless(
                    cluster, live, lambda: _create(admin))
                with pytest.raises(RequestError) as exists:
                    await admin.create_topic("elected", 1, wait=0)
                assert exists.value.code == Code.TOPIC_EXISTS

        trio.run(main)


async def _create(admin: Admin) -> None:
    await admin.create_topic("elected", 1, wait=0)


def test_a_user_command_rides_out_an_election_of_the_metadata_group(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`raftmq user add` while the metadata group (g0) elects: the user is added once the
    group has a leader, and the command says so with exit status 0."""
    password = tmp_path / "pw"
    password.write_text("bob's password\n")
    with LocalCluster(tmp_path / "c", groups=1) as cluster:
        cluster.wait_ready(timeout=60)
        live = LiveCluster(cluster, TOPIC, 1)
        status: list[int] = []

        async def add() -> None:
            status.append(await trio.to_thread.run_sync(user_cmd.main, [
                "add", "bob", "--password-file", str(password), "--namesrv",
                cluster.namesrv_addr]))

        trio.run(_while_leaderless, cluster, live, add)
        assert status == [0], capsys.readouterr().err
        capsys.readouterr()
        assert user_cmd.main(["list", "--namesrv", cluster.namesrv_addr]) == 0
        assert capsys.readouterr().out.split() == ["bob"]
