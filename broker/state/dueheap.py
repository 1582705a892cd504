"""Keys by the time they fall due, for a leader's tick that wants only the due ones.

A tick that filtered every open transaction would sort and scan them all each time;
`DueHeap.due(until)` costs O(d log n) for the d keys due, whatever n. The heap is derived
state, never replicated nor snapshotted: its owner says what a key's time is now
(`current`), pushes a key again when that time changes, and rebuilds it on restore. An
entry whose key was dropped or re-timed is stale: skipped when it comes up, and the heap
is compacted when stale entries pile up (on a follower, which never asks what is due).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["DueHeap"]

K = TypeVar("K")

_SLACK = 64  # entries allowed beyond twice the live ones before compacting


class DueHeap(Generic[K]):
    """Keys ordered by a due time; `current(key)` is a key's time now (None: gone)."""

    def __init__(self, current: Callable[[K], int | None]) -> None:
        self._current = current
        self._heap: list[tuple[int, K]] = []
        self._limit = _SLACK

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return len(self._heap)

    def push(self, at: int, key: K) -> None:
        """`key` is due at `at` from now on (an older entry of it becomes stale)."""
        heapq.heappush(self._heap, (at, key))
        if len(self._heap) > self._limit:
            self._compact()

    def rebuild(self, items: Iterable[tuple[int, K]]) -> None:
        """Hold exactly `items` (a restore)."""
        self._heap = list(items)
        heapq.heapify(self._heap)
        self._limit = 2 * len(self._heap) + _SLACK

    def due(self, until: int, limit: int | None = None) -> list[K]:
        """The keys due at or before `until`, each once, in key order; with `limit`, only
        the `limit` due first, so a tick that handles a few at a time looks at no more
        (O(limit log n) however many are due). They stay held (still due at the next call
        until their owner re-times or drops them)."""
        found: dict[K, int] = {}
        heap = self._heap
        while heap and heap[0][0] <= until and (limit is None or len(found) < limit):
            at, key = heapq.heappop(heap)
            if key not in found and self._current(key) == at:
                found[key] = at
        for key, at in found.items():
            heapq.heappush(heap, (at, key))
        return sorted(found)  # type: ignore[type-var]

    def _compact(self) -> None:
        live: dict[K, int] = {}
        for at, key in self._heap:
            if self._current(key) == at:
                live[key] = at
        self.rebuild((at, key) for key, at in live.items())
