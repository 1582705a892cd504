"""The producer batch: the bytes a client frames, the leader stores and consumers read.

A batch is written once, by the client, and never re-encoded: the leader copies it once,
into the stored entry, behind the 8-byte slot it fills with the store timestamp
(`STORED_PREFIX`), and appends it to the CommitLog as one MESSAGES entry; the broker only
walks record headers to build ConsumeQueue entries; a fetch sends stored record bytes
back verbatim. `encode_batch` says where each record will start in the stored entry when
the batch is the entry's first, which is what message ids are made of, so a client never
parses the layout itself.

A MESSAGES entry holds one or more batches back to back behind the store timestamp (the
batches of one PRODUCE request, for any queues of the group): a batch ends after the `n`
records its header counts, and the next one starts there (`walk_entry`). An entry of one
batch, the only kind older nodes wrote, is the same layout. A batch that is not its
entry's first sits some bytes further on (its shift), which the leader says in the
batch's outcome.

    batch   := "RB" u8 version u8 flags u16 header_len header records
    header  := msgpack map {topic: str, queue: int, pid: int, seq: int, n: int,
               tx?: [tid: str, epoch: int, n: int], half?: [txid: str, producer_group: str],
               delay?: int, at?: int}
               pid/seq are 0/-1 for a producer without idempotence; `tx` (a transaction's
               batch) or `half` (a half message), never both, make it a prepared batch
               (`broker.state.parts.txpart`); an ordinary batch has neither. `delay`
               (ms after the store time) or `at` (ms since the epoch), never both, make
               it a delayed batch: its messages enter their queue when due
               (`broker.state.parts.timers`)
    record  := u32 size u64 born_ms u16 key_len u16 tags_len u32 props_len u32 body_len
               key tags props body            (size counts the whole record)
               props is a msgpack map of str -> str, or empty

All integers are big-endian. `walk_batch` validates every length before anything is
applied, so a malformed batch is refused whole (and `walk_entry` a malformed entry).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import msgpack

from wire.protocol import MAX_MESSAGE_BYTES, Code, RequestError, validate_group_name

__all__ = [
    "MAX_DUE_MS",
    "MAX_KEY_BYTES",
    "MAX_MESSAGE_GROUP_CHARS",
    "MESSAGE_GROUP_PROPERTY",
    "MAX_PROPERTIES_BYTES",
    "MAX_TAGS_BYTES",
    "RECORD_HEADER",
    "STORED_PREFIX",
    "BatchHeader",
    "Message",
    "OutgoingMessage",
    "RecordRef",
    "EncodedBatch",
    "WalkedBatch",
    "WalkedEntry",
    "batch_header",
    "decode_record",
    "message_group_problem",
    "encode_batch",
    "record_size",
    "message_id",
    "parse_message_id",
    "tag_hash",
    "validate_due",
    "validate_half",
    "validate_tx",
    "walk_batch",
    "walk_entry",
]

MAX_TID_CHARS = 255  # a transactional id or half-message txid
# What one record may carry besides its body, checked where a producer's batch comes in
# (`walk_batch(check_properties=True)`): keys are kept in every replica's key index in
# memory, so their size is bounded; properties follow RocketMQ's 32 KiB.
MAX_KEY_BYTES = 1024
MAX_TAGS_BYTES = 255
MAX_PROPERTIES_BYTES = 32 << 10
# The largest `delay`/`at` a stored header may carry (year 2255 as a time); a node takes
# delays up to its own configured maximum (`broker.config.NodeConfig.max_delay_s`).
MAX_DUE_MS = 1 << 43
#: The property that carries a message's message group (FIFO message groups on the simple
#: consumer, `broker.state.parts.receipts`): the name RocketMQ stores a message group
#: (its sharding key) under, so a filter or a consumer sees it as any other property.
MESSAGE_GROUP_PROPERTY = "__SHARDINGKEY"
MAX_MESSAGE_GROUP_CHARS = 255

MAGIC = b"RB"
VERSION = 1
_BATCH_PREFIX = struct.Struct(">2sBBH")
RECORD_HEADER = struct.Struct(">IQHHII")  # size, born_ms, key_len, tags_len, props_len, body_len
STORED_PREFIX = struct.Struct(">Q")  # store timestamp (ms) the leader puts before the batch
# Batch headers are packed by one reused packer: `msgpack.packb` builds a packer per
# call, which costs more than packing the header does. Sharing it across threads is safe:
# packing a map of str and int runs no Python code, so no other thread runs meanwhile.
_HEADER_PACKER = msgpack.Packer(use_bin_type=True)


class BatchHeader(NamedTuple):
    """A batch's header, decoded and checked (a tuple: one is made per batch on every
    replica, and a tuple is made several times faster than a frozen dataclass)."""

    topic: str
    queue: int
    pid: int = 0
    seq: int = -1
    n: int = 0
    tx: tuple[str, int, int] | None = None  # (transactional id, epoch, transaction number)
    half: tuple[str, str] | None = None  # (txid, producer group) of a half message
    delay_ms: int = 0  # due this long after the store time (0: not delayed this way)
    deliver_ms: int = 0  # due at this time, ms since the epoch (0: not delayed this way)

    @property
    def prepared(self) -> bool:
        """A batch of a transaction or a half message: held until decided."""
        return self.tx is not None or self.half is not None

    @property
    def delayed(self) -> bool:
        """A batch whose messages enter their queue when due, not when stored."""
        return self.delay_ms > 0 or self.deliver_ms > 0

    @property
    def held(self) -> bool:
        """A batch whose messages do not enter their queue when stored: prepared (until
        decided) or delayed (until due). Only such a batch is offered to the parts that
        hold batches (`Part.claims_batch`)."""
        return (self.tx is not None or self.half is not None or self.delay_ms > 0
                or self.deliver_ms > 0)

    def due_ms(self, store_ms: int) -> int:
        """When a delayed batch stored at `store_ms` falls due."""
        return store_ms + self.delay_ms if self.delay_ms else self.deliver_ms


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """What a producer sends."""

    body: bytes
    key: str = ""
    tags: str = ""
    properties: dict[str, str] = field(default_factory=dict)


class RecordRef(NamedTuple):
    """Where one record sits inside a batch, and what the broker indexes of it (a tuple:
    one is built per message on the hot path)."""

    start: int  # offset of the record within the batch bytes
    size: int
    key: str
    tag_hash: int


@dataclass(frozen=True, slots=True)
class Message:
    """What a consumer receives."""

    topic: str
    queue: int
    offset: int
    body: bytes
    key: str
    tags: str
    properties: dict[str, str]
    born_ms: int
    store_ms: int
    msg_id: str


def tag_problem(tag: str) -> str | None:
    """Why `tag` could never be selected by a subscription (`"TagA || TagB"`, or a list of
    tags), None when it can be: a message carries one tag, a word without spaces, '|',
    '*' or ','. Producers and subscriptions check tags by this one rule."""
    if not tag:
        return "a tag is not empty"
    if any(c.isspace() or c in "|*," for c in tag):
        return (f"tag {tag!r} has a space, '|', '*' or ',': a message carries one tag, "
                "and a subscription selects several as 'TagA || TagB' or a list")
    return None


def message_group_problem(group: object) -> str | None:
    """Why `group` cannot be a message group, None when it can: a str of 1-255
    characters. Producers check it before sending; a node receiving for a simple
    consumer takes a stored value it would refuse as no group at all."""
    if not isinstance(group, str):
        return f"a message group is a str, not {type(group).__name__}"
    if not group:
        return "a message group is not empty"
    if len(group) > MAX_MESSAGE_GROUP_CHARS:
        return (f"a message group has at most {MAX_MESSAGE_GROUP_CHARS} characters, "
                f"this one {len(group)}")
    return None


def tag_hash(tags: str) -> int:
    """32-bit hash kept in the ConsumeQueue so tag filtering needs no CommitLog read."""
    return zlib.crc32(tags.encode()) if tags else 0


def message_id(group: str, index: int, start: int) -> str:
    """Unique and resolvable: the Raft group, the log index of the batch, and where the
    record starts in that entry's data."""
    return f"{group}:{index}:{start}"


