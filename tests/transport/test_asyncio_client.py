"""The client pool on asyncio (`transport.framelink`, plain and on asyncio's TLS
transport) against the serving loop: the promises `test_tls.py` and `test_callback.py`
make on trio. The server runs in a thread of its own (trio), the client in
`asyncio.run`."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trustme

from transport.connection import ConnectionPool, TransportError
from transport.framelink import FrameProtocol
from wire.protocol import Frame

from .test_tls import BACK, OP, client_context, server_context, tls_server


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@contextmanager
def server_thread(ctx: ssl.SSLContext | None) -> Iterator[str]:
    """`test_tls.tls_server` (plain without `ctx`) in a thread running trio; its address."""
    ready = threading.Event()
    addr: list[str] = []
    stop: list[Any] = []

    async def main() -> None:
        async with tls_server(ctx) as a:
            done = trio.Event()
            stop.append((trio.lowlevel.current_trio_token(), done.set))
            addr.append(a)
            ready.set()
            await done.wait()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    assert ready.wait(30), "the TLS server did not start"
    try:
        yield addr[0]
    finally:
        token, done = stop[0]
        token.run_sync_soon(done)
        thread.join(30)


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
def test_an_asyncio_client_talks_both_ways(ca: trustme.CA, tls: bool) -> None:
    """Requests, large frames, and the server's requests to the client (answered in
    tasks of their own though the frames are read in no task)."""
    async def back(frame: Frame) -> tuple[dict[str, Any], bytes]:
        return {"said": "from the client"}, b""

    async def main(addr: str) -> None:
        async with ConnectionPool(ssl_context=client_context(ca) if tls else None) as pool:
            pool.on_request(BACK, back)
            f = await pool.request(addr, OP, {"back": True}, b"secret body")
            assert f.body == b"secret body" and f.header["said"] == "from the client"
            big = bytes(range(256)) * 4096  # 1 MiB each way: many TLS records
            assert (await pool.request(addr, OP, {}, big, timeout=30)).body == big
            link = pool.connection(addr)._link
            assert link is not None and isinstance(link.stream, FrameProtocol)

    with server_thread(server_context(ca) if tls else None) as addr:
        asyncio.run(main(addr))


def test_an_asyncio_client_that_trusts_another_ca_is_refused_before_sending(
        ca: trustme.CA) -> None:
    async def main(addr: str) -> None:
        async with ConnectionPool(ssl_context=client_context(trustme.CA())) as pool:
            with pytest.raises(TransportError) as info:
                await pool.request(addr, OP, {}, timeout=10)
            assert info.value.sent is False
            assert "certificate verify failed" in str(info.value)

    with server_thread(server_context(ca)) as addr:
        asyncio.run(main(addr))


def test_an_asyncio_client_refuses_a_server_with_an_expired_certificate(
        ca: trustme.CA) -> None:
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", not_before=past - datetime.timedelta(days=30),
                  not_after=past).configure_cert(ctx)

    async def main(addr: str) -> None:
        async with ConnectionPool(ssl_context=client_context(ca)) as pool:
            with pytest.raises(TransportError) as info:
                await pool.request(addr, OP, {}, timeout=10)
            assert info.value.sent is False and "expired" in str(info.value)

    with server_thread(ctx) as addr:
        asyncio.run(main(addr))


def test_a_dropped_tls_connection_fails_the_request_on_it_and_the_next_dials_again(
        ca: trustme.CA) -> None:
    async def main(addr: str) -> list[str]:
        async with ConnectionPool(ssl_context=client_context(ca)) as pool:
            await pool.request(addr, OP, {}, b"first")
            conn = pool.connection(addr)
            link = conn._link
            assert link is not None
            link.stream.abort()  # type: ignore[union-attr]  # the connection drops
            with pytest.raises(TransportError):
                await pool.request(addr, OP, {}, b"lost", timeout=5)
            again = await pool.request(addr, OP, {}, b"again", timeout=5)
            return [again.body.decode(), str(conn.connects)]

    with server_thread(server_context(ca)) as addr:
        assert asyncio.run(main(addr)) == ["again", "2"]
