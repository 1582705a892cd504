"""Test support for modules that run one cluster of real node processes.

`LiveCluster` wraps a running `LocalCluster` with one topic whose queue q lives in group
g{q}: it finds leaders, retries requests while leadership moves, produces batches and
remembers what was acknowledged (queue -> offset -> record bytes), and reads queues
back. `Raw` is a plain socket speaking frames, for bytes no well-behaved client would send.

Below them, helpers for tests that drive a cluster through the SDK: leaders (balanced,
new after a kill), a `SendLog` of what a producer sent, `produce_until` a stop, `drain`
of every queue and `check_log` of what was drained.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio

from raftmq.client import Message, Producer, PullConsumer, SendFuture, SendResult
from raftmq.localcluster import LocalCluster, free_port_base
from transport.blocking import request
from transport.connection import DEFAULT_TIMEOUT, ConnectionPool
from wire.protocol import Frame, FrameDecoder, Op, RequestError, encode_frame
from wire.records import OutgoingMessage, encode_batch, iter_records, walk_batch

__all__ = [
    "free_port_base",
    "DRAIN_TIMEOUT",
    "REBALANCE_TIMEOUT",
    "LiveCluster",
    "Raw",
    "SendLog",
    "assert_no_unexpected_exits",
    "check_log",
    "drain",
    "leader_of",
    "preferred",
    "produce_until",
    "running",
    "scrape_metrics",
    "wait_balanced",
    "wait_new_leader",
]

REBALANCE_TIMEOUT = 60.0
DRAIN_TIMEOUT = 90.0


class LiveCluster:
    """The running cluster and what it acknowledged: queue -> offset -> record bytes."""

    def __init__(self, cluster: LocalCluster, topic: str, queues: int) -> None:
        self.cluster = cluster
        self.topic = topic
        self.queues = queues
        self.acked: dict[int, dict[int, bytes]] = {q: {} for q in range(queues)}

    def addr(self, node: int) -> str:
        return self.cluster.node_addr(node)

    def leader(self, gid: str, timeout: float = 15.0) -> int:
        """The node that currently leads `gid` (the one with the highest term saying so)."""
        deadline = time.monotonic() + timeout
        while True:
            best: tuple[int, int] | None = None
            for node in self.cluster.node_ids:
                try:
                    h, _ = request(self.addr(node), {"op": int(Op.STATUS)}, timeout=2.0)
                except (OSError, RequestError):
                    continue
                st = h["groups"].get(gid)
                if st and st["role"] == "leader" and (best is None or st["term"] > best[0]):
                    best = (st["term"], node)
            if best is not None:
                return best[1]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no leader for {gid}")
            time.sleep(0.05)

    def settle(self, timeout: float = 60.0) -> None:
        """Wait for each group's preferred leader to take over, so requests do not meet a
        leadership hand-over; TimeoutError if that does not happen in `timeout`."""
        self.cluster.wait_preferred_leaders(timeout)

    def call_leader(
        self, gid: str, header: dict[str, Any], body: bytes = b"", timeout: float = 20.0
    ) -> tuple[dict[str, Any], bytes]:
        """Send to `gid`'s leader, retrying while leadership moves."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return request(self.addr(self.leader(gid)), header, body, timeout=5.0)
            except RequestError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def create_topic(self) -> None:
        """Create the topic, queue q hosted by group g{q}."""
        for q in range(self.queues):
            self.call_leader(f"g{q}", {"op": int(Op.CREATE_TOPIC), "g": f"g{q}",
                                       "topic": self.topic, "queues": self.queues,
                                       "hosted": [q]})

    def produce_batch(self, queue: int, messages: list[OutgoingMessage], *, pid: int,
                      seq: int, born_ms: int) -> dict[str, Any]:
        """Produce one batch to `queue` and remember its records as acked."""
        batch = encode_batch(self.topic, queue, messages, pid=pid, seq=seq, born_ms=born_ms)
        h, _ = self.call_leader(f"g{queue}", {"op": int(Op.PRODUCE), "g": f"g{queue}"}, batch)
        _, refs = walk_batch(batch)
        for i, ref in enumerate(refs):
            self.acked[queue][h["base"] + i] = batch[ref.start : ref.start + ref.size]
        return h

    def fetch(self, queue: int, offset: int = 0, count: int | None = None, *,
              topic: str | None = None) -> dict[int, bytes]:
        """Records from `offset` on, `count` of them (fewer at the end of the queue; all
        up to the end when None): offset -> record bytes."""
        out: dict[int, bytes] = {}
        while count is None or len(out) < count:
            h, body = self.call_leader(f"g{queue}", {
                "op": int(Op.FETCH), "topic": topic or self.topic, "queue": queue,
                "offset": offset, "max": 1024 if count is None else count - len(out),
                "max_bytes": 8 << 20, "wait_ms": 0})
            spans = list(iter_records(body))
            assert len(spans) == len(h["msgs"])
            for (start, size), meta in zip(spans, h["msgs"], strict=True):
                out[meta[0]] = body[start : start + size]
            if h["next"] >= h["end"]:
                break
            offset = h["next"]
        return out

    def assert_nodes_healthy(self) -> None:
        """No node process died, each still answers, and none logged an error."""
        assert self.cluster.unexpected_exits() == {}
        for node in self.cluster.node_ids:
            h, _ = request(self.addr(node), {"op": int(Op.STATUS)})
            assert h["node"] == node
            log = self.cluster.log_path(f"n{node}").read_text(errors="replace")
            bad = [line for line in log.splitlines()
                   if '"level":"ERROR"' in line or '"level":"CRITICAL"' in line
                   or "Traceback" in line]
            assert not bad, f"n{node} logged errors:\n" + "\n".join(bad[:5])


