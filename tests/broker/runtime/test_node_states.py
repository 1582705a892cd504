"""A node's group states have one owner, the group's runtime: whatever replaces the state
machine (a snapshot restored at open, or installed from a leader), `Node.states` reads
the same object the runtime applies entries to."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import trio

from broker.config import NodeConfig
from broker.node import Node
from broker.state.statemachine import BrokerState, control_create_topic
from raftlog.snapshot import Snapshot, save_snapshot
from raftlog.types import Entry, EntryType, Membership
from tests.runtime_harness import log_of

CONFIG = """\
node_id = 1
listen = "127.0.0.1:7101"
data = "{data}"
[peers]
1 = "127.0.0.1:7101"
2 = "127.0.0.1:7102"
3 = "127.0.0.1:7103"
[[groups]]
id = "g0"
replicas = [1, 2, 3]
"""


def _node(tmp_path: Path) -> Node:
    return Node(NodeConfig.from_dict(tomllib.loads(CONFIG.format(data=tmp_path)), env={}))


def _snapshot(topic: str, index: int = 5) -> Snapshot:
    s = BrokerState("g0")
    s.apply(Entry(index, 1, EntryType.CONTROL, control_create_topic(topic, 1, [0])))
    return Snapshot(index, 1, s.snapshot(), Membership(frozenset({1, 2, 3})))


def test_a_snapshot_restored_at_open_is_the_state_the_node_reads(tmp_path: Path) -> None:
    node = _node(tmp_path)
    g = node.groups["g0"]
    Path(g.path).mkdir(parents=True)
    save_snapshot(Path(g.path) / "snapshot", _snapshot("restored"))
    g.open()
    try:
        assert node.states["g0"] is g.machine
        assert node.states["g0"].topic("restored") is not None
        assert list(node.states) == ["g0"] and len(node.states) == 1
    finally:
        log_of(g).close()


def test_an_install_that_fails_to_save_leaves_node_and_runtime_agreeing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restoring comes first (a snapshot it refuses is not saved); when saving then fails,
    the runtime keeps its old state, and the node must read that one, not the restored
    copy the runtime never adopted."""
    node = _node(tmp_path)
    g = node.groups["g0"]
    g.open()
    before = g.machine

    def full_disk(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("raftlog.runtime.save_snapshot", full_disk)
    with pytest.raises(OSError):
        trio.run(g._install, _snapshot("installed"))
    try:
        assert g.machine is before
        assert node.states["g0"] is before
        assert node.states["g0"].topic("installed") is None
    finally:
        log_of(g).close()
