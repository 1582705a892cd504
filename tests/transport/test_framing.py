"""The coalescing answer writer (`transport.framing.FrameWriter`) and `serve_frames` over it."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from transport.framing import Caller, FrameWriter, read_some, serve_frames
from wire.protocol import MAX_HEADER, Code, Frame, FrameDecoder, HeaderTooLarge, encode_frame


class RecordingStream(trio.abc.SendStream):
    """Records each `send_all`; a write can be held until `release()`, or made to fail."""

    def __init__(self, *, hold: bool = False, fail: bool = False) -> None:
        self.writes: list[bytes] = []
        self.hold = hold
        self.fail = fail
        self.in_write = False
        self._gate = trio.Event()
        self.closed = False

    def release(self) -> None:
        self.hold = False
        self._gate.set()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.in_write = True
        try:
            if self.hold:
                await self._gate.wait()
            else:
                await trio.lowlevel.checkpoint()
            if self.fail:
                raise trio.BrokenResourceError("peer reset")
            self.writes.append(bytes(data))
        finally:
            self.in_write = False

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()


def frames_of(data: bytes) -> list[Frame]:
    dec = FrameDecoder()
    dec.feed(data)
    out = []
    while (f := dec.next_frame()) is not None:
        out.append(f)
    assert dec.buffered == 0, "a frame was cut"
    return out


def test_answers_queued_in_one_turn_share_one_write() -> None:
    async def main() -> None:
        stream = RecordingStream()
        out = FrameWriter(stream)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(out.run)
            for i in range(5):
                await out.send({"id": i, "code": 0}, bytes([i]) * (i * 100))
            await out.drain()
            nursery.cancel_scope.cancel()
        assert len(stream.writes) == 1
        frames = frames_of(stream.writes[0])
        assert [f.header["id"] for f in frames] == [0, 1, 2, 3, 4]
        assert [f.body for f in frames] == [bytes([i]) * (i * 100) for i in range(5)]
        assert out.pending == 0

    trio.run(main)


def test_answers_finished_during_a_write_go_in_the_next_one() -> None:
    async def main() -> None:
        stream = RecordingStream(hold=True)
        out = FrameWriter(stream)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(out.run)
            await out.send({"id": 1})
            await trio.testing.wait_all_tasks_blocked()
            assert stream.in_write
            for i in range(2, 6):  # separate tasks, finishing while the first write waits
                nursery.start_soon(out.send, {"id": i}, b"body")
            await trio.testing.wait_all_tasks_blocked()
            stream.release()
            await out.drain()
            nursery.cancel_scope.cancel()
        assert len(stream.writes) == 2
        assert [f.header["id"] for f in frames_of(stream.writes[0])] == [1]
        assert sorted(f.header["id"] for f in frames_of(stream.writes[1])) == [2, 3, 4, 5]
        assert all(f.body == b"body" for f in frames_of(stream.writes[1]))

    trio.run(main)


def test_senders_wait_beyond_the_pending_cap() -> None:
    async def main() -> None:
        stream = RecordingStream(hold=True)
        frame_len = len(encode_frame({"id": 0}, b"x" * 100))
        out = FrameWriter(stream, max_pending=2 * frame_len)
        sent: list[int] = []

        async def send(i: int) -> None:
            await out.send({"id": i}, b"x" * 100)
            sent.append(i)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(out.run)
            for i in range(5):
                nursery.start_soon(send, i)
                await trio.testing.wait_all_tasks_blocked()
            # the first frame is being written, one more fits under the cap, the rest wait
            assert sent == [0, 1]
            assert out.pending == 2 * frame_len
            stream.release()
            # a waiting sender queues its frame only once it runs again: drain until all did
            with trio.fail_after(5):
                while len(sent) < 5:
                    await out.drain()
                    await trio.testing.wait_all_tasks_blocked()
            assert sorted(sent) == [0, 1, 2, 3, 4]
            nursery.cancel_scope.cancel()
        got = [f.header["id"] for w in stream.writes for f in frames_of(w)]
        assert sorted(got) == [0, 1, 2, 3, 4]

    trio.run(main)


def test_a_failed_write_fails_the_writer_and_every_sender() -> None:
    async def main() -> None:
        stream = RecordingStream(hold=True, fail=True)
        out = FrameWriter(stream, max_pending=1)
        errors: list[type[BaseException]] = []

        async def send(i: int) -> None:
            try:
                await out.send({"id": i})
            except trio.BrokenResourceError as exc:
                errors.append(type(exc))

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:  # run() returns by itself
                nursery.start_soon(out.run)
                await out.send({"id": 0})
                nursery.start_soon(send, 1)  # waits: over the cap
                await trio.testing.wait_all_tasks_blocked()
                assert errors == []
                stream.release()
        assert errors == [trio.BrokenResourceError]
        with pytest.raises(trio.BrokenResourceError):
            await out.send({"id": 2})
        with pytest.raises(trio.BrokenResourceError):
            await out.drain()

    trio.run(main)


class QuietReceive(trio.abc.ReceiveStream):
    """A peer that sends the given bytes, then nothing, and never closes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.closed = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.data:
            data, self.data = self.data, b""
            await trio.lowlevel.checkpoint()
            return data
        await trio.sleep_forever()
        raise AssertionError

    async def aclose(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()


async def echo(_caller: Caller, frame: Frame) -> tuple[dict[str, Any], bytes]:
    await trio.sleep(0.01 * (5 - frame.header["id"]))  # later requests finish first
    return {"code": 0}, frame.body


def test_serve_frames_answers_pipelined_requests_whole_and_by_id() -> None:
    async def main() -> None:
        requests = b"".join(encode_frame({"op": 1, "id": i}, b"p%d" % i) for i in range(6))
        send = RecordingStream()
        recv = QuietReceive(requests)
        with trio.move_on_after(1):
            await serve_frames(trio.StapledStream(send, recv), echo)
        frames = frames_of(b"".join(send.writes))
        assert sorted(f.header["id"] for f in frames) == list(range(6))
        assert all(f.body == b"p%d" % f.header["id"] for f in frames)
        assert send.closed

    trio.run(main)


def test_serve_frames_a_failed_write_ends_only_that_connection() -> None:
    async def main() -> None:
        send = RecordingStream(fail=True)
        recv = QuietReceive(encode_frame({"op": 1, "id": 5}, b"x"))
        with trio.fail_after(5):  # the reader alone would wait forever on the quiet peer
            await serve_frames(trio.StapledStream(send, recv), echo)
        assert send.closed and recv.closed
        assert send.writes == []

    trio.run(main)


# ------------------------------------------------------------------ on a real socket


def _socket_streams() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


def _readable(sock: trio.socket.SocketType) -> bytes:
    """What the socket holds now, without waiting."""
    out = b""
    while True:
        try:
            chunk = sock._sock.recv(1 << 20)  # noqa: SLF001 - a non-blocking read, no task switch
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def test_an_answer_on_an_idle_socket_is_written_at_once() -> None:
    async def main() -> None:
        a, b = _socket_streams()
        w = FrameWriter(a)  # no writer task running: only the direct write can deliver
        await w.send({"id": 1}, b"hello")
        assert w.pending == 0
        (f,) = frames_of(_readable(b.socket))
        assert f.header == {"id": 1} and f.body == b"hello"

    trio.run(main)


def test_a_socket_that_takes_part_of_a_frame_keeps_frames_whole_and_in_order() -> None:
    """A frame larger than the socket buffer is written partly at once and the rest by the
    writer task; answers meanwhile wait behind it (never written into its middle)."""

    async def main() -> None:
        a, b = _socket_streams()
        big = bytes(range(256)) * 16384  # 4 MiB: more than any socket buffer takes at once
        w = FrameWriter(a, max_pending=1 << 30)
        received = bytearray()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.run)
            await w.send({"id": 1}, big)
            assert w.pending > 0  # the rest waits for the writer
            await trio.testing.wait_all_tasks_blocked()  # the writer is stuck in its send_all
            received += _readable(b.socket)  # room again, before the writer task runs
            for i in range(2, 12):
                await w.send({"id": i}, b"small %d" % i)
            total = len(encode_frame({"id": 1}, big)) + sum(
                len(encode_frame({"id": i}, b"small %d" % i)) for i in range(2, 12))
            while len(received) < total:
                received += await b.receive_some(1 << 20)
            nursery.cancel_scope.cancel()
        frames = frames_of(bytes(received))
        assert [f.header["id"] for f in frames] == list(range(1, 12))
        assert frames[0].body == big
        assert [f.body for f in frames[1:]] == [b"small %d" % i for i in range(2, 12)]

    trio.run(main)



