"""The MQTT gateway process: one asyncio server, one raftmq client session per MQTT
connection.

CONNECT's user name and password are a raftmq login: the connection's own
`ConnectionPool` logs in with them (SCRAM-SHA-256 against the nodes) and a node must
accept it before CONNACK says yes (0x04 for a refused password, 0x05 when no login was
given to a cluster that needs one). Everything the connection does afterwards is checked
by the nodes against that user's ACLs.

PUBLISH: QoS 0 is handed to the producer and not awaited; QoS 1 is answered with PUBACK
only once the producer's send is acknowledged, which means committed on a majority of
the queue's group. PUBLISHes of one connection are handed to the producer in order, so
they keep their order within a queue. A publish the ACLs refuse (or any send that
fails) closes the connection without a PUBACK, as MQTT 3.1.1 has no negative
acknowledgement: the client sends it again after reconnecting. QoS 2 is not served
(the connection is closed); SUBSCRIBE grants at most QoS 1.

SUBSCRIBE reads the filter's raftmq topic (`raftmq.mqtt.mapping`) from every queue with
long polls and forwards the messages whose MQTT topic name matches. A clean session
starts at the end of each queue; a persistent session (clean session 0) resumes from
offsets committed for consumer group `mqtt-<client id>` (which the user then needs
subscribe permission on), committed as messages are forwarded. Subscriptions themselves
are not kept across connections: a client subscribes again after it reconnects, as most
do. Retained messages are kept by the gateway process in memory (the last one of each
MQTT topic name; an empty retained payload clears it) and sent to new matching
subscriptions; they are also stored in raftmq like any other message.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import secrets
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from amqtt.adapters import StreamReaderAdapter, StreamWriterAdapter
from amqtt.mqtt import packet_class
from amqtt.mqtt.connack import ConnackPacket
from amqtt.mqtt.connect import ConnectPacket
from amqtt.mqtt.constants import QOS_0, QOS_1
from amqtt.mqtt.packet import (
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PUBACK,
    PUBLISH,
    SUBSCRIBE,
    UNSUBSCRIBE,
    MQTTFixedHeader,
)
from amqtt.mqtt.pingresp import PingRespPacket
from amqtt.mqtt.puback import PubackPacket
from amqtt.mqtt.publish import PublishPacket
from amqtt.mqtt.suback import SubackPacket
from amqtt.mqtt.unsuback import UnsubackPacket

from raftmq.client import Admin, Producer
from raftmq.client.reads import (
    commit_offsets,
    fetch,
    out_of_range_offset,
    query_offset,
    queue_bounds,
)
from raftmq.web.auth import prove_login
from transport.connection import ConnectionPool
from transport.scram import Credentials
from wire.protocol import Code, RequestError
from wire.records import OutgoingMessage

from .mapping import (
    MQTT_TOPIC_PROPERTY,
    RETAIN_PROPERTY,
    FilterProblem,
    matches,
    mqtt_topic_of,
    raftmq_target,
    subscription_topic,
)

__all__ = ["Gateway", "main"]

log = logging.getLogger("raftmq.mqtt")

CONNECT_TIMEOUT = 10.0
ACCEPTED, BAD_VERSION, BAD_LOGIN, NOT_AUTHORIZED, UNAVAILABLE = 0x00, 0x01, 0x04, 0x05, 0x03
SUBACK_FAILURE = 0x80
POLL_MS = 5_000


class Closing(Exception):
    """End this connection (the reason is logged)."""


@dataclass
class Gateway:
    """What every connection shares: the cluster and the retained messages."""

    namesrv: list[str]
    cluster_tls: Any = None
    retained: dict[str, tuple[bytes, int]] = field(default_factory=dict)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self, StreamReaderAdapter(reader), StreamWriterAdapter(writer))
        peer = writer.get_extra_info("peername")
        try:
            await conn.run()
        except Closing as exc:
            log.info("closing MQTT connection from %s: %s", peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError, anyio.EndOfStream):
            pass
        except Exception:
            log.exception("MQTT connection from %s failed", peer)
        finally:
            await conn.writer.close()


class _Connection:
    def __init__(self, gw: Gateway, reader: StreamReaderAdapter,
                 writer: StreamWriterAdapter) -> None:
        self.gw = gw
        self.reader = reader
        self.writer = writer
        self._write_lock = anyio.Lock()
        self._next_id = 0
        self._subs: dict[str, anyio.CancelScope] = {}
        self.client_id = ""
        self.persistent = False

    async def send(self, packet: Any) -> None:
        async with self._write_lock:
            await packet.to_stream(self.writer)

    async def run(self) -> None:
        with anyio.fail_after(CONNECT_TIMEOUT):
            header = await MQTTFixedHeader.from_stream(self.reader)
            if header is None or header.packet_type != CONNECT:
                raise Closing("the first packet is not CONNECT")
            connect = await ConnectPacket.from_stream(self.reader, fixed_header=header)
        if connect.proto_level != 4:
            await self.send(ConnackPacket.build(0, BAD_VERSION))
            raise Closing(f"protocol level {connect.proto_level}: only MQTT 3.1.1 (4)")
        creds = None
        if connect.username_flag and connect.username:
            creds = Credentials(connect.username, connect.password or "")
        self.client_id = connect.client_id or secrets.token_hex(8)
        self.persistent = not connect.clean_session_flag
        async with (
            ConnectionPool(ssl_context=self.gw.cluster_tls, credentials=creds,
                           env_credentials=False) as pool,
            Producer(self.gw.namesrv, pool=pool) as producer,
            Admin(self.gw.namesrv, pool=pool) as admin,
        ):
            try:
                await prove_login(admin, pool)
            except RequestError as exc:
                code = {Code.UNAUTHENTICATED: BAD_LOGIN if creds else NOT_AUTHORIZED,
                        Code.FORBIDDEN: NOT_AUTHORIZED}.get(exc.code, UNAVAILABLE)
                await self.send(ConnackPacket.build(0, code))
                raise Closing(f"login refused: {exc}") from None
            await self.send(ConnackPacket.build(0, ACCEPTED))
            try:
                async with anyio.create_task_group() as tg:
                    await self._serve(tg, producer, admin)
                    tg.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                closing = _first(group, Closing)
                if closing is not None:
                    raise closing from None
                raise

    async def _serve(self, tg: anyio.abc.TaskGroup, producer: Producer, admin: Admin) -> None:
        while True:
            header = await MQTTFixedHeader.from_stream(self.reader)
            if header is None:
                return
            packet: Any = await packet_class(header).from_stream(self.reader,
                                                                 fixed_header=header)
            kind = header.packet_type
            if kind == PUBLISH:
                await self._publish(tg, producer, packet)
            elif kind == SUBSCRIBE:
                await self._subscribe(tg, admin, packet)
            elif kind == UNSUBSCRIBE:
                for f in packet.payload.topics:
                    scope = self._subs.pop(f, None)
                    if scope is not None:
                        scope.cancel()
                await self.send(UnsubackPacket.build(packet.variable_header.packet_id))
            elif kind == PINGREQ:
                await self.send(PingRespPacket.build())
            elif kind == PUBACK:
                pass  # our QoS 1 deliveries: at least once, nothing kept to resend
            elif kind == DISCONNECT:
                return
            else:
                raise Closing(f"packet type {kind} is not served")

    # ------------------------------------------------------------ publish

    async def _publish(self, tg: anyio.abc.TaskGroup, producer: Producer,
                       packet: PublishPacket) -> None:
        name = packet.topic_name or ""
        qos = packet.qos or 0
        if qos > QOS_1:
            raise Closing("QoS 2 is not served")
        try:
            topic, tag = raftmq_target(name)
        except FilterProblem as exc:
            raise Closing(str(exc)) from None
        data = bytes(packet.data or b"")
        props = {MQTT_TOPIC_PROPERTY: name}
        if packet.retain_flag:
            props[RETAIN_PROPERTY] = "1"
            if data:
                self.gw.retained[name] = (data, qos)
            else:
                self.gw.retained.pop(name, None)
        msg = OutgoingMessage(data, "", tag, props)
        if qos == QOS_0:
            await producer.send_oneway(topic, msg)
            return
        try:
            fut = await producer.send_async(topic, msg)
        except RequestError as exc:
            raise Closing(f"publish to {name!r} refused: {exc}") from None
        packet_id = packet.packet_id
        assert packet_id is not None

        async def acknowledge() -> None:
            try:
                await fut
            except RequestError as exc:
                raise Closing(f"publish to {name!r} failed: {exc}") from None
            await self.send(PubackPacket.build(packet_id))

        tg.start_soon(acknowledge)

    # ------------------------------------------------------------ subscribe

    async def _subscribe(self, tg: anyio.abc.TaskGroup, admin: Admin, packet: Any) -> None:
        codes: list[int] = []
        starts: list[tuple[str, str, int, dict[int, int]]] = []
        for mqtt_filter, requested in packet.payload.topics:
            granted = min(int(requested or 0), QOS_1)
            try:
                topic = subscription_topic(mqtt_filter)
                route = await admin.routes.route(topic)
                positions = {}
                for q in range(route.total):  # also proves the user may read it
                    positions[q] = await self._start_offset(admin, topic, q)
            except (FilterProblem, RequestError) as exc:
                log.info("subscription %r of %s refused: %s", mqtt_filter, self.client_id, exc)
                codes.append(SUBACK_FAILURE)
                continue
            codes.append(granted)
            starts.append((mqtt_filter, topic, granted, positions))
        await self.send(SubackPacket.build(packet.variable_header.packet_id, codes))
        for mqtt_filter, topic, qos, positions in starts:
            old = self._subs.pop(mqtt_filter, None)
            if old is not None:
                old.cancel()
            scope = anyio.CancelScope()
            self._subs[mqtt_filter] = scope
            for name, (data, rqos) in list(self.gw.retained.items()):
                if matches(mqtt_filter, name):
                    await self._deliver(name, data, min(qos, rqos), retain=True)
            tg.start_soon(self._follow_all, scope, admin, mqtt_filter, topic, positions, qos)

    @property
    def group(self) -> str:
        return "mqtt-" + re.sub(r"[^A-Za-z0-9_\-%|.]", "_", self.client_id)[:100]

    async def _start_offset(self, admin: Admin, topic: str, queue: int) -> int:
        _lo, end = await queue_bounds(admin.routes, topic, queue)
        if self.persistent:
            committed = await query_offset(admin.routes, self.group, topic, queue)
            if committed >= 0:
                return committed
        return end

    async def _follow_all(self, scope: anyio.CancelScope, admin: Admin, mqtt_filter: str,
                          topic: str, positions: dict[int, int], qos: int) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                for q, offset in positions.items():
                    tg.start_soon(self._follow, admin, mqtt_filter, topic, q, offset, qos)

    async def _follow(self, admin: Admin, mqtt_filter: str, topic: str, queue: int,
                      offset: int, qos: int) -> None:
        while True:
            try:
                res = await fetch(admin.routes, topic, queue, offset, wait_ms=POLL_MS)
            except RequestError as exc:
                jump = out_of_range_offset(exc, topic, queue, offset)
                if jump is not None:
                    offset = jump
                    continue
                if exc.code in (Code.FORBIDDEN, Code.UNKNOWN_TOPIC):
                    raise Closing(f"subscription {mqtt_filter!r}: {exc}") from None
                log.debug("poll of %s/%d failed: %s", topic, queue, exc)
                await anyio.sleep(0.5)
                continue
            for m in res.messages:
                if matches(mqtt_filter, mqtt_topic_of(m)):
                    await self._deliver(mqtt_topic_of(m), m.body, qos)
            if res.next_offset != offset and self.persistent:
                await commit_offsets(admin.routes, self.group,
                                     {(topic, queue): res.next_offset}, timeout=10)
            offset = res.next_offset

    async def _deliver(self, name: str, data: bytes, qos: int, *, retain: bool = False) -> None:
        packet_id = None
        if qos:
            self._next_id = self._next_id % 65535 + 1
            packet_id = self._next_id
        await self.send(PublishPacket.build(name, data, packet_id, False, qos, retain))


def _first(group: BaseExceptionGroup, kind: type[Closing]) -> Closing | None:
    """The first `kind` among a (nested) exception group's leaves."""
    for exc in group.exceptions:
        if isinstance(exc, kind):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first(exc, kind)
            if found is not None:
                return found
    return None


