"""Bad input against a live cluster: every kind gets its own code and a message naming it.

One cluster of real node processes serves the whole module. A topic is created and a few
batches are produced (acknowledged) first; then frames over the limit, broken framing,
unknown request types, missing and ill-typed fields, oversized messages, malformed
batches, invalid names and unknown topics, queues and groups are thrown at the nodes.
Each must fail alone (a protocol error closes only its own connection, a request error
leaves the connection usable), and at the end every acknowledged message must still be
readable byte for byte from live, unchanged node processes.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import trio

from raftlog.types import Message, MsgType
from raftlog.wire import message_to_wire
from raftmq.localcluster import LocalCluster
from tests.live_cluster import LiveCluster, Raw, running
from transport.blocking import Connection, request
from transport.framing import open_frame_stream
from transport.peerauth import DEV_CLUSTER_SECRET, PeerRefused, dial_peer
from wire.protocol import (
    DEFAULT_MAX_FRAME,
    MAX_MESSAGE_BYTES,
    Code,
    Frame,
    Op,
    RequestError,
    encode_frame,
)
from wire.records import OutgoingMessage, encode_batch

pytestmark = pytest.mark.live

TOPIC = "T"
QUEUES = 3  # queue q lives in group g{q}
PID = 7001  # idempotent producer, so a retried produce can never duplicate
NODE_MAX_FRAME = max(DEFAULT_MAX_FRAME, 2 * MAX_MESSAGE_BYTES + (1 << 20))  # as broker.node


# ---------------------------------------------------------------------- cluster helpers


class Live(LiveCluster):
    """The cluster with one idempotent producer whose sequence advances per queue."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster, TOPIC, QUEUES)
        self.seq: dict[int, int] = {q: 0 for q in range(QUEUES)}

    def produce(self, queue: int, messages: list[OutgoingMessage]) -> dict[str, Any]:
        """Produce one idempotent batch to `queue` and remember its records as acked."""
        h = self.produce_batch(queue, messages, pid=PID, seq=self.seq[queue], born_ms=1)
        assert h["n"] == len(messages)
        self.seq[queue] += 1
        return h


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with running(tmp_path_factory.mktemp("bad-input"), Live) as lv:
        for q in range(QUEUES):
            for b in range(2):
                lv.produce(q, [
                    OutgoingMessage(f"q{q}-b{b}-m{i}".encode() * (i + 1), key=f"k{i}",
                                    tags="t", properties={"p": str(i)})
                    for i in range(3)
                ])
        yield lv
        # after every test of the module, in whatever order they ran
        for q in range(QUEUES):
            assert lv.fetch(q) == lv.acked[q], f"queue {q} differs from what was acked"
        lv.assert_nodes_healthy()


def expect(exc: pytest.ExceptionInfo[RequestError], code: Code, *words: str) -> None:
    """The error has `code` and a message that mentions each of `words`."""
    assert exc.value.code == code, exc.value
    for w in words:
        assert w in exc.value.message, (w, exc.value.message)


# ---------------------------------------------------------------------- raw sockets


def prefix(frame_len: int, header_len: int) -> bytes:
    return struct.pack(">II", frame_len, header_len)


def assert_protocol_error(raw: Raw, code: Code, *words: str) -> None:
    """One error frame (id 0) with `code` and `words` in its message, then end of stream."""
    f = raw.next()
    assert f is not None, "no error frame before the connection closed"
    assert f.header["id"] == 0 and f.header["code"] == code, f.header
    for w in words:
        assert w in f.header["msg"], (w, f.header["msg"])
    assert raw.next() is None, "connection still open after a protocol error"


def assert_ok(raw: Raw) -> None:
    h = raw.answer({"op": int(Op.STATUS), "id": 4242})
    assert h["code"] == 0 and h["id"] == 4242, h


# ---------------------------------------------------------------------- framing


def test_frame_over_the_limit_closes_only_its_connection(live: Live) -> None:
    addr = live.addr(1)
    bystander = Connection(addr)
    bystander.request({"op": int(Op.STATUS)})
    for warm in (False, True):  # as the first frame and after a good request
        raw = Raw(addr)
        if warm:
            assert_ok(raw)
        too_big = NODE_MAX_FRAME + 1
        raw.send(prefix(too_big, 10))  # refused on the prefix alone
        assert_protocol_error(raw, Code.FRAME_TOO_LARGE, str(too_big), str(NODE_MAX_FRAME))
        raw.close()
    h, _ = bystander.request({"op": int(Op.STATUS)})
    assert h["node"] == 1
    bystander.close()


_MAP = msgpack.packb({"op": int(Op.STATUS), "id": 1})

BROKEN_FRAMES = {
    "header longer than frame": (prefix(8, 20) + b"\0" * 8, "header length 20"),
    "zero header length": (prefix(4, 0), "header length 0"),
    "header over its own limit": (prefix(4 + (2 << 20), 2 << 20), "header length"),
    "not msgpack": (prefix(5, 1) + b"\xc1", "undecodable"),
    "truncated msgpack": (prefix(4 + 3, 3) + _MAP[:3], "undecodable"),
    "trailing bytes in header": (prefix(4 + len(_MAP) + 1, len(_MAP) + 1) + _MAP + b"\x01",
                                 "undecodable"),
    "header is a list": (prefix(4 + 3, 3) + msgpack.packb([1, 2]), "not a map"),
    "header is a string": (prefix(4 + 4, 4) + msgpack.packb("abc"), "not a map"),
    "invalid utf-8 key": (prefix(4 + 4, 4) + b"\x81\xa2\xff\xfe", "undecodable"),
}


