"""Every typed op: its request type and its answer type.

Gathered from the area modules rather than listed by hand, so a new type is registered
by being written: each `WireType` names its `OP` and its `ROLE`, and an op needs exactly
one of each role.
"""

from __future__ import annotations

from types import ModuleType

from wire.protocol import Op
from wire.requests import (
    cluster,
    consumers,
    locks,
    namesrv,
    offsets,
    produce,
    reads,
    security,
    simple,
    topics,
    trace,
    transactions,
)
from wire.requests.base import WireType

__all__ = ["AREAS", "TYPES"]

#: The modules holding the types, one per request area.
AREAS: tuple[ModuleType, ...] = (
    produce, reads, offsets, topics, cluster, consumers, transactions, security, namesrv,
    simple, locks, trace)


def _gather(areas: tuple[ModuleType, ...]) -> dict[Op, tuple[type[WireType], type[WireType]]]:
    roles: dict[Op, dict[str, type[WireType]]] = {}
    for area in areas:
        for name in area.__all__:
            t = getattr(area, name)
            if not (isinstance(t, type) and issubclass(t, WireType)) or t is WireType:
                continue
            held = roles.setdefault(t.OP, {})
            if t.ROLE in held:
                raise TypeError(f"{t.OP.name} has two {t.ROLE} types: "
                                f"{held[t.ROLE].__name__} and {t.__name__}")
            held[t.ROLE] = t
    incomplete = sorted(op.name for op, held in roles.items()
                        if set(held) != {"request", "answer"})
    if incomplete:
        raise TypeError(f"ops without both a request and an answer type: {incomplete}")
    return {op: (held["request"], held["answer"]) for op, held in sorted(roles.items())}


#: The typed ops: request type and answer type.
TYPES: dict[Op, tuple[type[WireType], type[WireType]]] = _gather(AREAS)
