"""The client commands of `raftmq` (topic, send, consume, status, bench) as a user runs
them: real subprocesses against one real cluster (name server + 3 nodes, 3 groups).

The checks are on exit codes, stderr lines and `--json` output, which is what scripts
depend on; the rich tables are only checked for not failing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftmq.commands.consume import message_json
from raftmq.commands.send import generated_body
from raftmq.localcluster import LocalCluster, free_ports
from tests.paths import REPO_ROOT as ROOT
from wire.records import Message


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cli"), nodes=3, groups=3, tick_ms=50) as c:
        c.wait_ready(timeout=30)
        yield c
        assert c.unexpected_exits() == {}


def raftmq(cluster: LocalCluster | None, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run `python -m raftmq ARGS`, finding the cluster through RAFTMQ_NAMESRV."""
    env = dict(os.environ)
    env.pop("RAFTMQ_NAMESRV", None)
    if cluster is not None:
        env["RAFTMQ_NAMESRV"] = cluster.namesrv_addr
    return subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# ------------------------------------------------------------------ topics


@pytest.mark.live
def test_topic_create_list_describe(cluster: LocalCluster) -> None:
    created = json.loads(ok(raftmq(cluster, "topic", "create", "cli-t", "--queues", "6",
                                   "--json")))
    assert created["placement"] == {"g0": [0, 3], "g1": [1, 4], "g2": [2, 5]}
    ok(raftmq(cluster, "topic", "create", "cli-t2", "--queues", "2", "--groups", "g2"))

    topics = json.loads(ok(raftmq(cluster, "topic", "list", "--json")))
    assert topics["cli-t"]["queues"] == 6
    assert topics["cli-t2"]["hosted"] == {"g2": [0, 1]}
    assert "cli-t" in ok(raftmq(cluster, "topic", "list"))

    info = json.loads(ok(raftmq(cluster, "topic", "describe", "cli-t", "--json")))
    assert info["total"] == 6
    assert [q["group"] for q in info["queues"]] == ["g0", "g1", "g2"] * 2
    assert all(q["leader"] and q["min_offset"] == 0 == q["end_offset"] for q in info["queues"])
    assert "g1" in ok(raftmq(cluster, "topic", "describe", "cli-t"))

    again = raftmq(cluster, "topic", "create", "cli-t", "--queues", "6")
    assert again.returncode == 1 and "raftmq: TOPIC_EXISTS:" in again.stderr
    ok(raftmq(cluster, "topic", "create", "cli-t", "--queues", "6", "--exist-ok"))


@pytest.mark.live
def test_topic_errors(cluster: LocalCluster) -> None:
    bad = raftmq(cluster, "topic", "create", "no spaces!")
    assert bad.returncode == 1
    assert bad.stderr.startswith("raftmq: INVALID_NAME: ")
    unknown = raftmq(cluster, "topic", "describe", "cli-missing")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("raftmq: UNKNOWN_TOPIC: ")
    group = raftmq(cluster, "topic", "create", "cli-x", "--groups", "g9")
    assert group.returncode == 1 and "UNKNOWN_GROUP" in group.stderr
    assert raftmq(cluster, "topic").returncode == 2


@pytest.mark.live
def test_usage_and_unreachable_name_server() -> None:
    assert raftmq(None, "send", "hello").returncode == 2  # --topic is required
    assert raftmq(None, "send", "--topic", "t").returncode == 2  # neither MESSAGE nor --count
    assert raftmq(None, "status", "--namesrv", "nonsense").returncode == 2
    port = free_ports(1)[0]
    down = raftmq(None, "topic", "list", "--namesrv", f"127.0.0.1:{port}")
    assert down.returncode == 1
    assert "cannot reach the name server" in down.stderr
    assert "Traceback" not in down.stderr


# ------------------------------------------------------------------ send and consume


@pytest.mark.live
def test_send_one_then_consume_it(cluster: LocalCluster) -> None:
    ok(raftmq(cluster, "topic", "create", "cli-one", "--queues", "2"))
    sent = json.loads(ok(raftmq(cluster, "send", "--topic", "cli-one", "--key", "k1",
                                "--tags", "tA", "--json", "héllo wörld")))
    assert sent["msg_id"] and sent["offset"] == 0

    got = json_lines(ok(raftmq(cluster, "consume", "--group", "cg-one", "--topic", "cli-one",
                               "--count", "1", "--json")))
    assert len(got) == 1
    first = got[0]
    assert first["msg_id"] == sent["msg_id"]
    assert (first["queue"], first["offset"]) == (sent["queue"], sent["offset"])
    assert first["body"] == "héllo wörld" and first["body_encoding"] == "utf-8"
    assert (first["key"], first["tags"]) == ("k1", "tA")
    assert first["store_ms"] > 0

    text = ok(raftmq(cluster, "send", "--topic", "cli-one", "--key", "k1", "second"))
    assert text.startswith("sent ") and f"queue {sent['queue']} offset 1" in text
    line = ok(raftmq(cluster, "consume", "--group", "cg-one", "--topic", "cli-one",
                     "--timeout", "1"))
    assert "offset=1" in line and "second" in line and "héllo" not in line


