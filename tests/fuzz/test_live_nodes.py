"""Hypothesis throws garbage at live nodes: the request decoder and handlers must hold.

A module-scoped cluster of real node processes gets a topic and some acknowledged
messages, then three kinds of input:

* well-framed requests with arbitrary headers (random keys and values, valid op numbers
  with garbage fields) and random bodies: each must get exactly one answer whose code is
  a known `Code` other than INTERNAL (INTERNAL means a handler crashed on bad input);
* raw byte strings: at most one protocol error frame, then the connection closes;
* mutations of a valid PRODUCE batch (bit flips, truncation, insertions, overwritten
  lengths): the node's verdict must be the one `walk_batch` reaches on the same bytes,
  and a batch it accepts must read back byte for byte.

Afterwards the nodes still serve a good produce and fetch, everything acknowledged before
the fuzzing is intact, no node process died and no node logged an error. Runs are
derandomized, so CI sees the same examples every time; a failure prints the falsifying
example.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from raftmq.localcluster import LocalCluster
from tests.live_cluster import LiveCluster, Raw, running
from wire.protocol import (
    DEFAULT_MAX_FRAME,
    MAX_MESSAGE_BYTES,
    Code,
    Frame,
    FrameDecoder,
    Op,
    ProtocolError,
    RequestError,
    encode_frame,
)
from wire.records import (
    OutgoingMessage,
    decode_record,
    encode_batch,
    walk_batch,
)

pytestmark = pytest.mark.live

TOPIC = "F"
QUEUES = 3  # queue q lives in group g{q}
KNOWN_CODES = {int(c) for c in Code}
PROTOCOL_ERRORS = {int(Code.MALFORMED), int(Code.FRAME_TOO_LARGE)}
PROTOCOL_ERROR_TEXTS = ("frame of", "header length", "undecodable frame header",
                        "frame header is not a map", "connection closed inside a frame")
NODE_MAX_FRAME = max(DEFAULT_MAX_FRAME, 2 * MAX_MESSAGE_BYTES + (1 << 20))  # as broker.node
ANSWER_TIMEOUT = 20.0  # a fuzzed request that hangs this long is a failure

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ---------------------------------------------------------------------- the cluster


class Live(LiveCluster):
    """The cluster and one long-lived connection per node."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster, TOPIC, QUEUES)
        self._conns: dict[int, Raw] = {}

    def conn(self, node: int) -> Raw:
        """A connection to `node` past its first frame (a first-frame HELLO would make it
        a peer link), reopened after anything closed it."""
        raw = self._conns.get(node)
        if raw is None:
            raw = Raw(self.addr(node), ANSWER_TIMEOUT)
            f = raw.ask({"op": int(Op.STATUS), "id": 1})
            assert f is not None and f.header["code"] == 0
            self._conns[node] = raw
        return raw

    def drop(self, node: int) -> None:
        raw = self._conns.pop(node, None)
        if raw is not None:
            raw.close()

    def produce(self, queue: int, messages: list[OutgoingMessage], pid: int, seq: int) -> None:
        self.produce_batch(queue, messages, pid=pid, seq=seq, born_ms=5)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with running(tmp_path_factory.mktemp("fuzz-live"), Live) as lv:
        for q in range(QUEUES):
            for b in range(3):
                lv.produce(q, [OutgoingMessage(f"before-{q}-{b}-{i}".encode(), key=f"k{i}",
                                               tags="tg", properties={"i": str(i)})
                               for i in range(2)], pid=900 + q, seq=b)
        for q in range(QUEUES):
            h, _ = lv.call_leader(f"g{q}", {"op": int(Op.FETCH), "topic": TOPIC, "queue": q,
                                            "offset": 0, "max": 100, "wait_ms": 0})
            MSG_IDS.extend(f"g{q}:{index}:{start}" for _o, index, start, _t in h["msgs"])
        yield lv
        for node in list(lv._conns):
            lv.drop(node)
        check_intact(lv)  # after the whole storm, in whatever order it came


def check_answer(req: dict[str, Any], f: Frame | None) -> dict[str, Any]:
    """A well-framed request got one answer with a known, non-INTERNAL code."""
    assert f is not None, "the node closed the connection instead of answering"
    h = f.header
    note(f"answer: {h}")
    code = h.get("code")
    assert code in KNOWN_CODES, f"unknown code {code!r}"
    assert code != Code.INTERNAL, f"handler crashed: {h.get('msg')}"
    if code != Code.OK:
        assert isinstance(h.get("msg"), str) and h["msg"], "an error without a message"
    rid = req.get("id")
    if isinstance(rid, int) and not isinstance(rid, bool):
        assert h.get("id") == rid
    return h