@pytest.mark.parametrize("warm", [False, True], ids=["first-frame", "later-frame"])
@pytest.mark.parametrize("case", sorted(BROKEN_FRAMES))
def test_broken_framing_is_malformed_and_closes(live: Live, case: str, warm: bool) -> None:
    data, word = BROKEN_FRAMES[case]
    raw = Raw(live.addr(2))
    if warm:
        assert_ok(raw)
    raw.send(data)
    assert_protocol_error(raw, Code.MALFORMED, word)
    raw.close()


@pytest.mark.parametrize("warm", [False, True], ids=["first-frame", "later-frame"])
def test_connection_closed_inside_a_frame(live: Live, warm: bool) -> None:
    raw = Raw(live.addr(3))
    if warm:
        assert_ok(raw)
    frame = encode_frame({"op": int(Op.STATUS), "id": 9})
    raw.send(frame[:-1])
    raw.sock.shutdown(socket.SHUT_WR)
    assert_protocol_error(raw, Code.MALFORMED, "inside a frame")
    raw.close()


@pytest.mark.parametrize("op", [99, -1, 2**40, "PRODUCE", None, 1.5, [10], int(Op.REGISTER)])
def test_unknown_op_fails_alone(live: Live, op: Any) -> None:
    raw = Raw(live.addr(1))
    assert_ok(raw)  # a HELLO only means something as the first frame
    h = raw.answer({"op": op, "id": 77})
    assert h["code"] == Code.UNKNOWN_OP and h["id"] == 77, h
    assert "unknown request type" in h["msg"] and repr(op) in h["msg"], h
    assert_ok(raw)
    h = raw.answer({"id": 78, "op": int(Op.HELLO), "node": 2})  # HELLO after the first frame
    assert h["code"] == Code.UNKNOWN_OP, h
    h = raw.answer({"id": 79})
    assert h["code"] == Code.UNKNOWN_OP and "None" in h["msg"], h
    assert_ok(raw)
    raw.close()


# ---------------------------------------------------------------------- fields

_GOOD_BATCH = encode_batch(TOPIC, 0, [OutgoingMessage(b"x")])

