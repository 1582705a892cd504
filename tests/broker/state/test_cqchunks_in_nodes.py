"""ConsumeQueue chunks in real node processes: snapshots that reference chunk files
restore on a restart, travel with InstallSnapshot over the real peer links, are rebuilt
from the leader when damaged, and let retention delete the chunks they no longer need.

The nodes run as in `test_snapshot_install_live` (16 KiB segments, retention of segments
older than a second, a snapshot every 16 entries) with 2 records per chunk, so the 320
messages produced make 160 chunks and the few retained ones several.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import pytest

from broker.state.statemachine import chunk_refs
from raftlog.snapshot import load_snapshot
from tests.broker.runtime.test_snapshot_install import (
    BATCHES,
    OVERRIDES,
    check_everything_readable,
    horizon,
    lead,
    produce,
)
from tests.conftest import live_cluster, node_status, wait_for
from tests.live_cluster import LiveCluster

pytestmark = pytest.mark.live

CHUNK = 2


@contextmanager
def cluster(base: Path) -> Iterator[LiveCluster]:
    overrides = {**OVERRIDES, "consume_queue_chunk": CHUNK}
    with live_cluster(base, groups=1, node_overrides=overrides) as c:
        live = LiveCluster(c, "t", 1)
        live.settle()
        live.create_topic()
        yield live


def group_dir(live: LiveCluster, node: int) -> Path:
    return live.cluster.configs[node - 1].data / "g0"


def chunk_files(live: LiveCluster, node: int) -> set[str]:
    d = group_dir(live, node) / "consumequeue"
    return {p.name for p in d.iterdir()} if d.exists() else set()


def referenced(live: LiveCluster, node: int) -> set[str]:
    """The chunks `node`'s snapshot file references, checking that it copies no more
    than the open ends of the queue inline."""
    snap = load_snapshot(group_dir(live, node) / "snapshot")
    assert snap is not None
    d = msgpack.unpackb(snap.data, raw=False, strict_map_key=False)
    (queues,) = [s for name, v, s in d["parts"] if name == "queues" and v == 2]
    for _t, _q, _lo, _end, head, _hk, _refs, tail, _tk in queues["queues"]:
        assert len(head) < CHUNK * 28 and len(tail) < CHUNK * 28
    return {name for name, _, _ in chunk_refs(snap.data)}


def settled_chunks(live: LiveCluster, node: int) -> set[str]:
    """Wait until `node` holds exactly the chunks its snapshot references (retention
    deleted the rest) and they are several; returns them."""

    def settled() -> set[str] | None:
        refs = referenced(live, node)
        return refs if len(refs) >= 3 and chunk_files(live, node) == refs else None

    return wait_for(settled, 30, f"node {node}'s chunks matching its snapshot")


def test_a_node_restarts_from_chunk_files_and_rebuilds_a_damaged_one_from_the_leader(tmp_path: Path) -> None:
    with cluster(tmp_path) as live:
        c = live.cluster
        produce(live, BATCHES)
        lo = horizon(live)
        node = c.groups[0].preferred_leader or 1
        refs = settled_chunks(live, node)
        # the chunks of every message retention removed are gone: 320 messages made 160
        assert len(refs) < BATCHES * 8 // CHUNK - 10

        c.kill(node)
        c.start_node(node)
        lead(live, node)
        check_everything_readable(live, node, lo)  # from the ConsumeQueue it restored
        live.assert_nodes_healthy()

        # a damaged or missing chunk makes the snapshot unusable, as a damaged snapshot
        # file does: the node sets it aside, keeps its log (retention cut its beginning)
        # and installs the leader's snapshot over it, chunks included
        for damage, says in (("bitflip", "corrupt consume queue chunk"), ("gone", "missing")):
            c.kill(node)
            victim = group_dir(live, node) / "consumequeue" / sorted(referenced(live, node))[1]
            good = victim.read_bytes()
            if damage == "bitflip":
                victim.write_bytes(good[:40] + bytes([good[40] ^ 0x01]) + good[41:])
            else:
                victim.unlink()
            assert c.restart_and_wait(node) is None  # no refusal: its peers can help
            st = node_status(c, node, "g0")
            assert says in st["snapshot_set_aside"], st
            wait_for(lambda: not node_status(c, node, "g0")["stateless"], 60,
                     f"node {node}'s state from the leader")
            lead(live, node)
            check_everything_readable(live, node, lo)
        assert c.unexpected_exits() == {}


def test_install_snapshot_carries_the_chunks_over_the_peer_links(tmp_path: Path) -> None:
    with cluster(tmp_path) as live:
        c = live.cluster
        produce(live, BATCHES)
        lo = horizon(live)
        victim = c.groups[0].preferred_leader or 1
        c.kill(victim)
        shutil.rmtree(group_dir(live, victim))
        leader = live.leader("g0")
        c.start_node(victim)
        want = node_status(c, leader, "g0")["applied"]
        caught = wait_for(lambda: (s := node_status(c, victim, "g0")).get("applied", -1) >= want
                          and s, 60, f"node {victim} catching up")
        assert caught["snapshot"] > 0, caught  # caught up by InstallSnapshot
        refs = settled_chunks(live, victim)  # it wrote the shipped chunks beside its log

        lead(live, victim)
        check_everything_readable(live, victim, lo)
        # and after a restart, from the chunk files it wrote itself
        c.kill(victim)
        c.start_node(victim)
        lead(live, victim)
        check_everything_readable(live, victim, lo)
        assert refs <= chunk_files(live, victim)
        live.assert_nodes_healthy()
