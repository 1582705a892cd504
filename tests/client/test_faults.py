"""What the SDK and the CLI say when a group loses its quorum, over real processes.

Two of three nodes are paused (SIGSTOP: they keep their sockets and answer nothing), so
every group has lost its majority and a request can reach a leader that will not answer:

* a send whose request reached a node that may still store it fails with
  `OutcomeUnknownError`, and `raftmq send` says the message may have been stored;
* reads say UNAVAILABLE in every command (`raftmq lag`), and `raftmq consume` names the
  queues it could not read and exits non-zero instead of reporting "nothing new";
* after the nodes resume, the cluster serves again;
* with every node paused, each documented timeout bounds its whole call (route lookups,
  connects, retries and backoffs included) and the call raises the documented error;
* closing a `PushConsumer` whose plain handler is stuck takes `2 * shutdown_timeout` at
  most: the handler's thread is abandoned and its message is not committed;
* leaving a `Producer` block by an exception fails its sends, saying which may be stored.

The bounds asserted are generous correctness bounds (a call must end, well within twice
its timeout plus a few seconds), not speed targets: under the old code the same calls
took 11 to 18 s, or forever.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from raftmq.client import (
    Admin,
    ClientClosedError,
    OutcomeUnknownError,
    Producer,
    PullConsumer,
    PushConsumer,
    RaftMQError,
    RequestError,
    SendFuture,
    TransactionError,
    UnavailableError,
    key_queue,
)
from raftmq.client.blocking import BlockingPullConsumer
from raftmq.localcluster import LocalCluster
from tests.paths import REPO_ROOT as ROOT
from wire.protocol import Code

pytestmark = pytest.mark.live  # every test here starts a cluster

TOPIC = "faults"
QUEUES = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "c", nodes=3, groups=3, tick_ms=50) as c:
        c.wait_ready(timeout=60)
        c.wait_preferred_leaders(timeout=30)

        async def create() -> None:
            async with Admin(c.namesrv_addr) as admin:
                await admin.create_topic(TOPIC, queues=QUEUES, groups=["g0", "g1", "g2"])

        anyio.run(create)
        yield c


def raftmq(cluster: LocalCluster, *args: str, timeout: float = 120
           ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTMQ_NAMESRV", "NAMESRV_ADDR")}
    env["RAFTMQ_NAMESRV"] = cluster.namesrv_addr
    return subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


def key_for(queue: int) -> str:
    return next(k for i in range(1000) if key_queue(k := f"key-{i}", QUEUES) == queue)


def test_a_lost_quorum_is_outcome_unknown_for_writes_and_unavailable_for_reads(
        cluster: LocalCluster) -> None:
    leader = cluster.leaders()["g0"]
    assert leader is not None
    other = next(n for n in cluster.node_ids if n != leader)
    live = next(n for n in cluster.node_ids if n not in (leader, other))
    # queue 0 lives in g0; its leader and one follower stop answering
    cluster.pause(leader)
    cluster.pause(other)
    try:
        async def send() -> None:
            async with Producer(cluster.namesrv_addr, send_timeout=1.0, retries=1) as producer:
                await producer.send(TOPIC, b"in doubt", queue=0)

        with pytest.raises(OutcomeUnknownError) as info:
            anyio.run(send)
        assert isinstance(info.value, RequestError) and isinstance(info.value, RaftMQError)
        assert "may have" in info.value.message
        assert info.value.txid is None

        async def prepare() -> None:
            async with Producer(cluster.namesrv_addr, send_timeout=1.0, retries=1,
                                producer_group="pg") as producer:
                await producer.prepare(TOPIC, b"half in doubt", queue=0)

        with pytest.raises(OutcomeUnknownError) as half:
            anyio.run(prepare)
        txid = half.value.txid  # the half message may be stored: it can still be decided
        assert isinstance(txid, str) and len(txid) == 32, txid

        out = raftmq(cluster, "send", "--topic", TOPIC, "--key", key_for(0), "in doubt too")
        assert out.returncode == 1
        assert "OUTCOME UNKNOWN" in out.stderr and "MAY HAVE BEEN STORED" in out.stderr
        assert "TIMEOUT" not in out.stderr, out.stderr

        lag = raftmq(cluster, "lag", "--group", "cg", "--topic", TOPIC)
        assert lag.returncode == 1
        assert "UNAVAILABLE" in lag.stderr, lag.stderr

        consume = raftmq(cluster, "consume", "--group", "cg", "--topic", TOPIC,
                         "--timeout", "1")
        assert consume.returncode == 1, consume.stderr
        assert "could not read" in consume.stderr
        for q in range(QUEUES):  # every group lost its majority
            assert f"{TOPIC}/{q}" in consume.stderr, consume.stderr
        assert cluster.is_running(live)
    finally:
        cluster.resume(leader)
        cluster.resume(other)

    cluster.wait_ready(timeout=60)

    async def send_again() -> int:
        async with Producer(cluster.namesrv_addr) as producer:
            return (await producer.send(TOPIC, b"after", queue=0)).offset

    assert anyio.run(send_again) >= 0

    async def roll_back() -> None:
        async with Admin(cluster.namesrv_addr) as admin:
            try:
                await admin.tx_rollback(txid)  # it was stored: rolled back by its id
            except TransactionError as exc:  # it never was: no group knows the id
                assert exc.code == Code.TX_UNKNOWN, exc
                return
            assert not (await admin.tx_show(txid))["halves"]

    anyio.run(roll_back)
    ok = raftmq(cluster, "consume", "--group", "cg2", "--topic", TOPIC, "--timeout", "1")
    assert ok.returncode == 0, ok.stderr
    assert "could not read" not in ok.stderr
    assert Code.UNAVAILABLE.retriable


def bound(timeout: float) -> float:
    """The most a call with `timeout` may take here: twice it, and a few seconds for the
    shared machine's scheduling."""
    return 2 * timeout + 4


