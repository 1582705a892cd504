"""Per-connection admission in `serve_frames`: no new request is read while the bodies of
those running reach `max_inflight_bytes` (a request is admitted whole); and a caller that
takes no answer bytes for `write_timeout` is disconnected."""

from __future__ import annotations

import trio
import trio.testing

from transport.framing import Caller, Response, serve_frames
from wire.protocol import Frame, FrameDecoder, encode_frame


def test_request_bytes_in_flight_stop_reading_until_one_finishes() -> None:
    seen: list[int] = []
    release = trio.Event()

    async def handler(_caller: Caller, frame: Frame) -> Response:
        seen.append(frame.header["id"])
        await release.wait()
        return {"code": 0}, b""

    async def main() -> None:
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_frames(server, handler, max_inflight_bytes=1024,
                                                    caller=Caller("test")))
            for i in (1, 2, 3):
                await client.send_all(encode_frame({"op": 90, "id": i}, b"x" * 600))
            await trio.testing.wait_all_tasks_blocked()
            # 1200 bytes running: the third waits unread (the first two start in either
            # order: trio runs tasks woken together in an order of its own)
            assert sorted(seen) == [1, 2]
            release.set()
            dec, answers = FrameDecoder(1 << 20), 0
            while answers < 3:
                dec.feed(await client.receive_some(65536))
                while dec.next_frame() is not None:
                    answers += 1
            assert sorted(seen) == [1, 2, 3] and seen[2] == 3
            await client.aclose()

    trio.run(main)


def test_a_caller_that_reads_nothing_is_dropped_after_the_write_timeout() -> None:
    async def handler(_caller: Caller, frame: Frame) -> Response:
        return {"code": 0}, b"y" * 65536

    async def main() -> None:
        client, server = trio.testing.lockstep_stream_pair()  # no buffer at all
        done = trio.Event()

        async def serve() -> None:
            await serve_frames(server, handler, write_timeout=0.2, caller=Caller("test"))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            await client.send_all(encode_frame({"op": 90, "id": 1}))
            with trio.fail_after(30):  # the serving loop ends by itself, the answer unread
                await done.wait()
            await client.aclose()

    trio.run(main)
