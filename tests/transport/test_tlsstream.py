"""`transport.tlsstream.TlsStream`: TLS over a socket with the plain transport's shortcuts
(a frame written without waiting, buffered records read without a scheduling round),
and the same guarantees as `trio.SSLStream`: bytes whole and in order, certificates
checked, a cut connection told from a clean close."""

from __future__ import annotations

import socket
import ssl

import pytest
import trio
import trio.testing
import trustme

from transport.framing import FrameWriter, read_some, unflushed, write_now
from transport.peerauth import certificate_node
from transport.tls import accept_tls, connect_tls, is_tls, peer_certificate
from transport.tlsstream import TlsStream
from wire.protocol import FrameDecoder, encode_frame


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _contexts(ca: trustme.CA, *, client_cert: bool = False) -> tuple[ssl.SSLContext,
                                                                     ssl.SSLContext]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca.configure_trust(server)
    server.verify_mode = ssl.CERT_OPTIONAL
    client = ssl.create_default_context()
    ca.configure_trust(client)
    if client_cert:
        ca.issue_cert("raftmq-n2", common_name="raftmq-n2").configure_cert(client)
    return server, client


async def _pair(ca: trustme.CA, *, small_buffers: bool = False, client_cert: bool = False,
                ) -> tuple[TlsStream, TlsStream]:
    """A connected client and server `TlsStream`, handshake done (over a socketpair)."""
    a, b = trio.socket.socketpair()
    if small_buffers:
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    server_ctx, client_ctx = _contexts(ca, client_cert=client_cert)
    out: dict[str, trio.abc.Stream] = {}

    async def serve() -> None:
        out["server"] = await accept_tls(trio.SocketStream(b), server_ctx)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        out["client"] = await connect_tls(trio.SocketStream(a), client_ctx, "127.0.0.1")
    client, server = out["client"], out["server"]
    assert isinstance(client, TlsStream) and isinstance(server, TlsStream)
    return client, server


async def _read_exactly(stream: TlsStream, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        data = await read_some(stream, 1 << 16)
        assert data, "the stream ended early"
        got += data
    return bytes(got)


def test_a_socket_gets_the_fast_tls_stream_and_certificates_are_checked(ca: trustme.CA) -> None:
    async def main() -> None:
        client, server = await _pair(ca, client_cert=True)
        assert is_tls(client) and is_tls(server)
        assert client.version() in ("TLSv1.2", "TLSv1.3")
        cert = peer_certificate(server)  # what a node reads to tell which peer dialled
        assert certificate_node(cert) == 2
        assert peer_certificate(client) is not None

    trio.run(main)


def test_an_untrusted_server_fails_the_handshake(ca: trustme.CA) -> None:
    async def main() -> None:
        a, b = trio.socket.socketpair()
        server_ctx, _ = _contexts(ca)
        stranger = ssl.create_default_context()
        trustme.CA().configure_trust(stranger)  # another CA: the server is not trusted
        async with trio.open_nursery() as nursery:
            async def serve() -> None:
                with pytest.raises(trio.BrokenResourceError):
                    await accept_tls(trio.SocketStream(b), server_ctx)
            nursery.start_soon(serve)
            with pytest.raises(trio.BrokenResourceError):
                await connect_tls(trio.SocketStream(a), stranger, "127.0.0.1")
            await trio.aclose_forcefully(trio.SocketStream(a))

    trio.run(main)


def test_bytes_arrive_whole_and_in_order_both_ways_at_once(ca: trustme.CA) -> None:
    """Large writes (many records) in both directions while the other end reads."""

    async def main() -> None:
        client, server = await _pair(ca, small_buffers=True)
        up = bytes(range(256)) * 8192  # 2 MiB
        down = bytes(reversed(range(256))) * 6000
        got: dict[str, bytes] = {}

        async def read(name: str, stream: TlsStream, n: int) -> None:
            got[name] = await _read_exactly(stream, n)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, "server", server, len(up))
            nursery.start_soon(read, "client", client, len(down))
            nursery.start_soon(client.send_all, up)
            nursery.start_soon(server.send_all, down)
        assert got == {"server": up, "client": down}

    trio.run(main)


