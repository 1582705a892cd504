"""Every console page against a live cluster with logins: 200 with the numbers the SDK
answers, in the HTML and in its JSON twin; a 401 without a login; actions confirmed
first, done as the logged-in user, refused (nothing changed) for a user the ACLs do not
allow, and each written to the audit log."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from raftmq.client import Admin
from raftmq.commands.status import gather_status
from tests.web.console.seeded import (
    ALICE,
    GROUP,
    QUEUES,
    ROOT,
    TOPIC,
    Seeded,
    as_user,
    console_app,
    seeded_cluster,
    served,
)

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    with seeded_cluster(tmp_path_factory.mktemp("console")) as s:
        yield s


@pytest.fixture(scope="module")
def url(seeded: Seeded) -> Iterator[str]:
    with served(console_app(seeded.settings)) as base:
        yield base


def client(url: str, creds: object = ROOT) -> httpx.Client:
    auth = None if creds is None else (creds.user, creds.password)  # type: ignore[attr-defined]
    return httpx.Client(base_url=url, auth=auth, timeout=30, follow_redirects=False)


def cells(html: str, table: str) -> list[list[str]]:
    """The text of each row's cells of the table with id `table`."""
    body = html.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    return [[re.sub(r"<[^>]+>", "", c).strip()
             for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)] for r in rows if "<td" in r]


def test_a_page_without_a_login_asks_for_one(url: str) -> None:
    with client(url, None) as c:
        for path in ("/", "/console/cluster", "/topics"):
            r = c.get(path)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"].startswith("Basic")


def test_a_request_without_a_login_never_acts_as_the_console_process_user(url: str) -> None:
    # RAFTMQ_USER/RAFTMQ_PASSWORD of the process serving the console are not a login
    with as_user(ROOT), client(url, None) as c:
        assert c.get("/console/cluster").status_code == 401


def test_a_wrong_password_is_refused(url: str) -> None:
    with httpx.Client(base_url=url, auth=("root", "not it"), timeout=30) as c:
        assert c.get("/").status_code == 401


def test_the_cluster_page_shows_each_group_as_the_nodes_report_it(seeded: Seeded,
                                                                   url: str) -> None:
    with client(url) as c:
        page, live = c.get("/"), c.get("/console/cluster")
    assert page.status_code == 200 and live.status_code == 200
    d = live.json()
    assert set(d["groups"]) == {g.id for g in seeded.cluster.groups}
    leaders = seeded.cluster.leaders()
    rows = {r[0]: r for r in cells(page.text, "groups")}
    for gid, g in d["groups"].items():
        assert g["leader"] == leaders[gid]
        assert g["health"] == "ok"
        assert rows[gid][1] == "ok" and rows[gid][2] == str(leaders[gid])
        assert rows[gid][3] == f"{g['term']:,}"
        for nid, m in g["members"].items():
            assert m["fsync_ms"] is not None and m["fsync_ms"] >= 0, (gid, nid)
    assert d["produced"] >= 20  # every message of the seed, counted by its leader
    nodes = {r[1]: r for r in cells(page.text, "nodes")}
    assert sorted(nodes) == [str(n) for n in seeded.cluster.node_ids]
    assert all(r[3] == "up" for r in nodes.values())
    # each node's host: its own (`n<id>`) in a cluster without a [hosts] table
    assert all(r[0] == f"n{nid}" for nid, r in nodes.items())


@pytest.mark.anyio
async def test_the_cluster_page_agrees_with_raftmq_status(seeded: Seeded, url: str) -> None:
    from raftmq.client import ConnectionPool

    async with ConnectionPool(credentials=ROOT) as pool, \
            Admin([seeded.cluster.namesrv_addr], pool=pool) as admin:
        status = await gather_status(admin)
    with client(url) as c:
        d = c.get("/console/cluster").json()
    for gid, g in status["groups"].items():
        assert d["groups"][gid]["leader"] == g["leader"]
        assert d["groups"][gid]["term"] == g["term"]
        assert sorted(d["groups"][gid]["members"]) == sorted(str(n) for n in g["members"])


