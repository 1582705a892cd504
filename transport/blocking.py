"""Plain blocking request/response over the frame protocol, for tools and tests.

The node and the SDK are asynchronous; a CLI command or a test that asks a name server or
a node one question does not need an event loop. `request` opens a connection, sends one
frame, waits for the response with the same id and closes; `Connection` keeps one socket
for a series of requests (e.g. polling).
"""

from __future__ import annotations

import itertools
import socket
import ssl
import time
from typing import Any

from wire.protocol import (
    DEFAULT_MAX_FRAME,
    Code,
    FrameDecoder,
    ProtocolError,
    RequestError,
    encode_frame,
    parse_address,
)

from .scram import Credentials, credentials_from_env, exchange
from .tls import context_from_env

__all__ = ["Connection", "request"]

_ids = itertools.count(1)
_RECEIVE_SIZE = 1 << 16


def _error(header: dict[str, Any]) -> RequestError:
    raw = header.get("code")
    try:
        code = Code(raw) if isinstance(raw, int) else Code.INTERNAL
    except ValueError:  # a newer peer may know codes we do not
        code = Code.INTERNAL
    extra = {k: v for k, v in header.items() if k not in ("id", "code", "msg")}
    msg = header.get("msg")
    return RequestError(code, msg if isinstance(msg, str) else f"error code {raw!r}", **extra)


class Connection:
    """One TCP connection to a node or name server, used for sequential requests.

    Raises `OSError` when the peer cannot be reached, closes the connection or does not
    answer in time (`TimeoutError` is an `OSError`), and `RequestError` when the peer
    answers with a non-zero code; `ProtocolError` when its bytes are not valid frames.
    After an `OSError` or a `ProtocolError` the connection is closed. With `ssl_context`
    the connection is TLS.
    """

    def __init__(
        self, addr: str | tuple[str, int], *, timeout: float = 5.0, max_frame: int = DEFAULT_MAX_FRAME,
        ssl_context: ssl.SSLContext | None = None, credentials: Credentials | None = None,
    ) -> None:
        host, port = parse_address(addr) if isinstance(addr, str) else addr
        self.addr = f"{host}:{port}"
        self.timeout = timeout
        self._decoder = FrameDecoder(max_frame)
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is None:
            ssl_context = context_from_env()  # RAFTMQ_TLS_CA, for tools; plain when unset
        if ssl_context is not None:  # a failed handshake raises ssl.SSLError, an OSError
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        self._sock: socket.socket | None = sock
        if credentials is None:
            credentials = credentials_from_env()  # RAFTMQ_USER/PASSWORD, for tools
        if credentials is not None:
            try:
                exchange(credentials, lambda h: self.request(h)[0])
            except BaseException:
                self.close()
                raise

    def request(
        self,
        header: dict[str, Any],
        body: bytes | bytearray | memoryview = b"",
        *,
        timeout: float | None = None,
    ) -> tuple[dict[str, Any], bytes]:
        """Send one request and return the response's (header, body).

        An `id` is assigned when the header has none. `timeout` (default: the
        connection's) bounds the whole exchange, not each socket read.
        """
        sock = self._sock
        if sock is None:
            raise OSError(f"connection to {self.addr} is closed")
        header = dict(header)
        rid = header.setdefault("id", next(_ids))
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(encode_frame(header, body))
            while True:
                frame = self._decoder.next_frame()
                if frame is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"no answer from {self.addr} in time")
                    sock.settimeout(left)
                    data = sock.recv(_RECEIVE_SIZE)
                    if not data:
                        raise ConnectionError(f"{self.addr} closed the connection")
                    self._decoder.feed(data)
                    continue
                if frame.header.get("id") == 0 and frame.header.get("code"):
                    self.close()  # the server's last words before it closes (TLS only, ...)
                    raise _error(frame.header)
                if frame.header.get("id") != rid:
                    continue  # an answer to an earlier request that timed out
                break
        except (OSError, ProtocolError):
            self.close()
            raise
        code = frame.header.get("code", 0)
        if code != 0:
            raise _error(frame.header)
        return frame.header, frame.body

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request(
    addr: str | tuple[str, int],
    header: dict[str, Any],
    body: bytes | bytearray | memoryview = b"",
    timeout: float = 5.0,
    *,
    ssl_context: ssl.SSLContext | None = None,
    credentials: Credentials | None = None,
) -> tuple[dict[str, Any], bytes]:
    """One request on a fresh connection: the response's (header, body).

    Raises `RequestError` for a non-zero response code (its `extra` holds the other
    header fields, e.g. `leader` on NOT_LEADER) and `OSError` when the peer cannot be
    reached or does not answer within `timeout` seconds (connect included).
    """
    deadline = time.monotonic() + timeout
    with Connection(addr, timeout=timeout, ssl_context=ssl_context,
                    credentials=credentials) as conn:
        return conn.request(header, body, timeout=max(0.001, deadline - time.monotonic()))
