"""A cluster the harness did not start: `raftmq chaos run --cluster CONFIG`.

CONFIG (TOML) names the cluster's name server and, per node, the `chaos.agent` that runs
it::

    namesrv = "10.0.0.1:9876"
    token = "..."                 # optional: the agents' --token

    [nodes.1]
    agent = "10.0.0.1:7101"
    [nodes.2]
    agent = "10.0.0.2:7101"
    [nodes.3]
    agent = "10.0.0.3:7101"

`RemoteCluster` offers what `chaos.nemesis.Nemesis` asks of a `LocalCluster` for the
faults it can apply through agents (`REMOTE_NEMESES`: kill, pause, leader-transfer).
Faults that need the harness between the nodes (partitions go through its proxies) or at
the nodes' files (crash-unsynced, corrupt) are refused. Groups and leaders come from the
name server. Nodes are never stopped by the harness except by a fault, which `heal`
undoes; the harness stops nothing when the run ends.
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from broker.config import GroupConfig
from raftmq.localcluster import ClusterError, leaders_by_group, node_name
from transport.blocking import request
from wire.protocol import Op, RequestError
from wire.requests.namesrv import ClusterRequest

from .agent import agent_request

__all__ = ["REMOTE_NEMESES", "RemoteCluster"]

REMOTE_NEMESES = ("kill", "pause", "leader-transfer")


class RemoteCluster:
    """Nodes run by agents, found through their name server (see the module docstring)."""

    def __init__(self, namesrv: str, agents: Mapping[int, str], *,
                 token: str | None = None) -> None:
        if not agents:
            raise ValueError("a cluster needs at least one node")
        self._namesrv_addr = namesrv
        self.agents = dict(sorted(agents.items()))
        self.token = token
        self._groups: tuple[GroupConfig, ...] = ()
        self._paused: set[int] = set()
        self._running: dict[int, bool] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> RemoteCluster:
        """Read CONFIG; a malformed one raises ValueError saying what is wrong."""
        try:
            doc = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        namesrv = doc.get("namesrv")
        nodes = doc.get("nodes")
        token = doc.get("token")
        if not isinstance(namesrv, str) or ":" not in namesrv:
            raise ValueError(f"{path}: namesrv must be \"host:port\", got {namesrv!r}")
        if not isinstance(nodes, dict) or not nodes:
            raise ValueError(f"{path}: [nodes.N] tables with an agent address are required")
        if token is not None and not isinstance(token, str):
            raise ValueError(f"{path}: token must be a string")
        agents: dict[int, str] = {}
        for key, node in nodes.items():
            agent = node.get("agent") if isinstance(node, dict) else None
            if not str(key).isdigit() or not isinstance(agent, str) or ":" not in agent:
                raise ValueError(f"{path}: [nodes.{key}] needs a numeric id and "
                                 "agent = \"host:port\"")
            agents[int(key)] = agent
        return cls(namesrv, agents, token=token)

    # ------------------------------------------------------------ layout

    @property
    def node_ids(self) -> list[int]:
        return list(self.agents)

    @property
    def namesrv_addr(self) -> str:
        return self._namesrv_addr

    @property
    def groups(self) -> tuple[GroupConfig, ...]:
        """The groups the name server knows (learned by `wait_ready`)."""
        return self._groups

    def _ask(self, i: int, op: str, timeout: float = 15.0) -> dict[str, Any]:
        if i not in self.agents:
            raise ValueError(f"no node {i}: nodes are {self.node_ids}")
        try:
            answer = agent_request(self.agents[i], op, token=self.token, timeout=timeout)
        except (OSError, RuntimeError, ValueError) as exc:
            raise ClusterError(f"node {i}'s agent: {exc}") from None
        self._running[i] = bool(answer.get("running"))
        return answer

    # ------------------------------------------------------------ faults

    def kill_together(self, nodes: Iterable[int], sig: int = 9, timeout: float = 10.0) -> None:
        for i in nodes:
            self._ask(i, "kill", timeout=timeout + 5.0)
            self._paused.discard(i)

    def kill(self, i: int, sig: int = 9, timeout: float = 10.0) -> None:
        self.kill_together([i], sig, timeout)

    def restart(self, i: int) -> None:
        if self.is_running(i):
            self.kill(i)
        self._ask(i, "start")
        self._paused.discard(i)

    def pause(self, i: int) -> None:
        self._ask(i, "pause")
        self._paused.add(i)

    def resume(self, i: int) -> None:
        self._ask(i, "resume")
        self._paused.discard(i)

    def is_running(self, i: int) -> bool:
        try:
            return bool(self._ask(i, "status", timeout=5.0)["running"])
        except ClusterError:
            return False

    def is_paused(self, i: int) -> bool:
        return i in self._paused

    def unexpected_exits(self) -> dict[str, int]:
        """Nodes whose process exited although no fault stopped it (each reported once);
        an agent that cannot be reached counts as exit code -1."""
        gone: dict[str, int] = {}
        for i in self.node_ids:
            try:
                exits = self._ask(i, "status", timeout=5.0)["exits"]
            except ClusterError:
                gone[node_name(i)] = -1
                continue
            if exits:
                gone[node_name(i)] = exits[-1]
        return gone

    def stop(self, timeout: float = 10.0) -> None:
        """Nothing to stop: the nodes are the user's."""

    # ------------------------------------------------------------ cluster view

    def cluster_info(self, timeout: float = 5.0) -> dict[str, Any]:
        ask = {"op": int(Op.CLUSTER), **ClusterRequest(topics=False).header()}
        header, _body = request(self._namesrv_addr, ask, timeout=timeout)
        info = {k: v for k, v in header.items() if k not in ("id", "code")}
        groups = []
        for gid, g in sorted((info.get("groups") or {}).items()):
            replicas = g.get("replicas") if isinstance(g, Mapping) else None
            ids = sorted(int(n) for n in (replicas or {}) if str(n).isdigit())
            groups.append(GroupConfig(str(gid), tuple(ids or self.node_ids)))
        if groups:
            self._groups = tuple(groups)
        return info

    def leaders(self, timeout: float = 5.0) -> dict[str, int | None]:
        return leaders_by_group(self.cluster_info(timeout), self.groups)

    def wait_ready(self, timeout: float = 30.0, *, raise_on_exit: bool = True) -> dict[str, int]:
        """Block until the name server names a leader for every group and each leader's
        agent says it runs, unpaused; `LocalCluster.wait_ready`'s contract."""
        deadline = time.monotonic() + timeout
        problem = "no answer from the name server yet"
        while True:
            if raise_on_exit:
                gone = self.unexpected_exits()
                if gone:
                    raise ClusterError(f"nodes exited on their own: {gone}")
            try:
                leaders = self.leaders(timeout=2.0)
            except (OSError, RequestError) as exc:
                problem = f"name server {self._namesrv_addr}: {exc}"
            else:
                missing = [g for g, n in leaders.items() if n is None]
                stopped = [n for n in leaders.values() if n is not None
                           and (n in self._paused or not self._running.get(n, True))]
                if not leaders:
                    problem = "the name server knows no groups"
                elif missing:
                    problem = f"groups without a leader: {missing}"
                elif stopped:
                    problem = f"leaders not running: {stopped}"
                else:
                    return {g: n for g, n in leaders.items() if n is not None}
            if time.monotonic() >= deadline:
                raise TimeoutError(f"cluster not ready after {timeout} s: {problem}")
            time.sleep(0.1)
