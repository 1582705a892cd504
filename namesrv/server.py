"""The name server's network service: REGISTER, ROUTE and CLUSTER over the frame protocol.

REGISTER: see `namesrv.registry` for the header and body; with TLS only a caller holding
a certificate from the cluster CA that names the registering node (`transport.peerauth`)
may register, so no one else can redirect routes. ROUTE and CLUSTER are routing metadata any client needs, and hold no data; the answer may list `resend`
(groups whose topic table the node must send whole). ROUTE: (topic) -> (total, queues,
replicas, terms). CLUSTER: (topics: bool, default true) -> (nodes, groups: {gid: {leader,
leader_addr, term, replicas, topic_count, commit, applied, members}}); with topics the
body is msgpack {gid: [[queues, hosted, names], ...]}, every group's topics by shape.

All route logic lives in `namesrv.registry`; this module only adds the clock, the TCP
listener and a periodic sweep so expired nodes are logged and dropped even when nobody
asks for routes.
"""

from __future__ import annotations

import logging
import math
import signal
import ssl
from collections.abc import Callable
from typing import Any

import msgpack
import trio

from broker.protocol import DEFAULT_MAX_FRAME, Code, Frame, Op, RequestError, ok_header
from transport.framing import Caller, Response, request_id, serve_frames
from transport.peerauth import certificate_node, node_certificate_name

from .registry import DEFAULT_EXPIRY, Registry, parse_registration

__all__ = ["NameServer", "listener_address", "run_until_signalled"]

log = logging.getLogger(__name__)

# A registration carries whole topic tables in its body when a name server has none yet:
# 100,000 topics with names of 127 characters in each of three groups is about 40 MB.
NAMESRV_MAX_FRAME = max(DEFAULT_MAX_FRAME, 64 << 20)


class NameServer:
    """One independent name server: a registry plus the request handler in front of it."""

    def __init__(
        self,
        expiry: float = DEFAULT_EXPIRY,
        *,
        clock: Callable[[], float] = trio.current_time,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.registry = Registry(expiry)
        self.clock = clock
        self.ssl_context = ssl_context  # TLS on every connection when given

    async def handle(self, caller: Caller, frame: Frame) -> Response:
        """Answer one request; `RequestError` becomes an error response in `serve_frames`."""
        h = frame.header
        rid = request_id(frame)
        op = h.get("op")
        if not isinstance(op, int) or isinstance(op, bool):
            raise RequestError(Code.MALFORMED, f"request needs an integer op, got {op!r}")
        now = self.clock()
        if op == Op.REGISTER:
            if self.ssl_context is not None and caller.certificate is None:
                # only a node (a certificate from the cluster CA) may say where routes go
                raise RequestError(Code.FORBIDDEN, "REGISTER takes a node's certificate from "
                                   "the cluster CA (mutual TLS)")
            reg = parse_registration(h, frame.body)
            if self.ssl_context is not None and certificate_node(caller.certificate) != reg.node:
                # and only for itself: another node's (or a name server's) certificate
                # cannot move node `reg.node`'s routes
                raise RequestError(Code.FORBIDDEN, f"REGISTER as node {reg.node} takes that "
                                   f"node's certificate (subject CN "
                                   f"{node_certificate_name(reg.node)!r})")
            if not self.registry.is_live(reg.node, now):
                log.info("node %d registered from %s with %d groups", reg.node, reg.addr,
                         len(reg.groups))
            resend = self.registry.register(reg, now)
            if resend:
                log.info("node %d: topic tables of %s must be resent whole", reg.node, resend)
                return ok_header(rid, resend=resend), b""
            return ok_header(rid), b""
        if op == Op.ROUTE:
            topic = h.get("topic")
            if not isinstance(topic, str):
                raise RequestError(Code.MALFORMED, f"ROUTE needs a topic string, got {topic!r}")
            return ok_header(rid, **self.registry.route(topic, now)), b""
        if op == Op.CLUSTER:
            topics = h.get("topics", True)
            if not isinstance(topics, bool):
                raise RequestError(Code.MALFORMED, f"CLUSTER topics must be a bool, got {topics!r}")
            # the topic listing grows with the topics: it goes in the body, not the header
            shapes: dict[str, list[list[Any]]] = {}
            fields = self.registry.cluster(now, topics=False, shapes=shapes if topics else None)
            if not topics:
                return ok_header(rid, **fields), b""
            return ok_header(rid, **fields), msgpack.packb(shapes, use_bin_type=True)
        raise RequestError(
            Code.UNKNOWN_OP,
            f"unknown op {op}: a name server answers REGISTER ({int(Op.REGISTER)}), "
            f"ROUTE ({int(Op.ROUTE)}) and CLUSTER ({int(Op.CLUSTER)})",
        )

    async def _connection(self, stream: trio.SocketStream) -> None:
        await serve_frames(stream, self.handle, max_frame=NAMESRV_MAX_FRAME,
                           ssl_context=self.ssl_context)

    async def _sweep(self) -> None:
        period = max(0.05, self.registry.expiry / 4)
        while True:
            await trio.sleep(period)
            for node in self.registry.expire(self.clock()):
                log.info("node %d expired after %.0f s without a registration",
                         node, self.registry.expiry)

    async def serve(
        self,
        listeners: list[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept connections on `listeners` until cancelled; with `nursery.start`, returns
        once accepting. Open the listeners first (`trio.open_tcp_listeners`) so a busy port
        fails plainly, outside any nursery."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sweep)
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started()


def listener_address(listener: trio.SocketListener) -> str:
    """'host:port' a client can dial, with the real port when 0 was asked for."""
    sockname: Any = listener.socket.getsockname()
    return f"{sockname[0]}:{sockname[1]}"


async def run_until_signalled(
    host: str, port: int, expiry: float, on_ready: Callable[[str], None], *,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM, then return normally so the process exits with 0."""
    if not (expiry > 0 and math.isfinite(expiry)):
        raise ValueError(f"expiry must be a positive number of seconds, got {expiry}")
    server = NameServer(expiry, ssl_context=ssl_context)
    listeners = await trio.open_tcp_listeners(port, host=host)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, listeners)
            on_ready(listener_address(listeners[0]))
            async for signum in signals:
                log.info("stopping on %s", signal.Signals(signum).name)
                break
            nursery.cancel_scope.cancel()