FIELD_CASES: list[tuple[str, Op, dict[str, Any], str]] = [
    ("produce no g", Op.PRODUCE, {}, "'g'"),
    ("produce g int", Op.PRODUCE, {"g": 0}, "'g'"),
    ("fetch no topic", Op.FETCH, {"queue": 0, "offset": 0}, "'topic'"),
    ("fetch topic int", Op.FETCH, {"topic": 5, "queue": 0, "offset": 0}, "'topic'"),
    ("fetch no queue", Op.FETCH, {"topic": TOPIC, "offset": 0}, "'queue'"),
    ("fetch queue str", Op.FETCH, {"topic": TOPIC, "queue": "0", "offset": 0}, "'queue'"),
    ("fetch queue bool", Op.FETCH, {"topic": TOPIC, "queue": True, "offset": 0}, "'queue'"),
    ("fetch no offset", Op.FETCH, {"topic": TOPIC, "queue": 0}, "'offset'"),
    ("fetch offset float", Op.FETCH, {"topic": TOPIC, "queue": 0, "offset": 1.0}, "'offset'"),
    ("fetch max str", Op.FETCH, {"topic": TOPIC, "queue": 0, "offset": 0, "max": "9"}, "'max'"),
    ("fetch max_bytes none", Op.FETCH,
     {"topic": TOPIC, "queue": 0, "offset": 0, "max_bytes": None}, "'max_bytes'"),
    ("fetch wait_ms list", Op.FETCH,
     {"topic": TOPIC, "queue": 0, "offset": 0, "wait_ms": [1]}, "'wait_ms'"),
    ("fetch tags str", Op.FETCH, {"topic": TOPIC, "queue": 0, "offset": 0, "tags": "t"},
     "'tags'"),
    ("fetch tags ints", Op.FETCH, {"topic": TOPIC, "queue": 0, "offset": 0, "tags": [1]},
     "tags"),
    ("fetch sql int", Op.FETCH, {"topic": TOPIC, "queue": 0, "offset": 0, "sql": 5},
     "'sql'"),
    ("fetch sql list", Op.FETCH, {"topic": TOPIC, "queue": 0, "offset": 0, "sql": ["a"]},
     "'sql'"),
    ("fetch sql unfinished", Op.FETCH, {"topic": TOPIC, "queue": 0, "offset": 0,
                                        "sql": "a > "}, "column 5"),
    ("fetch sql trailing", Op.FETCH, {"topic": TOPIC, "queue": 0, "offset": 0,
                                      "sql": "a = 1 )"}, "column 7"),
    ("fetch sql refused", Op.FETCH, {"topic": TOPIC, "queue": 0, "offset": 0,
                                     "sql": "a > 'x'"}, "SQL92"),
    ("commit no cg", Op.COMMIT_OFFSET, {"offsets": []}, "'cg'"),
    ("commit no offsets", Op.COMMIT_OFFSET, {"cg": "c"}, "'offsets'"),
    ("commit offsets map", Op.COMMIT_OFFSET, {"cg": "c", "offsets": {"T": 1}}, "'offsets'"),
    ("commit short item", Op.COMMIT_OFFSET, {"cg": "c", "offsets": [[TOPIC, 0]]}, "offsets"),
    ("commit negative", Op.COMMIT_OFFSET, {"cg": "c", "offsets": [[TOPIC, 0, -1]]}, "offsets"),
    ("commit queue str", Op.COMMIT_OFFSET, {"cg": "c", "offsets": [[TOPIC, "0", 1]]},
     "offsets"),
    ("commit queue bool", Op.COMMIT_OFFSET, {"cg": "c", "offsets": [[TOPIC, True, 1]]},
     "offsets"),
    ("commit topic int", Op.COMMIT_OFFSET, {"cg": "c", "offsets": [[1, 0, 1]]}, "offsets"),
    ("query no cg", Op.QUERY_OFFSET, {"topic": TOPIC, "queue": 0}, "'cg'"),
    ("query cg list", Op.QUERY_OFFSET, {"cg": ["c"], "topic": TOPIC, "queue": 0}, "'cg'"),
    ("query no topic", Op.QUERY_OFFSET, {"cg": "c", "queue": 0}, "'topic'"),
    ("query no queue", Op.QUERY_OFFSET, {"cg": "c", "topic": TOPIC}, "'queue'"),
    ("create no g", Op.CREATE_TOPIC, {"topic": "N", "queues": 1, "hosted": [0]}, "'g'"),
    ("create no topic", Op.CREATE_TOPIC, {"g": "g0", "queues": 1, "hosted": [0]}, "'topic'"),
    ("create no queues", Op.CREATE_TOPIC, {"g": "g0", "topic": "N", "hosted": [0]}, "'queues'"),
    ("create queues str", Op.CREATE_TOPIC, {"g": "g0", "topic": "N", "queues": "1",
                                            "hosted": [0]}, "'queues'"),
    ("create queues 0", Op.CREATE_TOPIC, {"g": "g0", "topic": "N", "queues": 0, "hosted": [0]},
     "queues must be"),
    ("create queues huge", Op.CREATE_TOPIC, {"g": "g0", "topic": "N", "queues": 1 << 20,
                                             "hosted": [0]}, "queues must be"),
    ("create no hosted", Op.CREATE_TOPIC, {"g": "g0", "topic": "N", "queues": 1}, "'hosted'"),
    ("create hosted empty", Op.CREATE_TOPIC, {"g": "g0", "topic": "N", "queues": 2,
                                              "hosted": []}, "hosted"),
    ("create hosted out of range", Op.CREATE_TOPIC, {"g": "g0", "topic": "N", "queues": 2,
                                                     "hosted": [2]}, "hosted"),
    ("create hosted str", Op.CREATE_TOPIC, {"g": "g0", "topic": "N", "queues": 2,
                                            "hosted": ["0"]}, "hosted"),
    ("create hosted bool", Op.CREATE_TOPIC, {"g": "g0", "topic": "N", "queues": 2,
                                             "hosted": [True]}, "hosted"),
    ("get no id", Op.GET_MESSAGE, {}, "'msg_id'"),
    ("get id int", Op.GET_MESSAGE, {"msg_id": 5}, "'msg_id'"),
    ("get id garbage", Op.GET_MESSAGE, {"msg_id": "garbage"}, "garbage"),
    ("get id not numbers", Op.GET_MESSAGE, {"msg_id": "g0:x:y"}, "g0:x:y"),
    ("key no key", Op.QUERY_KEY, {"topic": TOPIC}, "'key'"),
    ("key no topic", Op.QUERY_KEY, {"key": "k"}, "'topic'"),
    ("key max str", Op.QUERY_KEY, {"topic": TOPIC, "key": "k", "max": "1"}, "'max'"),
    ("transfer no g", Op.TRANSFER_LEADER, {"to": 1}, "'g'"),
    ("transfer no to", Op.TRANSFER_LEADER, {"g": "g0"}, "'to'"),
    ("transfer to str", Op.TRANSFER_LEADER, {"g": "g0", "to": "2"}, "'to'"),
    ("heartbeat no cg", Op.HEARTBEAT, {"client": "c1"}, "'cg'"),
    ("heartbeat no client", Op.HEARTBEAT, {"cg": "c"}, "'client'"),
    ("heartbeat ttl str", Op.HEARTBEAT, {"cg": "c", "client": "c1", "ttl_ms": "5"}, "'ttl_ms'"),
    ("consumers no cg", Op.CONSUMERS, {}, "'cg'"),
    ("consumers wait_ms str", Op.CONSUMERS, {"cg": "c", "wait_ms": "1"}, "'wait_ms'"),
    ("consumers wait_ms huge", Op.CONSUMERS, {"cg": "c", "wait_ms": 1 << 40}, "wait_ms"),
    ("produce sizes empty", Op.PRODUCE, {"g": "g0", "sizes": []}, "'sizes'"),
    ("produce sizes null", Op.PRODUCE, {"g": "g0", "sizes": None}, "'sizes'"),
    ("produce size zero", Op.PRODUCE, {"g": "g0", "sizes": [0]}, "batch size 0"),
    ("delete topic no topic", Op.DELETE_TOPIC, {"g": "g0"}, "'topic'"),
    ("delete topic bad req", Op.DELETE_TOPIC, {"g": "g0", "topic": "N", "req": [0, 1]}, "req"),
    ("grow no queues", Op.GROW_TOPIC, {"g": "g0", "topic": TOPIC, "hosted": [0]}, "'queues'"),
    ("grow queues 0", Op.GROW_TOPIC, {"g": "g0", "topic": TOPIC, "queues": 0, "hosted": []},
     "queues must be"),
    ("grow hosted out of range", Op.GROW_TOPIC, {"g": "g0", "topic": TOPIC, "queues": 3,
                                                 "hosted": [3]}, "hosted"),
    ("delete group no cg", Op.DELETE_GROUP, {"g": "g0"}, "'cg'"),
    ("delete group bad req", Op.DELETE_GROUP, {"g": "g0", "cg": "c", "req": [1]}, "req"),
    ("transfer prefer int", Op.TRANSFER_LEADER, {"g": "g0", "to": 1, "prefer": 1}, "'prefer'"),
    ("membership no action", Op.MEMBERSHIP, {"g": "g0"}, "'action'"),
    ("membership bad action", Op.MEMBERSHIP, {"g": "g0", "action": "grow"}, "action"),
    ("membership no node", Op.MEMBERSHIP, {"g": "g0", "action": "remove"}, "'node'"),
    ("receive no cg", Op.RECEIVE, {"topic": TOPIC, "queue": 0}, "'cg'"),
    ("receive max str", Op.RECEIVE, {"cg": "c", "topic": TOPIC, "queue": 0, "max": "1"},
     "'max'"),
    ("receive max 0", Op.RECEIVE, {"cg": "c", "topic": TOPIC, "queue": 0, "max": 0},
     "max must be"),
    ("receive invisible 0", Op.RECEIVE, {"cg": "c", "topic": TOPIC, "queue": 0,
                                         "invisible_ms": 0}, "invisible_ms must be"),
    ("receive cap huge", Op.RECEIVE, {"cg": "c", "topic": TOPIC, "queue": 0, "cap": 1 << 20},
     "cap must be"),
    ("receive deliveries 0", Op.RECEIVE, {"cg": "c", "topic": TOPIC, "queue": 0,
                                          "max_deliveries": 0}, "max_deliveries must be"),
    ("receive client empty", Op.RECEIVE, {"cg": "c", "topic": TOPIC, "queue": 0,
                                          "client": ""}, "client id"),
    ("ack no items", Op.ACK, {"cg": "c", "topic": TOPIC, "queue": 0}, "'items'"),
    ("ack items empty", Op.ACK, {"cg": "c", "topic": TOPIC, "queue": 0, "items": []},
     "items must be"),
    ("ack item short", Op.ACK, {"cg": "c", "topic": TOPIC, "queue": 0, "items": [[1]]},
     "items must be"),
    ("ack handle 0", Op.ACK, {"cg": "c", "topic": TOPIC, "queue": 0, "items": [[0, 0]]},
     "items must be"),
    ("ack bad req", Op.ACK, {"cg": "c", "topic": TOPIC, "queue": 0, "items": [[0, 1]],
                             "req": [0]}, "req"),
    ("nack backoff str", Op.NACK, {"cg": "c", "topic": TOPIC, "queue": 0, "items": [[0, 1]],
                                   "backoff_ms": ["1"]}, "backoff_ms"),
    ("nack backoff huge", Op.NACK, {"cg": "c", "topic": TOPIC, "queue": 0,
                                    "items": [[0, 1]], "backoff_ms": [1 << 40]}, "backoff_ms"),
    ("nack error long", Op.NACK, {"cg": "c", "topic": TOPIC, "queue": 0, "items": [[0, 1]],
                                  "error": "x" * 2000}, "error must be"),
    ("nack delay negative", Op.NACK, {"cg": "c", "topic": TOPIC, "queue": 0,
                                      "items": [[0, 1]], "delay_ms": -1}, "delay_ms must be"),
    ("nack dead int", Op.NACK, {"cg": "c", "topic": TOPIC, "queue": 0, "items": [[0, 1]],
                                "dead": 1}, "'dead'"),
    ("change no handle", Op.CHANGE_INVISIBLE, {"cg": "c", "topic": TOPIC, "queue": 0,
                                               "offset": 0, "invisible_ms": 100}, "'handle'"),
    ("change invisible huge", Op.CHANGE_INVISIBLE, {"cg": "c", "topic": TOPIC, "queue": 0,
                                                    "offset": 0, "handle": 1,
                                                    "invisible_ms": 1 << 40}, "invisible_ms"),
    ("dlq bad action", Op.DLQ, {"action": "eat", "cg": "c"}, "action"),
    ("dlq no cg", Op.DLQ, {"action": "list"}, "'cg'"),
    ("dlq resend no g", Op.DLQ, {"action": "resend", "cg": "c", "ids": [1]}, "'g'"),
    ("dlq resend no ids", Op.DLQ, {"action": "resend", "cg": "c", "g": "g0"}, "ids must be"),
    ("dlq purge id 0", Op.DLQ, {"action": "purge", "cg": "c", "g": "g0", "ids": [0]},
     "ids must be"),
    ("dlq show ids str", Op.DLQ, {"action": "show", "cg": "c", "g": "g0", "ids": ["1"]},
     "ids"),
]


