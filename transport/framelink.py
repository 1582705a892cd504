"""A client link on asyncio that decodes frames in the event loop's read callback.

On asyncio, anyio's socket stream pauses the transport whenever no `receive` is waiting
and resumes it for the next one (two epoll changes per answer), and its bytes reach the
connection through a reader task woken for every read. At one request in flight that
was a fifth of a producer's CPU. `FrameProtocol` reads all the time instead: the loop
calls it with the bytes, it decodes whole frames and hands each to the connection's
`on_frame` at once (an answer wakes its caller directly), and it reports the end of the
connection once, with the reason a reader task would have given. Writes go straight to
the transport, waiting only while asyncio says its buffer is full. Over TLS, asyncio's
own TLS transport sits below it (anyio's TLS stream cost a TLS round trip more CPU
again on top of its socket stream).

On asyncio only: trio keeps anyio's streams and a reader task.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

import anyio

from wire.protocol import Frame, FrameDecoder, ProtocolError

__all__ = ["FrameProtocol", "open_frame_link"]

log = logging.getLogger("raftmq.client")


class FrameProtocol(asyncio.Protocol):
    """One connection's bytes in, frames out; see the module docstring."""

    def __init__(self, max_frame: int) -> None:
        self._decoder = FrameDecoder(max_frame)
        self._transport: asyncio.Transport | None = None
        self._on_frame: Callable[[Frame], None] | None = None
        self._on_end: Callable[[str], None] | None = None
        self._early: list[Frame] = []  # decoded before `attach` (none in practice)
        self._ended: str | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    # -------------------------------------------------------------- the connection's side

    def attach(self, on_frame: Callable[[Frame], None], on_end: Callable[[str], None]) -> None:
        """Start handing frames to `on_frame`; `on_end(reason)` runs once when the
        connection ends (at once if it already has)."""
        self._on_frame, self._on_end = on_frame, on_end
        early, self._early = self._early, []
        for frame in early:
            on_frame(frame)
        if self._ended is not None:
            on_end(self._ended)

    async def send(self, data: bytes) -> None:
        """Write `data` (whole frames); waits only while the transport's buffer is full."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise anyio.BrokenResourceError(f"the connection ended: {self._ended or 'closing'}")
        transport.write(data)
        if not self._writable.is_set():
            await self._writable.wait()
            if self._ended is not None:
                raise anyio.BrokenResourceError(f"the connection ended: {self._ended}")

    def abort(self) -> None:
        """Drop the connection now (what is unsent is lost, as with a forceful close)."""
        if self._transport is not None:
            self._transport.abort()

    # ------------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._ended is not None:
            return
        self._decoder.feed(data)
        try:
            while (frame := self._decoder.next_frame()) is not None:
                if self._on_frame is None:
                    self._early.append(frame)
                else:
                    self._on_frame(frame)
        except ProtocolError as exc:
            log.warning("closing connection: %s", exc)
            self._end(f"protocol error ({exc})")
            self.abort()

    def eof_received(self) -> bool | None:
        self._end("closed by the peer")
        return None  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self._end("closed by the peer" if exc is None else f"broken ({exc!r})")
        self._writable.set()  # a writer waiting for room learns of the end
        self._decoder.discard()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _end(self, reason: str) -> None:
        if self._ended is not None:
            return
        self._ended = reason
        if self._on_end is not None:
            self._on_end(reason)


async def open_frame_link(host: str, port: int, max_frame: int,
                          ssl_context: ssl.SSLContext | None = None) -> FrameProtocol:
    """Dial `host:port` (over TLS with `ssl_context`, the server's certificate checked
    against `host`) and return its `FrameProtocol`, on the running asyncio loop. A
    failed dial or handshake raises `OSError` (`ssl.SSLError` is one)."""
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(lambda: FrameProtocol(max_frame), host, port,
                                               ssl=ssl_context)
    return protocol
