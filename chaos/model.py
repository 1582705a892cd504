"""Operations, events and the model interface that the linearizability search runs against.

A model is a pure sequential specification: ``step(state, input, output)`` says whether the
operation may return ``output`` in ``state`` and what the state becomes. States must be
immutable; by default they are hashed and compared natively, which lets the checker keep its
cache as a plain set. Models with states that need a custom notion of equality override
``equal`` and ``hash`` together.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

__all__ = [
    "INFINITY",
    "UNKNOWN",
    "Event",
    "EventKind",
    "Model",
    "Operation",
    "events_to_operations",
]

S = TypeVar("S")
I = TypeVar("I")  # noqa: E741 - input type parameter
O = TypeVar("O")  # noqa: E741 - output type parameter

INFINITY = math.inf
"""Return time of an operation whose outcome was never learned: it may take effect at any
point after its call, or never (taking effect after everything else is indistinguishable)."""


class _Unknown:
    """Output of an operation whose result is unknown; models accept any result for it."""

    __slots__ = ()
    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __reduce__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


@dataclass(frozen=True, slots=True)
class Operation(Generic[I, O]):
    """One completed (or forever pending) operation with monotonic call and return times."""

    client_id: int
    input: I
    call: float
    output: O
    return_: float

    @property
    def pending(self) -> bool:
        """True when the outcome is unknown and the operation may land at any later point."""
        return self.return_ == INFINITY


class EventKind(Enum):
    CALL = "call"
    RETURN = "return"


@dataclass(frozen=True, slots=True)
class Event:
    """A call or return, ordered by its position in the history; ``id`` pairs them up."""

    client_id: int
    kind: EventKind
    value: Any
    id: int


def events_to_operations(events: Iterable[Event]) -> list[Operation]:
    """Pair call and return events by id, using each event's position as its time.

    A call without a return stays pending forever with an unknown output.
    """
    calls: dict[int, tuple[int, Any, int]] = {}
    returns: dict[int, tuple[Any, int]] = {}
    order: list[int] = []
    for index, event in enumerate(events):
        if event.kind is EventKind.CALL:
            if event.id in calls:
                raise ValueError(f"event {index}: duplicate call for operation id {event.id}")
            calls[event.id] = (event.client_id, event.value, index)
            order.append(event.id)
        else:
            if event.id not in calls:
                raise ValueError(f"event {index}: return for unknown operation id {event.id}")
            if event.id in returns:
                raise ValueError(f"event {index}: duplicate return for operation id {event.id}")
            returns[event.id] = (event.value, index)
    ops: list[Operation] = []
    for op_id in order:
        client, value, call = calls[op_id]
        output, ret = returns.get(op_id, (UNKNOWN, INFINITY))
        ops.append(Operation(client, value, float(call), output, float(ret)))
    return ops


class Model(Generic[S, I, O]):
    """Sequential specification searched by the checker; subclass and override ``init``/``step``."""

    name = "model"

    def init(self) -> S:
        raise NotImplementedError

    def step(self, state: S, input: I, output: O) -> tuple[bool, S]:
        raise NotImplementedError

    def equal(self, a: S, b: S) -> bool:
        return a == b

    def hash(self, state: S) -> int:
        return hash(state)

    def partition_key(self, input: I) -> Hashable:
        """Key of the independent sub-history holding this input (P-compositionality).

        Operations on different keys never constrain each other, so each key's history is
        checked alone; ``None`` everywhere means the history is one partition.
        """
        return None

    def partition(self, history: Sequence[Operation[I, O]]) -> list[list[Operation[I, O]]]:
        """Split the history into independently checkable sub-histories, in first-seen order."""
        groups: dict[Hashable, list[Operation[I, O]]] = {}
        key_of = self.partition_key
        for op in history:
            groups.setdefault(key_of(op.input), []).append(op)
        return list(groups.values())

    def doomed(self, state: S, input: I, output: O) -> bool:
        """True if no state reachable from ``state`` can accept this operation.

        Only asked after ``step`` rejected the operation. Every pending operation must be
        linearized eventually, so the search abandons the current branch at once instead of
        exploring every interleaving of the other concurrent operations first. The default
        (never doomed) is always safe; say True only when states evolve monotonically, as a
        log does: an append acknowledged at an offset the log has already passed never fits.
        """
        return False

    def always_legal(self, input: I, output: O) -> bool:
        """True if ``step`` accepts this operation, with this output, in every state.

        Operations pending forever that are always legal can all take effect after the
        others, in any order: once every operation that returned is linearized, the search
        stops there instead of linearizing them one by one (each step of which walks every
        entry still listed, so a run with a hundred thousand timed-out appends never ended).
        The default (never) is always safe.
        """
        return False

    def prepare(self, history: Sequence[Operation[I, O]]) -> list[I]:
        """Inputs the search uses for one partition, aligned with ``history``.

        A model may erase details that no output in the partition can observe (such as the id
        of a message nobody read), so that states differing only in those details coincide in
        the cache and operations that became identical are tried in one canonical order.
        """
        return [op.input for op in history]

    def is_read_only(self, input: I, output: O) -> bool:
        """True if this operation, returning this output, never changes any state.

        The checker relies on it twice. A read-only operation with an unknown output is legal
        anywhere and changes nothing, so it is dropped before the search. And a read-only
        operation that is legal when it comes up is linearized at once without trying it
        later: any linearization placing it later stays valid with it moved to this point, so
        concurrent reads cost no branching.
        """
        return False

    def describe_operation(self, input: I, output: O) -> str:
        return f"{input!r} -> {output!r}"

    def describe_state(self, state: S) -> str:
        return repr(state)

    def explain(self, state: S, input: I, output: O) -> str:
        """Why ``step`` rejects this operation in ``state``, for reports; the state by default."""
        return f"state {self.describe_state(state)}"

    @property
    def native_states(self) -> bool:
        """Whether states can be cached with Python's own ``hash``/``==``."""
        cls = type(self)
        return cls.equal is Model.equal and cls.hash is Model.hash
