"""`raftmq chaos agent`: runs one node beside it and lets a chaos run kill, restart and pause it.

A user who wants `raftmq chaos run --cluster CONFIG` to inject process faults into a
cluster the harness did not start runs one agent per node, on the node's host, in place
of the node's own command::

    raftmq chaos agent --listen 127.0.0.1:7101 -- raftmq node --config n1.toml

The agent starts the command at once (in its own process group, output to the agent's
stdout unless ``--log FILE``), keeps it running across harness runs, and answers one
JSON request per line on `--listen`:

- ``{"op": "status"}``: ``{"ok": true, "running": bool, "paused": bool, "pid": n | null,
  "exits": [codes of exits nobody asked for, since the last status]}``;
- ``{"op": "kill"}``: SIGKILL to the node's process group, answered once it has exited;
- ``{"op": "start"}``: start the command again (an error while it runs);
- ``{"op": "pause"}`` / ``{"op": "resume"}``: SIGSTOP / SIGCONT.

Every answer carries the status. With ``--token`` (or ``RAFTMQ_AGENT_TOKEN``) a request
must carry ``"token"``; without one, anyone who can reach the port can stop the node, so
the default address is loopback. On SIGTERM or SIGINT the agent stops its node (SIGTERM,
then SIGKILL after 10 s) and exits.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

__all__ = ["Agent", "agent_main", "agent_request"]

TOKEN_ENV = "RAFTMQ_AGENT_TOKEN"


class Agent:
    """The node process and what was done to it (thread-safe: requests may overlap)."""

    def __init__(self, command: list[str], log: IO[bytes] | None = None) -> None:
        if not command:
            raise ValueError("the agent needs the node's command after --")
        self.command = command
        self.log = log
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.intended = False  # the current process is being stopped on request
        self.exits: list[int] = []

    def _reap(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is not None:
            if not self.intended:
                self.exits.append(proc.returncode)
            self.proc = None
            self.paused = False

    def status(self, *, consume: bool = False) -> dict[str, Any]:
        self._reap()
        running = self.proc is not None
        out = {
            "ok": True, "running": running, "paused": running and self.paused,
            "pid": self.proc.pid if self.proc is not None else None, "exits": list(self.exits),
        }
        if consume:
            self.exits.clear()
        return out

    def start(self) -> None:
        self._reap()
        if self.proc is not None:
            raise RuntimeError(f"the node runs already (pid {self.proc.pid})")
        self.intended = False
        self.paused = False
        self.proc = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        self._reap()
        if self.proc is None:
            return
        self.intended = True
        self._signal(sig)
        if sig != signal.SIGKILL:
            self._signal(signal.SIGCONT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()
        self._reap()

    def pause(self) -> None:
        self._reap()
        if self.proc is None:
            raise RuntimeError("the node is not running")
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def handle(self, request: Any, token: str | None) -> dict[str, Any]:
        """One request's answer; errors are answers too (``"ok": false``)."""
        if not isinstance(request, dict):
            return {"ok": False, "error": "a request is a JSON object"}
        if token is not None and not hmac.compare_digest(str(request.get("token", "")), token):
            return {"ok": False, "error": "bad token"}
        op = request.get("op")
        actions = {"status": None, "kill": self.kill, "start": self.start, "pause": self.pause,
                   "resume": self.resume}
        if op not in actions:
            return {"ok": False, "error": f"unknown op {op!r} (known: {', '.join(actions)})"}
        with self.lock:
            action = actions[op]
            try:
                if action is not None:
                    action()
            except RuntimeError as exc:
                return {**self.status(), "ok": False, "error": str(exc)}
            return self.status(consume=op == "status")


def _server(agent: Agent, listen: tuple[str, int], token: str | None) -> socketserver.TCPServer:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for raw in self.rfile:
                try:
                    request = json.loads(raw)
                except json.JSONDecodeError:
                    answer: dict[str, Any] = {"ok": False, "error": "not JSON"}
                else:
                    answer = agent.handle(request, token)
                self.wfile.write(json.dumps(answer).encode() + b"\n")
                self.wfile.flush()

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    return Server(listen, Handler)


def agent_request(addr: str, op: str, *, token: str | None = None,
                  timeout: float = 15.0) -> dict[str, Any]:
    """Ask the agent at `addr` ("host:port") to do `op`; raises OSError when unreachable
    and RuntimeError when it refuses."""
    host, _, port = addr.rpartition(":")
    request: dict[str, Any] = {"op": op}
    if token is not None:
        request["token"] = token
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(json.dumps(request).encode() + b"\n")
        with sock.makefile("rb") as answers:
            line = answers.readline()
    if not line:
        raise OSError(f"agent {addr} closed the connection")
    answer: dict[str, Any] = json.loads(line)
    if not answer.get("ok"):
        raise RuntimeError(f"agent {addr}: {answer.get('error')}")
    return answer


def agent_main(argv: list[str]) -> int:
    """``raftmq chaos agent``; runs until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="raftmq chaos agent",
        description="Run one node and let `raftmq chaos run --cluster` kill, restart and "
        "pause it. Usage: raftmq chaos agent --listen HOST:PORT -- NODE COMMAND...",
    )
    parser.add_argument("--listen", default="127.0.0.1:7100", metavar="HOST:PORT")
    parser.add_argument("--log", type=Path, default=None, help="the node's output (appended)")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"required in every request (default ${TOKEN_ENV})")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code in (0, None) else 3
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    host, _, port = args.listen.rpartition(":")
    if not command or not port.isdigit():
        print("raftmq chaos agent: give --listen HOST:PORT and the node's command after --",
              file=sys.stderr)
        return 3
    log = args.log.open("ab") if args.log is not None else None
    agent = Agent(command, log)
    server = _server(agent, (host or "127.0.0.1", int(port)), args.token)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    agent.start()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print(f"ready {host or '127.0.0.1'}:{server.server_address[1]} "
          f"node pid {agent.status()['pid']}", flush=True)
    stop.wait()
    server.shutdown()
    with agent.lock:
        agent.kill(signal.SIGTERM)
    return 0
