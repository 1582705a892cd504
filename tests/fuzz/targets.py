"""The fuzz targets: bytes in, only documented errors out (see the package docstring)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from broker.doors.security import RULES
from broker.state.cqchunks import CorruptChunk
from broker.state.statemachine import BrokerState
from namesrv.registry import parse_registration
from raftlog.commitlog import CommitLog, CommitLogError
from raftlog.fsutil import CorruptFile
from raftmq.filter import FilterError
from raftmq.filter import compile as compile_filter
from wire.produce import split_batches
from wire.protocol import FrameDecoder, ProtocolError, RequestError
from wire.records import STORED_PREFIX, batch_header, decode_record, walk_batch, walk_entry

__all__ = ["TARGETS", "batch", "commitlog", "filter_expression", "frame", "seeds", "snapshot"]

MAX_FRAME = 1 << 20


def frame(data: bytes) -> None:
    """The frame decoder, fed in two pieces, then each frame's request decoding: the
    name server's REGISTER parser and every authorization rule (which read topics, groups
    and batch headers out of requests before any handler runs)."""
    dec = FrameDecoder(MAX_FRAME)
    cut = data[0] if data else 0
    frames = []
    try:
        for part in (data[1 : 1 + cut], data[1 + cut :]):
            dec.feed(part)
            while (f := dec.next_frame()) is not None:
                frames.append(f)
    except ProtocolError:
        pass
    for f in frames:
        h = f.header
        try:
            parse_registration(h, f.body)
        except (RequestError, ValueError):
            pass
        op = h.get("op")
        rule = RULES.get(op) if isinstance(op, int) else None
        if callable(rule):
            try:
                rule(h, f.body)
            except RequestError:
                pass
        try:
            split_batches(h.get("sizes"), f.body)
        except RequestError:
            pass


def batch(data: bytes) -> None:
    """A producer batch, alone and as a stored entry; every record it locates decodes."""
    for whole in (True, False):
        try:
            header, refs = walk_batch(data, check_properties=True, whole=whole)
        except RequestError:
            continue
        for i, ref in enumerate(refs):
            decode_record(data, ref.start, topic=header.topic, queue=header.queue, offset=i,
                          store_ms=0, msg_id="m")
    try:
        batch_header(data)
    except RequestError:
        pass
    try:
        walk_entry(STORED_PREFIX.pack(1) + data)
    except RequestError:
        pass


# ---------------------------------------------------------------------- snapshots


def _seed_state() -> BrokerState:
    from broker.state.parts.acls import Acl, AclAdd
    from broker.state.parts.users import UserPut
    from broker.state.statemachine import control_create_topic, control_offsets
    from raftlog.types import Entry, EntryType
    from wire.records import OutgoingMessage, encode_batch

    s = BrokerState("g0", chunk_records=4)
    datas: list[tuple[EntryType, bytes]] = [
        (EntryType.CONTROL, control_create_topic("t", 2, [0, 1])),
    ]
    for q in (0, 1):
        b = encode_batch("t", q, [OutgoingMessage(b"body", key="k", tags="a",
                                                  properties={"p": "v"})] * 5)
        datas.append((EntryType.MESSAGES, STORED_PREFIX.pack(7) + bytes(b)))
    datas.append((EntryType.CONTROL, control_offsets("cg", [("t", 0, 3)])))
    datas.append((EntryType.CONTROL, UserPut("u", b"s" * 16, 4096, b"k" * 32,
                                             b"v" * 32).encode()))
    datas.append((EntryType.CONTROL, AclAdd(Acl("u", "topic", "prefix", "t", "publish",
                                                "allow")).encode()))
    for i, (kind, d) in enumerate(datas, start=1):
        s.apply(Entry(term=1, index=i, type=kind, data=d))
    return s


_SNAPSHOT_STATE: list[BrokerState] = []


def snapshot(data: bytes) -> None:
    """Restoring a snapshot: ValueError or a corrupt chunk, nothing else; what restores
    snapshots again to the same bytes."""
    if not _SNAPSHOT_STATE:
        _SNAPSHOT_STATE.append(_seed_state())  # its chunk store holds the seed's chunks
    store = _SNAPSHOT_STATE[0].chunk_store
    try:
        s = BrokerState.restore("g0", data, chunk_store=store, chunk_records=4)
    except (ValueError, CorruptChunk, CorruptFile):
        return
    again = s.snapshot()
    assert BrokerState.restore("g0", again, chunk_store=store,
                               chunk_records=4).snapshot() == again


# ---------------------------------------------------------------------- CommitLog

SEGMENT = 4096
_TEMPLATE: dict[str, bytes] = {}
_SCRATCH: list[Path] = []


def _template() -> dict[str, bytes]:
    """The files of a small log (several segments, an index, a base) made once."""
    if not _TEMPLATE:
        from raftlog.types import Entry, EntryType

        d = Path(tempfile.mkdtemp(prefix="raftmq-fuzz-"))
        try:
            log = CommitLog.open(d, segment_size=SEGMENT)
            log.append([Entry(term=1 + i // 10, index=i + 1, type=EntryType.MESSAGES,
                              data=bytes([i]) * (50 + 37 * i)) for i in range(30)])
            log.sync()
            log.close()
            for p in sorted(d.rglob("*")):
                if p.is_file():
                    _TEMPLATE[str(p.relative_to(d))] = p.read_bytes()
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return _TEMPLATE


def _scratch() -> Path:
    if not _SCRATCH:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="raftmq-fuzz-log-", dir=base)))
    return _SCRATCH[0]


def commitlog(data: bytes) -> None:
    """Recovery over damaged files: the input picks a file and edits it (byte XORs at
    positions, then a cut); open must recover or raise CommitLogError, and every entry
    it then claims to hold must read back or raise CommitLogError."""
    files = _template()
    names = sorted(files)
    d = _scratch() / "log"
    shutil.rmtree(d, ignore_errors=True)
    contents = dict(files)
    if data:
        name = names[data[0] % len(names)]
        buf = bytearray(contents[name])
        rest = data[1:]
        while len(rest) >= 3 and buf:
            pos, x = struct.unpack_from(">HB", rest)
            buf[pos % len(buf)] ^= x or 0xFF
            rest = rest[3:]
        if rest:  # a leftover byte cuts the file short
            del buf[len(buf) * rest[0] // 256:]
        contents[name] = bytes(buf)
    for name, content in contents.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content)
    try:
        log = CommitLog.open(d, segment_size=SEGMENT)
    except CommitLogError:
        return
    try:
        for i in range(log.first_index(), log.last_index() + 1):
            try:
                log.entries(i, i + 1, 1 << 20)
            except CommitLogError:
                pass
    finally:
        log.close()


# ---------------------------------------------------------------------- SQL92 filters

_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_FILTER_VALUES = ("1", "5", "-0.0", "1.5", "NaN", "x", "", "true", " 7 ", "0x1p3",
                  "3000000000", "\u0665", "'")


def filter_expression(data: bytes) -> None:
    """A consumer's SQL92 filter, as the broker receives it: compiling raises
    FilterError or gives a predicate, which answers a bool for any properties (here
    the names the text mentions, with values Java reads in different ways)."""
    text = data.decode("utf-8", errors="replace")
    for strict in (False, True):
        try:
            match = compile_filter(text, strict=strict)
        except FilterError:
            continue
        names = _NAME.findall(text)
        for shift in range(3):
            props = {n: _FILTER_VALUES[(i + shift) % len(_FILTER_VALUES)]
                     for i, n in enumerate(names)}
            assert isinstance(match(props), bool)
        assert match({}) in (True, False)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "frame": frame, "batch": batch, "snapshot": snapshot, "commitlog": commitlog,
    "filter": filter_expression,
}


def seeds(name: str) -> list[bytes]:
    """Valid inputs to start from (the corpus grows from them)."""
    from wire.protocol import encode_frame
    from wire.records import OutgoingMessage, encode_batch

    b = bytes(encode_batch("t", 0, [OutgoingMessage(b"hello", key="k", tags="x",
                                                    properties={"a": "b"})] * 3))
    if name == "frame":
        reg: dict[str, Any] = {"op": 40, "id": 1, "node": 1, "addr": "127.0.0.1:7101",
                               "inc": 5, "groups": {"g0": {"role": "leader", "tv": 1}}}
        return [b"\x00" + encode_frame({"op": 10, "id": 1, "g": "g0"}, b),
                b"\x05" + encode_frame({"op": 10, "id": 2, "g": "g0", "sizes": [len(b)]}, b),
                b"\x00" + encode_frame(reg, msgpack.packb({"g0": []})),
                b"\x00" + encode_frame({"op": 12, "id": 3, "cg": "c",
                                        "offsets": [["t", 0, 1]]})]
    if name == "batch":
        return [b]
    if name == "snapshot":
        return [_seed_state().snapshot()]
    if name == "filter":
        return [e.encode() for e in (
            "a > 5 AND b = 'abc'", "a BETWEEN 1 AND 10 OR c IN ('x', 'y')",
            "NOT (a IS NULL) AND a NOT CONTAINS 'z'", "a STARTSWITH 'x' OR a ENDSWITH 'y'",
            "a = TRUE OR -b < 1.5e3 -- comment\n", "(a <> b) = (c >= 2147483648) /* c */",
            "a = 1 )", "TRUE",
        )]
    return [b"", b"\x00\x10\x00\x01", b"\x01\x00\x20\x40\x80"]