L = TypeVar("L", bound=LiveCluster)


@contextmanager
def running(base: Path, make: Callable[[LocalCluster], L], **options: Any) -> Iterator[L]:
    """A cluster under `base`, ready, its preferred leaders settled and its topic created;
    `options` holds more `LocalCluster` arguments (`env`, `node_overrides`)."""
    with LocalCluster(base, tick_ms=50, **options) as cluster:
        cluster.wait_ready(timeout=30)
        live = make(cluster)
        live.settle()
        live.create_topic()
        yield live


class Raw:
    """A plain socket speaking frames (or not)."""

    def __init__(self, addr: str, timeout: float = 5.0) -> None:
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.dec = FrameDecoder(1 << 30)
        self.reset = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next(self) -> Frame | None:
        """The next frame, None once the peer closed; raises TimeoutError if it hangs."""
        while (f := self.dec.next_frame()) is None:
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                self.reset = True
                return None
            if not data:
                assert self.dec.buffered == 0, "connection closed inside a response frame"
                return None
            self.dec.feed(data)
        return f

    def ask(self, header: dict[str, Any], body: bytes = b"") -> Frame | None:
        """Send one frame and read the next; None if the peer closed instead."""
        self.send(encode_frame(header, body))
        return self.next()

    def answer(self, header: dict[str, Any], body: bytes = b"") -> dict[str, Any]:
        """The header of the answer to one frame; the peer must not close instead."""
        f = self.ask(header, body)
        assert f is not None, "connection closed instead of answering"
        return f.header

    def close(self) -> None:
        self.sock.close()


# ------------------------------------------------------------------ SDK-driven helpers


def preferred(cluster: LocalCluster) -> dict[str, int | None]:
    return {g.id: g.preferred_leader for g in cluster.groups}


def _balanced(cluster: LocalCluster, leaders: dict[str, int | None]) -> bool:
    """Every group is led by its preferred leader, so each node leads exactly one group."""
    counts = Counter(leaders.values())
    return leaders == preferred(cluster) and all(counts[n] == 1 for n in cluster.node_ids)


def wait_balanced(cluster: LocalCluster, timeout: float = REBALANCE_TIMEOUT) -> float:
    """Wait until every group is led by its preferred leader (one group per node);
    seconds it took."""
    try:
        took = cluster.wait_preferred_leaders(timeout)
    except TimeoutError as exc:
        raise AssertionError(f"leaders not balanced: {exc}") from None
    leaders = cluster.leaders(timeout=2.0)
    assert _balanced(cluster, leaders), leaders
    return took


def wait_new_leader(cluster: LocalCluster, group: str, old: int, timeout: float) -> int:
    """Poll the name server until `group` names a running leader other than `old`."""
    deadline = time.monotonic() + timeout
    last: int | None = old
    while True:
        try:
            last = cluster.leaders(timeout=2.0)[group]
        except (OSError, RequestError):
            pass
        else:
            if last is not None and last != old and cluster.is_running(last):
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{group}: no new leader after {timeout} s (last: {last})")
        time.sleep(0.02)


def leader_of(cluster: LocalCluster, group: str) -> int:
    leader = cluster.leaders()[group]
    assert leader is not None, f"{group} has no leader"
    return leader


def assert_no_unexpected_exits(cluster: LocalCluster) -> None:
    gone = cluster.unexpected_exits()
    assert not gone, "processes exited unexpectedly: " + ", ".join(
        f"{name} (code {code}):\n{cluster.log_tail(name)}" for name, code in gone.items()
    )


