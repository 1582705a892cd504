"""The asyncio frame link: frames decoded in the loop's read callback, whatever the reads.

A real asyncio server on loopback writes the bytes exactly as each test wants them cut.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import pytest

from transport.connection import ConnectionPool
from transport.framelink import FrameProtocol, open_frame_link
from wire.protocol import Frame, FrameDecoder, Op, encode_frame


@asynccontextmanager
async def writer_server(
    script: Callable[[asyncio.StreamWriter], object],
) -> AsyncIterator[tuple[str, int]]:
    """A server that runs `script(writer)` (sync or async) for each connection."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        result = script(writer)
        if asyncio.iscoroutine(result):
            await result

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        host, port = server.sockets[0].getsockname()[:2]
        yield host, port
    finally:
        server.close()


class Seen:
    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.ends: list[str] = []
        self.ended = asyncio.Event()

    def frame(self, f: Frame) -> None:
        self.frames.append(f)

    def end(self, reason: str) -> None:
        self.ends.append(reason)
        self.ended.set()


async def until_the_end(host: str, port: int, max_frame: int) -> tuple[FrameProtocol, Seen]:
    """Dial, attach at once, and wait (10 s at most) until the link ends."""
    link = await open_frame_link(host, port, max_frame)
    seen = Seen()
    link.attach(seen.frame, seen.end)
    await asyncio.wait_for(seen.ended.wait(), 10)
    return link, seen


def test_frames_cut_anywhere_or_joined_arrive_whole_and_in_order() -> None:
    frames = [encode_frame({"id": i, "code": 0}, bytes([i]) * (i * 37)) for i in range(1, 40)]
    data = b"".join(frames)

    async def script(writer: asyncio.StreamWriter) -> None:
        pos = 0
        for cut in [1, 3, 1, 500, 7, 2000, 1, len(data)]:  # byte by byte, mid-header, many
            writer.write(data[pos:pos + cut])
            await writer.drain()
            await asyncio.sleep(0.005)
            pos += cut
        writer.close()

    async def main() -> None:
        async with writer_server(script) as (host, port):
            _, seen = await until_the_end(host, port, 1 << 20)
            assert [f.header["id"] for f in seen.frames] == list(range(1, 40))
            assert all(f.body == bytes([f.header["id"]]) * (f.header["id"] * 37)
                       for f in seen.frames)
            assert seen.ends == ["closed by the peer"]

    asyncio.run(main())


def test_a_frame_over_the_limit_ends_the_link_with_a_protocol_error() -> None:
    async def script(writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame({"id": 1, "code": 0}, b"ok"))
        writer.write(struct.pack(">I", 1 << 30) + b"x" * 16)  # a length no frame may have
        await writer.drain()
        await asyncio.sleep(5)  # the client hangs up, not us

    async def main() -> None:
        async with writer_server(script) as (host, port):
            link, seen = await until_the_end(host, port, 1 << 16)
            assert [f.header["id"] for f in seen.frames] == [1]
            assert len(seen.ends) == 1 and seen.ends[0].startswith("protocol error")
            with pytest.raises(anyio.BrokenResourceError):
                await link.send(encode_frame({"id": 2}))

    asyncio.run(main())


def test_frames_that_came_before_attach_are_handed_over_then() -> None:
    async def script(writer: asyncio.StreamWriter) -> None:
        writer.write(encode_frame({"id": 7, "code": 0}) + encode_frame({"id": 8, "code": 0}))
        writer.close()

    async def main() -> None:
        async with writer_server(script) as (host, port):
            link = await open_frame_link(host, port, 1 << 16)
            await asyncio.sleep(0.2)  # both frames and the end arrive before anyone listens
            seen = Seen()
            link.attach(seen.frame, seen.end)
            assert [f.header["id"] for f in seen.frames] == [7, 8]
            assert seen.ends == ["closed by the peer"]

    asyncio.run(main())


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_pool_uses_the_frame_link_on_asyncio_only(backend: str) -> None:
    """On asyncio a plain connection reads in the loop's callback (no reader task); on
    trio it keeps anyio's stream. Either way a request gets its answer."""
    async def echo(stream: anyio.abc.ByteStream) -> None:
        decoder = FrameDecoder()
        async with stream:
            try:
                while True:
                    decoder.feed(await stream.receive())
                    while (frame := decoder.next_frame()) is not None:
                        await stream.send(encode_frame({"id": frame.header["id"], "code": 0},
                                                       frame.body))
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass

    async def client() -> tuple[bytes, bool]:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, echo)
            async with ConnectionPool() as pool:
                frame = await pool.request(f"127.0.0.1:{port}", Op.PRODUCE, {}, b"payload")
                link = pool.connection(f"127.0.0.1:{port}")._link
                assert link is not None
                result = frame.body, isinstance(link.stream, FrameProtocol)
            tg.cancel_scope.cancel()
        return result

    body, framelink = anyio.run(client, backend=backend)
    assert body == b"payload"
    assert framelink == (backend == "asyncio")
