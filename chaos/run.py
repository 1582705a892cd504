"""`raftmq chaos run`: a Jepsen-style test of a real cluster under faults.

One trio program in this process runs everything that is not a node:

1. the fault proxies (one per node pair for Raft traffic, one per node for clients), so a
   partition is a proxy that stops forwarding;
2. a cluster of real node processes on loopback wired through those proxies;
3. the workload (producers and readers recording every operation) and the nemesis
   (faults on a seeded schedule) side by side for `time` seconds;
4. a full heal, a wait until every group has a leader again, and a drain that reads
   every queue from offset 0 to its end;
5. the analysis: accounting (lost, duplicated, unexpected...), the queue-log
   linearizability check per queue, the longest unavailability after a leader loss, and
   the bound on writes after every heal (`chaos.analysis.LIVENESS_BOUND`).

With `--workload delay` (or `all`) producers send delayed messages and readers follow
their queues from the start to the drain (`chaos.delayworkload`), checked by
`chaos.delaycheck`. With `--workload simple` (or `all`) simple consumers of one group, one
of them a process killed again and again, ack, nack, stall, re-time and dead-letter
messages (`chaos.simpleworkload`), checked by `chaos.simplecheck`. With `--workload fifo`
(or `all`) the same on messages of FIFO message groups, checked by `chaos.simplecheck`
and, per message group, `chaos.fifocheck`. With `--workload ordered` (or `all`) orderly
push consumers in processes that are killed or closed again and again handle keyed,
sequenced messages (`chaos.orderedworkload`), checked by `chaos.ordercheck`: in order
per key, nothing handled twice while its holder held on. With `--workload security` (or
`all`) the nodes run with logins and ACLs on and a
bootstrap superuser whose login every client of the harness uses (`chaos.secworkload`);
the default queue workload's cluster has neither.

Nodes run with small segments and frequent snapshots (`RunOptions.segment_size`,
`snapshot_every_entries`), so segments roll and snapshots are taken under faults. With
`disk-full` enabled, each node's data directory is a loop-mounted ext4 image
(`chaos.disk_faults.SmallDisk`), unmounted (its files copied back) at the end.

Output in `out`: `history.jsonl` (operations and faults), `results.json`, `report.html`
and `cluster/` (configs, node data and logs, kept for post-mortems). The run is valid, and
the command exits 0, only if nothing acknowledged was lost, nothing unexpected appeared,
every queue's history is linearizable and no node died except by the nemesis' hand.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import trio

from broker.config import ALLOW_MUTATIONS_ENV, KNOWN_MUTATIONS
from raftmq.localcluster import LocalCluster
from transport.scram import USER_ENV

from .analysis import Analysis, analyze_run
from .attackers import Attackers, node_rss_mib
from .delayworkload import DelayWorkload
from .disk_faults import SmallDisk
from .nemesis import NEMESES, Nemesis, Step, plan
from .orderedworkload import OrderedWorkload
from .proxy import ProxyNet
from .recorder import Recorder
from .remote import REMOTE_NEMESES, RemoteCluster
from .secworkload import SecurityWorkload, harness_login, harness_superuser
from .simpleworkload import SimpleWorkload
from .txworkload import TX_NODE_SETTINGS, TxWorkload
from .workload import Workload

__all__ = ["RunOptions", "nemesis_plan", "run_chaos"]

WORKLOADS = ("queue", "txn", "security", "delay", "simple", "fifo", "ordered", "all")
SECURE_WORKLOADS = ("security", "all")
"""Workloads whose cluster runs with logins and ACLs on (`chaos.secworkload`); every
client of the harness then logs in as its superuser."""
TOPIC = "chaos"


@dataclass
class RunOptions:
    """Everything that decides a run; with the same seed the fault schedule repeats."""

    out: Path
    nodes: int = 3
    groups: int = 3
    hosts: int | None = None
    """Simulated machines of `shards` nodes each (`LocalCluster(hosts=, shards=)`): no
    group puts two replicas on one host, and node faults take hosts into account
    (`chaos.nemesis.pick_on_hosts`). `nodes` is then hosts x shards. None: every node is
    its own host."""
    shards: int = 1
    time: float = 60.0
    nemesis: tuple[str, ...] = ("kill", "partition-node")  # () runs without faults
    workload: str = "queue"
    seed: int = 0
    queues_per_group: int = 2
    producers: int = 4  # plain producers
    idempotent_producers: int = 4
    readers: int = 3
    mutations: tuple[str, ...] = ()  # deliberate node misbehaviour (needs the test flag)
    check_timeout: float | None = None
    """The linearizability search's limit in seconds; None: the run's `time`, at least
    120 s (the search of a long run takes a few percent of its length)."""
    ready_timeout: float = 60.0
    drain_timeout: float | None = None
    """How long the final drain may read; None: a twentieth of the run's `time`, at least
    120 s (the drain reads every queue from its start, so it grows with the run)."""
    tick_ms: int = 100
    # small, so segments roll and snapshots are taken (and damaged) during a short run
    segment_size: int = 256 << 10
    snapshot_every_entries: int = 400
    disk_size: int = 1 << 30  # of each node's file system when disk-full is enabled
    cluster: Path | None = None
    """A cluster the harness did not start (`chaos.remote`): its CONFIG file."""

    def __post_init__(self) -> None:
        if self.hosts is not None and self.hosts > 0 and self.shards > 0:
            self.nodes = self.hosts * self.shards

    @property
    def layout(self) -> str:
        """The cluster's shape in words: `3 nodes` or `3 hosts x 2 shards`."""
        return (f"{self.nodes} nodes" if self.hosts is None
                else f"{self.hosts} hosts x {self.shards} shards")

    @property
    def drain_seconds(self) -> float:
        """`drain_timeout`, or its default for the run's length."""
        return self.drain_timeout if self.drain_timeout is not None else max(120.0, self.time / 20)

    def validate(self) -> None:
        if self.hosts is None:
            if self.nodes not in (3, 5):
                raise ValueError(f"--nodes must be 3 or 5, got {self.nodes}")
            if self.shards != 1:
                raise ValueError("--shards needs --hosts (the machines the shards run on)")
        else:
            # a group's 3 replicas go to 3 different hosts
            if not 3 <= self.hosts <= MAX_HOSTS:
                raise ValueError(f"--hosts must be 3 to {MAX_HOSTS}, got {self.hosts}")
            if not 1 <= self.shards <= MAX_SHARDS:
                raise ValueError(f"--shards must be 1 to {MAX_SHARDS}, got {self.shards}")
            if self.cluster is not None:
                raise ValueError("--hosts needs nodes the harness starts, not --cluster "
                                 "(whose hosts are its own)")
        if self.groups < 1:
            raise ValueError(f"--groups must be at least 1, got {self.groups}")
        if self.drain_timeout is not None and not self.drain_timeout > 0:
            raise ValueError(f"--drain-timeout must be positive, got {self.drain_timeout}")
        if not self.time > 0:
            raise ValueError(f"--time must be positive, got {self.time}")
        if self.check_timeout is not None and not self.check_timeout > 0:
            raise ValueError(f"--check-timeout must be positive, got {self.check_timeout}")
        unknown = sorted(set(self.nemesis) - set(NEMESES))
        if unknown:
            raise ValueError(f"unknown nemesis {unknown} (known: {', '.join(NEMESES)})")
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r} (known: {', '.join(WORKLOADS)})")
        bad = sorted(set(self.mutations) - KNOWN_MUTATIONS)
        if bad:
            raise ValueError(f"unknown mutation {bad} (known: {', '.join(sorted(KNOWN_MUTATIONS))})")
        if self.segment_size < 1024 or self.snapshot_every_entries < 0:
            raise ValueError("segment_size is at least 1024 and snapshot_every_entries >= 0")
        if "disk-full" in self.nemesis:
            why = SmallDisk.supported(self.out.resolve().parent)
            if why is not None:
                raise ValueError(f"the disk-full nemesis cannot run here: {why}")
        if self.cluster is not None:
            outside = sorted(set(self.nemesis) - set(REMOTE_NEMESES))
            if outside:
                raise ValueError(
                    f"nemesis {outside} cannot be applied to a cluster the harness did not "
                    f"start (--cluster allows {', '.join(REMOTE_NEMESES)})"
                )
            if self.mutations:
                raise ValueError("--mutation needs nodes the harness starts, not --cluster")
            if self.workload != "queue":
                why = {"security": "with logins and ACLs on",
                       "delay": "on the clock its readers read: due times are the nodes' "
                                "wall clock",
                       "simple": "on the clock its consumers read: invisible times are the "
                                 "nodes' wall clock",
                       "fifo": "on the clock its consumers read: invisible times are the "
                               "nodes' wall clock",
                       "ordered": "with consumer processes it starts and kills"}.get(self.workload, "with short check-back timings")
                raise ValueError(f"--workload {self.workload} needs nodes the harness starts "
                                 f"({why}), not --cluster")
        if self.mutations and os.environ.get(ALLOW_MUTATIONS_ENV) != "1":
            raise ValueError(
                f"--mutation makes nodes misbehave on purpose; set {ALLOW_MUTATIONS_ENV}=1 "
                "to confirm this is a test"
            )


