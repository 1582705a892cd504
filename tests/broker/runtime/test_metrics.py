"""Node metrics: names in the exposition, per-node isolation, and the trio HTTP endpoint."""

from __future__ import annotations

import io
import json
import logging

import pytest
import trio

from broker.runtime.metrics import NodeMetrics, serve_metrics
from transport.logs import configure_logging


def test_render_contains_every_metric_name():
    m = NodeMetrics(1)
    m.set_raft_state("g0", role="leader", term=3, commit=10, applied=9, last=11, durable=11)
    m.fsync_seconds.labels("g0").observe(0.002)
    m.produce_messages.labels("g0").inc(5)
    m.produce_bytes.labels("g0").inc(500)
    m.produce_latency.labels("g0").observe(0.01)
    m.fetch_messages.labels("g0").inc(2)
    m.fetch_bytes.labels("g0").inc(200)
    m.consumer_lag.labels("g0", "cg1", "orders", "0").set(7)
    m.elections.labels("g0").inc()
    m.leader_changes.labels("g0").inc()
    text = m.render().decode()
    for name in (
        "raftmq_node_info",
        "raftmq_raft_role",
        "raftmq_raft_term",
        "raftmq_raft_commit_index",
        "raftmq_raft_applied_index",
        "raftmq_raft_last_index",
        "raftmq_raft_durable_index",
        "raftmq_fsync_seconds_bucket",
        "raftmq_produce_messages_total",
        "raftmq_produce_bytes_total",
        "raftmq_produce_latency_seconds_bucket",
        "raftmq_fetch_messages_total",
        "raftmq_fetch_bytes_total",
        "raftmq_consumer_lag",
        "raftmq_elections_total",
        "raftmq_leader_changes_total",
    ):
        assert name in text, name
    assert 'raftmq_raft_role{group="g0"} 2.0' in text
    assert 'raftmq_consumer_lag{cg="cg1",group="g0",queue="0",topic="orders"} 7.0' in text


def test_nodes_in_one_process_do_not_share_series():
    a, b = NodeMetrics(1), NodeMetrics(2)
    a.produce_messages.labels("g0").inc(3)
    assert 'raftmq_produce_messages_total{group="g0"} 3.0' in a.render().decode()
    assert "raftmq_produce_messages_total{" not in b.render().decode()
    assert 'node="2"' in b.render().decode()


def test_roles_and_group_removal():
    m = NodeMetrics(1)
    m.set_role("g1", "pre_candidate")
    assert 'raftmq_raft_role{group="g1"} 1.0' in m.render().decode()
    with pytest.raises(ValueError):
        m.set_role("g1", "emperor")
    m.consumer_lag.labels("g1", "cg", "t", "0").set(1)
    m.consumer_lag.labels("g2", "cg", "t", "0").set(1)
    m.remove_group("g1")
    text = m.render().decode()
    assert 'group="g1"' not in text and 'group="g2"' in text


async def _http(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    chunks = []
    while data := await stream.receive_some(65536):
        chunks.append(data)
    await stream.aclose()
    return b"".join(chunks)


def test_serve_metrics_answers_http_get_over_loopback():
    m = NodeMetrics(7)
    m.set_role("g0", "follower")

    async def main() -> tuple[bytes, bytes]:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                listeners = await nursery.start(serve_metrics, 0, m)
                port = listeners[0].socket.getsockname()[1]
                ok = await _http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                missing = await _http(port, b"GET / HTTP/1.0\r\n\r\n")
                nursery.cancel_scope.cancel()
        return ok, missing

    ok, missing = trio.run(main)
    head, _, body = ok.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200")
    assert b"Content-Type: text/plain; version=" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert b'raftmq_raft_role{group="g0"} 0.0' in body
    assert missing.startswith(b"HTTP/1.0 404")


def test_json_logs_carry_node_and_fields():
    buf = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("n1", "DEBUG", stream=buf)
        logging.getLogger("raftmq.test").info("hello %s", "x", extra={"fields": {"group": "g0",
                                                                               "msg": "clash"}})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    rec = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert rec["node"] == "n1" and rec["msg"] == "hello x" and rec["group"] == "g0"
    assert rec["level"] == "INFO" and rec["logger"] == "raftmq.test" and rec["field_msg"] == "clash"
    assert "T" in rec["ts"]
