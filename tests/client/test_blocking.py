"""The blocking facade over real processes: a script that never closes its clients still
ends, and what they held is flushed and committed on the way out.

Each case is a real Python program run in a subprocess against one cluster (a name server
and three nodes); `subprocess.run(timeout=...)` is the failure condition of a program that
hangs, not a measure of speed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from raftmq.client.blocking import BlockingAdmin, BlockingProducer, BlockingPullConsumer
from raftmq.localcluster import LocalCluster
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.live  # every test here starts a cluster

TOPIC = "blocking"
EXIT_BOUND = 90.0  # generous: the two cores are shared; a hang runs forever


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("blocking"), nodes=3, groups=3,
                      tick_ms=50) as c:
        c.wait_ready(timeout=60)
        with BlockingAdmin(c.namesrv_addr) as admin:
            admin.create_topic(TOPIC, queues=3, exist_ok=True)
        yield c
        assert c.unexpected_exits() == {}


def run_script(cluster: LocalCluster, body: str) -> subprocess.CompletedProcess[str]:
    """Run `body` (NAMESRV and TOPIC defined) as a script; fails the test if it hangs."""
    prelude = f"NAMESRV = {cluster.namesrv_addr!r}\nTOPIC = {TOPIC!r}\n"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        return subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c",
                               prelude + textwrap.dedent(body)],
                              capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=EXIT_BOUND)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the script did not exit within {EXIT_BOUND} s: {exc.stderr!r}")


SCRIPTS = {
    # the producer still holds the message (lingering) when the script ends: exit flushes it
    "producer": """
        from raftmq.client.blocking import BlockingProducer
        producer = BlockingProducer(NAMESRV, linger_ms=3000)
        producer.send_async(TOPIC, b"left in the producer", key="exit")
    """,
    "pull-consumer": """
        from raftmq.client.blocking import BlockingPullConsumer
        consumer = BlockingPullConsumer(NAMESRV, "exit-pull")
        consumer.assign(TOPIC)
        consumer.poll(timeout=0.5)
    """,
    "push-consumer": """
        import threading
        from raftmq.client.blocking import BlockingPushConsumer
        seen = threading.Event()
        consumer = BlockingPushConsumer(NAMESRV, "exit-push", [TOPIC], lambda msgs: seen.set(),
                                        backend="asyncio")
        assert seen.wait(60), "nothing consumed"
    """,
    "push-consumer-trio": """
        import threading
        from raftmq.client.blocking import BlockingPushConsumer
        seen = threading.Event()
        consumer = BlockingPushConsumer(NAMESRV, "exit-push-trio", [TOPIC],
                                        lambda msgs: seen.set(), backend="trio")
        assert seen.wait(60), "nothing consumed"
    """,
    "admin": """
        from raftmq.client.blocking import BlockingAdmin
        admin = BlockingAdmin(NAMESRV, backend="trio")
        admin.list_topics()
    """,
}


@pytest.mark.parametrize("kind", list(SCRIPTS))
def test_a_client_never_closed_lets_the_script_exit(cluster: LocalCluster, kind: str) -> None:
    """§ issue 28.5: the loop thread of a client left open used to be joined at interpreter
    shutdown, after it could no longer run: the script never ended."""
    if kind.startswith("push"):
        with BlockingProducer(cluster.namesrv_addr) as producer:
            producer.send(TOPIC, b"for the push consumer")
    out = run_script(cluster, SCRIPTS[kind])
    assert out.returncode == 0, out.stderr
    assert "was not closed; closing it at exit" in out.stderr, out.stderr


def test_exit_flushes_what_a_producer_left_open_held(cluster: LocalCluster) -> None:
    out = run_script(cluster, SCRIPTS["producer"])
    assert out.returncode == 0, out.stderr
    with BlockingPullConsumer(cluster.namesrv_addr, "exit-check") as consumer:
        consumer.assign(TOPIC)
        bodies: list[bytes] = []
        for _ in range(30):
            bodies += [m.body for m in consumer.poll(timeout=1.0, max_messages=1000)]
            if b"left in the producer" in bodies:
                break
        assert b"left in the producer" in bodies


def test_the_blocking_twins_offer_what_their_async_clients_do(cluster: LocalCluster) -> None:
    """§ issue 28.14: the blocking pull consumer lacked `bounds`, `assignment` and
    `unassign`, and `BlockingAdmin` could not look a message up by id or key."""
    ns = cluster.namesrv_addr
    with BlockingProducer(ns) as producer:
        sent = producer.send(TOPIC, b"look me up", key="lookup")
    with BlockingAdmin(ns) as admin:
        assert admin.get_message(str(sent.msg_id)).body == b"look me up"
        assert sent.msg_id in {m.msg_id for m in admin.query_key(TOPIC, "lookup")}
        assert admin.committed_offset("twins", TOPIC, sent.queue) == -1
    with BlockingPullConsumer(ns, "twins") as consumer:
        consumer.assign(TOPIC, [sent.queue])
        assert consumer.assignment() == [(TOPIC, sent.queue)]
        lo, end = consumer.bounds(TOPIC, sent.queue)
        assert lo <= sent.offset < end
        consumer.pause(TOPIC)
        assert consumer.paused() == [(TOPIC, None)]
        assert consumer.poll(timeout=0.2) == []
        consumer.resume(TOPIC)
        assert consumer.paused() == []
        consumer.unassign(TOPIC)
        assert consumer.assignment() == []