def parse_message_id(msg_id: str) -> tuple[str, int, int]:
    try:
        group, index, start = msg_id.rsplit(":", 2)
        return group, int(index), int(start)
    except ValueError:
        raise RequestError(Code.MALFORMED, f"bad message id {msg_id!r}") from None


class EncodedBatch(bytes):
    """A batch's bytes, plus `starts`: where each record begins in the stored entry
    (behind the leader's store timestamp) when the batch is the entry's first, the
    position a message id names (plus the batch's shift otherwise)."""

    starts: tuple[int, ...]


class WalkedBatch(NamedTuple):
    """A batch the leader already walked (`walk_batch` with `max_message_bytes`) before
    proposing it: handed back with the entry at apply so it is not walked twice."""

    header: BatchHeader
    refs: list[RecordRef]
    max_message_bytes: int


class WalkedEntry(NamedTuple):
    """The batches of a multi-batch entry as the leader walked them before proposing it
    (what `walk_entry` with `max_message_bytes` gives), handed back at apply likewise."""

    batches: list[tuple[BatchHeader, list[RecordRef]]]
    max_message_bytes: int


def record_size(msg: OutgoingMessage | bytes) -> int:
    """Bytes the message takes in a batch."""
    if type(msg) is bytes:
        return RECORD_HEADER.size + len(msg)
    assert isinstance(msg, OutgoingMessage)
    if not (msg.key or msg.tags or msg.properties):
        return RECORD_HEADER.size + len(msg.body)  # the common case, per message
    props = msgpack.packb(msg.properties, use_bin_type=True) if msg.properties else b""
    return (
        RECORD_HEADER.size + len(msg.key.encode()) + len(msg.tags.encode()) + len(props)
        + len(msg.body)
    )


