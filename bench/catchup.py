"""A leader's memory and answers while a new replica catches up, under reads.

Starts a local cluster of one group (three replicas), fills its log with `--messages`
messages of `--size` bytes sent `--in-flight` at a time (few per entry: a log of many
entries, as a long run leaves), then takes a follower's replica out of the group (the
node deletes it) and adds a fresh one back (`Admin.remove_replica`, `add_replica`): the
new replica is empty and the leader sends it the whole log as a learner. Meanwhile
`--readers` tasks fetch from the leader without pause (each FETCH is a ReadIndex round:
one heartbeat to every follower), and a probe asks the leader for STATUS every 0.2 s.

Reported: the log (entries and bytes), how long `add_replica` took (catch-up and
promotion), the leader's resident memory before and at its peak (read from /proc every
0.1 s), the slowest STATUS answer, and the reads done. A leader must take a replica in
without its memory growing with the log or its answers stalling.

Needs a cluster it starts itself (it changes the group's membership).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import anyio

from raftmq import Admin, OutgoingMessage, Producer
from transport.connection import ConnectionPool
from wire.protocol import Op, RequestError

from .common import READY_TIMEOUT, emit, latency_ms, progress, target_cluster

__all__ = ["build_parser", "main", "run_catchup"]

GROUP = "g0"


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _fill(namesrv: str, args: argparse.Namespace) -> None:
    """`--messages` sends, `--in-flight` senders each waiting for its acknowledgement."""
    body = b"x" * args.size
    async with Producer(namesrv, retries=20) as producer:
        async def sender(k: int) -> None:
            for i in range(k, args.messages, args.in_flight):
                await producer.send_batch(args.topic, [OutgoingMessage(body)],
                                          queue=i % args.queues)

        async with anyio.create_task_group() as tg:
            for k in range(args.in_flight):
                tg.start_soon(sender, k)


async def _catch_up(cluster: Any, args: argparse.Namespace) -> dict[str, Any]:
    namesrv = cluster.namesrv_addr
    async with Admin(namesrv) as admin:
        await admin.create_topic(args.topic, args.queues, [GROUP])
    progress("catchup", f"filling the log with {args.messages} messages")
    await _fill(namesrv, args)
    async with Admin(namesrv) as admin:
        before = await admin.group_members(GROUP)
        leader = before.leader
        follower = next(n for n in before.voters if n != leader)
        pid = cluster.pid(leader)
        addr = cluster.node_addr(leader)
        await admin.remove_replica(GROUP, follower)
        rss_before = _rss_mib(pid)
        peak = rss_before
        status_s: list[float] = []
        reads = 0
        read_errors = 0
        done = anyio.Event()

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _rss_mib(pid))
                await anyio.sleep(0.1)

        async def probe(pool: ConnectionPool) -> None:
            while not done.is_set():
                t0 = time.perf_counter()
                try:
                    await pool.request(addr, Op.STATUS, {}, timeout=60)
                except RequestError:
                    pass
                status_s.append(time.perf_counter() - t0)
                await anyio.sleep(0.2)

        async def reader(pool: ConnectionPool, q: int) -> None:
            nonlocal reads, read_errors
            while not done.is_set():
                try:
                    await pool.request(addr, Op.FETCH, {
                        "topic": args.topic, "queue": q % args.queues, "offset": 0,
                        "max": 1, "wait_ms": 0}, timeout=60)
                    reads += 1
                except RequestError:
                    read_errors += 1
                    await anyio.sleep(0.05)

        progress("catchup", f"node {follower} re-added to {GROUP}: catching up from "
                            f"node {leader}")
        async with ConnectionPool() as pool, anyio.create_task_group() as tg:
            tg.start_soon(sample)
            tg.start_soon(probe, pool)
            for q in range(args.readers):
                tg.start_soon(reader, pool, q)
            t0 = time.perf_counter()
            after = await admin.add_replica(GROUP, follower, catch_up_timeout=args.timeout)
            catch_up_s = time.perf_counter() - t0
            done.set()
        log_bytes = sum(p.stat().st_size for p in
                        (cluster.configs[leader - 1].data / GROUP / "commitlog").glob("0*"))
    return {
        "benchmark": "catchup",
        "log_entries": before.last,
        "log_bytes": log_bytes,
        "messages": args.messages,
        "size": args.size,
        "readers": args.readers,
        "leader": leader,
        "replica": follower,
        "voters_after": list(after.voters),
        "catch_up_s": round(catch_up_s, 2),
        "leader_rss_mib": {"before": round(rss_before, 1), "peak": round(peak, 1)},
        "status_ms": latency_ms(status_s, ("p50", "p99", "max")),
        "reads": reads,
        "read_errors": read_errors,
    }


def run_catchup(args: argparse.Namespace) -> dict[str, Any]:
    if args.namesrv:
        raise ValueError("the catch-up benchmark changes a group's membership, so it needs "
                         "a cluster it starts itself: drop --namesrv")
    with target_cluster(args) as target:
        assert target.local is not None
        target.local.wait_ready(READY_TIMEOUT)
        result = anyio.run(_catch_up, target.local, args)
        result.update(target.info, machine=target.machine)
        return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench catchup",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--size", type=int, default=500, help="message body bytes")
    p.add_argument("--in-flight", type=int, default=4,
                   help="messages sent at once while filling (few per entry)")
    p.add_argument("--topic", default="catchup")
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--readers", type=int, default=8, help="tasks fetching from the leader")
    p.add_argument("--timeout", type=float, default=600.0, help="catch-up time limit (s)")
    p.add_argument("--namesrv", help=argparse.SUPPRESS)
    p.add_argument("--groups", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--fsync", choices=["always", "interval"], default="interval")
    p.add_argument("--data-dir", help="parent of the local cluster's temporary directory")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _table(r: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"catch-up of a new replica: {r['log_entries']} entries, "
                    f"{r['log_bytes'] / 2**20:.0f} MiB, {r['readers']} readers")
    for col in ("catch-up s", "leader RSS before MiB", "peak MiB", "STATUS max ms", "reads"):
        t.add_column(col, justify="right")
    t.add_row(str(r["catch_up_s"]), str(r["leader_rss_mib"]["before"]),
              str(r["leader_rss_mib"]["peak"]), str(r["status_ms"]["max"]), str(r["reads"]))
    return t


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_catchup(args)
    emit(result, args.json, _table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
