"""FETCH answers decoded straight into Arrow (`raftmq.spark.arrow_fetch`) give the same rows
as the SDK's per-message decode (`decode_fetch`) put into Arrow (`messages_to_batch`).

Answers are made as the broker makes them: records encoded by the producer's
`encode_batch`, copied verbatim into the body, one [offset, index, start, store_ms] row
each, the start being where the record sits in its stored entry (what message ids name).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.client.consumer import decode_fetch
from raftmq.spark.arrow_fetch import fetch_to_batch
from raftmq.spark.schema import ARROW_SCHEMA, messages_to_batch
from wire.protocol import Code, RequestError
from wire.records import RECORD_HEADER, STORED_PREFIX, OutgoingMessage, encode_batch

TOPIC, QUEUE, GROUP = "orders", 3, "g2"
BORN_MS, STORE_MS = 1_700_000_000_123, 1_700_000_000_456

Answer = tuple[dict[str, Any], bytes]


def answer(batches: Sequence[Sequence[OutgoingMessage | bytes]], first: int = 40) -> Answer:
    """A FETCH answer holding every message of `batches`, each batch its own log entry."""
    rows: list[list[int]] = []
    parts: list[bytes] = []
    offset = first
    for index, msgs in enumerate(batches, start=7):
        batch = encode_batch(TOPIC, QUEUE, msgs, born_ms=BORN_MS + index)
        for start in batch.starts:
            pos = start - STORED_PREFIX.size  # where the record is in the batch's bytes
            size = int.from_bytes(batch[pos : pos + 4], "big")
            parts.append(bytes(batch[pos : pos + size]))
            rows.append([offset, index, start, STORE_MS + offset])
            offset += 1
    return {"g": GROUP, "next": offset, "msgs": rows}, b"".join(parts)


def expected(ans: Answer) -> pa.RecordBatch:
    header, body = ans
    return messages_to_batch(decode_fetch(TOPIC, QUEUE, GROUP, header, body))


def arrow(ans: Answer, **kwargs: Any) -> pa.RecordBatch:
    header, body = ans
    return fetch_to_batch(TOPIC, QUEUE, GROUP, header, body, **kwargs)


def same_rows(got: pa.RecordBatch, want: pa.RecordBatch) -> None:
    assert got.schema == ARROW_SCHEMA
    assert got.to_pylist() == want.to_pylist()
    assert got.equals(want)


text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
messages = st.builds(
    OutgoingMessage,
    body=st.binary(max_size=64),
    key=st.one_of(st.just(""), text),
    tags=st.one_of(st.just(""), st.sampled_from(["TagA", "TagB", "ünï"]), text),
    properties=st.one_of(st.just({}), st.dictionaries(text, text, max_size=4)),
)
batches = st.lists(st.lists(st.one_of(messages, st.binary(max_size=64)), min_size=1,
                            max_size=20), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(batches)
def test_random_records_decode_as_the_sdk_does(bs: list[list[OutgoingMessage | bytes]]) -> None:
    ans = answer(bs)
    same_rows(arrow(ans), expected(ans))
    header, body = ans  # a memoryview body (as a reader may hold) reads the same
    same_rows(fetch_to_batch(TOPIC, QUEUE, GROUP, header, memoryview(body)), expected(ans))


@pytest.mark.parametrize("bodies", [
    [b"x" * 100] * 1024,  # what a producer of bare bodies stores: the fixed-stride path
    [b""] * 5,  # empty bodies: records of the header only
    [b"a"],
    [b"a" * 30, b"b" * 20, b"c" * 40],  # first size times count is the total, yet not uniform
])
def test_bare_bodies(bodies: list[bytes]) -> None:
    ans = answer([bodies])
    same_rows(arrow(ans), expected(ans))


def test_same_size_records_with_keys_tags_and_properties() -> None:
    msgs = [OutgoingMessage(b"%03d" % i, key="k", tags="t", properties={"p": "v"})
            for i in range(50)]
    ans = answer([msgs, msgs])
    same_rows(arrow(ans), expected(ans))


def test_unicode_fields_and_properties_only_on_some_records() -> None:
    msgs = [OutgoingMessage("тело-✓".encode(), key="ключ-🔑", tags="标签",
                            properties={"ñ": "🙂", "": ""}),
            b"bare", OutgoingMessage(b"", properties={"only": "props"}),
            OutgoingMessage(b"\x00\xff", key="k-only")]
    ans = answer([msgs, [b"next entry"]])
    got = arrow(ans)
    same_rows(got, expected(ans))
    assert got.column("properties").to_pylist()[0] == [("ñ", "🙂"), ("", "")]


def test_no_messages() -> None:
    got = arrow(({"next": 9, "msgs": []}, b""))
    assert got.num_rows == 0 and got.schema == ARROW_SCHEMA


def test_tags_keep_exact_matches_and_end_cuts_the_range() -> None:
    msgs = [OutgoingMessage(b"%d" % i, tags=["TagA", "TagB", ""][i % 3]) for i in range(30)]
    ans = answer([msgs])
    rows = expected(ans).to_pylist()
    assert arrow(ans, tags=["TagB", "TagA"]).to_pylist() == [
        r for r in rows if r["tags"] in ("TagA", "TagB")]
    assert arrow(ans, end=55).to_pylist() == [r for r in rows if r["offset"] < 55]
    assert arrow(ans, end=40).num_rows == 0
    assert arrow(ans, end=10_000).to_pylist() == rows
    assert arrow(ans, tags=["TagA"], end=50).to_pylist() == [
        r for r in rows if r["tags"] == "TagA" and r["offset"] < 50]


def _malformed(ans: Answer, what: str) -> None:
    with pytest.raises(RequestError) as err:
        arrow(ans)
    assert err.value.code == Code.MALFORMED
    assert what in err.value.message


def test_malformed_answers_are_refused() -> None:
    header, body = answer([[OutgoingMessage(b"body", key="key", tags="tag"), b"bare" * 3]])
    first = int.from_bytes(body[:4], "big")
    _malformed((header, body[:first]), "lists 2 messages but carries 1")
    _malformed((header, body[:-3]), "record sizes do not add up")
    _malformed((header, body[: first + RECORD_HEADER.size - 1]), "truncated")
    _malformed(({"msgs": []}, body), "lists no message")
    _malformed(({"msgs": [[1, 2, 3]] * 2}, body), "rows are not")
    bad_klen = bytearray(body)
    bad_klen[13] += 1  # the key length (u16 at 12) no longer adds up to the record's size
    _malformed((header, bytes(bad_klen)), "lengths are inconsistent")
    bad_key = bytearray(body)
    bad_key[RECORD_HEADER.size] = 0xFF  # the key's first byte: not UTF-8
    _malformed((header, bytes(bad_key)), "keys are not UTF-8")
    bad_props = answer([[OutgoingMessage(b"b", properties={"a": "b"})]])
    raw = bytearray(bad_props[1])
    raw[RECORD_HEADER.size] = 0x93  # a msgpack array, not a map
    _malformed((bad_props[0], bytes(raw)), "properties are not a map")
    uniform_h, uniform = answer([[b"x" * 10] * 4])
    broken = bytearray(uniform)
    broken[34 + 13] = 1  # the second record's key length
    _malformed((uniform_h, bytes(broken)), "lengths are inconsistent")
