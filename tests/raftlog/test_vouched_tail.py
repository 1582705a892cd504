"""A replica that lost the fsynced tail of its last CommitLog segment, then a second fault.

Under ``fsync = "always"`` an index record reaches the index file only after its entry's
data was fsynced, so an entry the index vouches for that is missing from the last
segment was lost to damage (a cut file, a bad disk), not torn by a crash. Recovery used
to walk back over it as a torn tail: the replica then voted as if it never had those
entries, and with the one other replica that held them down, it and a lagging replica
elected a leader without them and an acknowledged message was gone for good. Now the
entries are kept as corrupt awaiting repair, the log end stays where the index says,
and the replica neither campaigns nor votes for a shorter log until a peer that holds
them refills it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from chaos.disk_faults import stored_entries
from tests.conftest import group_leader, live_cluster, node_status, wait_for
from tests.live_cluster import LiveCluster
from wire.records import OutgoingMessage

pytestmark = pytest.mark.live


def test_a_replica_whose_vouched_tail_was_cut_keeps_acknowledged_entries_through_a_second_fault(
    tmp_path: Path,
) -> None:
    with live_cluster(tmp_path, groups=1) as cluster:
        live = LiveCluster(cluster, "t", 1)
        live.settle()
        live.create_topic()
        for b in range(3):
            live.produce_batch(0, [OutgoingMessage(f"before-{b}".encode())], pid=0, seq=-1,
                               born_ms=1)
        a = live.leader("g0")
        b, c = (i for i in cluster.node_ids if i != a)
        wait_for(lambda: all(node_status(cluster, n, "g0").get("applied", 0)
                             >= node_status(cluster, a, "g0")["applied"] for n in (b, c))
                 or None, 30, "every replica caught up")
        kept = node_status(cluster, b, "g0")["last"]  # every replica holds 1..kept

        cluster.kill(c)  # c lags from here on
        for k in range(3):  # acknowledged by a and b only
            live.produce_batch(0, [OutgoingMessage(f"after-{k}".encode())], pid=0, seq=-1,
                               born_ms=1)
        acked = node_status(cluster, a, "g0")["commit"]
        wait_for(lambda: node_status(cluster, b, "g0").get("last", 0) >= acked or None, 30,
                 "b holds every acknowledged entry")
        cluster.kill(b, signal.SIGTERM)  # a clean stop: its index vouches for every entry
        cluster.kill(a)  # the second fault: the other replica holding the tail is down

        # b loses the fsynced tail of its last segment: every entry after `kept`
        log_dir = cluster.configs[b - 1].data / "g0" / "commitlog"
        (cut,) = [e for e in stored_entries(log_dir) if e.index == kept + 1]
        assert cut.file == max(log_dir.glob("0*"))
        os.truncate(cut.file, cut.offset)

        assert cluster.restart_and_wait(b) is None
        assert cluster.restart_and_wait(c) is None

        def settled() -> str | None:
            # either b and c elected a leader that committed an entry of its own term
            # (then a's tail is overwritten when it returns), or b says it holds the
            # entries up to `acked` and awaits their repair
            lead = group_leader(cluster, "g0", among=[b, c])
            if lead is not None and node_status(cluster, lead, "g0").get("commit", 0) > kept:
                return "elected"
            st = node_status(cluster, b, "g0")
            if st.get("last", 0) >= acked and st.get("unrepaired"):
                return "awaiting repair"
            return None

        wait_for(settled, 60, "b and c settled")
        assert cluster.restart_and_wait(a) is None
        assert live.fetch(0) == live.acked[0]
        wait_for(lambda: (lambda st: st.get("repaired", 0) >= 1 and not st["unrepaired"])(
            node_status(cluster, b, "g0")) or None, 60, "b's lost tail repaired")
        assert cluster.unexpected_exits() == {}
