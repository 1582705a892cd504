"""What every leader-side duty shares: the `Duty` interface and what it may use of the node.

A duty is work a group's leader does beside its state machine: sending a decided
transaction's markers, asking producers about half messages, proposing retention. Its
decisions are in the log, so whichever node leads a group next picks the work up from
the group's applied state; the duty itself only has to run where the group is led.

So a duty declares (`broker.duties.registry` runs them, as `BrokerState` runs its parts):

* `name`: how logs and tests call it;
* `run(gid)`: the duty for group `gid`, started once this node leads it and is ready
  (its state holds everything an earlier leader committed), cancelled when it stops
  leading it. Its work is proposed through `GroupLead`, which refuses it anyway once the
  leadership moved, so a cancellation a moment late does no harm;
* optionally `serve()`: what the duty keeps for the node's whole life, whatever it leads
  (the transaction duty's tasks that requests start as well as its ticks).

A duty reaches its groups only through the registry and `GroupLead` (and the transaction
operations of `broker.doors.transactions`, pinned by `tests/test_dependencies.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Protocol

import trio

from broker.config import NodeConfig
from broker.runtime.groups import GroupRegistry
from broker.runtime.peer_rpc import PeerRPC

if TYPE_CHECKING:
    from broker.doors.security import Guard
    from broker.doors.transactions import TxService

__all__ = ["Duty", "DutyHost"]


class DutyHost(Protocol):
    """What the duties use of the node (`broker.node.Node` is one)."""

    config: NodeConfig
    node_id: int
    registry: GroupRegistry
    rpc: PeerRPC  # requests to other nodes as a proven peer

    @property
    def tx_service(self) -> TxService: ...

    @property
    def guard(self) -> Guard: ...


class Duty(ABC):
    """One leader-side duty of a node (see the module docstring)."""

    name: ClassVar[str] = ""

    def __init__(self, host: DutyHost) -> None:
        self.host = host

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Run for the node's whole life, beside the groups (none by default): started
        before any group's `run`, cancelled with the node."""
        task_status.started()

    @abstractmethod
    async def run(self, gid: str) -> None:
        """Do the duty for group `gid` while this node leads it; returning ends it for
        this term, an exception restarts it after a pause (logged)."""
