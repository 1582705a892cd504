"""pysyncobj: three SyncObj nodes (separate processes) replicating an append/counter op.

pysyncobj has no client protocol of its own: a program reaches a cluster by being a SyncObj
itself. The bench process therefore joins as a *read-only* node (`selfNode=None`: it votes
for nothing and counts toward no majority), which forwards each call to the leader and
gets its callback once the entry is committed and applied. That is the nearest pysyncobj
has to a client, and its callbacks let us hold the same in-flight window as the others.

`appendEntriesUseBatch=False` sends each command at once (sub-millisecond sequential
latency); the default batching adds ~100 ms per call. The journal is a file in the run's
temp dir, written through mmap and never fsynced.

Run as `python -m bench.peers.pysyncobj_peer --self ADDR --partners A,B` to be one node.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers.common import (
    WARMUP,
    LoadSpec,
    LoadStats,
    Peer,
    PeerError,
    Procs,
    free_ports,
    wait_until,
)

__all__ = ["PEER", "PySyncObjPeer"]



def _conf(journal: Path | None) -> Any:
    from pysyncobj import SyncObjConf

    return SyncObjConf(
        appendEntriesUseBatch=False,
        dynamicMembershipChange=False,
        journalFile=str(journal) if journal is not None else None,
        commandsQueueSize=1_000_000,
        # nodes start together, so the first connection attempts often find nothing
        # listening yet: retry after 0.5 s rather than the default 5 s
        connectionRetryTime=0.5,
    )


def _counter_class() -> type:
    """The replicated class, built on demand so this module imports without pysyncobj."""
    from pysyncobj import SyncObj, replicated

    class Counter(SyncObj):
        """Counts appended messages and bytes: a replicated op that keeps no payload."""

        def __init__(self, self_addr: str | None, partners: list[str], conf: Any) -> None:
            super().__init__(self_addr, partners, conf)
            self.count = 0
            self.bytes = 0

        @replicated
        def append(self, payload: bytes) -> int:
            self.count += 1
            self.bytes += len(payload)
            return self.count

    return Counter


def node_main(argv: list[str] | None = None) -> int:
    """One cluster node: serve until SIGTERM."""
    p = argparse.ArgumentParser(description="one pysyncobj node for bench.peers")
    p.add_argument("--self", dest="self_addr", required=True)
    p.add_argument("--partners", required=True)
    p.add_argument("--journal", type=Path)
    args = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    node = _counter_class()(args.self_addr, args.partners.split(","), _conf(args.journal))
    print(f"node {args.self_addr} started", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        node.destroy()
    return 0


@dataclass
class _Cluster:
    addrs: list[str]
    procs: Procs


class PySyncObjPeer(Peer):
    name = "pysyncobj"
    system = "pysyncobj"
    durability = "NO fsync"
    durability_detail = ("calls back once committed on a majority; its journal file is "
                         "written through mmap and never fsynced")
    notes = ("client is a read-only SyncObj node in the bench process; "
             "appendEntriesUseBatch=False; window held with callbacks")
    python_modules = ("pysyncobj",)
    pip_packages = ("pysyncobj==0.3.17",)

    def version(self) -> str:
        from importlib.metadata import version

        return version("pysyncobj")

    def start(self, workdir: Path, procs: Procs, spec: LoadSpec) -> _Cluster:
        addrs = [f"127.0.0.1:{port}" for port in free_ports(3)]
        for i, addr in enumerate(addrs, 1):
            partners = ",".join(a for a in addrs if a != addr)
            procs.start(f"n{i}", [sys.executable, "-m", "bench.peers.pysyncobj_peer",
                                  "--self", addr, "--partners", partners,
                                  "--journal", str(workdir / f"n{i}.journal")])
        return _Cluster(addrs, procs)

    def load(self, cluster: _Cluster, spec: LoadSpec) -> LoadStats:
        resent = _ResentEntries()
        log = logging.getLogger("pysyncobj.syncobj")
        log.addFilter(resent)
        client = _counter_class()(None, cluster.addrs, _conf(None))
        try:
            wait_until(client._getLeader, timeout=spec.startup_timeout,
                       what="pysyncobj leader", procs=cluster.procs)
            stats = _drive_callbacks(client, spec, cluster.procs)
        finally:
            client.destroy()
            log.removeFilter(resent)
        if resent.count:
            stats.notes.append(f"the leader re-sent already-applied entries to the client "
                               f"{resent.count} times (logged by pysyncobj as critical; same "
                               f"entries, no callback fires twice)")
        return stats


class _ResentEntries(logging.Filter):
    """Counts, instead of printing, pysyncobj's complaint about entries it receives twice.

    A leader's reply handler moves its next index for a node back to the last entry that
    node acknowledged, so with many entries in flight it re-sends entries the node already
    has; the node truncates and re-adds them (same term, same data) and logs "state machine
    may have diverged". The nodes log it to their files; the client's copies are counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg.startswith("truncating already-applied log entries"):
            self.count += 1
            return False
        return True


def _call(client: Any, payload: bytes, timeout: float) -> None:
    """One acknowledged call, for warm-up: raise unless it succeeds within `timeout`."""
    from pysyncobj import FAIL_REASON

    done = threading.Event()
    outcome: list[Any] = []

    def cb(result: Any, err: Any) -> None:
        outcome.append(err)
        done.set()

    client.append(payload, callback=cb)
    if not done.wait(timeout):
        raise PeerError(f"pysyncobj call not acknowledged within {timeout:.0f} s")
    if outcome[0] != FAIL_REASON.SUCCESS:
        raise PeerError(f"pysyncobj call failed: {outcome[0]}")


def _drive_callbacks(client: Any, spec: LoadSpec, procs: Procs) -> LoadStats:
    """The window, with callbacks: each ack (on pysyncobj's thread) sends the next message."""
    from pysyncobj import FAIL_REASON

    payload = b"x" * spec.size
    deadline = time.monotonic() + spec.startup_timeout
    for _ in range(WARMUP):  # a fresh cluster may still be settling: retry until it acks
        while True:
            try:
                _call(client, payload, timeout=5.0)
                break
            except PeerError:
                procs.check_alive()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    stats = LoadStats()
    lock = threading.Lock()
    finished = threading.Event()
    sent = 0
    answered = 0

    def send_next() -> None:
        nonlocal sent
        with lock:
            if sent >= spec.messages:
                return
            sent += 1
        t0 = time.perf_counter()

        def cb(result: Any, err: Any) -> None:
            nonlocal answered
            if err == FAIL_REASON.SUCCESS:
                stats.latencies.append(time.perf_counter() - t0)
            else:
                stats.record_error(f"pysyncobj: {err}")
            with lock:
                answered += 1
                last = answered >= spec.messages
            if last:
                finished.set()
            else:
                send_next()

        client.append(payload, callback=cb)

    t_start = time.perf_counter()
    for _ in range(max(1, min(spec.in_flight, spec.messages))):
        send_next()
    if not finished.wait(spec.load_timeout):
        stats.timed_out = True
        stats.record_error(f"load did not finish within {spec.load_timeout:.0f} s")
    stats.seconds = time.perf_counter() - t_start
    return stats


PEER = PySyncObjPeer()

if __name__ == "__main__":
    sys.exit(node_main())
