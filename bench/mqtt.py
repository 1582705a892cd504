"""MQTT QoS 1 publish through the gateway against the binary protocol, in the same run.

A cluster (a local one by default; `--namesrv` for a running one) and a `raftmq mqtt`
gateway process for it (`--broker HOST:PORT` for a running one). Two cases, each
`--messages` messages of `--size` bytes:

- `binary_single`: `--clients` tasks each awaiting `Producer.send` per message;
- `mqtt_qos1`: `--clients` MQTT connections (amqtt's client, the codec the gateway
  uses), each publishing at QoS 1 and waiting for the PUBACK before the next publish;
  the gateway sends a PUBACK once the message is committed on a majority.

Each connection waits for a PUBACK before its next publish (a publish-and-wait device),
so `--clients` is the concurrency of both cases. The result has each case's msgs/s and
latency (publish to PUBACK, send call to ack) and `mqtt_vs_binary`. With authentication
on the cluster, the MQTT clients log in as RAFTMQ_USER/RAFTMQ_PASSWORD.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .common import (
    Target,
    add_cluster_args,
    emit,
    freeze_gc,
    positive_int,
    progress,
    run_on_target,
)
from .frontend import gateway
from .httpapi import compare, timed_requests

__all__ = ["build_parser", "main", "run_mqtt"]

QUEUES = 4


def _broker_uri(address: str) -> str:
    from urllib.parse import quote

    from transport.scram import PASSWORD_ENV, USER_ENV

    user = os.environ.get(USER_ENV)
    login = ""
    if user:
        login = f"{quote(user, safe='')}:{quote(os.environ.get(PASSWORD_ENV, ''), safe='')}@"
    return f"mqtt://{login}{address}/"


async def _drive(namesrv: str, broker: str, args: argparse.Namespace) -> dict[str, Any]:
    from amqtt.client import MQTTClient
    from amqtt.mqtt.constants import QOS_1

    from raftmq.client import Admin, Producer

    topic = args.topic
    async with Admin(namesrv) as admin:
        await admin.create_topic(topic, QUEUES, exist_ok=True)
    payload = b"x" * args.size
    uri = _broker_uri(broker)
    clients = [MQTTClient(client_id=f"bench-mqtt-{i}",
                          config={"auto_reconnect": False, "keep_alive": 60})
               for i in range(args.clients)]
    for c in clients:
        await c.connect(uri, cleansession=True)
    cases: dict[str, Any] = {}
    try:
        async with Producer(namesrv) as producer:

            async def binary_single(i: int) -> str | None:
                await producer.send(topic, payload)
                return None

            async def mqtt_qos1(i: int) -> str | None:
                # worker w makes publishes w, w + clients, ...: one connection each
                await clients[i % args.clients].publish(f"{topic}/bench", payload, qos=QOS_1)
                return None

            for i in range(args.clients):  # warm-up: routes learned, connections open
                await binary_single(i)
                await mqtt_qos1(i)
            freeze_gc()
            for name, one in (("binary_single", binary_single), ("mqtt_qos1", mqtt_qos1)):
                progress("mqtt", f"{name}: {args.messages} messages")
                cases[name] = await timed_requests(args.messages, args.clients, 1, one)
    finally:
        for c in clients:
            await c.disconnect()
    return {
        "benchmark": "mqtt",
        "size_bytes": args.size,
        "clients": args.clients,
        "queues": QUEUES,
        **cases,
        "mqtt_vs_binary": compare(cases["mqtt_qos1"], cases["binary_single"]),
        "errors": sum(c["errors"] for c in cases.values()),
    }


def run_mqtt(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark against `--namesrv` or a local cluster started (and stopped) here."""

    async def drive(target: Target, args: argparse.Namespace) -> dict[str, Any]:
        with gateway("mqtt", args.broker, target.namesrv) as broker:
            result = await _drive(target.namesrv, broker, args)
            result["broker"] = broker if args.broker else "local raftmq mqtt"
            return result

    return run_on_target(args, drive)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftmq bench mqtt",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=positive_int, default=5000, help="messages per case")
    p.add_argument("--size", type=positive_int, default=100, help="message bytes (100)")
    p.add_argument("--clients", type=positive_int, default=16,
                   help="MQTT connections (and SDK tasks) publishing at once (default 16)")
    p.add_argument("--topic", default="bench-mqtt")
    p.add_argument("--broker", metavar="HOST:PORT",
                   help="a running `raftmq mqtt` instead of starting one for the cluster")
    add_cluster_args(p)
    return p


def _table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title=f"MQTT QoS 1 vs binary protocol ({result['size_bytes']} B messages, "
                    f"{result['clients']} clients)")
    t.caption = "latency per message in ms: publish to PUBACK, send call to ack"
    for col in ("case", "msgs/s", "p50", "p99", "max", "errors"):
        t.add_column(col, justify="right")
    for name in ("binary_single", "mqtt_qos1"):
        c = result[name]
        lat = c["latency_ms"]
        t.add_row(name, str(c["msgs_per_s"]), str(lat["p50"]), str(lat["p99"]),
                  str(lat["max"]), str(c["errors"]))
    return t


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_mqtt(args)
    emit(result, args.json, _table)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
