"""The TLS hook: wrap a connection's stream when an `ssl.SSLContext` is given.

Every place that opens or accepts a connection (the serving loop, the client pool, the
blocking client, the peer links) takes an optional context and goes through here, so
turning TLS on is configuration, not new code.

The contexts themselves are made here too, from PEM files:

* `server_context(cert, key, ca)` for a listener: it presents the node's certificate and
  *asks* for the other end's (`CERT_OPTIONAL`). Clients need none (they authenticate
  with SCRAM over the encrypted link); a certificate that is offered must chain to `ca`,
  and a connection that wants to be a peer must have offered one (`peer_certificate`),
  which is how mutual TLS between nodes shares one listener with clients.
* `client_context(ca, cert, key)` for a dialer: trusts `ca` only and checks the host
  name; a node dials its peers with its own certificate loaded.
* `context_from_env()`: the client context `RAFTMQ_TLS_CA` (and optionally
  `RAFTMQ_TLS_CERT`/`RAFTMQ_TLS_KEY`) describe, for tools and the SDK's default pool.

Over a socket the connection is a `transport.tlsstream.TlsStream`, which the framing
layer writes and reads without waiting, as it does plain TCP (`write_now`, `read_some`);
over anything else, `trio.SSLStream`.

A plaintext client that reaches a TLS listener is told so in a plain error frame before
the connection closes (`accept_tls` peeks at the first byte: every TLS connection starts
with a handshake record, 0x16), instead of a silent close.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Mapping
from typing import Any, TypeGuard

import trio

from wire.protocol import Code, encode_frame, error_header

from .tlsstream import TlsStream

__all__ = [
    "CA_ENV",
    "CERT_ENV",
    "KEY_ENV",
    "TLS_HANDSHAKE_TIMEOUT",
    "PlaintextRefused",
    "TlsConfigError",
    "accept_tls",
    "client_context",
    "connect_tls",
    "context_from_env",
    "is_tls",
    "peer_certificate",
    "server_context",
    "socket_of",
]

TLS_HANDSHAKE_TIMEOUT = 10.0
CA_ENV = "RAFTMQ_TLS_CA"
CERT_ENV = "RAFTMQ_TLS_CERT"
KEY_ENV = "RAFTMQ_TLS_KEY"
_TLS_HANDSHAKE_RECORD = 0x16
#: What a plaintext client reads from a TLS port (then the connection closes).
PLAINTEXT_MESSAGE = (f"this port accepts TLS connections only: connect with TLS trusting the "
                     f"cluster's CA (`raftmq --tls-ca FILE`, {CA_ENV}, or an ssl_context)")


class TlsConfigError(ValueError):
    """A certificate, key or CA file is missing or unusable; the message names it."""


class PlaintextRefused(Exception):
    """A client spoke plaintext to a TLS listener (it was told so, and is closed)."""


def _load_ca(ctx: ssl.SSLContext, ca: str, what: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca)
    except FileNotFoundError:
        raise TlsConfigError(f"{what}: CA file {ca!r} does not exist") from None
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"{what}: CA file {ca!r} holds no usable PEM certificate "
                             f"({exc})") from None


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str, what: str) -> None:
    for path, kind in ((cert, "certificate"), (key, "key")):
        if not os.path.isfile(path):
            raise TlsConfigError(f"{what}: {kind} file {path!r} does not exist")
    try:
        ctx.load_cert_chain(certfile=cert, keyfile=key)
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"{what}: certificate {cert!r} and key {key!r} do not load as a "
                             f"PEM pair that belongs together ({exc})") from None


def server_context(cert: str, key: str, ca: str, *, what: str = "tls") -> ssl.SSLContext:
    """The listener's context: presents `cert`, verifies any certificate offered against
    `ca` (a peer must offer one; a client may). Raises `TlsConfigError`."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert, key, what)
    _load_ca(ctx, ca, what)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(ca: str, cert: str | None = None, key: str | None = None, *,
                   what: str = "tls") -> ssl.SSLContext:
    """A dialer's context trusting only `ca` (host names are checked); with `cert` and
    `key` it also proves who it is (a node dialing its peers). Raises `TlsConfigError`."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(ctx, ca, what)
    if cert or key:
        if not (cert and key):
            raise TlsConfigError(f"{what}: a client certificate needs both a cert and a key file")
        _load_chain(ctx, cert, key, what)
    return ctx


def context_from_env(env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """The client context `RAFTMQ_TLS_CA` names, or None when it is unset or empty."""
    env = os.environ if env is None else env
    ca = env.get(CA_ENV, "")
    if not ca:
        return None
    return client_context(ca, env.get(CERT_ENV) or None, env.get(KEY_ENV) or None, what=CA_ENV)


def _wrap(stream: trio.abc.Stream, context: ssl.SSLContext, *, server_side: bool,
          server_hostname: str | None = None) -> TlsStream | trio.SSLStream[trio.abc.Stream]:
    """A TLS stream over `stream`: `TlsStream` over a socket (it writes and reads without
    the scheduling rounds `trio.SSLStream` takes, see `transport.tlsstream`), trio's own
    over anything else."""
    if type(stream) is trio.SocketStream:
        return TlsStream(stream, context, server_side=server_side,
                         server_hostname=server_hostname)
    return trio.SSLStream(stream, context, server_side=server_side,
                          server_hostname=server_hostname, https_compatible=False)


async def connect_tls(stream: trio.abc.Stream, context: ssl.SSLContext,
                      server_hostname: str) -> TlsStream | trio.SSLStream[trio.abc.Stream]:
    """The client side over `stream`, handshake done (raises `trio.BrokenResourceError`
    when the handshake fails, e.g. an untrusted certificate)."""
    tls = _wrap(stream, context, server_side=False, server_hostname=server_hostname)
    await tls.do_handshake()
    return tls


async def accept_tls(stream: trio.abc.Stream,
                     context: ssl.SSLContext) -> TlsStream | trio.SSLStream[trio.abc.Stream]:
    """The server side over an accepted `stream`, handshake done.

    Raises `PlaintextRefused` (after telling the client in a plain error frame) when the
    first byte is not a TLS handshake record, and `trio.BrokenResourceError` when the
    handshake fails (an untrusted or expired certificate)."""
    sock = socket_of(stream)
    if sock is not None:
        try:
            first = await sock.recv(1, socket.MSG_PEEK)
        except OSError as exc:
            raise trio.BrokenResourceError(f"reading the first byte failed: {exc!r}") from exc
        if not first:
            raise trio.BrokenResourceError("closed before the TLS handshake")
        if first[0] != _TLS_HANDSHAKE_RECORD:
            await _tell_plaintext(stream)
            raise PlaintextRefused("a plaintext client on the TLS port")
    tls = _wrap(stream, context, server_side=True)
    await tls.do_handshake()
    return tls


async def _tell_plaintext(stream: trio.abc.Stream) -> None:
    with trio.move_on_after(2):
        try:
            await stream.send_all(encode_frame(error_header(0, Code.FORBIDDEN, PLAINTEXT_MESSAGE)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def is_tls(stream: trio.abc.Stream) -> TypeGuard[TlsStream | trio.SSLStream[Any]]:
    """Whether `stream` is a TLS connection (made by `connect_tls` or `accept_tls`)."""
    return isinstance(stream, (TlsStream, trio.SSLStream))


def peer_certificate(stream: trio.abc.Stream) -> dict[str, object] | None:
    """The certificate the other end of a TLS `stream` presented and the handshake
    verified against the CA; None for a plain stream or when it offered none."""
    if not is_tls(stream):
        return None
    cert = stream.getpeercert()
    return dict(cert) if cert else None


def socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under `stream` (through TLS), to read addresses or close it hard."""
    while not isinstance(stream, trio.SocketStream):
        inner = getattr(stream, "transport_stream", None)
        if inner is None:
            return None
        stream = inner
    return stream.socket