def test_a_frame_on_an_idle_stream_is_written_without_waiting(ca: trustme.CA) -> None:
    async def main() -> None:
        client, server = await _pair(ca)
        frame = encode_frame({"id": 1}, b"hello")
        with trio.CancelScope() as scope:
            scope.cancel()  # any checkpoint inside would raise Cancelled here
            assert write_now(server, frame) == len(frame)
            assert not unflushed(server)
        assert not scope.cancelled_caught
        assert await _read_exactly(client, len(frame)) == frame

    trio.run(main)


def test_an_answer_on_an_idle_tls_connection_needs_no_writer_task(ca: trustme.CA) -> None:
    async def main() -> None:
        client, server = await _pair(ca)
        w = FrameWriter(server)  # no writer task running: only the direct write can deliver
        await w.send({"id": 7}, b"answer")
        assert w.pending == 0
        dec = FrameDecoder()
        dec.feed(await read_some(client, 1 << 16))
        frame = dec.next_frame()
        assert frame is not None and frame.header == {"id": 7} and frame.body == b"answer"

    trio.run(main)


def test_ciphertext_the_socket_does_not_take_waits_in_order_for_the_next_send(
        ca: trustme.CA) -> None:
    """A frame taken by `write_now` when the socket is nearly full leaves the rest of its
    ciphertext in the stream (`unflushed`); nothing else is written before it, and an
    empty `send_all` (the writer task's turn) writes it."""

    async def main() -> None:
        client, server = await _pair(ca, small_buffers=True)
        frames = [encode_frame({"id": i}, bytes([i]) * 3000) for i in range(1, 200)]
        taken = []
        for f in frames:
            if write_now(server, f) != len(f):
                break
            taken.append(f)
            if unflushed(server):
                break
        assert unflushed(server), "the socket never filled up"
        rest = frames[len(taken):]
        assert rest and write_now(server, rest[0]) == 0  # behind the backlog: not now
        expected = b"".join(frames)
        got: list[bytes] = []

        async def reader() -> None:
            got.append(await _read_exactly(client, len(expected)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await server.send_all(b"")  # the writer's flush
            assert not unflushed(server)
            await server.send_all(b"".join(rest))
        assert got == [expected]

    trio.run(main)


def test_a_frame_writer_flushes_what_the_socket_did_not_take(ca: trustme.CA) -> None:
    """`FrameWriter`: the last frame `write_now` took with ciphertext left over still
    reaches the other end (the writer task flushes it) though nothing follows it."""

    async def main() -> None:
        client, server = await _pair(ca, small_buffers=True)
        w = FrameWriter(server, max_pending=1 << 30)
        sent = []
        for i in range(1, 200):  # no writer task yet: only direct writes
            frame = ({"id": i}, bytes([i]) * 3000)
            await w.send(*frame)
            sent.append(encode_frame(*frame))
            if unflushed(server):
                break
        assert unflushed(server), "the socket never filled up"
        expected = b"".join(sent)
        got: list[bytes] = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(w.run)
                got.append(await _read_exactly(client, len(expected)))
                nursery.cancel_scope.cancel()
        assert got == [expected]

    trio.run(main)


def test_buffered_records_are_read_without_a_scheduling_round(ca: trustme.CA) -> None:
    async def main() -> None:
        client, server = await _pair(ca)
        for i in range(3):  # three records
            assert server.write_nowait(b"record %d;" % i)
        await trio.sleep(0.05)  # (on the socket by now)
        with trio.CancelScope() as scope:
            scope.cancel()
            data = await read_some(client, 1 << 16)
        assert data == b"record 0;record 1;record 2;"  # all of them, joined
        assert not scope.cancelled_caught

    trio.run(main)


def test_a_close_notify_is_a_clean_end_and_a_cut_connection_is_broken(ca: trustme.CA) -> None:
    async def main() -> None:
        client, server = await _pair(ca)
        await server.send_all(b"last words")
        await server.aclose()  # sends close_notify
        assert await _read_exactly(client, 10) == b"last words"
        assert await client.receive_some(100) == b""
        assert await client.receive_some(100) == b""  # and stays ended
        with pytest.raises(trio.ClosedResourceError):
            await server.send_all(b"more")

        client, server = await _pair(ca)
        server.transport_stream.socket.close()  # no close_notify: a cut
        with pytest.raises(trio.BrokenResourceError):
            await client.receive_some(100)

    trio.run(main)


def test_a_second_receiver_is_refused(ca: trustme.CA) -> None:
    async def main() -> None:
        client, _server = await _pair(ca)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.receive_some, 10)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await client.receive_some(10)
            nursery.cancel_scope.cancel()

    trio.run(main)
