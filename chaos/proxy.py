"""Fault proxies: every byte between nodes, and between clients and nodes, passes one.

A `Proxy` listens on a loopback port and forwards each accepted connection to its target,
both directions, in one small trio nursery per connection. Faults live on a `Link`, the
state shared by every connection a proxy assigns to it:

* `block()` is a blackhole, like an iptables DROP: forwarded connections stop delivering
  and new ones are accepted but forward nothing. The proxy keeps reading and discarding,
  so endpoints see silence (no reset, no back-pressure) and must time out on their own.
* `unblock()` closes every connection that lived through the block (it lost bytes, so
  its framing is broken) and forwards normally again; endpoints notice the close and
  reconnect at once instead of waiting for a timeout.
* `delay` (seconds) and `jitter` (seconds either side of it) hold each forwarded chunk
  back; chunks are stamped with their due time as they arrive and sent when due, so a
  delayed link has latency without losing throughput, and never reorders (TCP does not).
* `loss` is a probability per chunk. A TCP stream cannot skip bytes, so a lost chunk is
  what TCP makes of packet loss: a retransmission stall (`RETRANSMIT`, Linux's minimum
  RTO), and one time in `RESET_EVERY` the connection is given up: the chunk is dropped
  and the connection closed, as after a reset.

`ProxyNet` owns the proxies of one cluster and says how to wire the node configs. Raft
runs one connection per node pair, dialled by the lower id to `peers[j]` of its own
config, so node i's table gets, for j > i, the address of the pair proxy {i, j}. A node
also hands out `peers` entries to clients (its own entry is what it registers with the
name server, others appear in NOT_LEADER hints and replica lists), so for j < i and for
itself the entry is node j's *client* proxy. A client may still be sent to a pair proxy
(node i hints at leader j > i); a pair proxy therefore looks at each connection's first
frame and treats only a `HELLO` as Raft traffic of the pair — anything else is client
traffic of its target and obeys that node's client link. A partition thus never cuts
clients, and cutting a node's clients never cuts its peers.

Nodes listen on their own ports (`listen`), which only the proxies, the harness and
metrics scrapers dial directly. The name server is not proxied.
"""

from __future__ import annotations

import logging
import random
import struct
from collections.abc import Iterable, Mapping
from itertools import combinations
from typing import Any

import msgpack
import trio

from raftmq.localcluster import free_ports
from wire.protocol import Op, parse_address

from .topology import Pair

__all__ = ["Link", "Proxy", "ProxyNet"]

log = logging.getLogger("raftmq.chaos.proxy")

_CHUNK = 64 << 10
_CONNECT_TIMEOUT = 5.0
_FRAME_PREFIX = struct.Struct(">II")
_MAX_SNIFF = 64 << 10  # a first frame header longer than this is nobody's HELLO
RETRANSMIT = 0.2  # seconds a lost chunk is held back: Linux's minimum retransmission timeout
RESET_EVERY = 8  # one lost chunk in this many ends its connection
_QUEUED_CHUNKS = 256  # chunks in flight per direction of a connection on a delayed link


class _Conn:
    """One accepted connection: its cancel scope, and whether it lived through a block."""

    __slots__ = ("scope", "tainted")

    def __init__(self, tainted: bool) -> None:
        self.scope = trio.CancelScope()
        self.tainted = tainted

    def close(self) -> None:
        self.scope.cancel()


