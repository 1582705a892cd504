"""What every peer shares: the load generator, process groups, ports, readiness, results.

The load design is the one `bench.produce` uses: a few warm-up sends, then `messages`
sends of `size` bytes with at most `in_flight` awaiting their acknowledgement; a message's
latency runs from the moment it is handed to the client to the moment its ack arrives;
throughput is acknowledged messages over the measured wall time.
"""

from __future__ import annotations

import abc
import asyncio
import gc
import importlib.util
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar

# The same percentiles and GC handling as our own benchmark, so columns compare like for like.
from bench.common import freeze_gc, latency_ms
from raftmq.localcluster import free_ports  # below the ephemeral range: restarts can re-bind

__all__ = [
    "WARMUP", "LoadSpec", "LoadStats", "Peer", "PeerError", "Procs", "drive", "find_binary",
    "free_ports", "http_json", "install_hint", "run_peer", "wait_until",
]

T = TypeVar("T")

WARMUP = 10
#: Debian puts daemons in sbin, which a non-root PATH often lacks.
EXTRA_BIN_DIRS: tuple[str, ...] = ("/usr/sbin", "/sbin", "/usr/local/sbin")


class PeerError(RuntimeError):
    """A peer cluster could not be started or driven; the message says why."""


@dataclass(frozen=True)
class LoadSpec:
    messages: int
    size: int
    in_flight: int
    startup_timeout: float = 90.0
    load_timeout: float = 600.0