def encode_batch(
    topic: str,
    queue: int,
    messages: Sequence[OutgoingMessage | bytes],
    *,
    pid: int = 0,
    seq: int = -1,
    born_ms: int = 0,
    tx: tuple[str, int, int] | None = None,
    half: tuple[str, str] | None = None,
    delay_ms: int = 0,
    deliver_ms: int = 0,
) -> EncodedBatch:
    """The batch's bytes; `.starts` on them says where each record will sit in the
    stored entry. `tx` (tid, epoch, n) or `half` (txid, producer group) make it a
    prepared batch (RequestError MALFORMED if invalid, or both are given); `delay_ms`
    (after the store time) or `deliver_ms` (since the epoch) a delayed one."""
    if tx is None and half is None and not delay_ms and not deliver_ms:
        header = _HEADER_PACKER.pack(
            {"topic": topic, "queue": queue, "pid": pid, "seq": seq, "n": len(messages)})
    else:
        h: dict[str, Any] = {"topic": topic, "queue": queue, "pid": pid, "seq": seq,
                             "n": len(messages)}
        if tx is not None and half is not None:
            raise _bad("a batch is either a transaction's (tx) or a half message (half)")
        if tx is not None:
            h["tx"] = list(validate_tx(list(tx)))
        if half is not None:
            h["half"] = list(validate_half(list(half)))
        if delay_ms and deliver_ms:
            raise _bad("a batch is delayed either by a delay or to a time, not both")
        if delay_ms:
            h["delay"] = validate_due("delay", delay_ms)
        if deliver_ms:
            h["at"] = validate_due("at", deliver_ms)
        header = _HEADER_PACKER.pack(h)
    pos = STORED_PREFIX.size + _BATCH_PREFIX.size + len(header)
    if len(messages) == 1 and type(messages[0]) is bytes:
        # one bare body, the batch of a producer spreading sends over many queues: the
        # same bytes as the loop below makes, without its lists
        body = messages[0]
        size = RECORD_HEADER.size + len(body)
        one = EncodedBatch(b"".join((
            _BATCH_PREFIX.pack(MAGIC, VERSION, 0, len(header)), header,
            RECORD_HEADER.pack(size, born_ms, 0, 0, 0, len(body)), body)))
        one.starts = (pos,)
        return one
    parts: list[bytes] = [_BATCH_PREFIX.pack(MAGIC, VERSION, 0, len(header)), header]
    starts: list[int] = []
    for m in messages:
        starts.append(pos)
        if isinstance(m, bytes):  # a bare body: no key, tags or properties
            size = RECORD_HEADER.size + len(m)
            parts.append(RECORD_HEADER.pack(size, born_ms, 0, 0, 0, len(m)))
            parts.append(m)
            pos += size
            continue
        key = m.key.encode()
        tags = m.tags.encode()
        props = msgpack.packb(m.properties, use_bin_type=True) if m.properties else b""
        size = RECORD_HEADER.size + len(key) + len(tags) + len(props) + len(m.body)
        parts.append(
            RECORD_HEADER.pack(size, born_ms, len(key), len(tags), len(props), len(m.body))
        )
        parts += (key, tags, props, m.body)
        pos += size
    batch = EncodedBatch(b"".join(parts))
    batch.starts = tuple(starts)
    return batch


