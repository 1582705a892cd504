"""Requests from this node to other nodes' listeners, as a proven peer.

The transaction coordinator sends TX_MARKER (peer-only), a participant asks TX_STATUS
of other groups' leaders, and a group repairing corrupt entries asks READ_RAW of its
peer replicas (`broker.node`). Each goes over one connection per peer node, opened with the
peer handshake (purpose `rpc`, `transport.peerauth`) on first use and kept open, with any
number of requests in flight on it (matched by id); a connection that fails is dropped
and the next request dials again. Reader tasks live in the nursery `run` holds, so
nothing outlives it.
"""

from __future__ import annotations

import itertools
import logging
import ssl
from collections.abc import Mapping
from typing import Any

import trio

from transport.connection import raise_for_code
from transport.framing import FrameStream, open_frame_stream
from transport.peerauth import PeerRefused, dial_peer
from wire.protocol import Code, Frame, RequestError

__all__ = ["PeerRPC"]

log = logging.getLogger("raftmq.peer_rpc")


class _Link:
    def __init__(self, peer: int, fs: FrameStream) -> None:
        self.peer = peer
        self.fs = fs
        self.waiters: dict[int, list[Any]] = {}  # id -> [event, frame or None]
        self.dead = False

    def fail(self) -> None:
        self.dead = True
        waiters, self.waiters = self.waiters, {}
        for slot in waiters.values():
            slot[0].set()


class PeerRPC:
    """Multiplexed requests to peer nodes (`request`), while `run` runs."""

    def __init__(self, me: int, secret: bytes, addresses: Mapping[int, str], *,
                 max_frame: int, ssl_context: ssl.SSLContext | None = None,
                 connect_timeout: float = 5.0) -> None:
        self.me = me
        self._secret = secret
        self._addresses = addresses
        self._max_frame = max_frame
        self._ssl = ssl_context
        self._connect_timeout = connect_timeout
        self._links: dict[int, _Link] = {}
        self._dialing: dict[int, trio.Lock] = {}
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            links, self._links = self._links, {}
            for link in links.values():
                link.fail()
                await trio.aclose_forcefully(link.fs.stream)

    def node_at(self, addr: object) -> int | None:
        """The node id listening at `addr` (a NOT_LEADER hint), None if unknown."""
        for nid, a in self._addresses.items():
            if a == addr:
                return nid
        return None

    async def request(self, peer: int, header: dict[str, Any], *, timeout: float) -> Frame:
        """Send `header` to node `peer` and wait for its answer. Raises `RequestError`
        for an error answer (its extra fields kept), TIMEOUT when none comes in time,
        UNAVAILABLE when the node cannot be reached or refuses the handshake, and
        CONNECTION_LOST when the connection fails with the request out (outcome unknown)."""
        with trio.move_on_after(timeout) as scope:
            link = await self._link(peer)
            rid = next(self._ids)
            slot: list[Any] = [trio.Event(), None]
            link.waiters[rid] = slot
            try:
                try:
                    await link.fs.send({**header, "id": rid})
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    link.fail()
                    raise RequestError(Code.CONNECTION_LOST, f"node {peer}: connection lost") \
                        from None
                await slot[0].wait()
            finally:
                link.waiters.pop(rid, None)
            frame = slot[1]
            if frame is None:
                raise RequestError(Code.CONNECTION_LOST, f"node {peer}: connection lost")
            return raise_for_code(frame)
        assert scope.cancelled_caught
        raise RequestError(Code.TIMEOUT, f"node {peer}: no answer to op {header.get('op')} "
                           f"within {timeout:g} s")

    async def _link(self, peer: int) -> _Link:
        link = self._links.get(peer)
        if link is not None and not link.dead:
            return link
        lock = self._dialing.setdefault(peer, trio.Lock())
        async with lock:
            link = self._links.get(peer)
            if link is not None and not link.dead:
                return link
            link = await self._dial(peer)
            self._links[peer] = link
            assert self._nursery is not None, "PeerRPC.run is not running"
            self._nursery.start_soon(self._read, link)
            return link

    async def _dial(self, peer: int) -> _Link:
        addr = self._addresses.get(peer)
        if addr is None or peer == self.me:
            raise RequestError(Code.UNAVAILABLE, f"node {peer} is not a peer of this node")
        try:
            with trio.fail_after(self._connect_timeout):
                fs = await open_frame_stream(addr, max_frame=self._max_frame,
                                             ssl_context=self._ssl)
        except (OSError, trio.TooSlowError) as exc:
            raise RequestError(Code.UNAVAILABLE, f"node {peer} at {addr}: {exc!r}") from None
        try:
            await dial_peer(fs, self._secret, self.me, peer, purpose="rpc",
                            timeout=self._connect_timeout)
        except BaseException as exc:
            await trio.aclose_forcefully(fs.stream)
            if isinstance(exc, (PeerRefused, trio.TooSlowError, trio.BrokenResourceError,
                                trio.ClosedResourceError, OSError)):
                raise RequestError(Code.UNAVAILABLE, f"node {peer}: {exc}") from None
            raise
        return _Link(peer, fs)

    async def _read(self, link: _Link) -> None:
        try:
            while True:
                frame = await link.fs.receive()
                if frame is None:
                    break
                rid = frame.header.get("id")
                slot = link.waiters.pop(rid, None) if isinstance(rid, int) else None
                if slot is not None:
                    slot[1] = frame
                    slot[0].set()
        except Exception as exc:  # noqa: BLE001 - a broken link only ends itself
            log.info("peer rpc link failed", extra={"fields": {"peer": link.peer,
                                                               "error": repr(exc)}})
        finally:
            link.fail()
            if self._links.get(link.peer) is link:
                del self._links[link.peer]
            await trio.aclose_forcefully(link.fs.stream)
