"""The retention horizon: `retain` entries move it, and every part then forgets what
lies below it (queues drop records, producers and clients silent since go)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from broker.state.parts.base import ControlRecord, ControlResult, Handler, Part, int_field

__all__ = ["Horizon", "Retain"]


@dataclass(frozen=True, slots=True)
class Retain(ControlRecord):
    """Drop every message stored below Raft index `min_index`."""

    op: ClassVar[str] = "retain"
    min_index: int

    def validate(self) -> None:
        int_field("min_index", self.min_index, 0)

    def to_map(self) -> dict[str, Any]:
        return {"min_index": self.min_index}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> Retain:
        return cls(d.get("min_index"))  # type: ignore[arg-type]


class Horizon(Part):
    """The highest `retain` min_index applied: nothing below it is still referenced."""

    name = "horizon"
    version = 1
    records = (Retain,)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.retained_index = 0

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {Retain.op: (Retain, self._retain)}

    def _retain(self, rec: Retain, index: int) -> ControlResult:
        if rec.min_index <= self.retained_index:
            return ControlResult(Retain.op, 0)
        self.retained_index = rec.min_index
        return ControlResult(Retain.op, self.state.broadcast_retained(rec.min_index))

    def section(self) -> Any:
        return self.retained_index

    def load(self, version: int, section: Any) -> None:
        if version != 1:
            raise ValueError(f"unsupported horizon section version {version!r}")
        self.retained_index = int(section)
