"""Raft traffic between nodes: one TCP connection per node pair carries every group.

The node with the lower id dials, the other accepts (its listener hands the stream over
once the peer handshake proved the dialer knows the cluster secret, see
`transport.peerauth`), and both directions share that connection. The dialer checks the
acceptor the same way, so neither end takes Raft messages from anyone but a peer.
Messages are queued per peer and written in batches, so a burst of appends for many
groups costs one `send_all`; a message finding its link idle (nothing queued or being
written) is written at once, when the socket takes it whole, sparing the writer task's
turn on the way of every append and acknowledgement. While a link is down its queue is
dropped: Raft repeats whatever matters (heartbeats, appends after a reject), and old
messages would only be stale.

When an established connection ends (the peer closed it, reset it, or a write failed:
a peer process killed with SIGKILL has its sockets closed by the kernel at once), or a
dialled one is closed before the handshake completes (a dead peer behind a proxy),
`on_lost(peer)` is called, so the groups it led can elect a new leader without waiting
out the election timeout. A quiet link never counts as lost; nor does a connection the
peer replaced with a newer one.

Frames on a peer link are bounded like a client's (`max_frame`). A Raft snapshot that
does not fit in one frame travels in chunks (`send_snapshot`, the thesis' chunked
InstallSnapshot: each chunk a frame with the message's fields, its byte offset `off` and
the snapshot's size `total`), written one after another as the link drains, with other
groups' messages and heartbeats between them. The receiver appends each chunk to the
transfer it continues and hands the core the whole message once the last byte arrived:
the sans-I/O core sees one SNAPSHOT as before. A chunk that does not continue the
transfer in progress (a chunk the sender's full queue dropped, a new snapshot) ends
that transfer; the connection's end ends every one. The core resends a snapshot nobody
acknowledged, so a transfer cut short costs a retry, never a wrong state. A node older
than chunked transfers cannot take a snapshot larger than one frame.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any

import trio

from raftlog.types import Message
from raftlog.wire import WireError, message_from_wire, message_to_wire
from transport.framing import FrameStream, read_some, unflushed, write_now
from transport.peerauth import PeerGone, PeerRefused, dial_peer
from transport.tls import TLS_HANDSHAKE_TIMEOUT, connect_tls, socket_of
from wire.protocol import FrameDecoder, Op, ProtocolError, encode_frame, parse_address

__all__ = ["PeerLinks"]

log = logging.getLogger("raftmq.peers")

_MAX_QUEUED = 64 << 20  # per peer; beyond this new messages are dropped (Raft retries)
#: The largest snapshot a receiver assembles from chunks (a peer proved who it is; this
#: only stops a bad size from reserving unbounded memory).
MAX_SNAPSHOT_BYTES = 1 << 40
_READ_CHUNK = 1 << 18


def _hard_close(stream: trio.abc.Stream) -> None:
    """Close the socket under `stream` now (its tasks see the close at once)."""
    sock = socket_of(stream)
    if sock is not None:
        sock.close()


class _Link:
    def __init__(self, peer: int, addr: str) -> None:
        self.peer = peer
        self.addr = addr
        self.stream: trio.abc.Stream | None = None
        self.queue: list[bytes | memoryview] = []
        self.queued = 0
        self.has_data = trio.Event()
        self.connected = trio.Event()
        self.dropped = 0
        self.writing = False  # the writer task is in a send_all
        self.wrote = trio.Event()  # set after each send_all: the queue went to the socket

    def enqueue(self, frame: bytes | memoryview) -> None:
        if self.stream is None or self.queued > _MAX_QUEUED:
            self.dropped += 1
            return
        if not self.queue and not self.writing:  # idle link: no wait for the writer task
            sent = write_now(self.stream, frame)
            if sent == len(frame):
                if not unflushed(self.stream):
                    return
                frame = b""  # taken (TLS), the rest is the writer's send_all to flush
            elif sent:
                frame = memoryview(frame)[sent:]  # the rest, not copied
        self.queue.append(frame)
        self.queued += len(frame)
        self.has_data.set()

    def attach(self, stream: trio.abc.Stream) -> None:
        old, self.stream = self.stream, stream
        self.queue, self.queued = [], 0
        if old is not None:
            _hard_close(old)  # the peer reconnected; the old connection is dead to it
        self.connected.set()

    def detach(self, stream: trio.abc.Stream) -> bool:
        """Forget `stream` if it is the current connection; True if it was."""
        if self.stream is not stream:
            return False
        self.stream = None
        self.queue, self.queued = [], 0
        self.connected = trio.Event()
        return True


class _Transfer:
    """A snapshot arriving in chunks: its message fields, size and the bytes so far."""

    __slots__ = ("data", "fields", "total")

    def __init__(self, fields: list[Any], total: int) -> None:
        self.fields = fields
        self.total = total
        self.data = bytearray()


def _take_chunk(transfers: dict[str, _Transfer], peer: int, h: dict[str, Any],
                body: bytes) -> bytes | None:
    """Add one snapshot chunk (header `h`) to its group's transfer; the whole snapshot
    once this chunk completes it. WireError for a chunk no sender makes (the link is
    reset); a chunk that does not continue the transfer in progress ends it."""
    group, fields, off, total = h["g"], h.get("m"), h.get("off"), h.get("total")
    if (not isinstance(fields, list) or not isinstance(off, int) or not isinstance(total, int)
            or isinstance(off, bool) or isinstance(total, bool)
            or not 0 <= off < total <= MAX_SNAPSHOT_BYTES or not body
            or off + len(body) > total):
        raise WireError(f"bad snapshot chunk for {group!r}: off {off!r}, total {total!r}, "
                        f"{len(body)} bytes")
    t = transfers.get(group)
    if off == 0:
        t = transfers[group] = _Transfer(fields, total)
    elif t is None or off != len(t.data) or t.fields != fields or t.total != total:
        transfers.pop(group, None)
        log.info("snapshot chunk out of sequence; transfer dropped", extra={"fields": {
            "peer": peer, "group": group, "off": off,
            "have": len(t.data) if t is not None else None}})
        return None
    t.data += body
    if len(t.data) < total:
        return None
    del transfers[group]
    return bytes(t.data)


class PeerLinks:
    """All of a node's peer connections. `send` never blocks."""

    def __init__(
        self,
        node_id: int,
        peers: dict[int, str],
        deliver: Callable[[str, Message], None],
        *,
        max_frame: int,
        secret: bytes,
        on_lost: Callable[[int], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.node_id = node_id
        #: the snapshot bytes one chunk frame carries: half a frame, room for the header
        self.chunk_bytes = max_frame // 2
        # (peer, group) -> ((index, term, size) of the snapshot being sent, its transfer)
        self._transfers: dict[tuple[int, str], tuple[tuple[int, int, int], object]] = {}
        self._secret = secret
        self._ssl = ssl_context  # dial peers over TLS with it (their listener's context)
        self._deliver = deliver
        self._on_lost = on_lost
        self._max_frame = max_frame
        self._links = {p: _Link(p, a) for p, a in peers.items() if p != node_id}

    def send(self, group: str, m: Message) -> None:
        link = self._links.get(m.dst)
        if link is None:
            return
        fields, body = message_to_wire(m)
        frame = encode_frame({"op": Op.RAFT, "g": group, "m": fields}, body)
        if len(frame) - 4 > self._max_frame:
            log.warning("raft message too large for a peer frame; not sent", extra={"fields": {
                "peer": m.dst, "group": group, "type": m.type.name, "bytes": len(frame),
                "max_frame": self._max_frame}})
            return
        link.enqueue(frame)

    async def send_snapshot(self, group: str, m: Message) -> int:
        """Send a SNAPSHOT message, in chunks when it is larger than `chunk_bytes`: each
        written once the link has taken the one before, so a large snapshot never fills
        the queue other messages share. Returns the snapshot bytes this call queued, once
        the last chunk is queued, or early when the connection changes, a chunk is
        dropped or a newer snapshot for the peer and group takes over (the core resends
        later); 0 for a retry of the transfer under way, which goes on undisturbed (a
        restart at each retry would never finish a transfer longer than the retry time)."""
        fields, body = message_to_wire(m)
        if len(body) <= self.chunk_bytes:
            self.send(group, m)
            return len(body)
        link = self._links.get(m.dst)
        if link is None or link.stream is None:
            return 0
        view = memoryview(body)
        total = len(view)
        key, what = (m.dst, group), (m.log_index, m.log_term, total)
        current = self._transfers.get(key)
        if current is not None and current[0] == what:
            return 0  # the core's retry of a transfer still under way: let that one finish
        token = object()  # a newer snapshot for this peer and group ends an older transfer
        self._transfers[key] = (what, token)
        stream, dropped = link.stream, link.dropped
        sent = 0
        try:
            for off in range(0, total, self.chunk_bytes):
                while link.queue and link.stream is stream:  # the last chunk still queued
                    with trio.move_on_after(1.0):  # a link detached meanwhile writes nothing
                        await link.wrote.wait()
                if (link.stream is not stream or link.dropped != dropped
                        or self._transfers.get(key, (None, None))[1] is not token):
                    log.info("snapshot transfer cut short; the leader resends it", extra={
                        "fields": {"peer": m.dst, "group": group, "sent": off,
                                   "total": total}})
                    return sent
                piece = view[off : off + self.chunk_bytes]
                link.enqueue(encode_frame({"op": Op.RAFT, "g": group, "m": fields,
                                           "off": off, "total": total}, piece))
                sent += len(piece)
                await trio.lowlevel.checkpoint()
            return sent
        finally:
            if self._transfers.get(key, (None, None))[1] is token:
                del self._transfers[key]

    def connected_peers(self) -> list[int]:
        return sorted(p for p, link in self._links.items() if link.stream is not None)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for peer, link in self._links.items():
                nursery.start_soon(self._writer, link)
                if self.node_id < peer:
                    nursery.start_soon(self._dialer, link)

    async def accept(self, peer: int, stream: trio.abc.Stream, decoder: FrameDecoder) -> None:
        """Serve a connection a peer opened (its HELLO already read)."""
        link = self._links.get(peer)
        if link is None:
            log.warning("hello from unknown peer", extra={"fields": {"peer": peer}})
            return
        link.attach(stream)
        decoder.max_frame = max(decoder.max_frame, self._max_frame)  # a client's limit so far
        await self._reader(link, stream, decoder)

    async def _dialer(self, link: _Link) -> None:
        host, port = parse_address(link.addr)
        delay = 0.05
        while True:
            try:
                stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            except OSError:
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            try:
                if self._ssl is not None:
                    with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                        stream = await connect_tls(stream, self._ssl, host)
                fs = FrameStream(stream, max_frame=self._max_frame)
                await dial_peer(fs, self._secret, self.node_id, link.peer)
                delay = 0.05
                link.attach(stream)
                await self._reader(link, stream, fs.decoder)
            except PeerGone:
                self._lost(link.peer)  # accepted and closed at once: as a link that died
            except (PeerRefused, ProtocolError, trio.TooSlowError) as exc:
                log.warning("peer handshake failed", extra={"fields": {  # TooSlowError says
                    "peer": link.peer, "error": str(exc) or type(exc).__name__}})  # nothing
                await trio.sleep(delay)  # a misconfigured peer is not redialled in a loop
                delay = min(delay * 2, 1.0)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            finally:
                self._detach(link, stream)
                await trio.aclose_forcefully(stream)  # no TLS goodbye to a peer gone quiet
            await trio.sleep(0.05)

    async def _reader(
        self, link: _Link, stream: trio.abc.Stream, decoder: FrameDecoder
    ) -> None:
        transfers: dict[str, _Transfer] = {}  # group -> snapshot chunks so far
        try:
            while True:
                while (frame := decoder.next_frame()) is not None:
                    h = frame.header
                    if h.get("op") != Op.RAFT or not isinstance(h.get("g"), str):
                        raise WireError(f"unexpected frame on a peer link: {h.get('op')!r}")
                    if "off" in h:
                        whole = _take_chunk(transfers, link.peer, h, frame.body)
                        if whole is not None:
                            self._deliver(h["g"], message_from_wire(h["m"], whole))
                        continue
                    self._deliver(h["g"], message_from_wire(h.get("m"), frame.body))
                data = await read_some(stream, _READ_CHUNK)
                if not data:
                    return
                decoder.feed(data)
        except (ProtocolError, WireError) as exc:
            log.warning("peer link reset", extra={"fields": {"peer": link.peer, "error": str(exc)}})
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self._detach(link, stream)

    def _detach(self, link: _Link, stream: trio.abc.Stream) -> None:
        """`stream` ended: if it was the peer's live connection, report the loss."""
        if link.detach(stream):
            self._lost(link.peer)

    def _lost(self, peer: int) -> None:
        if self._on_lost is not None:
            try:
                self._on_lost(peer)
            except Exception:  # noqa: BLE001 - a failing hook must not kill the link task
                log.exception("peer-lost hook failed")

    async def _writer(self, link: _Link) -> None:
        while True:
            await link.has_data.wait()
            link.has_data = trio.Event()
            stream = link.stream
            if stream is None or not link.queue:
                continue
            data = b"".join(link.queue)
            link.queue, link.queued = [], 0
            link.writing = True
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self._detach(link, stream)
                _hard_close(stream)
            finally:
                link.writing = False
                link.wrote.set()
                link.wrote = trio.Event()
