"""Multiplexed request/response over one TCP connection per address.

Every client object (producer, consumers, admin) reaches nodes and name servers through a
`ConnectionPool`: one connection per address, shared, with any number of requests
outstanding on it. A reader task per connection hands each response to its waiter by
request id, so a FETCH held for 15 s by long polling never delays a PRODUCE on the same
socket, and responses may arrive in any order. (On asyncio there is no reader task: the
event loop's read callback decodes the frames, `transport.framelink`.)

A lost connection fails every request waiting on it with a retriable `TransportError`
(CONNECTION_LOST: the outcome is unknown); a failed dial is UNAVAILABLE (nothing was
sent); the next request dials again. A request larger than the frame limit is refused
here (FRAME_TOO_LARGE), as the broker would refuse it by closing the connection. All reader tasks live in the
pool's task group, so leaving `async with ConnectionPool()` leaves nothing running.

The server may send requests the other way on the same connection (a broker asking a
producer whether a transaction commits). A frame with an `op` is such a request: it runs
the handler registered for its op with `ConnectionPool.on_request`, in its own task, and
the answer goes back with the request's id; an op without a handler is answered
UNKNOWN_OP.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from wire.protocol import (
    DEFAULT_MAX_FRAME,
    Code,
    Frame,
    FrameDecoder,
    Op,
    ProtocolError,
    RequestError,
    encode_frame,
    error_header,
    parse_address,
)

from .errors import ClientClosedError, TransportError, close_stack
from .framelink import FrameProtocol, open_frame_link
from .scram import Credentials, Exchange, credentials_from_env
from .tls import context_from_env

__all__ = [
    "DEFAULT_TIMEOUT",
    "ClientClosedError",
    "Connection",
    "ConnectionPool",
    "RequestHandler",
    "TransportError",
    "is_retriable",
    "raise_for_code",
]

log = logging.getLogger("raftmq.client")

DEFAULT_TIMEOUT = 3.0  # RocketMQ's send timeout; also used for control requests
_LAST_WORDS = 1.0  # seconds a failed send waits for the peer's closing error frame
_RESERVED = frozenset({"id", "code", "msg", "message"})

#: Answers a request the server sent: `(header, body)` of the answer (its id is filled
#: in); raising `RequestError` answers with that error.
RequestHandler = Callable[[Frame], Awaitable[tuple[dict[str, Any], bytes]]]


def is_retriable(exc: RequestError) -> bool:
    """Retriable codes, plus client-side conditions marked transient (a route gap)."""
    return exc.retriable or bool(exc.extra.get("transient"))


def raise_for_code(frame: Frame) -> Frame:
    """Turn an error response into `RequestError`, keeping its extra header fields
    (`leader`, `min`, `end`, ...) in `RequestError.extra`."""
    h = frame.header
    raw = h.get("code", 0)
    if raw == 0:
        return frame
    try:
        code = Code(raw)
    except ValueError:
        code = Code.INTERNAL
    text = h.get("msg")
    message = str(text) if text else f"{code.name} (code {raw})"
    extra = {k: v for k, v in h.items() if isinstance(k, str) and k not in _RESERVED}
    raise RequestError(code, message, **extra)


class _Waiter:
    __slots__ = ("error", "event", "frame")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.frame: Frame | None = None
        self.error: RequestError | None = None

    def resolve(self, frame: Frame) -> None:
        self.frame = frame
        self.event.set()

    def fail(self, error: RequestError) -> None:
        self.error = error
        self.event.set()


class _Link:
    """One established TCP connection; a failed link is replaced, never reused."""

    def __init__(self, addr: str, stream: anyio.abc.ByteStream | FrameProtocol) -> None:
        self.addr = addr
        self.stream = stream
        self.waiters: dict[int, _Waiter] = {}
        self.send_lock = anyio.Lock()
        self.scope = anyio.CancelScope()
        self.closed = False
        self.reason = ""
        self.peer_error: RequestError | None = None  # why the peer is closing, if it said
        self.reader_done = anyio.Event()
        # a FrameProtocol link's requests from the server, for `_serve_requests`
        self.asked: list[Frame] = []
        self.asking = anyio.Event()

    def fail(self, reason: str) -> None:
        """Mark dead, stop the reader, fail everyone waiting. Idempotent, synchronous."""
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        self.scope.cancel()  # the reader task's, which closes the stream
        if isinstance(self.stream, FrameProtocol):  # no reader task: closed here
            self.stream.abort()
        waiters, self.waiters = self.waiters, {}
        if self.peer_error is not None:
            reason = f"{reason}; the peer said {self.peer_error}"
        for w in waiters.values():
            w.fail(TransportError(f"connection to {self.addr} lost: {reason}", sent=True))


class Connection:
    """Requests to one address, multiplexed by id over a lazily (re)opened TCP link."""

    def __init__(
        self,
        addr: str,
        spawn: Callable[..., Any],
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        handlers: Mapping[int, RequestHandler] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.addr = addr
        self._ssl = ssl_context
        self._credentials = credentials
        self._host, self._port = parse_address(addr)
        self._spawn = spawn
        self._max_frame = max_frame
        self._handlers: Mapping[int, RequestHandler] = {} if handlers is None else handlers
        self._ids = itertools.count(1)
        self._link: _Link | None = None
        self._connect_lock = anyio.Lock()
        self._closed = False
        self.connects = 0  # how many times a link was opened; for tests and metrics

    @property
    def connected(self) -> bool:
        return self._link is not None and not self._link.closed

    async def request(
        self,
        op: Op | int,
        header: Mapping[str, Any] | None = None,
        body: bytes | bytearray | memoryview = b"",
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Frame:
        """Send one request and wait for its answer.

        Raises `RequestError` for an error code (with the response's extra fields),
        `RequestError(TIMEOUT)` when no answer arrives within `timeout` seconds (the
        connection stays up; a late answer is dropped), and `TransportError` when the
        connection fails.
        """
        if self._closed:
            raise ClientClosedError(f"connection to {self.addr} is closed")
        req_id = next(self._ids)
        data = encode_frame({**(header or {}), "op": int(op), "id": req_id}, body)
        if len(data) - 4 > self._max_frame:
            raise RequestError(
                Code.FRAME_TOO_LARGE,
                f"{_op_name(op)} request of {len(data) - 4} bytes exceeds the frame limit of "
                f"{self._max_frame} bytes (nothing was sent)",
            )
        waiter = _Waiter()
        link: _Link | None = None
        try:
            # a bare scope rather than `fail_after`'s generator around one: a request is
            # the SDK's hot path
            with anyio.CancelScope(deadline=anyio.current_time() + timeout) as scope:
                link = await self._get_link()
                link.waiters[req_id] = waiter
                await self._send(link, data)
                await waiter.event.wait()
        finally:
            if link is not None:
                link.waiters.pop(req_id, None)
        if scope.cancelled_caught:
            raise RequestError(
                Code.TIMEOUT, f"{_op_name(op)} to {self.addr}: no answer within {timeout:g} s"
            )
        if waiter.error is not None:
            raise waiter.error
        assert waiter.frame is not None
        return raise_for_code(waiter.frame)

    def close(self) -> None:
        """Drop the link; waiters fail, the reader task ends on its own."""
        self._closed = True
        if self._link is not None:
            self._link.fail("closed by the client")

    async def _get_link(self) -> _Link:
        link = self._link
        if link is not None and not link.closed:
            return link
        async with self._connect_lock:
            link = self._link
            if link is not None and not link.closed:
                return link
            if self._closed:
                raise ClientClosedError(f"connection to {self.addr} is closed")
            try:
                stream = await self._dial()
            except (OSError, anyio.BrokenResourceError) as exc:
                raise TransportError(f"cannot connect to {self.addr}: {exc}", sent=False) from exc
            link = _Link(self.addr, stream)
            self.connects += 1
            if isinstance(stream, FrameProtocol):  # frames come from the loop's callback
                stream.attach(partial(self._on_frame, link), partial(self._ended, link))
                self._spawn(self._serve_requests, link)
            else:
                self._spawn(self._read, link)
            # let the link's task (reader, or the frame link's request server) start
            # before anything is sent: with anyio's asyncio stream the transport reads
            # only while a receive is pending, and a peer that refuses the first request
            # says why just before it closes (see `_send`); shielded, so a cancellation
            # cannot leave the new link running unowned
            await anyio.lowlevel.cancel_shielded_checkpoint()
            if self._credentials is not None:  # before anyone else may use the link
                try:
                    await self._authenticate(link, self._credentials)
                except BaseException:
                    link.fail("authentication did not complete")
                    raise
            self._link = link
            return link

    async def _authenticate(self, link: _Link, creds: Credentials) -> None:
        """SCRAM-SHA-256 on a fresh link (`transport.scram`); a server that does not
        authenticate (a name server answers UNKNOWN_OP) is used as it is."""
        ex = Exchange(creds)
        try:
            h = (await self._on_link(link, ex.first())).header
        except RequestError as exc:
            if exc.code == Code.UNKNOWN_OP:
                return
            raise
        ex.check((await self._on_link(link, ex.final(h.get("msg")))).header.get("msg"))

    async def _on_link(self, link: _Link, header: dict[str, Any]) -> Frame:
        req_id = next(self._ids)
        waiter = _Waiter()
        link.waiters[req_id] = waiter
        try:
            with anyio.fail_after(DEFAULT_TIMEOUT):
                await self._send(link, encode_frame({**header, "id": req_id}))
                await waiter.event.wait()
        except TimeoutError:
            raise RequestError(Code.TIMEOUT, f"AUTH to {self.addr}: no answer in time") from None
        finally:
            link.waiters.pop(req_id, None)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.frame is not None
        return raise_for_code(waiter.frame)

    async def _dial(self) -> anyio.abc.ByteStream | FrameProtocol:
        if anyio.get_cancelled_exc_class() is asyncio.CancelledError:  # on asyncio
            return await open_frame_link(self._host, self._port, self._max_frame, self._ssl)
        if self._ssl is None:
            return await anyio.connect_tcp(self._host, self._port)
        return await anyio.connect_tcp(self._host, self._port, ssl_context=self._ssl,
                                       tls_standard_compatible=False)

    async def _send(self, link: _Link, data: bytes) -> None:
        lock = link.send_lock
        # A free lock is taken without the scheduling round `acquire` adds (one per
        # request; the stream's send still yields once). As `acquire` would, a cancelled
        # caller stops here, before the write, and the link stays usable.
        await anyio.lowlevel.checkpoint_if_cancelled()
        try:
            lock.acquire_nowait()
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            if link.closed:
                raise TransportError(
                    f"connection to {self.addr} lost: {link.reason}", sent=False
                )
            done = False
            try:
                await link.stream.send(data)
                done = True
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                # A peer refusing the stream (a frame over its limit) says why in a last
                # frame before closing: let the reader take it in, then report that.
                with anyio.move_on_after(_LAST_WORDS):
                    await link.reader_done.wait()
                link.fail(f"send failed: {exc!r}")
                if link.peer_error is not None:
                    raise link.peer_error from exc
                raise TransportError(
                    f"connection to {self.addr} lost while sending: {exc!r}", sent=True
                ) from exc
            finally:
                if not done:
                    # interrupted mid-write (a timeout): the stream may hold half a frame
                    link.fail("a send was interrupted")
        finally:
            lock.release()

    async def _read(self, link: _Link) -> None:
        decoder = FrameDecoder(self._max_frame)
        reason = "reader stopped"
        try:
            with link.scope:
                try:
                    stream = link.stream
                    assert not isinstance(stream, FrameProtocol)
                    while True:
                        decoder.feed(await stream.receive())
                        while (frame := decoder.next_frame()) is not None:
                            self._on_frame(link, frame)
                except anyio.EndOfStream:
                    reason = "closed by the peer"
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    reason = f"broken ({exc!r})"
                except ProtocolError as exc:
                    reason = f"protocol error ({exc})"
                    log.warning("closing connection to %s: %s", self.addr, exc)
        finally:
            self._ended(link, reason)
            assert not isinstance(link.stream, FrameProtocol)
            await anyio.aclose_forcefully(link.stream)

    def _on_frame(self, link: _Link, frame: Frame) -> None:
        """A frame from the server: an answer goes to its waiter, a request of the
        server's to its handler (in a task of its own), a closing error is kept."""
        if "op" in frame.header:  # the server asks us something
            if isinstance(link.stream, FrameProtocol):  # (not in a task: see below)
                link.asked.append(frame)
                link.asking.set()
            else:
                self._spawn(self._answer, link, frame)
            return
        rid = frame.header.get("id")
        waiter = link.waiters.pop(rid, None) if isinstance(rid, int) else None
        if waiter is not None:
            waiter.resolve(frame)
        elif rid == 0 and frame.header.get("code"):
            link.peer_error = _peer_error(frame)

    async def _serve_requests(self, link: _Link) -> None:
        """A FrameProtocol link's requests from the server, each answered in a task of
        its own: the read callback that decodes them runs in no task, and a task can be
        started only from one. Ends with the link."""
        with link.scope:
            while True:
                await link.asking.wait()
                link.asking = anyio.Event()
                asked, link.asked = link.asked, []
                for frame in asked:
                    self._spawn(self._answer, link, frame)

    def _ended(self, link: _Link, reason: str) -> None:
        """The link's reading ended (`reason`): everyone waiting on it fails, and the
        next request dials again."""
        link.reader_done.set()
        link.fail(reason)
        if self._link is link:
            self._link = None

    async def _answer(self, link: _Link, frame: Frame) -> None:
        """Run the handler for a request the server sent and send its answer back."""
        op, rid = frame.header.get("op"), frame.header.get("id", 0)
        handler = self._handlers.get(op) if isinstance(op, int) else None
        try:
            if handler is None:
                raise RequestError(Code.UNKNOWN_OP, f"this client answers no op {op!r}")
            header, body = await handler(frame)
            header = {**header, "id": rid}
            header.setdefault("code", 0)
        except RequestError as exc:
            header, body = error_header(rid, exc.code, exc.message, **exc.extra), b""
        except Exception as exc:  # a buggy handler must not take the connection down
            log.exception("handler for server request %r failed", op)
            header, body = error_header(rid, Code.INTERNAL, f"internal error: {exc!r}"), b""
        try:
            await self._send(link, encode_frame(header, body))
        except RequestError:
            pass  # the connection is gone (or refused it): the server sees that, not an answer


def _peer_error(frame: Frame) -> RequestError:
    """The error a peer sent with id 0 before closing the connection (its reason)."""
    try:
        raise_for_code(frame)
    except RequestError as exc:
        return exc
    return RequestError(Code.INTERNAL, "the peer closed the connection")


def _op_name(op: Op | int) -> str:
    try:
        return Op(op).name
    except ValueError:
        return f"op {int(op)}"


class ConnectionPool:
    """One `Connection` per address, shared by every user of the pool.

    Use as `async with ConnectionPool() as pool:`; reader tasks run in the pool's task
    group and end when the block exits. With `ssl_context` every connection is TLS
    (the server's certificate is checked against it and the address's host); without
    one, the environment decides (`transport.tls.context_from_env`: `RAFTMQ_TLS_CA`).
    With `credentials` (default: `RAFTMQ_USER`/`RAFTMQ_PASSWORD`) every connection to a
    node authenticates with SCRAM-SHA-256 before its first request. `env_credentials=False`
    keeps the environment's login out of a pool that acts for someone else (the HTTP API
    serving a request that carries no login must not borrow the process's own).
    """

    def __init__(
        self, *, max_frame: int = DEFAULT_MAX_FRAME, ssl_context: ssl.SSLContext | None = None,
        credentials: Credentials | None = None, env_credentials: bool = True,
    ) -> None:
        self._max_frame = max_frame
        # without a context of its own, the one RAFTMQ_TLS_CA names (plain when unset)
        self._ssl = ssl_context if ssl_context is not None else context_from_env()
        # every connection logs in first (SCRAM-SHA-256); default RAFTMQ_USER/PASSWORD
        self._credentials = credentials if credentials is not None or not env_credentials \
            else credentials_from_env()
        self._handlers: dict[int, RequestHandler] = {}
        self._conns: dict[str, Connection] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> ConnectionPool:
        if self._tg is not None or self._closed:
            raise RuntimeError("a ConnectionPool can be entered once")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closed = True
        for conn in self._conns.values():
            conn.close()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await close_stack(self._tg, exc)

    def connection(self, addr: str) -> Connection:
        """The shared connection to `addr` (created on first use, dialled lazily)."""
        if self._tg is None or self._closed:
            raise ClientClosedError("the connection pool is not open (use `async with`)")
        conn = self._conns.get(addr)
        if conn is None:
            conn = Connection(addr, self._tg.start_soon, max_frame=self._max_frame,
                              handlers=self._handlers, ssl_context=self._ssl,
                              credentials=self._credentials)
            self._conns[addr] = conn
        return conn

    def on_request(self, op: Op | int, handler: RequestHandler) -> None:
        """Answer requests of type `op` that a server sends on any of the pool's
        connections with `handler` (replacing any handler registered before)."""
        self._handlers[int(op)] = handler

    async def request(
        self,
        addr: str,
        op: Op | int,
        header: Mapping[str, Any] | None = None,
        body: bytes | bytearray | memoryview = b"",
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Frame:
        """`Connection.request` on the shared connection to `addr`."""
        return await self.connection(addr).request(op, header, body, timeout=timeout)
