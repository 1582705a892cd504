"""Deterministic simulation of a Raft group (the approach of FoundationDB's simulator
and TigerBeetle's VOPR): several cores in one thread with a virtual clock, a faulty
network and disks that lose unsynced writes, all driven by one seeded PRNG.

A seed picks every knob (group size unless given, Raft config, latencies, loss,
duplication, reordering, fsync latency, fault mix and rates, client mix) through a
fault profile (`knobs.PROFILES`). A history then runs in two phases:

- safety: `--steps` events (a delivery, a node's tick, an fsync completing, a client
  call or a fault), faults on, every checker of `invariants` after every event;
- liveness: heal, restart, faults off; a leader must commit a new entry and every member
  must apply it within a bound of virtual time.

Replicas also snapshot their state machine and compact their logs now and then (the
workload's `compact`), and a disk may be replaced (the nemesis' `wipe`), so leaders send
snapshots to followers behind their first index and the checkers follow state through
them. An entry may go bad on one replica's disk (the nemesis' corruption, while peers
hold it intact): the core hears of it when it reads it (`Ready.repair`), the shell
repairs it from a peer's copy, and a checker makes sure it is never applied or sent
meanwhile; the liveness phase also waits for every repair.

Modules: `knobs` (seed → knobs), `events` (virtual clock), `network`, `disk`, `machine`
(the replicated state machine), `cluster` (the shell around each core and the group),
`nemesis` (faults), `workload` (clients), `invariants` (checkers), `runner` (one seed),
`sweep` (many), `script` (hand-driven scenarios), `__main__` (CLI):

    python -m raftlog.sim --seeds 200 --steps 3000 --json
    python -m raftlog.sim --seed 17 --steps 3000 --nodes 5 --verbose   # replay one
    python -m raftlog.sim --seeds 200 --mutation commit-old-term --stop-at-first
"""

from raftlog.sim.cluster import Cluster, SimNode
from raftlog.sim.disk import SimStore
from raftlog.sim.invariants import Violation
from raftlog.sim.knobs import Knobs
from raftlog.sim.network import SimNetwork
from raftlog.sim.runner import RunResult, replay_command, run_seed
from raftlog.sim.script import Script
from raftlog.sim.sweep import Summary, sweep

__all__ = [
    "Cluster",
    "Knobs",
    "RunResult",
    "Script",
    "SimNetwork",
    "SimNode",
    "SimStore",
    "Summary",
    "Violation",
    "replay_command",
    "run_seed",
    "sweep",
]