# ---------------------------------------------------------------------- strategies

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.integers(-3, 5),
    st.floats(), st.text(max_size=12), st.binary(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=6) | st.integers(-2, 2), inner, max_size=4),
    max_leaves=8,
)
FIELDS = ["op", "id", "g", "topic", "queue", "offset", "max", "max_bytes", "wait_ms", "tags",
          "cg", "offsets", "queues", "hosted", "msg_id", "key", "to", "client", "ttl_ms",
          "node", "m", "code", "msg"]
names = st.sampled_from([TOPIC, "g0", "g1", "g2", "g9", "bad name!", "", "c", "k0", "k1",
                         "g0:1:8", "g1:3:34", "x" * 128, "tg"])
field_values = st.one_of(
    names, st.integers(-2, 4), values,
    st.lists(st.tuples(names, st.integers(-1, 4), st.integers(-1, 10)).map(list), max_size=3),
    st.lists(st.integers(-1, 4) | names, max_size=4),
)
ops = st.one_of(st.sampled_from([int(o) for o in Op]), st.integers(-2, 60), values)

MSG_IDS: list[str] = []  # real message ids, filled in by the fixture
msg_ids = st.one_of(
    st.integers(0, 1 << 16).map(lambda i: MSG_IDS[i % len(MSG_IDS)] if MSG_IDS else "g0:2:8"),
    st.builds(lambda g, i, s: f"{g}:{i}:{s}", st.sampled_from(["g0", "g1", "g2", "g9", ""]),
              st.integers(-1, 40), st.integers(-1, 120)),
    st.text(max_size=12),
)
topics = st.sampled_from([TOPIC, TOPIC, "Nope", "bad name!", "", "x" * 128, "New1", "New2"])
offset_items = st.lists(st.tuples(topics, st.integers(-1, 4), st.integers(-1, 12)).map(list)
                        | values, max_size=3)
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "g": st.sampled_from(["g0", "g1", "g2", "g9"]),
    "topic": topics,
    "queue": st.integers(-1, QUEUES + 1),
    "offset": st.integers(-1, 12) | st.integers(-(2**63), 2**64 - 1),
    "max": st.integers(-2, 2000),
    "max_bytes": st.integers(-2, 1 << 24),
    "wait_ms": st.just(0),
    "tags": st.lists(st.sampled_from(["tg", "other", ""]) | st.text(max_size=4), max_size=3),
    "cg": st.sampled_from(["cg1", "cg2", "bad cg!", ""]),
    "offsets": offset_items,
    "queues": st.integers(-1, 5) | st.just(1 << 20),
    "hosted": st.lists(st.integers(-1, 5), max_size=4),
    "msg_id": msg_ids,
    "key": st.sampled_from(["k0", "k1", "after", ""]) | st.text(max_size=4),
    "to": st.integers(-1, 4),
    "client": st.text(max_size=6),
    "ttl_ms": st.integers(-5, 1 << 40),
    "ms": st.integers(-5, 1 << 45),
}
OP_FIELDS: dict[Op, list[str]] = {
    Op.PRODUCE: ["g"],
    Op.FETCH: ["topic", "queue", "offset", "max", "max_bytes", "wait_ms", "tags"],
    Op.COMMIT_OFFSET: ["cg", "offsets"],
    Op.QUERY_OFFSET: ["cg", "topic", "queue"],
    Op.CREATE_TOPIC: ["g", "topic", "queues", "hosted"],
    Op.TOPICS: [],
    Op.STATUS: [],
    Op.GET_MESSAGE: ["msg_id"],
    Op.QUERY_KEY: ["topic", "key", "max"],
    Op.OFFSET_FOR_TIME: ["topic", "queue", "ms"],
    Op.TRANSFER_LEADER: ["g", "to"],
    Op.HEARTBEAT: ["cg", "client", "ttl_ms"],
    Op.CONSUMERS: ["cg"],
}


@st.composite
def shaped_headers(draw: st.DrawFn) -> dict[Any, Any]:
    """A request for a real op whose fields are mostly plausible, sometimes garbage,
    sometimes missing, plus stray keys."""
    op = draw(st.sampled_from(sorted(OP_FIELDS)))
    h: dict[Any, Any] = {"op": int(op), "id": draw(st.integers(1, 2**31))}
    fields = OP_FIELDS[op]
    spoilt: list[str] = []
    if fields and draw(st.integers(0, 2)) == 0:  # two in three stay well-typed
        spoilt = draw(st.lists(st.sampled_from(fields), min_size=1, max_size=2, unique=True))
    for name in fields:
        if name not in spoilt:
            h[name] = draw(PLAUSIBLE[name])
        elif draw(st.booleans()):
            h[name] = draw(values)
    h.update(draw(st.dictionaries(st.text(max_size=4), values, max_size=2)))
    return h


