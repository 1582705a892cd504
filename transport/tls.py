"""The TLS hook: wrap a connection's stream when an `ssl.SSLContext` is given.

Every place that opens or accepts a connection (the serving loop, the client pool, the
blocking client, the peer links) takes an optional context and goes through here, so
turning TLS on is configuration, not new code. Which certificates, mutual TLS between
peers and client authentication belong to the security work; without a context nothing
changes on the wire.
"""

from __future__ import annotations

import ssl

import trio

__all__ = ["TLS_HANDSHAKE_TIMEOUT", "accept_tls", "connect_tls", "socket_of"]

TLS_HANDSHAKE_TIMEOUT = 10.0


async def connect_tls(stream: trio.abc.Stream, context: ssl.SSLContext,
                      server_hostname: str) -> trio.SSLStream[trio.abc.Stream]:
    """The client side over `stream`, handshake done (raises `trio.BrokenResourceError`
    when the handshake fails, e.g. an untrusted certificate)."""
    tls = trio.SSLStream(stream, context, server_hostname=server_hostname,
                         https_compatible=False)
    await tls.do_handshake()
    return tls


async def accept_tls(stream: trio.abc.Stream,
                     context: ssl.SSLContext) -> trio.SSLStream[trio.abc.Stream]:
    """The server side over an accepted `stream`, handshake done."""
    tls = trio.SSLStream(stream, context, server_side=True, https_compatible=False)
    await tls.do_handshake()
    return tls


def socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under `stream` (through TLS), to read addresses or close it hard."""
    while not isinstance(stream, trio.SocketStream):
        inner = getattr(stream, "transport_stream", None)
        if inner is None:
            return None
        stream = inner
    return stream.socket
