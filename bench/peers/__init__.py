"""Side-by-side produce benchmarks against peer systems on loopback.

Each peer module starts a three-node cluster of its system from the machine's own binaries
(Debian packages) or PyPI, drives it with that system's Python client using the same load
design as `bench.produce` (same message count, size and in-flight window, latency from a
request to its acknowledgement: ours is `bench.produce`'s in-flight latency), and stops
every process it started. `python -m bench.peers` runs our own produce benchmark with the
same parameters in the same run and prints our ratio to each.

This package imports no peer client at import time, so a machine without them can still
list the peers and report each as skipped with the command that installs it.
"""

from __future__ import annotations

import importlib

from bench.peers.common import Peer

__all__ = ["PEER_MODULES", "Peer", "all_peers", "get_peer"]

#: short name (for --only) -> module defining `PEER`
PEER_MODULES: dict[str, str] = {
    "nats": "bench.peers.nats",
    "rabbitmq": "bench.peers.rabbitmq",
    "etcd": "bench.peers.etcd",
    "pysyncobj": "bench.peers.pysyncobj_peer",
}


def get_peer(name: str) -> Peer:
    """The peer registered under `name`; its module imports its client lazily."""
    try:
        module = importlib.import_module(PEER_MODULES[name])
    except KeyError:
        raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEER_MODULES)}") from None
    peer: Peer = module.PEER
    return peer


def all_peers() -> list[Peer]:
    return [get_peer(name) for name in PEER_MODULES]
