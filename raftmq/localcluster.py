"""A raftmq cluster of real processes on loopback: `raftmq dev` runs one, and the tests,
the benchmarks and the chaos harness start theirs through it.

`LocalCluster` writes one TOML config per node (`base_dir/n{i}.toml`), starts a name
server and the nodes as child processes and hands out the faults a nemesis needs: kill
(any signal, -9 by default) and restart, pause and resume (SIGSTOP/SIGCONT). Each child
runs in its own session, so a Ctrl-C in the terminal reaches only the harness, which then
stops its children in order; signals go to the child's whole process group, so nothing a
node spawns is left behind. Output of each child is appended to `base_dir/logs/<name>.log`.

Readiness is judged from the outside, the way a client sees the cluster: the name
server's CLUSTER view must show a leader for every group, on a node that is registered
and whose process is running and not paused.

Nodes may be wired through fault proxies (`chaos.proxy.ProxyNet`): per-node overrides of
`listen` and `peers` give each node its own peers table (which address it dials for each
peer, which it advertises), while `node_addr` stays the node's own listen address for
the harness and `client_addr` is the address the node tells clients.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from broker.config import (
    NAMESRV_PORT_OFFSET,
    GroupConfig,
    NodeConfig,
    cluster_configs,
    dump_config,
)
from raftmq.client.routes import merge_cluster_topics
from transport.blocking import request
from transport.scram import Credentials, credentials_from_env
from wire.protocol import Op, RequestError
from wire.requests.namesrv import ClusterRequest

__all__ = ["ClusterError", "LocalCluster", "free_port_base", "free_ports"]

NAMESRV = "namesrv"
_PROJECT_ROOT = Path(__file__).resolve().parents[1]
_POLL = 0.05


class ClusterError(RuntimeError):
    """A process of the cluster failed to start or exited when nobody stopped it."""


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct TCP ports, free now, that no other caller of `free_ports` or
    `free_port_base`, in this process or any other, is handed meanwhile (`_PortBlock`).
    Falls back to kernel-chosen ports when the range below the ephemeral one is too small
    for a block."""
    ports: list[int] = []
    for _ in range(n):
        port = _ports.take(1, host)
        if port is None:
            return _kernel_ports(n, host)
        ports.append(port)
    return ports