# ------------------------------------------------------------------ client helpers


async def drain(
    namesrv: str, topic: str, group: str, timeout: float = DRAIN_TIMEOUT
) -> dict[int, list[Message]]:
    """Every retained message of every queue of `topic`, read from offset 0 by a fresh
    consumer group: queue -> messages in offset order."""
    out: dict[int, list[Message]] = {}
    with anyio.fail_after(timeout):
        async with PullConsumer(namesrv, group, start_from="first", wait_ms=0) as c:
            total = (await c.routes.route(topic, refresh=True)).total
            for q in range(total):
                lo, end = await _retrying(partial(c.bounds, topic, q))
                assert lo == 0, f"queue {q} lost its head: earliest offset {lo}"
                msgs: list[Message] = []
                offset = 0
                while offset < end:
                    res = await _retrying(
                        partial(c.pull, topic, q, offset, max=256, wait_ms=0)
                    )
                    msgs += res.messages
                    offset = res.next_offset
                out[q] = msgs
    return out


async def poll_for(consumer: PullConsumer, n: int, timeout: float = DRAIN_TIMEOUT
                   ) -> list[Message]:
    """Poll until `n` messages came (or `timeout` passed): one poll can come back short
    or empty on a busy machine while the rest is there to read."""
    got: list[Message] = []
    with anyio.move_on_after(timeout):
        while len(got) < n:
            got += await consumer.poll(timeout=1.0, max_messages=max(n - len(got), 1))
    return got


async def _retrying(fn: Callable[[], Any], attempts: int = 20) -> Any:
    for attempt in range(attempts):
        try:
            return await fn()
        except RequestError as exc:
            if not exc.retriable or attempt == attempts - 1:
                raise
            await anyio.sleep(0.25)
    raise AssertionError("unreachable")


def check_log(queues: dict[int, list[Message]]) -> None:
    """Each queue is contiguous from offset 0 and its message ids are distinct."""
    for q, msgs in queues.items():
        assert [m.offset for m in msgs] == list(range(len(msgs))), f"queue {q} has gaps"
    ids = [m.msg_id for msgs in queues.values() for m in msgs]
    assert len(ids) == len(set(ids)), "a message id is served twice"


@dataclass
class SendLog:
    """What one producer sent: acknowledged results and failures, by body."""

    name: str
    acked: dict[str, SendResult] = field(default_factory=dict)
    ack_time: dict[str, float] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # body -> sequence of the send
    failed: dict[str, str] = field(default_factory=dict)
    dedup_answers: int = 0  # acks the state machine gave to a recognised resend

    def record(self, body: str, fut: SendFuture[SendResult]) -> None:
        exc = fut.exception()
        if exc is None:
            res = fut.result()
            self.acked[body] = res
            self.ack_time[body] = time.monotonic()
            self.dedup_answers += res.dup
        else:
            self.failed[body] = repr(exc)


async def produce_until(
    producer: Producer,
    topic: str,
    log: SendLog,
    stop: anyio.Event,
    *,
    interval: float = 0.004,
    window: int = 64,
) -> None:
    """Send `<name>-<i>` bodies every `interval` s with at most `window` unacknowledged,
    until `stop` is set; then wait for the outstanding ones."""
    slots = anyio.Semaphore(window)
    i = 0
    while not stop.is_set():
        await slots.acquire()
        body = f"{log.name}-{i}"
        log.order[body] = i
        i += 1

        def done(fut: SendFuture[SendResult], body: str = body) -> None:
            log.record(body, fut)
            slots.release()

        try:
            await producer.send_async(topic, body, callback=done)
        except RequestError as exc:  # the route could not be learned: nothing was sent
            log.failed[body] = repr(exc)
            slots.release()
        await anyio.sleep(interval)
    await producer.flush()


def scrape_metrics(addr: str) -> dict[str, float]:
    """A node's Prometheus endpoint at `addr` as {sample name with labels: value}."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


class CrashAskingPool(ConnectionPool):
    """A real connection pool whose PRODUCE requests ask for the `crash-before-answer`
    test mutation (`test_exit`): a node started with it exits right after committing the
    batch, before answering, so the client must retry a batch that is already stored.
    Nodes without the mutation ignore the request."""

    async def request(
        self, addr: str, op: Op | int, header: Mapping[str, Any] | None = None,
        body: bytes | bytearray | memoryview = b"", *, timeout: float = DEFAULT_TIMEOUT,
    ) -> Frame:
        if op == Op.PRODUCE:
            header = {**(header or {}), "test_exit": True}
        return await super().request(addr, op, header, body, timeout=timeout)
