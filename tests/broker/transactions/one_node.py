"""One real node (port 0) leading one-replica groups, for tests that drive the
transaction service and duty of a node directly: its duty ticks only when woken, so a
test decides when it looks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from broker.config import GroupConfig, NodeConfig
from broker.node import Node
from wire.txn import coordinator_group


def one_node(data: Path, groups: Sequence[str] = ("g0", "g1"), **settings: Any) -> Node:
    """A node leading `groups`, each of one replica (itself); `settings` go to its
    config."""
    return Node(NodeConfig(node_id=1, listen="127.0.0.1:0", data=data,
                           peers={1: "127.0.0.1:0"}, tick_ms=10, tx_tick_ms=3_600_000,
                           groups=tuple(GroupConfig(g, (1,), 1) for g in groups), **settings))


async def leading(node: Node, groups: Sequence[str] = ("g0", "g1")) -> None:
    """Once the node leads every one of `groups` (within 60 s)."""
    with trio.fail_after(60):
        while not all(node.groups[g].is_leader for g in groups):
            await trio.sleep(0.02)


def tid_coordinated_by(gid: str, prefix: str, groups: Sequence[str] = ("g0", "g1")) -> str:
    """A transactional id `prefix-k` whose coordinator is group `gid` among `groups`."""
    for k in range(1000):
        if coordinator_group(f"{prefix}-{k}", list(groups)) == gid:
            return f"{prefix}-{k}"
    raise AssertionError("no id hashes there")
