"""Where each group's leadership belongs: the preferred leader, a replicated setting.

The node's static config names a preferred leader per group (spread round-robin over
the nodes, so leaders are spread by default) and the Raft core hands leadership back to
it once it has caught up. An operator who moves a group's leadership for good
(`raftmq cluster transfer-leader`) logs a `prefer_leader` record first: every replica
then agrees on the new preference, it survives restarts and snapshots, and the core
no longer hands leadership back to the old node. `node == 0` returns to the config's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from broker.state.parts.base import ControlRecord, ControlResult, Handler, Part, int_field

__all__ = ["Leadership", "PreferLeader"]

MAX_NODE_ID = 1 << 31


@dataclass(frozen=True, slots=True)
class PreferLeader(ControlRecord):
    """Make node `node` the group's preferred leader (0: the configured one again)."""

    op: ClassVar[str] = "prefer_leader"
    node: int

    def validate(self) -> None:
        int_field("node", self.node, 0, MAX_NODE_ID)

    def to_map(self) -> dict[str, Any]:
        return {"node": self.node}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> PreferLeader:
        return cls(d.get("node"))  # type: ignore[arg-type]


class Leadership(Part):
    """The preferred leader set through the log (None: the node config's applies)."""

    name = "leadership"
    version = 1
    records = (PreferLeader,)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.preferred: int | None = None

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {PreferLeader.op: (PreferLeader, self._prefer)}

    def _prefer(self, rec: PreferLeader, index: int) -> ControlResult:
        new = rec.node or None
        changed = new != self.preferred
        self.preferred = new
        return ControlResult(PreferLeader.op, int(changed))

    def section(self) -> Any:
        return self.preferred or 0

    def load(self, version: int, section: Any) -> None:
        if version != 1:
            raise ValueError(f"unsupported leadership section version {version!r}")
        self.preferred = int(section) or None
