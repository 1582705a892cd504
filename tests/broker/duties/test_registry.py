"""Duties are started and stopped by leadership: each registered duty of a group runs on
the node that leads it, once that node is ready, and is cancelled there when leadership
moves. Three replicas of one group as real GroupRuntimes (`tests.runtime_harness`), a
`LeaderDuties` beside each as a node keeps one; leadership is moved by transfer."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from broker.config import GroupConfig, NodeConfig
from broker.duties import registry
from broker.duties.base import Duty
from broker.duties.registry import DUTIES, LeaderDuties
from broker.duties.retention import Retention
from broker.duties.transactions import TxTasks
from broker.runtime.groups import GroupRegistry
from broker.state.statemachine import BrokerState
from tests.runtime_harness import Group

REPLICAS = (1, 2, 3)


class _Probe(Duty):
    """Records where it ran and whether it was cancelled there; `failures` times it
    raises first (the registry restarts it)."""

    name = "probe"
    failures = 0

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self.events: list[tuple[str, str, bool]] = []  # (event, gid, ready at the time)
        self.served = False
        self._failed = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        self.served = True
        task_status.started()

    async def run(self, gid: str) -> None:
        g = self.host.registry[gid]
        self.events.append(("start", gid, g.is_ready))
        if self._failed < self.failures:
            self._failed += 1
            raise RuntimeError("a duty's bug")
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.events.append(("cancelled", gid, g.is_leader))
            raise


class _Flaky(_Probe):
    name = "flaky"
    failures = 1


def _host(tmp: Path, i: int, rt: Any) -> SimpleNamespace:
    """What a node gives its duties, for replica `i` hosting group "g" as `rt`."""
    config = NodeConfig(node_id=i, listen="127.0.0.1:0", data=tmp / f"n{i}",
                        peers={n: "127.0.0.1:0" for n in REPLICAS},
                        groups=(GroupConfig("g", REPLICAS, None),))
    return SimpleNamespace(config=config, node_id=i, registry=GroupRegistry({"g": rt}, {}),
                           rpc=None, tx_service=None, guard=None)


def _replicas(tmp: Path) -> Group[BrokerState]:
    return Group(tmp, lambda: BrokerState("g"))


async def _wait(cond: Any, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.01)


@pytest.fixture(autouse=True)
def _quick_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    # the harness's runtimes have no role-change hook: the periodic look finds changes
    monkeypatch.setattr(registry, "RECHECK_S", 0.02)
    monkeypatch.setattr(registry, "RESTART_PAUSE_S", 0.02)


def test_transactions_and_retention_are_the_registered_duties() -> None:
    assert TxTasks in DUTIES and Retention in DUTIES
    assert len({d.name for d in DUTIES}) == len(DUTIES)


def test_every_registered_duty_runs_where_the_group_is_led_and_moves_with_it(
        tmp_path: Path) -> None:
    names = frozenset(d.name for d in DUTIES)

    async def main() -> None:
        r = _replicas(tmp_path)
        async with trio.open_nursery() as n:
            duties: dict[int, LeaderDuties] = {}
            for i in REPLICAS:
                await r.start(n, i)
                duties[i] = LeaderDuties(_host(tmp_path, i, r.runtimes[i]))  # type: ignore[arg-type]
                await n.start(duties[i].run)
            leader = await r.leader()
            await _wait(lambda: duties[leader.node_id].running("g") == names)
            assert all(not duties[i].running("g") for i in REPLICAS if i != leader.node_id)
            assert isinstance(duties[leader.node_id].duty(TxTasks), TxTasks)

            to = next(i for i in REPLICAS if i != leader.node_id)
            leader.transfer_leadership(to)
            await _wait(lambda: r.runtimes[to].is_leader)
            await _wait(lambda: duties[to].running("g") == names)
            await _wait(lambda: not duties[leader.node_id].running("g"))
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_duty_starts_once_ready_is_cancelled_on_losing_leadership_and_restarts_after_a_bug(
        tmp_path: Path) -> None:
    async def main() -> None:
        r = _replicas(tmp_path)
        async with trio.open_nursery() as n:
            duties: dict[int, LeaderDuties] = {}
            for i in REPLICAS:
                await r.start(n, i)
                duties[i] = LeaderDuties(_host(tmp_path, i, r.runtimes[i]),  # type: ignore[arg-type]
                                         (_Probe, _Flaky))
                await n.start(duties[i].run)
            assert all(duties[i].duty(_Probe).served for i in REPLICAS)
            first = await r.leader()
            probe = duties[first.node_id].duty(_Probe)
            flaky = duties[first.node_id].duty(_Flaky)
            await _wait(lambda: duties[first.node_id].running("g") == {"probe", "flaky"})
            await _wait(lambda: bool(probe.events))  # counted as running before it starts
            assert probe.events == [("start", "g", True)]  # ready: nothing committed missing
            await _wait(lambda: len(flaky.events) == 2)  # failed once, started again
            assert flaky.events == [("start", "g", True), ("start", "g", True)]
            for i in REPLICAS:
                if i != first.node_id:
                    assert duties[i].duty(_Probe).events == []

            to = next(i for i in REPLICAS if i != first.node_id)
            first.transfer_leadership(to)
            await _wait(lambda: duties[to].running("g") == {"probe", "flaky"})
            await _wait(lambda: not duties[first.node_id].running("g"))
            await _wait(lambda: bool(duties[to].duty(_Probe).events))
            # cancelled on the old leader once it no longer led
            assert probe.events == [("start", "g", True), ("cancelled", "g", False)]
            assert duties[to].duty(_Probe).events == [("start", "g", True)]
            n.cancel_scope.cancel()

    trio.run(main)


def test_duties_need_distinct_names(tmp_path: Path) -> None:
    class Twin(_Probe):
        pass

    with pytest.raises(TypeError, match="distinct names"):
        LeaderDuties(_host(tmp_path, 1, None), (_Probe, Twin))  # type: ignore[arg-type]
