"""Prometheus metrics of one node, and a tiny trio HTTP endpoint that serves them.

Each node gets its own `CollectorRegistry` rather than the process-global one, because
tests and the simulator run several nodes in one process and their series must not mix.
The HTTP side is a few lines of trio instead of prometheus_client's threaded server, so a
node stays a single-threaded trio program that shuts down with its nursery.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

__all__ = ["ROLE_VALUES", "NodeMetrics", "serve_metrics"]

log = logging.getLogger(__name__)

# The role gauge's encoding; a pre-candidate counts as a candidate (an election is on).
ROLE_VALUES = {"follower": 0, "pre_candidate": 1, "precandidate": 1, "candidate": 1, "leader": 2}

# fsync on SSDs is sub-millisecond, on cloud disks tens of milliseconds: cover both.
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0, 2.5)
# A produce waits for a majority fsync plus a network round trip.
PRODUCE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)


ProduceSeries = tuple[Any, Any, Any]  # labelled children: Counter, Counter, Histogram
FetchSeries = tuple[Any, Any]  # labelled children: Counter, Counter


class NodeMetrics:
    """All series one node exports, registered in a registry of its own."""

    def __init__(self, node_id: int | str) -> None:
        self.node_id = node_id
        r = self.registry = CollectorRegistry(auto_describe=True)
        g = ["group"]
        self.info = Info("raftmq_node", "Identity of this raftmq node", registry=r)
        self.info.info({"node": str(node_id)})

        self.role = Gauge("raftmq_raft_role", "Raft role: 0 follower, 1 candidate, 2 leader",
                          g, registry=r)
        self.term = Gauge("raftmq_raft_term", "Current Raft term", g, registry=r)
        self.commit_index = Gauge("raftmq_raft_commit_index", "Raft commit index", g, registry=r)
        self.applied_index = Gauge("raftmq_raft_applied_index",
                                   "Index applied to the broker state machine", g, registry=r)
        self.last_index = Gauge("raftmq_raft_last_index", "Last index in the local log", g,
                                registry=r)
        self.durable_index = Gauge("raftmq_raft_durable_index",
                                   "Last index fsynced to the local CommitLog", g, registry=r)
        self.fsync_seconds = Histogram("raftmq_fsync_seconds", "CommitLog fsync latency", g,
                                       buckets=FSYNC_BUCKETS, registry=r)
        self.elections = Counter("raftmq_elections",
                                 "Elections this node started (as candidate)", g, registry=r)
        self.leader_changes = Counter("raftmq_leader_changes",
                                      "Times this node saw the group's leader change", g,
                                      registry=r)

        self.produce_messages = Counter("raftmq_produce_messages",
                                        "Messages committed by produce requests", g, registry=r)
        self.produce_bytes = Counter("raftmq_produce_bytes",
                                     "Bytes committed by produce requests", g, registry=r)
        self.produce_latency = Histogram("raftmq_produce_latency_seconds",
                                         "Produce request latency, arrival to committed answer",
                                         g, buckets=PRODUCE_BUCKETS, registry=r)
        self.fetch_messages = Counter("raftmq_fetch_messages", "Messages returned by fetches",
                                      g, registry=r)
        self.fetch_bytes = Counter("raftmq_fetch_bytes", "Bytes returned by fetches", g,
                                   registry=r)
        self.fetch_filtered = Counter("raftmq_fetch_filtered", "Messages a fetch's SQL92 "
                                      "filter read and left out", g, registry=r)
        self.tx_ids = Gauge("raftmq_tx_ids", "Transactional ids this group coordinates "
                            "(forgotten after tx_id_expiration_ms idle)", g, registry=r)
        self.tx_fences = Gauge("raftmq_tx_fences", "Transactional ids this group keeps a "
                               "fence of (forgotten after tx_id_expiration_ms idle)", g,
                               registry=r)
        self.delayed_pending = Gauge("raftmq_delayed_pending", "Delayed messages stored and "
                                     "not yet due (broker.state.parts.timers)", g, registry=r)
        self.delayed_delivered = Gauge("raftmq_delayed_delivered", "Delayed messages moved "
                                       "into their queues since the group began", g,
                                       registry=r)
        self.consumer_lag = Gauge("raftmq_consumer_lag",
                                  "Messages between a consumer group's offset and the queue end",
                                  ["group", "cg", "topic", "queue"], registry=r)
        # `.labels()` costs a lock and a dict lookup per call: the per-request series of
        # each group are looked up once (and dropped again by `remove_group`).
        self._produce_series: dict[str, ProduceSeries] = {}
        self._fetch_series: dict[str, FetchSeries] = {}

    def produce_series(self, group: str) -> ProduceSeries:
        """(messages, bytes, latency) children of `group` for the produce path."""
        s = self._produce_series.get(group)
        if s is None:
            s = self._produce_series[group] = (self.produce_messages.labels(group),
                                               self.produce_bytes.labels(group),
                                               self.produce_latency.labels(group))
        return s

    def fetch_series(self, group: str) -> FetchSeries:
        """(messages, bytes) children of `group` for the fetch path."""
        s = self._fetch_series.get(group)
        if s is None:
            s = self._fetch_series[group] = (self.fetch_messages.labels(group),
                                             self.fetch_bytes.labels(group))
        return s

    def set_role(self, group: str, role: str) -> None:
        """Record a role by name ("follower", "candidate", "pre_candidate", "leader")."""
        value = ROLE_VALUES.get(role.lower())
        if value is None:
            raise ValueError(f"unknown Raft role {role!r}; known: {sorted(ROLE_VALUES)}")
        self.role.labels(group).set(value)

    def set_raft_state(self, group: str, *, role: str, term: int, commit: int, applied: int,
                       last: int, durable: int) -> None:
        """Update every per-group Raft gauge at once (called after each Raft step)."""
        self.set_role(group, role)
        self.term.labels(group).set(term)
        self.commit_index.labels(group).set(commit)
        self.applied_index.labels(group).set(applied)
        self.last_index.labels(group).set(last)
        self.durable_index.labels(group).set(durable)

    def remove_group(self, group: str) -> None:
        """Drop a group's series when its replica leaves this node, so stale gauges vanish."""
        self._produce_series.pop(group, None)
        self._fetch_series.pop(group, None)
        for metric in (self.role, self.term, self.commit_index, self.applied_index,
                       self.last_index, self.durable_index, self.fsync_seconds, self.elections,
                       self.leader_changes, self.produce_messages, self.produce_bytes,
                       self.produce_latency, self.fetch_messages, self.fetch_bytes,
                       self.fetch_filtered,
                       self.tx_ids, self.tx_fences, self.delayed_pending,
                       self.delayed_delivered):
            try:
                metric.remove(group)
            except KeyError:
                pass
        stale = [labels for labels in self._lag_labels() if labels[0] == group]
        for labels in stale:
            self.consumer_lag.remove(*labels)

    def _lag_labels(self) -> list[tuple[str, ...]]:
        return [
            (s.labels["group"], s.labels["cg"], s.labels["topic"], s.labels["queue"])
            for family in self.consumer_lag.collect()
            for s in family.samples
        ]

    def render(self) -> bytes:
        """The Prometheus text exposition of this node's registry."""
        return generate_latest(self.registry)


