"""Client transport: multiplexing by request id, timeouts, reconnects, clean shutdown.

The server here speaks only the frame format (it echoes, delays, fails or hangs up as
each request's header asks); it stands in for no node behaviour.
"""

from __future__ import annotations

import random
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest

from transport.connection import ClientClosedError, ConnectionPool, TransportError
from wire.protocol import Code, FrameDecoder, Op, RequestError, encode_frame


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class FrameServer:
    """Answers each request in its own task, so answers can overtake each other.

    Header instructions: `delay` (seconds before answering), `code` (answer with that
    error code, plus `leader`), `close` (hang up at once), `garbage` (send bytes that
    are not a valid frame).
    """

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.addr = ""

    async def handle(self, stream: anyio.abc.ByteStream) -> None:
        self.connections += 1
        decoder = FrameDecoder()
        lock = anyio.Lock()
        async with stream, anyio.create_task_group() as tg:
            try:
                while True:
                    decoder.feed(await stream.receive())
                    while (frame := decoder.next_frame()) is not None:
                        self.requests += 1
                        h = frame.header
                        if h.get("close"):
                            tg.cancel_scope.cancel()
                            return
                        if h.get("garbage"):
                            async with lock:
                                await stream.send(struct.pack(">II", 1 << 30, 4))
                            continue
                        tg.start_soon(self.answer, stream, lock, h, frame.body)
            except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            tg.cancel_scope.cancel()

    async def answer(
        self, stream: anyio.abc.ByteStream, lock: anyio.Lock, h: dict[str, Any], body: bytes
    ) -> None:
        await anyio.sleep(float(h.get("delay", 0)))
        if h.get("code"):
            header = {"id": h["id"], "code": h["code"], "msg": "as asked",
                      "leader": h.get("leader")}
        else:
            header = {"id": h["id"], "code": 0, "echo": h.get("n")}
        async with lock:
            await stream.send(encode_frame(header, body))


@asynccontextmanager
async def frame_server() -> AsyncIterator[FrameServer]:
    server = FrameServer()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    server.addr = f"127.0.0.1:{port}"
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.handle)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


OP = Op.STATUS  # any op: the test server ignores it


@pytest.mark.anyio
async def test_answers_overtaking_each_other_reach_their_callers() -> None:
    async with frame_server() as server, ConnectionPool() as pool:
        done: list[int] = []

        async def call(n: int, delay: float) -> None:
            frame = await pool.request(server.addr, OP, {"n": n, "delay": delay},
                                       f"body-{n}".encode())
            assert frame.header["echo"] == n
            assert frame.body == f"body-{n}".encode()
            done.append(n)

        async with anyio.create_task_group() as tg:
            for n, delay in ((0, 0.3), (1, 0.15), (2, 0.0)):
                tg.start_soon(call, n, delay)
        assert done == [2, 1, 0]
        assert server.connections == 1


@pytest.mark.anyio
async def test_many_concurrent_requests_share_one_connection() -> None:
    rng = random.Random(7)
    async with frame_server() as server, ConnectionPool() as pool:
        results: dict[int, bytes] = {}

        async def call(n: int) -> None:
            body = rng.randbytes(rng.randrange(0, 3000))
            frame = await pool.request(server.addr, OP, {"n": n, "delay": rng.random() / 50},
                                       body)
            assert frame.header["echo"] == n
            results[n] = frame.body
            assert frame.body == body

        async with anyio.create_task_group() as tg:
            for n in range(300):
                tg.start_soon(call, n)
        assert len(results) == 300
        assert server.connections == 1
        assert pool.connection(server.addr).connects == 1


@pytest.mark.anyio
async def test_large_bodies_round_trip() -> None:
    async with frame_server() as server, ConnectionPool() as pool:
        body = bytes(range(256)) * (5 * 4096)  # 5 MiB
        frame = await pool.request(server.addr, OP, {"n": 1}, body)
        assert frame.body == body


@pytest.mark.anyio
async def test_timeout_fails_only_that_request() -> None:
    async with frame_server() as server, ConnectionPool() as pool:
        with pytest.raises(RequestError) as info:
            await pool.request(server.addr, OP, {"n": 1, "delay": 0.5}, timeout=0.1)
        assert info.value.code == Code.TIMEOUT and info.value.retriable
        assert not isinstance(info.value, TransportError)
        conn = pool.connection(server.addr)
        assert conn.connected
        frame = await pool.request(server.addr, OP, {"n": 2})
        assert frame.header["echo"] == 2
        await anyio.sleep(0.6)  # the late answer arrives and is dropped
        frame = await pool.request(server.addr, OP, {"n": 3})
        assert frame.header["echo"] == 3
        assert conn.connects == 1 and server.connections == 1