@st.composite
def random_headers(draw: st.DrawFn) -> dict[Any, Any]:
    h: dict[Any, Any] = draw(st.dictionaries(
        st.sampled_from(FIELDS) | st.text(max_size=5) | st.integers(-2, 30),
        field_values, max_size=8))
    if draw(st.integers(0, 3)) > 0:
        h["op"] = draw(ops)
    if draw(st.integers(0, 3)) > 0:
        h["id"] = draw(st.integers(1, 2**31))
    return h


headers = st.one_of(shaped_headers(), shaped_headers(), shaped_headers(), random_headers())


messages = st.lists(
    st.builds(OutgoingMessage, st.binary(max_size=40), st.text(max_size=6),
              st.text(max_size=6), st.dictionaries(st.text(max_size=4), st.text(max_size=4),
                                                   max_size=2)),
    min_size=1, max_size=3,
)
valid_batches = st.builds(
    lambda topic, q, msgs: encode_batch(topic, q, msgs),
    st.sampled_from([TOPIC, TOPIC, "Nope", "bad name!"]), st.integers(-1, 4), messages,
)
bodies = st.one_of(st.just(b""), st.binary(max_size=200), valid_batches, valid_batches)


def _not_hanging(h: dict[Any, Any]) -> dict[Any, Any]:
    """A FETCH at the end of a queue long-polls; keep it short (bad types stay bad)."""
    if h.get("op") == Op.FETCH and not isinstance(h.get("op"), bool):
        w = h.get("wait_ms", 0)
        if isinstance(w, int) and not isinstance(w, bool):
            h["wait_ms"] = 0
    return h


# ---------------------------------------------------------------------- properties


@settings(FUZZ, max_examples=1500)
@given(header=headers.map(_not_hanging), body=bodies, node=st.sampled_from([1, 2, 3]))
def test_any_header_gets_a_known_answer(live: Live, header: dict[Any, Any], body: bytes,
                                        node: int) -> None:
    raw = live.conn(node)
    try:
        f = raw.ask(header, body)
    except TimeoutError:
        f = None
    if f is None:
        live.drop(node)
    check_answer(header, f)


raw_bytes = st.one_of(
    st.binary(min_size=1, max_size=512),
    st.builds(  # a plausible prefix in front of garbage
        lambda fl, hl, rest: struct.pack(">II", fl, hl) + rest,
        st.integers(0, 2**32 - 1) | st.integers(0, 300),
        st.integers(0, 2**32 - 1) | st.integers(0, 300),
        st.binary(max_size=300),
    ),
    st.builds(  # a good frame with some bytes changed
        lambda frame, pos, byte: frame[: pos % len(frame)] + bytes([byte])
        + frame[pos % len(frame) + 1 :],
        st.builds(lambda h: encode_frame(h), st.dictionaries(st.sampled_from(FIELDS),
                                                            names, max_size=4)),
        st.integers(0, 1000), st.integers(0, 255),
    ),
)


@settings(FUZZ, max_examples=500)
@given(data=raw_bytes, warm=st.booleans(), node=st.sampled_from([1, 2, 3]))
def test_raw_garbage_gets_at_most_an_error_then_a_close(live: Live, data: bytes, warm: bool,
                                                        node: int) -> None:
    bystander = live.conn(node)  # opened earlier: must outlive the broken connection
    raw = Raw(live.addr(node), ANSWER_TIMEOUT)
    try:
        if warm:  # past the first frame, which the node reads separately
            check_answer({"id": 3}, raw.ask({"op": int(Op.STATUS), "id": 3}))
        raw.sock.sendall(data)
        raw.sock.shutdown(socket.SHUT_WR)
        frames: list[dict[str, Any]] = []
        while (f := raw.next()) is not None:  # TimeoutError: the node never closed
            frames.append(f.header)
        note(f"frames: {frames}")
        for h in frames:  # answers to whole frames that happened to be in the garbage
            assert h.get("code") in KNOWN_CODES and h.get("code") != Code.INTERNAL, h
        errors = [h["code"] for h in frames if h.get("id") == 0
                  and h.get("code") in PROTOCOL_ERRORS
                  and str(h.get("msg")).startswith(PROTOCOL_ERROR_TEXTS)]
        want = stream_verdict(data)
        if want is None:
            assert errors == [], "a protocol error for a well-framed stream"
        elif not (raw.reset and not errors):  # a reset may swallow the error frame
            assert errors == [want], f"expected one {want!r} frame"
    finally:
        raw.close()
    status = {"op": int(Op.STATUS), "id": 6}
    check_answer(status, bystander.ask(status))