def _bad(msg: str) -> RequestError:
    return RequestError(Code.MALFORMED, f"malformed batch: {msg}")


def walk_batch(
    batch: bytes | memoryview,
    base: int = 0,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    *,
    check_properties: bool = False,
    whole: bool = True,
) -> tuple[BatchHeader, list[RecordRef]]:
    """Validate a batch starting at `base` in `batch` and locate its records.

    `RecordRef.start` is relative to `batch` (so `base` is included). Raises
    `RequestError` (MALFORMED or MESSAGE_TOO_LARGE) without side effects.
    `check_properties` also refuses records whose properties are not a msgpack map of
    str -> str, which no consumer could decode: the produce path asks for it, before
    anything is written; applying entries does not (it must accept what was logged).
    It rides the same pass over the records, as one walk per message is the cost here.
    With `whole` the batch must end where `batch` does; without, it ends after the
    records its header counts (the last ref's end), as inside a multi-batch entry.
    """
    mv = memoryview(batch)
    if len(mv) - base < _BATCH_PREFIX.size:
        raise _bad("shorter than its prefix")
    magic, version, _flags, hlen = _BATCH_PREFIX.unpack_from(mv, base)
    if magic != MAGIC or version != VERSION:
        raise _bad(f"bad magic/version {bytes(magic)!r}/{version}")
    hstart = base + _BATCH_PREFIX.size
    if hstart + hlen > len(mv):
        raise _bad("header runs past the end")
    raw = bytes(mv[hstart : hstart + hlen])
    header = _HEADERS.get(raw)
    if header is None:
        header = _decode_header(raw)
    pos = hstart + hlen
    end = len(mv)
    if header.n == 1:
        one = _single_ref(mv, pos, end, whole, max_message_bytes)
        if one is not None:
            return header, one
    elif header.n > 1 and end - pos >= RECORD_HEADER.size:
        # a batch of same-size bare records ends n records on; inside a multi-batch
        # entry (not `whole`) another batch may follow it
        span = int.from_bytes(mv[pos : pos + 4], "big") * header.n
        if span == end - pos or (not whole and 0 < span < end - pos):
            same = _uniform_refs(mv, pos, pos + span, header.n, max_message_bytes)
            if same is not None:
                return header, same
    refs: list[RecordRef] = []
    bad_props = -1  # the first record with undecodable properties, reported last
    # One pass per message on every replica is the broker's main cost per entry: the
    # loop keeps its lookups local and builds each RecordRef without a Python-level call.
    unpack, hsize = RECORD_HEADER.unpack_from, RECORD_HEADER.size
    add, new = refs.append, tuple.__new__
    for i in range(header.n):
        if end - pos < hsize:
            if pos == end:
                raise _bad(f"header says {header.n} records, found {i}")
            raise _bad(f"record {i} header truncated")
        size, _born, klen, tlen, plen, blen = unpack(mv, pos)
        if size != hsize + klen + tlen + plen + blen or pos + size > end:
            raise _bad(f"record {i} lengths are inconsistent")
        if blen > max_message_bytes:
            raise RequestError(
                Code.MESSAGE_TOO_LARGE,
                f"message body of {blen} bytes exceeds the limit of {max_message_bytes}",
            )
        if check_properties and (plen or klen or tlen):
            if klen > MAX_KEY_BYTES or tlen > MAX_TAGS_BYTES or plen > MAX_PROPERTIES_BYTES:
                raise _bad(f"record {i}: key, tags and properties are limited to "
                           f"{MAX_KEY_BYTES}, {MAX_TAGS_BYTES} and {MAX_PROPERTIES_BYTES} "
                           f"bytes; it has {klen}, {tlen} and {plen}")
            p = pos + hsize + klen + tlen
            if plen and bad_props < 0 and not _string_map(mv[p : p + plen]):
                bad_props = i
        if klen or tlen:
            kstart = pos + hsize
            try:
                key = str(mv[kstart : kstart + klen], "utf-8") if klen else ""
                tags = str(mv[kstart + klen : kstart + klen + tlen], "utf-8") if tlen else ""
            except UnicodeDecodeError:
                raise _bad(f"record {i} key or tags are not UTF-8") from None
            add(new(RecordRef, (pos, size, key, tag_hash(tags))))
        else:
            add(new(RecordRef, (pos, size, "", 0)))
        pos += size
    if whole and pos != end:
        raise _bad(_trailing(mv, pos, header.n))
    if bad_props >= 0:
        raise _bad(f"record {bad_props} properties are not a map of strings")
    return header, refs


