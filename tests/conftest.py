"""Shared fixtures and helpers for tests that run real node processes.

Every test that starts processes carries the `live` marker (`pytest -m "not live"` is the
quick unit tier); a test without it that starts one fails, naming the marker. Tests marked
`slow` or `chaos` run only when the `-m` expression names that marker (`pytest -m chaos`),
so `-m "not live"` does not bring them in. The cluster family:

* `live_cluster(base, ...)`: a started `LocalCluster` (a context manager) whose groups are
  led by their preferred leaders, so the hand-back after a start does not land mid-test;
* `proxied_cluster(base, ...)`: the same wired through fault proxies (`chaos.proxy.ProxyNet`)
  run by a trio loop in a background thread, so a plain test can cut Raft links;
* `steady_leaders(cluster)`: what `live_cluster` waits for, for a cluster started otherwise;
* `node_status(cluster, node, group)`: a group as that node itself reports it;
* `wait_for(predicate, timeout, what)`: poll an event instead of sleeping a fixed time.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from chaos.proxy import ProxyNet
from raftmq.localcluster import LocalCluster
from transport.blocking import request
from wire.protocol import Op, RequestError

T = TypeVar("T")

READY_TIMEOUT = 60.0  # generous: other test runs may share the two cores


OPT_IN_MARKERS = ("slow", "chaos")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out `slow` and `chaos` tests unless the -m expression asks for them."""
    expr = config.getoption("markexpr") or ""
    left_out = [m for m in OPT_IN_MARKERS if m not in expr]
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (dropped if any(item.get_closest_marker(m) for m in left_out) else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(autouse=True, scope="session")
def _broadcast_offsets_in_a_temporary_directory(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Broadcast consumers keep their offsets in `~/.raftmq/offsets` by default: the
    suite keeps them out of the user's home."""
    before = os.environ.get("RAFTMQ_OFFSETS_DIR")
    os.environ["RAFTMQ_OFFSETS_DIR"] = str(tmp_path_factory.mktemp("broadcast-offsets"))
    yield
    if before is None:
        del os.environ["RAFTMQ_OFFSETS_DIR"]
    else:
        os.environ["RAFTMQ_OFFSETS_DIR"] = before


@pytest.fixture(autouse=True)
def _processes_only_in_live_tests(request: pytest.FixtureRequest,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit tier stays quick and self-contained: a test that is not marked `live`
    may not start a process."""
    if request.node.get_closest_marker("live") is not None:
        return

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.live")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `predicate` until it returns something truthy (returned); TimeoutError naming
    `what` after `timeout` seconds. The bound is a safety net, not a measurement."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(interval)


def node_status(cluster: LocalCluster, node: int, group: str) -> dict[str, Any]:
    """`group` as `node` itself reports it ({} when the node does not answer)."""
    try:
        header, _ = request(cluster.node_addr(node), {"op": int(Op.STATUS)}, timeout=2.0)
    except (OSError, RequestError):
        return {}
    return dict(header["groups"].get(group) or {})


def group_leader(cluster: LocalCluster, group: str, among: list[int] | None = None) -> int | None:
    """The node that says it leads `group` with the highest term (asked directly)."""
    best: tuple[int, int] | None = None
    for node in among or cluster.node_ids:
        st = node_status(cluster, node, group)
        if st.get("role") == "leader" and (best is None or st["term"] > best[0]):
            best = (st["term"], node)
    return None if best is None else best[1]


@contextmanager
def live_cluster(base: Path, **kwargs: Any) -> Iterator[LocalCluster]:
    """A started cluster (LocalCluster's keyword arguments; tick 50 ms unless given) whose
    groups all have a leader, and the preferred one: whoever wins the first election hands
    leadership to the preferred leader about half a second later, and a test that counts
    entries or requests must not meet that move."""
    kwargs.setdefault("tick_ms", 50)
    with LocalCluster(base, **kwargs) as cluster:
        steady_leaders(cluster)
        yield cluster


def steady_leaders(cluster: LocalCluster) -> dict[str, int]:
    """Wait until every group of a started cluster is led by its preferred leader (see
    `live_cluster`); the leaders. A test that acts on "the leader" (kills it, pauses its
    followers, sends it raw requests) takes it from here, not from `wait_ready`."""
    cluster.wait_ready(timeout=READY_TIMEOUT)
    cluster.wait_preferred_leaders(timeout=READY_TIMEOUT)
    return {g: n for g, n in cluster.leaders().items() if n is not None}


class ProxyThread:
    """A `ProxyNet` served by a trio loop of its own in a daemon thread; its fault methods
    are called in that loop (`partition`, `heal`)."""

    def __init__(self, node_ids: list[int]) -> None:
        self.net = ProxyNet(node_ids)
        self._token: trio.lowlevel.TrioToken | None = None
        self._started = threading.Event()
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="proxies")

    def _main(self) -> None:
        async def serve() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            async with trio.open_nursery() as nursery:
                await nursery.start(self.net.serve)
                self._started.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

        try:
            trio.run(serve)
        except BaseException as exc:  # reported by start()/stop()
            self._error = exc
            self._started.set()

    def start(self) -> None:
        self._thread.start()
        self._started.wait(30)
        if self._error is not None or self._token is None:
            raise RuntimeError(f"the proxies did not start: {self._error!r}")

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._token is not None
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def isolate(self, node: int) -> None:
        """Cut every Raft link of `node`; its clients still reach it."""
        others = [i for i in self.net.node_ids if i != node]
        self.call(self.net.set_partition, [frozenset({node, j}) for j in others])

    def heal(self) -> None:
        self.call(self.net.heal)

    def stop(self) -> None:
        if self._token is not None and self._stop is not None:
            try:
                self.call(self._stop.set)
            except trio.RunFinishedError:
                pass
        self._thread.join(10)


@contextmanager
def proxied_cluster(
    base: Path, *, nodes: int = 3, node_overrides: Mapping[str | int, Any] | None = None,
    **kwargs: Any,
) -> Iterator[tuple[LocalCluster, ProxyThread]]:
    """`live_cluster` with every Raft link through a fault proxy; yields (cluster, proxies).
    Clients talking to `cluster.node_addr(i)` bypass the proxies."""
    proxies = ProxyThread(list(range(1, nodes + 1)))
    proxies.start()
    try:
        overrides = proxies.net.node_overrides(node_overrides)
        with live_cluster(base, nodes=nodes, node_overrides=overrides, **kwargs) as cluster:
            yield cluster, proxies
    finally:
        proxies.stop()
