"""A leader elected a moment ago does not call a created topic unknown (over real node
processes).

The commit index is not stored: after a restart a replica knows which of its entries are
committed only once its leader's first entry commits. A new leader whose log holds a
CREATE_TOPIC it has not applied yet would answer UNKNOWN_TOPIC, which a client does not
retry. Before refusing a topic or queue as unknown, a leader first applies everything
committed before the request (a read barrier) and looks again.

The scenario stops every node, slows every Raft link to `DELAY` seconds per chunk and
starts them again: the group elects a leader seconds before that leader's first entry
commits, and the requests reach it in between.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest

from broker.produce_wire import decode_outcome
from broker.protocol import Code, Op, RequestError
from broker.records import encode_batch
from chaos.cluster import LocalCluster
from raftmq.client import Admin
from tests.conftest import ProxyThread, group_leader, node_status, proxied_cluster, wait_for
from transport.blocking import request

pytestmark = pytest.mark.live

TOPIC = "born"
DELAY = 1.0  # seconds each chunk waits on a Raft link after the restart
# an election timeout (5 to 10 s) outlasts a pre-vote and a vote round trip (4 s) on those
# links, so the group elects a leader rather than timing out round after round
OVERRIDES = {"election_ticks": 100}


def _create_and_fill(cluster: LocalCluster) -> None:
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


def _produce(cluster: LocalCluster, node: int, body: bytes, queue: int = 1) -> dict[str, Any]:
    """One batch of one message sent to `node` for g0: its outcome, or the error raised."""
    batch = encode_batch(TOPIC, queue, [body])
    h, _ = request(cluster.node_addr(node),
                   {"op": int(Op.PRODUCE), "g": "g0", "sizes": [len(batch)]}, batch,
                   timeout=30.0)
    return decode_outcome(h["results"][0])


def _restarted_slowly(cluster: LocalCluster, proxies: ProxyThread) -> int:
    """Stop every node, slow every Raft link and start them again; the new leader of g0,
    found before its first entry commits."""
    cluster.kill_together(cluster.node_ids)
    proxies.call(proxies.net.set_delay, DELAY)
    for i in cluster.node_ids:
        cluster.start_node(i)
    leader = wait_for(lambda: group_leader(cluster, "g0"), 60, "a leader of g0")
    assert leader is not None
    status = node_status(cluster, leader, "g0")
    # the scenario holds: the leader has not applied the topic's creation yet; the
    # requests below reach it seconds before it could have
    assert TOPIC not in status["queues"], status
    return leader


def test_a_new_leader_applies_a_created_topic_before_calling_it_unknown(tmp_path: Path) -> None:
    with proxied_cluster(tmp_path, groups=1, node_overrides=OVERRIDES) as (cluster, proxies):
        _create_and_fill(cluster)
        leader = _restarted_slowly(cluster, proxies)
        addr = cluster.node_addr(leader)

        def fetch(topic: str) -> list[Any]:
            h, _ = request(addr, {"op": int(Op.FETCH), "topic": topic, "queue": 1,
                                  "offset": 0, "wait_ms": 0}, timeout=30.0)
            return list(h["msgs"])

        def query_key(topic: str) -> dict[str, Any]:
            h, _ = request(addr, {"op": int(Op.QUERY_KEY), "topic": topic, "key": "k"},
                           timeout=30.0)
            return h

        def tx_offsets(topic: str) -> Code | None:
            """Offsets prepared in a transaction (whose coordinator is not asked here): the
            error they met, if any."""
            try:
                request(addr, {"op": int(Op.TX_OFFSETS), "g": "g0", "tid": "t1", "epoch": 0,
                               "n": 0, "cg": "cg", "offsets": [[topic, 1, 0]]}, timeout=30.0)
            except RequestError as exc:
                return exc.code
            return None

        with ThreadPoolExecutor(5) as pool:  # all five reach the leader before it catches up
            sent = pool.submit(_produce, cluster, leader, b"after")
            read = pool.submit(fetch, TOPIC)
            keyed = pool.submit(query_key, TOPIC)
            in_tx = pool.submit(tx_offsets, TOPIC)
            never = pool.submit(fetch, "never")
            assert sent.result()["base"] == 1, sent.result()  # after "before", at offset 0
            assert len(read.result()) >= 1  # at least "before"
            assert keyed.result()["msgs"] == [], keyed.result()  # nothing sent with key "k"
            assert in_tx.result() is None
            with pytest.raises(RequestError) as unknown:
                never.result()
        assert unknown.value.code == Code.UNKNOWN_TOPIC  # still refused, once caught up
        proxies.call(proxies.net.set_delay, 0.0)
