"""The name server's network service: REGISTER, ROUTE and CLUSTER over the frame protocol.

REGISTER: see `namesrv.registry` for the header and body; with TLS only a caller holding
a certificate from the cluster CA that names the registering node (`transport.peerauth`)
may register, so no one else can redirect routes. ROUTE and CLUSTER are routing metadata
any client needs, and hold no data; when the nodes have logins on, they need one here too:
AUTH runs the same SCRAM-SHA-256 exchange as a node (`broker.doors.security`), checked against
the users the nodes register (their verifiers, never passwords, from the freshest live
registration: a user added or removed counts here once a node registers it, at once after
the change or at the next registration), and unknown users get the same made-up salt as
from the nodes. A connection whose certificate names a node needs no login. Without any
registration that has logins on, AUTH is UNKNOWN_OP, as it always was, and lookups are
open: there is nothing to look up yet either. The requests and answers are the types of
`wire.requests.namesrv`, decoded here at the trust boundary: a REGISTER answer may list
`resend` (groups whose topic table the node must send whole); ROUTE answers (total,
queues, replicas, terms); CLUSTER (nodes, groups) and, with `topics`, every group's
topics by shape in the body.

All route logic lives in `namesrv.registry`; this module only adds the clock, the TCP
listener and a periodic sweep so expired nodes are logged and dropped even when nobody
asks for routes.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import math
import signal
import ssl
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import trio

from transport.budget import Budget, BytePool
from transport.framing import Caller, FrameStream, Response, caller_of, request_id, serve_frames
from transport.peerauth import certificate_node, node_certificate_name
from transport.scram import MECHANISM, LoginFailed, ServerLogins
from transport.tls import TLS_HANDSHAKE_TIMEOUT, PlaintextRefused, accept_tls
from wire.protocol import (
    DEFAULT_MAX_FRAME,
    Code,
    Frame,
    Op,
    RequestError,
    error_header,
    ok_header,
)
from wire.requests.namesrv import (
    ClusterAnswer,
    ClusterRequest,
    RegisterAnswer,
    RegisterRequest,
    RouteRequest,
)

from .registry import DEFAULT_EXPIRY, Registry, registration

__all__ = ["NameServer", "listener_address", "run_until_signalled"]

log = logging.getLogger(__name__)

# A registration carries whole topic tables in its body when a name server has none yet:
# 100,000 topics with names of 127 characters in each of three groups is about 40 MB.
NAMESRV_MAX_FRAME = max(DEFAULT_MAX_FRAME, 64 << 20)
#: Every other request (ROUTE, CLUSTER) is a small header; so is a REGISTER without TLS
#: from a caller without a node's certificate, when TLS is on.
NAMESRV_SMALL_FRAME = 64 << 10
#: The name server's connection budget (`transport.budget`): nodes register every 30 s
#: and clients refresh routes every 30 s, so a connection idle for 10 minutes is gone;
#: a frame, even a whole registration, arrives well within a minute on any working link.
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_FRAME_TIMEOUT = 60.0
DEFAULT_IDLE_TIMEOUT = 600.0
#: Large frames (full registrations) read at once over all connections: one full-size
#: registration at a time, the others wait their turn (the steady registrations that
#: follow are small and never wait).
DEFAULT_MAX_BUFFERED = NAMESRV_MAX_FRAME
_FAKE_ITERATIONS = 4096  # what a node gives an unknown user too (`broker.doors.security`)


def request_id_of(h: Mapping[str, Any]) -> int:
    rid = h.get("id", 0)
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else 0


class NameServer:
    """One independent name server: a registry plus the request handler in front of it."""

    def __init__(
        self,
        expiry: float = DEFAULT_EXPIRY,
        *,
        clock: Callable[[], float] = trio.current_time,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        frame_timeout: float = DEFAULT_FRAME_TIMEOUT,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be positive, got {max_connections}")
        if max_buffered < 1:
            raise ValueError(f"max_buffered must be positive, got {max_buffered}")
        self.registry = Registry(expiry)
        self.clock = clock
        self.ssl_context = ssl_context  # TLS on every connection when given
        self.max_connections = max_connections
        self.budget = Budget(frame_timeout=frame_timeout, idle_timeout=idle_timeout)
        # the large frames being read or handled, all connections together
        self.large_frames = BytePool(max_buffered)
        self.connections = 0  # served now, TLS handshakes included
        self.refused = 0  # turned away over max_connections: none was idle to close
        self.evicted = 0  # idle connections closed to make room for a new one
        # served connections, least recently active first, and the ones handling a request
        self._open: OrderedDict[int, trio.CancelScope] = OrderedDict()
        self._busy: set[int] = set()
        self._keys = itertools.count()
        self._logins = ServerLogins()

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
            request = RegisterRequest.decode(h)
            reg = registration(request, request.decode_body(frame.body))
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
            return ok_header(rid, **RegisterAnswer(resend=tuple(resend)).header()), b""
        if op == Op.AUTH:
            return await self._auth(caller, h, now)
        if op in (Op.ROUTE, Op.CLUSTER):
            self._check_login(caller, now)
        if op == Op.ROUTE:
            route = RouteRequest.decode(h)
            return ok_header(rid, **self.registry.route(route.topic, now).header()), b""
        if op == Op.CLUSTER:
            topics = ClusterRequest.decode(h).topics
            # the topic listing grows with the topics: it goes in the body, not the header
            shapes: dict[str, list[list[Any]]] = {}
            fields = self.registry.cluster(now, topics=False, shapes=shapes if topics else None)
            answer = ClusterAnswer(nodes=fields["nodes"], groups=fields["groups"]).header()
            if not topics:
                return ok_header(rid, **answer), b""
            return ok_header(rid, **answer), ClusterAnswer.encode_body(shapes)
        raise RequestError(
            Code.UNKNOWN_OP,
            f"unknown op {op}: a name server answers REGISTER ({int(Op.REGISTER)}), "
            f"ROUTE ({int(Op.ROUTE)}) and CLUSTER ({int(Op.CLUSTER)})",
        )

    # ------------------------------------------------------------------ logins

    def _check_login(self, caller: Caller, now: float) -> None:
        """Raise UNAUTHENTICATED unless lookups are open (no node has logins on), the
        caller is a node (its certificate names one), or it logged in as a user the
        freshest registration still has."""
        auth = self.registry.auth(now)
        if auth is None or certificate_node(caller.certificate) is not None:
            return
        user = caller.principal
        if user is None:
            raise RequestError(Code.UNAUTHENTICATED, "authenticate first: this cluster "
                               f"answers lookups of {MECHANISM}-authenticated users only (AUTH)")
        if user not in auth.users:
            caller.principal = None
            if auth.over:
                raise RequestError(Code.UNAUTHENTICATED, f"user {user!r} is not among the "
                                   "users the nodes register here (they have more than a "
                                   "registration carries): ask the nodes directly")
            raise RequestError(Code.UNAUTHENTICATED, f"user {user!r} was removed after this "
                               "connection logged in: authenticate again (AUTH)")

    async def _auth(self, caller: Caller, h: dict[str, Any], now: float) -> Response:
        """One step of the SCRAM exchange (see the module docstring)."""
        auth = self.registry.auth(now)
        if auth is None:
            raise RequestError(Code.UNKNOWN_OP, "this name server takes no logins: no node "
                               "registered with logins on")
        step, msg = self._logins.step(caller, h)
        if step == "first":
            def lookup(name: str) -> tuple[bytes, bytes, bytes, int]:
                known = auth.users.get(name)
                if known is not None:
                    salt, iterations, stored_key, server_key = known
                    return salt, stored_key, server_key, iterations
                fake = hmac.new(auth.salt_key, name.encode(), hashlib.sha256).digest()
                return fake[:16], fake, fake, _FAKE_ITERATIONS  # no password matches it

            return ok_header(request_id_of(h), msg=self._logins.first(caller, msg, lookup)), b""
        try:
            user, final = self._logins.final(caller, msg)
        except LoginFailed as failed:
            caller.hang_up()  # one try per connection, as on a node
            log.info("authentication failed for %r from %s", failed.user, caller.remote)
            why = ("; the nodes have more users than a registration carries, so this name "
                   "server checks only the configured superuser" if auth.over else "")
            raise RequestError(Code.UNAUTHENTICATED, "authentication failed: unknown user or "
                               "wrong password" + why) from None
        caller.principal = user
        return ok_header(request_id_of(h), msg=final, user=user), b""

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            await self._serve(stream)
        finally:
            self.connections -= 1

    async def _serve(self, raw: trio.SocketStream) -> None:
        stream: trio.abc.Stream = raw
        if self.ssl_context is not None:
            try:
                with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                    stream = await accept_tls(raw, self.ssl_context)
            except (trio.BrokenResourceError, trio.TooSlowError, PlaintextRefused) as exc:
                log.info("closing connection: TLS handshake failed: %r", exc)
                await trio.aclose_forcefully(raw)
                return
        caller = caller_of(stream)
        fs = FrameStream(stream, max_frame=NAMESRV_MAX_FRAME)
        if self.connections > self.max_connections and not self._evict_idle():
            self.refused += 1
            with trio.move_on_after(2):
                try:
                    await fs.send(error_header(0, Code.BUSY, f"this name server serves at most "
                                               f"{self.max_connections} connections"))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            await trio.aclose_forcefully(stream)
            return
        fs.decoder.small_frame = NAMESRV_SMALL_FRAME  # only a registration may be large

        def large_ok(header: dict[Any, Any]) -> bool:
            return header.get("op") == Op.REGISTER and (
                self.ssl_context is None or caller.certificate is not None)

        fs.decoder.large_ok = large_ok
        key = next(self._keys)

        async def handle(c: Caller, frame: Frame) -> Response:
            self._open.move_to_end(key)
            self._busy.add(key)
            try:
                return await self.handle(c, frame)
            finally:
                self._busy.discard(key)

        with trio.CancelScope() as scope:
            self._open[key] = scope
            try:
                await serve_frames(fs, handle, caller=caller, budget=self.budget,
                                   frame_pool_of=lambda _caller: self.large_frames)
            finally:
                self._open.pop(key, None)  # `_evict_idle` may have taken it already
        if scope.cancelled_caught:
            await trio.aclose_forcefully(stream)

    def _evict_idle(self) -> bool:
        """Make room for a new connection by closing the one least recently active with
        no request being handled: idle connections (which need no login) then cannot lock
        nodes and clients out until the idle timeout; whoever was closed reconnects."""
        for key, scope in self._open.items():
            if key not in self._busy:
                del self._open[key]
                scope.cancel()
                self.evicted += 1
                return True
        return False

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
    ssl_context: ssl.SSLContext | None = None, max_connections: int = DEFAULT_MAX_CONNECTIONS,
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    max_buffered: int = DEFAULT_MAX_BUFFERED,
) -> None:
    """Serve until SIGINT or SIGTERM, then return normally so the process exits with 0."""
    if not (expiry > 0 and math.isfinite(expiry)):
        raise ValueError(f"expiry must be a positive number of seconds, got {expiry}")
    server = NameServer(expiry, ssl_context=ssl_context, max_connections=max_connections,
                        frame_timeout=frame_timeout, idle_timeout=idle_timeout,
                        max_buffered=max_buffered)
    listeners = await trio.open_tcp_listeners(port, host=host)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, listeners)
            on_ready(listener_address(listeners[0]))
            async for signum in signals:
                log.info("stopping on %s", signal.Signals(signum).name)
                break
            nursery.cancel_scope.cancel()