def _single_ref(
    mv: memoryview, pos: int, end: int, whole: bool, max_message_bytes: int
) -> list[RecordRef] | None:
    """The record of a batch of one bare body (no key, tags or properties) starting at
    `pos`, None when the batch is not of that shape (the caller walks it in full): the
    batch of a producer spreading sends over many queues, where the walk is paid once
    per message. What it accepts, the full walk accepts too, with the same ref."""
    if end - pos < RECORD_HEADER.size:
        return None
    size, _born, klen, tlen, plen, blen = RECORD_HEADER.unpack_from(mv, pos)
    if (klen or tlen or plen or size != RECORD_HEADER.size + blen or blen > max_message_bytes
            or not (pos + size == end or (not whole and pos + size < end))):
        return None
    return [tuple.__new__(RecordRef, (pos, size, "", 0))]


# Where a record header's fields sit: the bytes every record of a uniform batch shares
# (all but the producer's born_ms).
_SHARED_HEADER_BYTES = (*range(0, 4), *range(12, RECORD_HEADER.size))


def _uniform_refs(
    mv: memoryview, pos: int, end: int, n: int, max_message_bytes: int
) -> list[RecordRef] | None:
    """The records of a batch whose `n` messages are all bare bodies of one size (no key,
    tags or properties), checked column by column over the headers instead of record by
    record; None when the batch is not of that shape (the caller walks it in full).

    What it accepts, the full walk accepts too, with the same refs: every header says the
    same whole-record size, zero key, tags and properties lengths and the body length
    that makes the sizes agree, and the records tile the rest of the batch exactly."""
    if n < 2 or end - pos < RECORD_HEADER.size:
        return None
    size = int.from_bytes(mv[pos : pos + 4], "big")
    blen = size - RECORD_HEADER.size
    if blen < 0 or size * n != end - pos or blen > max_message_bytes:
        return None
    first = RECORD_HEADER.pack(size, 0, 0, 0, 0, blen)
    if mv[pos + 12 : pos + RECORD_HEADER.size] != first[12:]:
        return None
    for k in _SHARED_HEADER_BYTES:  # each: the k-th header byte of every record at once
        if mv[pos + k : end : size] != first[k : k + 1] * n:
            return None
    starts = range(pos, end, size)  # each RecordRef built in C, no bytecode per message
    return list(map(tuple.__new__, repeat(RecordRef, n), zip(starts, repeat(size), repeat(""),
                                                             repeat(0))))


def _trailing(mv: memoryview, pos: int, n: int) -> str:
    """What the bytes after a batch's `n` records are, when they should be nothing."""
    end, more = len(mv), 0
    while end - pos >= RECORD_HEADER.size:
        (size,) = struct.unpack_from(">I", mv, pos)
        if size < RECORD_HEADER.size or pos + size > end:
            break
        pos += size
        more += 1
    if more and pos == end:
        return f"header says {n} records, found {n + more}"
    if end - pos < RECORD_HEADER.size:
        return f"record {n + more} header truncated"
    return f"record {n + more} lengths are inconsistent"


def walk_entry(
    data: bytes | memoryview, max_message_bytes: int = MAX_MESSAGE_BYTES
) -> list[tuple[BatchHeader, list[RecordRef]]]:
    """The batches of a MESSAGES entry's data (store timestamp, then one or more batches
    back to back), each walked as `walk_batch` does, refs relative to `data`. Raises
    `RequestError` for the entry as a whole when any batch is malformed or too large:
    its batches can then not be told apart, and the leader never proposes such an entry.
    """
    end = len(data)
    pos = STORED_PREFIX.size
    if end <= pos:
        raise _bad(f"an entry of {end} bytes holds no batch")
    out: list[tuple[BatchHeader, list[RecordRef]]] = []
    while pos < end:
        header, refs = walk_batch(data, pos, max_message_bytes, whole=False)
        out.append((header, refs))
        last = refs[-1]
        pos = last.start + last.size
    return out