def test_read_some_takes_what_is_there_without_a_scheduling_round() -> None:
    async def main() -> None:
        a, b = _socket_streams()
        await b.send_all(b"hello")
        with trio.CancelScope() as scope:
            scope.cancel()  # any checkpoint inside would raise Cancelled here
            data = await read_some(a, 1024)
        assert data == b"hello" and not scope.cancelled_caught

    trio.run(main)


def test_read_some_never_drops_a_full_read_on_cancellation() -> None:
    async def main() -> None:
        a, b = _socket_streams()
        await b.send_all(b"x" * 100)
        with trio.CancelScope() as scope:
            scope.cancel()
            data = await read_some(a, 100)  # full: it yields, but keeps what it read
        assert data == b"x" * 100

    trio.run(main)


def test_read_some_waits_for_data_and_reports_the_end() -> None:
    async def main() -> None:
        a, b = _socket_streams()
        got: list[bytes | bytearray] = []
        async with trio.open_nursery() as nursery:
            async def reader() -> None:
                got.append(await read_some(a, 1024))
                got.append(await read_some(a, 1024))
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            await b.send_all(b"late")
            await trio.testing.wait_all_tasks_blocked()
            assert got == [b"late"]
            await b.send_eof()
        assert got == [b"late", b""]
        await a.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await read_some(a, 1024)

    trio.run(main)