def stream_verdict(data: bytes) -> Code | None:
    """What the node's decoder must make of `data` followed by end of stream."""
    dec = FrameDecoder(NODE_MAX_FRAME)
    dec.feed(data)
    try:
        while dec.next_frame() is not None:
            pass
    except ProtocolError as exc:
        return exc.code
    return Code.MALFORMED if dec.buffered else None


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 16), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 16), st.integers(1, 8)),
    st.tuples(st.just("u32"), st.integers(0, 1 << 16),
              st.sampled_from([0, 1, 23, 24, 25, 0x7FFFFFFF, 0xFFFFFFFF])),
    st.tuples(st.just("u16"), st.integers(0, 1 << 16), st.sampled_from([0, 1, 0xFFFF])),
)


def mutate(batch: bytes, muts: list[tuple[str, int, int]]) -> bytes:
    b = bytearray(batch)
    for kind, at, arg in muts:
        pos = at % (len(b) + 1)
        if kind == "flip" and pos < len(b):
            b[pos] ^= 1 << arg
        elif kind == "truncate":
            del b[pos:]
        elif kind == "insert":
            b[pos:pos] = bytes([arg])
        elif kind == "delete":
            del b[pos : pos + arg]
        elif kind == "u32":
            b[pos : pos + 4] = struct.pack(">I", arg)
        elif kind == "u16":
            b[pos : pos + 2] = struct.pack(">H", arg)
    return bytes(b)


ACCEPTABLE_FOR_VALID = {Code.OK, Code.INVALID_NAME, Code.UNKNOWN_TOPIC, Code.UNKNOWN_QUEUE,
                        Code.SEQUENCE_GAP}
LEADERSHIP = {Code.NOT_LEADER, Code.PROPOSAL_DROPPED}


@settings(FUZZ, max_examples=600)
@given(queue=st.integers(0, QUEUES - 1), msgs=messages, pid=st.sampled_from([0, 77]),
       muts=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_produce_batches(live: Live, queue: int, msgs: list[OutgoingMessage],
                                 pid: int, muts: list[tuple[str, int, int]]) -> None:
    seq = -1 if pid == 0 else 1 << 40  # far ahead: a gap unless the mutation changed it
    batch = mutate(encode_batch(TOPIC, queue, msgs, pid=pid, seq=seq, born_ms=9), muts)
    try:
        local = walk_batch(batch, check_properties=True)  # what the produce path checks
        verdict: Code | None = None
    except RequestError as exc:
        verdict = exc.code
    note(f"batch {batch!r}; local verdict {verdict!r}")
    node = live.leader(f"g{queue}")
    req = {"op": int(Op.PRODUCE), "g": f"g{queue}", "id": 5}
    try:
        f = live.conn(node).ask(req, batch)
    except TimeoutError:
        f = None
    if f is None:
        live.drop(node)
    h = check_answer(req, f)
    code = Code(h["code"])
    if code in LEADERSHIP:
        return
    if verdict is not None:
        assert code == verdict, f"node said {code!r}, the decoder {verdict!r}"
        return
    assert code in ACCEPTABLE_FOR_VALID, code
    if code == Code.OK and not h["dup"]:
        header, refs = local
        assert h["n"] == len(refs)
        got = live.fetch(header.queue, h["base"], len(refs), topic=header.topic)
        want = {h["base"] + i: batch[r.start : r.start + r.size] for i, r in enumerate(refs)}
        assert got == want, "an accepted batch does not read back as sent"


# ---------------------------------------------------------------------- afterwards


def check_intact(live: Live) -> None:
    """Every acknowledged record reads back as acked, whatever was accepted decodes, and
    no node died or logged an error."""
    for q in range(QUEUES):
        ends = live.acked[q]
        got = live.fetch(q, 0, 1 << 20)
        assert {o: got.get(o) for o in ends} == ends, f"queue {q} lost acknowledged data"
        for offset, record in got.items():  # whatever was accepted, a consumer can read
            msg, _ = decode_record(record, 0, topic=TOPIC, queue=q, offset=offset,
                                   store_ms=0, msg_id="-")
            assert isinstance(msg.properties, dict)
    live.assert_nodes_healthy()


def test_nodes_still_serve_and_acked_data_is_intact(live: Live) -> None:
    # a good produce and fetch on every group (the fixture checks again after every test
    # of the module ran, in whatever order)
    for q in range(QUEUES):
        live.produce(q, [OutgoingMessage(b"after the storm", key="after")], pid=900 + q, seq=3)
    check_intact(live)
