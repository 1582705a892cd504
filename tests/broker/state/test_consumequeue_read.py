"""`ConsumeQueue.read` against a plain model of its contract: entries from `offset`, at
most `max_count`, stopping before the entry that would pass `max_bytes` yet never
returning none when one matches; with tag hashes, only matching entries, at most
`max_scan` looked at."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.state.consumequeue import ConsumeQueue, CQEntry


def model(records: list[tuple[int, int, int, int, int]], first: int, offset: int,
          max_count: int, max_bytes: int, tags: set[int] | None,
          max_scan: int | None) -> tuple[list[CQEntry], int]:
    if not tags:
        stop = min(len(records), offset - first + max_count)
    else:
        scan = max(10 * max_count, 1000) if max_scan is None else max(1, max_scan)
        stop = min(len(records), offset - first + scan)
    out: list[CQEntry] = []
    used, nxt = 0, offset
    for i in range(offset - first, stop):
        index, start, size, tag_hash, store_ms = records[i]
        if tags and tag_hash not in tags:
            nxt += 1
            continue
        if out and used + size > max_bytes:
            break
        out.append(CQEntry(nxt, index, start, size, tag_hash, store_ms))
        used += size
        nxt += 1
        if len(out) >= max_count:
            break
    return out, nxt


record = st.tuples(st.integers(1, 50), st.integers(0, 1 << 20), st.integers(20, 400),
                   st.sampled_from([1, 2, 3]), st.integers(0, 1 << 42))


@settings(max_examples=300, deadline=None)
@given(st.lists(record, max_size=60), st.integers(0, 5), st.data())
def test_read_follows_its_contract(records: list[tuple[int, int, int, int, int]], first: int,
                                   data: st.DataObject) -> None:
    q = ConsumeQueue(first)
    for rec in records:
        q.append(*rec)
    offset = data.draw(st.integers(first, first + len(records)))
    max_count = data.draw(st.integers(1, 70))
    max_bytes = data.draw(st.integers(1, 5000))
    tags = data.draw(st.one_of(st.none(), st.just(set()), st.sets(st.sampled_from([1, 2, 3]),
                                                                   min_size=1)))
    max_scan = data.draw(st.one_of(st.none(), st.integers(0, 70)))
    got = q.read(offset, max_count, max_bytes, tags, max_scan)
    assert got == model(records, first, offset, max_count, max_bytes, tags, max_scan)
    assert all(type(e) is CQEntry for e in got[0])


def test_an_oversized_entry_is_still_read_alone() -> None:
    q = ConsumeQueue()
    q.append(1, 0, 900, 0, 5)
    q.append(1, 900, 10, 0, 5)
    assert q.read(0, 10, 100) == ([CQEntry(0, 1, 0, 900, 0, 5)], 1)
    assert q.read(0, 10, 910) == ([CQEntry(0, 1, 0, 900, 0, 5), CQEntry(1, 1, 900, 10, 0, 5)],
                                  2)
    assert q.read(2, 10, 100) == ([], 2)
