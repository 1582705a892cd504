"""The audit job at scale: `raftmq audit` over a history of `--events` lines, on Spark.

Sends `--events / 2` messages to a topic of `--queues` queues (one sending process per
queue, batches of `--batch`), each message's body being its id as the chaos workload
names them (``p<process>-<n>``), and writes the history a chaos run would have recorded
for them: an ``invoke`` and an ``ok`` line (with the acknowledged offset) per message, so
`--events` lines in all. Then times the audit (`raftmq.spark.audit.audit`) of that history
against the cluster on a local SparkSession (`--master`, `local[2]` by default): both
inputs are read by Spark, the history with its JSON reader and the cluster through the
`raftmq` source. The session starts before the clock does.

The run fails (exit 1) unless the audit accounts for every message: acknowledged and read
equal to the messages sent, nothing lost, duplicated, unexpected or reordered.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import anyio

from .common import Target, add_cluster_args, emit, positive_int, run_id, run_on_target

__all__ = ["build_parser", "main"]

AUDIT_TARGET_EVENTS = 10_000_000  # the history size


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench audit", description=__doc__.split("\n\n")[0])
    add_cluster_args(p)
    p.add_argument("--events", type=positive_int, default=AUDIT_TARGET_EVENTS,
                   help="history lines (two per message: invoke and ok)")
    p.add_argument("--queues", type=positive_int, default=8)
    p.add_argument("--batch", type=positive_int, default=512, help="messages per send")
    p.add_argument("--master", default="local[2]", help="Spark master")
    return p


async def fill_with_history(namesrv: str, topic: str, queues: int, messages: int, batch: int,
                            out: IO[str]) -> float:
    """Send `messages` over the queues of a new `topic`, writing each one's invoke and ok
    lines to `out` as the chaos recorder does; seconds it took."""
    from raftmq.client import Admin, Producer

    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, queues)
    clock = time.monotonic
    t0 = time.perf_counter()
    async with Producer(namesrv) as producer:
        async def process(q: int) -> None:
            n = messages // queues + (1 if q < messages % queues else 0)
            key = f"{topic}/{q}"
            for start in range(0, n, batch):
                ids = [f"p{q}-{i}" for i in range(start, min(start + batch, n))]
                call = clock()
                results = await producer.send_batch(topic, ids, queue=q)
                ret = clock()
                out.write("".join(
                    f'{{"process":{q},"type":"invoke","f":"append","key":"{key}",'
                    f'"value":"{m}","time":{call}}}\n'
                    f'{{"process":{q},"type":"ok","f":"append","key":"{key}",'
                    f'"value":{{"offset":{r.offset}}},"time":{ret}}}\n'
                    for m, r in zip(ids, results, strict=True)))

        async with anyio.create_task_group() as tg:
            for q in range(queues):
                tg.start_soon(process, q)
    return time.perf_counter() - t0


def timed_audit(master: str, history: str, namesrv: str, topic: str) -> dict[str, Any]:
    from raftmq.spark.audit import audit, session

    spark = session(master, app="raftmq-bench-audit")
    spark.conf.set("spark.sql.shuffle.partitions", "8")
    t0 = time.perf_counter()
    result = audit(spark, history, namesrv, topics=[topic])
    return {"audit_s": round(time.perf_counter() - t0, 3), "valid": result["valid"],
            "totals": result["totals"], "latency_ms": result["latency_ms"]}


def _table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"raftmq bench audit: {result['events']:,} history lines, "
                        f"{result['master']}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("messages", "fill_s", "audit_s", "events_per_s", "valid"):
        table.add_row(key, f"{result[key]:,}" if not isinstance(result[key], bool)
                      else str(result[key]))
    return table


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    messages = max(1, args.events // 2)
    topic = f"audit-bench-{run_id()}"

    async def drive(target: Target, a: argparse.Namespace) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="raftmq-audit-bench-") as tmp:
            history = Path(tmp) / "history.jsonl"
            with history.open("w") as out:
                fill_s = await fill_with_history(target.namesrv, topic, a.queues, messages,
                                                 a.batch, out)
            figures = await anyio.to_thread.run_sync(
                timed_audit, a.master, str(history), target.namesrv, topic)
            size = history.stat().st_size
        return {"benchmark": "audit", "events": 2 * messages, "messages": messages,
                "history_bytes": size, "queues": a.queues, "master": a.master,
                "fill_s": round(fill_s, 3), **figures,
                "events_per_s": round(2 * messages / figures["audit_s"])}

    result = run_on_target(args, drive)
    emit(result, args.json, _table)
    t = result["totals"]
    whole = t["acknowledged"] == t["read"] == messages and result["valid"]
    return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main())