@pytest.mark.anyio
async def test_error_answers_raise_with_their_fields() -> None:
    async with frame_server() as server, ConnectionPool() as pool:
        with pytest.raises(RequestError) as info:
            await pool.request(server.addr, OP, {"code": int(Code.NOT_LEADER),
                                                 "leader": "10.0.0.2:7000"})
        assert info.value.code == Code.NOT_LEADER and info.value.retriable
        assert info.value.extra["leader"] == "10.0.0.2:7000"
        with pytest.raises(RequestError) as info:
            await pool.request(server.addr, OP, {"code": int(Code.UNKNOWN_TOPIC)})
        assert info.value.code == Code.UNKNOWN_TOPIC and not info.value.retriable
        with pytest.raises(RequestError) as info:
            await pool.request(server.addr, OP, {"code": 999})
        assert info.value.code == Code.INTERNAL
        # the connection survived every error answer
        assert pool.connection(server.addr).connects == 1


@pytest.mark.anyio
async def test_connection_loss_fails_waiters_and_next_request_reconnects() -> None:
    async with frame_server() as server, ConnectionPool() as pool:
        errors: list[BaseException] = []

        async def slow() -> None:
            try:
                await pool.request(server.addr, OP, {"n": 1, "delay": 5}, timeout=10)
            except RequestError as exc:
                errors.append(exc)

        with anyio.fail_after(3):
            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                await anyio.sleep(0.05)
                with pytest.raises(TransportError) as info:
                    await pool.request(server.addr, OP, {"close": True})
                assert info.value.retriable and info.value.code == Code.CONNECTION_LOST
        assert len(errors) == 1 and isinstance(errors[0], TransportError)
        frame = await pool.request(server.addr, OP, {"n": 2})
        assert frame.header["echo"] == 2
        assert server.connections == 2
        assert pool.connection(server.addr).connects == 2


@pytest.mark.anyio
async def test_broken_stream_closes_the_connection() -> None:
    async with frame_server() as server, ConnectionPool() as pool:
        with anyio.fail_after(3), pytest.raises(TransportError):
            await pool.request(server.addr, OP, {"garbage": True})
        frame = await pool.request(server.addr, OP, {"n": 5})
        assert frame.header["echo"] == 5
        assert server.connections == 2


@pytest.mark.anyio
async def test_refused_connection_is_retriable_and_unsent(free_tcp_port: int) -> None:
    async with ConnectionPool() as pool:
        with pytest.raises(TransportError) as info:
            await pool.request(f"127.0.0.1:{free_tcp_port}", OP, {})
        assert info.value.retriable and not info.value.sent
        assert info.value.code == Code.UNAVAILABLE  # "connection refused" is no timeout


@pytest.mark.anyio
async def test_leaving_the_pool_stops_readers_and_fails_waiters(anyio_backend: str) -> None:
    before = _tasks(anyio_backend)
    async with frame_server() as server:
        errors: list[BaseException] = []
        with anyio.fail_after(3):
            async with anyio.create_task_group() as tg:
                async with ConnectionPool() as pool:

                    async def hang() -> None:
                        try:
                            await pool.request(server.addr, OP, {"delay": 30}, timeout=60)
                        except RequestError as exc:
                            errors.append(exc)

                    await pool.request(server.addr, OP, {"n": 1})
                    tg.start_soon(hang)
                    await anyio.sleep(0.05)
        assert len(errors) == 1 and isinstance(errors[0], TransportError)
        with pytest.raises(ClientClosedError):
            await pool.request(server.addr, OP, {})
    if before is not None:
        await anyio.sleep(0.01)
        assert _tasks(anyio_backend) == before


def _tasks(backend: str) -> set[Any] | None:
    if backend != "asyncio":
        return None  # trio's nurseries make a leak impossible by construction
    import asyncio

    return set(asyncio.all_tasks())


@pytest.mark.anyio
async def test_a_request_over_the_frame_limit_is_refused_before_sending() -> None:
    async with frame_server() as server, ConnectionPool(max_frame=1 << 16) as pool:
        with pytest.raises(RequestError) as info:
            await pool.request(server.addr, OP, {}, b"x" * (1 << 16))
        assert info.value.code == Code.FRAME_TOO_LARGE and not info.value.retriable
        assert "nothing was sent" in info.value.message
        assert server.requests == 0
        frame = await pool.request(server.addr, OP, {"n": 1}, b"x" * 100)  # still usable
        assert frame.header["echo"] == 1
