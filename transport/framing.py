"""Frames over trio streams: one request loop shared by the node and the name server.

`FrameStream` turns a byte stream into frames (`wire.protocol`) and serialises writes,
so any number of tasks may answer on one connection. `serve_frames` is the server side:
it reads requests and runs each one in its own task, because a long-polling FETCH must not
hold up a PRODUCE pipelined behind it on the same connection. A cap on requests in flight
per connection stops reading when a client outruns us, which pushes back through TCP
instead of growing memory.

Every handler is given the connection's `Caller`: who is on the other end (its address,
the node id a peer proved, later the authenticated principal) and a way to call it back.
`Caller.request` sends a request the other way, on the same connection (the broker asks a
producer whether a transaction commits). Its ids are negative, so they never meet the
client's own (positive) ids in either direction; the answer is a frame with no `op`, a
`code` and that id. Any other frame is a request, answered as usual (an "answer" nobody
waits for gets UNKNOWN_OP, which the client drops: no request of its own has that id).

Answers go out through a `FrameWriter`: an answer finding the connection idle (nothing
queued, no write in progress) is written at once when the socket takes it whole
(`write_now`), which spares a task switch per answer; otherwise one writer task per
connection joins every frame queued since its last write (those finished in the same
scheduler turn, or while a write was in progress) into a single `send_all`. Responses
carry their request id, so they may leave in any order; a frame is always written whole.
Queued bytes are capped per connection, so a client that stops reading makes the
answering tasks wait. Reading, likewise, takes bytes already there without trio's extra
scheduling round (`read_some`). Both hold for TLS connections too (`transport.tlsstream`).
"""

from __future__ import annotations

import itertools
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from wire.protocol import (
    DEFAULT_MAX_FRAME,
    Code,
    Frame,
    FrameDecoder,
    HeaderTooLarge,
    Op,
    ProtocolError,
    RequestError,
    encode_frame,
    error_header,
    parse_address,
)

from .budget import Budget, BytePool, Watch
from .connection import raise_for_code
from .tls import (
    TLS_HANDSHAKE_TIMEOUT,
    PlaintextRefused,
    accept_tls,
    connect_tls,
    peer_certificate,
    socket_of,
)
from .tlsstream import TlsStream, read_socket

