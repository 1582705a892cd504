"""RabbitMQ: three nodes, one quorum queue (three replicas), publisher confirms.

Everything a node needs lives in the run's temp dir (Mnesia and Raft data, config, enabled
plugins, Erlang cookie), so the machine's own RabbitMQ setup is neither used nor touched.
The bench starts its own epmd on a free port in the foreground, so no daemonized epmd is
left behind, and runs each node in the foreground (not `-detached`, which would leave our
process group). Nodes 2 and 3 join node 1 (stop_app, join_cluster, start_app), as in
PEERS.md. The queue is declared on node 1, so its leader is there, and the client publishes
to node 1 and awaits each message's confirm. A quorum queue confirms once a majority of
its members have the message in their fsynced Raft log.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.peers.common import (
    LoadSpec,
    LoadStats,
    Peer,
    PeerError,
    Procs,
    drive,
    free_ports,
    port_open,
    wait_until,
)

__all__ = ["PEER", "RabbitMQPeer"]

RABBIT_BIN = "/usr/lib/rabbitmq/bin"
QUEUE = "bench"
NODE_NAMES = ("rabbit", "hare", "bunny")


@dataclass
class _Cluster:
    amqp_port: int  # node 1, where the queue's leader is
    procs: Procs


class RabbitMQPeer(Peer):
    name = "rabbitmq"
    system = "RabbitMQ quorum queue"
    durability = "fsync, majority"
    durability_detail = "confirms once a majority has fsynced the message to its Raft log"
    notes = "aio-pika, publisher confirms, persistent messages, queue leader on the node used"
    binaries = (("rabbitmq-server", (RABBIT_BIN,)), ("rabbitmqctl", (RABBIT_BIN,)),
                ("epmd", ()))
    debian_packages = ("rabbitmq-server",)
    python_modules = ("aio_pika",)
    pip_packages = ("aio-pika",)
    stop_grace = 30.0

    def version(self) -> str:
        lib = Path("/usr/lib/rabbitmq/lib")
        found = sorted(lib.glob("rabbitmq_server-*")) if lib.is_dir() else []
        return found[-1].name.removeprefix("rabbitmq_server-") if found else ""

    def start(self, workdir: Path, procs: Procs, spec: LoadSpec) -> _Cluster:
        host = _short_hostname()
        nodes = [f"{n}@{host}" for n in NODE_NAMES]
        ports = free_ports(7)
        amqp, dist, epmd_port = ports[0:3], ports[3:6], ports[6]
        home = workdir / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)
        (workdir / "enabled_plugins").write_text("[].\n")
        (workdir / "rabbitmq.conf").write_text("loopback_users = none\n")
        (workdir / "rabbitmq-env.conf").write_text("")
        base = dict(os.environ)
        base.update(
            HOME=str(home),
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_EPMD_PORT=str(epmd_port),
            RABBITMQ_CONF_ENV_FILE=str(workdir / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(workdir / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(workdir / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(workdir / "enabled_plugins"),
        )
        procs.start("epmd", [self.binary("epmd"), "-address", "127.0.0.1",
                             "-port", str(epmd_port)], env=base, stop_last=True)
        wait_until(lambda: port_open(epmd_port) or None, timeout=10, what="epmd",
                   procs=procs)
        for i, (short, node) in enumerate(zip(NODE_NAMES, nodes, strict=True)):
            d = workdir / short
            d.mkdir()
            env = dict(base)
            env.update(
                RABBITMQ_NODENAME=node,
                RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                RABBITMQ_NODE_PORT=str(amqp[i]),
                RABBITMQ_DIST_PORT=str(dist[i]),
                RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
                RABBITMQ_LOG_BASE=str(d / "log"),
                RABBITMQ_LOGS="-",
                RABBITMQ_PID_FILE=str(d / "pid"),
                ERL_CRASH_DUMP=str(d / "erl_crash.dump"),
            )
            procs.start(short, [self.binary("rabbitmq-server")], env=env, cwd=d)

        ctl = self.binary("rabbitmqctl")

        def rabbitmqctl(node: str, *args: str, timeout: float = 60.0) -> str:
            done = procs.run([ctl, "-n", node, *args], env=base, timeout=timeout, cwd=workdir)
            if done.returncode != 0:
                raise PeerError(f"rabbitmqctl -n {node} {' '.join(args)}: exit "
                                f"{done.returncode}\n{done.stdout.strip()}")
            return str(done.stdout)

        def started(node: str) -> bool:
            rabbitmqctl(node, "await_startup", timeout=30)
            return True

        for node in nodes:
            wait_until(partial(started, node),
                       timeout=spec.startup_timeout, what=f"RabbitMQ node {node}",
                       procs=procs, interval=1.0)
        for node in nodes[1:]:
            rabbitmqctl(node, "stop_app")
            rabbitmqctl(node, "join_cluster", nodes[0])
            rabbitmqctl(node, "start_app")

        def running() -> bool | None:
            status = json.loads(rabbitmqctl(nodes[0], "cluster_status", "--formatter",
                                            "json", timeout=30))
            return True if set(status.get("running_nodes", [])) == set(nodes) else None

        wait_until(running, timeout=spec.startup_timeout, what="3-node RabbitMQ cluster",
                   procs=procs, interval=1.0)
        return _Cluster(amqp[0], procs)

    def load(self, cluster: _Cluster, spec: LoadSpec) -> LoadStats:
        return asyncio.run(_load(cluster, spec))


def _short_hostname() -> str:
    """The host part of node names (as `hostname -s`); localhost where it does not resolve,
    since Erlang's short names need a host that resolves."""
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
    except OSError:
        return "localhost"
    return host


async def _load(cluster: _Cluster, spec: LoadSpec) -> LoadStats:
    import aio_pika

    connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{cluster.amqp_port}/")
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await channel.declare_queue(QUEUE, durable=True, arguments={
            "x-queue-type": "quorum", "x-quorum-initial-group-size": 3})
        exchange = channel.default_exchange

        async def send(payload: bytes) -> Any:
            return await exchange.publish(
                aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=QUEUE, timeout=60)

        return await drive(send, spec)
    finally:
        await connection.close()


PEER = RabbitMQPeer()