def _prepare_out(out: Path) -> Path:
    """Create `out`; a previous run's files there are replaced, nothing else is touched."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("history.jsonl", "results.json", "report.html"):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "cluster", ignore_errors=True)
    for stale in out.glob(".analysis-*"):  # spill files of an analysis that was killed
        shutil.rmtree(stale, ignore_errors=True)
    return out


def nemesis_plan(opts: RunOptions) -> list[Step]:
    """The faults a run with `opts` schedules (their targets are chosen as they start),
    so a test can tell from the seed alone which fault comes first."""
    return plan(random.Random(random.Random(opts.seed).getrandbits(64)), opts.nemesis, opts.time)


MAX_HOSTS = 7
MAX_SHARDS = 4  # 28 node processes at most: every one is a real process on this machine
CHAOS_CQ_CHUNK = 64  # ConsumeQueue records per chunk file in the clusters a run starts
CHAOS_LISTEN_RETRY_S = 30.0  # seconds a restarted node waits for a port another process holds
# Delayed messages a group keeps in memory, and the horizon past which the others spill
# to run files: small, so the delay load's messages (due 0.5-20 s ahead) go through the
# runs, their snapshots and their reading back under faults too
CHAOS_TIMER_MEMORY_RECORDS = 32
CHAOS_TIMER_SPILL_HORIZON_S = 3.0


async def _run(opts: RunOptions, recorder: Recorder,
               security: dict[str, Any] | None = None) -> dict[str, Any]:
    """Steps 1-4 of the module docstring; returns facts the analysis needs. `security`:
    the node config keys of logins and ACLs (`harness_superuser`), or None."""
    if opts.cluster is not None:
        return await _run_remote(opts, recorder)
    rng = random.Random(opts.seed)
    nemesis_seed = rng.getrandbits(64)  # first, so the schedule depends on the seed alone
    node_ids = list(range(1, opts.nodes + 1))
    overrides: dict[str | int, Any] = {
        "segment_size": opts.segment_size,
        "snapshot_every_entries": opts.snapshot_every_entries,
        # small, so snapshots reference ConsumeQueue chunk files under faults too
        "consume_queue_chunk": CHAOS_CQ_CHUNK,
        "timer_memory_records": CHAOS_TIMER_MEMORY_RECORDS,
        "timer_spill_horizon_s": CHAOS_TIMER_SPILL_HORIZON_S,
        # a restarted node whose port a stranger on this host took meanwhile (a test
        # cluster's, say) waits for it rather than exiting as if it had crashed
        "listen_retry_s": CHAOS_LISTEN_RETRY_S,
    }
    env: dict[str, str] = {}
    if opts.workload in ("txn", "all"):
        overrides.update(TX_NODE_SETTINGS)
    if security is not None:
        overrides.update(security)
        env[USER_ENV] = ""  # the nodes themselves log in nowhere as the harness
    if opts.mutations:
        overrides["test_mutations"] = list(opts.mutations)
    # power losses (a kill-host loses what its shards had not fsynced too)
    power = {"crash-unsynced", "kill-host"} & set(opts.nemesis)
    if power:
        overrides["test_sync_marks"] = True
    if opts.mutations or power:
        env[ALLOW_MUTATIONS_ENV] = "1"
    facts: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        net = ProxyNet(node_ids)
        await nursery.start(net.serve)
        cluster = LocalCluster(
            opts.out / "cluster", nodes=opts.nodes, groups=opts.groups, tick_ms=opts.tick_ms,
            hosts=opts.hosts, shards=opts.shards,
            env=env, node_overrides=net.node_overrides(overrides),
        )
        facts["layout"] = {"hosts": cluster.hosts,
                           "groups": {g.id: list(g.replicas) for g in cluster.groups}}
        disks: dict[int, SmallDisk] = {}
        try:
            if "disk-full" in opts.nemesis:
                for cfg in cluster.configs:
                    disk = SmallDisk(cfg.data, opts.out / f"disk-n{cfg.node_id}.img",
                                     opts.disk_size)
                    await trio.to_thread.run_sync(disk.mount)
                    disks[cfg.node_id] = disk
            await trio.to_thread.run_sync(cluster.start)
            await trio.to_thread.run_sync(cluster.wait_ready, opts.ready_timeout)
            queues = opts.queues_per_group * opts.groups
            workload: Workload | None = None
            facts["queue_groups"] = {}
            if opts.workload in ("queue", "all"):
                workload = Workload(
                    cluster.namesrv_addr, TOPIC, queues, recorder=recorder, rng=rng,
                    producers=opts.producers, idempotent_producers=opts.idempotent_producers,
                    readers=opts.readers,
                )
                facts["queue_groups"] = await workload.setup()
            txload: TxWorkload | None = None
            if opts.workload in ("txn", "all"):
                txload = TxWorkload(cluster.namesrv_addr, TOPIC, opts.groups,
                                    recorder=recorder, rng=random.Random(rng.getrandbits(64)),
                                    log=opts.out / "cluster" / "pipeline.log")
                facts["tx_queue_groups"] = await txload.setup()
            delayload: DelayWorkload | None = None
            if opts.workload in ("delay", "all"):
                delayload = DelayWorkload(cluster.namesrv_addr, TOPIC, opts.groups,
                                          recorder=recorder,
                                          rng=random.Random(rng.getrandbits(64)))
                facts["delay_queue_groups"] = await delayload.setup()
            simpleload: SimpleWorkload | None = None
            if opts.workload in ("simple", "all"):
                simpleload = SimpleWorkload(cluster.namesrv_addr, TOPIC, opts.groups,
                                            recorder=recorder,
                                            rng=random.Random(rng.getrandbits(64)),
                                            log=opts.out / "cluster" / "simple-workers.log")
                facts["simple_queue_groups"] = await simpleload.setup()
            fifoload: SimpleWorkload | None = None
            if opts.workload in ("fifo", "all"):
                fifoload = SimpleWorkload(cluster.namesrv_addr, TOPIC, opts.groups,
                                          recorder=recorder,
                                          rng=random.Random(rng.getrandbits(64)),
                                          log=opts.out / "cluster" / "fifo-workers.log",
                                          fifo=True)
                facts["fifo_queue_groups"] = await fifoload.setup()
            orderedload: OrderedWorkload | None = None
            if opts.workload in ("ordered", "all"):
                orderedload = OrderedWorkload(
                    cluster.namesrv_addr, TOPIC, opts.groups, recorder=recorder,
                    rng=random.Random(rng.getrandbits(64)), mutations=opts.mutations,
                    log=opts.out / "cluster" / "ordered-consumers.log")
                facts["ordered_queue_groups"] = await orderedload.setup()
            secload: SecurityWorkload | None = None
            if opts.workload in SECURE_WORKLOADS:
                secload = SecurityWorkload(
                    {i: cluster.client_addr(i) for i in cluster.node_ids},
                    min(g.id for g in cluster.groups), recorder=recorder,
                    rng=random.Random(rng.getrandbits(64)))
                secload.attackers = Attackers(
                    {i: cluster.client_addr(i) for i in cluster.node_ids},
                    min(g.id for g in cluster.groups), cluster.namesrv_addr, opts.groups,
                    recorder=recorder, rng=random.Random(rng.getrandbits(64)),
                    credentials=secload.some_login,
                    rss_mib=(functools.partial(node_rss_mib, cluster)
                             if isinstance(cluster, LocalCluster) else None))
            nemesis = (
                Nemesis(cluster, net, recorder, rng=random.Random(nemesis_seed),
                        enabled=opts.nemesis, disks=disks, probe=workload)
                if opts.nemesis else None
            )
            # a node that died on its own is reported (unexpected_exits), not raised
            ready = functools.partial(cluster.wait_ready, opts.ready_timeout, raise_on_exit=False)
            loads = _Loads(workload, txload, secload, delayload, simpleload, fifoload,
                           orderedload)
            await _load_heal_drain(opts, loads, nemesis, ready, cluster.unexpected_exits, facts)
        finally:
            await trio.to_thread.run_sync(cluster.stop)
            for disk in disks.values():
                await trio.to_thread.run_sync(disk.unmount)
            nursery.cancel_scope.cancel()
    return facts


_Load = (Workload | TxWorkload | SecurityWorkload | DelayWorkload | SimpleWorkload
         | OrderedWorkload)


class _Loads:
    """The queue workload, the transactional one, the security one, the delayed-message
    one, the simple-consumer one, its FIFO twin, the ordered one, or several side by
    side."""

    def __init__(self, queue: Workload | None, tx: TxWorkload | None,
                 security: SecurityWorkload | None = None,
                 delay: DelayWorkload | None = None,
                 simple: SimpleWorkload | None = None,
                 fifo: SimpleWorkload | None = None,
                 ordered: OrderedWorkload | None = None) -> None:
        self.loads: list[_Load] = [w for w in (queue, tx, security, delay, simple, fifo,
                                               ordered)
                                   if w is not None]
        self.tx = tx
        self.security = security
        self.delay = delay
        self.simple = simple
        self.fifo = fifo
        self.ordered = ordered

    async def follow(self) -> None:
        """What watches the cluster from the load's start until the drain: the delayed
        messages' readers (so a message due during the heal is seen when it arrives) and
        the simple consumers in the harness (they consume through the heal)."""
        async with trio.open_nursery() as nursery:
            for load in (self.delay, self.simple, self.fifo):
                if load is not None:
                    nursery.start_soon(load.follow)

    async def run(self, stop_at: float) -> None:
        async with trio.open_nursery() as nursery:
            for load in self.loads:
                nursery.start_soon(load.run, stop_at)

    async def drain(self, timeout: float) -> bool:
        done: list[bool] = []

        async def one(load: _Load) -> None:
            done.append(await load.drain(timeout))

        async with trio.open_nursery() as nursery:
            for load in self.loads:
                nursery.start_soon(one, load)
        return all(done)


async def _load_heal_drain(
    opts: RunOptions,
    workload: Workload | _Loads,
    nemesis: Nemesis | None,
    ready: Callable[[], object],
    exits: Callable[[], dict[str, int]],
    facts: dict[str, Any],
) -> None:
    """Steps 3-4 on whatever cluster: load and faults for `opts.time`, heal, wait until
    `ready` (a cluster not ready by then is a finding, `not_ready`), drain; the timings,
    the drain's outcome and the nodes that exited on their own go into `facts`."""
    started = time.monotonic()
    stop_at = started + opts.time
    async with trio.open_nursery() as watching:
        if isinstance(workload, _Loads):
            watching.start_soon(workload.follow)
        async with trio.open_nursery() as load:
            load.start_soon(workload.run, stop_at)
            if nemesis is not None:
                load.start_soon(nemesis.run, stop_at)
        if nemesis is not None:
            await nemesis.heal()
            if nemesis.degraded:
                facts["harness_degraded"] = nemesis.degraded
        try:
            await trio.to_thread.run_sync(ready)
        except TimeoutError as exc:
            facts["not_ready"] = str(exc)
        healed = time.monotonic()
        facts["drained"] = await workload.drain(opts.drain_seconds)
        watching.cancel_scope.cancel()  # the drain stopped its own; anything else too
    facts["timings"] = {
        "load_seconds": round(healed - started, 3),
        "drain_seconds": round(time.monotonic() - healed, 3),
    }
    restarted = nemesis.exited if nemesis is not None else []
    facts["unexpected_exits"] = {**{e["node"]: e["code"] for e in restarted}, **exits()}
    if restarted:
        facts["restarted_after_exit"] = restarted
    if isinstance(workload, _Loads) and workload.tx is not None:
        facts["tx_load"] = {**workload.tx.stats, "pipeline_starts": workload.tx.pipeline_starts}
    if isinstance(workload, _Loads) and workload.security is not None:
        facts["security_converged"] = workload.security.converged
    if isinstance(workload, _Loads) and workload.delay is not None:
        facts["delay_load"] = dict(workload.delay.stats)
    if isinstance(workload, _Loads) and workload.simple is not None:
        facts["simple_load"] = {**workload.simple.stats,
                                "worker_starts": workload.simple.worker_starts}
    if isinstance(workload, _Loads) and workload.fifo is not None:
        facts["fifo_load"] = {**workload.fifo.stats,
                              "worker_starts": workload.fifo.worker_starts}
    if isinstance(workload, _Loads) and workload.ordered is not None:
        facts["ordered_load"] = {**workload.ordered.stats,
                                 "worker_starts": workload.ordered.worker_starts}


