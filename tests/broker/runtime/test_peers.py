"""Peer links: what is queued for a peer, what is too large to send at all, and how a
lost link reaches the groups."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
import trio
import trio.testing
import trustme

from broker.runtime.peers import PeerLinks, _take_chunk
from chaos.proxy import Proxy
from raftlog.types import Membership, Message, MsgType, Role
from raftlog.wire import WireError, message_from_wire, message_to_wire
from raftmq.localcluster import free_ports
from tests.raft_harness import Cluster
from transport.framing import FrameStream
from transport.peerauth import PeerRefused, accept_peer
from transport.tls import accept_tls, connect_tls
from wire.protocol import FrameDecoder

SECRET = b"a secret of the test cluster"


async def _tls_socket_pair() -> tuple[trio.abc.Stream, trio.abc.Stream]:
    """Two ends of a socketpair with TLS done (the streams a node's peer links get)."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    a, b = trio.socket.socketpair()
    out: list[trio.abc.Stream] = []

    async def serve() -> None:
        out.append(await accept_tls(trio.SocketStream(b), server))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        ours = await connect_tls(trio.SocketStream(a), client, "127.0.0.1")
    return ours, out[0]


def _attached(stream: Any) -> tuple[PeerLinks, Any]:
    """Links of node 1 whose link to node 2 runs over `stream`."""
    links = PeerLinks(1, {1: "127.0.0.1:1", 2: "127.0.0.1:2"}, lambda g, m: None,
                      max_frame=64 << 20, secret=SECRET)
    link: Any = links._links[2]
    link.attach(stream)
    return links, link


def _big_snapshot() -> Message:
    """A 4 MiB snapshot message: more than a socket takes at once."""
    return Message(MsgType.SNAPSHOT, 1, 2, 3, log_index=9, log_term=3,
                   snapshot=bytes(range(256)) * 16384, membership=Membership(frozenset({1, 2})))


def _assert_big_among_heartbeats(got: list[Message], big: Message) -> None:
    """What the write tests send arrived whole and in order: heartbeat 1, the big
    snapshot, heartbeats 2-11."""
    heartbeat, snapshot = MsgType.HEARTBEAT, MsgType.SNAPSHOT
    assert [m.type for m in got] == [heartbeat, snapshot] + [heartbeat] * 10
    assert got[1].snapshot == big.snapshot
    assert [m.commit for m in got[2:]] == list(range(2, 12))


def test_over_tls_an_idle_links_messages_leave_at_once_and_a_partial_write_is_flushed() -> None:
    """TLS: an idle link's message is written by `send` itself; a message the socket took
    only part of (its ciphertext waits in the stream) is finished by the writer task, and
    later messages follow it, whole and in order."""

    async def main() -> None:
        ours, theirs = await _tls_socket_pair()
        links, link = _attached(ours)
        links.send("g", Message(MsgType.HEARTBEAT, 1, 2, 3, commit=1))
        assert not link.queue  # written without the writer task (none is running)
        big = _big_snapshot()
        got: list[Message] = []
        async with trio.open_nursery() as nursery:
            links.send("g", big)
            assert link.queue  # the rest of its ciphertext: the writer's to flush
            for commit in range(2, 12):
                links.send("g", Message(MsgType.HEARTBEAT, 1, 2, 3, commit=commit))
            nursery.start_soon(links._writer, link)
            dec = FrameDecoder(64 << 20)
            while len(got) < 12:
                dec.feed(await theirs.receive_some(1 << 20))
                while (f := dec.next_frame()) is not None:
                    got.append(message_from_wire(f.header["m"], f.body))
            nursery.cancel_scope.cancel()
        _assert_big_among_heartbeats(got, big)

    trio.run(main)


def test_a_message_over_the_peer_frame_limit_is_not_queued() -> None:
    links = PeerLinks(1, {1: "127.0.0.1:1", 2: "127.0.0.1:2"}, lambda g, m: None,
                      max_frame=4096, secret=SECRET)
    link: Any = links._links[2]
    link.stream = object()  # connected, as far as queueing goes
    small = Message(MsgType.HEARTBEAT, 1, 2, 3, commit=4)
    links.send("g", small)
    assert len(link.queue) == 1
    members = Membership(frozenset({1, 2}))
    links.send("g", Message(MsgType.SNAPSHOT, 1, 2, 3, log_index=9, log_term=3,
                            snapshot=b"x" * 1000, membership=members))
    assert len(link.queue) == 2  # a snapshot that fits travels like any message
    links.send("g", Message(MsgType.SNAPSHOT, 1, 2, 3, log_index=9, log_term=3,
                            snapshot=b"x" * 5000, membership=members))
    assert len(link.queue) == 2  # one that does not is dropped (and logged), not sent


def test_messages_on_an_idle_link_leave_at_once_and_never_inside_a_write() -> None:
    """An idle link's message is written by `send` itself; once a write is partial (the
    socket is full), later messages wait behind it for the writer task, even when the
    socket has room again before that task runs."""

    async def main() -> None:
        a, b = trio.socket.socketpair()
        ours, theirs = trio.SocketStream(a), trio.SocketStream(b)
        links, link = _attached(ours)
        links.send("g", Message(MsgType.HEARTBEAT, 1, 2, 3, commit=1))
        assert not link.queue  # written without the writer task (none is running)
        big = _big_snapshot()
        received = bytearray()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(links._writer, link)
            links.send("g", big)
            assert link.queue  # the socket took part of it: the rest is the writer's
            await trio.testing.wait_all_tasks_blocked()  # the writer waits in its send_all
            while True:  # make room without letting the writer run
                try:
                    received += b._sock.recv(1 << 20)  # noqa: SLF001 - no task switch
                except BlockingIOError:
                    break
            for commit in range(2, 12):
                links.send("g", Message(MsgType.HEARTBEAT, 1, 2, 3, commit=commit))
            dec = FrameDecoder(64 << 20)
            got: list[Message] = []
            while len(got) < 12:
                dec.feed(received)
                received = bytearray()
                while (f := dec.next_frame()) is not None:
                    got.append(message_from_wire(f.header["m"], f.body))
                if len(got) < 12:
                    received += await theirs.receive_some(1 << 20)
            nursery.cancel_scope.cancel()
        _assert_big_among_heartbeats(got, big)

    trio.run(main)


def test_redialling_a_dead_leader_through_a_proxy_does_not_hold_back_the_campaign() -> None:
    """Node 2 dials node 3 through a fault proxy. With 3 dead the proxy accepts each
    reconnect and closes it, so the loss is reported over and over (about every 50 ms);
    the follower must still campaign in its slot (second tick for rank 1), not keep
    pushing its timer off until 3 returns."""
    c = Cluster(3)
    c.campaign(3)
    assert c.leader().id == 3
    c.crash(3)
    follower = c.nodes[2]
    lost: list[int] = []

    def on_lost(peer: int) -> None:
        lost.append(peer)
        follower.leader_unreachable(peer)

    async def main() -> None:
        (dead,) = free_ports(1, "127.0.0.1")
        async with trio.open_nursery() as nursery:
            proxy = Proxy(f"127.0.0.1:{dead}")
            addr = await nursery.start(proxy.serve)
            links = PeerLinks(2, {2: "127.0.0.1:1", 3: addr}, lambda g, m: None,
                              max_frame=1 << 20, secret=SECRET, on_lost=on_lost)
            nursery.start_soon(links.run)
            with trio.move_on_after(5):
                while not lost:
                    await trio.sleep(0.01)
            for _ in range(5):  # 100 ms ticks, as a node runs them
                await trio.sleep(0.1)
                follower.tick()
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(lost) >= 3  # the loss was reported again and again
    assert follower.role == Role.PRE_CANDIDATE


async def _accepting(links: PeerLinks, secret: bytes, stream: trio.abc.Stream,
                     tls: ssl.SSLContext | None = None) -> None:
    """What a node's listener does with a connection that opens with HELLO."""
    if tls is not None:
        try:
            stream = await accept_tls(stream, tls)
        except trio.BrokenResourceError:  # a dialer that does not trust us
            return
    fs = FrameStream(stream, max_frame=1 << 20)
    hello = await fs.receive()
    assert hello is not None
    try:
        peer, _purpose = await accept_peer(fs, hello, secret, links.node_id, {1: "", 2: ""})
    except PeerRefused:
        await fs.aclose()
        return
    await links.accept(peer, stream, fs.decoder)


def _pair(dialer_secret: bytes, acceptor_secret: bytes, *, server_tls: ssl.SSLContext | None = None,
          client_tls: ssl.SSLContext | None = None) -> tuple[list[Message], list[Message]]:
    """Nodes 1 (dials) and 2 (accepts) over loopback; each sends the other one heartbeat
    for a while. Returns what 1 and 2 received."""
    got1: list[Message] = []
    got2: list[Message] = []

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        addr = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        one = PeerLinks(1, {1: "127.0.0.1:1", 2: addr}, lambda g, m: got1.append(m),
                        max_frame=1 << 20, secret=dialer_secret, ssl_context=client_tls)
        two = PeerLinks(2, {1: "127.0.0.1:1", 2: addr}, lambda g, m: got2.append(m),
                        max_frame=1 << 20, secret=acceptor_secret)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners,
                               lambda s: _accepting(two, acceptor_secret, s, server_tls),
                               listeners)
            nursery.start_soon(one.run)
            nursery.start_soon(two.run)
            with trio.move_on_after(3):
                while not (got1 and got2):
                    one.send("g", Message(MsgType.HEARTBEAT, 1, 2, 1, commit=0))
                    two.send("g", Message(MsgType.HEARTBEAT, 2, 1, 1, commit=0))
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return got1, got2


