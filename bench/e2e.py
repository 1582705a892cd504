"""End-to-end latency at a fixed produce rate: send -> acknowledgement and send -> receipt.

A producer sends at `--rate` messages per second (open loop: the schedule does not wait
for acknowledgements) while a consumer in the same process receives, so one clock serves
both ends: each body starts with its send time (`time.perf_counter()`) and sequence
number. Without `--rate`, a quick maximum-throughput run (`bench.produce` with its
defaults on a separate topic) comes first and the rate is `--fraction` (half) of it: the
issue's target is a p99 acknowledgement latency of at most 10 ms at half of the maximum
throughput, so both latencies are reported. The first `--warmup` seconds are sent but not
counted. The consumer is a `PushConsumer` (`--consumer push`, what applications use), a
`PullConsumer` long-polling every queue (`--consumer pull`), or none (`--consumer none`):
then only acknowledgements are measured, and the producer has the process to itself, as
it would in an application whose consumers run elsewhere.

`--api` says how messages are handed to the producer: `single` (default) calls
`send_async` once per message at its scheduled time; `batch` schedules whole batches of
`--batch` messages at `rate / --batch` per second and hands each to `send_batch` (one
PRODUCE request to one queue, the queues taken round robin), every message of a batch
stamped with the batch's send time; batches never merge, so only `--max-pending`
(messages) bounds the calls in flight, not `--batches-in-flight`. The maximum-throughput
run uses the same api and batch size, so the rate is a share of the same kind of maximum.

Latencies start when `send_async` (or `send_batch`) is called; every message of a batch
gets the batch's acknowledgement latency. How far the sender ran behind its schedule
(`schedule_lag_ms`, per call) is reported beside them, so a saturated sender is visible
instead of hiding in the figures.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from itertools import repeat
from typing import Any

import anyio
import anyio.abc

from .common import (
    Pacer,
    add_api_arg,
    add_batching_args,
    add_cluster_args,
    batch_producer_options,
    emit,
    freeze_gc,
    latency_ms,
    progress_delta,
    raft_progress,
    run_id,
    run_on_target,
    single_producer_options,
)

__all__ = ["build_parser", "main", "run_e2e"]

STAMP = struct.Struct(">dQ")  # send time (perf_counter seconds), sequence number
ACK_P99_TARGET_MS = 10.0
POINTS = ("p50", "p99", "p999", "max")


class _Run:
    """What one run saw; sequence numbers below `first` belong to the warm-up, those from
    `end` on to the message that taught the producer its routes."""

    def __init__(self, first: int, end: int) -> None:
        self.first = first
        self.end = end
        self.ack: list[float] = []
        self.e2e: list[float] = []
        self.lag: list[float] = []
        self.acked: set[int] = set()
        self.received: set[int] = set()
        self.duplicates = 0
        self.errors: list[str] = []

    def batch_done(self, first: int, messages: int, t0: float,
                   exc: BaseException | None = None) -> None:
        """The outcome of one `send_batch` call of `messages` from sequence `first` on,
        made at `t0`: each of its messages gets the call's latency or failure."""
        if exc is not None:
            self.errors += repeat(repr(exc), messages)
            return
        elapsed = time.perf_counter() - t0
        self.acked.update(range(first, first + messages))
        if first >= self.first:
            self.ack += repeat(elapsed, messages)

    def on_messages(self, bodies: list[bytes]) -> None:
        now = time.perf_counter()
        for body in bodies:
            sent, seq = STAMP.unpack_from(body)
            if seq >= self.end:
                continue  # the route-learning message
            if seq in self.received:
                self.duplicates += 1
                continue
            self.received.add(seq)
            if seq >= self.first:
                self.e2e.append(now - sent)


async def _max_rate(namesrv: str, args: argparse.Namespace) -> dict[str, Any]:
    """The quick maximum-throughput measurement the default rate is derived from."""
    from . import produce

    argv = ["--messages", str(args.probe_messages), "--size", str(args.size),
            "--queues", str(args.queues)]
    if args.api == "batch":  # the same kind of maximum as the run at a share of it
        argv += ["--api", "batch", "--batch", str(args.batch)]
    pargs = produce.build_parser().parse_args(argv)
    return await produce.drive(namesrv, f"{args.topic}-max-{run_id()}", pargs)