def test_the_topic_page_shows_the_offsets_the_sdk_answers(seeded: Seeded, url: str) -> None:
    with seeded.admin() as admin:
        info = admin.describe_topic(TOPIC)
    with client(url) as c:
        listing = c.get("/topics")
        page = c.get(f"/topics/{TOPIC}")
        live = c.get(f"/console/topics/{TOPIC}").json()
    assert listing.status_code == 200 and page.status_code == 200
    assert [r[0] for r in cells(listing.text, "topics")].count(TOPIC) == 1
    rows = cells(page.text, "queues")
    assert len(rows) == QUEUES == info.total
    for q, row in zip(info.queues, rows, strict=True):
        assert row[0] == str(q.queue) and row[1] == q.group
        assert row[3] == f"{q.min_offset:,}" and row[4] == f"{q.end_offset:,}"
    assert live["end"] == sum(q.end_offset or 0 for q in info.queues) == 20
    assert [q["end_offset"] for q in live["queues"]] == [q.end_offset for q in info.queues]


def test_the_group_page_shows_lag_per_queue(seeded: Seeded, url: str) -> None:
    with seeded.admin() as admin:
        lags = admin.consumer_lag(GROUP, TOPIC)
    with client(url) as c:
        assert GROUP in [r[0] for r in cells(c.get("/groups").text, "groups")]
        page = c.get(f"/groups/{GROUP}")
        live = c.get(f"/console/groups/{GROUP}").json()
    rows = cells(page.text, "queues")
    assert [(r[0], int(r[1]), r[5]) for r in rows] == [
        (TOPIC, q, f"{lag.lag:,}") for q, lag in lags.items()]
    assert live["lag"] == sum(lag.lag for lag in lags.values())


def test_messages_are_found_by_id_and_by_key(seeded: Seeded, url: str) -> None:
    with client(url) as c:
        by_id = c.get("/messages", params={"id": seeded.msg_ids[3]})
        key, ids = next(iter(seeded.keys.items()))
        by_key = c.get("/console/messages", params={"topic": TOPIC, "key": key}).json()
        missing = c.get("/messages", params={"id": "not an id"})
        half = c.get("/messages", params={"topic": TOPIC})
    assert by_id.status_code == 200
    assert cells(by_id.text, "messages")[0][0] == seeded.msg_ids[3]
    assert "order 3" in by_id.text
    assert sorted(m["msg_id"] for m in by_key["messages"]) == sorted(ids)
    assert missing.status_code == 400
    assert half.status_code == 400


def test_a_message_page_shows_its_trace(seeded: Seeded, url: str) -> None:
    traced = seeded.extra["traced"]
    with client(url) as c:
        untraced = c.get("/messages", params={"id": seeded.msg_ids[0]})
        deadline = time.monotonic() + 30  # the node writes the trace records in batches
        while True:
            page = c.get("/messages", params={"id": traced})
            steps = [row[0] for row in cells(page.text, "trace")]
            if "stored" in steps or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        live = c.get("/console/messages", params={"id": traced}).json()
    assert page.status_code == 200 and steps[:2] == ["sent", "stored"], steps
    assert [s["kind"] for s in live["trace"]["steps"]][:2] == ["sent", "stored"]
    assert live["trace"]["steps"][1]["detail"].startswith("group ")
    assert "No trace" in untraced.text and cells(untraced.text, "trace") == [[
        "No trace: neither its producer nor a consumer group reading it traces (trace=True)."]]


def test_the_transactions_page_lists_the_undecided_half(seeded: Seeded, url: str) -> None:
    with client(url) as c:
        page = c.get("/transactions")
        live = c.get("/console/transactions").json()
    assert page.status_code == 200
    assert seeded.txid in [h["txid"] for h in live["halves"]]
    assert seeded.txid in [r[0] for r in cells(page.text, "halves")]


def test_the_users_page_lists_users_and_acls(url: str) -> None:
    with client(url) as c:
        page = c.get("/users")
        live = c.get("/console/users").json()
    assert page.status_code == 200
    assert ALICE.user in live["users"]
    listed = re.findall(r"<li><code>([^<]+)</code></li>",
                        page.text.split('id="users"', 1)[1].split("</ul>", 1)[0])
    assert listed == live["users"]


def test_the_chaos_page_lists_runs_and_opens_one(seeded: Seeded, url: str) -> None:
    root = seeded.settings.chaos_dir
    assert root is not None
    run = root / "seed-7"
    run.mkdir(parents=True, exist_ok=True)
    (run / "results.json").write_text(json.dumps({
        "valid": True, "verdict": "valid", "operations": 1234, "faults": [1, 2, 3], "lost": 0,
        "duplicated": 0, "options": {"seed": 7, "workload": "queue", "nemesis": ["kill"]}}))
    (run / "report.html").write_text("<html><body>the full report</body></html>")
    with client(url) as c:
        listing = c.get("/chaos")
        one = c.get("/chaos/run", params={"name": "seed-7"})
        report = c.get("/chaos/run/report", params={"name": "seed-7"})
        escape = c.get("/chaos/run", params={"name": "../.."})
    assert [r[0] for r in cells(listing.text, "runs")] == ["seed-7"]
    assert 'id="run-operations">1,234<' in one.text and 'id="run-faults">3<' in one.text
    assert report.text == "<html><body>the full report</body></html>"
    assert escape.status_code == 404