def test_peers_that_share_the_secret_link_up_both_ways() -> None:
    got1, got2 = _pair(SECRET, SECRET)
    assert got1 and got2
    assert {m.src for m in got1} == {2} and {m.src for m in got2} == {1}


def test_peers_with_different_secrets_never_exchange_a_message() -> None:
    got1, got2 = _pair(SECRET, b"another cluster's secret")
    assert got1 == [] and got2 == []


def _node_tls(ca: trustme.CA, node: int) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Node `node`'s listening and dialing contexts (mutual TLS, as `transport.tls` makes
    them), with a certificate whose subject names the node (`raftmq-n<id>`)."""
    cert = ca.issue_cert("127.0.0.1", common_name=f"raftmq-n{node}")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server)
    ca.configure_trust(server)
    server.verify_mode = ssl.CERT_OPTIONAL
    client = ssl.create_default_context()
    ca.configure_trust(client)
    cert.configure_cert(client)
    return server, client


def test_peer_links_run_over_tls_when_given_a_context() -> None:
    ca = trustme.CA()
    server, _ = _node_tls(ca, 2)
    _, client = _node_tls(ca, 1)
    got1, got2 = _pair(SECRET, SECRET, server_tls=server, client_tls=client)
    assert got1 and got2
    stranger = ssl.create_default_context()  # trusts no certificate of ours
    got1, got2 = _pair(SECRET, SECRET, server_tls=server, client_tls=stranger)
    assert got1 == [] and got2 == []


def test_a_snapshot_larger_than_a_frame_arrives_whole_in_chunks_between_heartbeats() -> None:
    """Chunked InstallSnapshot at the link: a snapshot five times the frame limit leaves
    in chunks, heartbeats of the same link pass between them, a retry of the same
    snapshot while it is under way does not start a second transfer over it, and the
    receiver hands over one SNAPSHOT message, byte for byte the one sent."""
    got: list[Message] = []
    members = Membership(frozenset({1, 2}), frozenset({3}))
    data = bytes(range(256)) * (5 * 4096 + 7)  # ~5 MiB, not a multiple of a chunk
    snap = Message(MsgType.SNAPSHOT, 1, 2, 7, log_index=900, log_term=6, commit=880,
                   hint_index=400, hint_term=5, snapshot=data, membership=members)
    sent: list[int] = []
    retried: list[int] = []

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        addr = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        one = PeerLinks(1, {1: "127.0.0.1:1", 2: addr}, lambda g, m: None,
                        max_frame=1 << 20, secret=SECRET)
        two = PeerLinks(2, {1: "127.0.0.1:1", 2: addr}, lambda g, m: got.append(m),
                        max_frame=1 << 20, secret=SECRET)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners,
                               lambda s: _accepting(two, SECRET, s, None), listeners)
            nursery.start_soon(one.run)
            nursery.start_soon(two.run)
            while not got:
                one.send("g", Message(MsgType.HEARTBEAT, 1, 2, 7, commit=0))
                await trio.sleep(0.01)
            assert len(data) > 4 * (1 << 20) and one.chunk_bytes <= 1 << 19
            one.send("g", snap)  # too large for one frame: `send` alone drops it
            done = trio.Event()

            async def send(to: list[int]) -> None:
                to.append(await one.send_snapshot("g", snap))
                if len(sent) + len(retried) == 2:
                    done.set()

            nursery.start_soon(send, sent)
            while not one._transfers:  # under way
                await trio.sleep(0)
            nursery.start_soon(send, retried)  # the core's retry meanwhile
            while not any(m.type == MsgType.SNAPSHOT for m in got):
                one.send("g", Message(MsgType.HEARTBEAT, 1, 2, 7, commit=1))
                await trio.sleep(0)
            await done.wait()
            nursery.cancel_scope.cancel()

    trio.run(main)
    snaps = [i for i, m in enumerate(got) if m.type == MsgType.SNAPSHOT]
    assert len(snaps) == 1 and got[snaps[0]] == snap
    beats = [m.commit for m in got[: snaps[0]] if m.type == MsgType.HEARTBEAT]
    assert 1 in beats  # heartbeats sent after the first chunk arrived before the last
    assert sent == [len(data)] and retried == [0]  # one transfer, sent once


def test_a_chunk_that_does_not_continue_its_transfer_ends_it() -> None:
    members = Membership(frozenset({1, 2}))
    m = Message(MsgType.SNAPSHOT, 1, 2, 3, log_index=9, log_term=3, snapshot=b"abcdef",
                membership=members)
    fields, _ = message_to_wire(m)

    def chunk(off: int, total: int = 6) -> dict[str, Any]:
        return {"op": 2, "g": "g", "m": fields, "off": off, "total": total}

    transfers: dict[str, Any] = {}
    assert _take_chunk(transfers, 1, chunk(0), b"ab") is None
    assert _take_chunk(transfers, 1, chunk(4), b"ef") is None  # "cd" was lost
    assert transfers == {}
    assert _take_chunk(transfers, 1, chunk(2), b"cd") is None  # nothing to continue
    assert _take_chunk(transfers, 1, chunk(0), b"abc") is None
    whole = _take_chunk(transfers, 1, chunk(3), b"def")
    assert whole == b"abcdef" and transfers == {}
    assert message_from_wire(fields, whole) == m
    for off, body, total in ((6, b"x", 6), (0, b"", 6), (5, b"xy", 6), (-1, b"x", 6),
                             (0, b"x", 1 << 41)):
        with pytest.raises(WireError):
            _take_chunk(transfers, 1, chunk(off, total), body)


def test_a_peer_certificate_naming_another_node_never_links() -> None:
    """Node 1 dialing with node 3's certificate (the secret is right), or node 2
    answering with node 3's: no message passes either way."""
    ca = trustme.CA()
    server2, _ = _node_tls(ca, 2)
    server3, client3 = _node_tls(ca, 3)
    _, client1 = _node_tls(ca, 1)
    for server, client in ((server2, client3), (server3, client1)):
        got1, got2 = _pair(SECRET, SECRET, server_tls=server, client_tls=client)
        assert got1 == [] and got2 == []
