"""`raftmq layout`: the node configs of a cluster of hosts with shards, one folder per host.

For a deployment on real machines: each `--host NAME=ADDRESS` is a machine, each runs
`--shards` node processes (by default one per core of the machine this runs on, the
machines being alike), and every config gets the same `[peers]`, `[hosts]` and
`[[groups]]` (placed as `broker.config.place_groups`: no two replicas of a group on one
host, leaders on every shard) and the same new `cluster_secret`. Shard s of a host listens
at ADDRESS:`--port`+s-1, serves metrics on loopback at `--metrics-port`+s-1 (ADDRESS
itself when that is a loopback address: hosts tried out on one machine), and keeps
its data in `--data`/n<id>. The folder OUT/NAME then goes to machine NAME, where
`raftmq host --config OUT/NAME` runs its shards.

Refuses (exit 2, nothing written) what cannot be placed or would be ambiguous: fewer
hosts than replicas, a host named twice, an address twice, an OUT that already holds
configs.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from broker.config import ConfigError, NodeConfig, dump_config, is_loopback, place_groups
from wire.protocol import parse_address

__all__ = ["layout_configs", "main"]


def cores() -> int:
    """The cores this process may use (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def layout_configs(hosts: list[tuple[str, str]], *, shards: int, groups: int, port: int,
                   metrics_port: int, data: str, namesrv: list[str],
                   replication: int = 3, secret: str | None = None) -> dict[str, list[NodeConfig]]:
    """Host name -> the configs of its shards, in node order (validated)."""
    if shards < 1:
        raise ConfigError(f"--shards must be at least 1, got {shards}")
    names = [n for n, _ in hosts]
    for what, values in (("host", names), ("address", [a for _, a in hosts])):
        dup = sorted({v for v in values if values.count(v) > 1})
        if dup:
            raise ConfigError(f"{what} {dup[0]!r} is given twice")
    if port < 1 or port + shards - 1 > 65535 or metrics_port < 1 \
            or metrics_port + shards - 1 > 65535:
        raise ConfigError("--port and --metrics-port leave no room for the shards' ports")
    if port <= metrics_port < port + shards or metrics_port <= port < metrics_port + shards:
        raise ConfigError("the listen ports and the metrics ports of the shards overlap")
    node_host: dict[int, str] = {}
    peers: dict[int, str] = {}
    for k, (name, addr) in enumerate(hosts):
        for s in range(shards):
            nid = k * shards + s + 1
            node_host[nid] = name
            peers[nid] = f"{addr}:{port + s}"
    placed = place_groups(groups, len(peers), replication, node_host)
    secret = secret or secrets.token_urlsafe(32)
    out: dict[str, list[NodeConfig]] = {name: [] for name in names}
    for nid, name in node_host.items():
        shard = (nid - 1) % shards
        addr = dict(hosts)[name]
        # metrics are served on loopback only: the host's own address when that is a
        # loopback one (hosts tried out on one machine as 127.0.0.x), else 127.0.0.1
        local = addr if is_loopback(addr) else "127.0.0.1"
        doc: dict[str, Any] = {
            "node_id": nid, "listen": peers[nid],
            "metrics": f"{local}:{metrics_port + shard}",
            "data": str(Path(data) / f"n{nid}"), "namesrv": namesrv, "peers": peers,
            "hosts": node_host, "groups": placed, "cluster_secret": secret,
        }
        out[name].append(NodeConfig.from_dict(doc, env={}))
    return out


def _host(spec: str) -> tuple[str, str]:
    name, sep, addr = spec.partition("=")
    if not sep or not name or not addr:
        raise argparse.ArgumentTypeError(f"--host takes NAME=ADDRESS, got {spec!r}")
    try:
        parse_address(f"{addr}:1")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--host {spec!r}: {exc}") from None
    return name, addr


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="raftmq layout",
        description="Write the node configs of hosts with shards, one folder per host.")
    p.add_argument("--host", dest="hosts", action="append", type=_host, required=True,
                   metavar="NAME=ADDRESS", help="a machine and the address its shards "
                   "listen on; repeat for each (at least 3 for 3 replicas)")
    p.add_argument("--shards", type=int, default=None, metavar="N",
                   help="node processes per host (default: the cores of this machine, "
                        f"{cores()} here)")
    p.add_argument("--groups", type=int, default=None, metavar="G",
                   help="Raft groups (default: one per shard, so every shard leads one)")
    p.add_argument("--namesrv", action="append", required=True, metavar="HOST:PORT",
                   help="a name server the nodes register with; repeat for several")
    p.add_argument("--port", type=int, default=7101,
                   help="the first shard's port on each host (default %(default)s)")
    p.add_argument("--metrics-port", type=int, default=7201,
                   help="the first shard's metrics port, on loopback (default %(default)s)")
    p.add_argument("--data", default="/var/lib/raftmq", metavar="DIR",
                   help="where each node keeps its data, DIR/n<id> (default %(default)s)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="write DIR/<host>/n<id>.toml")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    shards = args.shards if args.shards is not None else cores()
    groups = args.groups if args.groups is not None else len(args.hosts) * shards
    try:
        for ns in args.namesrv:
            parse_address(ns)
        if args.out.exists() and any(args.out.glob("*/*.toml")):
            raise ConfigError(f"{args.out} holds node configs already: write a new layout "
                              "elsewhere (its cluster_secret and placement are new)")
        layout = layout_configs(args.hosts, shards=shards, groups=groups, port=args.port,
                                metrics_port=args.metrics_port, data=args.data,
                                namesrv=args.namesrv)
    except (ConfigError, ValueError) as exc:
        print(f"raftmq layout: {exc}", file=sys.stderr)
        return 2
    for name, configs in layout.items():
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        for cfg in configs:
            path = folder / f"n{cfg.node_id}.toml"
            path.write_text(dump_config(cfg))
            path.chmod(0o600)  # it holds the cluster secret
        print(f"{folder}: nodes {', '.join(str(c.node_id) for c in configs)} "
              f"(run `raftmq host --config {folder}` on {name})")
    print(f"{groups} groups over {len(layout)} hosts x {shards} shards; every config holds "
          "the same new cluster_secret", file=sys.stderr)
    return 0