class Link:
    """Fault state shared by connections: blocked or not, delay, jitter and loss.

    Only call it from the trio thread that runs the proxies.
    """

    def __init__(self, name: str, *, rng: random.Random | None = None) -> None:
        self.name = name
        self.delay = 0.0
        self.jitter = 0.0
        self.loss = 0.0
        self.rng = rng if rng is not None else random.Random()
        self._blocked = False
        self._conns: set[_Conn] = set()
        self.dropped_bytes = 0  # bytes discarded by blackholes and resets, for tests and reports
        self.lost_chunks = 0  # chunks `loss` hit (stalled or reset)
        self.resets = 0  # connections `loss` ended

    @property
    def shaped(self) -> bool:
        """Whether chunks are held back or may be lost (delay, jitter or loss set)."""
        return self.delay > 0 or self.jitter > 0 or self.loss > 0

    def hold_for(self) -> float:
        """Seconds the next chunk waits: delay ± jitter, plus a stall when it is lost;
        -1 when it is lost for good (the connection must end)."""
        wait = max(0.0, self.delay + self.rng.uniform(-self.jitter, self.jitter))
        if self.loss > 0 and self.rng.random() < self.loss:
            self.lost_chunks += 1
            if self.rng.randrange(RESET_EVERY) == 0:
                self.resets += 1
                return -1.0
            wait += RETRANSMIT
        return wait

    @property
    def blocked(self) -> bool:
        return self._blocked

    @property
    def connections(self) -> int:
        return len(self._conns)

    def block(self) -> None:
        """Blackhole every connection of the link, present and future."""
        self._blocked = True
        for conn in self._conns:
            conn.tainted = True

    def unblock(self) -> None:
        """Forward again; connections that lived through the block are closed."""
        self._blocked = False
        for conn in list(self._conns):
            if conn.tainted:
                conn.close()

    def _add(self, conn: _Conn) -> None:
        self._conns.add(conn)

    def _discard(self, conn: _Conn) -> None:
        self._conns.discard(conn)

    def __repr__(self) -> str:
        state = "blocked" if self._blocked else "open"
        return f"Link({self.name!r}, {state}, {len(self._conns)} conns)"


def _opens_with_hello(data: bytes) -> bool | None:
    """Whether `data` starts with a HELLO frame; None while too few bytes have arrived."""
    if len(data) < _FRAME_PREFIX.size:
        return None
    frame_len, header_len = _FRAME_PREFIX.unpack_from(data)
    if header_len > _MAX_SNIFF or header_len + 4 > frame_len:
        return False
    end = _FRAME_PREFIX.size + header_len
    if len(data) < end:
        return None
    try:
        header = msgpack.unpackb(data[_FRAME_PREFIX.size : end], raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several unrelated types; not a HELLO either way
        return False
    return isinstance(header, dict) and header.get("op") == Op.HELLO


class Proxy:
    """Forwards connections from `host:port` (0: any free port) to `target`.

    Connections obey `link` (a fresh one by default). With `clients` set, the proxy
    carries one node pair's Raft traffic: connections whose first frame is not a HELLO
    are client traffic and obey `clients` instead.
    """

    def __init__(
        self,
        target: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str | None = None,
        link: Link | None = None,
        clients: Link | None = None,
    ) -> None:
        self.target = target
        self.name = name or f"proxy->{target}"
        self.link = link or Link(self.name)
        self.clients = clients
        self._host = host
        self._port = port
        self.accepted = 0

    @property
    def address(self) -> str:
        """`host:port` clients dial; the real port once `serve` has bound (port 0)."""
        return f"{self._host}:{self._port}"

    def block(self) -> None:
        self.link.block()

    def unblock(self) -> None:
        self.link.unblock()

    @property
    def blocked(self) -> bool:
        return self.link.blocked

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind, report the address through `task_status`, then forward until cancelled."""
        listeners = await trio.open_tcp_listeners(self._port, host=self._host)
        self._port = listeners[0].socket.getsockname()[1]
        task_status.started(self.address)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, down: trio.SocketStream) -> None:
        self.accepted += 1
        try:
            link, first = self.link, b""
            if self.clients is not None:
                sniffed = await self._sniff(down)
                if sniffed is None:
                    return
                is_hello, first = sniffed
                link = self.link if is_hello else self.clients
            conn = _Conn(tainted=link.blocked)
            link._add(conn)
            try:
                with conn.scope:
                    await self._forward(down, link, conn, first)
            finally:
                link._discard(conn)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # an endpoint went away; the other one sees the close below
        finally:
            with trio.CancelScope(shield=True):
                await down.aclose()

    async def _sniff(self, down: trio.SocketStream) -> tuple[bool, bytes] | None:
        """Read until the first frame's header is in; (is HELLO, bytes read), None on EOF."""
        data = b""
        while (verdict := _opens_with_hello(data)) is None:
            chunk = await down.receive_some(_CHUNK)
            if not chunk:
                return None
            data += chunk
        return verdict, data

    async def _forward(self, down: trio.SocketStream, link: Link, conn: _Conn, first: bytes) -> None:
        if conn.tainted:  # accepted during a block: swallow everything until unblock
            await self._pump(down, None, link, conn, b"")
            return
        host, port = parse_address(self.target)
        up: trio.SocketStream | None = None
        with trio.move_on_after(_CONNECT_TIMEOUT):
            up = await trio.open_tcp_stream(host, port)
        if up is None:
            return  # the target does not answer: the caller sees its connection close
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, down, up, link, conn, first)
                nursery.start_soon(self._pump, up, down, link, conn, b"")
        finally:
            with trio.CancelScope(shield=True):
                await up.aclose()

    async def _pump(
        self,
        src: trio.SocketStream,
        dst: trio.SocketStream | None,
        link: Link,
        conn: _Conn,
        pending: bytes,
    ) -> None:
        """Copy src to dst chunk by chunk, dropping chunks once `conn` is tainted.

        Either side closing (or failing) ends the whole connection: our protocols never
        half-close, and a peer that sees its stream end reconnects. On a shaped link a
        second task sends each chunk when it is due."""
        try:
            if pending and dst is not None and not conn.tainted:
                await dst.send_all(pending)
            if dst is None:
                while data := await src.receive_some(_CHUNK):
                    link.dropped_bytes += len(data)
            else:
                send, receive = trio.open_memory_channel[tuple[float, bytes]](_QUEUED_CHUNKS)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._deliver, receive, dst, link, conn)
                    nursery.start_soon(self._receive, src, send, link, conn)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        conn.close()

    @staticmethod
    async def _receive(
        src: trio.SocketStream,
        send: trio.MemorySendChannel[tuple[float, bytes]],
        link: Link,
        conn: _Conn,
    ) -> None:
        """Queue each chunk from `src` with its due time (0: at once); see `Link`."""
        try:
            async with send:
                due = 0.0
                while data := await src.receive_some(_CHUNK):
                    if conn.tainted:
                        link.dropped_bytes += len(data)
                        continue
                    if not link.shaped:
                        await send.send((0.0, data))
                        continue
                    wait = link.hold_for()
                    if wait < 0:  # lost for good: the stream is broken
                        link.dropped_bytes += len(data)
                        break
                    due = max(due, trio.current_time() + wait)  # never reorders
                    await send.send((due, data))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            conn.close()

    @staticmethod
    async def _deliver(
        receive: trio.MemoryReceiveChannel[tuple[float, bytes]],
        dst: trio.SocketStream,
        link: Link,
        conn: _Conn,
    ) -> None:
        """Send each queued chunk at its due time (trio's clock); tainted ones are dropped."""
        try:
            async with receive:
                async for due, data in receive:
                    if due:
                        await trio.sleep_until(due)
                    if conn.tainted:
                        link.dropped_bytes += len(data)
                        continue
                    await dst.send_all(data)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            conn.close()