def audit_lines(seeded: Seeded) -> list[dict[str, object]]:
    path = seeded.settings.audit_log
    assert path is not None
    return [json.loads(line) for line in Path(path).read_text().splitlines()] \
        if Path(path).exists() else []


def test_an_action_is_confirmed_first_then_done_and_audited(seeded: Seeded, url: str) -> None:
    form = {"topic": "console-made", "queues": "2"}
    with client(url) as c:
        ask = c.post("/actions/create-topic", data=form)
        assert ask.status_code == 200 and 'id="confirm"' in ask.text
        with seeded.admin() as admin:
            assert "console-made" not in admin.list_topics()
        done = c.post("/actions/create-topic", data={**form, "confirm": "yes"})
    assert done.status_code == 200, done.text
    with seeded.admin() as admin:
        assert admin.list_topics()["console-made"]["queues"] == 2
    line = audit_lines(seeded)[-1]
    assert line["user"] == ROOT.user and line["action"] == "create-topic"
    assert line["outcome"] == "done" and line["detail"] == {"topic": "console-made", "queues": 2}


def test_reset_offsets_shows_the_plan_then_moves_them(seeded: Seeded, url: str) -> None:
    form = {"group": GROUP, "topic": TOPIC, "to": "latest"}
    with client(url) as c:
        plan = c.post("/actions/reset-offsets", data=form)
        assert plan.status_code == 200
        with seeded.admin() as admin:
            before = admin.consumer_lag(GROUP, TOPIC)
        # the plan: each queue from its committed offset to its end; nothing moved yet
        assert [(int(r[0]), int(r[1]), int(r[2])) for r in cells(plan.text, "plan")] == [
            (q, lag.committed, lag.end_offset) for q, lag in before.items()]
        assert sum(q.lag for q in before.values()) > 0
        done = c.post("/actions/reset-offsets", data={**form, "confirm": "yes"})
    assert done.status_code == 200, done.text
    with seeded.admin() as admin:
        after = admin.consumer_lag(GROUP, TOPIC)
    assert sum(q.lag for q in after.values()) == 0


def test_a_user_without_the_permission_is_refused_and_nothing_changes(seeded: Seeded,
                                                                      url: str) -> None:
    form = {"topic": "alice-made", "queues": "1", "confirm": "yes"}
    with client(url, ALICE) as c:
        r = c.post("/actions/create-topic", data=form)
    assert r.status_code == 403, r.text
    with seeded.admin() as admin:
        assert "alice-made" not in admin.list_topics()
    line = audit_lines(seeded)[-1]
    assert line["user"] == ALICE.user and line["outcome"] == "refused: FORBIDDEN"


@pytest.mark.parametrize("form, why", [
    ({"topic": "bad name!", "queues": "1"}, "INVALID_NAME"),
    ({"topic": "fine", "queues": "0"}, "queues is a whole number"),
    ({"topic": "fine"}, "queues is required"),
])
def test_bad_input_is_a_400_and_changes_nothing(seeded: Seeded, url: str,
                                                form: dict[str, str], why: str) -> None:
    with client(url) as c:
        r = c.post("/actions/create-topic", data={**form, "confirm": "yes"})
    assert r.status_code == 400 and why in r.text
    with seeded.admin() as admin:
        assert "fine" not in admin.list_topics()


def test_a_form_from_another_site_is_refused(url: str) -> None:
    with client(url) as c:
        r = c.post("/actions/create-topic", headers={"Origin": "http://evil.example"},
                   data={"topic": "x", "queues": "1", "confirm": "yes"})
    assert r.status_code == 400


def test_an_operator_commits_the_half_message(seeded: Seeded, url: str) -> None:
    # its own half message, on its own topic: the other pages' numbers do not move
    form = {"txid": seeded.txid_to_decide, "decision": "commit", "confirm": "yes"}
    with client(url) as c:
        done = c.post("/actions/tx-decide", data=form)
        assert done.status_code == 200, done.text
        live = c.get("/console/transactions").json()
    assert seeded.txid_to_decide not in [h["txid"] for h in live["halves"]]
    assert seeded.txid in [h["txid"] for h in live["halves"]]
    assert any(r.get("id") == seeded.txid_to_decide and r.get("commit") for r in live["decided"])