async def _run_remote(opts: RunOptions, recorder: Recorder) -> dict[str, Any]:
    """Steps 3-4 on a cluster the user runs (`RemoteCluster`): no proxies, nothing started
    or stopped but by a fault. The topic is new for each run (its name says when), since
    an earlier run's messages would be read as unexpected ones."""
    assert opts.cluster is not None
    rng = random.Random(opts.seed)
    cluster = RemoteCluster.from_file(opts.cluster)
    facts: dict[str, Any] = {"cluster": str(opts.cluster)}
    await trio.to_thread.run_sync(cluster.wait_ready, opts.ready_timeout)
    topic = f"{TOPIC}-{time.strftime('%Y%m%d%H%M%S')}-{opts.seed}"
    queues = opts.queues_per_group * max(1, len(cluster.groups))
    workload = Workload(
        cluster.namesrv_addr, topic, queues, recorder=recorder, rng=rng,
        producers=opts.producers, idempotent_producers=opts.idempotent_producers,
        readers=opts.readers,
    )
    facts["topic"] = topic
    facts["queue_groups"] = await workload.setup()
    nemesis = (
        # Nemesis asks only for the process faults RemoteCluster offers (REMOTE_NEMESES)
        Nemesis(cast(LocalCluster, cluster), None, recorder,
                rng=random.Random(rng.getrandbits(64)), enabled=opts.nemesis)
        if opts.nemesis else None
    )
    ready = functools.partial(cluster.wait_ready, opts.ready_timeout)
    await _load_heal_drain(opts, workload, nemesis, ready, cluster.unexpected_exits, facts)
    return facts


