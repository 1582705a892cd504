"""How a consumer group shares a topic's queues among its members: RocketMQ's
average and round-robin strategies, each a pure function every member computes alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

Q = TypeVar("Q")


def allocate_average(queues: Iterable[Q], clients: Iterable[str], me: str) -> list[Q]:
    """RocketMQ's default allocation: each client takes one contiguous block of the
    sorted queues, block sizes differing by at most one (earlier clients take the
    larger blocks). A client not in `clients` gets nothing."""
    qs = sorted(queues)  # type: ignore[type-var]
    cs = sorted(set(clients))
    if me not in cs or not qs:
        return []
    i, k, n = cs.index(me), len(cs), len(qs)
    size, extra = divmod(n, k)
    start = i * size + min(i, extra)
    return qs[start : start + size + (1 if i < extra else 0)]


def allocate_round_robin(queues: Iterable[Q], clients: Iterable[str], me: str) -> list[Q]:
    """Deal the sorted queues to the sorted clients like cards: client i takes queues
    i, i+k, i+2k, ... (spreads each client over the queue range)."""
    qs = sorted(queues)  # type: ignore[type-var]
    cs = sorted(set(clients))
    if me not in cs:
        return []
    return qs[cs.index(me) :: len(cs)]


STRATEGIES: dict[str, Callable[[Iterable[Any], Iterable[str], str], list[Any]]] = {
    "average": allocate_average,
    "round_robin": allocate_round_robin,
}


def strategy_of(strategy: str | Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    if callable(strategy):
        return strategy
    if strategy in STRATEGIES:
        return STRATEGIES[strategy]
    raise ValueError(f"unknown strategy {strategy!r}: 'average' or 'round_robin'")
