"""The ConsumeQueue's time index (`first_offset_at_or_after_ms`, OFFSET_FOR_TIME's
answer): for any store times -- stepping back where leadership moved, across chunk
boundaries, after a retention cut -- it is the first retained offset whose store time
reaches the one asked for (the running maximum's first reaching it), the end when none
does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.state.consumequeue import ConsumeQueue


def naive(times: list[int], base: int, ms: int) -> int:
    return next((base + i for i, t in enumerate(times) if t >= ms), base + len(times))


def queue_of(times: list[int]) -> ConsumeQueue:
    cq = ConsumeQueue()
    for i, t in enumerate(times):
        cq.append(i + 1, 0, 10, 0, t)
    return cq


@given(st.lists(st.integers(0, 50), max_size=60), st.integers(0, 60), st.integers(0, 55))
def test_it_agrees_with_a_scan_for_any_store_times(times: list[int], cut: int,
                                                   ms: int) -> None:
    cq = queue_of(times)
    cq.drop_before(cut)
    base = cq.min_offset
    assert cq.first_offset_at_or_after_ms(ms) == naive(times[base:], base, ms)
    # a restored queue (a snapshot's records) answers the same
    restored = ConsumeQueue(base, cq.records())
    assert restored.first_offset_at_or_after_ms(ms) == naive(times[base:], base, ms)


def test_store_times_stepping_back_are_passed_by_their_running_maximum() -> None:
    # leader A stamped 100..104, leader B's clock is 3 ms behind: 102, 103, ...
    cq = queue_of([100, 101, 102, 103, 104, 102, 103, 105])
    assert cq.first_offset_at_or_after_ms(102) == 2
    assert cq.first_offset_at_or_after_ms(105) == 7
    assert cq.first_offset_at_or_after_ms(106) == cq.end_offset == 8
    assert cq.first_offset_at_or_after_ms(0) == 0


def test_it_finds_records_beyond_the_first_chunks() -> None:
    times = [i // 3 for i in range(10_000)]  # three chunks of 4,096 and a part
    cq = queue_of(times)
    for ms in (0, 1, 1365, 1366, 2730, 3000, 3333, 3334):
        assert cq.first_offset_at_or_after_ms(ms) == naive(times, 0, ms), ms
    cq.drop_before(5000)
    assert cq.first_offset_at_or_after_ms(0) == 5000  # below retention: the minimum
    assert cq.first_offset_at_or_after_ms(2000) == 6000


def test_an_empty_queue_answers_its_end() -> None:
    cq = ConsumeQueue(7)
    assert cq.first_offset_at_or_after_ms(0) == 7
