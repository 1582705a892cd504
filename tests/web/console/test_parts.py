"""The console's pure pieces, without a cluster: metrics summaries, chaos run folders,
logins, group health, and the pages rendered from given data."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

from raftmq.web.console import routes
from raftmq.web.console.chaosruns import find_runs, run_dir, summary
from raftmq.web.console.data import LAGGING_ENTRIES, _health
from raftmq.web.console.login import BadLogin, login_of
from raftmq.web.console.nodemetrics import summarize, totals
from raftmq.web.settings import WebSettings

EXPOSITION = """\
# HELP raftmq_fsync_seconds CommitLog fsync latency
# TYPE raftmq_fsync_seconds histogram
raftmq_fsync_seconds_bucket{group="g0",le="0.001"} 1.0
raftmq_fsync_seconds_bucket{group="g0",le="+Inf"} 4.0
raftmq_fsync_seconds_count{group="g0"} 4.0
raftmq_fsync_seconds_sum{group="g0"} 0.01
# HELP raftmq_produce_messages Messages produced
# TYPE raftmq_produce_messages counter
raftmq_produce_messages_total{group="g0"} 120.0
raftmq_produce_messages_total{group="g1"} 30.0
# HELP raftmq_fetch_messages Messages returned by fetches
# TYPE raftmq_fetch_messages counter
raftmq_fetch_messages_total{group="g1"} 7.0
# HELP raftmq_raft_term Current Raft term
# TYPE raftmq_raft_term gauge
raftmq_raft_term{group="g0"} 3.0
"""


def test_a_nodes_metrics_give_fsync_latency_and_counters() -> None:
    m = summarize(EXPOSITION)
    assert m["g0"] == {"fsyncs": 4.0, "fsync_seconds": 0.01, "produced": 120.0, "fetched": 0.0}
    assert m["g1"]["fetched"] == 7.0
    t = totals({1: m, 2: {"g0": {"fsyncs": 0.0, "fsync_seconds": 0.0, "produced": 5.0,
                                  "fetched": 1.0}}})
    assert t["produced"] == 155 and t["fetched"] == 8
    assert t["fsync_ms"] == {1: {"g0": 2.5}, 2: {}}  # no fsync yet: no latency to show


def _member(**kw: object) -> dict[str, object]:
    return {"lag": 0, "disk_full": False, "refill_gap": None, **kw}


@pytest.mark.parametrize("leader, members, word", [
    (1, [_member(), _member()], "ok"),
    (None, [_member()], "no-leader"),
    (1, [_member(), _member(disk_full=True)], "disk-full"),
    (1, [_member(refill_gap=[5, 9])], "refill-gap"),
    (1, [_member(), _member(lag=3)], "ok"),  # replication at work
    (1, [_member(), _member(lag=LAGGING_ENTRIES)], "lagging"),
])
def test_a_groups_health_in_a_word(leader: int | None, members: list[dict[str, object]],
                                   word: str) -> None:
    assert _health({"leader": leader, "members": dict(enumerate(members))}) == word


def test_chaos_runs_are_found_below_the_directory_and_nothing_outside(tmp_path: Path) -> None:
    for name, valid in (("a/seed-1", True), ("seed-2", False)):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "results.json").write_text(json.dumps({
            "valid": valid, "verdict": "valid" if valid else "invalid", "lost": int(not valid),
            "faults": [{}, {}], "options": {"seed": int(name[-1])}}))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("{not json")
    runs = {r["name"]: r for r in find_runs(tmp_path)}
    assert set(runs) == {"a/seed-1", "seed-2", "broken"}
    assert runs["a/seed-1"]["seed"] == 1 and runs["a/seed-1"]["faults"] == 2
    assert runs["seed-2"]["lost"] == 1 and not runs["seed-2"]["valid"]
    assert "unreadable" in runs["broken"]["error"]
    assert run_dir(tmp_path, "a/seed-1") == (tmp_path / "a" / "seed-1").resolve()
    for outside in ("..", "../..", "/etc", "a/../../x"):
        assert run_dir(tmp_path, outside) is None
    assert summary({})["verdict"] is None


class _Req:
    def __init__(self, header: str | None) -> None:
        self.headers = {} if header is None else {"authorization": header}


@pytest.mark.parametrize("header", ["Bearer abc", "Basic !!!", "Basic " + "OnB3"])
def test_a_login_that_is_not_basic_user_password_is_refused(header: str) -> None:
    with pytest.raises(BadLogin):
        login_of(_Req(header))  # type: ignore[arg-type]


def test_a_basic_login_names_its_user() -> None:
    creds = login_of(_Req("Basic YWxpY2U6czNjcjN0OndpdGg6Y29sb25z"))  # type: ignore[arg-type]
    assert creds is not None and (creds.user, creds.password) == ("alice", "s3cr3t:with:colons")
    assert login_of(_Req(None)) is None  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_the_chaos_page_and_static_files_need_no_cluster() -> None:
    app = Starlette(routes=routes(WebSettings(namesrv=("127.0.0.1:1",), chaos_dir=None)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://console") as c:
        page = await c.get("/chaos")
        assert page.status_code == 200 and 'id="no-dir"' in page.text
        assert (await c.get("/static/console.css")).status_code == 200
        assert (await c.get("/static/vendor/uplot/uPlot.iife.min.js")).status_code == 200
        assert (await c.get("/static/vendor/uplot/LICENSE")).text.startswith("The MIT License")
        assert (await c.get("/chaos/run", params={"name": "x"})).status_code == 404
