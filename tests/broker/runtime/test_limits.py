"""Per-node limits on a real cluster: client connections over `max_connections` are
turned away with a clear BUSY (and counted) while the peers' links, which do not count,
keep replicating; a client that stops reading its answers is disconnected after
`slow_client_timeout` without holding up anyone else."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftmq.localcluster import LocalCluster
from tests.live_cluster import scrape_metrics
from transport.blocking import Connection, request
from wire.protocol import Code, FrameDecoder, Op, RequestError, encode_frame
from wire.records import OutgoingMessage, encode_batch

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    keys = {"max_connections": 2, "slow_client_timeout": 1.0,
            "max_pending_bytes_per_connection": 1024}
    with LocalCluster(tmp_path_factory.mktemp("limits"), nodes=3, groups=1, tick_ms=50,
                      node_overrides=keys) as c:
        c.wait_ready(timeout=60)
        c.wait_preferred_leaders(timeout=60)
        yield c


def leader_addr(c: LocalCluster) -> str:
    n = c.leaders()["g0"]
    assert n is not None
    return c.node_addr(n)


def on_leader(conn: Connection, header: dict[str, Any], body: bytes = b"") -> dict[str, Any]:
    """`header` on `conn`, whose node led g0 when it was opened: if an election on the
    busy machine moved the leadership meanwhile, the node takes it back (the hand-back to
    the preferred leader) and the request is asked again."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return conn.request(header, body)[0]
        except RequestError as exc:
            if exc.code != Code.NOT_LEADER or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_connections_over_the_limit_are_refused_and_peers_keep_working(
        cluster: LocalCluster) -> None:
    addr = leader_addr(cluster)
    node = cluster.leaders()["g0"] or 1
    metrics = cluster.configs[node - 1].metrics or ""
    before = scrape_metrics(metrics).get('raftmq_connections_refused_total{reason="connections"}', 0)
    with Connection(addr) as a, Connection(addr) as b:
        a.request({"op": int(Op.STATUS)})
        b.request({"op": int(Op.STATUS)})
        with pytest.raises(RequestError) as info:
            request(addr, {"op": int(Op.STATUS)})
        assert info.value.code == Code.BUSY
        assert "at most 2 client connections" in info.value.message
        # the held connections still work, and a write replicates over the peer links
        on_leader(a, {"op": int(Op.CREATE_TOPIC), "g": "g0", "topic": "lim", "queues": 1,
                      "hosted": [0]})
        h = on_leader(b, {"op": int(Op.PRODUCE), "g": "g0"},
                      bytes(encode_batch("lim", 0, [OutgoingMessage(b"m")])))
        assert h["n"] == 1  # committed: a majority (peers) stored it
    after = scrape_metrics(metrics)['raftmq_connections_refused_total{reason="connections"}']
    assert after == before + 1
    deadline = time.monotonic() + 10  # the slots free up as the node sees the closes
    while True:
        try:
            request(addr, {"op": int(Op.STATUS)})
            break
        except RequestError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_client_that_stops_reading_is_disconnected_without_stalling_others(
        cluster: LocalCluster) -> None:
    addr = leader_addr(cluster)
    other = Connection(addr)  # one of the two slots; the slow client takes the other
    on_leader(other, {"op": int(Op.CREATE_TOPIC), "g": "g0", "topic": "big", "queues": 1,
                      "hosted": [0]})
    for _ in range(8):  # 8 x 64 x 4 KiB of messages to fetch again and again
        on_leader(other, {"op": int(Op.PRODUCE), "g": "g0"},
                  bytes(encode_batch("big", 0, [OutgoingMessage(b"x" * 4096)] * 64)))
    host, port = addr.rsplit(":", 1)
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect((host, int(port)))
    try:
        for i in range(200):  # far more answer bytes than any buffer holds; never read
            slow.sendall(encode_frame({"op": int(Op.FETCH), "id": i + 1, "topic": "big",
                                       "queue": 0, "offset": 0, "max": 512,
                                       "max_bytes": 4 << 20, "wait_ms": 0}))
        h, _ = other.request({"op": int(Op.STATUS)})  # others are served meanwhile
        assert h["addr"] == addr
        time.sleep(1.5)  # past slow_client_timeout with nothing read: the node gives up
        slow.settimeout(30)
        dec, answers = FrameDecoder(64 << 20), 0
        while True:
            try:
                data = slow.recv(1 << 20)
            except ConnectionResetError:
                break
            if not data:
                break
            dec.feed(data)
            while dec.next_frame() is not None:
                answers += 1
        assert answers < 200, "every answer arrived: the slow client was never dropped"
    finally:
        slow.close()
        other.close()
