"""`raftmq bench SUBCOMMAND`: benchmarks against a running cluster or a local one.

The benchmarks live in `bench/` (runnable as `python -m bench.<name>` too); this only
routes to them and reports request failures the way every other command does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from wire.protocol import RequestError

from . import first_request_error, report_error

__all__ = ["main"]

PROG = "raftmq bench"


def _produce(argv: list[str]) -> int:
    from bench.produce import main as produce_main

    return produce_main(argv)


def _e2e(argv: list[str]) -> int:
    from bench.e2e import main as e2e_main

    return e2e_main(argv)


def _delay(argv: list[str]) -> int:
    from bench.delay import main as delay_main

    return delay_main(argv)


def _filter(argv: list[str]) -> int:
    from bench.filter import main as filter_main

    return filter_main(argv)


def _trace(argv: list[str]) -> int:
    from bench.trace import main as trace_main

    return trace_main(argv)


def _ack(argv: list[str]) -> int:
    from bench.ack import main as ack_main

    return ack_main(argv)


def _consume(argv: list[str]) -> int:
    from bench.consume import main as consume_main

    return consume_main(argv)


def _topics(argv: list[str]) -> int:
    from bench.topics import main as topics_main

    return topics_main(argv)


def _failover(argv: list[str]) -> int:
    from bench.failover import main as failover_main

    return failover_main(argv)


def _txn(argv: list[str]) -> int:
    from bench.txn import main as txn_main

    return txn_main(argv)


def _catchup(argv: list[str]) -> int:
    from bench.catchup import main as catchup_main

    return catchup_main(argv)


def _spark(argv: list[str]) -> int:
    from bench.spark import main as spark_main

    return spark_main(argv)


def _audit(argv: list[str]) -> int:
    from bench.audit import main as audit_main

    return audit_main(argv)


def _http(argv: list[str]) -> int:
    from bench.httpapi import main as http_main

    return http_main(argv)


def _cpu(argv: list[str]) -> int:
    from bench.cpu_per_entry import main as cpu_main

    return cpu_main(argv)


def _scale(argv: list[str]) -> int:
    from bench.scale import main as scale_main

    return scale_main(argv)


def _mqtt(argv: list[str]) -> int:
    from bench.mqtt import main as mqtt_main

    return mqtt_main(argv)


# Each benchmark is imported only when run: they pull in the cluster harness and rich.
BENCHMARKS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "produce": (_produce, "produce throughput and ack latency (SDK Producer, real nodes)"),
    "e2e": (_e2e, "send -> receive and send -> ack latency at a fixed rate"),
    "consume": (_consume, "consume throughput, hot and cold data; --catch-up under load"),
    "topics": (_topics, "produce throughput over 1 ... 10,000 topics, and creation time"),
    "failover": (_failover, "kill -9 a group leader under load: time until acks resume"),
    "catchup": (_catchup, "a new replica catches up under reads: leader memory, answers"),
    "delay": (_delay, "delayed sends vs plain, memory of pending, lateness of a crowd"),
    "filter": (_filter, "consume with a SQL92 filter matching 1%, 50%, 100% vs none"),
    "trace": (_trace, "message trace on vs off: produce and consume throughput, records"),
    "ack": (_ack, "simple consumer receive + ack vs pull + commit, redelivery, retries"),
    "txn": (_txn, "transactions (10/100 msgs, 1/3 groups) and half messages vs plain sends"),
    "spark": (_spark, "PySpark `raftmq` source: batch and streaming read rows/s"),
    "audit": (_audit, "`raftmq audit` on Spark over a history of --events lines"),
    "http": (_http, "HTTP API produce vs the binary protocol, one per request and batched"),
    "mqtt": (_mqtt, "MQTT QoS 1 publish (PUBACK once committed) vs the binary protocol"),
    "cpu": (_cpu, "CPU per message per hop (client, leader, followers) at one in flight"),
    "scale": (_scale, "H hosts x S shards on one machine: msgs/s, p99, CPU of every shard"),
}


def _usage() -> str:
    lines = [f"usage: {PROG} BENCHMARK [ARGS]   (`{PROG} BENCHMARK --help` for its options)",
             "", "benchmarks:"]
    lines += [f"  {name:<9} {summary}" for name, (_, summary) in BENCHMARKS.items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    entry = BENCHMARKS.get(argv[0])
    if entry is None:
        print(f"{PROG}: unknown benchmark {argv[0]!r} (known: {', '.join(BENCHMARKS)})",
              file=sys.stderr)
        return 2
    try:
        return entry[0](argv[1:])
    except KeyboardInterrupt:
        return 130
    except (RequestError, BaseExceptionGroup) as exc:
        found = first_request_error(exc)
        if found is None:
            raise
        return report_error("raftmq", found)
    except OSError as exc:  # the benchmark's blocking requests: the peer is unreachable
        print(f"raftmq: cannot reach the cluster: {exc}", file=sys.stderr)
        return 1