@dataclass
class LoadStats:
    """Raw outcome of one load run; `summarize` turns it into the figures of a row."""

    errors: int = 0
    first_error: str | None = None
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    timed_out: bool = False
    #: what this run observed that a reader of the figures should know
    notes: list[str] = field(default_factory=list)

    @property
    def acknowledged(self) -> int:
        return len(self.latencies)

    def record_error(self, exc: BaseException | str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = exc if isinstance(exc, str) else repr(exc)


# --------------------------------------------------------------------------- load generator

async def drive(send: Callable[[bytes], Awaitable[object]], spec: LoadSpec) -> LoadStats:
    """Keep `spec.in_flight` sends awaiting their ack until `spec.messages` were sent.

    One coroutine per window slot, each awaiting one acknowledgement at a time, is the
    cheapest way to hold a fixed window with clients whose API is "await one publish".
    """
    payload = b"x" * spec.size
    stats = LoadStats()
    for _ in range(WARMUP):  # learn routes, open connections, fail fast if nothing acks
        await send(payload)
    remaining = spec.messages
    latencies = stats.latencies

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            try:
                await send(payload)
            except Exception as exc:  # counted, reported; the run goes on like ours does
                stats.record_error(exc)
            else:
                latencies.append(time.perf_counter() - t0)

    freeze_gc()
    t_start = time.perf_counter()
    workers = [asyncio.create_task(worker()) for _ in range(max(1, min(spec.in_flight,
                                                                       spec.messages)))]
    try:
        async with asyncio.timeout(spec.load_timeout):
            await asyncio.gather(*workers)
    except TimeoutError:
        stats.timed_out = True
        stats.record_error(f"load did not finish within {spec.load_timeout:.0f} s")
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        stats.seconds = time.perf_counter() - t_start
        gc.unfreeze()  # the next peer runs in this process: let this run's garbage go
    return stats


def summarize(stats: LoadStats, spec: LoadSpec) -> dict[str, Any]:
    """The figures every row has, computed the way bench.produce computes ours."""
    lat = latency_ms(stats.latencies)
    per_s = 1 / stats.seconds if stats.seconds > 0 else 0.0
    return {
        "messages": spec.messages,
        "size_bytes": spec.size,
        "in_flight": spec.in_flight,
        "acknowledged": stats.acknowledged,
        "errors": stats.errors,
        "first_error": stats.first_error,
        "seconds": round(stats.seconds, 3),
        "msgs_per_s": round(stats.acknowledged * per_s, 1),
        "mb_per_s": round(stats.acknowledged * spec.size * per_s / 1e6, 2),
        "p50_ms": lat["p50"],
        "p99_ms": lat["p99"],
        "p999_ms": lat["p999"],
    }


# --------------------------------------------------------------------------- processes

class Procs:
    """Every process a peer starts, each the leader of its own process group.

    Servers fork helpers (Erlang's epmd and port programs, for one), so stopping means
    signalling the whole group, first TERM for a clean shutdown, then KILL. Used as a
    context manager, it stops everything on normal exit, on errors and on Ctrl-C alike.
    A process in its own session also does not receive the terminal's Ctrl-C itself, so
    it is stopped by us, in order, rather than racing our cleanup.
    """

    def __init__(self, logdir: Path, grace: float = 20.0) -> None:
        self.logdir = logdir
        self.grace = grace
        self.started: dict[str, subprocess.Popen[bytes]] = {}
        self._stop_last: set[str] = set()
        self._logs: list[IO[bytes]] = []

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_path(self, name: str) -> Path:
        return self.logdir / f"{name}.log"

    def start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None,
              cwd: Path | None = None, stop_last: bool = False) -> subprocess.Popen[bytes]:
        """Start a long-running process; its output goes to `<logdir>/<name>.log`.

        `stop_last`: a service the others need while they shut down (Erlang's epmd), stopped
        once they are gone.
        """
        if name in self.started:
            raise ValueError(f"process {name!r} already started")
        log = open(self.log_path(name), "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)
        self.started[name] = proc
        if stop_last:
            self._stop_last.add(name)
        return proc

    def run(self, argv: list[str], *, env: dict[str, str] | None = None,
            cwd: Path | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a short command (an admin CLI) in its own group; its group dies with it."""
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd, text=True,
                                start_new_session=True)
        out = f"(timed out after {timeout:.0f} s)"
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _killpg(proc.pid, signal.SIGKILL)  # on timeout, Ctrl-C, or helpers left behind
            proc.wait()
        return subprocess.CompletedProcess(argv, proc.returncode, out, None)

    def check_alive(self) -> None:
        """Fail fast, with the log, when a server died while we wait for it."""
        for name, proc in self.started.items():
            if proc.poll() is not None:
                raise PeerError(f"{name} exited with status {proc.returncode}\n"
                                + self.tail(name))

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.log_path(name).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  {name}| {line}" for line in text[-lines:])

    def tails(self, lines: int = 8) -> str:
        return "\n".join(t for name in self.started if (t := self.tail(name, lines)))

    def stop(self, grace: float | None = None) -> None:
        """TERM every group, wait up to `grace` s, then KILL whatever remains of them.

        The `stop_last` services go in a second round, after the others have exited.
        """
        grace = self.grace if grace is None else grace
        first = [p for n, p in self.started.items() if n not in self._stop_last]
        last = [p for n, p in self.started.items() if n in self._stop_last]
        try:
            for wave in (first, last):
                for proc in wave:
                    _killpg(proc.pid, signal.SIGTERM)
                deadline = time.monotonic() + grace
                for proc in wave:
                    try:
                        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        _killpg(proc.pid, signal.SIGKILL)
        finally:
            for proc in first + last:
                _killpg(proc.pid, signal.SIGKILL)  # also children that outlived the leader
                if proc.poll() is None:
                    proc.wait()
            for log in self._logs:
                log.close()
            self._logs.clear()
            self.started.clear()
            self._stop_last.clear()


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_until(probe: Callable[[], T | None], *, timeout: float, what: str,
               procs: Procs | None = None, interval: float = 0.2) -> T:
    """Poll `probe` until it returns a value; raise a PeerError saying what never came up.

    Exceptions from the probe count as "not yet" and the last one is quoted in the error,
    as is the tail of every server's log.
    """
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        if procs is not None:
            procs.check_alive()
        try:
            value = probe()
        except Exception as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if value is not None:
                return value
            last = "not ready"
        if time.monotonic() >= deadline:
            logs = procs.tails() if procs is not None else ""
            raise PeerError(f"{what}: not ready after {timeout:.0f} s (last: {last})"
                            + (f"\n{logs}" if logs else ""))
        time.sleep(interval)


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 2.0) -> Any:
    """GET (or POST `body` as JSON) and decode the JSON answer; used for health probes."""
    import json

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


# --------------------------------------------------------------------------- installs

def find_binary(name: str, first_dirs: tuple[str, ...] = ()) -> str | None:
    """`name` in `first_dirs`, else on PATH or in sbin, where Debian installs daemons.

    `first_dirs` come first because a package may put a wrapper on PATH that does more than
    we want (Debian's /usr/sbin/rabbitmq-server switches to the rabbitmq user).
    """
    path = os.pathsep.join([*first_dirs, os.environ.get("PATH", ""), *EXTRA_BIN_DIRS])
    return shutil.which(name, path=path)


def _sudo() -> str:
    return "" if os.geteuid() == 0 else "sudo "


def install_hint(debian_packages: tuple[str, ...] = (), pip_packages: tuple[str, ...] = ()) -> str:
    """The exact command that installs what is missing, for this user and this interpreter."""
    cmds = []
    if debian_packages:
        s = _sudo()
        cmds.append(f"{s}apt-get update && {s}apt-get install -y {' '.join(debian_packages)}")
    if pip_packages:
        pip = [shlex.quote(sys.executable), "-m", "pip", "install",
               *map(shlex.quote, pip_packages)]
        cmds.append(" ".join(pip))
    return " && ".join(cmds)


# --------------------------------------------------------------------------- peers

class Peer(abc.ABC):
    """One peer system: start a cluster, drive it, describe it. Subclasses fill the labels.

    `start` starts the servers through `procs` (which stops them) and returns whatever
    `load` needs to reach them; `load` runs the measured load and closes its clients.
    """

    name: ClassVar[str]
    system: ClassVar[str]
    #: short label for the table: does an ack wait for an fsync, and on how many nodes
    durability: ClassVar[str]
    #: the same in a sentence, printed under the table and kept in the JSON
    durability_detail: ClassVar[str]
    notes: ClassVar[str] = ""
    nodes: ClassVar[int] = 3
    #: seconds between TERM and KILL when stopping; the data is thrown away either way
    stop_grace: ClassVar[float] = 20.0
    #: (binary name, directories to look in before PATH)
    binaries: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = ()
    debian_packages: ClassVar[tuple[str, ...]] = ()
    python_modules: ClassVar[tuple[str, ...]] = ()
    pip_packages: ClassVar[tuple[str, ...]] = ()

    def missing(self) -> dict[str, Any] | None:
        """Why this peer cannot run here, and how to fix that; None when it can."""
        lacking_bins = [b for b, dirs in self.binaries if find_binary(b, dirs) is None]
        lacking_mods = [m for m in self.python_modules if importlib.util.find_spec(m) is None]
        if not lacking_bins and not lacking_mods:
            return None
        reasons = []
        if lacking_bins:
            reasons.append(f"server binary not found: {', '.join(lacking_bins)}")
        if lacking_mods:
            reasons.append(f"Python client not installed: {', '.join(lacking_mods)}")
        return {
            "reason": "; ".join(reasons),
            "install": install_hint(self.debian_packages if lacking_bins else (),
                                    self.pip_packages if lacking_mods else ()),
        }

    def binary(self, name: str) -> str:
        for b, dirs in self.binaries:
            if b == name and (found := find_binary(b, dirs)):
                return found
        raise PeerError(f"{name} not found; install with: {install_hint(self.debian_packages)}")

    def version(self) -> str:
        return ""

    @abc.abstractmethod
    def start(self, workdir: Path, procs: Procs, spec: LoadSpec) -> Any:
        """Start the cluster under `workdir`, wait until it serves; return its handle."""

    @abc.abstractmethod
    def load(self, cluster: Any, spec: LoadSpec) -> LoadStats:
        """Run the measured load against a started cluster."""

    def describe(self) -> dict[str, Any]:
        return {"peer": self.name, "system": self.system, "nodes": self.nodes,
                "durability": self.durability, "durability_detail": self.durability_detail,
                "notes": self.notes}


@contextmanager
def _workdir(name: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"raftmq-peer-{name}-") as tmp:
        yield Path(tmp)


def run_peer(peer: Peer, spec: LoadSpec) -> dict[str, Any]:
    """Start, load, stop one peer; a row for the table whatever happens (ok/skipped/error).

    Ctrl-C is not an error: it propagates, after the processes are stopped.
    """
    row = peer.describe()
    lacking = peer.missing()
    if lacking is not None:
        row.update(status="skipped", **lacking)
        return row
    try:
        row["version"] = peer.version()
    except Exception:
        row["version"] = ""
    try:
        with _workdir(peer.name) as workdir, Procs(workdir, peer.stop_grace) as procs:
            cluster = peer.start(workdir, procs, spec)
            stats = peer.load(cluster, spec)
    except PeerError as exc:
        row.update(status="error", error=str(exc))
        return row
    except Exception as exc:
        row.update(status="error", error=f"{type(exc).__name__}: {exc}",
                   traceback=traceback.format_exc(limit=6))
        return row
    row.update(summarize(stats, spec))
    row["notes"] = "; ".join(n for n in [row["notes"], *stats.notes] if n)
    row["status"] = "ok" if stats.acknowledged and not stats.timed_out else "error"
    if row["status"] == "error":
        row["error"] = stats.first_error or "nothing was acknowledged"
    return row