def test_an_answer_whose_header_no_reader_takes_becomes_an_error_and_the_rest_flow() -> None:
    """A handler that builds an answer header over MAX_HEADER (rows in the header) gets an
    INTERNAL error sent in its place: the client's reader would refuse the frame and close
    the connection, failing every other request on it."""

    async def lists(caller: Caller, frame: Frame) -> tuple[dict[str, Any], bytes]:
        await trio.lowlevel.checkpoint()
        if frame.header["id"] == 1:
            return {"code": 0, "rows": ["x" * 100] * (MAX_HEADER // 100 + 10)}, b""
        return {"code": 0}, frame.body

    async def main() -> None:
        requests = b"".join(encode_frame({"op": 1, "id": i}, b"p%d" % i) for i in range(3))
        send = RecordingStream()
        with trio.move_on_after(1):
            await serve_frames(trio.StapledStream(send, QuietReceive(requests)), lists)
        frames = {f.header["id"]: f for f in frames_of(b"".join(send.writes))}
        assert sorted(frames) == [0, 1, 2]
        assert frames[1].header["code"] == Code.INTERNAL
        assert "exceeds the limit" in frames[1].header["msg"]
        assert frames[0].header["code"] == frames[2].header["code"] == 0

    trio.run(main)


def test_a_header_over_the_limit_is_never_encoded() -> None:
    with pytest.raises(HeaderTooLarge):
        encode_frame({"op": 1, "rows": ["x" * 100] * (MAX_HEADER // 100 + 10)})
