"""The fault scheduler of `raftmq chaos run`: which fault, when, and on which nodes.

One seeded `random.Random` decides the schedule (`schedule`, a pure function): when each
fault starts, how long it lasts, which kind it is and a seed of its own. Kinds come from
shuffled rounds of the enabled nemeses, so every enabled one occurs once per round;
`crash-unsynced` also rotates its scope (one node, a majority, every node). A fault's
own seed decides its targets at run time, so a node that is slow to come back, or a
leader that moved, changes that fault's targets but never the rest of the schedule.

Faults run one at a time: inject, hold, heal, wait for the cluster to be ready (bounded),
then the next. Targets of node faults lean towards current group leaders
(`leader_bias`), since leader loss is what a run measures. Every fault is recorded with
`Recorder.fault_start` before it is injected and `fault_end` once healed; its value holds
the affected `nodes` and, as `leaders`, the group leaders that it took away
({group: node}). The kinds:

- `kill`: SIGKILL, restart at the end;
- `kill-host`: SIGKILL of every shard of one host at once, a machine's power loss: with
  sync marks on (`run` turns them on for it) what the shards had not fsynced is discarded
  as by `crash-unsynced`; restarted at the end. Without hosts, one node;
- `partition-host`: every shard of one host cut from every node on other hosts, while the
  host's own shards still talk (`topology.on_hosts`). Without hosts, `partition-node`;
- `pause`: SIGSTOP, SIGCONT at the end;
- `partition-halves`, `partition-node`, `bridge`, `majority-ring`: a `chaos.topology`
  shape applied to the Raft links of a `ProxyNet`;
- `crash-unsynced`: SIGKILL of one node, a majority or all of them at once, then the
  writes they had not fsynced are discarded (`chaos.disk_faults.discard_unsynced`; nodes
  run with `test_sync_marks = true`); a whole-cluster power loss is what catches a node
  that skips fsync;
- `corrupt`: SIGKILL of one node, one byte of one stored entry corrupted while it is
  down, in its body or its header (`chaos.disk_faults.corrupt_entry`), restart at the
  end;
- `leader-transfer`: a storm of TRANSFER_LEADER requests moving random groups to random
  followers for the fault's length;
- `delay`: every link, node-to-node and client, holds each chunk back 100 ms ± 50 ms
  (`DELAY`); `loss`: every link loses chunks (`LOSS`, see `chaos.proxy.Link`); both
  through `ProxyNet.shape`, with the links named in the value;
- `partition-clients`: clients are cut from a minority of nodes (leaders preferred)
  while the nodes still see each other (`ProxyNet.cut_clients`);
- `truncate-file` / `bitflip-file`: SIGKILL of a minority, then on each of them one
  random CommitLog segment, index, snapshot or ConsumeQueue chunk file is truncated, or
  has bits flipped (`chaos.disk_faults.damage_file`); `snapshot-corrupt` does either to
  a snapshot file or a chunk file it references.
  At the end each node is restarted and must either start (repairing what it can from
  its peers) or refuse to; a refusal is recorded in the value (`outcome`, `refusals`),
  the original bytes are put back as an operator would from a backup, and the node is
  started again. Serving damaged data or losing acknowledged data is for the checkers
  to catch;
- `stale-leader`: a group leader is stopped (SIGSTOP) and cut from its peers, not from its
  clients. Once the other replicas elected a new leader and it acknowledged writes (seen
  by `probe`, the workload), reads of those offsets are sent to the old leader while it
  is still stopped, and it is resumed, still cut off: it believes it leads for another
  election timeout and finds those reads waiting. It must refuse them or confirm its
  leadership first (ReadIndex), which it cannot; a leader that answers from its own state
  returns the end of the log before those acknowledged writes, a stale read the
  linearizability check rejects at any seed. The value holds the reads aimed (`probed`);
- `disk-full`: the file system of one node (leaders preferred) is filled with a ballast
  file so every write fails with ENOSPC, then the ballast is deleted at the end. Needs
  `disks` (`chaos.disk_faults.SmallDisk` per node: root and a loop device);
- `membership`: replica membership changes through `raftmq cluster`'s operations,
  taking turns (`MEMBERSHIP_ACTIONS`): `remove-add` removes a follower's replica of one
  group (the node deletes it) and at the end adds a fresh one back, caught up from the
  leader; `replace-disk` kills a node (leaders preferred), wipes its data directory and
  at the end starts it empty (`join = true`) and re-creates its replica of every group
  it held (`replace-replica G N N`). The value names the memberships seen after each
  change (`removed`, `added`, `replaced`) and any step that failed (`errors`).
  A change never destroys a majority: it starts only when every group involved has its
  full voter set, no learner, and its other voters up, heard from and caught up
  (`membership_blocker`); otherwise it is skipped and the reason recorded
  (`skipped`). Its heal finishes what it began, retried until the group is back to its
  full voter set; what a heal could not finish is tried again before every later step
  and at the final heal, and what even that leaves is reported (`Nemesis.degraded`,
  results.json's ``run.harness_degraded``): the harness left the cluster degraded, and
  the verdict does not blame the product for it.

Hosts: on a cluster whose nodes are shards of a few hosts (`LocalCluster(hosts=, shards=)`)
a node fault's targets are chosen over hosts (`pick_on_hosts`): the hosts as nodes were
chosen before (a minority of them, the first a leader's), then one, some or every live
shard of each. A group keeps at most one replica per host, so a minority of hosts takes
at most that many replicas of any group, whichever shards are taken (never a majority
with 3 or 4 hosts). `crash-unsynced` takes every shard of its hosts (a power loss takes
the machine); `partition-halves`, `bridge` and `majority-ring` are drawn over hosts and
expanded to their shards; `partition-node`, `corrupt`, `disk-full`, `stale-leader` and
`membership` act on one node, a minority of every group wherever it is. `membership`
re-creates a replica on the node that held it, so on a host holding no other replica of
the group (`host_clash` guards it). With one node per host every draw is what it was
before hosts existed, so a seed keeps its targets.

Blocking `LocalCluster` calls run in worker threads: the event loop also runs the proxies
and the workload and must never stall.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import shutil
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from raftmq.client.admin import Admin
from raftmq.client.membership import GroupMembers
from raftmq.localcluster import ClusterError, LocalCluster, node_of
from transport.blocking import request
from wire.protocol import Op, RequestError

from . import topology
from .disk_faults import Damage, SmallDisk, corrupt_entry, damage_file, discard_unsynced
from .proxy import ProxyNet
from .recorder import Recorder


class Probe(Protocol):
    """What `stale-leader` asks of the workload (`chaos.workload.Workload` is one)."""

    def acked_since(self, since: float, groups: Collection[str]) -> dict[int, int]: ...

    async def read_from_node(self, addr: str, targets: Mapping[int, int],
                             timeout: float) -> None: ...


__all__ = [
    "CRASH_SCOPES", "LEADER_BIAS", "NEMESES", "Cadence", "Nemesis", "Probe", "Step",
    "host_clash", "minority_hosts", "pick_on_hosts", "plan", "schedule",
]

log = logging.getLogger("raftmq.chaos.nemesis")

NEMESES = (
    "kill",
    "pause",
    "partition-halves",
    "partition-node",
    "bridge",
    "majority-ring",
    "crash-unsynced",
    "corrupt",
    "leader-transfer",
    "delay",
    "loss",
    "partition-clients",
    "truncate-file",
    "bitflip-file",
    "snapshot-corrupt",
    "disk-full",
    "stale-leader",
    "membership",
    "kill-host",
    "partition-host",
)
MEMBERSHIP_ACTIONS = ("remove-add", "replace-disk")  # taken in turn by `membership` faults
# Seconds a membership change may take, a catch-up included: the group holding the most
# data is caught up by a chunked InstallSnapshot, under whatever faults are running.
MEMBERSHIP_TIMEOUT = 300.0
RESTORE_TIMEOUT = 600.0  # seconds the final heal spends finishing membership changes
CAUGHT_UP_LAG = 2000  # entries a voter may lack and still count as caught up
DELAY = (0.1, 0.05)  # seconds per chunk, and the jitter either side
LOSS = 0.05  # chunks lost per chunk forwarded
# faults that need a ProxyNet besides PARTITIONS
NETWORK = ("delay", "loss", "partition-clients", "stale-leader")
DAMAGE = {  # file faults: (how the file is damaged, or None: either way; which files)
    "truncate-file": ("truncate", ("segment", "index", "snapshot", "chunk")),
    "bitflip-file": ("bitflip", ("segment", "index", "snapshot", "chunk")),
    "snapshot-corrupt": (None, ("snapshot", "chunk")),  # a snapshot is its file + chunks
}
REFUSAL_WAIT = 30.0  # seconds a damaged node gets to start or refuse
PARTITIONS: Mapping[str, Callable[..., topology.Partition]] = {
    "partition-halves": topology.halves,
    "partition-node": topology.isolate,
    "bridge": topology.bridge,
    "majority-ring": topology.majority_ring,
    "partition-host": topology.isolate,  # drawn over hosts: one host's shards together
}
CRASH_SCOPES = ("one", "majority", "all")
STALE_WAIT = 30.0  # seconds stale-leader waits for writes acknowledged by the new leader
STALE_HANDOFF = 0.5  # seconds the aimed reads get to reach the stopped leader's socket
STALE_READ_TIMEOUT = 5.0
LEADER_BIAS = 0.75  # how often a node fault's first target is a group leader


# ------------------------------------------------------------------ the schedule (pure)


@dataclass(frozen=True, slots=True)
class Cadence:
    """Timing of a schedule in seconds: (low, high) ranges drawn uniformly.

    `gap` runs from one fault's start to the next one's; it is stretched when a fault's
    `length` plus `quiet` (healed time between faults) would not fit in it.
    """

    first: tuple[float, float] = (2.0, 5.0)
    gap: tuple[float, float] = (6.0, 10.0)
    length: tuple[float, float] = (2.0, 8.0)
    quiet: float = 1.5


@dataclass(frozen=True, slots=True)
class Step:
    """One planned fault: `at` seconds after the run starts, lasting `length` seconds."""

    at: float
    length: float
    kind: str
    seed: int  # decides the targets when the fault runs
    scope: str | None = None  # crash-unsynced only: one of CRASH_SCOPES

    @property
    def end(self) -> float:
        return self.at + self.length

    def describe(self) -> str:
        scope = f" ({self.scope})" if self.scope else ""
        return f"{self.at:7.2f}s +{self.length:.2f}s {self.kind}{scope}"


def _enabled(names: Iterable[str]) -> tuple[str, ...]:
    kinds = tuple(dict.fromkeys(names))  # de-duplicated, in the order given
    unknown = [k for k in kinds if k not in NEMESES]
    if unknown:
        raise ValueError(f"unknown nemesis {unknown} (known: {', '.join(NEMESES)})")
    if not kinds:
        raise ValueError("no nemesis enabled")
    return kinds


def schedule(
    rng: random.Random, enabled: Sequence[str], cadence: Cadence = Cadence()
) -> Iterator[Step]:
    """The endless fault schedule `rng` decides; a run takes the steps that fit its time.

    Every value comes from `rng`, in one fixed order, so equal seeds give equal schedules
    and a shorter run's schedule is a prefix of a longer one's.
    """
    kinds = _enabled(enabled)
    deck: list[str] = []
    scopes: list[str] = []
    at = rng.uniform(*cadence.first)
    while True:
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        kind = deck.pop()
        scope = None
        if kind == "crash-unsynced":
            if not scopes:
                scopes = list(CRASH_SCOPES)
                rng.shuffle(scopes)
            scope = scopes.pop()
        length = rng.uniform(*cadence.length)
        seed = rng.getrandbits(64)
        yield Step(round(at, 3), round(length, 3), kind, seed, scope)
        at += max(rng.uniform(*cadence.gap), length + cadence.quiet)


def plan(
    rng: random.Random, enabled: Sequence[str], duration: float, cadence: Cadence = Cadence()
) -> list[Step]:
    """The steps of `schedule` that end within `duration` seconds."""
    steps: list[Step] = []
    for step in schedule(rng, enabled, cadence):
        if step.end > duration:
            return steps
        steps.append(step)
    raise AssertionError("unreachable: schedule is endless")  # pragma: no cover


# ------------------------------------------------------------------ running it


@dataclass
class _Active:
    """The fault in progress: what was recorded, how to hold it and how to end it."""

    f: str
    value: dict[str, Any]
    undo: Callable[[], Awaitable[None]]
    hold: Callable[[float], Awaitable[None]] | None = None  # until a monotonic deadline
    started: float = field(default_factory=time.monotonic)


async def _sleep_until(deadline: float) -> None:
    """Sleep until `deadline` on `time.monotonic()`, the clock of the Recorder."""
    await trio.sleep(max(0.0, deadline - time.monotonic()))


async def _nothing() -> None:
    return None


def membership_blocker(group: str, full: Sequence[int], target: int,
                       m: GroupMembers | None, live: Iterable[int]) -> str | None:
    """Why changing `target`'s replica of `group` must not start now (None: it may).

    Removing or wiping a replica leaves the other voters to carry the group: they must
    be every voter but `target` of the full set, all up, heard from by the leader and
    caught up, so that no other failure during the change loses the majority."""
    if m is None:
        return f"group {group} has no leader"
    if sorted(m.voters) != sorted(full) or m.learners:
        return (f"group {group} has voters {sorted(m.voters)} (learners "
                f"{sorted(m.learners)}), not its full set {sorted(full)}")
    up = set(live)
    for n in sorted(full):
        if n == target:
            continue
        if n not in up:
            return f"node {n} of group {group} is down"
        if n != m.leader and n not in m.active:
            return f"node {n} of group {group} is not heard from by its leader"
        lag = m.lag(n)
        if lag is None or lag > CAUGHT_UP_LAG:
            return f"node {n} of group {group} lags {lag} entries"
    return None


def restore_action(todo: str, node: int, m: GroupMembers | None) -> str:
    """What finishing `todo` ("add" or "replace") of `node` needs, given the group's
    membership `m`: "done", "wait" (no leader now), "add" (the node is no voter: add it
    back, resuming a learner's catch-up) or "replace" (it still votes with an old or wiped
    replica: re-create it)."""
    if m is None:
        return "wait"
    if node in m.voters:
        return "done" if todo == "add" else "replace"
    return "add"


Hosts = Sequence[tuple[str, Sequence[int]]]
"""A cluster's hosts in order of their first node: (name, its shards in node order). A
cluster without a `[hosts]` table has one host per node, `n<id>`."""


def minority_hosts(rng: random.Random, hosts: int) -> int:
    """How many hosts a kill or pause takes: one, or up to a minority on 5+ hosts."""
    return rng.randint(1, max(1, (hosts - 1) // 2))


def pick_on_hosts(rng: random.Random, hosts: Hosts, live: Collection[int],
                  leading: Collection[int], count: int, bias: float,
                  shards: str = "one") -> list[int]:
    """Nodes on `count` hosts that have a live shard: the first host is that of a live
    group leader (`leading`) with probability `bias`, the others are drawn at random.
    Which of a chosen host's live shards are taken: `shards` "one" (the leader drawn on
    the first host, one at random on the others), "some" (a random non-empty subset,
    the drawn leader among them) or "all".

    Targets are shards of at most `count` hosts, and a group keeps at most one replica
    per host, so a group loses at most `count` replicas whichever shards are taken: a
    minority of hosts is a minority of every group that spans them all. With one shard
    per host this draws exactly what choosing `count` nodes did before hosts existed
    (the same values from `rng`, in the same order), so earlier seeds keep their targets.
    """
    if shards not in ("one", "some", "all"):
        raise ValueError(f"shards is one, some or all, not {shards!r}")
    up = set(live)
    on = [(name, [n for n in ns if n in up]) for name, ns in hosts]
    on = [(name, ns) for name, ns in on if ns]
    live_nodes = sorted(n for _, ns in on for n in ns)
    if not live_nodes or count < 1:
        return []
    leaders = sorted(set(leading) & up)
    first = (rng.choice(leaders) if leaders and rng.random() < bias
             else rng.choice(live_nodes))
    (home,) = [i for i, (_, ns) in enumerate(on) if first in ns]
    rest = [i for i in range(len(on)) if i != home]
    chosen = [home, *rng.sample(rest, min(count - 1, len(rest)))]
    picked: list[int] = []
    for i in chosen:
        ns = on[i][1]
        if shards == "all" or len(ns) == 1:
            picked += ns
        elif i == home:
            others = [n for n in ns if n != first]
            picked += [first, *(rng.sample(others, rng.randint(0, len(others)))
                                if shards == "some" else [])]
        elif shards == "some":
            picked += rng.sample(ns, rng.randint(1, len(ns)))
        else:
            picked.append(rng.choice(ns))
    return sorted(picked)


def host_clash(host_of: Mapping[int, str], voters: Iterable[int], old: int,
               new: int) -> int | None:
    """A voter of a group (other than `old`, whose replica `new` replaces or re-creates)
    on `new`'s host: a replica on `new` would share a machine with it. None: `new` may
    hold one (its host holds no other replica, or it is `old`'s own host)."""
    where = host_of.get(new, f"n{new}")
    return next((v for v in sorted(voters)
                 if v not in (old, new) and host_of.get(v, f"n{v}") == where), None)


class Nemesis:
    """Injects the enabled faults into `cluster` (and `net`, for partitions) on the
    schedule `rng` decides, recording each one with `recorder`.

    `run(until)` plays the schedule until `until` (a `time.monotonic()` instant) and heals;
    `heal()` ends whatever is in progress and may be called at any time, also after a
    cancelled `run`. Call both from the trio thread that records and runs the proxies.
    """

    def __init__(
        self,
        cluster: LocalCluster,
        net: ProxyNet | None,
        recorder: Recorder,
        *,
        rng: random.Random,
        enabled: Sequence[str] = ("kill", "partition-node"),
        cadence: Cadence = Cadence(),
        ready_timeout: float = 30.0,
        leader_bias: float = LEADER_BIAS,
        disks: Mapping[int, SmallDisk] | None = None,
        probe: Probe | None = None,
    ) -> None:
        self.enabled = _enabled(enabled)
        if net is None and any(k in PARTITIONS or k in NETWORK for k in self.enabled):
            raise ValueError("partition and network nemeses need a ProxyNet (net=None given)")
        if "disk-full" in self.enabled:
            missing = sorted(set(cluster.node_ids) - set(disks or {}))
            if missing:
                raise ValueError(f"disk-full needs a SmallDisk for every node (none for {missing})")
        if "crash-unsynced" in self.enabled:
            unmarked = [c.node_id for c in cluster.configs if not c.test_sync_marks]
            if unmarked:
                raise ValueError(
                    f"crash-unsynced needs every node started with test_sync_marks = true "
                    f"(not set on nodes {unmarked})"
                )
        self.cluster = cluster
        self.net = net
        self.recorder = recorder
        self.cadence = cadence
        self.ready_timeout = ready_timeout
        self.leader_bias = leader_bias
        self.disks = dict(disks or {})
        self.probe = probe
        self._steps = schedule(rng, self.enabled, cadence)
        self._active: _Active | None = None
        self._killed: set[int] = set()
        self._paused: set[int] = set()
        self._membership_turns = 0
        self._full = {g.id: tuple(g.replicas) for g in cluster.groups}  # configured voters
        # membership changes begun and not finished: (group, node) -> "add" | "replace"
        self._pending: dict[tuple[str, int], str] = {}
        # (host, its shards) in node order; a cluster without hosts (or a RemoteCluster)
        # has one host per node
        hosts: Mapping[str, Sequence[int]] = getattr(cluster, "hosts", None) or {
            f"n{i}": [i] for i in cluster.node_ids}
        self.hosts: list[tuple[str, list[int]]] = [(h, list(ns)) for h, ns in hosts.items()]
        self._host_of = {n: h for h, ns in self.hosts for n in ns}
        self._sharded = any(len(ns) > 1 for _, ns in self.hosts)
        self.history: list[dict[str, Any]] = []  # one entry per fault, for tests and logs
        # nodes that exited on their own, restarted once the fault in force was healed
        self.exited: list[dict[str, Any]] = []
        self._origin = time.monotonic()
        self._starters: dict[str, Callable[[Step, random.Random], Awaitable[_Active | None]]] = {
            "kill": self._kill,
            "pause": self._pause,
            "crash-unsynced": self._crash_unsynced,
            "corrupt": self._corrupt,
            "leader-transfer": self._leader_transfer,
            "delay": self._shape,
            "loss": self._shape,
            "partition-clients": self._partition_clients,
            "disk-full": self._disk_full,
            "stale-leader": self._stale_leader,
            "membership": self._membership,
            "kill-host": self._kill_host,
            **{k: self._partition for k in PARTITIONS},
            **{k: self._damage for k in DAMAGE},
        }

    # ------------------------------------------------------------ schedule

    async def run(self, until: float) -> None:
        """Play the schedule until the monotonic instant `until`, then heal.

        A step starts at its planned time or, when the previous heal took longer, as soon
        as it is over; a step that would not end by `until` is not started."""
        origin = self._origin = time.monotonic()
        for step in self._steps:
            start = max(origin + step.at, time.monotonic())
            if start + step.length > until:
                break
            await _sleep_until(start)
            await self._play(step, start + step.length)
        await self.heal()

    async def _play(self, step: Step, deadline: float) -> None:
        rng = random.Random(step.seed)
        await self._restore_before_step()
        active = await self._starters[step.kind](step, rng)
        if active is None:
            log.info("nemesis %s skipped: no target", step.kind)
            return
        if active.hold is not None:
            await active.hold(deadline)
        else:
            await _sleep_until(deadline)
        await self._end()
        await self._restart_exited()
        took, problem = await self._wait_ready()
        self.history[-1].update(ready_after=took, problem=problem)

    async def _restart_exited(self) -> None:
        """Start again every node that exited on its own (a finding that makes the run
        invalid, reported in `exited`), once the fault in force is healed: the rest of
        the run then still puts a whole cluster under faults, instead of going on with a
        group short of a voter or of its quorum."""
        gone = await trio.to_thread.run_sync(self.cluster.unexpected_exits)
        for name, code in sorted(gone.items()):
            node = node_of(name)
            entry: dict[str, Any] = {"node": name, "code": code,
                                     "at": round(time.monotonic() - self._origin, 3)}
            self.exited.append(entry)
            log.error("node %s exited on its own (code %s): started again", name, code)
            if node is None or node not in self.cluster.node_ids:
                entry["restarted"] = False
                continue
            try:
                await trio.to_thread.run_sync(self.cluster.restart, node)
            except (ClusterError, OSError) as exc:
                entry["restarted"] = False
                entry["error"] = str(exc)
            else:
                entry["restarted"] = True

    async def heal(self) -> None:
        """End every fault: the one in progress, then anything left behind (resume
        paused nodes, restart killed ones, unblock every link); then wait (bounded) until
        every group has a leader again. A slow recovery is logged, never raised: the
        harness judges the cluster afterwards."""
        await self._end()
        for i in sorted(self._paused):
            self.cluster.resume(i)
        self._paused.clear()
        await self._restart(sorted(self._killed))
        if self.net is not None:
            self.net.heal()
        for disk in self.disks.values():
            await trio.to_thread.run_sync(disk.free)
        await self._restart_exited()
        if self._pending:
            value: dict[str, Any] = {"action": "restore", "todo": self._pending_text()}
            self._begin("membership", value, _nothing)
            try:
                await self._restore(RESTORE_TIMEOUT, value)
            finally:
                await self._end()
        await self._wait_ready()

    def _begin(
        self,
        f: str,
        value: dict[str, Any],
        undo: Callable[[], Awaitable[None]],
        hold: Callable[[float], Awaitable[None]] | None = None,
    ) -> _Active:
        """Record the fault's start (before it is injected) and make it the active one."""
        self.recorder.fault_start(f, value)
        log.info("nemesis %s: %s", f, value)
        self._active = _Active(f, value, undo, hold)
        return self._active

    async def _end(self) -> None:
        """Heal the active fault, then record its end with its final value."""
        active, self._active = self._active, None
        if active is None:
            return
        try:
            await active.undo()
        finally:
            self.recorder.fault_end(active.f, active.value)
            self.history.append({
                "f": active.f, "value": active.value, "start": active.started,
                "end": time.monotonic(),
            })
            log.info("nemesis %s healed", active.f)

    async def _wait_ready(self) -> tuple[float | None, str | None]:
        """Wait up to `ready_timeout` for every group to have a live leader; returns
        (seconds it took, None) or (None, what was missing). Never raises on a node that
        exited by itself: that stays for the harness's `unexpected_exits()`."""
        t0 = time.monotonic()
        wait = functools.partial(self.cluster.wait_ready, self.ready_timeout, raise_on_exit=False)
        try:
            await trio.to_thread.run_sync(wait, abandon_on_cancel=True)
        except TimeoutError as exc:
            log.warning("cluster not ready after %.1f s: %s", self.ready_timeout, exc)
            return None, str(exc)
        return time.monotonic() - t0, None

    # ------------------------------------------------------------ targets

    async def _leaders(self) -> dict[str, int]:
        """Group -> leader node as the name server says now ({} when it cannot tell)."""
        try:
            got = await trio.to_thread.run_sync(
                self.cluster.leaders, 2.0, abandon_on_cancel=True
            )
        except (OSError, RequestError):
            return {}
        return {g: n for g, n in got.items() if n is not None}

    def _live(self) -> list[int]:
        return [i for i in self.cluster.node_ids
                if self.cluster.is_running(i) and not self.cluster.is_paused(i)]

    def _pick(self, rng: random.Random, leaders: Mapping[str, int], count: int,
              shards: str = "one") -> list[int]:
        """Live nodes on `count` hosts (`pick_on_hosts`; a host per node without hosts);
        the first is a group leader with probability `leader_bias`."""
        return pick_on_hosts(rng, self.hosts, self._live(), leaders.values(), count,
                             self.leader_bias, shards)

    def _minority(self, rng: random.Random) -> int:
        """How many hosts a kill or pause takes: one, or up to a minority on 5+ hosts."""
        return minority_hosts(rng, len(self.hosts))

    def _hosts_of(self, nodes: Iterable[int]) -> list[str]:
        return sorted({self._host_of[n] for n in nodes})

    @staticmethod
    def _on(leaders: Mapping[str, int], nodes: Iterable[int]) -> dict[str, int]:
        chosen = set(nodes)
        return {g: n for g, n in sorted(leaders.items()) if n in chosen}

    # ------------------------------------------------------------ process faults

    async def _kill_now(self, nodes: list[int]) -> None:
        self._killed.update(nodes)  # first: a cancelled kill is still restarted by heal
        await trio.to_thread.run_sync(self.cluster.kill_together, nodes)

    async def _restart(self, nodes: Iterable[int]) -> None:
        for i in nodes:
            await trio.to_thread.run_sync(self.cluster.restart, i)
            self._killed.discard(i)

    async def _kill(self, step: Step, rng: random.Random) -> _Active | None:
        leaders = await self._leaders()
        nodes = self._pick(rng, leaders, self._minority(rng), "some")
        if not nodes:
            return None
        value = {"nodes": nodes, "leaders": self._on(leaders, nodes)}
        active = self._begin("kill", value, functools.partial(self._restart, nodes))
        await self._kill_now(nodes)
        return active

    async def _pause(self, step: Step, rng: random.Random) -> _Active | None:
        leaders = await self._leaders()
        nodes = self._pick(rng, leaders, self._minority(rng), "some")
        if not nodes:
            return None

        async def resume() -> None:
            for i in nodes:
                self.cluster.resume(i)
                self._paused.discard(i)

        value = {"nodes": nodes, "leaders": self._on(leaders, nodes)}
        active = self._begin("pause", value, resume)
        for i in nodes:
            self._paused.add(i)
            try:
                self.cluster.pause(i)
            except ClusterError as exc:  # it exited meanwhile; the harness reports that
                log.warning("pause of node %d: %s", i, exc)
        return active

    async def _crash_unsynced(self, step: Step, rng: random.Random) -> _Active | None:
        scope = step.scope or "one"
        n = len(self.hosts)  # a power loss takes a whole machine: every shard of a host
        count = {"one": 1, "majority": topology.majority(n), "all": n}[scope]
        leaders = await self._leaders()
        nodes = self._pick(rng, leaders, count, "all")
        if not nodes:
            return None
        value: dict[str, Any] = {
            "scope": scope, "nodes": nodes, "leaders": self._on(leaders, nodes),
        }
        if self._sharded:
            value["hosts"] = self._hosts_of(nodes)
        active = self._begin("crash-unsynced", value, functools.partial(self._restart, nodes))
        await self._kill_now(nodes)
        value["discarded"] = await self._discard_unsynced(nodes)
        return active

    async def _discard_unsynced(self, nodes: Iterable[int]) -> dict[str, Any]:
        """Throw away what each of `nodes` (killed) had written and not fsynced."""
        dirs = {i: self.cluster.configs[i - 1].data for i in nodes}

        def discard_all() -> dict[str, Any]:
            return {str(i): discard_unsynced(d) for i, d in dirs.items()}

        return await trio.to_thread.run_sync(discard_all)

    async def _kill_host(self, step: Step, rng: random.Random) -> _Active | None:
        """Every shard of one host (leaders' hosts preferred) SIGKILLed at once, as a
        machine's power loss does; with sync marks on every node, what they had not
        fsynced is discarded too. Restarted at the end."""
        leaders = await self._leaders()
        nodes = self._pick(rng, leaders, 1, "all")
        if not nodes:
            return None
        value: dict[str, Any] = {"host": self._host_of[nodes[0]], "nodes": nodes,
                                 "leaders": self._on(leaders, nodes)}
        active = self._begin("kill-host", value, functools.partial(self._restart, nodes))
        await self._kill_now(nodes)
        configs = getattr(self.cluster, "configs", None) or []
        if configs and all(c.test_sync_marks for c in configs):
            value["discarded"] = await self._discard_unsynced(nodes)
        return active

    async def _corrupt(self, step: Step, rng: random.Random) -> _Active | None:
        leaders = await self._leaders()
        nodes = self._pick(rng, leaders, 1)
        if not nodes:
            return None
        (node,) = nodes
        value: dict[str, Any] = {"nodes": nodes, "leaders": self._on(leaders, nodes)}
        active = self._begin("corrupt", value, functools.partial(self._restart, nodes))
        await self._kill_now(nodes)
        data = self.cluster.configs[node - 1].data
        part = rng.choice(("body", "header"))
        value["corrupted"] = await trio.to_thread.run_sync(corrupt_entry, data, rng, part)
        return active

    async def _damage(self, step: Step, rng: random.Random) -> _Active | None:
        how, kinds = DAMAGE[step.kind]
        leaders = await self._leaders()
        nodes = self._pick(rng, leaders, self._minority(rng), "some")
        if not nodes:
            return None
        value: dict[str, Any] = {"nodes": nodes, "leaders": self._on(leaders, nodes)}
        damages: dict[int, Damage] = {}
        active = self._begin(step.kind, value,
                             functools.partial(self._restart_damaged, nodes, damages, value))
        await self._kill_now(nodes)
        done: dict[str, Any] = {}
        for i in nodes:
            data = self.cluster.configs[i - 1].data
            way = how or rng.choice(("truncate", "bitflip"))
            d = await trio.to_thread.run_sync(damage_file, data, rng, way, kinds)
            if d is not None:
                damages[i] = d
            done[str(i)] = None if d is None else d.describe()
        value["damaged"] = done
        return active

    async def _restart_damaged(
        self, nodes: list[int], damages: dict[int, Damage], value: dict[str, Any]
    ) -> None:
        """Restart each damaged node; one that refuses to start gets its original file
        back and is started again (see the module docstring)."""
        outcome: dict[str, str] = {}
        refusals: dict[str, str] = {}
        for i in nodes:
            wait = functools.partial(self.cluster.restart_and_wait, i, REFUSAL_WAIT)
            refused = await trio.to_thread.run_sync(wait)
            if refused is None:
                outcome[str(i)] = "started"
            else:
                outcome[str(i)] = "refused"
                refusals[str(i)] = refused[-2000:]
                log.warning("node %d refused to start on damaged files: %s", i, refused)
                if i in damages:
                    await trio.to_thread.run_sync(damages[i].restore)
                await trio.to_thread.run_sync(self.cluster.restart, i)
            self._killed.discard(i)
        value["outcome"] = outcome
        if refusals:
            value["refusals"] = refusals

    async def _disk_full(self, step: Step, rng: random.Random) -> _Active | None:
        leaders = await self._leaders()
        nodes = self._pick(rng, leaders, 1)
        if not nodes:
            return None
        disk = self.disks[nodes[0]]
        value: dict[str, Any] = {"nodes": nodes, "leaders": self._on(leaders, nodes)}

        async def free() -> None:
            await trio.to_thread.run_sync(disk.free)
            value["free_after_heal"] = disk.free_bytes()

        active = self._begin("disk-full", value, free)
        value.update(await trio.to_thread.run_sync(disk.fill))
        return active

    # ------------------------------------------------------------ membership

    async def _membership(self, step: Step, rng: random.Random) -> _Active | None:
        groups = sorted(g.id for g in self.cluster.groups)
        if not groups:
            return None
        action = MEMBERSHIP_ACTIONS[self._membership_turns % len(MEMBERSHIP_ACTIONS)]
        self._membership_turns += 1
        leaders = await self._leaders()
        if action == "remove-add":
            group = rng.choice(groups)
            voters = self._full[group]
            followers = [n for n in voters if n != leaders.get(group) and n in self._live()]
            if not followers:
                return None
            node = rng.choice(followers)
            value: dict[str, Any] = {"action": action, "groups": [group], "nodes": [node],
                                     "leaders": {}}
            if why := (self._clash(group, node)
                       or await self._membership_blocked([group], node)):
                return self._skip_membership(value, why)
            active = self._begin("membership", value,
                                 functools.partial(self._heal_membership, [], value))
            self._pending[(group, node)] = "add"  # first: a cancelled removal is healed too
            await self._admin_step(value, "removed", group, "remove_replica", group, node)
            return active
        nodes = self._pick(rng, leaders, 1)
        if not nodes:
            return None
        (node,) = nodes
        held = [g.id for g in self.cluster.groups if node in g.replicas]
        value = {"action": action, "groups": held, "nodes": nodes,
                 "leaders": self._on(leaders, nodes)}
        if why := (next(filter(None, (self._clash(g, node) for g in held)), None)
                   or await self._membership_blocked(held, node)):
            return self._skip_membership(value, why)
        active = self._begin("membership", value,
                             functools.partial(self._heal_membership, nodes, value))
        for group in held:
            self._pending[(group, node)] = "replace"
        await self._kill_now(nodes)
        value["wiped"] = await trio.to_thread.run_sync(self._wipe, node)
        return active

    def _clash(self, group: str, node: int) -> str | None:
        """Why `node` must not hold `group`'s replica it gets back (`host_clash`): the
        nemesis re-creates a replica on the node that held it, so on its own host, which
        holds no other replica of the group; this says so if that ever changes."""
        other = host_clash(self._host_of, self._full[group], node, node)
        return None if other is None else (
            f"node {node} shares host {self._host_of.get(node)} with node {other} of "
            f"group {group}")

    async def _members(self, group: str) -> GroupMembers | None:
        """`group`'s membership from its leader (None: no leader answered)."""
        try:
            with trio.fail_after(30.0):
                async with Admin(self.cluster.namesrv_addr, timeout=5.0) as admin:
                    return await admin.group_members(group, wait=10.0)
        except (RequestError, OSError, trio.TooSlowError):
            return None

    async def _membership_blocked(self, groups: Sequence[str], node: int) -> str | None:
        """Why a change of `node` in `groups` must not start now (`membership_blocker`)."""
        if self._pending:
            return f"membership changes not finished yet: {self._pending_text()}"
        for group in groups:
            m = await self._members(group)
            why = membership_blocker(group, self._full[group], node, m, self._live())
            if why is not None:
                return why
        return None

    def _skip_membership(self, value: dict[str, Any], why: str) -> _Active | None:
        """Record a membership fault not made, and why (a zero-length fault); None: no
        fault is active."""
        value["skipped"] = why
        self.recorder.fault_start("membership", value)
        self.recorder.fault_end("membership", value)
        now = time.monotonic()
        self.history.append({"f": "membership", "value": value, "start": now, "end": now})
        log.info("nemesis membership skipped: %s", why)
        return None

    def _pending_text(self) -> str:
        return ", ".join(f"{todo} node {n} in {g}" for (g, n), todo in sorted(self._pending.items()))

    async def _admin_step(self, value: dict[str, Any], key: str, group: str, op: str,
                          *args: Any, **kwargs: Any) -> None:
        """One `Admin` membership operation, retried (bounded) while it may yet work; its
        outcome goes in `value[key][group]` (the voters after it) or `value["errors"]`."""
        deadline = time.monotonic() + MEMBERSHIP_TIMEOUT
        error = ""
        while time.monotonic() < deadline:
            try:
                with trio.fail_after(max(1.0, deadline - time.monotonic())):
                    async with Admin(self.cluster.namesrv_addr, timeout=5.0) as admin:
                        m = await getattr(admin, op)(*args, **kwargs)
                value.setdefault(key, {})[group] = list(m.voters)
                return
            except (RequestError, OSError, trio.TooSlowError) as exc:
                error = f"{op} {group}: {exc!r}"
                log.info("membership step failed, retrying: %s", error)
            await trio.sleep(0.5)
        value.setdefault("errors", []).append(error)

    async def _heal_membership(self, wiped: list[int], value: dict[str, Any]) -> None:
        """Start the wiped node (empty, hosting nothing) and finish every change begun."""
        await self._restart(wiped)
        await self._restore(MEMBERSHIP_TIMEOUT, value)

    async def _restore(self, timeout: float, value: dict[str, Any]) -> None:
        """Finish the pending membership changes, each retried until `timeout` is spent:
        a replica added back or re-created (`replace-replica N N`) on its node, until
        the group has its full voter set again. What is left stays pending."""
        deadline = time.monotonic() + timeout
        for key in sorted(self._pending):
            while key in self._pending and time.monotonic() < deadline:
                await self._restore_one(*key, deadline, value)
        if self._pending:
            value["pending"] = self._pending_text()
            log.warning("membership left unfinished: %s", value["pending"])

    async def _restore_one(self, group: str, node: int, deadline: float,
                           value: dict[str, Any]) -> None:
        """One attempt at finishing `node`'s change in `group` (see `restore_action`)."""
        todo = self._pending[(group, node)]
        m = await self._members(group)
        action = restore_action(todo, node, m)
        if action == "done":
            assert m is not None
            value.setdefault("added" if todo == "add" else "replaced", {})[group] = list(m.voters)
            del self._pending[(group, node)]
            return
        if action == "wait":
            await trio.sleep(1.0)
            return
        self._pending[(group, node)] = action
        op, args = (("replace_replica", (group, node, node)) if action == "replace"
                    else ("add_replica", (group, node)))
        left = max(1.0, deadline - time.monotonic())
        try:
            with trio.fail_after(left):
                async with Admin(self.cluster.namesrv_addr, timeout=5.0) as admin:
                    m = await getattr(admin, op)(*args, catch_up_timeout=left)
        except (RequestError, OSError, trio.TooSlowError) as exc:
            errors = value.setdefault("errors", [])
            if len(errors) < 20:
                errors.append(f"{op} {group}: {exc!r}")
            log.info("membership restore failed, retrying: %s %s: %r", op, group, exc)
            await trio.sleep(1.0)
            return
        value.setdefault("added" if action == "add" else "replaced", {})[group] = list(m.voters)
        del self._pending[(group, node)]

    async def _restore_before_step(self) -> None:
        """Before any step: finish what an earlier membership heal could not (recorded as
        a membership fault of its own, `action: restore`)."""
        if not self._pending:
            return
        groups = sorted({g for g, _ in self._pending})
        nodes = sorted({n for _, n in self._pending})
        value: dict[str, Any] = {"action": "restore", "groups": groups, "nodes": nodes,
                                 "todo": self._pending_text()}
        self._begin("membership", value, _nothing)
        try:
            await self._restore(MEMBERSHIP_TIMEOUT, value)
        finally:
            await self._end()

    @property
    def degraded(self) -> list[str]:
        """Membership changes the harness began and could not finish: the cluster is left
        with fewer voters than configured by the harness, not by the product."""
        return [f"group {g}: {todo} of node {n} not finished"
                for (g, n), todo in sorted(self._pending.items())]

    def _wipe(self, node: int) -> int:
        """Delete everything in `node`'s data directory (a new disk), and have it start
        with `join` from now on; returns how many entries were removed."""
        cfg = self.cluster.configs[node - 1]
        removed = 0
        for child in cfg.data.iterdir():  # the directory itself may be a mount point
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
            removed += 1
        self.cluster.configs[node - 1] = dataclasses.replace(cfg, join=True)
        self.cluster.write_configs()
        return removed

    # ------------------------------------------------------------ network faults

    async def _shape(self, step: Step, rng: random.Random) -> _Active | None:
        assert self.net is not None
        net = self.net
        delay, jitter, loss = (*DELAY, 0.0) if step.kind == "delay" else (0.0, 0.0, LOSS)
        value: dict[str, Any] = {"delay": delay, "jitter": jitter, "loss": loss}

        async def unshape() -> None:
            net.shape()
            value["lost_chunks"] = sum(p.link.lost_chunks for p in net.proxies()) - lost0
            value["resets"] = sum(p.link.resets for p in net.proxies()) - resets0

        lost0 = sum(p.link.lost_chunks for p in net.proxies())
        resets0 = sum(p.link.resets for p in net.proxies())
        active = self._begin(step.kind, value, unshape)
        value["links"] = net.shape(delay=delay, jitter=jitter, loss=loss, rng=rng)
        return active

    async def _partition_clients(self, step: Step, rng: random.Random) -> _Active | None:
        assert self.net is not None
        net = self.net
        leaders = await self._leaders()
        nodes = self._pick(rng, leaders, self._minority(rng), "some")
        if not nodes:
            return None
        value = {"nodes": nodes, "leaders": self._on(leaders, nodes)}

        async def reconnect() -> None:
            net.cut_clients(())

        active = self._begin("partition-clients", value, reconnect)
        net.cut_clients(nodes)
        return active

    async def _partition(self, step: Step, rng: random.Random) -> _Active | None:
        assert self.net is not None
        net = self.net
        leaders = await self._leaders()
        ids = self.cluster.node_ids
        if step.kind in ("partition-node", "partition-host"):
            target = self._pick(rng, leaders, 1) or [rng.choice(ids)]
            if step.kind == "partition-host" and self._sharded:
                host = [i for i, (_, ns) in enumerate(self.hosts, 1) if target[0] in ns]
                shape = self._over_hosts(topology.isolate, rng, host[0])
            else:  # one shard alone (or a host of one node)
                shape = topology.isolate(ids, rng, target[0])
        else:
            shape = self._over_hosts(PARTITIONS[step.kind], rng)
        value = {**shape.to_json(), "leaders": self._on(leaders, shape.cut_off)}
        if shape.cut_off:
            value["nodes"] = sorted(shape.cut_off)
        if step.kind == "partition-host":
            value["host"] = self._host_of[target[0]]

        async def unblock() -> None:
            net.set_partition(())

        active = self._begin(step.kind, value, unblock)
        net.set_partition(shape.blocked)
        return active

    def _over_hosts(self, shape: Callable[..., topology.Partition], rng: random.Random,
                    *args: Any) -> topology.Partition:
        """`shape` drawn over the hosts and expanded to their shards (`topology.on_hosts`):
        a host's shards stay on one side together. Without hosts, over the nodes."""
        if not self._sharded:
            return shape(self.cluster.node_ids, rng, *args)
        return topology.on_hosts(shape(range(1, len(self.hosts) + 1), rng, *args), self.hosts)

    async def _leader_transfer(self, step: Step, rng: random.Random) -> _Active | None:
        groups = list(self.cluster.groups)
        if not groups:
            return None
        leaders = await self._leaders()
        value: dict[str, Any] = {
            "groups": [g.id for g in groups], "leaders": dict(sorted(leaders.items())),
        }
        transfers: list[dict[str, Any]] = []

        async def storm(deadline: float) -> None:
            async with Admin(self.cluster.namesrv_addr, timeout=2.0) as admin:
                while (left := deadline - time.monotonic()) > 0.05:
                    g = rng.choice(groups)
                    now = await self._leaders()
                    followers = [r for r in g.replicas if r != now.get(g.id)]
                    to = rng.choice(followers or list(g.replicas))
                    entry: dict[str, Any] = {"group": g.id, "from": now.get(g.id), "to": to}
                    with trio.move_on_after(min(2.0, left)) as scope:
                        try:
                            await admin.transfer_leader(g.id, to, prefer=False)
                            entry["ok"] = True
                        except RequestError as exc:
                            entry["error"] = exc.code.name
                    if scope.cancelled_caught:
                        entry["error"] = "timeout"
                    transfers.append(entry)
                    value["transfers"] = transfers
                    await trio.sleep(min(rng.uniform(0.2, 0.8), max(0.0, left)))

        return self._begin("leader-transfer", value, _nothing, storm)

    async def _led_by(self, node: int) -> list[str]:
        """The groups `node` itself says it leads ([] when it does not answer)."""
        addr = self.cluster.node_addr(node)
        try:
            header, _ = await trio.to_thread.run_sync(
                functools.partial(request, addr, {"op": int(Op.STATUS)}, timeout=2.0),
                abandon_on_cancel=True,
            )
        except (OSError, RequestError):
            return []
        groups = header.get("groups") or {}
        return sorted(g for g, st in groups.items() if (st or {}).get("role") == "leader")

    async def _stale_leader(self, step: Step, rng: random.Random) -> _Active | None:
        assert self.net is not None
        net = self.net
        leaders = await self._leaders()
        live = self._live()
        candidates = sorted(set(leaders.values()) & set(live))
        rng.shuffle(candidates)
        node, led = None, []
        for n in candidates:  # the name server may lag a change: ask the node itself
            led = await self._led_by(n)
            if led:
                node = n
                break
        if node is None:
            return None
        value: dict[str, Any] = {"nodes": [node], "leaders": {g: node for g in led}}
        cut = topology.isolate(self.cluster.node_ids, rng, node)

        def resume() -> None:
            if node in self._paused:
                self.cluster.resume(node)
                self._paused.discard(node)

        async def undo() -> None:
            resume()
            net.set_partition(())

        async def hold(deadline: float) -> None:
            waited_until = max(deadline, time.monotonic() + STALE_WAIT)
            targets: dict[int, int] = {}
            while self.probe is not None and time.monotonic() < waited_until:
                targets = self.probe.acked_since(stopped, led)
                if all(self.probe.acked_since(stopped, [g]) for g in led):
                    break  # every group it led has a new leader that acknowledged writes
                await trio.sleep(0.1)
            value["probed"] = {str(q): o for q, o in sorted(targets.items())}
            if self.probe is not None and targets:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.probe.read_from_node, net.client(node).address,
                                       targets, STALE_READ_TIMEOUT)
                    await trio.sleep(STALE_HANDOFF)
                    resume()
            resume()
            await _sleep_until(deadline)

        active = self._begin("stale-leader", value, undo, hold)
        self._paused.add(node)
        try:
            self.cluster.pause(node)
        except ClusterError as exc:  # it exited meanwhile; the harness reports that
            log.warning("pause of node %d: %s", node, exc)
        stopped = time.monotonic()
        net.set_partition(cut.blocked)
        return active