async def _pull_readers(namesrv: str, group: str, topic: str, queues: int, run: _Run,
                        args: argparse.Namespace, ready: anyio.Event) -> None:
    """One long-polling reader per queue until cancelled."""
    from raftmq.client import PullConsumer, RequestError

    async with PullConsumer(namesrv, group, start_from="first") as consumer:

        async def read(q: int) -> None:
            while True:
                try:
                    res = await consumer.pull(topic, q, max=args.pull_batch,
                                              wait_ms=args.long_poll_ms)
                except RequestError as exc:
                    if not exc.retriable:
                        raise
                    await anyio.sleep(0.05)
                    continue
                run.on_messages([m.body for m in res.messages])

        async with anyio.create_task_group() as tg:
            for q in range(queues):
                tg.start_soon(read, q)
            ready.set()


async def _drive(namesrv: str, args: argparse.Namespace) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        return await _measure(stack, namesrv, args)


async def _measure(stack: AsyncExitStack, namesrv: str, args: argparse.Namespace
                   ) -> dict[str, Any]:
    from raftmq.client import Admin, Message, Producer, PushConsumer, SendFuture, SendResult

    probe = None
    rate = args.rate
    if not rate:
        probe = await _max_rate(namesrv, args)
        rate = round(probe["msgs_per_s"] * args.fraction, 1)
    topic = f"{args.topic}-{run_id()}"
    admin = await stack.enter_async_context(Admin(namesrv))
    await admin.create_topic(topic, args.queues)

    batched = args.api == "batch"
    per_call = args.batch if batched else 1  # messages per send call
    warm_n = int(rate * args.warmup / per_call) * per_call
    total = warm_n + max(1, int(rate * args.duration / per_call)) * per_call
    run = _Run(warm_n, total)
    pad = b"\0" * max(0, args.size - STAMP.size)
    group = f"e2e-{run_id()}"

    async def handle(msgs: list[Message]) -> None:
        run.on_messages([m.body for m in msgs])

    async with anyio.create_task_group() as tg:
        if args.consumer == "none":
            pass
        elif args.consumer == "push":
            push = PushConsumer(namesrv, group, [topic], handle, pull_batch=args.pull_batch,
                                consume_batch=args.pull_batch, long_poll_ms=args.long_poll_ms)
            await tg.start(_hold, push)
            with anyio.fail_after(30):
                while len(push.assignment()) < args.queues:
                    await anyio.sleep(0.05)
        else:
            ready = anyio.Event()
            tg.start_soon(_pull_readers, namesrv, group, topic, args.queues, run, args, ready)
            await ready.wait()

        if batched:  # open loop: only --max-pending (messages) bounds the calls in flight
            options = batch_producer_options(args.batch, max(1, args.max_pending // args.batch))
        else:
            options = single_producer_options(args, args.max_pending)
        async with Producer(namesrv, **options) as producer:
            await producer.send(topic, STAMP.pack(time.perf_counter(), total) + pad)  # routes
            freeze_gc()

            def on_ack(seq: int, t0: float) -> Callable[[SendFuture[SendResult]], None]:
                def done(fut: SendFuture[SendResult]) -> None:
                    if fut.exception() is not None:
                        run.errors.append(repr(fut.exception()))
                        return
                    run.acked.add(seq)
                    if seq >= warm_n:
                        run.ack.append(time.perf_counter() - t0)
                return done

            async def send_batch(first: int, t0: float, queue: int) -> None:
                bodies = [STAMP.pack(t0, s) + pad for s in range(first, first + per_call)]
                try:
                    await producer.send_batch(topic, bodies, queue=queue)
                except Exception as exc:  # counted, reported; the schedule goes on
                    run.batch_done(first, per_call, t0, exc)
                else:
                    run.batch_done(first, per_call, t0)

            before = await raft_progress(admin)
            pacer = Pacer(rate / per_call)  # one release per send call
            seq = call = 0
            t_first = t_last = 0.0
            async with anyio.create_task_group() as calls:  # open loop: batches in flight
                while seq < total:
                    n = min(await pacer.due(), (total - seq) // per_call)
                    for _ in range(n):
                        t0 = time.perf_counter()
                        if seq == warm_n:
                            t_first = t0
                        if seq >= warm_n:
                            run.lag.append(max(0.0, t0 - pacer.scheduled(call)))
                        if batched:
                            calls.start_soon(send_batch, seq, t0, call % args.queues)
                        else:
                            await producer.send_async(topic, STAMP.pack(t0, seq) + pad,
                                                      callback=on_ack(seq, t0))
                        seq += per_call
                        call += 1
                    if batched:
                        await anyio.sleep(0)  # let the calls start even when behind schedule
                t_last = time.perf_counter()
            await producer.flush()
            cost = progress_delta(before, await raft_progress(admin))

        with anyio.move_on_after(args.drain_timeout if args.consumer != "none" else 0):
            while not run.acked <= run.received:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()

    measured = total - warm_n
    achieved = measured / (t_last - t_first) if t_last > t_first else 0.0
    ack = latency_ms(run.ack, POINTS)
    return {
        "benchmark": "e2e",
        "rate_msgs_per_s": rate,
        "rate_source": "given" if args.rate else f"{args.fraction:g} x measured max",
        "max_msgs_per_s": probe["msgs_per_s"] if probe else None,
        "achieved_msgs_per_s": round(achieved, 1),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "size_bytes": args.size,
        "queues": args.queues,
        "consumer": args.consumer,
        "api": args.api,
        "batch_messages": args.batch if batched else None,
        "sent": total,
        "acked": len(run.acked),
        "errors": len(run.errors),
        "first_error": run.errors[0] if run.errors else None,
        "received": len(run.received) if args.consumer != "none" else None,
        "missing": len(run.acked - run.received) if args.consumer != "none" else None,
        "duplicates": run.duplicates,
        "e2e_latency_ms": latency_ms(run.e2e, POINTS) if args.consumer != "none" else None,
        "ack_latency_ms": ack,
        "schedule_lag_ms": latency_ms(run.lag, ("p50", "p99", "max")),
        "target": {"ack_p99_ms": ACK_P99_TARGET_MS, "met": 0 < ack["p99"] <= ACK_P99_TARGET_MS},
        "linger_ms": options["linger_ms"],
        "batch_max_messages": options["batch_max_messages"],
        "batches_in_flight": options["max_in_flight"],
        # what the cluster spent on the whole run (warm-up included): per-entry work
        # and fsyncs are what each acknowledgement waits for
        "raft_entries": cost["entries"],
        "msgs_per_entry": round(total / cost["entries"], 1) if cost["entries"] else None,
        "elections": cost["elections"],
        "fsyncs": cost["fsyncs"],
    }


async def _hold(push: Any, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    """Keep the push consumer open until the task group is cancelled."""
    async with push:
        task_status.started()
        await anyio.sleep_forever()


def run_e2e(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark against `--namesrv` or a local cluster started (and stopped) here."""
    return run_on_target(args, lambda target, a: _drive(target.namesrv, a))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=0.0,
                   help="messages per second (default: --fraction of a quick max measurement)")
    p.add_argument("--fraction", type=float, default=0.5,
                   help="share of the measured maximum to send at when --rate is not given")
    p.add_argument("--probe-messages", type=int, default=200_000,
                   help="messages of the quick maximum measurement")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds sent before measuring")
    p.add_argument("--size", type=int, default=100, help="message body bytes (at least 16)")
    p.add_argument("--topic", default="e2e")
    p.add_argument("--queues", type=int, default=12)
    p.add_argument("--consumer", choices=["push", "pull", "none"], default="push",
                   help="none: measure acknowledgements only")
    p.add_argument("--pull-batch", type=int, default=32, help="messages per FETCH")
    p.add_argument("--long-poll-ms", type=int, default=15_000)
    add_api_arg(p)
    add_batching_args(p)
    p.add_argument("--max-pending", type=int, default=100_000,
                   help="unacknowledged messages before a send call waits")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds to wait for the consumer to receive every acknowledged message")
    add_cluster_args(p)
    return p


def _table(r: dict[str, Any]) -> Any:
    from rich.table import Table

    how = ("send_async" if r["api"] == "single"
           else f"send_batch of {r['batch_messages']}")
    t = Table(title=f"e2e: {r['rate_msgs_per_s']:,.0f} msgs/s ({r['rate_source']}), "
                    f"{r['size_bytes']} B, {how}, {r['consumer']} consumer")
    for col in ("latency", "p50 ms", "p99 ms", "p999 ms", "max ms"):
        t.add_column(col, justify="right")
    rows = [("send -> ack", "ack_latency_ms")]
    if r["received"] is not None:
        rows.append(("send -> receive", "e2e_latency_ms"))
    for name, key in rows:
        lat = r[key]
        t.add_row(name, str(lat["p50"]), str(lat["p99"]), str(lat["p999"]), str(lat["max"]))
    received = ("" if r["received"] is None
                else f"received {r['received']:,}, missing {r['missing']}, ")
    t.caption = (f"achieved {r['achieved_msgs_per_s']:,.0f} msgs/s; acked {r['acked']:,}, "
                 f"{received}errors {r['errors']}; "
                 f"p99 ack <= {ACK_P99_TARGET_MS:g} ms: {'met' if r['target']['met'] else 'not met'}")
    return t


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.size < STAMP.size:
        build_parser().error(f"--size must be at least {STAMP.size} (the send stamp)")
    result = run_e2e(args)
    emit(result, args.json, _table)
    return 0 if result["errors"] == 0 and not result["missing"] else 1


if __name__ == "__main__":
    sys.exit(main())
