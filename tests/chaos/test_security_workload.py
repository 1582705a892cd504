"""`raftmq chaos run --workload security` end to end: users and ACLs changed under faults
by one admin while test users log in and publish or subscribe through every node.

- valid: a short run under `kill` and `partition-node` (the clients of the harness all
  log in as its superuser, on a cluster with logins and ACLs on);
- `drop-acl-remove` (the acls part acknowledges every 5th removal and keeps the entry):
  the same run is invalid, the kept entries found on every node (`lost_changes`).

The checker itself is tested on hand-made histories in tests/chaos/test_authcheck.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from broker.config import ALLOW_MUTATIONS_ENV
from broker.state.parts.acls import DROP_REMOVE_EVERY, Acl, AclAdd, AclRemove, Acls
from broker.state.parts.base import ControlResult
from broker.state.statemachine import BrokerState
from chaos.attackers import ATTACKS
from chaos.cli import EXIT_USAGE, run_main
from chaos.histories import parse_faults
from chaos.run import RunOptions, run_chaos
from chaos.secworkload import SUPERUSER, harness_login, harness_superuser
from raftlog.types import Entry, EntryType
from tests.chaos.test_run import _recheck, _results
from transport.scram import PASSWORD_ENV, USER_ENV, Credentials, credentials_from_env

SEC_SECONDS = float(os.environ.get("CHAOS_SEC_SECONDS", "20"))
SEED = 2
NEMESES = ("kill", "partition-node")




def test_drop_acl_remove_acknowledges_every_fifth_removal_and_keeps_the_entry() -> None:
    acls = [Acl(f"u{i}", "topic", "literal", "t", "publish", "allow") for i in range(10)]
    for mutations, kept in (((), set()), (("drop-acl-remove",), {acls[4], acls[9]})):
        s = BrokerState("g0", mutations=mutations)
        records = [AclAdd(a) for a in acls] + [AclRemove(a) for a in acls]
        results = [s.apply(Entry(term=1, index=i, type=EntryType.CONTROL, data=r.encode()))
                   for i, r in enumerate(records, start=1)]
        # every removal acknowledged
        assert all(isinstance(r, ControlResult) and r.applied == 1 for r in results)
        assert set(s.part(Acls).entries()) == kept
    assert DROP_REMOVE_EVERY == 5


def test_security_workload_needs_nodes_the_harness_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('namesrv = "127.0.0.1:1"\n[nodes.1]\nagent = "127.0.0.1:2"\n')
    assert run_main(["--out", str(tmp_path / "out"), "--workload", "security", "--cluster",
                     str(cluster), "--nemesis", "kill"]) == EXIT_USAGE
    assert "--workload security needs nodes the harness starts (with logins and ACLs on)" in (
        capsys.readouterr().err)


def test_the_harness_login_is_its_clients_and_is_put_back(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setenv(USER_ENV, "someone")
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    creds, keys = harness_superuser()
    assert creds.user == SUPERUSER and keys["superusers"] == [SUPERUSER]
    assert keys["authenticate"] is True and keys["authorize"] is True
    assert creds.password not in keys["superuser_scram"]  # a verifier, not the password
    with harness_login(creds):
        assert credentials_from_env() == creds
    assert credentials_from_env() == Credentials("someone", "")
    assert PASSWORD_ENV not in os.environ


def _line(process: object, kind: str, f: str, key: object, value: object, t: float) -> str:
    return json.dumps({"process": process, "type": kind, "f": f, "key": key, "value": value,
                       "time": t})


def test_the_run_verdict_includes_the_security_one(tmp_path: Path) -> None:
    """Queue operations and security records in one history: the queue analysis reads its
    own, `chaos.authcheck` the others, and a lost change makes the run invalid."""
    from chaos.analysis import analyze_run
    from chaos.authcheck import check_file

    acl = ["alice", "topic", "literal", "sec-a", "publish", "allow"]

    def history(final_acls: list[list[str]]) -> Path:
        lines = [
            _line(1, "invoke", "append", "q/0", "p1-0", 1.0),
            _line("sec-admin", "invoke", "acl-add", "/".join(acl), acl, 1.5),
            _line(1, "ok", "append", "q/0", {"offset": 0}, 2.0),
            _line("sec-admin", "ok", "acl-add", "/".join(acl), {"added": True}, 2.5),
            _line(2, "invoke", "read", "q/0", {"offset": 0, "n": 8}, 3.0),
            _line("sec-final", "invoke", "sec-final", 1, None, 3.5),
            _line(2, "ok", "read", "q/0", ["p1-0"], 4.0),
            _line("sec-final", "ok", "sec-final", 1, {"users": [], "acls": final_acls}, 4.5),
        ]
        path = tmp_path / f"h{len(final_acls)}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        return path

    facts = {"queue_groups": {"q/0": "g0"}, "drained": True, "unexpected_exits": {}}
    good = analyze_run(history([acl]), facts, check_timeout=5).results
    assert good["verdict"] == "valid", good["problems"]
    assert good["security"]["changes"] == {"acl-add": {"ok": 1}}
    assert good["linearizable"] == {"q/0": True}
    bad = analyze_run(history([]), facts, check_timeout=5).results
    assert bad["verdict"] == "invalid"
    assert bad["problems"] == ["security: lost_changes: 1"]
    for path, results in ((history([acl]), good), (history([]), bad)):
        # fed from the analysis' one pass over the history, the checker says what it
        # says over the file alone, word for word
        assert results["security"] == check_file(path)
    queue_only = tmp_path / "q.jsonl"
    queue_only.write_text(_line(1, "invoke", "append", "q/0", "p1-0", 1.0) + "\n")
    assert "security" not in analyze_run(queue_only, None, check_timeout=5).results


def test_report_shows_the_security_verdict() -> None:
    from chaos.authcheck import check_lines
    from chaos.linearizability import CheckInfo, CheckResult
    from chaos.models import QueueLogModel
    from chaos.report import render_html

    empty = CheckInfo(CheckResult.OK, [], 0.0, False, 0)
    valid = check_lines([])
    page = render_html(QueueLogModel(), empty, security=valid)
    assert page.index("<h2>Timeline") < page.index("<h2>Users and ACLs")
    bad = {**valid, "valid": False, "lost_changes": 2,
           "examples": {"lost_changes": [{"node": "2", "acl": "a/topic/literal/t/publish/allow"}]}}
    page = render_html(QueueLogModel(), empty, security=bad)
    assert page.index("<h2>Users and ACLs") < page.index("<h2>Timeline")
    assert "lost_changes: 2" in page and "a/topic/literal/t/publish/allow" in page


def _options(out: Path, *mutations: str) -> RunOptions:
    return RunOptions(out=out, workload="security", time=SEC_SECONDS, seed=SEED,
                      nemesis=NEMESES, mutations=mutations, check_timeout=20,
                      drain_timeout=40)


@pytest.mark.live
def test_security_smoke_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = run_main(["--out", str(out), "--workload", "security", "--time", str(SEC_SECONDS),
                     "--seed", str(SEED), "--nemesis", ",".join(NEMESES),
                     "--drain-timeout", "40", "--json"])
    results = _results(out)
    sec = results["security"]
    assert code == 0, json.dumps(results, indent=1)[:4000]
    assert results["valid"] is True and sec["valid"] is True
    # every kind of change was acknowledged, and logins and operations went both ways,
    # so the rules above were not vacuous
    for kind in ("user-put", "user-remove", "acl-add", "acl-remove"):
        assert sec["changes"][kind].get("ok", 0) > 0, sec["changes"]
    assert sec["logins"]["login"].get("ok", 0) > 0 and sec["logins"]["login"].get("fail", 0) > 0
    assert sec["logins"]["final login"].get("ok", 0) > 0
    assert any(row.get("ok", 0) for row in sec["authz"].values()), sec["authz"]
    assert any(row.get("fail", 0) for row in sec["authz"].values()), sec["authz"]
    assert sec["final_nodes"] == ["1", "2", "3"]
    assert results["run"]["security_converged"] is True  # every node held the barrier
    # the attackers ran beside the clients and were stopped each time they could be judged
    assert set(sec["attacks"]) == set(ATTACKS), sec["attacks"]
    assert sum(row.get("ok", 0) for row in sec["attacks"].values()) > 0, sec["attacks"]
    assert sec["attacks_got_through"] == 0 and sec["memory_over_bound"] == 0
    assert set(sec["rss_mib_max"]) == {"1", "2", "3"}
    assert {f.f for f in parse_faults(out / "history.jsonl")} <= set(NEMESES)
    assert "Users and ACLs" in (out / "report.html").read_text()
    _recheck(out, 0, capsys)


@pytest.mark.live
def test_drop_acl_remove_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The smoke's run with acknowledged ACL removals dropped: invalid."""
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")
    out = tmp_path / "run"
    results = run_chaos(_options(out, "drop-acl-remove"))
    sec = results["security"]
    assert results["verdict"] == "invalid", json.dumps(results, indent=1)[:4000]
    assert sec["valid"] is False and sec["lost_changes"] > 0, json.dumps(sec)[:4000]
    assert all(x["present"] and x["acknowledged"].startswith("remove")
               for x in sec["examples"]["lost_changes"])
    assert any(p.startswith("security: lost_changes") for p in results["problems"])
    html = (out / "report.html").read_text()
    assert "Users and ACLs" in html and "invalid" in html
    _recheck(out, 1, capsys)


def test_human_summary_names_the_security_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from chaos.cli import _print_run

    monkeypatch.setenv("COLUMNS", "400")  # one table row a line
    _print_run({
        "valid": False, "verdict": "invalid", "problems": ["security: lost_changes: 3"],
        "operations": {}, "faults": {}, "linearizable": {},
        "security": {"changes": {"acl-remove": {"ok": 9, "info": 1}},
                     "logins": {"login": {"ok": 4, "fail": 2}},
                     "authz": {"publish": {"fail": 5}}, "final_nodes": ["1", "2", "3"]},
        "options": {"seed": 2, "time": 20.0, "nemesis": ["kill"], "nodes": 3, "groups": 3,
                    "workload": "security", "mutations": ["drop-acl-remove"]},
    }, tmp_path)
    out = " ".join(capsys.readouterr().out.split())
    for text in ("INVALID", "security: lost_changes: 3", "acl-remove 9 ok/1 info",
                 "login 4 ok/2 fail", "publish 5 fail", "read at the end on nodes 1, 2, 3",
                 "--workload security --mutation drop-acl-remove"):
        assert text in out, (text, out)
