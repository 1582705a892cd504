"""A snapshot larger than any frame a node takes from a peer installs on a follower.

Peer frames are bounded like a client's (plus room for the Raft header), so a group's
shipped snapshot (its state and the ConsumeQueue chunks it references) may be larger than
one frame: it travels in chunks (`broker.runtime.peers`). Here the state holds ~30 MiB of message
keys (keys of up to 64 KiB are stored in the snapshot with their records), retention has
deleted the log prefix, and a follower that lost its disk must be caught up by
InstallSnapshot. It installs the snapshot, refills the retained entries, and serves
every retained message as leader; a peer link announcing a frame of the snapshot's size
is reset by the same node (before chunked transfers, peer frames of up to 1 GiB were
taken).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio

from broker.node import PEER_FRAME_HEADROOM
from tests.broker.runtime.test_snapshot_install import horizon, lead, read_all
from tests.conftest import live_cluster, node_status, wait_for
from tests.live_cluster import LiveCluster
from transport.framing import open_frame_stream
from transport.peerauth import dial_peer
from wire.protocol import MAX_MESSAGE_BYTES, frame_limit
from wire.records import OutgoingMessage

pytestmark = pytest.mark.live

OVERRIDES = {
    "segment_size": 40 << 20,
    "retention_check_interval": 0.2,
    "snapshot_every_entries": 4,
    "retention_hours": 1 / 3600,
}
KEY_BYTES = 1_000  # under the 1 KiB a key may hold (`wire.records.MAX_KEY_BYTES`)
KEYED_BATCHES = 30
PER_BATCH = 1_000


async def _announce_frame(addr: str, secret: bytes, me: int, peer: int, size: int) -> None:
    """On a proven Raft link to node `peer` (as node `me`), announce a frame of `size`
    bytes and wait until the link closes: at once if `peer` refuses the size, else when
    the real node `me` reconnects and replaces this link (or after a few seconds)."""
    fs = await open_frame_stream(addr, max_frame=1 << 20)
    async with fs:
        await dial_peer(fs, secret, me, peer)
        await fs.stream.send_all(size.to_bytes(4, "big") + (16).to_bytes(4, "big") + b"\0" * 64)
        with trio.move_on_after(10):  # a safety net, not a measurement
            try:
                while await fs.stream.receive_some(1 << 16):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


def test_a_snapshot_larger_than_a_peer_frame_installs_on_a_follower(tmp_path: Path) -> None:
    peer_frame = frame_limit(MAX_MESSAGE_BYTES) + PEER_FRAME_HEADROOM
    with live_cluster(tmp_path, groups=1, node_overrides=OVERRIDES) as c:
        live = LiveCluster(c, "t", 1)
        live.settle()
        live.create_topic()
        for i in range(41):  # 41 MiB of plain messages: the first segment fills and rolls
            live.produce_batch(0, [OutgoingMessage(bytes([i]) * (1 << 20))], pid=0, seq=-1,
                               born_ms=1)
        for b in range(KEYED_BATCHES):  # ~30 MiB of keys the state keeps, in the next one
            msgs = [OutgoingMessage(b"v%d" % i, key=f"{b:04d}-{i:04d}-".ljust(KEY_BYTES, "k"))
                    for i in range(PER_BATCH)]
            live.produce_batch(0, msgs, pid=0, seq=-1, born_ms=1)
        lo = horizon(live)  # retention deleted the first segment everywhere
        # the group's preferred leader loses its disk: once caught up it takes the
        # group back by itself, and keeps it while it is read from below
        victim = c.groups[0].preferred_leader or 1
        c.kill(victim)
        shutil.rmtree(c.configs[victim - 1].data / "g0")
        leader = live.leader("g0")
        assert leader != victim
        c.start_node(victim)
        want = node_status(c, leader, "g0")["applied"]
        caught = wait_for(lambda: (s := node_status(c, victim, "g0")).get("applied", -1) >= want
                          and s, 180, f"node {victim} catching up")
        assert caught["snapshot"] > 0, caught  # caught up by InstallSnapshot

        gdir = c.configs[victim - 1].data / "g0"
        installed = (gdir / "snapshot").stat().st_size + sum(
            p.stat().st_size for p in (gdir / "consumequeue").rglob("*") if p.is_file())
        assert installed > peer_frame, (installed, peer_frame)

        lead(live, victim)
        got = read_all(live, victim, lo)
        assert sorted(got) == [o for o in sorted(live.acked[0]) if o >= lo]
        assert all(got[o][0] == live.acked[0][o] for o in got)
        assert len(got) >= KEYED_BATCHES * PER_BATCH

        # no peer can make the node take a frame that large: the snapshot came in chunks
        other = next(n for n in c.node_ids if n != victim)
        secret = c.configs[victim - 1].cluster_secret.encode()
        trio.run(_announce_frame, live.addr(victim), secret, other, victim, installed)
        refusal = f"frame of {installed} bytes exceeds the limit {peer_frame}"
        wait_for(lambda: refusal in c.log_path(f"n{victim}").read_text(errors="replace"), 10,
                 "the refusal logged")
        live.assert_nodes_healthy()