# Decoded batch headers by their bytes. A producer without idempotence sends the same
# header for every batch of a queue with the same count, so most batches skip the msgpack
# decode and the checks. Only valid headers of at most `_HEADER_CACHED_BYTES` are kept
# (a real one is under 700 bytes even with a 255-character transactional id; a client
# padding headers with unknown keys up to 64 KiB must not make the table hold 4 GiB);
# bounded by clearing when full, and sized for a producer spreading single messages over
# 10,000 topics of 4 queues (some 20 MB at most, 64 MiB of keys at worst): a smaller
# table cycled through by 40,000 headers hits nothing.
_HEADERS: dict[bytes, BatchHeader] = {}
_HEADERS_MAX = 1 << 16
_HEADER_CACHED_BYTES = 1024


def _decode_header(raw: bytes) -> BatchHeader:
    try:
        h = msgpack.unpackb(raw, raw=False)
    except Exception as exc:
        raise _bad(f"undecodable header ({exc})") from exc
    if not isinstance(h, dict):
        raise _bad("header is not a map")
    header = _header(h)
    if len(raw) > _HEADER_CACHED_BYTES:
        return header
    if len(_HEADERS) >= _HEADERS_MAX:
        _HEADERS.clear()
    _HEADERS[raw] = header
    return header


def _string_map(data: memoryview) -> bool:
    try:
        props = msgpack.unpackb(data, raw=False)
    except Exception:  # msgpack raises several unrelated types
        return False
    return isinstance(props, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in props.items()
    )


def validate_tx(tx: object) -> tuple[str, int, int]:
    """A header's `tx` value as (tid, epoch, n); RequestError MALFORMED if it is not one."""
    if not isinstance(tx, list | tuple) or len(tx) != 3:
        raise _bad("tx must be [transactional id, epoch, transaction number]")
    tid, epoch, n = tx
    if not valid_tid(tid):
        raise _bad(f"bad transactional id {tid!r}: 1-{MAX_TID_CHARS} printable characters")
    if type(epoch) is not int or type(n) is not int or epoch < 0 or n < 0:  # noqa: E721
        raise _bad(f"tx epoch and number must be integers >= 0, got {epoch!r}, {n!r}")
    if epoch >= 1 << 63 or n >= 1 << 63:
        raise _bad("tx epoch or number out of range")
    return tid, epoch, n


def validate_half(half: object) -> tuple[str, str]:
    """A header's `half` value as (txid, producer group); RequestError MALFORMED if not."""
    if not isinstance(half, list | tuple) or len(half) != 2:
        raise _bad("half must be [txid, producer group]")
    txid, pg = half
    if not valid_tid(txid):
        raise _bad(f"bad half-message txid {txid!r}: 1-{MAX_TID_CHARS} printable characters")
    try:
        validate_group_name(pg)
    except RequestError as exc:
        raise _bad(f"half-message producer group: {exc.message}") from None
    return txid, pg


def valid_tid(tid: object) -> bool:
    """Whether `tid` may name a transaction: 1..255 printable characters."""
    return (isinstance(tid, str) and 0 < len(tid) <= MAX_TID_CHARS and tid.isprintable()
            and tid.strip() == tid)


def _header(h: dict[str, Any]) -> BatchHeader:
    topic, queue = h.get("topic"), h.get("queue")
    pid, seq, n = h.get("pid", 0), h.get("seq", -1), h.get("n")
    # one header is decoded per batch on every replica: a good one passes one test; what
    # it refuses, the checks below refuse too, each with its reason
    if (type(topic) is str and topic and type(queue) is int and type(pid) is int  # noqa: E721
            and type(seq) is int and type(n) is int  # noqa: E721
            and queue >= 0 and n >= 1 and pid >= 0 and seq >= -1 and (seq >= 0 or not pid)):
        if "tx" not in h and "half" not in h and "delay" not in h and "at" not in h:
            return BatchHeader(topic, queue, pid, seq, n)
        return _prepared_header(h, BatchHeader(topic, queue, pid, seq, n))
    if not isinstance(topic, str) or not topic:
        raise _bad("topic missing")
    if not (type(queue) is int and type(pid) is int and type(seq) is int  # noqa: E721
            and type(n) is int):  # (bool is an int subclass: refused too)
        for name, v in (("queue", queue), ("pid", pid), ("seq", seq), ("n", n)):
            if type(v) is not int:  # noqa: E721
                raise _bad(f"{name} is not an integer")
    assert isinstance(queue, int) and isinstance(pid, int) and isinstance(seq, int)
    assert isinstance(n, int)
    if queue < 0 or n < 1 or pid < 0 or seq < -1:
        raise _bad("negative queue/pid/seq or empty batch")
    if pid and seq < 0:
        raise _bad("an idempotent batch (pid != 0) needs a sequence")
    return _prepared_header(h, BatchHeader(topic, queue, pid, seq, n))


