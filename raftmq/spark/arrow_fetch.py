"""A FETCH answer straight into one Arrow record batch of the source's schema.

The SDK's `decode_fetch` builds a `Message` per record, and the Arrow columns were then
built from those objects again: some 5 µs of CPU per 100-byte message, most of what a
Spark worker spent per row. Here the records are located in one pass (none at all when
every record has the same size, as a producer's bare bodies do), their headers are read
as one NumPy array, and each column is made from buffers: the bodies, keys and tags are cut out of the
answer's body by Arrow (`take` over an offsets buffer laid on it, no Python per row), the
times, offsets and message ids come from the answer header's rows as arrays. Only
properties, where a record has any, are decoded one by one (they are msgpack maps).

The rows are exactly those of `decode_fetch` followed by `schema.messages_to_batch`. A
user-given schema (`schema.columns`) narrows the batch: only its columns are made, and
when none of them comes from the records (`queue`, `offset`, `timestamp`, `msg_id`,
`topic`) and no tag is asked for, the body is not even looked at.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wire.protocol import Code, RequestError
from wire.records import RECORD_HEADER

from .schema import ALL_COLUMNS, ARROW_SCHEMA, Columns

__all__ = ["fetch_to_batch"]

# the record header of `wire.records` (big-endian), as one NumPy record per message
_HEADER = np.dtype([("size", ">u4"), ("born", ">u8"), ("klen", ">u2"), ("tlen", ">u2"),
                    ("plen", ">u4"), ("blen", ">u4")])
_HSIZE = RECORD_HEADER.size
assert _HEADER.itemsize == _HSIZE
_SIZE = struct.Struct(">I")
_HEADER_BYTES = np.arange(_HSIZE, dtype=np.int64)

_TS = ARROW_SCHEMA.field("timestamp").type
_PROPS = ARROW_SCHEMA.field("properties").type
_COLON = pa.scalar(":", pa.string())


def _malformed(msg: str) -> RequestError:
    return RequestError(Code.MALFORMED, f"FETCH answer: {msg}")


def _starts(body: bytes | memoryview, raw: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """Where each of the `n` records of `body` (`raw`, as bytes) starts, and their common
    size (0 when they differ). Bounds are checked here; the other lengths by the caller."""
    end = len(body)
    if end >= 4:
        (size,) = _SIZE.unpack_from(body, 0)
        if size >= _HSIZE and size * n == end and (  # every record says that size too
                np.ascontiguousarray(raw.reshape(n, size)[:, :4]).view(">u4") == size).all():
            return np.arange(0, end, size, dtype=np.int64), size
    starts: list[int] = []
    add, unpack = starts.append, _SIZE.unpack_from
    pos = 0
    while pos < end:
        if end - pos < _HSIZE:
            raise _malformed("a record header is truncated")
        (size,) = unpack(body, pos)
        if size < _HSIZE or pos + size > end:
            raise _malformed("record sizes do not add up")
        add(pos)
        pos += size
    if len(starts) != n:
        raise _malformed(f"lists {n} messages but carries {len(starts)}")
    return np.array(starts, dtype=np.int64), 0


def _cut(buf: pa.Buffer, type_: pa.DataType, start: np.ndarray, length: np.ndarray
         ) -> pa.Array:
    """Values `buf[start[i] : start[i] + length[i]]` as one array of `type_`, copied by
    Arrow: an array over `buf` whose even elements are the values and odd ones the bytes
    between them (offsets only grow: the records are in order), then its even elements."""
    n = len(start)
    offsets = np.empty(2 * n, dtype=np.int64)
    offsets[0::2] = start
    offsets[1::2] = start + length
    if buf.size < 1 << 31:
        spread = pa.Array.from_buffers(type_, 2 * n - 1,
                                       [None, pa.py_buffer(offsets.astype(np.int32)), buf])
        return spread.take(pa.array(np.arange(0, 2 * n, 2)))
    large = pa.large_binary() if type_ == pa.binary() else pa.large_string()
    spread = pa.Array.from_buffers(large, 2 * n - 1, [None, pa.py_buffer(offsets), buf])
    return spread.take(pa.array(np.arange(0, 2 * n, 2))).cast(type_)


def _text(buf: pa.Buffer, start: np.ndarray, length: np.ndarray, what: str) -> pa.Array:
    """UTF-8 fields (keys, tags): empty strings when no record has one."""
    if not length.any():
        return _empty(len(start), pa.string())
    arr = _cut(buf, pa.string(), start, length)
    try:
        arr.validate(full=True)  # UTF-8, as the broker checked when it stored them
    except pa.ArrowInvalid:
        raise _malformed(f"a record's {what} are not UTF-8") from None
    return arr


@lru_cache(maxsize=8)
def _empty(n: int, type_: pa.DataType) -> pa.Array:
    """`n` empty strings or byte strings."""
    return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(np.zeros(n + 1, np.int32)),
                                            pa.py_buffer(b"")])


@lru_cache(maxsize=8)
def _empty_maps(n: int, type_: pa.DataType) -> pa.Array:
    return pa.array([[]] * n, type_)


def _same(value: str, n: int) -> pa.Array:
    """`n` times `value` (the topic), as a string array."""
    raw = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(raw * n)])


def _properties(body: bytes | memoryview, start: np.ndarray, length: np.ndarray,
                type_: pa.DataType = _PROPS) -> pa.Array:
    """Properties (msgpack maps), decoded only for the records that have any."""
    n = len(start)
    present = np.flatnonzero(length)
    if not len(present):
        return _empty_maps(n, type_)
    mv = memoryview(body)
    items: list[Any] = [[]] * n
    try:
        for i in present.tolist():
            p = int(start[i])
            items[i] = list(msgpack.unpackb(mv[p : p + int(length[i])], raw=False).items())
        return pa.array(items, type_)
    except Exception:  # msgpack and pyarrow raise several unrelated types
        raise _malformed("a record's properties are not a map of strings") from None


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(_TS, len(ms), [None, pa.py_buffer(ms.astype(np.int64) * 1000)])


# the columns made from the records in the body (the others come from the answer's header)
_FROM_BODY = frozenset({"key", "value", "born_timestamp", "tags", "properties"})


def fetch_to_batch(topic: str, queue: int, group: str, header: Mapping[str, Any],
                   body: bytes | memoryview, *, tags: Sequence[str] | None = None,
                   end: int | None = None, columns: Columns = ALL_COLUMNS) -> pa.RecordBatch:
    """The messages of a FETCH answer (`header["msgs"]` rows [offset, index, start,
    store_ms] describe the records concatenated in `body`) as one record batch of
    `columns` (all of `ARROW_SCHEMA` by default; only the columns asked for are built,
    and the body is not even read when none of them comes from it): with `tags`, only the
    messages with one of them (the broker filters by tag hash only); with `end`, only
    those at offsets below it. A malformed answer is a `RequestError` MALFORMED."""
    rows = header.get("msgs") or []
    n = len(rows)
    if n == 0:
        if len(body):
            raise _malformed("lists no message but carries some")
        return pa.RecordBatch.from_pylist([], schema=columns.arrow)
    try:
        meta = np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=4 * n).reshape(n, 4)
    except (TypeError, ValueError):
        raise _malformed("message rows are not [offset, index, start, store_ms]") from None
    wanted = set(columns.names)
    if tags or wanted & _FROM_BODY:
        records = _Records(body, n)
    built: dict[str, pa.Array] = {}
    for name, field in zip(columns.names, columns.arrow, strict=True):
        if name == "key":
            built[name] = records.key(field.type)
        elif name == "value":
            built[name] = records.value(field.type, topic, queue, meta)
        elif name == "topic":
            built[name] = _same(topic, n)
        elif name == "queue":
            built[name] = pa.array(np.full(n, queue, dtype=np.int32))
        elif name == "offset":
            built[name] = pa.array(meta[:, 0])
        elif name == "timestamp":
            built[name] = _timestamps(meta[:, 3])
        elif name == "born_timestamp":
            built[name] = _timestamps(records.heads["born"])
        elif name == "tags":
            built[name] = records.tags()
        elif name == "properties":
            built[name] = records.properties(field.type)
        else:
            assert name == "msg_id", name
            index, start = pa.array(meta[:, 1]), pa.array(meta[:, 2])
            # (scalars made here: a bare str costs pyarrow a failed import per call)
            built[name] = pc.binary_join_element_wise(
                pa.scalar(group, pa.string()), index.cast(pa.string()),
                start.cast(pa.string()), _COLON)
    batch = pa.RecordBatch.from_arrays([built[name] for name in columns.names],
                                       schema=columns.arrow)
    keep = n
    if end is not None and meta[-1, 0] >= end:
        keep = int(np.searchsorted(meta[:, 0], end))
        batch = batch.slice(0, keep)
    if tags:
        tag_column = built["tags"] if "tags" in built else records.tags()
        batch = batch.filter(pc.is_in(tag_column.slice(0, keep),
                                      value_set=pa.array(sorted(set(tags)), pa.string())))
    return batch


class _Records:
    """The records of a FETCH answer's body, located and length-checked once; each
    column is cut from them on demand."""

    def __init__(self, body: bytes | memoryview, n: int) -> None:
        raw = np.frombuffer(body, dtype=np.uint8)
        starts, same = _starts(body, raw, n)
        if same:
            heads = np.ascontiguousarray(raw.reshape(n, same)[:, :_HSIZE]).view(_HEADER)[:, 0]
        else:
            heads = raw[starts[:, None] + _HEADER_BYTES].view(_HEADER)[:, 0]
        size = heads["size"].astype(np.int64)
        self.klen = heads["klen"].astype(np.int64)
        self.tlen = heads["tlen"].astype(np.int64)
        self.plen = heads["plen"].astype(np.int64)
        self.blen = heads["blen"].astype(np.int64)
        if not np.array_equal(size, _HSIZE + self.klen + self.tlen + self.plen + self.blen):
            raise _malformed("record lengths are inconsistent")
        self.body, self.raw, self.n, self.same, self.heads = body, raw, n, same, heads
        self.buf = pa.py_buffer(body)
        self.kstart = starts + _HSIZE
        self._tags: pa.Array | None = None

    def key(self, type_: pa.DataType) -> pa.Array:
        if type_ == pa.binary():  # (keys are UTF-8: the broker checked when it stored them)
            if not self.klen.any():
                return _empty(self.n, pa.binary())
            return _cut(self.buf, pa.binary(), self.kstart, self.klen)
        return _text(self.buf, self.kstart, self.klen, "keys")

    def value(self, type_: pa.DataType, topic: str, queue: int, meta: np.ndarray
              ) -> pa.Array:
        n, same = self.n, self.same
        if same and not (self.klen.any() or self.tlen.any() or self.plen.any()):
            width = same - _HSIZE  # bare bodies at a fixed stride: one strided copy
            data = np.ascontiguousarray(self.raw.reshape(n, same)[:, _HSIZE:])
            value = pa.Array.from_buffers(pa.binary(), n, [
                None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * width),
                pa.py_buffer(data)])
        else:
            value = _cut(self.buf, pa.binary(), self.kstart + self.klen + self.tlen + self.plen,
                         self.blen)
        if type_ == pa.binary():
            return value
        text = value.view(pa.string())
        try:
            text.validate(full=True)
        except pa.ArrowInvalid:
            raise ValueError(
                f"raftmq source: {topic} queue {queue}: a message body at offsets "
                f"{int(meta[0, 0])}..{int(meta[-1, 0])} is not UTF-8 text; read `value` "
                "as BINARY and decode it in the query") from None
        return text

    def tags(self) -> pa.Array:
        if self._tags is None:
            self._tags = _text(self.buf, self.kstart + self.klen, self.tlen, "tags")
        return self._tags

    def properties(self, type_: pa.DataType) -> pa.Array:
        return _properties(self.body, self.kstart + self.klen + self.tlen, self.plen, type_)