@pytest.mark.live
def test_message_lookup_by_id_and_by_key(cluster: LocalCluster) -> None:
    ok(raftmq(cluster, "topic", "create", "cli-look", "--queues", "3"))
    sent = [json.loads(ok(raftmq(cluster, "send", "--topic", "cli-look", "--key", "order-9",
                                 "--json", f"step {k}"))) for k in range(3)]
    sent.append(json.loads(ok(raftmq(cluster, "send", "--topic", "cli-look", "--key", "other",
                                     "--json", "not this one"))))
    got = json_lines(ok(raftmq(cluster, "message", "get", sent[1]["msg_id"], "--json")))
    assert [(g["msg_id"], g["body"], g["offset"]) for g in got] == [
        (sent[1]["msg_id"], "step 1", sent[1]["offset"])]
    by_key = json_lines(ok(raftmq(cluster, "message", "key", "--topic", "cli-look", "order-9",
                                  "--json")))
    assert sorted(m["body"] for m in by_key) == ["step 0", "step 1", "step 2"]
    assert {m["msg_id"] for m in by_key} == {s["msg_id"] for s in sent[:3]}
    ok(raftmq(cluster, "consume", "--group", "cg-look", "--topic", "cli-look", "--count", "2"))
    lag = json.loads(ok(raftmq(cluster, "lag", "--group", "cg-look", "--topic", "cli-look",
                               "--json")))
    assert lag["total"] == 2 and len(lag["queues"]) == 3
    assert "lag" in ok(raftmq(cluster, "lag", "--group", "cg-look", "--topic", "cli-look"))
    missing = raftmq(cluster, "message", "get", "g0:999999:8")
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    nothing = raftmq(cluster, "message", "key", "--topic", "cli-look", "no-such-key")
    assert nothing.returncode == 1 and nothing.stdout == ""


@pytest.mark.live
def test_send_many_consume_across_groups_no_loss_no_duplicates(cluster: LocalCluster) -> None:
    ok(raftmq(cluster, "topic", "create", "cli-many", "--queues", "6"))
    summary = json.loads(ok(raftmq(cluster, "send", "--topic", "cli-many", "--count", "1000",
                                   "--size", "32", "--json")))
    assert summary["acked"] == 1000 and summary["errors"] == 0

    out = ok(raftmq(cluster, "consume", "--group", "cg-many", "--topic", "cli-many",
                    "--count", "1000", "--json", "--timeout", "10"))
    msgs = json_lines(out)
    bodies = [m["body"] for m in msgs]
    assert len(bodies) == 1000 and len(set(bodies)) == 1000
    assert set(bodies) == {generated_body(i, 32).decode() for i in range(1000)}
    # round robin moves on by batch (up to 256 messages): four batches reach every group
    assert {m["msg_id"].split(":")[0] for m in msgs} == {"g0", "g1", "g2"}
    assert len({(m["queue"], m["offset"]) for m in msgs}) == 1000

    # offsets were committed: the group has nothing left
    rest = raftmq(cluster, "consume", "--group", "cg-many", "--topic", "cli-many",
                  "--json", "--timeout", "1")
    assert ok(rest).strip() == ""
    assert "0 message(s)" in rest.stderr
    # another group starts from the beginning
    other = json_lines(ok(raftmq(cluster, "consume", "--group", "cg-other", "--topic",
                                 "cli-many", "--count", "10", "--json")))
    assert len(other) == 10


@pytest.mark.live
def test_consume_unknown_topic(cluster: LocalCluster) -> None:
    proc = raftmq(cluster, "consume", "--group", "cg", "--topic", "cli-missing", "--timeout", "1")
    assert proc.returncode == 1 and proc.stderr.startswith("raftmq: UNKNOWN_TOPIC: ")


def test_message_json_binary_body() -> None:
    m = Message("t", 1, 7, b"\xff\x00", "", "", {"a": "b"}, 1, 2, "g0:3:4")
    j = message_json(m)
    assert (j["body"], j["body_encoding"]) == ("/wA=", "base64")
    assert j["properties"] == {"a": "b"}


# ------------------------------------------------------------------ status and bench


@pytest.mark.live
def test_status(cluster: LocalCluster) -> None:
    for _ in range(20):  # leadership may still be moving to the preferred leaders
        proc = raftmq(cluster, "status", "--json")
        if proc.returncode == 0:
            break
        time.sleep(0.5)
    status = json.loads(ok(proc))
    assert status["ok"] is True
    assert sorted(status["groups"]) == ["g0", "g1", "g2"]
    for g in status["groups"].values():
        assert g["leader"] in (1, 2, 3)
        assert g["leader_addr"] == cluster.node_addr(g["leader"])
        assert g["term"] >= 1 and g["commit"] >= 1
        assert sorted(g["members"]) == ["1", "2", "3"]
    assert all(n["reachable"] for n in status["nodes"].values())
    table = ok(raftmq(cluster, "status"))
    assert "g0" in table and "leader" in table


@pytest.mark.live
def test_bench_routing(cluster: LocalCluster) -> None:
    proc = raftmq(None, "bench", "produce", "--namesrv", cluster.namesrv_addr,
                  "--messages", "2000", "--json")
    result = json.loads(ok(proc).strip().splitlines()[-1])
    assert result["acknowledged"] == 2000 and result["errors"] == 0
    unknown = raftmq(None, "bench", "nope")
    assert unknown.returncode == 2 and "produce" in unknown.stderr
    assert raftmq(None, "bench").returncode == 2
