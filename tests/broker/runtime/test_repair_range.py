"""A replica with hundreds of corrupt entries repairs them a range per request.

A follower is stopped cleanly and one body byte of each of 500 consecutive entries of its
CommitLog is flipped (every CRC fails, every index record still vouches for its entry).
On restart it must fetch those entries from its peers in ranges over its one peer
connection each, not one request (and one connection, and one fsync) per entry, and
then serve as a full member: with the other follower stopped, the leader commits on
its acknowledgements alone and every acknowledged record reads back.

The time the repair took is printed (`-s` shows it); it is a figure, not an assertion.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from chaos.disk_faults import stored_entries
from raftlog.commitlog import HEADER_SIZE
from tests.conftest import live_cluster, node_status, wait_for
from tests.live_cluster import LiveCluster
from transport.blocking import request
from wire.protocol import Op
from wire.records import OutgoingMessage, encode_batch, walk_batch

pytestmark = pytest.mark.live

DAMAGED = 500
#: READ_RAW's answer holds at most this many bytes of entries (`broker.doors.reads`); the
#: entries here are ~300 bytes, so the bound is far above what a range repair needs
RANGE_BYTES = 1 << 20


def test_five_hundred_corrupt_entries_are_repaired_a_range_per_request(tmp_path: Path) -> None:
    with live_cluster(tmp_path, groups=1, node_overrides={"segment_size": 64 << 10}) as cluster:
        live = LiveCluster(cluster, "t", 1)
        live.settle()
        live.create_topic()
        leader = live.leader("g0")
        for b in range(DAMAGED + 20):  # one entry per batch, sent to the leader directly
            batch = encode_batch("t", 0, [OutgoingMessage(f"entry {b} ".encode() * 24)],
                                 pid=0, seq=-1, born_ms=1)
            h, _ = request(live.addr(leader), {"op": int(Op.PRODUCE), "g": "g0"}, batch,
                           timeout=10.0)
            _, refs = walk_batch(batch)
            live.acked[0][h["base"]] = batch[refs[0].start : refs[0].start + refs[0].size]
        victim, other = (i for i in cluster.node_ids if i != leader)
        wait_for(lambda: node_status(cluster, victim, "g0").get("applied", 0)
                 >= node_status(cluster, leader, "g0")["applied"] or None, 60,
                 "the victim caught up")
        cluster.kill(victim, signal.SIGTERM)  # a clean stop: its index vouches for every entry

        entries = stored_entries(cluster.configs[victim - 1].data / "g0" / "commitlog")
        damaged = [e for e in entries if e.size > HEADER_SIZE][5 : 5 + DAMAGED]
        assert len(damaged) == DAMAGED
        assert sum(e.size for e in damaged) < RANGE_BYTES
        for e in damaged:
            with e.file.open("r+b") as f:
                f.seek(e.offset + HEADER_SIZE)
                byte = f.read(1)
                f.seek(e.offset + HEADER_SIZE)
                f.write(bytes([byte[0] ^ 0xFF]))
        segments = len({e.file for e in damaged})

        started = time.monotonic()
        assert cluster.restart_and_wait(victim) is None
        st = wait_for(lambda: (lambda s: s if s.get("repaired", 0) >= DAMAGED
                               and not s["unrepaired"] else None)(
            node_status(cluster, victim, "g0")), 600, "the damaged entries repaired")
        took = time.monotonic() - started
        print(f"\nrepair of {DAMAGED} entries in {segments} segments: {took:.2f} s from the "
              f"restart, {st['repair_requests']} requests")
        assert st["repaired"] == DAMAGED
        # a range per request: a handful per segment crossed (an answer ends at a
        # segment's end) and per peer tried, never one per entry
        assert st["repair_requests"] <= 2 * (segments + 2), st["repair_requests"]

        cluster.kill(other)  # the repaired replica's acknowledgements alone commit now
        # idempotent: the commit waits on the repaired replica and may outlast the first
        # try, and a resend of a batch already committed must not store it twice
        live.produce_batch(0, [OutgoingMessage(b"after the repair")], pid=77, seq=0, born_ms=1)
        assert live.fetch(0) == live.acked[0]
        st = node_status(cluster, victim, "g0")
        assert not st["unrepaired"], st
        assert cluster.unexpected_exits() == {}