def _kernel_ports(n: int, host: str) -> list[int]:
    """`n` ports the kernel picks (from the ephemeral range), all bound at once so they
    are distinct."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


PORT_BASE_SPAN = 128


def free_port_base(span: int = PORT_BASE_SPAN, host: str = "127.0.0.1") -> int:
    """A port base B whose ports B..B+span-1 are all free now and handed to no other
    caller: room for a `--port-base` layout (node i at B+i, the name server at B+76, the
    console at B+80, the MQTT gateway at B+83, metrics at B+100+i)."""
    base = _ports.take(span, host)
    if base is None:
        raise ClusterError("no port block below the kernel's ephemeral range")
    return base


_LOW_PORT = 20000  # above the usual fixed service ports
PORT_BLOCK = 512  # ports a process reserves at once; 24 blocks fit below 32768
_LOCK_DIR = "raftmq-ports"


class _PortBlock:
    """This process's own block of ports, from which `free_ports` and `free_port_base`
    hand out ports.

    Why: a port found free is bound only later, by a child process (a node, the name
    server), and whoever binds it in between wins: another test worker's cluster, or this
    process's own next pick (a chaos run picks its nodes' ports in `ProxyNet`, then
    `LocalCluster` picks the name server's while those are still unbound). Probing cannot
    close that window, and retrying on EADDRINUSE would mean rewriting configs and proxy
    wiring that name the port, so callers do not share ports at all. The range below the
    kernel's ephemeral ports (where only explicit binds land, so a restarted node can
    re-bind its port) is cut into blocks of `PORT_BLOCK`; a process takes one by holding an
    exclusive flock on `<tmpdir>/raftmq-ports/<first port>.lock` for its whole life (the
    kernel drops it when the process dies: no lock goes stale, nothing needs cleaning up)
    and hands its ports out in order, each once, wrapping around only at the block's end
    (a span that does not fit there starts at its beginning). Each port is still bound
    once before it is handed out and skipped when busy (a stranger's, or one of this
    process's long-lived clusters after a wrap); a block with no room left for a span is
    kept and another claimed. When others hold every block, the process shares the one
    its pid points at, unlocked: no worse than picking at random.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._pid = -1  # the process that claimed the block (a forked child claims anew)
        self._fds: list[int] = []  # the lock files held, open for the process's life
        self._held: list[int] = []  # first ports of the blocks claimed, the current last
        self._start: int | None = None  # first port of the block; None: no block fits
        self._next = 0  # offset in the block of the next port to hand out

    def take(self, span: int, host: str) -> int | None:
        """The first of `span` consecutive free ports of the block, never handed out
        before in this lap; None when no block fits below the ephemeral range. A block
        with no room left (this process's own clusters still hold its ports) is kept and
        another claimed."""
        if not 1 <= span <= PORT_BLOCK:
            raise ValueError(f"span must be 1..{PORT_BLOCK}, not {span}")
        with self._mutex:
            if self._pid != os.getpid():
                for fd in self._fds:  # inherited through fork: the parent's, not ours
                    os.close(fd)
                self._pid, self._fds, self._held = os.getpid(), [], []
                self._claim()
            while self._start is not None:
                for _ in range(PORT_BLOCK // span + 1):  # one lap, at most
                    if self._next + span > PORT_BLOCK:
                        self._next = 0
                    base = self._start + self._next
                    self._next += span
                    if _all_bindable(host, range(base, base + span)):
                        return base
                full = self._start
                if not self._claim():
                    end = full + PORT_BLOCK - 1
                    raise ClusterError(f"no {span} free port(s) in a row in {full}-{end}, "
                                       "and no other port block to claim")
            return None

    def _claim(self) -> bool:
        """Take a block no process holds (the first claim falls back to sharing one
        unlocked when others hold them all); False when there is none left to take."""
        first_claim = not self._held
        self._next = 0
        if first_claim:
            self._start = None
        low, high = _LOW_PORT, _ephemeral_low()
        first = -(-low // PORT_BLOCK)
        blocks = [k * PORT_BLOCK for k in range(first, high // PORT_BLOCK)]
        if not blocks:
            return False
        at = self._pid % len(blocks)
        lock_dir = Path(tempfile.gettempdir()) / _LOCK_DIR
        try:
            lock_dir.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):  # every user's processes share the dir
                lock_dir.chmod(0o1777)
        except OSError:
            pass
        for start in blocks[at:] + blocks[:at]:
            if start in self._held:
                continue
            fd = _lock(lock_dir / f"{start}.lock")
            if fd is not None:
                self._fds.append(fd)
                self._held.append(start)
                self._start = start
                return True
        if first_claim:
            self._held.append(blocks[at])
            self._start = blocks[at]
            return True
        return False


def _lock(path: Path) -> int | None:
    """An open descriptor of `path` holding its exclusive flock, or None when another
    process holds it (or the file cannot be had)."""
    try:
        try:
            fd = os.open(path, os.O_RDONLY)  # another user's file may be only readable
        except FileNotFoundError:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _all_bindable(host: str, ports: Iterable[int]) -> bool:
    socks: list[socket.socket] = []
    try:
        for port in ports:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            # as the servers bind (trio's listeners set it): a port whose last
            # connections linger in TIME_WAIT is free to listen on; one listened on is not
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


_ports = _PortBlock()


def _ephemeral_low() -> int:
    """First port of the kernel's ephemeral range (Linux; 32768 where unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def node_name(i: int) -> str:
    """A node's name in logs, certificates and `unexpected_exits`."""
    return f"n{i}"


def node_of(name: str) -> int | None:
    """The node id `node_name` gave `name` (None for the name server or anything else)."""
    digits = name[1:]
    return int(digits) if name.startswith("n") and digits.isdigit() else None


class LocalCluster:
    """Name server plus `nodes` node processes hosting `groups` 3-replica groups.

    With `hosts` (and `shards`), the nodes are the shards of `hosts` simulated machines,
    `shards` each (`broker.config.host_layout`): groups never put two replicas on one
    host, and `kill_host` takes all of a host's shards down together.

    `port_base=None` picks free ports; with a fixed `port_base` the layout is that of
    `cluster_configs` (node i at port_base+i, metrics at port_base+100+i, name server at
    port_base+76). `env` is added to the children's environment. `node_overrides` sets
    config keys: a str key applies to every node, an int key `i` maps to a dict of keys for
    node i only (e.g. `{2: {"test_mutations": ["skip-fsync"]}}`). Per-node `listen` and
    `peers` are allowed (that is how `ProxyNet.node_overrides` wires proxies), as long as
    every peers table names exactly the cluster's nodes.

    Use as a context manager, or call `start()` and `stop()`; `stop()` also runs at
    interpreter exit for clusters still running.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        *,
        nodes: int | None = None,
        groups: int = 3,
        hosts: int | None = None,
        shards: int = 1,
        port_base: int | None = None,
        fsync: str = "always",
        tick_ms: int = 100,
        env: Mapping[str, str] | None = None,
        node_overrides: Mapping[str | int, Any] | None = None,
        host: str = "127.0.0.1",
        tls: bool = False,
        credentials: Credentials | None = None,
    ) -> None:
        self.base_dir = Path(base_dir).resolve()
        if hosts is not None:
            if nodes is not None and nodes != hosts * shards:
                raise ValueError(f"nodes={nodes} does not match {hosts} hosts x {shards} shards")
            nodes = hosts * shards
        elif nodes is None:
            nodes = 3
        layout: dict[str, Any] = ({"hosts": hosts, "shards": shards} if hosts is not None
                                  else {"nodes": nodes})
        # who the harness logs in as to ask the name server (with logins on, lookups need
        # one); None: RAFTMQ_USER/RAFTMQ_PASSWORD when set, else no login
        self.credentials = credentials
        self.env = dict(env or {})
        self.host = host
        common: dict[str, Any] = {"fsync": fsync, "tick_ms": tick_ms}
        # TLS on every link: a development CA and certificates under base_dir/tls
        # (`raftmq.devtls`, made at `write_configs`); clients trust `tls_ca`
        self.tls_dir = self.base_dir / "tls" if tls else None
        self.tls_ca: Path | None = None
        self._client_ssl: ssl.SSLContext | None = None
        if self.tls_dir is not None:
            from raftmq.devtls import pki_paths

            pki = pki_paths(self.tls_dir, [NAMESRV, *(node_name(i) for i in range(1, nodes + 1))])
            self.tls_ca = pki.ca
            self._pki = pki
            for i in range(1, nodes + 1):
                cert_path, key_path = pki.pairs[node_name(i)]
                per = {"tls_cert": str(cert_path), "tls_key": str(key_path),
                       "tls_ca": str(pki.ca)}
                node_overrides = {**(node_overrides or {}),
                                  i: {**per, **dict((node_overrides or {}).get(i, {}))}}
        per_node: dict[int, dict[str, Any]] = {}
        for key, value in (node_overrides or {}).items():
            if isinstance(key, int):
                per_node[key] = dict(value)
            else:
                common[key] = value
        if (tls or common.get("authenticate")) and "cluster_secret" not in common:
            # a TLS cluster, or one with logins, has a secret of its own (the built-in
            # one is public)
            common["cluster_secret"] = secrets.token_urlsafe(24)
        unknown = sorted(set(per_node) - set(range(1, nodes + 1)))
        if unknown:
            raise ValueError(f"node_overrides for unknown node(s) {unknown} (nodes 1..{nodes})")

        validation_env = {**os.environ, **self.env}
        if port_base is None:
            ports = free_ports(2 * nodes + 1, host)
            self._namesrv_addr = f"{host}:{ports[0]}"
            configs = cluster_configs(
                self.base_dir, **layout, groups=groups, host=host,
                namesrv=[self._namesrv_addr], listen_ports=ports[1 : nodes + 1],
                metrics_ports=ports[nodes + 1 :], env=validation_env, **common,
            )
        else:
            self._namesrv_addr = f"{host}:{port_base + NAMESRV_PORT_OFFSET}"
            configs = cluster_configs(
                self.base_dir, **layout, groups=groups, host=host, port_base=port_base,
                env=validation_env, **common,
            )
        for i, extra in per_node.items():
            doc = tomllib.loads(dump_config(configs[i - 1]))
            doc.update(extra)
            configs[i - 1] = NodeConfig.from_dict(doc, env=validation_env)
        ids = sorted(c.node_id for c in configs)
        for cfg in configs:
            if sorted(cfg.peers) != ids:
                raise ValueError(
                    f"node {cfg.node_id}'s peers name nodes {sorted(cfg.peers)}; "
                    f"the cluster has nodes {ids}"
                )
        self.configs: list[NodeConfig] = configs

        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._down: set[str] = set()  # stopped on purpose: exiting is expected
        self._paused: set[str] = set()

    # ------------------------------------------------------------ layout

    @property
    def node_ids(self) -> list[int]:
        return [c.node_id for c in self.configs]

    @property
    def groups(self) -> tuple[GroupConfig, ...]:
        return self.configs[0].groups if self.configs else ()

    @property
    def namesrv_addr(self) -> str:
        return self._namesrv_addr

    def node_addr(self, i: int) -> str:
        """Where node i listens: the direct address, past any proxy."""
        return self._config(i).listen

    def client_addr(self, i: int) -> str:
        """The address node i registers for clients (its own `peers` entry): equal to
        `node_addr` unless the node is wired through a proxy."""
        return self._config(i).address

    def config_path(self, i: int) -> Path:
        return self.base_dir / f"n{i}.toml"

    def log_path(self, name: str) -> Path:
        """The log of `name` ("namesrv", "n1", ...)."""
        return self.base_dir / "logs" / f"{name}.log"

    def _config(self, i: int) -> NodeConfig:
        if not 1 <= i <= len(self.configs):
            raise ValueError(f"no node {i}: nodes are 1..{len(self.configs)}")
        return self.configs[i - 1]

    def _name(self, i: int) -> str:
        return node_name(self._config(i).node_id)

    def host_of(self, i: int) -> str:
        """The host node i runs on (`n<i>` when the cluster has no `[hosts]` table)."""
        return self._config(i).host

    @property
    def hosts(self) -> dict[str, list[int]]:
        """Every host and the nodes (shards) it runs, in node order."""
        out: dict[str, list[int]] = {}
        for i in self.node_ids:
            out.setdefault(self.host_of(i), []).append(i)
        return out

    def host_nodes(self, host: str) -> list[int]:
        """The shards of `host`."""
        try:
            return self.hosts[host]
        except KeyError:
            raise ValueError(f"no host {host!r}: hosts are {sorted(self.hosts)}") from None

    # ------------------------------------------------------------ commands

    def namesrv_command(self) -> list[str]:
        cmd = [sys.executable, "-m", "namesrv", "--listen", self._namesrv_addr]
        if self.tls_ca is not None:
            cert, key = self._pki.pairs[NAMESRV]
            cmd += ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(self.tls_ca)]
        return cmd

    def client_ssl_context(self) -> ssl.SSLContext | None:
        """What a client of this cluster dials with: TLS trusting its CA, or None."""
        if self.tls_ca is None:
            return None
        if self._client_ssl is None:
            from transport.tls import client_context

            self._client_ssl = client_context(str(self.tls_ca))
        return self._client_ssl

    def node_command(self, i: int) -> list[str]:
        return [sys.executable, "-m", "raftmq", "node", "--config", str(self.config_path(i))]

    def child_env(self) -> dict[str, str]:
        """The children's environment: ours, unbuffered output, this source tree first on
        the import path (so children run the code the harness was imported from), `env`."""
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(_PROJECT_ROOT) + (os.pathsep + path if path else "")
        env.update(self.env)
        return env

    # ------------------------------------------------------------ lifecycle

    def write_configs(self) -> None:
        """Write `n{i}.toml` for every node.

        Refuses when the directory already holds configs of a different layout (other
        node ids or groups), because the data there belongs to that other cluster. Ports
        may differ: a restarted cluster with free ports is still the same cluster.
        """
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._check_existing_layout()
        if self.tls_dir is not None:
            from raftmq.devtls import make_dev_pki

            make_dev_pki(self.tls_dir, list(self._pki.pairs), self.host)
        for cfg in self.configs:
            cfg.data.mkdir(parents=True, exist_ok=True)
            path = self.config_path(cfg.node_id)
            tmp = path.with_suffix(".toml.tmp")
            tmp.write_text(dump_config(cfg))
            tmp.replace(path)

    def _check_existing_layout(self) -> None:
        want_nodes = sorted(self.node_ids)
        want_groups = [(g.id, sorted(g.replicas)) for g in self.groups]
        for path in sorted(self.base_dir.glob("n*.toml")):
            try:
                doc = tomllib.loads(path.read_text())
                have_nodes = sorted(int(k) for k in doc.get("peers", {}))
                have_groups = [(g["id"], sorted(g["replicas"])) for g in doc.get("groups", [])]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ClusterError(f"{path}: existing config is unreadable: {exc}") from None
            if have_nodes != want_nodes or have_groups != want_groups:
                raise ClusterError(
                    f"{self.base_dir} holds a different cluster ({path.name}: nodes "
                    f"{have_nodes}, groups {have_groups}; asked for nodes {want_nodes}, "
                    f"groups {want_groups}); use another directory"
                )

    def start(self, *, namesrv_timeout: float = 15.0) -> None:
        """Write configs, start the name server (waiting for its `ready` line), then every
        node. On any failure everything already started is stopped before re-raising."""
        try:
            self.write_configs()
            self.start_namesrv(timeout=namesrv_timeout)
            for i in self.node_ids:
                self.start_node(i)
        except BaseException:
            self.stop()
            raise

    def node_pids(self) -> list[int]:
        """Process ids of the node processes running now (not the name server)."""
        return [proc.pid for name, proc in self._procs.items()
                if name != NAMESRV and proc.poll() is None]

    def start_namesrv(self, timeout: float = 15.0) -> str:
        """Start the name server unless it runs; wait for `ready host:port`, return it."""
        proc = self._procs.get(NAMESRV)
        if proc is not None and proc.poll() is None:
            return self._namesrv_addr
        log = self.log_path(NAMESRV)
        offset = log.stat().st_size if log.exists() else 0
        proc = self._spawn(NAMESRV, self.namesrv_command())
        line = self._wait_for_line(NAMESRV, proc, offset, "ready ", timeout)
        self._namesrv_addr = line.split()[1]
        return self._namesrv_addr

    def start_node(self, i: int) -> None:
        """Start node i's process (its config must have been written)."""
        name = self._name(i)
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is None:
            raise ClusterError(f"node {i} is already running (pid {proc.pid})")
        self._spawn(name, self.node_command(i))

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = self.log_path(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            out.write(f"--- {stamp} starting: {' '.join(cmd)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.child_env(), cwd=self.base_dir, start_new_session=True,
            )
        self._procs[name] = proc
        _live_clusters.add(self)
        self._down.discard(name)
        self._paused.discard(name)
        return proc

    def _wait_for_line(
        self, name: str, proc: subprocess.Popen[bytes], offset: int, prefix: str, timeout: float
    ) -> str:
        """The first line starting with `prefix` that `name` logs after `offset`."""
        deadline = time.monotonic() + timeout
        log = self.log_path(name)
        while True:
            with log.open("rb") as f:
                f.seek(offset)
                for raw in f.read().decode(errors="replace").splitlines():
                    if raw.startswith(prefix):
                        return raw
            if proc.poll() is not None:
                self._down.add(name)
                raise ClusterError(
                    f"{name} exited with code {proc.returncode} before saying {prefix!r}:\n"
                    + self.log_tail(name)
                )
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"{name} did not say {prefix!r} within {timeout} s:\n" + self.log_tail(name)
                )
            time.sleep(_POLL)

    def log_tail(self, name: str, lines: int = 20) -> str:
        """The last lines of `name`'s log, for error messages."""
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------ faults

    def _signal(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        # only while unreaped: after wait() the pid (and group id) may belong to a stranger
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

    def _terminate(self, name: str, sig: int, timeout: float) -> None:
        proc = self._procs.get(name)
        self._down.add(name)
        self._paused.discard(name)
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(proc, sig)
            if sig != signal.SIGKILL:
                self._signal(proc, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.wait()

    def send_signal(self, i: int, sig: int) -> None:
        """Deliver `sig` to node i's process group without waiting for anything."""
        proc = self._procs.get(self._name(i))
        if proc is not None:
            self._signal(proc, sig)

    def kill(self, i: int, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send `sig` to node i and wait until it has exited (SIGKILL after `timeout`)."""
        self._terminate(self._name(i), sig, timeout)

    def kill_together(
        self, nodes: Iterable[int], sig: int = signal.SIGKILL, timeout: float = 10.0
    ) -> None:
        """Send `sig` to every node in `nodes` before waiting for any, as one power loss
        would; then wait until all have exited (SIGKILL after `timeout`)."""
        names = [self._name(i) for i in nodes]
        self._down.update(names)  # before any signal: these exits are expected
        for name in names:
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is None:
                self._signal(proc, sig)
        for name in names:
            self._terminate(name, sig, timeout)

    def kill_host(self, host: str, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Take every shard of `host` down at once, as a machine's power loss would."""
        self.kill_together(self.host_nodes(host), sig, timeout)

    def restart_and_wait(self, i: int, timeout: float = 30.0) -> str | None:
        """Restart node i and wait for its ``ready`` line. Returns None once it is ready,
        or the end of its log when it exited first (it refused to start): that exit then
        counts as expected, not as one for `unexpected_exits`."""
        if self.is_running(i):
            self.kill(i)
        name = self._name(i)
        log = self.log_path(name)
        offset = log.stat().st_size if log.exists() else 0
        self.start_node(i)
        try:
            self._wait_for_line(name, self._procs[name], offset, "ready ", timeout)
        except ClusterError as exc:
            if self.is_running(i):
                raise  # slow, not refused: the caller's timeout was too short
            return str(exc)
        return None

    def restart(self, i: int) -> None:
        """Start node i again with the same config and data; kills it first (-9) if it
        still runs."""
        if self.is_running(i):
            self.kill(i)
        self.start_node(i)

    def pause(self, i: int) -> None:
        """SIGSTOP node i: it keeps its sockets but answers nothing, like a long GC pause."""
        name = self._name(i)
        proc = self._procs.get(name)
        if proc is None or proc.poll() is not None:
            raise ClusterError(f"node {i} is not running")
        self._signal(proc, signal.SIGSTOP)
        self._paused.add(name)

    def resume(self, i: int) -> None:
        """SIGCONT node i after `pause`."""
        name = self._name(i)
        proc = self._procs.get(name)
        if proc is not None:
            self._signal(proc, signal.SIGCONT)
        self._paused.discard(name)

    def is_running(self, i: int) -> bool:
        """Whether node i's process exists (paused counts as running)."""
        proc = self._procs.get(self._name(i))
        return proc is not None and proc.poll() is None

    def is_paused(self, i: int) -> bool:
        return self._name(i) in self._paused and self.is_running(i)

    def pid(self, i: int) -> int | None:
        proc = self._procs.get(self._name(i))
        return proc.pid if proc is not None and proc.poll() is None else None

    def pids(self) -> dict[str, int]:
        """Every child process still running, by name."""
        return {n: p.pid for n, p in self._procs.items() if p.poll() is None}

    def unexpected_exits(self) -> dict[str, int]:
        """Children that exited although nobody stopped them: name -> exit code.

        Each is reported once (it then counts as stopped)."""
        gone = {}
        for name, proc in self._procs.items():
            if name not in self._down and proc.poll() is not None:
                gone[name] = proc.returncode
                self._down.add(name)
                self._paused.discard(name)
        return gone

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every child: SIGTERM (with SIGCONT, for paused ones), wait up to `timeout`
        in total, then SIGKILL. Nodes go first so their last words reach a live name
        server. Safe to call more than once."""
        deadline = time.monotonic() + timeout
        nodes = [n for n in self._procs if n != NAMESRV]
        for batch in (nodes, [NAMESRV] if NAMESRV in self._procs else []):
            for name in batch:
                self._down.add(name)
                proc = self._procs[name]
                if proc.poll() is None:
                    self._signal(proc, signal.SIGTERM)
                    self._signal(proc, signal.SIGCONT)
            for name in batch:
                proc = self._procs[name]
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self._signal(proc, signal.SIGKILL)
                    proc.wait()
        self._paused.clear()
        _live_clusters.discard(self)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ cluster view

    def cluster_info(self, timeout: float = 5.0, *, topics: bool = True) -> dict[str, Any]:
        """The name server's CLUSTER answer: `{"nodes": {id: {...}}, "groups": {gid: {...}}}`.

        With `topics=False` groups do not list their topics (only `topic_count`), which
        keeps the answer small and quick with thousands of topics."""
        ask = {"op": int(Op.CLUSTER), **ClusterRequest(topics=topics).header()}
        header, body = request(self._namesrv_addr, ask,
                               timeout=timeout, ssl_context=self.client_ssl_context(),
                               credentials=self.credentials or credentials_from_env())
        info = {k: v for k, v in header.items() if k not in ("id", "code")}
        if topics:
            merge_cluster_topics(info, body)
        return info

    def leaders(self, timeout: float = 5.0) -> dict[str, int | None]:
        """Group -> leader node id according to the name server (None: no leader known)."""
        return leaders_by_group(self.cluster_info(timeout, topics=False), self.groups)

    def _is_alive(self, node: object) -> bool:
        return (
            isinstance(node, int)
            and node in self.node_ids
            and self.is_running(node)
            and not self.is_paused(node)
        )

    def _readiness_problem(self, info: Mapping[str, Any]) -> str | None:
        registered = {_as_int(n) for n in (info.get("nodes") or {})}
        for gid, leader in leaders_by_group(info, self.groups).items():
            if leader is None:
                return f"group {gid} has no leader"
            if not self._is_alive(leader):
                return f"group {gid} names leader {leader}, which is not running"
            if leader not in registered:
                return f"group {gid} names leader {leader}, which is not registered"
        return None

    def wait_preferred_leaders(self, timeout: float = 30.0) -> float:
        """Block until every group is led by its preferred leader, running; seconds it took.

        Benchmarks and tests that assume a steady state wait for this, so the hand-back
        that follows a start or a restart does not land in the middle of what they measure.
        Raises TimeoutError naming the leaders last seen.
        """
        # a group without a preferred leader has no hand-back to wait for
        want = {g.id: g.preferred_leader for g in self.groups if g.preferred_leader is not None}
        t0 = time.monotonic()
        last: dict[str, int | None] = {}
        while True:
            try:
                last = self.leaders(timeout=2.0)
            except (OSError, RequestError):
                pass
            else:
                if all(last.get(g) == n and self.is_running(n) for g, n in want.items()):
                    return time.monotonic() - t0
            if time.monotonic() - t0 >= timeout:
                raise TimeoutError(f"preferred leaders {want} not back after {timeout} s: {last}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 30.0, *, raise_on_exit: bool = True) -> dict[str, int]:
        """Block until every group has a leader that is registered, running and not paused;
        returns the leaders. Raises `ClusterError` at once when a child exits unexpectedly
        and `TimeoutError` (saying what is missing) after `timeout` seconds.

        With `raise_on_exit=False` an unexpected exit is neither raised nor consumed: it
        stays for `unexpected_exits()`, so a nemesis waiting for the cluster to recover
        does not hide a crash from the harness."""
        deadline = time.monotonic() + timeout
        problem = "no answer from the name server yet"
        while True:
            gone = self.unexpected_exits() if raise_on_exit else {}
            if gone:
                name, code = next(iter(gone.items()))
                raise ClusterError(f"{name} exited with code {code}:\n" + self.log_tail(name))
            left = deadline - time.monotonic()
            try:
                info = self.cluster_info(timeout=max(0.1, min(2.0, left)), topics=False)
            except (OSError, RequestError) as exc:
                problem = f"name server {self._namesrv_addr}: {exc}"
            else:
                found = self._readiness_problem(info)
                if found is None:
                    return {g: n for g, n in leaders_by_group(info, self.groups).items() if n is not None}
                problem = found
            if time.monotonic() >= deadline:
                raise TimeoutError(f"cluster not ready after {timeout} s: {problem}")
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _as_int(v: object) -> object:
    if isinstance(v, str) and v.isdigit():
        return int(v)
    return v


def leaders_by_group(
    info: Mapping[str, Any], groups: Sequence[GroupConfig]
) -> dict[str, int | None]:
    """Group -> leader node id from a CLUSTER answer, covering the configured groups too."""
    out: dict[str, int | None] = {g.id: None for g in groups}
    for gid, g in (info.get("groups") or {}).items():
        leader = _as_int(g.get("leader")) if isinstance(g, Mapping) else None
        out[gid] = leader if isinstance(leader, int) and not isinstance(leader, bool) else None
    return out


# Clusters with children are kept here (strongly: a forgotten cluster must not take its
# processes' handles with it) and stopped at interpreter exit, so a test that dies
# half-way does not leave nodes holding ports for the next run.
_live_clusters: set[LocalCluster] = set()


@atexit.register
def _stop_all() -> None:
    for cluster in list(_live_clusters):
        cluster.stop(timeout=5.0)
