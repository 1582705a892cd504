"""The connection budget (`transport.budget`) in `serve_frames`, on memory streams with a
mock clock: a frame started must finish in time (however slowly its bytes trickle), an
idle connection is closed but not one with a request in flight, a login is due within
its deadline and frames before it are small; the header-gated frame limit the name server
uses (`FrameDecoder.small_frame`); a pool of request bytes shared by connections."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from transport.budget import Budget, BytePool
from transport.framing import Caller, Response, serve_frames
from wire.protocol import Code, Frame, FrameDecoder, Op, ProtocolError, RequestError, encode_frame


async def _ok(_caller: Caller, frame: Frame) -> Response:
    return {"code": 0}, b""


async def _until_closed(client: trio.abc.Stream) -> list[dict[str, object]]:
    """Every frame the server sends until it closes the stream."""
    dec, headers = FrameDecoder(1 << 20), []
    while True:
        data = await client.receive_some(65536)
        if not data:
            return headers
        dec.feed(data)
        while (f := dec.next_frame()) is not None:
            headers.append(f.header)


def _run(main: object) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


def test_a_half_sent_frame_is_dropped_at_its_deadline_with_the_connection() -> None:
    async def main() -> None:
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_frames(server, _ok, caller=Caller("t"),
                                                    budget=Budget(frame_timeout=5)))
            await client.send_all(encode_frame({"op": 90, "id": 1}))  # a whole one: served
            data = encode_frame({"op": 90, "id": 2}, b"x" * 100_000)
            await client.send_all(data[:-3])  # all but the last bytes, never sent
            start = trio.current_time()
            headers = await _until_closed(client)
            assert [h.get("id") for h in headers] == [1, 0]
            assert headers[1]["code"] == Code.TIMEOUT
            assert "not completed within 5 s" in str(headers[1]["msg"])
            assert trio.current_time() - start == pytest.approx(5, abs=0.1)

    _run(main)


def test_a_frame_trickling_one_byte_at_a_time_meets_the_same_deadline() -> None:
    async def main() -> None:
        client, server = trio.testing.memory_stream_pair()
        closed = trio.Event()

        async def serve() -> None:
            await serve_frames(server, _ok, caller=Caller("t"),
                               budget=Budget(frame_timeout=30, idle_timeout=600))
            closed.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            data = encode_frame({"op": 90, "id": 1}, b"x" * 1000)
            sent = 0
            while not closed.is_set() and sent < len(data):  # a byte every 5 s
                await client.send_all(data[sent:sent + 1])
                sent += 1
                await trio.sleep(5)
            assert closed.is_set() and sent < len(data)
            assert trio.current_time() <= 40
            nursery.cancel_scope.cancel()

    _run(main)


def test_idle_connections_close_but_not_while_a_request_runs() -> None:
    async def slow(_caller: Caller, frame: Frame) -> Response:
        await trio.sleep(100)  # a long poll, 10 times the idle timeout
        return {"code": 0}, b""

    async def main() -> None:
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_frames(server, slow, caller=Caller("t"),
                                                    budget=Budget(idle_timeout=10)))
            await client.send_all(encode_frame({"op": 90, "id": 1}))
            start = trio.current_time()
            headers = await _until_closed(client)
            assert [h.get("id") for h in headers] == [1, 0]  # answered, then idle, closed
            assert headers[1]["code"] == Code.TIMEOUT and "idle for 10 s" in str(headers[1]["msg"])
            assert trio.current_time() - start == pytest.approx(110, abs=0.1)

    _run(main)


def test_before_a_login_frames_are_small_and_the_login_is_due() -> None:
    async def login(caller: Caller, frame: Frame) -> Response:
        if frame.header["op"] == Op.AUTH:
            caller.log_in("alice")
        return {"code": 0}, b""

    budget = Budget(login_timeout=10, login_max_frame=4096)

    async def main() -> None:
        # a large frame before the login: refused at its length, nothing buffered
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_frames(server, login, caller=Caller("t"),
                                                    budget=budget))
            await client.send_all(encode_frame({"op": 90, "id": 1}, b"x" * 8192)[:100])
            headers = await _until_closed(client)
            assert headers[0]["code"] == Code.FRAME_TOO_LARGE
        # no login at all: closed at the deadline
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_frames(server, login, caller=Caller("t"),
                                                    budget=budget))
            await client.send_all(encode_frame({"op": 90, "id": 1}))
            headers = await _until_closed(client)
            assert headers[-1]["code"] == Code.TIMEOUT
            assert "no login within 10 s" in str(headers[-1]["msg"])
        # logged in: full frames, no login deadline
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_frames(server, login, caller=Caller("t"),
                                                    budget=budget))
            await client.send_all(encode_frame({"op": int(Op.AUTH), "id": 1}))
            dec = FrameDecoder()
            while dec.next_frame() is None:
                dec.feed(await client.receive_some(65536))
            await trio.sleep(60)
            await client.send_all(encode_frame({"op": 90, "id": 2}, b"x" * 100_000))
            while (f := dec.next_frame()) is None:
                dec.feed(await client.receive_some(65536))
            assert f.header == {"code": 0, "id": 2}
            nursery.cancel_scope.cancel()

    _run(main)


def test_a_refused_login_hook_leaves_the_caller_logged_out() -> None:
    caller = Caller("t")

    def full(_user: str) -> None:
        raise RequestError(Code.BUSY, "no room")

    caller.on_login(full)
    with pytest.raises(RequestError):
        caller.log_in("alice")
    assert caller.principal is None


def test_a_frame_over_the_small_limit_needs_a_header_allowed_to_be_large() -> None:
    dec = FrameDecoder(64 << 20, small_frame=1024, large_ok=lambda h: h.get("op") == 1)
    big = encode_frame({"op": 2, "id": 1}, b"x" * 5000)
    dec.feed(big[:64])  # the header is in, the rest not: refused already
    with pytest.raises(ProtocolError) as info:
        dec.next_frame()
    assert info.value.code == Code.FRAME_TOO_LARGE
    dec = FrameDecoder(64 << 20, small_frame=1024, large_ok=lambda h: h.get("op") == 1)
    ok = encode_frame({"op": 1, "id": 1}, b"x" * 5000)
    small = encode_frame({"op": 2, "id": 2}, b"y" * 10)
    for i in range(0, len(ok), 700):
        dec.feed(ok[i:i + 700])
        frame = dec.next_frame()
    assert frame is not None and frame.body == b"x" * 5000
    dec.feed(small + big)
    assert dec.next_frame() is not None  # small frames of any op pass
    with pytest.raises(ProtocolError):
        dec.next_frame()


def test_a_users_connections_share_one_pool_of_request_bytes() -> None:
    async def main() -> None:
        pool = BytePool(1000)
        pool.take(1500)  # one request larger than the pool runs, alone
        waited = trio.Event()

        async def second() -> None:
            await pool.wait_room()
            waited.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            assert not waited.is_set()
            pool.give(1500)
            await waited.wait()

    _run(main)


def test_connections_sharing_a_pool_read_large_frames_only_as_they_fit() -> None:
    """Two connections send 100 kB frames into a shared pool of 150 kB: the second is not
    read past its first bytes until the first one's request ends (its wait, longer than
    the frame deadline, is the server's and does not count); a connection closed inside
    a frame gives back what was set aside for it."""
    pool = BytePool(150_000)
    done: list[int] = []

    async def slow(_caller: Caller, frame: Frame) -> Response:
        await trio.sleep(20)
        done.append(int(frame.header["id"]))
        return {"code": 0}, b""

    async def main() -> None:
        budget = Budget(frame_timeout=5)
        async with trio.open_nursery() as nursery:
            streams = [trio.testing.memory_stream_pair() for _ in range(3)]
            for i, (_client, server) in enumerate(streams):
                nursery.start_soon(lambda s=server, i=i: serve_frames(
                    s, slow, caller=Caller(f"c{i}"), budget=budget,
                    frame_pool_of=lambda _c: pool))
            a, b, c = (client for client, _ in streams)
            frame_a = encode_frame({"op": 90, "id": 1}, bytes(100_000))
            await a.send_all(frame_a)
            await trio.testing.wait_all_tasks_blocked()
            assert pool.held == 100_000  # its body, while its request runs
            await b.send_all(encode_frame({"op": 90, "id": 2}, bytes(100_000)))
            await trio.testing.wait_all_tasks_blocked()
            assert pool.held == 100_000  # b is not read on: both would not fit
            assert (await _first_answer(a))["id"] == 1  # at t = 20
            assert (await _first_answer(b))["id"] == 2  # read then, answered at 40
            assert done == [1, 2] and pool.held == 0
            await c.send_all(encode_frame({"op": 90, "id": 3}, bytes(100_000))[:-1])
            await trio.testing.wait_all_tasks_blocked()
            assert pool.held > 100_000  # its frame, set aside whole
            headers = await _until_closed(c)
            assert headers[-1]["code"] == Code.TIMEOUT and pool.held == 0
            nursery.cancel_scope.cancel()

    _run(main)


async def _first_answer(client: trio.abc.Stream) -> dict[str, object]:
    dec = FrameDecoder(1 << 20)
    while (f := dec.next_frame()) is None:
        dec.feed(await client.receive_some(65536))
    return f.header


def test_a_large_frame_whose_prefix_arrives_in_pieces_is_read_whole() -> None:
    """The length prefix of a large frame split over reads (4 to 7 bytes in first) once
    broke the memory reservation; every split point now sets the frame aside once and
    answers it."""
    pool = BytePool(1 << 20)
    frame = encode_frame({"op": 90, "id": 7}, bytes(100_000))

    async def main() -> None:
        for cut in range(1, 9):
            client, server = trio.testing.memory_stream_pair()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda s=server: serve_frames(
                    s, _ok, caller=Caller("c"), budget=Budget(frame_timeout=5),
                    frame_pool_of=lambda _c: pool))
                await client.send_all(frame[:cut])
                await trio.testing.wait_all_tasks_blocked()
                await client.send_all(frame[cut:])
                assert (await _first_answer(client))["code"] == 0
                nursery.cancel_scope.cancel()
        assert pool.held == 0

    _run(main)


@pytest.mark.parametrize("have", range(9))
def test_the_pending_frame_size_is_known_once_its_length_is_in(have: int) -> None:
    frame = encode_frame({"op": 90}, bytes(1000))
    dec = FrameDecoder(1 << 20)
    dec.feed(frame[:have])
    assert dec.pending_frame() == (None if have < 4 else len(frame))