@pytest.mark.parametrize(("op", "fields", "word"), [c[1:] for c in FIELD_CASES],
                         ids=[c[0] for c in FIELD_CASES])
def test_missing_or_ill_typed_fields(live: Live, op: Op, fields: dict[str, Any],
                                     word: str) -> None:
    body = _GOOD_BATCH if op == Op.PRODUCE else b""
    with pytest.raises(RequestError) as exc:
        live.call_leader("g0", {"op": int(op), **fields}, body)
    expect(exc, Code.MALFORMED, word)


# ---------------------------------------------------------------------- batches


def test_message_over_the_size_limit(live: Live) -> None:
    big = encode_batch(TOPIC, 0, [OutgoingMessage(b"\x5a" * (MAX_MESSAGE_BYTES + 1))])
    assert len(big) < NODE_MAX_FRAME  # the frame itself is fine
    # one good message and an oversized one: refused whole
    mixed = encode_batch(TOPIC, 0, [OutgoingMessage(b"ok"),
                                    OutgoingMessage(b"\0" * (MAX_MESSAGE_BYTES + 7))])
    for batch, size in ((big, MAX_MESSAGE_BYTES + 1), (mixed, MAX_MESSAGE_BYTES + 7)):
        for _attempt in range(20):  # on one connection to the leader, wherever it is
            with Connection(live.addr(live.leader("g0")), timeout=20) as conn:
                with pytest.raises(RequestError) as exc:
                    conn.request({"op": int(Op.PRODUCE), "g": "g0"}, batch)
                if exc.value.code == Code.NOT_LEADER:
                    continue
                conn.request({"op": int(Op.STATUS)})  # the connection is still usable
                break
        expect(exc, Code.MESSAGE_TOO_LARGE, str(size), str(MAX_MESSAGE_BYTES))
    # exactly at the limit is accepted (and joins what must survive)
    live.produce(0, [OutgoingMessage(bytes(range(256)) * (MAX_MESSAGE_BYTES // 256))])


def _batch(header: dict[str, Any], records: bytes, *, magic: bytes = b"RB",
           version: int = 1, hlen_delta: int = 0) -> bytes:
    h = msgpack.packb(header)
    return struct.pack(">2sBBH", magic, version, 0, len(h) + hlen_delta) + h + records


def _record(body: bytes = b"hi", key: bytes = b"", tags: bytes = b"", props: bytes = b"",
            size_delta: int = 0) -> bytes:
    size = 24 + len(key) + len(tags) + len(props) + len(body)
    return struct.pack(">IQHHII", size + size_delta, 0, len(key), len(tags), len(props),
                       len(body)) + key + tags + props + body


_HDR = {"topic": TOPIC, "queue": 0, "pid": 0, "seq": -1, "n": 1}
_REC = _record()

BAD_BATCHES: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "shorter than its prefix"),
    "bad magic": (_batch(_HDR, _REC, magic=b"XX"), "magic"),
    "bad version": (_batch(_HDR, _REC, version=9), "version"),
    "header past end": (_batch(_HDR, b"", hlen_delta=50), "header runs past the end"),
    "header undecodable": (b"RB\x01\x00\x00\x01\xc1" + _REC, "undecodable header"),
    "header not a map": (b"RB\x01\x00\x00\x01\x90" + _REC, "not a map"),
    "topic missing": (_batch({**_HDR, "topic": None}, _REC), "topic"),
    "queue not int": (_batch({**_HDR, "queue": "0"}, _REC), "queue"),
    "negative queue": (_batch({**_HDR, "queue": -1}, _REC), "negative"),
    "n zero": (_batch({**_HDR, "n": 0}, _REC), "empty batch"),
    "n too big": (_batch({**_HDR, "n": 2}, _REC), "says 2 records, found 1"),
    "n too small": (_batch(_HDR, _REC + _REC), "says 1 records, found 2"),
    "no records": (_batch(_HDR, b""), "found 0"),
    "record header truncated": (_batch(_HDR, _REC[:10]), "truncated"),
    "size too small": (_batch(_HDR, _record(size_delta=-1)), "inconsistent"),
    "size too large": (_batch(_HDR, _record(size_delta=1) + b"\0"), "inconsistent"),
    "record past end": (_batch(_HDR, _REC[:-1]), "inconsistent"),
    "trailing garbage": (_batch(_HDR, _REC + b"\0\0\0"), "truncated"),
    "key not utf-8": (_batch(_HDR, _record(key=b"\xff\xfe")), "UTF-8"),
    "pid without seq": (_batch({**_HDR, "pid": 5, "seq": -1}, _REC), "sequence"),
    "props not msgpack": (_batch(_HDR, _record(props=b"\xc1")), "properties"),
    "props not a map": (_batch(_HDR, _record(props=msgpack.packb([1]))), "properties"),
    "props int values": (_batch(_HDR, _record(props=msgpack.packb({"a": 1}))), "properties"),
    "props int keys": (_batch(_HDR, _record(props=msgpack.packb({1: "a"}))), "properties"),
    "props trailing bytes": (_batch(_HDR, _record(props=msgpack.packb({"a": "b"}) + b"\0")),
                             "properties"),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_malformed_batch(live: Live, case: str) -> None:
    body, word = BAD_BATCHES[case]
    with pytest.raises(RequestError) as exc:
        live.call_leader("g0", {"op": int(Op.PRODUCE), "g": "g0"}, body)
    expect(exc, Code.MALFORMED, "malformed batch", word)


# ---------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["bad name!", "", "x" * 128, "a/b", "über", "t\n"])
def test_invalid_topic_names(live: Live, name: str) -> None:
    cases: list[tuple[dict[str, Any], bytes]] = [
        ({"op": int(Op.CREATE_TOPIC), "g": "g0", "topic": name, "queues": 1, "hosted": [0]},
         b""),
        ({"op": int(Op.FETCH), "topic": name, "queue": 0, "offset": 0, "wait_ms": 0}, b""),
        ({"op": int(Op.QUERY_OFFSET), "cg": "c", "topic": name, "queue": 0}, b""),
        ({"op": int(Op.COMMIT_OFFSET), "cg": "c", "offsets": [[name, 0, 1]]}, b""),
        ({"op": int(Op.QUERY_KEY), "topic": name, "key": "k"}, b""),
        ({"op": int(Op.RECEIVE), "cg": "c", "topic": name, "queue": 0, "wait_ms": 0}, b""),
        ({"op": int(Op.ACK), "cg": "c", "topic": name, "queue": 0, "items": [[0, 1]]}, b""),
    ]
    if name:  # an empty topic in a batch header is a missing field (MALFORMED)
        cases.append(({"op": int(Op.PRODUCE), "g": "g0"},
                      encode_batch(name, 0, [OutgoingMessage(b"x")])))
    for header, body in cases:
        with pytest.raises(RequestError) as exc:
            live.call_leader("g0", header, body)
        expect(exc, Code.INVALID_NAME, "invalid topic name", repr(name))


@pytest.mark.parametrize("cg", ["bad cg!", "", "c" * 128, "a b", "cg\n"])
def test_invalid_consumer_group_names(live: Live, cg: str) -> None:
    for header in (
        {"op": int(Op.QUERY_OFFSET), "cg": cg, "topic": TOPIC, "queue": 0},
        {"op": int(Op.COMMIT_OFFSET), "cg": cg, "offsets": [[TOPIC, 0, 1]]},
        {"op": int(Op.HEARTBEAT), "cg": cg, "client": "c1"},
        {"op": int(Op.CONSUMERS), "cg": cg},
        {"op": int(Op.OFFSETS), "cg": cg},
        {"op": int(Op.DELETE_GROUP), "g": "g0", "cg": cg},
        {"op": int(Op.RECEIVE), "cg": cg, "topic": TOPIC, "queue": 0, "wait_ms": 0},
        {"op": int(Op.NACK), "cg": cg, "topic": TOPIC, "queue": 0, "items": [[0, 1]]},
        {"op": int(Op.DLQ), "action": "list", "cg": cg},
    ):
        with pytest.raises(RequestError) as exc:
            live.call_leader("g0", header)
        expect(exc, Code.INVALID_NAME, "invalid group name", repr(cg))


# ---------------------------------------------------------------------- unknown things


def test_a_consumer_group_that_is_no_string_is_an_invalid_name_in_offsets(live: Live) -> None:
    with pytest.raises(RequestError) as exc:
        live.call_leader("g0", {"op": int(Op.OFFSETS), "cg": 5})
    expect(exc, Code.INVALID_NAME, "invalid group name")


def test_unknown_topic(live: Live) -> None:
    nope = "Nope"
    for gid, header, body in (
        ("g0", {"op": int(Op.PRODUCE), "g": "g0"}, encode_batch(nope, 0, [OutgoingMessage(b"x")])),
        ("g1", {"op": int(Op.FETCH), "topic": nope, "queue": 0, "offset": 0, "wait_ms": 0}, b""),
        ("g2", {"op": int(Op.QUERY_OFFSET), "cg": "c", "topic": nope, "queue": 0}, b""),
        ("g0", {"op": int(Op.COMMIT_OFFSET), "cg": "c", "offsets": [[nope, 0, 1]]}, b""),
        ("g0", {"op": int(Op.QUERY_KEY), "topic": nope, "key": "k"}, b""),
        ("g1", {"op": int(Op.RECEIVE), "cg": "c", "topic": nope, "queue": 0, "wait_ms": 0},
         b""),
        ("g0", {"op": int(Op.ACK), "cg": "c", "topic": nope, "queue": 0, "items": [[0, 1]]},
         b""),
    ):
        with pytest.raises(RequestError) as exc:
            live.call_leader(gid, header, body)
        expect(exc, Code.UNKNOWN_TOPIC, repr(nope))


def test_unknown_queue(live: Live) -> None:
    cases: list[tuple[str, dict[str, Any], bytes, str]] = [
        ("g0", {"op": int(Op.FETCH), "topic": TOPIC, "queue": QUEUES, "offset": 0,
                "wait_ms": 0}, b"", f"queues are 0..{QUEUES - 1}"),
        ("g0", {"op": int(Op.FETCH), "topic": TOPIC, "queue": -1, "offset": 0}, b"", "-1"),
        ("g0", {"op": int(Op.FETCH), "topic": TOPIC, "queue": 1 << 40, "offset": 0}, b"",
         str(1 << 40)),
        ("g0", {"op": int(Op.QUERY_OFFSET), "cg": "c", "topic": TOPIC, "queue": 7}, b"", "0..2"),
        ("g0", {"op": int(Op.COMMIT_OFFSET), "cg": "c", "offsets": [[TOPIC, 9, 1]]}, b"", "0..2"),
        ("g0", {"op": int(Op.COMMIT_OFFSET), "cg": "c", "offsets": [[TOPIC, -1, 1]]}, b"",
         "-1"),
        # queue 1 exists, but in group g1: g0 refuses it
        ("g0", {"op": int(Op.PRODUCE), "g": "g0"},
         encode_batch(TOPIC, 1, [OutgoingMessage(b"x")]), "queue 1"),
        ("g0", {"op": int(Op.PRODUCE), "g": "g0"},
         encode_batch(TOPIC, 7, [OutgoingMessage(b"x")]), "queue 7"),
    ]
    for gid, header, body, word in cases:
        with pytest.raises(RequestError) as exc:
            live.call_leader(gid, header, body)
        expect(exc, Code.UNKNOWN_QUEUE, word)


def test_unknown_group(live: Live) -> None:
    for header, body in (
        ({"op": int(Op.PRODUCE), "g": "g9"}, encode_batch(TOPIC, 0, [OutgoingMessage(b"x")])),
        ({"op": int(Op.CREATE_TOPIC), "g": "g9", "topic": "N", "queues": 1, "hosted": [0]}, b""),
        ({"op": int(Op.TRANSFER_LEADER), "g": "g9", "to": 1}, b""),
        ({"op": int(Op.GET_MESSAGE), "msg_id": "g9:1:8"}, b""),
    ):
        with pytest.raises(RequestError) as exc:
            request(live.addr(1), header, body)
        expect(exc, Code.UNKNOWN_GROUP, "'g9'")


def test_produce_to_a_follower_names_the_leader(live: Live) -> None:
    batch = encode_batch(TOPIC, 2, [OutgoingMessage(b"never stored")])
    for _attempt in range(20):
        leader = live.leader("g2")
        follower = next(n for n in live.cluster.node_ids if n != leader)
        with pytest.raises(RequestError) as exc:
            request(live.addr(follower), {"op": int(Op.PRODUCE), "g": "g2"}, batch)
        if live.leader("g2") == leader:  # leadership did not move meanwhile
            break
    expect(exc, Code.NOT_LEADER, "does not lead")
    assert exc.value.extra["leader"] == live.addr(leader)
    assert exc.value.retriable


def test_fetch_outside_the_queue(live: Live) -> None:
    h, _ = live.call_leader("g1", {"op": int(Op.FETCH), "topic": TOPIC, "queue": 1,
                                   "offset": 0, "wait_ms": 0})
    end = h["end"]
    assert end == len(live.acked[1]) and h["min"] == 0
    for offset, code in ((end + 1, Code.OFFSET_TOO_LARGE), (1 << 62, Code.OFFSET_TOO_LARGE),
                         (-1, Code.OFFSET_TOO_SMALL)):
        with pytest.raises(RequestError) as exc:
            live.call_leader("g1", {"op": int(Op.FETCH), "topic": TOPIC, "queue": 1,
                                    "offset": offset, "wait_ms": 0})
        expect(exc, code, str(offset), str(end))
        assert exc.value.extra["min"] == 0 and exc.value.extra["end"] == end
    # the end itself is no error: nothing yet
    h, body = live.call_leader("g1", {"op": int(Op.FETCH), "topic": TOPIC, "queue": 1,
                                      "offset": end, "wait_ms": 0})
    assert h["msgs"] == [] and body == b"" and h["next"] == end


def test_a_stale_receipt_is_named_and_changes_nothing(live: Live) -> None:
    """An ack or nack of a delivery that is not current is answered with it named as
    stale; a change of invisible time of one is refused STALE_RECEIPT."""
    where = {"cg": "stale-cg", "topic": TOPIC, "queue": 2}
    h, _ = live.call_leader("g2", {"op": int(Op.RECEIVE), **where, "max": 1, "wait_ms": 0})
    [(offset, _index, _start, _store, deliveries, handle)] = h["msgs"]
    assert (offset, deliveries) == (0, 1)
    h, _ = live.call_leader("g2", {"op": int(Op.ACK), **where,
                                   "items": [[offset, handle + 1], [5, handle]]})
    assert h["acked"] == 0 and h["stale"] == [[offset, handle + 1], [5, handle]]
    h, _ = live.call_leader("g2", {"op": int(Op.NACK), **where, "items": [[offset, 1]]})
    assert h["nacked"] == 0 and h["stale"] == [[offset, 1]]
    with pytest.raises(RequestError) as exc:
        live.call_leader("g2", {"op": int(Op.CHANGE_INVISIBLE), **where, "offset": offset,
                                "handle": handle + 1, "invisible_ms": 1000})
    expect(exc, Code.STALE_RECEIPT, "not current")
    h, _ = live.call_leader("g2", {"op": int(Op.ACK), **where, "items": [[offset, handle]]})
    assert h["acked"] == 1 and "stale" not in h


def test_get_message_that_does_not_exist(live: Live) -> None:
    h, _ = live.call_leader("g0", {"op": int(Op.STATUS)})
    last = h["groups"]["g0"]["last"]
    for msg_id in ("g0:1:8", f"g0:{last + 1000}:8", "g0:-3:8", "g0:3:999999"):
        with pytest.raises(RequestError) as exc:
            live.call_leader("g0", {"op": int(Op.GET_MESSAGE), "msg_id": msg_id})
        expect(exc, Code.NOT_FOUND, msg_id)


@pytest.mark.parametrize("node", [99, 0, True, "2", None, 1])
def test_hello_from_a_non_peer_is_refused(live: Live, node: Any) -> None:
    """Only another node of the cluster may open a peer link (node 1 dials 1 = itself)."""
    raw = Raw(live.addr(1))
    raw.send(encode_frame({"op": int(Op.HELLO), "node": node}))
    assert_protocol_error(raw, Code.MALFORMED, "not a peer")
    raw.close()
    assert_ok(Raw(live.addr(1)))


def terms(live: Live, node: int) -> dict[str, int]:
    h, _ = request(live.addr(node), {"op": int(Op.STATUS)})
    return {gid: g["term"] for gid, g in h["groups"].items()}


def raft_heartbeat(term: int) -> bytes:
    """A Raft heartbeat from node 2 to node 1 in group g0: accepted, it would make node 1
    adopt `term`."""
    fields, body = message_to_wire(Message(MsgType.HEARTBEAT, 2, 1, term, commit=0))
    return encode_frame({"op": int(Op.RAFT), "g": "g0", "m": fields}, body)


@pytest.mark.parametrize("proof", [b"", b"x" * 32, None])
def test_a_client_posing_as_a_peer_is_refused_and_injects_no_raft_message(
    live: Live, proof: Any
) -> None:
    """HELLO with a real peer's id is not enough: without the cluster secret the handshake
    fails, and the Raft message pipelined behind it never reaches a group."""
    forged = max(terms(live, 1).values()) + 100
    raw = Raw(live.addr(1))
    raw.send(encode_frame({"op": int(Op.HELLO), "node": 2, "nonce": b"n" * 16,
                           "purpose": "raft"}))
    challenge = raw.next()
    assert challenge is not None and challenge.header["code"] == 0
    assert challenge.header["node"] == 1 and len(challenge.header["nonce"]) == 16
    raw.send(encode_frame({"op": int(Op.HELLO), "node": 2, "proof": proof})
             + raft_heartbeat(forged))
    assert_protocol_error(raw, Code.FORBIDDEN, "cluster secret")
    raw.close()
    assert max(terms(live, 1).values()) < forged  # the forged term was never seen


def test_raft_traffic_and_raw_reads_from_a_client_are_forbidden(live: Live) -> None:
    forged = max(terms(live, 1).values()) + 100
    raw = Raw(live.addr(1))
    assert_ok(raw)
    h = raw.answer({"op": int(Op.READ_RAW), "id": 5, "g": "g0", "index": 1})
    assert h["code"] == Code.FORBIDDEN and "READ_RAW" in h["msg"], h
    raw.send(raft_heartbeat(forged))  # a one-way op: it is answered too
    f = raw.next()
    assert f is not None and f.header["code"] == Code.FORBIDDEN and "RAFT" in f.header["msg"]
    assert_ok(raw)  # a refused request leaves the connection usable
    raw.close()
    assert max(terms(live, 1).values()) < forged


def test_a_peer_with_the_secret_may_read_raw_entries(live: Live) -> None:
    """The same READ_RAW, on a connection opened with the handshake (the default secret
    every test cluster shares), is answered: the refusal above is about who asks."""

    async def read_raw() -> Frame | None:
        fs = await open_frame_stream(live.addr(1), max_frame=1 << 30)
        async with fs:
            await dial_peer(fs, DEV_CLUSTER_SECRET.encode(), 2, 1, purpose="rpc")
            await fs.send({"op": int(Op.READ_RAW), "id": 6, "g": "g0", "index": 1})
            return await fs.receive()

    f = trio.run(read_raw)
    assert f is not None and f.header["code"] == 0 and f.header["term"] >= 1, f
    assert len(f.body) > 0

    async def wrong_secret() -> None:
        fs = await open_frame_stream(live.addr(1))
        async with fs:
            await dial_peer(fs, b"not the cluster secret", 2, 1, purpose="rpc")

    with pytest.raises(PeerRefused, match="does not know the cluster secret"):
        trio.run(wrong_secret)


# ---------------------------------------------------------------------- afterwards


def test_acknowledged_data_is_intact_and_nodes_alive(live: Live) -> None:
    for q in range(QUEUES):
        assert live.fetch(q) == live.acked[q], f"queue {q} differs from what was acked"
    # the fixture's batches (two of three messages per queue) are among them, whatever
    # other tests added and in whatever order they ran
    assert all(set(range(6)) <= set(live.acked[q]) for q in range(QUEUES)), live.acked
    live.assert_nodes_healthy()
