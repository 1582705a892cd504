"""A leader answers from its state only once that state is complete and current (over
real node processes).

The commit index is not stored: after a restart a replica knows which of its entries are
committed only once its leader's first entry commits. Until a new leader has applied an
entry of its own term it answers every request NOT_LEADER naming itself, with `ready`
false, and the SDK retries it as it does an election; a follower whose state lags never
calls a topic unknown (FETCH and QUERY_OFFSET name the group their route found), and a
leader that was replaced without knowing it yet confirms its leadership (ReadIndex)
before it serves a topic from its state, so it never serves one deleted meanwhile.

The first scenario stops every node, slows every Raft link to `DELAY` seconds per chunk
and starts them again: the group elects a leader seconds before that leader's first
entry commits, and the requests reach it (and a follower) in between.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest

from raftmq.client import Admin, OutgoingMessage, Producer, PullConsumer
from raftmq.client.consumer import fetch as sdk_fetch
from raftmq.localcluster import LocalCluster
from tests.conftest import ProxyThread, group_leader, node_status, proxied_cluster, wait_for
from transport.blocking import request
from wire.produce import decode_outcome
from wire.protocol import Code, Op, RequestError
from wire.records import encode_batch

pytestmark = pytest.mark.live

TOPIC = "born"
DELAY = 1.0  # seconds each chunk waits on a Raft link after the restart
# an election timeout (5 to 10 s) outlasts a pre-vote and a vote round trip (4 s) on those
# links, so the group elects a leader rather than timing out round after round
OVERRIDES = {"election_ticks": 100}


def _create_and_fill(cluster: LocalCluster) -> int:
    """The topic, created with one message on queue 1; the leader of g0."""
    async def main() -> None:
        async with Admin(cluster.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, 2)

    anyio.run(main, backend="trio")
    leader = wait_for(lambda: group_leader(cluster, "g0"), 30, "a leader of g0")
    assert leader is not None
    _produce(cluster, leader, b"before")
    # the transactional id of the offsets below: only an epoch its coordinator granted
    # may prepare anything
    request(cluster.node_addr(leader), {"op": int(Op.TX_INIT), "g": "g0", "tid": "t1",
                                        "timeout_ms": 60_000}, timeout=30.0)
    return leader


def _produce(cluster: LocalCluster, node: int, body: bytes, queue: int = 1) -> dict[str, Any]:
    """One batch of one message sent to `node` for g0: its outcome, or the error raised."""
    batch = encode_batch(TOPIC, queue, [body])
    h, _ = request(cluster.node_addr(node),
                   {"op": int(Op.PRODUCE), "g": "g0", "sizes": [len(batch)]}, batch,
                   timeout=30.0)
    return decode_outcome(h["results"][0])


def _refused(addr: str, header: dict[str, Any], body: bytes = b"") -> RequestError:
    """The error `addr` answers `header` with (the test fails if it answers OK)."""
    with pytest.raises(RequestError) as exc:
        request(addr, header, body, timeout=30.0)
    return exc.value


def _fetch(topic: str, **extra: Any) -> dict[str, Any]:
    return {"op": int(Op.FETCH), "topic": topic, "queue": 1, "offset": 0, "max": 1,
            "wait_ms": 0, **extra}


def _query_offset(topic: str, **extra: Any) -> dict[str, Any]:
    return {"op": int(Op.QUERY_OFFSET), "cg": "cg", "topic": topic, "queue": 1, **extra}


def _restarted_slowly(cluster: LocalCluster, proxies: ProxyThread) -> tuple[int, int]:
    """Stop every node, slow every Raft link and start them again; the new leader of g0
    and a follower, found before the leader's first entry commits."""
    cluster.kill_together(cluster.node_ids)
    proxies.call(proxies.net.set_delay, DELAY)
    for i in cluster.node_ids:
        cluster.start_node(i)
    leader = wait_for(lambda: group_leader(cluster, "g0"), 60, "a leader of g0")
    assert leader is not None
    follower = next(i for i in cluster.node_ids if i != leader)
    # the scenario holds: neither has applied the topic's creation yet; the requests
    # below reach them seconds before they could have
    for node in (leader, follower):
        status = node_status(cluster, node, "g0")
        assert TOPIC not in status["queues"], (node, status)
    return leader, follower


