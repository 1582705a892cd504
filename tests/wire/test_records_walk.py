"""`walk_batch`'s shortcuts for batches of same-size bare messages and for a batch of one
bare message give exactly what the record-by-record walk gives, for good batches and
damaged ones alike; the shortcuts for encoding one bare message's batch and for a good
header agree with the general code likewise."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wire.records as records
from wire.protocol import RequestError
from wire.records import STORED_PREFIX, OutgoingMessage, encode_batch, walk_batch

MAX = 40  # a small message size limit, so some batches break it


def _outcome(data: bytes, check_properties: bool) -> Any:
    try:
        return walk_batch(data, STORED_PREFIX.size, MAX, check_properties=check_properties)
    except RequestError as exc:
        return ("refused", exc.code, str(exc))


def _no_shortcuts(m: pytest.MonkeyPatch) -> None:
    """The record-by-record walk only: the shortcuts (same-size bodies, one bare body)
    say they do not apply."""
    m.setattr(records, "_uniform_refs", lambda *a: None)
    m.setattr(records, "_single_ref", lambda *a: None)


def _full_walk(data: bytes, check_properties: bool) -> Any:
    with pytest.MonkeyPatch.context() as m:
        _no_shortcuts(m)
        return _outcome(data, check_properties)


messages = st.one_of(
    # same-size bare bodies: the shortcut's case
    st.tuples(st.integers(1, 40), st.integers(0, MAX + 10)).map(lambda t: [b"u" * t[1]] * t[0]),
    # anything else
    st.lists(st.one_of(st.binary(max_size=50),
                       st.builds(OutgoingMessage, st.binary(max_size=20),
                                 key=st.sampled_from(["", "k"]),
                                 tags=st.sampled_from(["", "t"]))),
             min_size=1, max_size=20),
)


@settings(max_examples=400, deadline=None)
@given(msgs=messages, flip=st.one_of(st.none(), st.tuples(st.booleans(), st.integers(0, 1 << 16),
                                                          st.integers(0, 31), st.integers(1, 255))),
       cut=st.integers(0, 3), check_properties=st.booleans())
def test_the_shortcut_agrees_with_the_full_walk(
    msgs: list[Any], flip: tuple[bool, int, int, int] | None, cut: int, check_properties: bool
) -> None:
    batch = encode_batch("t", 1, msgs)
    data = bytearray(STORED_PREFIX.size) + batch
    if flip is not None:  # damage one byte: anywhere, or in some record's header
        in_header, where, k, xor = flip
        if in_header:
            at = batch.starts[where % len(batch.starts)] + k % records.RECORD_HEADER.size
        else:
            at = STORED_PREFIX.size + where % (len(data) - STORED_PREFIX.size)
        data[at] ^= xor
    if cut:
        del data[-cut:]
    assert _outcome(bytes(data), check_properties) == _full_walk(bytes(data), check_properties)


def test_a_batch_of_same_size_bodies_takes_the_shortcut() -> None:
    data = bytes(bytearray(STORED_PREFIX.size) + encode_batch("t", 1, [b"x" * 30] * 64))
    header, refs = walk_batch(data, STORED_PREFIX.size)
    mv = memoryview(data)
    assert records._uniform_refs(mv, refs[0].start, len(data), header.n, MAX) == refs
    mixed = bytes(bytearray(STORED_PREFIX.size) + encode_batch("t", 1, [b"x" * 30, b"y"] * 8))
    header, refs = walk_batch(mixed, STORED_PREFIX.size)
    assert records._uniform_refs(memoryview(mixed), refs[0].start, len(mixed), header.n,
                                 MAX) is None


def test_a_batch_of_one_bare_body_takes_the_shortcut() -> None:
    data = bytes(bytearray(STORED_PREFIX.size) + encode_batch("t", 1, [b"x" * 30]))
    header, refs = walk_batch(data, STORED_PREFIX.size)
    assert records._single_ref(memoryview(data), refs[0].start, len(data), True, MAX) == refs
    keyed = bytes(bytearray(STORED_PREFIX.size)
                  + encode_batch("t", 1, [OutgoingMessage(b"x", key="k")]))
    header, refs = walk_batch(keyed, STORED_PREFIX.size)
    assert records._single_ref(memoryview(keyed), refs[0].start, len(keyed), True, MAX) is None


def _entry_outcome(data: bytes) -> Any:
    try:
        return records.walk_entry(data, MAX)
    except RequestError as exc:
        return ("refused", exc.code, str(exc))


@settings(max_examples=300, deadline=None)
@given(batches=st.lists(messages, min_size=1, max_size=4),
       flip=st.one_of(st.none(), st.tuples(st.integers(0, 1 << 16), st.integers(1, 255))),
       cut=st.integers(0, 3))
def test_the_shortcut_agrees_with_the_full_walk_inside_a_multi_batch_entry(
    batches: list[list[Any]], flip: tuple[int, int] | None, cut: int
) -> None:
    """Inside an entry of several batches a same-size batch is followed by others: the
    shortcut must end it after its own records, exactly where the full walk does."""
    data = bytearray(STORED_PREFIX.size)
    for i, msgs in enumerate(batches):
        data += encode_batch("t", i, msgs)
    if flip is not None:
        where, xor = flip
        data[STORED_PREFIX.size + where % (len(data) - STORED_PREFIX.size)] ^= xor
    if cut:
        del data[-cut:]
    with pytest.MonkeyPatch.context() as m:
        _no_shortcuts(m)
        full = _entry_outcome(bytes(data))
    assert _entry_outcome(bytes(data)) == full


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=64), topic=st.text(min_size=1, max_size=12),
       queue=st.integers(0, 1 << 20), pid=st.integers(0, 1 << 62), seq=st.integers(-1, 1 << 31),
       born=st.integers(0, 1 << 50))
def test_a_single_bare_body_encodes_as_the_general_layout(
    body: bytes, topic: str, queue: int, pid: int, seq: int, born: int
) -> None:
    """The one-message shortcut of `encode_batch` makes the bytes and record starts the
    general path makes for the same message given as an `OutgoingMessage`, and the layout
    the module docstring gives (a msgpack header map, then one record)."""
    seq = max(seq, 0) if pid else -1
    fast = encode_batch(topic, queue, [body], pid=pid, seq=seq, born_ms=born)
    general = encode_batch(topic, queue, [OutgoingMessage(body)], pid=pid, seq=seq, born_ms=born)
    assert bytes(fast) == bytes(general)
    assert fast.starts == general.starts
    header = msgpack.packb({"topic": topic, "queue": queue, "pid": pid, "seq": seq, "n": 1},
                           use_bin_type=True)
    size = records.RECORD_HEADER.size + len(body)
    assert bytes(fast) == (struct.pack(">2sBBH", b"RB", 1, 0, len(header)) + header
                           + records.RECORD_HEADER.pack(size, born, 0, 0, 0, len(body)) + body)
    assert fast.starts == (STORED_PREFIX.size + 6 + len(header),)
    h, refs = walk_batch(fast)
    assert (h.topic, h.queue, h.pid, h.seq, h.n) == (topic, queue, pid, seq, 1)
    assert [(r.start, r.size) for r in refs] == [(fast.starts[0] - STORED_PREFIX.size, size)]


_FIELD = st.one_of(st.integers(-2, 2), st.integers(min_value=1 << 40), st.booleans(),
                   st.none(), st.text(max_size=2), st.floats(allow_nan=False))


@st.composite
def _header_maps(draw: st.DrawFn) -> dict[str, Any]:
    """A good header map with up to two fields changed to anything or left out."""
    fields: dict[str, Any] = {
        "topic": draw(st.text(min_size=1, max_size=3)), "queue": draw(st.integers(0, 3)),
        "pid": draw(st.integers(0, 2)), "seq": draw(st.integers(-1, 2)),
        "n": draw(st.integers(1, 3))}
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True)):
        if draw(st.booleans()):
            del fields[name]
        else:
            fields[name] = draw(_FIELD if name != "topic" else st.one_of(_FIELD, st.just("")))
    return fields


@settings(max_examples=600, deadline=None)
@given(fields=_header_maps())
def test_a_batch_header_is_accepted_exactly_when_every_field_is_good(
    fields: dict[str, Any]
) -> None:
    """A decoded header map becomes a `BatchHeader` when its topic is a non-empty str, its
    queue, pid, seq and n are ints (not bools) with queue >= 0, n >= 1, pid >= 0, seq >= -1,
    and an idempotent batch (pid != 0) has a sequence; anything else is MALFORMED."""
    topic, queue = fields.get("topic"), fields.get("queue")
    pid, seq, n = fields.get("pid", 0), fields.get("seq", -1), fields.get("n")
    good = (isinstance(topic, str) and topic != ""
            and all(type(v) is int for v in (queue, pid, seq, n))  # noqa: E721
            and queue >= 0 and n >= 1 and pid >= 0 and seq >= -1 and not (pid and seq < 0))
    if good:
        assert records._header(fields) == records.BatchHeader(topic, queue, pid, seq, n)
    else:
        with pytest.raises(RequestError) as info:
            records._header(fields)
        assert "malformed batch" in info.value.message