def test_timeouts_bound_their_calls_with_every_node_paused(cluster: LocalCluster) -> None:
    """§ issue 28.10: with every node paused, `send` took 15.1 s at send_timeout 3,
    `poll(timeout=1)` 11.0 s and `commit_all` 15.3 s: retries, backoffs and the leader
    wait each went on past the call's own timeout."""

    async def main() -> None:
        async with Producer(cluster.namesrv_addr, delivery_timeout=3.0) as producer, \
                PullConsumer(cluster.namesrv_addr, "paused") as consumer:
            await producer.send(TOPIC, b"before")  # routes known, connections open
            consumer.assign(TOPIC)
            got: list[bytes] = []
            for _ in range(20):
                got += [m.body for m in await consumer.poll(timeout=2.0)]
                if b"before" in got:
                    break
            assert b"before" in got
            for node in cluster.node_ids:
                cluster.pause(node)
            try:
                start = time.monotonic()
                with pytest.raises(OutcomeUnknownError, match="delivery_timeout"):
                    await producer.send(TOPIC, b"paused", queue=0)
                assert time.monotonic() - start < bound(3.0)

                start = time.monotonic()
                with pytest.raises(OutcomeUnknownError, match="delivery_timeout"):
                    await producer.send_batch(TOPIC, [b"a", b"b"], queue=1)
                assert time.monotonic() - start < bound(3.0)

                every = {(TOPIC, q) for q in range(QUEUES)}
                for _ in range(10):  # unreadable once silent for the consumer's timeout
                    start = time.monotonic()
                    assert await consumer.poll(timeout=1.0) == []
                    assert time.monotonic() - start < bound(1.0)
                    assert set(consumer.silent()) | set(consumer.unreadable) == every
                    if set(consumer.unreadable) == every:
                        break
                assert set(consumer.unreadable) == every
                assert all(isinstance(e, UnavailableError)
                           for e in consumer.unreadable.values())

                start = time.monotonic()
                with pytest.raises(OutcomeUnknownError, match="COMMIT_OFFSET"):
                    await consumer.commit_all(timeout=3.0)
                assert time.monotonic() - start < bound(3.0)
            finally:
                for node in cluster.node_ids:
                    cluster.resume(node)

    anyio.run(main)

    # the blocking facade passes the bound on
    with BlockingPullConsumer(cluster.namesrv_addr, "paused-blocking") as blocking:
        blocking.assign(TOPIC)
        blocking.poll(timeout=2.0)
        for node in cluster.node_ids:
            cluster.pause(node)
        try:
            start = time.monotonic()
            with pytest.raises((OutcomeUnknownError, UnavailableError)):
                blocking.commit_all(timeout=2.0)
            assert time.monotonic() - start < bound(2.0)
        finally:
            for node in cluster.node_ids:
                cluster.resume(node)


