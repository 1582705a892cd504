"""DueHeap: what a leader's tick finds due, without looking at what is not."""

from __future__ import annotations

from broker.state.dueheap import DueHeap


def test_due_looks_only_at_the_due_keys_and_keeps_them_until_retimed() -> None:
    times = {f"k{i:05}": 1000 + i for i in range(10_000)}
    asked: list[str] = []

    def current(key: str) -> int | None:
        asked.append(key)
        return times.get(key)

    heap: DueHeap[str] = DueHeap(current)
    for key, at in reversed(list(times.items())):
        heap.push(at, key)
    asked.clear()
    assert heap.due(1002) == ["k00000", "k00001", "k00002"]
    assert len(asked) == 3  # not the other 9,997
    assert heap.due(1002) == ["k00000", "k00001", "k00002"]  # still due: nothing changed
    del times["k00001"]  # decided
    times["k00000"] = 5000  # checked again: due later
    heap.push(5000, "k00000")
    assert heap.due(1002) == ["k00002"]
    assert heap.due(999) == []
    assert heap.due(5000)[:2] == ["k00000", "k00002"] and "k00001" not in heap.due(5000)


def test_a_limit_looks_at_only_that_many_of_the_due_keys() -> None:
    """1,000 ids may fall due at once (an expiry); a tick taking 10 a time pops 10."""
    times = {f"k{i:05}": 1000 - i for i in range(1000)}  # the last key is due first
    asked: list[str] = []

    def current(key: str) -> int | None:
        asked.append(key)
        return times.get(key)

    heap: DueHeap[str] = DueHeap(current)
    for key, at in times.items():
        heap.push(at, key)
    asked.clear()
    first = heap.due(10**9, limit=10)
    assert first == sorted(f"k{i:05}" for i in range(990, 1000)) and len(asked) == 10
    for key in first:
        del times[key]  # handled: gone
    assert heap.due(10**9, limit=10) == sorted(f"k{i:05}" for i in range(980, 990))
    assert len(heap.due(10**9)) == 990


def test_stale_entries_do_not_pile_up_where_nobody_asks() -> None:
    times: dict[str, int] = {}
    heap: DueHeap[str] = DueHeap(times.get)
    for i in range(10_000):  # a follower: keys come, are re-timed and go; no tick asks
        key = f"k{i % 10}"
        times[key] = i
        heap.push(i, key)
        if i % 7 == 0:
            del times[key]
    assert len(heap) <= 2 * 10 + 64 + 1
    assert heap.due(10**9) == sorted(times)


def test_rebuild_holds_exactly_what_it_is_given() -> None:
    times = {"a": 5, "b": 1}
    heap: DueHeap[str] = DueHeap(times.get)
    heap.push(99, "old")
    heap.rebuild((t, k) for k, t in times.items())
    assert len(heap) == 2 and heap.due(5) == ["a", "b"] and heap.due(4) == ["b"]
