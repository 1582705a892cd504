"""TLS over a trio socket, with the same shortcuts the transport takes for plain TCP.

`trio.SSLStream` is correct but slow for many small frames: every `receive_some` and
`send_all` goes through its generic retry loop, a lock and trio's socket wrapper (each a
scheduling round), and nothing can be written without waiting. On a node under load
that made a TLS answer or Raft message cost several task switches more than a plain
one, and latency (not throughput) showed it.

`TlsStream` keeps the protocol in an `ssl.SSLObject` over memory buffers (sans-I/O: the
SSL object only turns plaintext into records and back) and does the socket I/O itself,
the way `transport.framing.read_some`/`write_now` do for plain TCP:

* `read_nowait`-style reading (`read_some`): records already buffered are decrypted
  without a scheduling round; it waits only when no whole record is there yet.
* `write_nowait`: a frame is encrypted and written with one `os.write` when nothing else
  is being written; ciphertext the socket does not take now stays in the stream (in
  order) and goes out first on the next `send_all` (`backlog` says how much waits).

Every byte of ciphertext, whoever produced it (a write, a handshake, a TLS 1.3 message
produced while reading), goes to the socket through one ordered buffer, so records never
interleave. Certificate checks are the context's, as with `trio.SSLStream`; a
connection that ends without a TLS close_notify is `trio.BrokenResourceError`, as with
`trio.SSLStream(https_compatible=False)`.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

import trio

__all__ = ["TlsStream", "read_socket"]

_RAW_READ = 1 << 16  # ciphertext read from the socket at once (a whole record fits)


async def read_socket(sock: trio.socket.SocketType, max_bytes: int) -> bytes:
    """What `sock` holds, at most `max_bytes` (b"" at its end), with one `os.read`: it
    waits only when nothing is there, and takes no scheduling round once the bytes are
    in (trio's `recv` does). `trio.ClosedResourceError` once the socket is closed here,
    `trio.BrokenResourceError` when the read fails. The plain transport reads its
    sockets this way (`transport.framing.read_some`), and `TlsStream` its ciphertext."""
    while True:
        fd = sock.fileno()
        if fd < 0:
            raise trio.ClosedResourceError("the stream was closed")
        try:
            return os.read(fd, max_bytes)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
        except OSError as exc:
            raise trio.BrokenResourceError(f"reading the connection failed: {exc!r}") from exc


class TlsStream(trio.abc.Stream):
    """A TLS connection over `transport` (a connected `trio.SocketStream`).

    Call `do_handshake()` before anything else. One task may receive and one may send
    at a time (the transport's readers and writers are single tasks); a second sender
    waits for the first.
    """

    def __init__(self, transport: trio.SocketStream, context: ssl.SSLContext, *,
                 server_side: bool = False, server_hostname: str | None = None) -> None:
        self.transport_stream = transport
        self._sock = transport.socket
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                     server_hostname=server_hostname)
        self._out = bytearray()  # ciphertext not yet taken by the socket, in order
        self._send_lock = trio.Lock()  # held while waiting to flush `_out`
        self._receiving = False
        self._eof = False  # the socket reached its end
        # why reading ended (told once the plaintext before it has been read)
        self._ended: ssl.SSLError | None = None
        self._broken: BaseException | None = None
        self._closed = False
        self._handshook = False

    # --- what the SSL object knows -------------------------------------------------

    def getpeercert(self) -> dict[str, Any] | None:
        """The verified certificate the other end presented (None: none offered)."""
        return self._ssl.getpeercert()  # type: ignore[return-value]

    def version(self) -> str | None:
        """The negotiated protocol (`TLSv1.3`), once the handshake is done."""
        return self._ssl.version()

    @property
    def backlog(self) -> int:
        """Ciphertext bytes written by this stream that the socket has not taken yet."""
        return len(self._out)

    # --- handshake ---------------------------------------------------------------------

    async def do_handshake(self) -> None:
        """Run the TLS handshake (certificates checked by the context). Raises
        `trio.BrokenResourceError` when it fails or the other end leaves."""
        while True:
            self._check()
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._take_outgoing()
                await self._flush()
                await self._fill()
            except ssl.SSLError as exc:
                self._take_outgoing()  # the alert that says why, best effort
                self._push()
                raise self._fail(exc) from exc
        self._handshook = True
        self._take_outgoing()  # the last flight (a client's Finished, a server's ticket)
        await self._flush()

    # --- receiving -------------------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """Plaintext, at most `max_bytes`; b"" after the other end's close_notify."""
        await trio.lowlevel.checkpoint_if_cancelled()
        data = await self.read_some(max_bytes or _RAW_READ)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return data

    async def read_some(self, max_bytes: int) -> bytes | bytearray:
        """Like `receive_some`, without a scheduling round when records are already
        buffered or on the socket: it waits only when no whole record is there. The
        caller checkpoints for fairness (`transport.framing.read_some` does)."""
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this TLS stream")
        self._receiving = True
        try:
            while True:
                self._check()
                data = self._decrypt(max_bytes)
                if data is not None:
                    break
                await self._fill()
        finally:
            self._receiving = False
        return data

    def _decrypt(self, max_bytes: int) -> bytes | None:
        """The plaintext the buffered records hold (several records joined, up to
        `max_bytes`); b"" after a close_notify; None when a whole record is missing."""
        if self._ended is not None:
            ended, self._ended = self._ended, None
            if isinstance(ended, ssl.SSLZeroReturnError):
                self._ended = ended  # a clean end stays one
                return b""
            raise self._fail(ended) from ended
        chunks: list[bytes] = []
        got = 0
        # (a read the buffers cannot serve raises SSLWantReadError: not tried for nothing)
        while got < max_bytes and (self._incoming.pending or self._ssl.pending()
                                   or self._eof):
            try:
                piece = self._ssl.read(max_bytes - got)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLError as exc:  # close_notify, a cut connection, a bad record
                self._ended = exc
                break
            if not piece:  # what `read` returns after a close_notify: a clean end
                self._ended = ssl.SSLZeroReturnError()
                break
            chunks.append(piece)
            got += len(piece)
        if self._outgoing.pending:  # reading produced records (a TLS 1.3 key update):
            self._take_outgoing()  # written now if the socket takes them, else before
            self._push()  # the next frame (nothing waits for them; a reader never blocks)
        if chunks:
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if self._ended is not None:
            return self._decrypt(max_bytes)  # the end, now that nothing is left before it
        return None

    async def _fill(self) -> None:
        """Read ciphertext from the socket into the SSL object, waiting for some; at the
        socket's end, mark the SSL object's input ended (its next read tells a
        close_notify from a cut connection)."""
        if self._eof:
            raise self._fail(trio.BrokenResourceError("the connection ended"))
        try:
            raw = await read_socket(self._sock, _RAW_READ)
        except trio.BrokenResourceError as exc:
            raise self._fail(exc) from exc
        self._check()  # (closed or failed elsewhere while this waited)
        if raw:
            self._incoming.write(raw)
        else:
            self._eof = True
            self._incoming.write_eof()

    # --- sending -----------------------------------------------------------------------

    def write_nowait(self, data: bytes | bytearray | memoryview) -> int:
        """Encrypt `data` and write it now, without waiting; returns len(data) when it
        was taken (any ciphertext the socket did not take is `backlog`, for the next
        `send_all`), 0 when it was not (a write in progress or pending, or the stream
        is broken): then the caller sends it with `send_all`."""
        if (self._out or self._send_lock.locked() or self._broken is not None
                or self._closed or not self._handshook):
            return 0
        try:
            self._ssl.write(data)
        except ssl.SSLError:
            return 0  # `send_all` meets the same error and reports it
        self._take_outgoing()
        self._push()
        return len(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypt and write `data` after any ciphertext still waiting (`backlog`);
        an empty `data` just flushes that."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check()
        if data:
            try:
                self._ssl.write(data)
            except ssl.SSLError as exc:
                raise self._fail(exc) from exc
            self._take_outgoing()
        waited = await self._flush()
        if not waited:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        if self._out:
            await trio.lowlevel.wait_writable(self._sock)
        else:
            await self.transport_stream.wait_send_all_might_not_block()

    def _take_outgoing(self) -> None:
        if self._outgoing.pending:
            self._out += self._outgoing.read()

    def _push(self) -> None:
        """Write as much of `_out` as the socket takes now (never waits)."""
        if not self._out or self._send_lock.locked():
            return  # the task flushing takes it
        try:
            sent = os.write(self._sock.fileno(), self._out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(exc)
            return
        del self._out[:sent]

    async def _flush(self) -> bool:
        """Write all of `_out`, waiting for the socket (or for the task already writing
        it); True when it had to wait."""
        self._push()  # (no lock taken when the socket takes it all: a scheduling round less)
        if not self._out:
            return False
        async with self._send_lock:
            while self._out:
                self._check()
                try:
                    sent = os.write(self._sock.fileno(), self._out)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self._sock)
                    continue
                except OSError as exc:
                    raise self._fail(exc) from exc
                del self._out[:sent]
        return True

    # --- closing -----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Send close_notify when that can be done without waiting, then close the
        socket (a peer gone quiet never holds this up)."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        try:
            if self._handshook and self._broken is None and not self._out:
                try:
                    self._ssl.unwrap()
                except ssl.SSLError:
                    pass  # the other end's close_notify is not waited for
                self._take_outgoing()
                self._push()
        finally:
            self._closed = True
            await self.transport_stream.aclose()

    # --- state -------------------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream was closed")
        if self._broken is not None:
            raise trio.BrokenResourceError("the TLS connection failed") from self._broken

    def _fail(self, exc: BaseException) -> trio.BrokenResourceError:
        if self._broken is None:
            self._broken = exc
        if isinstance(exc, trio.BrokenResourceError):
            return exc
        return trio.BrokenResourceError(f"TLS connection failed: {exc!r}")