def run_chaos(opts: RunOptions) -> dict[str, Any]:
    """Run the test described by `opts`, write its outputs and return results.json's content."""
    opts.validate()
    if opts.check_timeout is None:
        opts = replace(opts, check_timeout=max(120.0, opts.time))
    assert opts.check_timeout is not None
    out = _prepare_out(opts.out)
    began = time.monotonic()
    with Recorder(out / "history.jsonl") as recorder:
        if opts.workload in SECURE_WORKLOADS:
            creds, security = harness_superuser()
            with harness_login(creds):
                facts = trio.run(_run, opts, recorder, security)
        else:
            facts = trio.run(_run, opts, recorder)
    analysis: Analysis = analyze_run(
        out / "history.jsonl", facts, check_timeout=opts.check_timeout
    )
    results = dict(analysis.results)
    results["options"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()}
    results["run"] = {**facts, "total_seconds": round(time.monotonic() - began, 3)}
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    analysis.write_report(out / "report.html", title=f"raftmq chaos run, seed {opts.seed}")
    return results


def parse_list(text: str, known: Sequence[str], what: str) -> tuple[str, ...]:
    """`a,b,c` (or `all`, or `none`) into a tuple of names from `known`."""
    if text == "all":
        return tuple(known)
    if text == "none":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"unknown {what} {bad or text!r} (known: {', '.join(known)}, or all)")
    return names
