"""CPU per message per hop at one message in flight (issue 32 part 3).

Starts its own cluster on loopback (three node processes, ONE group of three replicas,
`fsync=always`), creates a topic with one queue, so one leader and two followers carry
every message and each process has one role; warms up, then sends `--messages` messages
of `--size` bytes one at a time (`send_async`, then wait for its acknowledgement: the
round trip a publish-and-wait client sees). An acknowledgement means the entry is
fsynced on a majority.

It reads user + system CPU of every thread of every process from /proc before and after
the timed section and prints one JSON object: the round trip (`p50_ms`, `p99_ms`) and,
per hop, CPU microseconds per acknowledged message:

* `client`: this process (the SDK on anyio/asyncio; one thread on the hot path);
* `leader` / `followers` (one entry per follower): the process total, `main` (the
  event-loop thread, trio) and `other_threads` (the group's fsync thread, `SyncThread`,
  plus any of trio's worker threads: none of those runs on this path once warm), with
  voluntary context switches per message (`wakeups`: times a thread slept and was woken);
* `cluster_us_per_msg` (leader + followers) and `end_to_end_us_per_msg` (+ client).

CPU time, unlike wall time, barely moves with the load of a shared machine; compare two
builds by interleaving their runs. `loadavg_1m` says how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from .common import READY_TIMEOUT, freeze_gc, machine, percentile, progress_delta, raft_progress

__all__ = ["main", "measure"]

_TICK = os.sysconf("SC_CLK_TCK")
TOPIC = "cpu-per-entry"


def _threads(pid: int) -> dict[int, tuple[float, int]]:
    """tid -> (user + system CPU seconds, voluntary context switches) of a process."""
    out: dict[int, tuple[float, int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        vol = next((int(line.split()[1]) for line in status.splitlines()
                    if line.startswith("voluntary_ctxt_switches")), 0)
        out[int(tid)] = ((int(fields[11]) + int(fields[12])) / _TICK, vol)
    return out


def _hop(pid: int, before: dict[int, tuple[float, int]],
         after: dict[int, tuple[float, int]], n: int) -> dict[str, Any]:
    def per_msg(tids: list[int]) -> dict[str, float]:
        cpu = sum(after[t][0] - before.get(t, (0.0, 0))[0] for t in tids)
        vol = sum(after[t][1] - before.get(t, (0.0, 0))[1] for t in tids)
        return {"us_per_msg": round(cpu / n * 1e6, 1), "wakeups_per_msg": round(vol / n, 2)}

    others = [t for t in after if t != pid]
    main_thread = per_msg([pid] if pid in after else [])
    rest = per_msg(others)
    return {"us_per_msg": round(main_thread["us_per_msg"] + rest["us_per_msg"], 1),
            "main": main_thread, "other_threads": rest}


async def _run(namesrv: str, pids: dict[str, int], leader: int | None,
               args: argparse.Namespace) -> dict[str, Any]:
    from raftmq.client import Admin, Producer

    async with Admin(namesrv) as admin:
        await admin.create_topic(TOPIC, 1, exist_ok=True)
    payload = b"x" * args.size
    options: dict[str, Any] = {"linger_ms": 0.0, "max_pending": 1}
    lat: list[float] = []
    async with Producer(namesrv, **options) as producer:
        for _ in range(args.warmup):
            await producer.send(TOPIC, payload)
        freeze_gc()
        async with Admin(namesrv) as admin:
            p0 = await raft_progress(admin)
        me = os.getpid()
        watched = {**pids, "client": me}
        load0 = os.getloadavg()
        s0 = {name: _threads(pid) for name, pid in watched.items()}
        t_start = time.perf_counter()
        for _ in range(args.messages):
            t0 = time.perf_counter()
            await (await producer.send_async(TOPIC, payload)).wait()
            lat.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - t_start
        s1 = {name: _threads(pid) for name, pid in watched.items()}
        load1 = os.getloadavg()
        async with Admin(namesrv) as admin:
            p1 = await raft_progress(admin)
    n = args.messages
    lat.sort()
    hops = {name: _hop(pid, s0[name], s1[name], n) for name, pid in watched.items()}
    lead_name = f"n{leader}"
    leader_hop = hops.get(lead_name)
    nodes = [k for k in hops if k[:1] == "n" and k[1:].isdigit()]
    followers = {k: hops[k] for k in nodes if k != lead_name}
    cluster = round(sum(hops[k]["us_per_msg"] for k in nodes), 1)
    return {
        "benchmark": "cpu_per_entry",
        "messages": n, "size_bytes": args.size, "fsync": "always", "in_flight": 1,
        "seconds": round(elapsed, 3), "msgs_per_s": round(n / elapsed, 1),
        "p50_ms": round(percentile(lat, 50) * 1e3, 3),
        "p99_ms": round(percentile(lat, 99) * 1e3, 3),
        "loadavg_1m": [round(load0[0], 2), round(load1[0], 2)],
        **progress_delta(p0, p1),
        "client": hops["client"],
        "leader": leader_hop,
        "followers": followers,
        "others": {k: v for k, v in hops.items()
                   if k != "client" and k not in nodes},  # the name server
        "cluster_us_per_msg": cluster,
        "end_to_end_us_per_msg": round(cluster + hops["client"]["us_per_msg"], 1),
        "machine": machine(),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start the cluster, run, stop it; the result."""
    from raftmq.localcluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="cpu-per-entry-") as tmp:
        with LocalCluster(Path(tmp), nodes=3, groups=1, fsync="always") as cluster:
            cluster.wait_ready(timeout=READY_TIMEOUT)
            cluster.wait_preferred_leaders(READY_TIMEOUT)
            leader = next(iter(cluster.leaders().values()))
            pids = cluster.pids()
            result: dict[str, Any] = anyio.run(_run, cluster.namesrv_addr, pids, leader, args)
            if list(cluster.leaders().values()) != [leader] or result["elections"]:
                result["leader_changed"] = True  # roles mixed: discard this run
            return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_per_entry", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=3000, help="timed messages (3000)")
    p.add_argument("--warmup", type=int, default=300, help="untimed messages first (300)")
    p.add_argument("--size", type=int, default=100, help="payload bytes (100)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    print(json.dumps(measure(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
