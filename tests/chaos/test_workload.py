"""The chaos workload against a real 3-node cluster, analysed as `raftmq chaos run` does.

Two short runs: one without faults, and one where the node leading a group is killed -9
part-way through and restarted. Both must come out valid: nothing lost, no idempotent
duplicate, every queue and every committed consumer offset linearizable, every queue
drained. Op rates, outcomes, checker time and the unavailability after the kill are
printed as figures (`-s` shows them).
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from chaos.analysis import Analysis, analyze
from chaos.recorder import Recorder
from chaos.workload import ADMIN, IDEMPOTENT, OFFSETS, PLAIN, READER, Workload
from raftmq.client import RequestError
from raftmq.localcluster import LocalCluster
from tests.live_cluster import wait_balanced

pytestmark = pytest.mark.live


TOPIC = "chaos"
QUEUES = 6
RUN_SECONDS = 15.0
READY_TIMEOUT = 60.0
DRAIN_TIMEOUT = 60.0
CHECK_TIMEOUT = 120.0

Nemesis = Callable[[LocalCluster, Recorder, random.Random], Awaitable[None]]


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "cluster", port_base=None)
    c.start()
    try:
        c.wait_ready(timeout=READY_TIMEOUT)
        yield c
    finally:
        c.stop()


def _figure(name: str, value: object) -> None:
    print(f"[figure] {name}: {value}")


async def _run(
    cluster: LocalCluster, history: Path, seed: int, nemesis: Nemesis | None = None
) -> tuple[Workload, Analysis, bool]:
    """Set up the topic, run workload and nemesis side by side, drain, analyse."""
    ns = cluster.namesrv_addr
    with Recorder(history) as rec:
        workload = Workload(
            ns, TOPIC, QUEUES, producers=2, idempotent_producers=2, readers=2,
            recorder=rec, seed=seed,
        )
        groups = await workload.setup()  # creates the topic
        stop_at = time.monotonic() + RUN_SECONDS
        async with anyio.create_task_group() as tg:
            tg.start_soon(workload.run, stop_at)
            if nemesis is not None:
                tg.start_soon(nemesis, cluster, rec, random.Random(seed))
        stats = workload.stats()
        drained = await workload.drain(DRAIN_TIMEOUT)
    analysis = await anyio.to_thread.run_sync(
        lambda: analyze(history, queue_groups=groups, check_timeout=CHECK_TIMEOUT)
    )
    for key in ("seconds", "append_per_second", "read_per_second", "counts", "processes"):
        _figure(f"workload {key}", stats.get(key))
    r = analysis.results
    _figure("operations", r["operations"])
    _figure("checker seconds", r["checker_seconds"])
    _figure("node exits nobody caused", cluster.unexpected_exits())
    _figure("recovered / unread / plain duplicates",
            (r["recovered"], r["unread"], r["duplicated_plain"]))
    return workload, analysis, drained


def _assert_valid(workload: Workload, analysis: Analysis, drained: bool) -> None:
    r = analysis.results
    assert r["problems"] == [], r["examples"]
    assert analysis.verdict == "valid", r["linearizability"]
    assert r["lost"] == 0 and r["duplicated"] == 0 and r["unexpected"] == 0
    queues = {f"{TOPIC}/{q}" for q in range(QUEUES)}
    assert set(r["linearizable"]) == queues
    assert set(r["linearizable"].values()) == {True}
    assert drained and workload.drained == dict.fromkeys(sorted(queues), True)
    assert all(r["drained"][q] for q in queues)
    assert set(workload.queue_groups) == queues
    assert len(workload.process_ids(PLAIN)) == 2 * workload.workers
    assert len(workload.process_ids(IDEMPOTENT)) == 2 * workload.workers
    assert len(workload.process_ids(READER)) == 2
    for f in ("append", "read", "commit", "read-offset"):
        assert r["operations"][f]["ok"] > 20, r["operations"]
    assert r["offsets_linearizable"]
    assert set(r["offsets_linearizable"].values()) == {True}
    assert len(workload.process_ids(OFFSETS)) == workload.offset_clients


@pytest.mark.anyio
async def test_fault_free_run_is_valid(cluster: LocalCluster, tmp_path: Path) -> None:
    # Right after start the preferred leaders take their groups over; a send cut off by
    # such a move may be stored twice by a plain producer. Start once that is over.
    await anyio.to_thread.run_sync(wait_balanced, cluster)
    workload, analysis, drained = await _run(cluster, tmp_path / "history.jsonl", seed=1)
    _assert_valid(workload, analysis, drained)
    r = analysis.results
    assert r["faults"] == {} and r["longest_unavailability"] is None
    assert await workload.setup() == workload.queue_groups  # the topic exists: fine


def _leaders(cluster: LocalCluster) -> dict[str, int | None]:
    deadline = time.monotonic() + 10
    while True:
        try:
            return cluster.leaders(timeout=2.0)
        except (OSError, RequestError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def _kill_a_leader(cluster: LocalCluster, rec: Recorder, rng: random.Random) -> None:
    """kill -9 the node leading the first group a third into the run; restart it 3 s later."""
    await anyio.sleep(RUN_SECONDS / 3)
    leaders = await anyio.to_thread.run_sync(_leaders, cluster)
    victim = leaders["g0"]
    assert victim is not None
    led = {g: n for g, n in leaders.items() if n == victim}
    rec.fault_start("kill", {"nodes": [victim], "leaders": led})
    await anyio.to_thread.run_sync(cluster.kill, victim, signal.SIGKILL)
    await anyio.sleep(3.0)
    await anyio.to_thread.run_sync(cluster.restart, victim)
    rec.fault_end("kill", {"nodes": [victim], "leaders": led})


@pytest.mark.anyio
async def test_run_with_a_leader_killed_is_valid(cluster: LocalCluster, tmp_path: Path) -> None:
    workload, analysis, drained = await _run(
        cluster, tmp_path / "history.jsonl", seed=2, nemesis=_kill_a_leader
    )
    _assert_valid(workload, analysis, drained)
    r = analysis.results
    assert r["faults"] == {"kill": 1}
    (kill,) = r["unavailability"]
    assert kill["recovered"] and "g0" in kill["groups"]
    _figure("unavailability after the kill (s)", kill["groups"])
    assert r["longest_unavailability"] is not None and r["longest_unavailability"] < 15.0
    report: Any = analysis.write_report(tmp_path / "report.html")
    assert "Faults" in report.read_text()


def test_a_topic_write_of_unknown_outcome_moves_the_admin_on_to_a_new_topic(
    tmp_path: Path,
) -> None:
    """An admin write whose outcome is unknown stays open to the end of the history; the
    admin goes on with a topic of a new name, so that open writes do not pile up on one
    key (the checker's cost grows with each one open beside a key's later operations)."""

    class _NoAnswer:  # a node that never answers: every write's outcome is unknown
        class routes:  # noqa: N801 - stands where `Admin.routes` is
            @staticmethod
            async def call_group(*_args: Any, **_kwargs: Any) -> None:
                raise TimeoutError("no answer")

    history = tmp_path / "history.jsonl"
    with Recorder(history) as rec:
        workload = Workload("127.0.0.1:1", TOPIC, QUEUES, recorder=rec)
        client = workload._new_process(ADMIN)
        for f, queues in (("create", 1), ("delete", None)):
            anyio.run(workload.topic_write, _NoAnswer, client, "g0", f, queues)
    assert workload.admin_topic == f"{TOPIC}-admin2"
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    keys = [(e["type"], e["key"]) for e in lines]
    assert keys == [("invoke", f"topic:{TOPIC}-admin"), ("info", f"topic:{TOPIC}-admin"),
                    ("invoke", f"topic:{TOPIC}-admin1"), ("info", f"topic:{TOPIC}-admin1")]