def _sdk_reads(cluster: LocalCluster) -> tuple[int, int, str]:
    """Through the SDK (routes from the name server, retries): the committed offset of
    queue 1, how many messages a fetch from offset 0 returns, and the body a send got."""
    async def main() -> tuple[int, int, str]:
        async with PullConsumer(cluster.namesrv_addr, "cg", wait_ms=0) as consumer:
            committed = await consumer.committed(TOPIC, 1)
            got = await sdk_fetch(consumer.routes, TOPIC, 1, 0, wait_ms=0)
        async with Producer(cluster.namesrv_addr) as producer:
            sent = await producer.send(TOPIC, OutgoingMessage(b"sdk"), queue=1)
        return committed, len(got.messages), type(sent).__name__

    return anyio.run(main, backend="trio")


def test_a_new_leader_answers_only_once_ready(tmp_path: Path) -> None:
    with proxied_cluster(tmp_path, groups=1, node_overrides=OVERRIDES) as (cluster, proxies):
        _create_and_fill(cluster)
        leader, follower = _restarted_slowly(cluster, proxies)
        at_leader, at_follower = cluster.node_addr(leader), cluster.node_addr(follower)
        batch = encode_batch(TOPIC, 1, [b"after"])
        to_leader = [  # every kind of request, answered from the group's state
            ({"op": int(Op.PRODUCE), "g": "g0", "sizes": [len(batch)]}, batch),
            (_fetch(TOPIC), b""),
            (_fetch(TOPIC, g="g0"), b""),
            (_fetch("never"), b""),
            (_query_offset(TOPIC, g="g0"), b""),
            ({"op": int(Op.QUERY_KEY), "topic": TOPIC, "key": "k"}, b""),
            ({"op": int(Op.COMMIT_OFFSET), "cg": "cg", "offsets": [[TOPIC, 1, 0]]}, b""),
            ({"op": int(Op.TX_OFFSETS), "g": "g0", "tid": "t1", "epoch": 0, "n": 0,
              "cg": "cg", "offsets": [[TOPIC, 1, 0]]}, b""),
            ({"op": int(Op.TOPICS), "g": "g0"}, b""),
        ]
        to_follower = [  # its state lags: it must not call the topic unknown (it did)
            _fetch(TOPIC, g="g0"), _query_offset(TOPIC, g="g0"), _fetch(TOPIC),
            _query_offset(TOPIC),
        ]
        with ThreadPoolExecutor(len(to_leader) + len(to_follower)) as pool:
            # all reach the nodes before the leader catches up
            led = [pool.submit(_refused, at_leader, h, b) for h, b in to_leader]
            followed = [pool.submit(_refused, at_follower, h) for h in to_follower]
            for f, h in zip(followed, to_follower, strict=True):
                exc = f.result()
                assert exc.code == Code.NOT_LEADER and "ready" not in exc.extra, (h, exc)
            for f, (h, _b) in zip(led, to_leader, strict=True):
                exc = f.result()
                assert exc.code == Code.NOT_LEADER and exc.extra.get("ready") is False, (h, exc)
                assert exc.extra.get("leader"), (h, exc)  # itself: the client stays
        # once ready, an unknown topic is still refused, by the group's leader (whichever
        # node that is by then: the preferred one takes leadership back)
        assert _settled(cluster, _fetch("never")).code == Code.UNKNOWN_TOPIC
        assert _settled(cluster, _fetch("never", g="g0")).code == Code.UNKNOWN_TOPIC
        proxies.call(proxies.net.set_delay, 0.0)


