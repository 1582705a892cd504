"""The registry of the Raft groups a node hosts: what the request handlers look up.

The service answers requests against groups (their runtimes, their state machines) and
names leaders by address; that is all it needs of the node's groups, so that is all it
is given, rather than the node.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from broker.state.statemachine import BrokerState
from raftlog.runtime import GroupRuntime

__all__ = ["GroupRegistry"]


class _States(Mapping[str, BrokerState]):
    """Each group's state machine, read from its runtime (the one owner) at every access."""

    def __init__(self, groups: Mapping[str, GroupRuntime[BrokerState]]) -> None:
        self._groups = groups

    def __getitem__(self, gid: str) -> BrokerState:
        return self._groups[gid].machine

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)


class GroupRegistry(Mapping[str, GroupRuntime[BrokerState]]):
    """The hosted groups by id, their state machines (`states`), and where each node of
    the cluster listens (`peer_addr`, for leader hints). A live view: the node adds to and
    removes from the mappings it was built from (groups it starts or stops hosting, its
    own address once bound to port 0), so iterate over a copy across an await."""

    def __init__(self, groups: Mapping[str, GroupRuntime[BrokerState]],
                 addresses: Mapping[int, str]) -> None:
        self._groups = groups
        self._addresses = addresses
        self.states: Mapping[str, BrokerState] = _States(groups)

    def __getitem__(self, gid: str) -> GroupRuntime[BrokerState]:
        return self._groups[gid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def peer_addr(self, node: int | None) -> str | None:
        """The address node `node` serves on (None for None or a node not configured)."""
        return None if node is None else self._addresses.get(node)
