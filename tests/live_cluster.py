"""Test support for modules that run one cluster of real node processes.

`LiveCluster` wraps a running `LocalCluster` with one topic whose queue q lives in group
g{q}: it finds leaders, retries requests while leadership moves, produces batches and
remembers what was acknowledged (queue -> offset -> record bytes), and reads queues
back. `Raw` is a plain socket speaking frames, for bytes no well-behaved client would send.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from broker.protocol import Frame, FrameDecoder, Op, RequestError, encode_frame
from broker.records import OutgoingMessage, encode_batch, iter_records, walk_batch
from chaos.cluster import LocalCluster
from transport.blocking import request

__all__ = ["LiveCluster", "Raw", "running"]


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

    def settle(self, timeout: float = 10.0) -> None:
        """Wait (a while) for each group's preferred leader to take over, so fewer
        requests meet a leadership hand-over."""
        deadline = time.monotonic() + timeout
        for g in self.cluster.groups:
            while (g.preferred_leader is not None and self.leader(g.id) != g.preferred_leader
                   and time.monotonic() < deadline):
                time.sleep(0.05)

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
def running(base: Path, make: Callable[[LocalCluster], L]) -> Iterator[L]:
    """A cluster under `base`, ready, its preferred leaders settled and its topic created."""
    with LocalCluster(base, tick_ms=50) as cluster:
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
