"""`raftmq dev`: a whole cluster on this machine with one command, for trying things out.

Starts a name server and the nodes as child processes (see `raftmq.localcluster.LocalCluster`),
waits until every group has a leader, prints exactly one line `ready <namesrv host:port>`
on stdout (for scripts), a summary table on stderr (for people), and runs until SIGINT or
SIGTERM, then stops every child, says which, and exits 0. A child that dies meanwhile is
started again after a backoff (1 s, doubling up to 30 s while it keeps dying soon after
starting), with a line on stderr naming it and its log.

Ports, for `--port-base B` (default 7100): node i listens at B+i, serves Prometheus
metrics at B+100+i, and the name server listens at B+76 (7176 by default). The web
console and HTTP API (`raftmq console`) listen at B+80 and the MQTT gateway
(`raftmq mqtt`) at B+83; both are child processes too, and their addresses are printed. Data and logs
live under `--data`; running again with the same directory restarts the same cluster with
its data.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from broker.config import ConfigError

if TYPE_CHECKING:
    from raftmq.localcluster import LocalCluster

__all__ = ["main"]


RESTART_DELAYS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
STABLE_AFTER = 60.0  # seconds a restarted child must run for its backoff to start over


@dataclass
class Restarts:
    """When to start again each child that died: the delay doubles while a child keeps
    dying within `STABLE_AFTER` seconds of its start, and starts over once it ran that
    long. Pure: the caller passes the time."""

    due: dict[str, float] = field(default_factory=dict)  # name -> when to start it
    quick_deaths: dict[str, int] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)

    def exited(self, name: str, now: float) -> float:
        """Record a death; returns the delay before the restart."""
        if now - self.started.get(name, -math.inf) >= STABLE_AFTER:
            self.quick_deaths[name] = 0
        n = self.quick_deaths.get(name, 0)
        self.quick_deaths[name] = n + 1
        delay = RESTART_DELAYS[min(n, len(RESTART_DELAYS) - 1)]
        self.due[name] = now + delay
        return delay

    def take_due(self, now: float) -> list[str]:
        """Names whose restart time has come (removed from `due`)."""
        ready = sorted(n for n, t in self.due.items() if t <= now)
        for n in ready:
            del self.due[n]
        return ready

    def restarted(self, name: str, now: float) -> None:
        self.started[name] = now


class _Interrupted(Exception):
    """Raised in the main thread by the first SIGINT/SIGTERM."""


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Turn the first SIGINT/SIGTERM into `_Interrupted`; later ones are ignored so the
    shutdown they asked for is not itself interrupted half-way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise _Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="raftmq dev",
        description="Run a local raftmq cluster (name server + nodes) until Ctrl-C.",
    )
    p.add_argument("--data", default="./raftmq-dev", metavar="DIR",
                   help="configs, data and logs (default %(default)s); reused on the next run")
    p.add_argument("--port-base", type=int, default=7100, metavar="N",
                   help="node i at N+i, metrics at N+100+i, name server at N+76 "
                        "(default %(default)s)")
    p.add_argument("--nodes", type=int, default=None,
                   help="node processes, each its own host (default 3; not with --hosts)")
    p.add_argument("--hosts", type=int, default=None, metavar="H",
                   help="simulated machines of --shards node processes each: no group puts "
                        "two replicas on one host")
    p.add_argument("--shards", type=int, default=None, metavar="S",
                   help="node processes per host (with --hosts; default: this machine's "
                        "cores shared out over the hosts, at least 1): one Python process "
                        "uses one core, so a host of S shards can use S cores")
    p.add_argument("--groups", type=int, default=None,
                   help="Raft groups, 3 replicas each (default 3; with --hosts, one per "
                        "shard, so every shard leads one)")
    p.add_argument("--fsync", choices=("always", "interval"), default="always",
                   help="'interval' acknowledges before data reaches the disk "
                        "(page-cache durability; default %(default)s)")
    p.add_argument("--tls", action="store_true",
                   help="TLS on every link, mutual between nodes: makes a development CA and "
                        "certificates under DATA/tls (needs trustme: pip install 'raftmq[tls]')")
    p.add_argument("--auth", action="store_true",
                   help="clients must log in (SCRAM-SHA-256) and ACLs apply (default deny); "
                        "the superuser 'admin' gets a password written to DATA/admin.password")
    p.add_argument("--showcase", action="store_true",
                   help="once ready, run a producer and a consumer against the cluster")
    p.add_argument("--exit-after-showcase", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ready-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="give up if the cluster has no leaders by then (default %(default)s)")
    return p


def _admin_password(data: str) -> str:
    """The dev superuser's password: made once (random), kept in DATA/admin.password."""
    import secrets
    from pathlib import Path

    path = Path(data) / "admin.password"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(18) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def _auth_overrides(data: str) -> dict[str | int, Any]:
    """Node config keys of a dev cluster with authentication and ACLs: superuser 'admin'
    logging in with the verifier of its password (the nodes never see the password)."""
    from wire.security import format_verifier, make_credential

    verifier = format_verifier(make_credential(_admin_password(data)))
    return {"authenticate": True, "authorize": True, "superusers": ["admin"],
            "superuser_scram": verifier}


