"""`raftmq bench txn` at a tiny size on a cluster it starts itself: the shape of its JSON
result and the sanity of its values (every transaction and half message accounted for,
rates and latencies positive). How fast anything is never decides a test here."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from bench.txn import Rounds, _split
from raftmq.commands.bench import BENCHMARKS
from raftmq.commands.bench import main as bench_main


def test_messages_split_evenly_over_the_groups() -> None:
    assert _split(10, 3) == [4, 3, 3] and _split(100, 1) == [100] and _split(2, 3) == [1, 1, 0]


def test_rounds_are_shared_taken_once_each_and_failures_counted() -> None:
    taken: list[int] = []
    paced: list[int] = []

    async def step(k: int) -> None:
        taken.append(k)
        await anyio.sleep(0)  # let the other workers take theirs
        if k % 3 == 2:
            raise RuntimeError(f"round {k} fails")

    async def pace(k: int) -> None:
        paced.append(k)

    async def main() -> tuple[Rounds, Rounds]:
        shared = Rounds(10, "round")
        await shared.run(4, step)
        paced_rounds = Rounds(4, "round")
        async with anyio.create_task_group() as tg:
            tg.start_soon(paced_rounds.take, step, pace)
            tg.start_soon(paced_rounds.take, step, pace)
        return shared, paced_rounds

    shared, paced_rounds = anyio.run(main)
    assert sorted(taken[:10]) == list(range(10))  # each round once, over all workers
    assert shared.errors == 3 and len(shared.latencies) == 7  # rounds 2, 5, 8 failed
    assert all(t >= 0 for t in shared.latencies)
    assert sorted(paced) == sorted(taken[10:]) == [0, 1, 2, 3]
    assert paced_rounds.errors == 1 and len(paced_rounds.latencies) == 3


@pytest.mark.live
def test_bench_txn_reports_every_case_beside_send_batch(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert "txn" in BENCHMARKS
    code = bench_main(["txn", "--messages", "3,6", "--spans", "1,3", "--txns", "3",
                       "--producers", "2", "--halves", "4", "--concurrency", "2",
                       "--check-ms", "200", "--json"])
    result: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0, result
    assert result["benchmark"] == "txn" and result["cluster"] == "local"
    cases = {(c["messages"], c["groups"]): c for c in result["cases"]}
    assert set(cases) == {(3, 1), (3, 3), (6, 1), (6, 3)}
    for (messages, _groups), c in cases.items():
        txn, plain = c["txn"], c["send_batch"]
        assert txn["transactions"] == 3 and txn["errors"] == 0
        assert plain["rounds"] == 3 and plain["errors"] == 0
        assert txn["msgs_per_s"] == pytest.approx(txn["txn_per_s"] * messages, rel=0.01)
        assert 0 < txn["commit_latency_ms"]["p50"] <= txn["commit_latency_ms"]["p99"]
        assert txn["commit_latency_ms"]["p99"] <= txn["txn_latency_ms"]["max"]
        assert plain["msgs_per_s"] > 0 and c["vs_batch"] > 0
        half = c["txn_half_load"]  # the same case paced at half the rate it reached
        assert half["rate_txn_per_s"] == pytest.approx(txn["txn_per_s"] / 2, abs=0.1)
        assert half["transactions"] == 3 and half["errors"] == 0
    halves = result["halves"]
    assert halves["half_commit"]["errors"] == halves["plain_send"]["errors"] == 0
    assert halves["half_commit"]["msgs_per_s"] > 0 and halves["plain_send"]["msgs_per_s"] > 0
    assert "added_us_per_msg" in halves
    assert set(halves["one_at_a_time_ms"]) == {"prepare", "commit", "plain_send"}
    assert all(v["p50"] > 0 for v in halves["one_at_a_time_ms"].values())
    check = halves["half_checkback"]
    assert check["stored"] == check["delivered"] == 4 and check["checks_answered"] >= 4


def test_bad_bench_arguments_are_usage_errors() -> None:
    for argv in (["--messages", "0"], ["--spans", "x"], ["--txns", "0"]):
        with pytest.raises(SystemExit) as info:
            bench_main(["txn", *argv])
        assert info.value.code == 2