def test_the_sdk_retries_a_new_leader_until_it_is_ready(tmp_path: Path) -> None:
    """The leader is killed with every Raft link slowed: its successor is elected seconds
    before its first entry commits. The SDK's calls meanwhile (an offset query, a fetch,
    a send) get NOT_LEADER with ready false and are retried there, as after an election:
    none reaches its caller as an error."""
    with proxied_cluster(tmp_path, groups=1, node_overrides=OVERRIDES) as (cluster, proxies):
        old = _create_and_fill(cluster)
        proxies.call(proxies.net.set_delay, DELAY)
        cluster.kill(old)
        others = [i for i in cluster.node_ids if i != old]
        new = wait_for(lambda: group_leader(cluster, "g0", others), 60, "a new leader of g0")
        assert new is not None
        with ThreadPoolExecutor(2) as pool:
            sdk = pool.submit(_sdk_reads, cluster)
            # the scenario holds: the new leader is not ready while the SDK's calls start
            exc = pool.submit(_refused, cluster.node_addr(new), _fetch(TOPIC, g="g0")).result()
            assert exc.code == Code.NOT_LEADER and exc.extra.get("ready") is False, exc
            assert sdk.result() == (-1, 1, "SendResult"), sdk.result()
        proxies.call(proxies.net.set_delay, 0.0)


def test_a_replaced_leader_does_not_serve_a_topic_deleted_meanwhile(tmp_path: Path) -> None:
    """The old leader is paused and cut off; the others elect a leader, which deletes the
    topic; the old one resumes still believing it leads (for up to an election timeout,
    5 to 10 s here) and is asked for the topic's messages: it must not serve them from
    its state (it did: a full answer skipped the read barrier)."""
    with proxied_cluster(tmp_path, groups=1, node_overrides=OVERRIDES) as (cluster, proxies):
        old = _create_and_fill(cluster)
        addr = cluster.node_addr(old)
        assert len(request(addr, _fetch(TOPIC, g="g0"), timeout=30.0)[0]["msgs"]) == 1
        cluster.pause(old)
        proxies.isolate(old)  # before the others elect: it must hear nothing of that
        others = [i for i in cluster.node_ids if i != old]
        new = wait_for(lambda: group_leader(cluster, "g0", others), 60, "a new leader of g0")
        assert new is not None

        def delete() -> bool:
            """The new leader deletes the topic once it is ready: elected a moment ago,
            it refuses (NOT_LEADER, not ready, nothing proposed) while it applies what
            its predecessor committed."""
            try:
                request(cluster.node_addr(new), {"op": int(Op.DELETE_TOPIC), "g": "g0",
                                                  "topic": TOPIC}, timeout=30.0)
            except RequestError as exc:
                if exc.code == Code.NOT_LEADER and exc.extra.get("ready") is False:
                    return False
                raise
            return True

        wait_for(delete, 60, "the new leader deleting the topic", interval=0.1)
        cluster.resume(old)
        assert node_status(cluster, old, "g0")["role"] == "leader"  # it does not know yet
        with ThreadPoolExecutor(3) as pool:
            asked = [pool.submit(_refused, addr, h) for h in (
                _fetch(TOPIC, g="g0"), _fetch(TOPIC), _query_offset(TOPIC, g="g0"))]
            for f in asked:
                assert f.result().code == Code.NOT_LEADER, f.result()
        proxies.heal()
        # the group's ready leader, asked once the old one rejoined, calls the topic unknown
        assert _settled(cluster, _fetch(TOPIC, g="g0")).code == Code.UNKNOWN_TOPIC


def _settled(cluster: LocalCluster, header: dict[str, Any]) -> RequestError:
    """The error g0's leader answers `header` with, once one is ready to answer."""
    def answer() -> RequestError | None:
        leader = group_leader(cluster, "g0")
        if leader is None:
            return None
        exc = _refused(cluster.node_addr(leader), header)
        return None if exc.code == Code.NOT_LEADER else exc

    return wait_for(answer, 60, "an answer from g0's leader", interval=0.5)
