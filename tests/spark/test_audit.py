"""`raftmq audit` on a real chaos history: its counts equal the chaos analysis' accounting.

The chaos workload (`chaos.workload.Workload`: plain and idempotent producers, a reader,
the final drain) runs against a real 3-node cluster while a group leader is killed and
restarted. The history is then altered the way a broken cluster would make it look, so
that the error counts are not all zero: one acknowledged message is renamed in its invoke
line (its stored copy becomes unexpected, the renamed one lost) and two successive
acknowledged appends of one process swap names (stored in reverse order: reordered, and
both acknowledged at offsets where they are not). The audit reads the history with Spark
and the cluster through the `raftmq` source; the accounting reads the history's own reads
(the drain covered every queue); every count of every queue must agree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio

from chaos.accounting import account_queue_history
from chaos.analysis import split_records
from chaos.histories import HistoryRecord, parse_jsonl
from chaos.recorder import Recorder
from chaos.workload import Workload
from raftmq.spark.audit import COUNTS, audit, main, write_outputs
from tests.conftest import live_cluster
from tests.spark_support import requires_java, spark

pytestmark = [pytest.mark.live, requires_java]

LOAD_SECONDS = 8.0


def run_workload(cluster: object, history: Path) -> None:
    from raftmq.localcluster import LocalCluster

    assert isinstance(cluster, LocalCluster)

    async def go() -> None:
        with Recorder(history) as rec:
            work = Workload(cluster.namesrv_addr, "chaos", 4, recorder=rec, seed=7,
                            producers=1, idempotent_producers=1, readers=1, offset_clients=0,
                            admin_clients=0, pause=0.002)
            await work.setup()
            stop_at = time.monotonic() + LOAD_SECONDS
            async with trio.open_nursery() as nursery:
                nursery.start_soon(work.run, stop_at)
                await trio.sleep(LOAD_SECONDS / 3)
                leader = cluster.leaders()["g0"]
                assert leader is not None
                rec.fault_start("kill", {"node": leader})
                await trio.to_thread.run_sync(cluster.kill, leader)
                await trio.sleep(1.0)
                await trio.to_thread.run_sync(cluster.restart_and_wait, leader)
                rec.fault_end("kill")
            assert await work.drain(90.0), work.drained

    trio.run(go)


def alter(history: Path, into: Path) -> None:
    """Rename one acknowledged message and swap two successive ones (module docstring)."""
    records = parse_jsonl(history)
    acked = [r for r in records if r.f == "append" and r.status == "ok"
             and isinstance(r.result, dict) and "offset" in r.result
             and str(r.value).startswith("i")]  # idempotent: no attempt lines to match
    by_sender: dict[tuple[object, object], list[HistoryRecord]] = {}
    for r in acked:
        by_sender.setdefault((r.process, r.key), []).append(r)
    pair = next((a, b) for rs in by_sender.values() for a, b in zip(rs, rs[1:], strict=False)
                if b.call >= a.return_ and b.result["offset"] > a.result["offset"])
    renamed = next(r for r in acked if r not in pair)
    new_value = {pair[0].line: pair[1].value, pair[1].line: pair[0].value,
                 renamed.line: f"{renamed.value}-renamed"}
    with history.open() as src, into.open("w") as out:
        for number, line in enumerate(src, start=1):
            if number in new_value:
                entry = json.loads(line)
                assert entry["type"] == "invoke"
                entry["value"] = new_value[number]
                line = json.dumps(entry) + "\n"
            out.write(line)


def chaos_counts(queue: dict) -> dict[str, int]:
    return {c: v if isinstance(v, int) else len(v) for c, v in queue.items() if c in COUNTS}


def test_the_audit_agrees_with_the_chaos_accounting_on_a_real_history(tmp_path: Path) -> None:
    with live_cluster(tmp_path / "cluster", groups=2) as cluster:
        history = tmp_path / "history.jsonl"
        run_workload(cluster, history)
        altered = tmp_path / "altered.jsonl"
        alter(history, altered)

        queue_records, _ = split_records(parse_jsonl(altered))
        accounting = account_queue_history(queue_records)
        assert all(q["drained"] for q in accounting["queues"].values())

        result = audit(spark(), str(altered), cluster.namesrv_addr)
        assert result["inputs"]["topics"] == ["chaos"]
        for key, queue in accounting["queues"].items():
            got = result["queues"].get(key, dict.fromkeys(COUNTS, 0))
            assert got == chaos_counts(queue), key
        totals = result["totals"]
        assert totals["acknowledged"] > 100
        assert totals["unexpected"] == 1 and totals["lost"] == 1
        assert totals["reordered"] >= 1 and totals["ack_mismatches"] >= 2
        assert result["valid"] is False
        for name in ("send_to_ack", "born_to_store", "ack_to_first_read"):
            assert result["latency_ms"][name]["count"] > 0, name
        assert result["faults"] and result["events_per_second"]

        js, page = write_outputs(result, tmp_path / "out")
        assert json.loads(js.read_text())["totals"] == totals
        assert "INVALID" in page.read_text() and "<svg" in page.read_text()


def test_the_command_refuses_a_missing_history(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope.jsonl"), "--namesrv", "127.0.0.1:1"]) == 3
    assert "no history file" in capsys.readouterr().err


def test_a_history_line_that_is_not_json_stops_the_audit(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    history.write_text('{"process": 0, "type": "invoke", "f": "append", "key": "t/0", '
                       '"value": "m1", "time": 1.0}\n{"process": 0, "type": "ok", "f"\n')
    with pytest.raises(Exception, match="(?i)malformed"):
        audit(spark(), str(history), "127.0.0.1:1")


@pytest.mark.slow  # a minute of Spark jobs on this 2-core machine: opt-in with -m slow
def test_the_audit_benchmark_accounts_for_every_message_it_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`raftmq bench audit` at a tiny size: the history it writes is one the audit reads
    whole (every message acknowledged and read, nothing else), and its JSON says so."""
    from bench import audit as audit_bench

    spark()  # the module's session: the benchmark's getOrCreate reuses it
    with live_cluster(tmp_path / "cluster", groups=2) as cluster:
        code = audit_bench.main(["--namesrv", cluster.namesrv_addr, "--events", "2000",
                                 "--queues", "3", "--batch", "64", "--json"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert result["events"] == 2000 and result["messages"] == 1000
    totals = result["totals"]
    assert totals["acknowledged"] == totals["read"] == totals["attempted"] == 1000
    assert all(totals[c] == 0 for c in ("lost", "duplicated", "unexpected", "reordered",
                                        "ack_mismatches"))
    assert result["valid"] is True and result["audit_s"] > 0
