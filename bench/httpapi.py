"""HTTP API produce against the binary protocol, in the same run on the same cluster.

A cluster (a local one by default, started and stopped here; `--namesrv` for a running
one) and a `raftmq console` process serving its HTTP API (`--url` for a running one).
Four cases, each `--messages` messages of `--size` bytes with `--concurrency` requests
in flight, in this order:

- `binary_single`: `Producer.send` awaited per message (the SDK may put concurrent sends
  in one PRODUCE request, as it does for any application);
- `http_single`: `POST /api/v1/topics/{topic}/messages`, one message per request;
- `binary_batch`: `Producer.send_batch` of `--batch` messages to one queue per call;
- `http_batch`: `POST /api/v1/topics/{topic}/messages/batch` of `--batch` messages to
  one queue per request.

Every answer means committed on a majority, over either protocol. Each message gets the
latency of its request (or call). The result has each case's msgs/s and latency, and
`http_vs_binary`: the HTTP rate over the binary rate, and the HTTP p99 over the binary
p99, one message per request and batched. With authentication on the cluster the HTTP
requests log in as RAFTMQ_USER/RAFTMQ_PASSWORD (HTTP Basic), as the SDK does.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from .common import (
    Target,
    add_cluster_args,
    emit,
    freeze_gc,
    latency_ms,
    positive_int,
    progress,
    run_on_target,
)
from .frontend import gateway

__all__ = ["build_parser", "main", "run_http"]

QUEUES = 4
POINTS = ("p50", "p99", "max")


class Load:
    """The outcome of one case: every message's latency (its request's), and failures."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error: str | None = None

    def ok(self, seconds: float, messages: int) -> None:
        self.latencies.extend([seconds] * messages)

    def failed(self, what: str, messages: int) -> None:
        self.errors += messages
        if self.first_error is None:
            self.first_error = what

    def summary(self, seconds: float, per_request: int) -> dict[str, Any]:
        done = len(self.latencies)
        return {"messages": done, "messages_per_request": per_request,
                "errors": self.errors, "first_error": self.first_error,
                "seconds": round(seconds, 3), "msgs_per_s": round(done / seconds, 1),
                "latency_ms": latency_ms(self.latencies, POINTS)}


async def timed_requests(requests: int, concurrency: int, per_request: int,
                         one: Callable[[int], Awaitable[str | None]]) -> dict[str, Any]:
    """Make `requests` calls of `one(i)` (None: done; a string: what failed) with
    `concurrency` in flight; the summary of the `per_request` messages each one carries."""
    load = Load()

    async def worker(first: int) -> None:
        for i in range(first, requests, concurrency):
            t0 = time.perf_counter()
            try:
                failure = await one(i)
            except Exception as exc:  # counted, reported; the run goes on
                failure = repr(exc)
            if failure is None:
                load.ok(time.perf_counter() - t0, per_request)
            else:
                load.failed(failure, per_request)

    t_start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(min(concurrency, requests)):
            tg.start_soon(worker, w)
    return load.summary(time.perf_counter() - t_start, per_request)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def compare(http: dict[str, Any], binary: dict[str, Any]) -> dict[str, Any]:
    """HTTP over binary: throughput and p99 ratios."""
    return {"msgs_per_s": _ratio(http["msgs_per_s"], binary["msgs_per_s"]),
            "p99_ms": _ratio(http["latency_ms"]["p99"], binary["latency_ms"]["p99"])}


def _basic_auth() -> tuple[str, str] | None:
    from transport.scram import PASSWORD_ENV, USER_ENV

    user = os.environ.get(USER_ENV)
    return (user, os.environ.get(PASSWORD_ENV, "")) if user else None