# ---------------------------------------------------------------------- HTTP endpoint

_MAX_REQUEST_HEAD = 8192
_REQUEST_TIMEOUT = 10.0


def _http_response(status: str, content_type: str, body: bytes, *, head: bool = False) -> bytes:
    lines = (
        f"HTTP/1.0 {status}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return lines.encode("ascii") + (b"" if head else body)


async def _read_request_head(stream: trio.abc.Stream) -> bytes | None:
    buf = bytearray()
    while b"\r\n\r\n" not in buf and b"\n\n" not in buf:
        if len(buf) > _MAX_REQUEST_HEAD:
            return None
        data = await stream.receive_some(4096)
        if not data:
            break
        buf += data
    return bytes(buf)


async def _answer_http(stream: trio.abc.Stream, metrics: NodeMetrics) -> None:
    async with stream:
        with trio.move_on_after(_REQUEST_TIMEOUT):
            try:
                head = await _read_request_head(stream)
                if head is None:
                    await stream.send_all(_http_response(
                        "431 Request Header Fields Too Large", "text/plain", b"too large\n"))
                    return
                parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
                method = parts[0] if parts else b""
                path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
                if method in (b"GET", b"HEAD") and path == b"/metrics":
                    reply = _http_response("200 OK", CONTENT_TYPE_LATEST, metrics.render(),
                                           head=method == b"HEAD")
                else:
                    reply = _http_response("404 Not Found", "text/plain; charset=utf-8",
                                           b"not found: try GET /metrics\n")
                await stream.send_all(reply)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


async def serve_metrics(
    listener_or_port: int | trio.SocketListener | list[trio.SocketListener],
    metrics: NodeMetrics,
    *,
    host: str = "127.0.0.1",
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer `GET /metrics` over HTTP/1.0 until cancelled; anything else gets 404.

    Give a port (0 picks a free one, on `host`) or listeners already opened. Started with
    `nursery.start`, it reports the listeners, so the caller can learn the bound port.
    """
    if isinstance(listener_or_port, int):
        listeners = await trio.open_tcp_listeners(listener_or_port, host=host)
    elif isinstance(listener_or_port, trio.SocketListener):
        listeners = [listener_or_port]
    else:
        listeners = list(listener_or_port)

    async def handler(stream: trio.SocketStream) -> None:
        await _answer_http(stream, metrics)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(listeners)