def test_admin_and_transaction_calls_are_bounded_with_every_node_paused(
        cluster: LocalCluster) -> None:
    """With every node paused, Admin calls went on for 12-30 s (retries, the leader
    wait, create_topic's wait for routes) whatever the caller wanted. `call_timeout`
    bounds each whole call: a read is then unavailable, a change of unknown outcome."""

    async def main() -> None:
        async with Admin(cluster.namesrv_addr, call_timeout=2.0) as admin:
            await admin.describe_topic(TOPIC)  # routes known, connections open
            for node in cluster.node_ids:
                cluster.pause(node)
            try:
                for call, error in (
                        (lambda: admin.describe_topic(TOPIC), UnavailableError),
                        (lambda: admin.consumer_lag("paused-admin", TOPIC), UnavailableError),
                        (lambda: admin.create_topic("admin-bound", 3), OutcomeUnknownError),
                        (lambda: admin.delete_group("paused-admin"), OutcomeUnknownError)):
                    start = time.monotonic()
                    with pytest.raises(error, match="call_timeout"):
                        await call()
                    assert time.monotonic() - start < bound(2.0)
                # send_async's hand-over: a send waiting for room gives up in time too
                async with Producer(cluster.namesrv_addr, delivery_timeout=2.0,
                                    max_pending=1) as tight:
                    held = await tight.send_async(TOPIC, b"holds the one slot", queue=0)
                    start = time.monotonic()
                    with pytest.raises(UnavailableError, match="not handed over"):
                        await tight.send_async(TOPIC, b"no room", queue=0)
                    assert time.monotonic() - start < bound(2.0)
                    with pytest.raises(OutcomeUnknownError):
                        await held
                # a transactional producer's coordinator calls: within delivery_timeout
                start = time.monotonic()
                with pytest.raises(OutcomeUnknownError, match="TX_INIT"):
                    async with Producer(cluster.namesrv_addr, transactional_id="paused-tx",
                                        delivery_timeout=2.0) as tx_producer:
                        await tx_producer.begin()  # TX_INIT, at the first transaction
                assert time.monotonic() - start < bound(2.0)
            finally:
                for node in cluster.node_ids:
                    cluster.resume(node)

    anyio.run(main)


def test_closing_a_push_consumer_abandons_a_stuck_plain_handler(cluster: LocalCluster) -> None:
    """§ issue 28.10: close waited for a plain handler stuck in its thread, whatever
    `shutdown_timeout` said. Now it waits `shutdown_timeout` for it, then abandons the
    thread; the message stays uncommitted, so the group is given it again."""
    release = threading.Event()
    started = threading.Event()
    watchdog = threading.Timer(120.0, release.set)  # lets the old code end, late
    watchdog.start()

    def stuck(msgs: list[Any]) -> None:
        started.set()
        release.wait()

    async def main() -> float:
        async with Producer(cluster.namesrv_addr) as producer:
            await producer.send(TOPIC, b"stuck", queue=0)
        consumer = PushConsumer(cluster.namesrv_addr, "stuck", [TOPIC], stuck,
                                shutdown_timeout=2.0, rebalance_interval=1.0,
                                commit_interval=0.5)
        async with consumer:
            while not started.is_set():
                await anyio.sleep(0.05)
            start = time.monotonic()
        return time.monotonic() - start

    try:
        took = anyio.run(main)
        assert took < bound(2 * 2.0), took
        assert not release.is_set()  # the handler was still stuck when close returned
    finally:
        release.set()
        watchdog.cancel()

    async def committed() -> int:
        async with PullConsumer(cluster.namesrv_addr, "stuck") as reader:
            return await reader.committed(TOPIC, 0)

    assert anyio.run(committed) <= 0  # not past the unfinished message


def test_leaving_a_producer_block_by_an_exception_says_which_sends_may_be_stored(
        cluster: LocalCluster) -> None:
    """§ issue 28.14: leaving the block by an exception does not wait for buffered sends:
    they fail. One never sent fails with `ClientClosedError`; one whose request was out
    (every node paused, no answer) with `OutcomeUnknownError`, since it may be stored;
    it used to fail with `ClientClosedError` too, as if it had never left."""
    futs: dict[str, SendFuture[Any]] = {}

    async def main() -> None:
        out = anyio.Event()
        async with Producer(cluster.namesrv_addr, on_attempt=lambda a: out.set()) as sender, \
                Producer(cluster.namesrv_addr, linger_ms=600_000) as holder:
            await sender.send(TOPIC, b"routes and connections", queue=0)
            out = anyio.Event()
            futs["held"] = await holder.send_async(TOPIC, b"held back", queue=1)
            for node in cluster.node_ids:
                cluster.pause(node)
            futs["out"] = await sender.send_async(TOPIC, b"in doubt", queue=0)
            await out.wait()  # its PRODUCE is leaving
            await anyio.sleep(0.5)  # and has left; no node answers it
            raise KeyError("the block fails")

    try:
        with pytest.raises(KeyError):
            anyio.run(main)
    finally:
        for node in cluster.node_ids:
            cluster.resume(node)
    held, out = futs["held"].exception(), futs["out"].exception()
    assert isinstance(held, ClientClosedError) and not isinstance(held, OutcomeUnknownError)
    assert isinstance(out, OutcomeUnknownError), repr(out)
    assert "may have been stored" in out.message