async def serve(gateway: Gateway, host: str, port: int,
                ready: Callable[[str], Awaitable[None] | None] | None = None) -> None:
    """Serve MQTT on host:port until cancelled; `ready` gets "host:port" once bound."""
    server = await asyncio.start_server(gateway.handle, host, port)
    bound = server.sockets[0].getsockname()
    if ready is not None:
        maybe = ready(f"{bound[0]}:{bound[1]}")
        if maybe is not None:
            await maybe
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    from raftmq.commands import add_namesrv_argument, namesrv_addresses
    from raftmq.web.server import listen_address
    from transport.tls import context_from_env

    p = argparse.ArgumentParser(prog="raftmq mqtt",
                                description="An MQTT 3.1.1 gateway to a raftmq cluster.")
    add_namesrv_argument(p)
    p.add_argument("--listen", default="127.0.0.1:1883", metavar="HOST:PORT",
                   help="where to accept MQTT connections (default %(default)s; port 0: "
                        "any free one)")
    args = p.parse_args(argv)
    namesrv = namesrv_addresses(p, args.namesrv)
    try:
        host, port = listen_address(args.listen)
    except ValueError as exc:
        p.error(f"--listen: {exc}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    gateway = Gateway(namesrv, context_from_env())

    def ready(addr: str) -> None:
        print(f"mqtt: {addr} (namesrv {','.join(namesrv)})", flush=True)

    try:
        asyncio.run(serve(gateway, host, port, ready))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
