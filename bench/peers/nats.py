"""NATS JetStream: three nats-server nodes, one R3 file-storage stream, acked publishes.

The client connects to the stream's leader (as our producer sends to each group's leader)
and awaits JetStream's PubAck for every message. NATS acknowledges once a majority has the
message in its file store, *not* after an fsync, and 2.9.x has no option to change that:
`sync_interval` and `sync_always` came with 2.10 (2.9.10 rejects both as unknown fields).
Its figures are page-cache durability and labelled so.
"""

from __future__ import annotations

import asyncio
import subprocess
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
    http_json,
    wait_until,
)

__all__ = ["PEER", "NatsPeer"]

STREAM = "BENCH"
SUBJECT = "bench.produce"


@dataclass
class _Cluster:
    client_urls: dict[str, str]  # server name -> nats://127.0.0.1:port
    procs: Procs


def _config(name: str, client: int, http: int, route: int, routes: list[int],
            store: Path) -> str:
    route_urls = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)
    return (
        f"server_name: {name}\n"
        f"listen: 127.0.0.1:{client}\n"
        f"http: 127.0.0.1:{http}\n"
        f'jetstream {{ store_dir: "{store}" }}\n'
        f"cluster {{ name: C1, listen: 127.0.0.1:{route}, routes: [{route_urls}] }}\n"
    )


class NatsPeer(Peer):
    name = "nats"
    system = "NATS JetStream"
    durability = "NO fsync"
    durability_detail = ("acks once a majority has the message in its file store, NOT after "
                         "an fsync (page-cache durability)")
    notes = "R3 file stream; client connected to the stream leader; one PubAck awaited per message"
    binaries = (("nats-server", ()),)
    debian_packages = ("nats-server",)
    python_modules = ("nats",)
    pip_packages = ("nats-py",)

    def version(self) -> str:
        out = subprocess.run([self.binary("nats-server"), "--version"], capture_output=True,
                             text=True, timeout=10).stdout
        return out.strip().removeprefix("nats-server: ").removeprefix("v")

    def start(self, workdir: Path, procs: Procs, spec: LoadSpec) -> _Cluster:
        ports = free_ports(9)
        clients, https, routes = ports[0:3], ports[3:6], ports[6:9]
        urls: dict[str, str] = {}
        for i in range(3):
            name = f"n{i + 1}"
            conf = workdir / f"{name}.conf"
            conf.write_text(_config(name, clients[i], https[i], routes[i], routes,
                                    workdir / name))
            procs.start(name, [self.binary("nats-server"), "-c", str(conf)])
            urls[name] = f"nats://127.0.0.1:{clients[i]}"
        for i in range(3):
            wait_until(partial(_healthy, https[i]), timeout=spec.startup_timeout,
                       what=f"nats-server n{i + 1} /healthz", procs=procs)
        return _Cluster(urls, procs)

    def load(self, cluster: _Cluster, spec: LoadSpec) -> LoadStats:
        return asyncio.run(_load(cluster, spec))


def _healthy(http_port: int) -> bool | None:
    answer = http_json(f"http://127.0.0.1:{http_port}/healthz")
    return True if isinstance(answer, dict) and answer.get("status") == "ok" else None


async def _create_stream(cluster: _Cluster, spec: LoadSpec) -> str:
    """Create the R3 stream (retrying while JetStream elects its meta leader); its leader."""
    import nats
    from nats.js.api import StorageType

    nc = await nats.connect(servers=list(cluster.client_urls.values()), connect_timeout=5)
    try:
        js = nc.jetstream(timeout=10)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.startup_timeout
        last: Exception | None = None
        while loop.time() < deadline:
            cluster.procs.check_alive()
            try:
                await js.add_stream(name=STREAM, subjects=[SUBJECT],
                                    storage=StorageType.FILE, num_replicas=3)
                info = await js.stream_info(STREAM)
                if info.cluster is not None and info.cluster.leader and all(
                        r.current for r in info.cluster.replicas or []):
                    return info.cluster.leader
            except Exception as exc:  # no meta leader yet, or the stream not placed yet
                last = exc
            await asyncio.sleep(0.25)
        raise PeerError(f"NATS stream {STREAM} not ready after {spec.startup_timeout:.0f} s "
                        f"(last: {last!r})\n{cluster.procs.tails()}")
    finally:
        await nc.close()


async def _load(cluster: _Cluster, spec: LoadSpec) -> LoadStats:
    import nats

    leader = await _create_stream(cluster, spec)
    nc = await nats.connect(servers=[cluster.client_urls[leader]], connect_timeout=5,
                            dont_randomize=True)
    try:
        js = nc.jetstream(timeout=60)

        async def send(payload: bytes) -> Any:
            return await js.publish(SUBJECT, payload)

        stats = await drive(send, spec)
        stats.notes.append(f"stream leader {leader}")
        return stats
    finally:
        await nc.close()


PEER = NatsPeer()