async def _drive(namesrv: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from raftmq.client import Admin, Producer

    topic = args.topic
    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, QUEUES, exist_ok=True)
    payload = b"x" * args.size
    body64 = base64.b64encode(payload).decode()
    singles = args.messages
    batches = max(1, -(-args.messages // args.batch))
    one_message = {"body": body64}
    cases: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=args.concurrency,
                          max_keepalive_connections=args.concurrency)
    async with Producer(namesrv) as producer, \
            httpx.AsyncClient(base_url=url + "/api/v1", limits=limits, timeout=60,
                              auth=_basic_auth()) as client:

        async def binary_single(i: int) -> str | None:
            await producer.send(topic, payload)
            return None

        async def binary_batch(i: int) -> str | None:
            await producer.send_batch(topic, [payload] * args.batch, queue=i % QUEUES)
            return None

        async def http_single(i: int) -> str | None:
            r = await client.post(f"/topics/{topic}/messages", json=one_message)
            return None if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"

        async def http_batch(i: int) -> str | None:
            r = await client.post(f"/topics/{topic}/messages/batch", json={
                "messages": [one_message] * args.batch, "queue": i % QUEUES})
            return None if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"

        # warm-up: routes learned, connections open, on both paths
        for i in range(args.concurrency):
            await binary_single(i)
            await http_single(i)
        freeze_gc()
        plan = (("binary_single", binary_single, singles, 1),
                ("http_single", http_single, singles, 1),
                ("binary_batch", binary_batch, batches, args.batch),
                ("http_batch", http_batch, batches, args.batch))
        for name, one, requests, per_request in plan:
            progress("http", f"{name}: {requests} requests of {per_request}")
            cases[name] = await timed_requests(requests, args.concurrency, per_request, one)
    return {
        "benchmark": "http",
        "size_bytes": args.size,
        "concurrency": args.concurrency,
        "batch_messages": args.batch,
        "queues": QUEUES,
        **cases,
        "http_vs_binary": {
            "single": compare(cases["http_single"], cases["binary_single"]),
            "batch": compare(cases["http_batch"], cases["binary_batch"]),
        },
        "errors": sum(c["errors"] for c in cases.values()),
    }


def run_http(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark against `--namesrv` or a local cluster started (and stopped) here."""

    async def drive(target: Target, args: argparse.Namespace) -> dict[str, Any]:
        with gateway("console", args.url and args.url.rstrip("/"), target.namesrv) as url:
            result = await _drive(target.namesrv, url, args)
            result["api_url"] = url if args.url else "local raftmq console"
            return result

    return run_on_target(args, drive)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench http",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=positive_int, default=5000,
                   help="messages per case (batched cases: rounded up to whole batches)")
    p.add_argument("--size", type=positive_int, default=100, help="message bytes (100)")
    p.add_argument("--concurrency", type=positive_int, default=32,
                   help="requests (SDK calls) in flight (default 32)")
    p.add_argument("--batch", type=positive_int, default=64,
                   help="messages per batched request (default 64)")
    p.add_argument("--topic", default="bench-http")
    p.add_argument("--url", help="a running HTTP API (http://host:port) instead of starting "
                                 "`raftmq console` for the cluster")
    add_cluster_args(p)
    return p


def _table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"HTTP API vs binary protocol ({result['size_bytes']} B messages, "
                    f"{result['concurrency']} requests in flight)")
    t.caption = "latency per message, of its request, in ms"
    for col in ("case", "msgs/request", "msgs/s", "p50", "p99", "max", "errors"):
        t.add_column(col, justify="right")
    for name in ("binary_single", "http_single", "binary_batch", "http_batch"):
        c = result[name]
        lat = c["latency_ms"]
        t.add_row(name, str(c["messages_per_request"]), str(c["msgs_per_s"]),
                  str(lat["p50"]), str(lat["p99"]), str(lat["max"]), str(c["errors"]))
    return t


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_http(args)
    emit(result, args.json, _table)
    if not args.json:
        vs = result["http_vs_binary"]
        print(f"HTTP / binary: one per request {vs['single']['msgs_per_s']}x the rate, "
              f"{vs['single']['p99_ms']}x the p99; batched {vs['batch']['msgs_per_s']}x, "
              f"{vs['batch']['p99_ms']}x")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
