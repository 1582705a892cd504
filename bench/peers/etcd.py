"""etcd: three members, one PUT per message to the leader through the JSON gateway.

etcd 3.4's gRPC clients for Python (python-etcd3) need protobuf<=3.20 and do not install
cleanly on current Python, so the client here is aiohttp against etcd's own HTTP/JSON
gateway (`POST /v3/kv/put`), as in PEERS.md. HTTP/1.1 has no pipelining: the window is held
with one keep-alive connection per message in flight. etcd answers a put once it is
committed, and an entry counts toward a majority only after that member fsynced its WAL.
"""

from __future__ import annotations

import asyncio
import base64
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

__all__ = ["PEER", "EtcdPeer"]


@dataclass
class _Cluster:
    client_urls: list[str]
    procs: Procs


class EtcdPeer(Peer):
    name = "etcd"
    system = "etcd"
    durability = "fsync, majority"
    durability_detail = "answers a put once a majority has fsynced it to its WAL"
    notes = ("one PUT per message to the leader; aiohttp to the JSON gateway, one keep-alive "
             "connection per message in flight")
    binaries = (("etcd", ()),)
    debian_packages = ("etcd-server",)
    python_modules = ("aiohttp",)
    pip_packages = ("aiohttp",)
    # A member stopped with TERM first tries to hand its leadership over, to members that
    # are stopping too; that waits ~7 s for nothing, and the data is thrown away anyway.
    stop_grace = 2.0

    def version(self) -> str:
        out = subprocess.run([self.binary("etcd"), "--version"], capture_output=True,
                             text=True, timeout=10).stdout
        first = out.splitlines()[0] if out else ""
        return first.removeprefix("etcd Version: ").strip()

    def start(self, workdir: Path, procs: Procs, spec: LoadSpec) -> _Cluster:
        ports = free_ports(6)
        client_ports, peer_ports = ports[:3], ports[3:]
        initial = ",".join(f"e{i + 1}=http://127.0.0.1:{p}" for i, p in enumerate(peer_ports))
        urls = []
        for i in range(3):
            name = f"e{i + 1}"
            client = f"http://127.0.0.1:{client_ports[i]}"
            peer = f"http://127.0.0.1:{peer_ports[i]}"
            procs.start(name, [
                self.binary("etcd"), "--name", name, "--data-dir", str(workdir / name),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", initial, "--initial-cluster-token", "bench",
                "--initial-cluster-state", "new",
            ])
            urls.append(client)
        for i, url in enumerate(urls):
            wait_until(partial(_healthy, url), timeout=spec.startup_timeout,
                       what=f"etcd member e{i + 1} /health", procs=procs)
        return _Cluster(urls, procs)

    def load(self, cluster: _Cluster, spec: LoadSpec) -> LoadStats:
        leader = wait_until(lambda: _leader(cluster.client_urls), timeout=spec.startup_timeout,
                            what="etcd leader", procs=cluster.procs)
        stats = asyncio.run(_load(leader, spec))
        stats.notes.append(f"leader {leader}")
        return stats


def _healthy(url: str) -> bool | None:
    answer = http_json(f"{url}/health")
    return True if isinstance(answer, dict) and answer.get("health") == "true" else None


def _leader(urls: list[str]) -> str | None:
    """The client URL of the member that says it is the leader (ids come as strings)."""
    for url in urls:
        status = http_json(f"{url}/v3/maintenance/status", body={})
        if status.get("leader") and status["leader"] == status["header"]["member_id"]:
            return url
    return None


async def _load(leader: str, spec: LoadSpec) -> LoadStats:
    import aiohttp

    counter = 0
    connector = aiohttp.TCPConnector(limit=max(1, spec.in_flight))
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def send(payload: bytes) -> Any:
            nonlocal counter
            counter += 1
            key = base64.b64encode(f"bench/{counter:010d}".encode()).decode()
            async with session.post(f"{leader}/v3/kv/put",
                                    json={"key": key, "value": base64.b64encode(payload).decode()}) as resp:
                body = await resp.json(content_type=None)
                if resp.status != 200 or "header" not in body:
                    raise PeerError(f"etcd put: HTTP {resp.status} {body}")
                return body

        return await drive(send, spec)


PEER = EtcdPeer()
