"""The virtual clock: one queue of timed events, popped in (time, insertion) order.

Ties are broken by insertion order, never by anything hash- or address-dependent, so a
seed replays identically in every process.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

__all__ = ["EventQueue"]


class EventQueue:
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0

    def push(self, at: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, fn, args))

    def peek_time(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[int, Callable[..., None], tuple[Any, ...]]:
        at, _seq, fn, args = heapq.heappop(self._heap)
        return at, fn, args

    def __len__(self) -> int:
        return len(self._heap)