def _summary(cluster: LocalCluster, leaders: dict[str, int]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    nodes = Table(title=f"raftmq dev: name server {cluster.namesrv_addr}", title_justify="left")
    for col in ("host", "node", "address", "metrics", "pid", "leads"):
        nodes.add_column(col)
    for host, shards in cluster.hosts.items():
        for i in shards:
            cfg = cluster.configs[i - 1]
            led = sorted(g for g, n in leaders.items() if n == i)
            nodes.add_row(host, str(i), cfg.listen, cfg.metrics or "-",
                          str(cluster.pid(i) or "-"), ", ".join(led) or "-")
    groups = Table()
    for col in ("group", "replicas", "hosts", "preferred", "leader"):
        groups.add_column(col)
    for g in cluster.groups:
        groups.add_row(g.id, ", ".join(map(str, g.replicas)),
                       ", ".join(cluster.host_of(r) for r in g.replicas),
                       str(g.preferred_leader or "-"), str(leaders.get(g.id, "-")))
    console.print(nodes)
    console.print(groups)
    fsync = cluster.configs[0].fsync
    note = " (page-cache durability: acks before fsync)" if fsync == "interval" else ""
    console.print(f"data: {cluster.base_dir}   logs: {cluster.log_path('namesrv').parent}")
    console.print(f"fsync: {fsync}{note}   Ctrl-C stops everything")


FRONTENDS = (("console", 80), ("mqtt", 83))  # command, port offset from --port-base


def _start_frontends(cluster: LocalCluster, args: argparse.Namespace,
                     stack: ExitStack) -> list[str]:
    """Start `raftmq console` and `raftmq mqtt` for the cluster as child processes, wait
    for the address each prints, and print it; they stop with the cluster. A front end
    that does not start is reported and left out (the cluster still runs)."""
    import subprocess

    started: list[str] = []
    logs = cluster.base_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for command, offset in FRONTENDS:
        listen = f"127.0.0.1:{args.port_base + offset}"
        log = open(logs / f"{command}.log", "ab")  # noqa: SIM115 - closed by the stack
        stack.callback(log.close)
        env = dict(os.environ)
        if args.auth:  # requests without a login stay anonymous: no borrowed superuser
            env.pop("RAFTMQ_USER", None)
            env.pop("RAFTMQ_PASSWORD", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "raftmq", command, "--namesrv", cluster.namesrv_addr,
             "--listen", listen], stdout=subprocess.PIPE, stderr=log, env=env, text=True)
        stack.callback(_stop_child, proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if proc.poll() is not None or not line:
            print(f"raftmq dev: {command} did not start (its log: {logs / (command + '.log')})",
                  file=sys.stderr, flush=True)
            continue
        started.append(command)
        print(line, file=sys.stderr, flush=True)
    return started


def _stop_child(proc: Any) -> None:
    import subprocess

    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _supervise(cluster: LocalCluster) -> NoReturn:
    """Until interrupted: start again, after a backoff, every child that died."""
    from raftmq.localcluster import NAMESRV, ClusterError

    starters: dict[str, Callable[[], object]] = {NAMESRV: cluster.start_namesrv}
    for i in cluster.node_ids:
        starters[f"n{i}"] = functools.partial(cluster.start_node, i)  # LocalCluster's names
    restarts = Restarts()
    while True:
        time.sleep(0.5)
        now = time.monotonic()
        for name, code in cluster.unexpected_exits().items():
            delay = restarts.exited(name, now)
            print(f"raftmq dev: {name} exited with code {code}; restarting it in {delay:g} s "
                  f"(its log: {cluster.log_path(name)})", file=sys.stderr, flush=True)
        for name in restarts.take_due(now):
            start = starters.get(name)
            if start is None:
                continue
            try:
                start()
            except (ClusterError, OSError, TimeoutError) as exc:
                delay = restarts.exited(name, time.monotonic())
                print(f"raftmq dev: {name} did not start again ({exc}); next try in "
                      f"{delay:g} s (its log: {cluster.log_path(name)})", file=sys.stderr,
                      flush=True)
                continue
            restarts.restarted(name, time.monotonic())
            print(f"raftmq dev: restarted {name} (pid {cluster.pids().get(name, '-')})",
                  file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the dev cluster; 0 after a clean stop on SIGINT/SIGTERM, 1 if it cannot start."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    # imported here: the launcher pulls in subprocess management the SDK does not need
    from raftmq.localcluster import ClusterError, LocalCluster
    from transport.scram import Credentials

    try:
        overrides = _auth_overrides(args.data) if args.auth else None
        # the harness asks the name server as the superuser (lookups need a login then)
        admin = Credentials("admin", _admin_password(args.data)) if args.auth else None
        if args.hosts is None and args.shards is not None:
            raise ValueError("--shards needs --hosts (the machines the shards run on)")
        if args.hosts is not None and args.nodes is not None:
            raise ValueError("--nodes and --hosts both say how many processes: give one "
                             "(--hosts H --shards S runs H x S)")
        if args.hosts is not None and args.shards is None:
            from raftmq.layout import cores

            args.shards = max(1, cores() // max(1, args.hosts))
        layout: dict[str, Any] = ({"hosts": args.hosts, "shards": args.shards}
                                  if args.hosts is not None else {"nodes": args.nodes or 3})
        groups = args.groups if args.groups is not None else (
            args.hosts * (args.shards or 1) if args.hosts is not None else 3)
        cluster = LocalCluster(args.data, **layout, groups=groups,
                               port_base=args.port_base, fsync=args.fsync, tls=args.tls,
                               node_overrides=overrides, credentials=admin)
    except (ConfigError, ValueError) as exc:
        print(f"raftmq dev: {exc}", file=sys.stderr)
        return 2
    stack = ExitStack()
    with _signals_interrupt():
        try:
            try:
                cluster.start()
                leaders = cluster.wait_ready(timeout=args.ready_timeout)
            except (ClusterError, TimeoutError, OSError, RuntimeError) as exc:
                print(f"raftmq dev: the cluster did not start: {exc}", file=sys.stderr)
                print(f"raftmq dev: logs are in {cluster.base_dir / 'logs'}", file=sys.stderr)
                return 1
            print(f"ready {cluster.namesrv_addr}", flush=True)
            _summary(cluster, leaders)
            if args.auth:  # the showcase logs in as the superuser
                from transport.scram import PASSWORD_ENV, USER_ENV

                os.environ[USER_ENV] = "admin"
                os.environ[PASSWORD_ENV] = _admin_password(args.data)
                print(f"clients log in: `raftmq --user admin --password-file "
                      f"{os.path.join(args.data, 'admin.password')} ...` (or RAFTMQ_USER and "
                      "RAFTMQ_PASSWORD); `raftmq user add` and `raftmq acl add` make more",
                      file=sys.stderr, flush=True)
            tls = ""
            if cluster.tls_ca is not None:  # the showcase and the hints dial with TLS
                from transport.tls import CA_ENV

                os.environ[CA_ENV] = str(cluster.tls_ca)
                tls = f"--tls-ca {cluster.tls_ca} "
                print(f"TLS on every link; clients trust {cluster.tls_ca} "
                      f"(`raftmq --tls-ca FILE ...` or {CA_ENV}=FILE)", file=sys.stderr,
                      flush=True)
            _start_frontends(cluster, args, stack)
            if args.showcase or args.exit_after_showcase:
                from raftmq.showcase import run_showcase

                ok = run_showcase(cluster.namesrv_addr)
                if args.exit_after_showcase:
                    return 0 if ok else 1
                print(f"the cluster keeps running; try in another shell:\n"
                      f"  .venv/bin/raftmq {tls}status --namesrv {cluster.namesrv_addr}\n"
                      f"  .venv/bin/raftmq {tls}send --namesrv {cluster.namesrv_addr} --topic showcase hello\n"
                      f"  .venv/bin/raftmq {tls}consume --namesrv {cluster.namesrv_addr} --group me "
                      f"--topic showcase --count 5", file=sys.stderr, flush=True)
            _supervise(cluster)
        except _Interrupted:
            return 0
        finally:
            stack.close()
            running = cluster.pids()
            cluster.stop()
            if running:
                stopped = ", ".join(f"{n} (pid {p})" for n, p in sorted(running.items()))
                print(f"raftmq dev: stopped {stopped}; data and logs stay in "
                      f"{cluster.base_dir}", file=sys.stderr, flush=True)