def validate_due(name: str, v: object) -> int:
    """A header's `delay` or `at` value (ms): an integer in 1..MAX_DUE_MS, else MALFORMED.
    (How far ahead a node accepts is its own limit, checked where a batch comes in.)"""
    if type(v) is not int or not 0 < v <= MAX_DUE_MS:  # noqa: E721  (bool: refused)
        raise _bad(f"{name} must be an integer number of ms in 1..{MAX_DUE_MS}, got {v!r}")
    return v


def _prepared_header(h: dict[str, Any], header: BatchHeader) -> BatchHeader:
    """`header` with the `tx` or `half` field of `h` (MALFORMED if both, or bad), and
    its `delay` or `at` field."""
    if "delay" in h or "at" in h:
        delay, at = h.get("delay"), h.get("at")
        if delay is not None and at is not None:
            raise _bad("a batch is delayed either by a delay or to a time, not both")
        if delay is not None:
            header = header._replace(delay_ms=validate_due("delay", delay))
        elif at is not None:
            header = header._replace(deliver_ms=validate_due("at", at))
    tx, half = h.get("tx"), h.get("half")
    if tx is None and half is None:
        return header
    if tx is not None and half is not None:
        raise _bad("a batch is either a transaction's (tx) or a half message (half)")
    if tx is not None:
        return header._replace(tx=validate_tx(tx))
    return header._replace(half=validate_half(half))


def decode_record(
    data: bytes | memoryview,
    start: int,
    *,
    topic: str,
    queue: int,
    offset: int,
    store_ms: int,
    msg_id: str,
) -> tuple[Message, int]:
    """Decode the record at `start`; returns the message and the offset after it."""
    size, born, klen, tlen, plen, blen = RECORD_HEADER.unpack_from(data, start)
    p = start + RECORD_HEADER.size
    mv = memoryview(data)
    key = str(mv[p : p + klen], "utf-8")
    p += klen
    tags = str(mv[p : p + tlen], "utf-8")
    p += tlen
    props = msgpack.unpackb(mv[p : p + plen], raw=False) if plen else {}
    p += plen
    body = bytes(mv[p : p + blen])
    msg = Message(topic, queue, offset, body, key, tags, props, born, store_ms, msg_id)
    return msg, start + size


def iter_records(data: bytes | memoryview) -> Iterator[tuple[int, int]]:
    """(start, size) of each record in a concatenation of records (a fetch body)."""
    pos, end = 0, len(data)
    while pos < end:
        (size,) = struct.unpack_from(">I", data, pos)
        if size < RECORD_HEADER.size or pos + size > end:
            raise _bad("record sizes do not add up")
        yield pos, size
        pos += size


def batch_header(batch: bytes | memoryview) -> BatchHeader:
    """The header of the batch `batch` starts with, read without walking its records
    (authorization needs the topic before anything else is done). Raises RequestError
    (MALFORMED) like `walk_batch`."""
    mv = memoryview(batch)
    if len(mv) < _BATCH_PREFIX.size:
        raise _bad("shorter than its prefix")
    magic, version, _flags, hlen = _BATCH_PREFIX.unpack_from(mv, 0)
    if magic != MAGIC or version != VERSION:
        raise _bad(f"bad magic/version {bytes(magic)!r}/{version}")
    if _BATCH_PREFIX.size + hlen > len(mv):
        raise _bad("header runs past the end")
    raw = bytes(mv[_BATCH_PREFIX.size : _BATCH_PREFIX.size + hlen])
    header = _HEADERS.get(raw)
    return header if header is not None else _decode_header(raw)
