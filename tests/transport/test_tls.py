"""The TLS hook of the transport: given an `ssl.SSLContext`, the serving loop, the client
pool and the blocking client speak frames over TLS (certificates made by trustme); a
client without TLS is told why and closed; one that does not trust the server gets no
answer."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trustme

from transport import blocking
from transport.connection import ConnectionPool, TransportError
from transport.framing import Caller, Response, serve_frames
from wire.protocol import Frame, RequestError

OP = 90
BACK = 91


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx


async def answer(caller: Caller, frame: Frame) -> Response:
    """Echoes the body; with `back`, first asks the client (server-to-client over TLS)."""
    said = None
    if frame.header.get("back"):
        said = (await caller.request(BACK, {}, timeout=5)).header["said"]
    return {"code": 0, "said": said, "remote": caller.remote}, frame.body


@asynccontextmanager
async def tls_server(ctx: ssl.SSLContext | None) -> AsyncIterator[str]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners,
                           lambda s: serve_frames(s, answer, ssl_context=ctx), listeners)
        try:
            yield f"127.0.0.1:{port}"
        finally:
            nursery.cancel_scope.cancel()


def test_clients_with_the_context_talk_both_ways_over_tls(ca: trustme.CA) -> None:
    async def back(frame: Frame) -> tuple[dict[str, Any], bytes]:
        return {"said": "from the client"}, b""

    async def main() -> None:
        async with tls_server(server_context(ca)) as addr:
            async with ConnectionPool(ssl_context=client_context(ca)) as pool:
                pool.on_request(BACK, back)
                f = await pool.request(addr, OP, {"back": True}, b"secret body")
                assert f.body == b"secret body" and f.header["said"] == "from the client"
                assert f.header["remote"].startswith("127.0.0.1:")
            h, body = await trio.to_thread.run_sync(
                lambda: blocking.request(addr, {"op": OP}, b"blocking",
                                         ssl_context=client_context(ca)))
            assert body == b"blocking" and h["code"] == 0

    trio.run(main)


def test_a_plain_or_distrustful_client_gets_no_answer(ca: trustme.CA) -> None:
    async def main() -> None:
        async with tls_server(server_context(ca)) as addr:
            async with ConnectionPool() as pool:  # no TLS: the server reads no frame
                with pytest.raises(TransportError, match="TLS connections only"):
                    await pool.request(addr, OP, {}, timeout=10)
            stranger = client_context(trustme.CA())  # trusts another CA
            async with ConnectionPool(ssl_context=stranger) as pool:
                with pytest.raises(TransportError) as info:
                    await pool.request(addr, OP, {}, timeout=10)
                assert info.value.sent is False  # refused before anything was sent

            def plain_blocking() -> None:
                blocking.request(addr, {"op": OP}, timeout=10)

            with pytest.raises(RequestError, match="TLS connections only"):  # told why
                await trio.to_thread.run_sync(plain_blocking)
            with pytest.raises(ssl.SSLError):
                await trio.to_thread.run_sync(
                    lambda: blocking.request(addr, {"op": OP}, ssl_context=stranger))

    trio.run(main)


def test_a_server_with_an_expired_certificate_is_refused(ca: trustme.CA) -> None:
    import datetime

    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", not_before=past - datetime.timedelta(days=30),
                  not_after=past).configure_cert(ctx)

    async def main() -> None:
        async with tls_server(ctx) as addr:
            with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
                await trio.to_thread.run_sync(
                    lambda: blocking.request(addr, {"op": OP}, ssl_context=client_context(ca)))
            async with ConnectionPool(ssl_context=client_context(ca)) as pool:
                with pytest.raises(TransportError) as info:
                    await pool.request(addr, OP, {}, timeout=10)
                assert info.value.sent is False and "expired" in str(info.value)

    trio.run(main)
