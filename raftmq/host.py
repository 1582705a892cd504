"""`raftmq host`: one machine's shards (node processes) as one service.

A Python process uses one core, so a machine with many cores runs several nodes, its
*shards*; their configs share a `[hosts]` table that names this machine for each of them
(`broker.config`). Each shard stays a node in every respect (its own address, data and Raft
identity; clients and peers reach it directly): this command only starts, watches and
stops them together, so a host is started, stopped and restarted as one unit (one systemd
unit, one container), the way a single node is with `raftmq node`.

- Every config must name the same host, and distinct nodes; a config that does not load
  is refused before anything starts (exit 2).
- Each shard runs `raftmq node --config FILE` as a child; its output lines are passed on
  prefixed with `n<id>: `. Once every shard has printed its `ready` line the host prints
  `ready <host> <node ids>` (for scripts).
- A shard that dies is started again after a backoff (1 s, doubling to 30 s while it keeps
  dying soon after starting; `raftmq.dev.Restarts`).
- SIGINT/SIGTERM stop every shard (SIGTERM, then SIGKILL after `--stop-timeout`) and exit
  0. The shards are bound to this process's life (Linux `PR_SET_PDEATHSIG`): if the host
  process is killed outright, so are they, as when a machine loses power. A restart of
  the host then brings every shard back with its data.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from broker.config import ConfigError, NodeConfig, load_config
from raftmq.dev import Restarts

__all__ = ["HostPlan", "main", "plan_host"]

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class HostPlan:
    """The shards one host runs: its name and each shard's node id and config file."""

    host: str
    shards: tuple[tuple[int, Path], ...]


def plan_host(paths: Sequence[str | Path]) -> HostPlan:
    """Load every config and check they describe the shards of one host: distinct nodes,
    one cluster (the same peers), the same host in `[hosts]`. `ConfigError` otherwise."""
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(p.glob("*.toml")) if p.is_dir() else [p])
    if not files:
        raise ConfigError("no node config given (--config FILE, or a directory of *.toml)")
    configs: list[tuple[NodeConfig, Path]] = [(load_config(f), f.resolve()) for f in files]
    first = configs[0][0]
    for cfg, path in configs:
        if dict(cfg.peers) != dict(first.peers):
            raise ConfigError(f"{path}: its peers differ from those of {configs[0][1]}: the "
                              "shards of a host belong to one cluster")
        if cfg.host != first.host:
            raise ConfigError(f"{path}: node {cfg.node_id} runs on host {cfg.host!r}, node "
                              f"{first.node_id} on {first.host!r}; a host runs its own shards "
                              "only (see [hosts])")
    ids = [cfg.node_id for cfg, _ in configs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"node(s) {dup} given more than once")
    return HostPlan(first.host, tuple(sorted((cfg.node_id, path) for cfg, path in configs)))


def _spawn(cmd: list[str]) -> subprocess.Popen[bytes]:
    """Start a shard from this (the main) thread: `PR_SET_PDEATHSIG` fires when the thread
    that forked the child ends, so a child forked by a worker thread would be killed when
    that thread retires, not when the host dies."""
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    """In the child, before exec: be killed when the host process dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the shards then outlive a killed host
        pass


@dataclass
class _Host:
    plan: HostPlan
    stop_timeout: float
    restarts: Restarts = field(default_factory=Restarts)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    ready: set[int] = field(default_factory=set)
    announced: bool = False

    def say(self, line: str) -> None:
        print(line, flush=True)

    async def run_shard(self, node: int, config: Path) -> None:
        """Keep shard `node` running: start it, pass its output on, start it again after
        a backoff when it dies."""
        while True:
            self.restarts.restarted(f"n{node}", trio.current_time())
            proc = _spawn([sys.executable, "-m", "raftmq", "node", "--config", str(config)])
            self.procs[node] = proc
            assert proc.stdout is not None
            async with trio.lowlevel.FdStream(os.dup(proc.stdout.fileno())) as out:
                proc.stdout.close()
                buf = b""
                while chunk := await out.receive_some():
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for raw in lines:
                        self.line(node, raw.decode(errors="replace"))
            code = await trio.to_thread.run_sync(proc.wait)  # its output ended: exiting
            self.procs.pop(node, None)
            self.ready.discard(node)
            delay = self.restarts.exited(f"n{node}", trio.current_time())
            print(f"raftmq host {self.plan.host}: shard n{node} exited with code {code}; "
                  f"starting it again in {delay:g} s", file=sys.stderr, flush=True)
            await trio.sleep(delay)

    def line(self, node: int, text: str) -> None:
        self.say(f"n{node}: {text}")
        if text.startswith("ready ") and node not in self.ready:
            self.ready.add(node)
            if not self.announced and len(self.ready) == len(self.plan.shards):
                self.announced = True
                nodes = ",".join(str(n) for n, _ in self.plan.shards)
                self.say(f"ready {self.plan.host} {nodes}")

    async def stop(self) -> None:
        """SIGTERM every shard, SIGKILL what is left after `stop_timeout`."""
        procs = list(self.procs.values())
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = trio.current_time() + self.stop_timeout
        while any(p.poll() is None for p in procs) and trio.current_time() < deadline:
            await trio.sleep(0.05)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def _serve(plan: HostPlan, stop_timeout: float) -> int:
    host = _Host(plan, stop_timeout)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            for node, config in plan.shards:
                nursery.start_soon(host.run_shard, node, config)
            async for sig in signals:
                print(f"raftmq host {plan.host}: {signal.Signals(sig).name}: stopping "
                      f"{len(plan.shards)} shard(s)", file=sys.stderr, flush=True)
                with trio.CancelScope(shield=True):
                    await host.stop()
                nursery.cancel_scope.cancel()
                break
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="raftmq host",
        description="Run the shards (node processes) of one machine as one service.")
    p.add_argument("--config", action="append", required=True, metavar="FILE|DIR",
                   help="a shard's node config, or a directory of them (*.toml); repeat "
                        "for each shard. All must name this machine in [hosts]")
    p.add_argument("--stop-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="on SIGTERM, how long shards get to stop before SIGKILL "
                        "(default %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if not (math.isfinite(args.stop_timeout) and args.stop_timeout >= 0):
        print("raftmq host: --stop-timeout must be a number of seconds >= 0", file=sys.stderr)
        return 2
    try:
        plan = plan_host(args.config)
    except ConfigError as exc:
        print(f"raftmq host: {exc}", file=sys.stderr)
        return 2
    print(f"raftmq host {plan.host}: shards "
          + ", ".join(f"n{n} ({p})" for n, p in plan.shards), file=sys.stderr, flush=True)
    return trio.run(_serve, plan, args.stop_timeout)