__all__ = [
    "Budget",
    "BytePool",
    "DEFAULT_MAX_INFLIGHT",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_MAX_PENDING",
    "Caller",
    "CallerGone",
    "FrameStream",
    "FrameWriter",
    "Handler",
    "Response",
    "caller_of",
    "read_some",
    "write_now",
    "unflushed",
    "is_answer",
    "open_frame_stream",
    "request_id",
    "serve_frames",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_INFLIGHT = 1024
_YIELD_EVERY = 16  # a connection's requests admitted in a row before one checkpoint
DEFAULT_MAX_PENDING = 1 << 20  # queued answer bytes per connection before senders wait
DEFAULT_MAX_INFLIGHT_BYTES = 64 << 20  # request bodies running per connection before reads stop
_RECEIVE_SIZE = 1 << 16
_ERROR_SEND_TIMEOUT = 5.0

Response = tuple[dict[str, Any], bytes]
Handler = Callable[["Caller", Frame], Awaitable[Response | None]]


class FrameStream:
    """Frames in both directions over one trio stream.

    `receive()` is meant for a single reader task; `send()` may be called from many tasks
    at once (a lock keeps frames whole on the wire).
    """

    def __init__(self, stream: trio.abc.Stream, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.stream = stream
        self._decoder = FrameDecoder(max_frame)
        self._send_lock = trio.Lock()
        self._eof = False

    async def send(self, header: dict[str, Any], body: bytes | bytearray | memoryview = b"") -> None:
        """Write one frame. Raises trio.BrokenResourceError/ClosedResourceError if the peer
        is gone."""
        data = encode_frame(header, body)
        async with self._send_lock:
            await self.stream.send_all(data)

    async def receive(self, watch: Watch | None = None) -> Frame | None:
        """The next frame, or None at a clean end of stream (or a reset connection).

        Raises `ProtocolError` for a broken stream, including one that ends mid-frame,
        and (with a `watch`) for a deadline of the connection's budget that passed.
        """
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                if watch is not None:
                    watch.frame_done()
                return frame
            if self._eof:  # raised again on every call, like the decoder's own errors
                if self._decoder.buffered:
                    raise ProtocolError(
                        Code.MALFORMED,
                        f"connection closed inside a frame ({self._decoder.buffered} bytes pending)",
                    )
                return None
            if watch is not None:
                await watch.before_read()  # a large frame's memory is set aside first
            try:
                if watch is None:
                    data = await read_some(self.stream, _RECEIVE_SIZE)
                else:
                    data = await watch.read(self.stream, _RECEIVE_SIZE)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                self._eof = True
                continue
            self._decoder.feed(data)
            if watch is not None:
                watch.received()  # the first byte of a frame starts its deadline

    @property
    def decoder(self) -> FrameDecoder:
        """The parser with any bytes already read past the last frame (for hand-over)."""
        return self._decoder

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> FrameStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def open_frame_stream(
    addr: str, *, max_frame: int = DEFAULT_MAX_FRAME, ssl_context: ssl.SSLContext | None = None
) -> FrameStream:
    """Connect to 'host:port' and wrap the TCP stream (in TLS first, with `ssl_context`)."""
    host, port = parse_address(addr)
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    if ssl_context is not None:
        try:
            with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                stream = await connect_tls(stream, ssl_context, host)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
    return FrameStream(stream, max_frame=max_frame)


def write_now(stream: trio.abc.SendStream, data: bytes | memoryview) -> int:
    """Write as much of `data` as the stream takes without waiting; returns how much
    that was. A plain TCP stream writes what the socket takes; a `TlsStream` takes a
    frame whole or not at all (any ciphertext its socket did not take waits in the
    stream: `unflushed` says so, and the caller must then have its writer task call
    `send_all`, which writes that first). 0 for any other stream, and when nothing can
    be taken now or the write fails (the caller queues the data for its writer task,
    whose `send_all` then waits, or meets the failure and reports it).

    The caller must be the stream's only writer at that moment: nothing of its own queued
    or being written, so bytes cannot interleave."""
    if type(stream) is TlsStream:
        return stream.write_nowait(data)
    if type(stream) is not trio.SocketStream:
        return 0
    try:
        return os.write(stream.socket.fileno(), data)
    except OSError:  # BlockingIOError, or a broken connection the writer task will report
        return 0


def unflushed(stream: trio.abc.SendStream) -> bool:
    """Whether `stream` holds bytes a `write_now` took but its socket did not (a TLS
    stream's ciphertext): the writer task must `send_all` (b"" will do) to write them."""
    return type(stream) is TlsStream and stream.backlog > 0


async def read_some(stream: trio.abc.ReceiveStream, max_bytes: int) -> bytes | bytearray:
    """`stream.receive_some(max_bytes)`, for a plain TCP stream without the scheduling round
    trio's takes after the data is in: what the bytes start (a Raft step, a request)
    happens one turn sooner. It waits only when nothing is there yet; after a full read
    (more may be waiting) it checkpoints, so a busy connection cannot starve the others.
    A `TlsStream` is read the same way (records already there are decrypted at once);
    any other stream with its own `receive_some`."""
    if type(stream) is TlsStream:
        data = await stream.read_some(max_bytes)
        if len(data) == max_bytes:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return data
    if type(stream) is not trio.SocketStream:
        return await stream.receive_some(max_bytes)
    data = await read_socket(stream.socket, max_bytes)
    if len(data) == max_bytes:
        await trio.lowlevel.cancel_shielded_checkpoint()  # (a cancel must not drop data)
    return data


class FrameWriter:
    """Joins frames bound for one stream so that many answers cost one write.

    `send()` queues a whole frame. It returns without waiting while fewer than
    `max_pending` bytes are queued or being written (a frame is admitted whole, so the
    total can pass the cap by one frame), and otherwise waits for the writer to catch up.
    `run()` is the only task that writes: it takes everything queued so far, writes it with
    one `send_all`, and repeats; with `write_timeout`, a write the other end does not
    take within that many seconds fails the writer (a client that stopped reading is
    disconnected rather than holding its requests' tasks and buffers forever). If a write fails, `run()` records it and returns; waiting
    and later `send()` calls raise `trio.BrokenResourceError` (`trio.ClosedResourceError`
    once `run()` has ended otherwise, e.g. by cancellation).
    """

    def __init__(self, stream: trio.abc.SendStream, *, max_pending: int = DEFAULT_MAX_PENDING,
                 write_timeout: float | None = None) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be positive, got {max_pending}")
        self._stream = stream
        self._max_pending = max_pending
        self._write_timeout = write_timeout  # a write stuck this long: the reader is gone
        self._queue: list[bytes | memoryview] = []
        self._pending = 0  # bytes queued plus bytes being written
        self._has_data = trio.lowlevel.ParkingLot()
        self._has_room = trio.lowlevel.ParkingLot()
        self._drained = trio.lowlevel.ParkingLot()
        self._failure: BaseException | None = None
        self._stopped = False
        self._writing = False  # run() is in a send_all
        self._stop_requested = False

    @property
    def pending(self) -> int:
        """Bytes accepted by `send()` and not yet written."""
        return self._pending

    def _check(self) -> None:
        if self._failure is not None:
            raise trio.BrokenResourceError("writing to the connection failed") from self._failure
        if self._stopped:
            raise trio.ClosedResourceError("the connection's writer has stopped")

    async def send(self, header: dict[str, Any], body: bytes | bytearray | memoryview = b"") -> None:
        """Queue one frame; waits only while the connection is over its pending-bytes cap."""
        data: bytes | memoryview = encode_frame(header, body)
        self._check()
        while self._pending >= self._max_pending:
            await self._has_room.park()
            self._check()
        if not self._queue and not self._writing:  # idle: no task switch for the answer
            sent = write_now(self._stream, data)
            if sent == len(data):
                if not unflushed(self._stream):
                    return
                data = b""  # taken, but the socket was full: the writer's send_all flushes
            elif sent:
                data = memoryview(data)[sent:]  # the rest, not copied
        self._queue.append(data)
        self._pending += len(data)
        self._has_data.unpark_all()

    async def drain(self) -> None:
        """Wait until everything queued so far has been written."""
        self._check()
        if not self._pending:
            await trio.lowlevel.checkpoint()
        while self._pending:
            await self._drained.park()
            self._check()

    def stop(self) -> None:
        """Make `run()` return once what is queued now is written (the connection ends)."""
        self._stop_requested = True
        self._has_data.unpark_all()

    async def run(self) -> None:
        """Write queued frames until cancelled, stopped or a write fails."""
        try:
            while True:
                while not self._queue:
                    if self._stop_requested:
                        return
                    await self._has_data.park()
                batch, self._queue = self._queue, []
                data = batch[0] if len(batch) == 1 else b"".join(batch)
                self._writing = True
                try:
                    if self._write_timeout is None:
                        await self._stream.send_all(data)
                    else:
                        with trio.fail_after(self._write_timeout):
                            await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._failure = exc
                    return
                except trio.TooSlowError as exc:  # it stopped reading: let it go
                    log.info("closing connection: the other end took no bytes for %g s",
                             self._write_timeout)
                    self._failure = exc
                    return
                finally:
                    self._writing = False
                self._pending -= len(data)
                self._has_room.unpark_all()
                if not self._pending:
                    self._drained.unpark_all()
        finally:
            self._stopped = True
            self._queue = []
            self._has_room.unpark_all()
            self._drained.unpark_all()


class CallerGone(RequestError):
    """The connection to the caller ended before it answered a request sent to it.

    Retriable: the caller may or may not have acted on the request (outcome unknown)."""

    def __init__(self, message: str) -> None:
        super().__init__(Code.TIMEOUT, message)


class Caller:
    """The other end of one served connection: who it is, and a way to call it back.

    `remote` is its address as the socket reports it; `peer` the node id it proved with
    the peer handshake (None for clients); `principal` the identity it authenticated as
    (None until client authentication exists). `request` sends it a request on this
    connection and waits for the answer; it works while `serve_frames` runs.
    """

    def __init__(self, remote: str = "", *, peer: int | None = None,
                 principal: str | None = None) -> None:
        self.remote = remote
        self.peer = peer
        self.principal = principal
        # the TLS client certificate the handshake verified against the CA (None: plain
        # TCP, or none offered); a name server takes registrations only from its holders
        self.certificate: dict[str, object] | None = None
        self._out: FrameWriter | None = None
        self._ids = itertools.count(-1, -1)  # negative: never a client's own request id
        self._waiters: dict[int, list[Any]] = {}  # id -> [event, frame or None]
        self._gone: str | None = None
        self._hang_up = False
        self._on_login: list[Callable[[str], None]] = []  # the connection's budget, the node

    def log_in(self, user: str) -> None:
        """The caller proved it is `user`: from now on the connection is served as that
        user's (the limits before a login are lifted, the user's own apply). Raises what
        a listener raises (`RequestError(BUSY)`: no room for another of its connections),
        the login then not taking effect."""
        for hook in self._on_login:
            hook(user)
        self.principal = user

    def on_login(self, hook: Callable[[str], None]) -> None:
        """Call `hook(user)` when this caller logs in (before it counts as logged in)."""
        self._on_login.append(hook)

    @property
    def is_peer(self) -> bool:
        """True when the other end proved it is a node of this cluster."""
        return self.peer is not None

    @property
    def connected(self) -> bool:
        """True while the connection is served (`request` can reach the other end)."""
        return self._out is not None and self._gone is None

    def describe(self) -> str:
        who = f"node {self.peer}" if self.peer is not None else "client"
        return f"{who} at {self.remote or '?'}"

    async def request(
        self,
        op: Op | int,
        header: Mapping[str, Any] | None = None,
        body: bytes | bytearray | memoryview = b"",
        *,
        timeout: float,
    ) -> Frame:
        """Send a request to the caller and wait for its answer.

        Raises `RequestError` for an error answer (with its extra fields),
        `RequestError(TIMEOUT)` when no answer comes within `timeout` seconds, and
        `CallerGone` when the connection ends first.
        """
        if self._out is None or self._gone is not None:
            raise CallerGone(f"{self.describe()}: {self._gone or 'not connected'}")
        rid = next(self._ids)
        slot: list[Any] = [trio.Event(), None]
        self._waiters[rid] = slot
        try:
            with trio.fail_after(timeout):
                try:
                    await self._out.send({**(header or {}), "op": int(op), "id": rid}, body)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    raise CallerGone(f"{self.describe()}: connection lost") from None
                await slot[0].wait()
        except trio.TooSlowError:
            raise RequestError(Code.TIMEOUT, f"{self.describe()}: no answer to op {int(op)} "
                               f"within {timeout:g} s") from None
        finally:
            self._waiters.pop(rid, None)
        frame = slot[1]
        if frame is None:
            raise CallerGone(f"{self.describe()}: {self._gone}")
        return raise_for_code(frame)

    def hang_up(self) -> None:
        """End this connection once the answer to the current request is written (a
        client whose login failed gets its answer, then must connect again)."""
        self._hang_up = True

    def disconnect(self) -> None:
        """End this connection now, after the answers already queued (a user removed
        while it was logged in: its connection must not outlive the login)."""
        self._hang_up = True
        if self._out is not None:
            self._out.stop()

    def _bind(self, out: FrameWriter) -> None:
        self._out = out
        self._gone = None

    def _resolve(self, frame: Frame) -> bool:
        """Hand an answer to its waiter; False when nobody waits for that id."""
        slot = self._waiters.pop(request_id(frame), None) if is_answer(frame) else None
        if slot is None:
            return False
        slot[1] = frame
        slot[0].set()
        return True

    def _close(self, reason: str) -> None:
        self._gone = reason
        waiters, self._waiters = self._waiters, {}
        for slot in waiters.values():
            slot[0].set()


def is_answer(frame: Frame) -> bool:
    """Shaped like an answer to a `Caller.request` (no `op`, a `code`, a negative id)."""
    h = frame.header
    return "op" not in h and "code" in h and request_id(frame) < 0


def caller_of(stream: trio.abc.Stream) -> Caller:
    """A client `Caller` named by the stream's remote address, when it has one."""
    remote = ""
    sock = socket_of(stream)
    if sock is not None:
        try:
            host, port, *_ = sock.getpeername()
            remote = f"{host}:{port}"
        except (OSError, ValueError, TypeError):
            pass
    return Caller(remote)


def request_id(frame: Frame) -> int:
    """The request id to echo; 0 when the sender did not give a usable one."""
    rid = frame.header.get("id", 0)
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else 0


class _Admission:
    """What a connection may have in flight: at most `max_inflight` requests, and no new
    one read while the bodies of those running add up to `max_bytes` or more (a request
    is admitted whole, so one larger than the cap still runs, alone), nor while the
    pool the caller shares with its other connections (`pool_of`: its user's) is full.
    A large frame is taken from `frame_pool_of`'s pool when its length is known, before
    its body is read (`reserve`), and stays charged there while its request runs.
    It also tells the connection's `Watch` what is in flight (nothing: the idle clock
    runs)."""

    def __init__(self, max_inflight: int, max_bytes: int, watch: Watch | None = None,
                 pool_of: Callable[[], BytePool | None] | None = None,
                 frame_pool_of: Callable[[], BytePool | None] | None = None) -> None:
        self._slots = trio.Semaphore(max_inflight)
        self._max_bytes = max_bytes
        self._bytes = 0
        self._freed = trio.lowlevel.ParkingLot()
        self._watch = watch
        self._pool_of = pool_of
        self._frame_pool_of = frame_pool_of
        self._reserved: tuple[int, BytePool] | None = None  # for the frame being read
        self._fast = 0  # slots taken in a row without a checkpoint

    async def acquire(self) -> None:
        # A free slot is taken without trio's checkpoint (a turn of the loop per request)
        # but every _YIELD_EVERY-th: the read that follows waits when nothing is there,
        # and this bounds what a connection whose requests keep arriving runs between
        # the other tasks' turns
        self._fast += 1
        if self._fast < _YIELD_EVERY:
            try:
                self._slots.acquire_nowait()
            except trio.WouldBlock:
                self._fast = 0
                await self._slots.acquire()
        else:
            self._fast = 0
            await self._slots.acquire()
        while self._bytes >= self._max_bytes:
            await self._freed.park()
        pool = self._pool_of() if self._pool_of is not None else None
        if pool is not None:
            await pool.wait_room()

    async def reserve(self, nbytes: int) -> bool:
        """A frame of `nbytes` began: take it from the frame pool (waiting until it fits)
        before its body is read. True when it had to wait."""
        pool = self._frame_pool_of() if self._frame_pool_of is not None else None
        if pool is None:
            return False
        waited = await pool.take_fitting(nbytes)
        self._reserved = (nbytes, pool)
        return waited

    def unreserve(self) -> BytePool | None:
        """Give back what was set aside for the frame being read (taken whole, or the
        connection closing inside it); the pool it came from."""
        reserved, self._reserved = self._reserved, None
        if reserved is None:
            return None
        reserved[1].give(reserved[0])
        return reserved[1]

    def charge(self, nbytes: int) -> BytePool | None:
        """Count a request's body as running; returns the shared pool it was drawn from
        (to give it back to the same pool, whatever the caller became since): the one
        its frame was set aside in, if it was."""
        self._bytes += nbytes
        if self._watch is not None:
            self._watch.started()
        pool = self.unreserve()
        if pool is None and self._pool_of is not None:
            pool = self._pool_of()
        if pool is not None:
            pool.take(nbytes)
        return pool

    def release(self, nbytes: int = 0, pool: BytePool | None = None, *,
                ran: bool = True) -> None:
        self._bytes -= nbytes
        if pool is not None:
            pool.give(nbytes)
        self._slots.release()
        self._freed.unpark_all()
        if ran and self._watch is not None:
            self._watch.finished()


async def _answer(
    out: FrameWriter, handler: Handler, caller: Caller, frame: Frame, slots: _Admission,
    pool: BytePool | None = None,
) -> None:
    try:
        rid = request_id(frame)
        try:
            response = await handler(caller, frame)
        except RequestError as exc:
            response = (error_header(rid, exc.code, exc.message, **exc.extra), b"")
        except Exception as exc:  # one buggy request must not take the connection down
            log.exception("request %r failed", frame.header.get("op"))
            response = (error_header(rid, Code.INTERNAL, f"internal error: {exc!r}"), b"")
        if response is None:
            return
        header, body = response
        header.setdefault("id", rid)
        try:
            try:
                await out.send(header, body)
            except HeaderTooLarge as exc:  # a handler's bug: an answer no reader takes
                log.error("request %r: %s", frame.header.get("op"), exc)
                await out.send(error_header(rid, Code.INTERNAL, f"internal error: {exc}"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the writer's failure ends the connection
        if caller._hang_up:
            out.stop()  # the writer ends after this answer, and with it the connection
    finally:
        slots.release(len(frame.body), pool)


async def serve_frames(
    stream: trio.abc.Stream | FrameStream,
    handler: Handler,
    *,
    max_frame: int = DEFAULT_MAX_FRAME,
    max_inflight: int = DEFAULT_MAX_INFLIGHT,
    max_pending: int = DEFAULT_MAX_PENDING,
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
    first: Frame | None = None,
    caller: Caller | None = None,
    ssl_context: ssl.SSLContext | None = None,
    write_timeout: float | None = None,
    budget: Budget | None = None,
    pool_of: Callable[[Caller], BytePool | None] | None = None,
    frame_pool_of: Callable[[Caller], BytePool | None] | None = None,
    since: float | None = None,
) -> None:
    """Answer requests on one connection until the peer leaves or breaks the framing.

    Each request runs `handler(caller, frame)` in its own task; its `(header, body)` result is sent
    back (a missing "id" is filled in from the request), None sends nothing (one-way ops).
    Answers are written through a `FrameWriter` (at most `max_pending` bytes queued), so
    they leave in completion order and several may share one write. `RequestError`
    becomes an error response and other exceptions an INTERNAL one; the connection stays
    open either way. A `ProtocolError` while reading gets one error frame with id 0 (after
    the answers already queued) and ends the connection, since the byte stream cannot be
    resynced. A failed write also ends the connection. When the connection ends, requests
    still running are cancelled (nobody is left to read their answers) and the stream is
    closed. `max_frame` applies when a raw stream is given; a `FrameStream` keeps its own
    limit. `first` is a frame already read from the stream (the node reads one to tell
    peers from clients). `caller` says who is on the other end (default: a client known by
    its address); answers to its `request` calls are taken from the stream here. With
    `ssl_context` a raw stream is wrapped in TLS first; a failed handshake closes it.
    `write_timeout` disconnects a caller that takes no answer bytes for that long.
    Reading stops while `max_inflight` requests, or request bodies of `max_inflight_bytes`
    or more, are running (TCP then pushes back on the client), or while the `BytePool`
    that `pool_of(caller)` names (shared with the caller's other connections) is full.
    A frame over `RESERVE_OVER` bytes is taken from `frame_pool_of(caller)`'s pool as
    soon as its length is known, before its body is read (waiting until it fits in that
    pool), so connections sharing a pool also share a bound on the frames they are
    reading; it is given back when the request ends or the connection closes.
    `budget` bounds the connection in time (`transport.budget`: a frame's deadline
    once started, idle and login deadlines, a smaller frame limit until the login);
    a deadline that passes closes the connection with a TIMEOUT error frame; `since`
    (trio time) is when the connection began, if before this call (its login deadline).
    """
    if ssl_context is not None:
        if isinstance(stream, FrameStream):
            raise TypeError("TLS wraps a raw stream: pass the accepted stream, not a FrameStream")
        try:
            with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                stream = await accept_tls(stream, ssl_context)
        except (trio.BrokenResourceError, trio.TooSlowError, PlaintextRefused) as exc:
            log.info("closing connection: TLS handshake failed: %r", exc)
            await trio.aclose_forcefully(stream)
            return
    fs = stream if isinstance(stream, FrameStream) else FrameStream(stream, max_frame=max_frame)
    if caller is None:
        caller = caller_of(fs.stream)
    caller.certificate = peer_certificate(fs.stream)
    watch = None
    if budget is not None or frame_pool_of is not None:
        watch = Watch(budget or Budget(), fs.decoder, since=since)
        caller.on_login(lambda _user: watch.log_in())
    slots = _Admission(max_inflight, max_inflight_bytes, watch,
                       None if pool_of is None else lambda: pool_of(caller),
                       None if frame_pool_of is None else lambda: frame_pool_of(caller))
    if watch is not None and frame_pool_of is not None:
        watch.reserve = slots.reserve
    out = FrameWriter(fs.stream, max_pending=max_pending, write_timeout=write_timeout)
    caller._bind(out)
    try:
        await _serve(fs, out, handler, caller, slots, first, watch)
    except Exception:  # under trio.serve_listeners an escaping error would stop the server
        log.exception("connection handler failed")
    finally:
        slots.unreserve()  # a frame cut off: what was set aside for it goes back
        fs.decoder.discard()  # and its bytes (the caller may outlive the connection)
        if watch is not None:
            watch.reserve = None  # (a cycle through `slots`)
        caller._close("connection closed")
        await trio.aclose_forcefully(fs.stream)  # a TLS goodbye must not hang on a dead peer


async def _write(out: FrameWriter, scope: trio.CancelScope) -> None:
    await out.run()
    scope.cancel()  # the write failed: end the connection, reader and requests too


async def _serve(
    fs: FrameStream, out: FrameWriter, handler: Handler, caller: Caller,
    slots: _Admission, first: Frame | None, watch: Watch | None,
) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_write, out, nursery.cancel_scope)
        if first is not None:  # a frame the caller read to decide who is calling
            await slots.acquire()
            pool = slots.charge(len(first.body))
            nursery.start_soon(_answer, out, handler, caller, first, slots, pool)
        try:
            while True:
                await slots.acquire()
                frame = await fs.receive(watch)
                if frame is None:
                    break
                if caller._resolve(frame):  # the answer to a `caller.request`
                    slots.unreserve()
                    slots.release(ran=False)
                    continue
                pool = slots.charge(len(frame.body))
                nursery.start_soon(_answer, out, handler, caller, frame, slots, pool)
        except ProtocolError as exc:
            log.info("closing connection: %s", exc)
            with trio.move_on_after(_ERROR_SEND_TIMEOUT):  # a peer that never reads
                try:
                    await out.send(error_header(0, exc.code, str(exc)))
                    await out.drain()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        except trio.ClosedResourceError:
            pass
        nursery.cancel_scope.cancel()