class ProxyNet:
    """The proxies of one cluster: one per node pair for Raft, one per node for clients.

    Ports (the nodes' own listen ports included) are chosen free at construction, so the
    node configs can be written before `serve` binds them. Use:

        net = ProxyNet([1, 2, 3])
        await nursery.start(net.serve)
        cluster = LocalCluster(dir, nodes=3, node_overrides=net.node_overrides())

    Fault methods (`set_partition`, `cut_clients`, `set_delay`, `shape`, `heal`) must be called
    from the trio thread that runs `serve`.
    """

    def __init__(self, node_ids: Iterable[int], *, host: str = "127.0.0.1") -> None:
        self.node_ids = sorted(set(node_ids))
        if len(self.node_ids) < 1:
            raise ValueError("a ProxyNet needs at least one node")
        pairs = list(combinations(self.node_ids, 2))
        ports = iter(free_ports(2 * len(self.node_ids) + len(pairs), host))
        self.host = host
        self._listen = {i: f"{host}:{next(ports)}" for i in self.node_ids}
        self._clients = {
            i: Proxy(self._listen[i], host=host, port=next(ports), name=f"clients->{i}")
            for i in self.node_ids
        }
        self._pairs = {
            frozenset((i, j)): Proxy(
                self._listen[j], host=host, port=next(ports), name=f"raft {i}->{j}",
                clients=self._clients[j].link,
            )
            for i, j in pairs
        }

    # ------------------------------------------------------------ addresses and wiring

    def listen_addr(self, i: int) -> str:
        """Where node i itself listens (not proxied)."""
        return self._listen[i]

    def client(self, i: int) -> Proxy:
        """The proxy clients use to reach node i."""
        return self._clients[i]

    def pair(self, i: int, j: int) -> Proxy:
        """The proxy carrying Raft traffic between i and j (dialled by the lower id)."""
        return self._pairs[frozenset((i, j))]

    def proxies(self) -> list[Proxy]:
        return [*self._clients.values(), *self._pairs.values()]

    def peers_table(self, i: int) -> dict[int, str]:
        """Node i's `peers`: pair proxies towards higher ids, client proxies otherwise."""
        return {
            j: self.pair(i, j).address if j > i else self._clients[j].address
            for j in self.node_ids
        }

    def node_overrides(
        self, overrides: Mapping[str | int, Any] | None = None
    ) -> dict[str | int, Any]:
        """`LocalCluster(node_overrides=...)` wiring every node through the proxies.

        `overrides` are merged in (common keys kept, per-node dicts extended); `listen`
        and `peers` of every node are set here and win over any given ones.
        """
        out: dict[str | int, Any] = {k: v for k, v in (overrides or {}).items()}
        for i in self.node_ids:
            mine = dict(out.get(i) or {})
            mine.update(listen=self._listen[i], peers=self.peers_table(i))
            out[i] = mine
        return out

    # ------------------------------------------------------------ service

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind every proxy, report readiness, then forward until cancelled."""
        async with trio.open_nursery() as nursery:
            for proxy in self.proxies():
                await nursery.start(proxy.serve)
            task_status.started()

    # ------------------------------------------------------------ faults

    def set_partition(self, blocked: Iterable[Pair]) -> None:
        """Block exactly the pairs in `blocked` (Raft links); every other pair forwards."""
        want = {frozenset(p) for p in blocked}
        unknown = [sorted(p) for p in want if p not in self._pairs]
        if unknown:
            raise ValueError(f"no such node pair(s) {unknown} among nodes {self.node_ids}")
        for pair, proxy in self._pairs.items():
            if pair in want:
                proxy.block()
            elif proxy.blocked:
                proxy.unblock()

    def blocked_pairs(self) -> set[Pair]:
        return {pair for pair, proxy in self._pairs.items() if proxy.blocked}

    def cut_clients(self, nodes: Iterable[int]) -> None:
        """Blackhole client traffic to exactly `nodes`; other nodes' clients forward."""
        cut = set(nodes)
        for i, proxy in self._clients.items():
            if i in cut:
                proxy.block()
            elif proxy.blocked:
                proxy.unblock()

    def set_delay(self, seconds: float, pairs: Iterable[Pair] | None = None) -> None:
        """Delay every chunk on the given Raft links (all of them when None)."""
        chosen = None if pairs is None else {frozenset(p) for p in pairs}
        for pair, proxy in self._pairs.items():
            if chosen is None or pair in chosen:
                proxy.link.delay = seconds

    def shape(
        self,
        *,
        delay: float = 0.0,
        jitter: float = 0.0,
        loss: float = 0.0,
        pairs: Iterable[Pair] | None = None,
        clients: Iterable[int] | None = None,
        rng: random.Random | None = None,
    ) -> list[str]:
        """Give the chosen links `delay` ± `jitter` seconds per chunk and `loss` (see
        `Link`); every other link is left as it is. `pairs` are Raft links (None: all),
        `clients` the nodes whose client links are shaped (None: all). With `rng`, each
        shaped link draws from its own generator seeded from it, so a seed replays the
        same draws per link. Returns the names of the links shaped."""
        if delay < 0 or jitter < 0 or not 0.0 <= loss < 1.0:
            raise ValueError(f"delay and jitter must not be negative and loss is in [0, 1) "
                             f"(got {delay}, {jitter}, {loss})")
        chosen = self._pairs.keys() if pairs is None else {frozenset(p) for p in pairs}
        unknown = [sorted(p) for p in chosen if p not in self._pairs]
        if unknown:
            raise ValueError(f"no such node pair(s) {unknown} among nodes {self.node_ids}")
        nodes = self.node_ids if clients is None else sorted(set(clients))
        links = [self._pairs[p].link for p in sorted(chosen, key=sorted)]
        links += [self._clients[i].link for i in nodes]
        for link in links:
            link.delay, link.jitter, link.loss = delay, jitter, loss
            if rng is not None:
                link.rng = random.Random(rng.getrandbits(64))
        return [link.name for link in links]

    def heal(self) -> None:
        """Every link forwards again without delay or loss."""
        for proxy in self.proxies():
            proxy.link.delay = proxy.link.jitter = proxy.link.loss = 0.0
            if proxy.blocked:
                proxy.unblock()
