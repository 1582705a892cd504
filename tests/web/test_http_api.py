"""The HTTP API against a live cluster with authentication and ACLs, through a real
`raftmq console` process and a real HTTP client: what a 200 promises (the message is
there for a consumer), long polls, commits, the simple consumer, admin, logins (401),
ACL refusals (403), the error table, bad input changing nothing, and the OpenAPI
description."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from raftmq.localcluster import LocalCluster
from raftmq.web.api import ENDPOINTS, openapi_document
from tests.secured_cluster import ROOT, secured_cluster
from tests.web.server_process import serving
from transport.scram import Credentials

pytestmark = pytest.mark.live

ALICE = Credentials("alice", "alice's password")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with secured_cluster(tmp_path_factory.mktemp("http"), groups=2, user=ALICE,
                         rules=(["--allow", "publish", "--topic", "open"],
                                ["--allow", "subscribe", "--topic", "open"]),
                         topics=dict.fromkeys(("web", "open", "closed", "simple", "batch",
                                               "poll"), 2)) as c:
        yield c


@pytest.fixture(scope="module")
def url(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("console")
    with serving("console", cluster.namesrv_addr, logs / "console.log",
                 "--audit-log", str(logs / "audit.jsonl")) as address:
        yield address + "/api/v1"


@pytest.fixture(scope="module")
def audit_file(url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    found = sorted(Path(tmp_path_factory.getbasetemp()).glob("console*/audit.jsonl"))
    assert found
    return found[0]


@pytest.fixture
def root(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, auth=(ROOT.user, ROOT.password), timeout=30) as c:
        yield c


@pytest.fixture
def alice(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, auth=(ALICE.user, ALICE.password), timeout=30) as c:
        yield c


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def end_offsets(client: httpx.Client, topic: str) -> list[int]:
    r = client.get(f"/topics/{topic}")
    assert r.status_code == 200, r.text
    return [q["end_offset"] for q in r.json()["queues"]]


def test_a_produced_message_is_read_back_with_its_key_tags_and_properties(
        root: httpx.Client, cluster: LocalCluster) -> None:
    r = root.post("/topics/web/messages", json={
        "body": b64(b"\x00binary\xff"), "key": "k1", "tags": "TagA",
        "properties": {"color": "blue"}})
    assert r.status_code == 200, r.text
    sent = r.json()
    # a 200 means committed: an SDK consumer reads it at once, at that offset
    got = root.get(f"/topics/web/queues/{sent['queue']}/messages",
                   params={"offset": sent["offset"], "max": 1})
    assert got.status_code == 200, got.text
    (msg,) = got.json()["messages"]
    assert base64.b64decode(msg["body"]) == b"\x00binary\xff"
    assert (msg["key"], msg["tags"], msg["properties"], msg["msg_id"]) == (
        "k1", "TagA", {"color": "blue"}, sent["msg_id"])


def test_a_raw_body_with_headers_is_sent_as_is(root: httpx.Client) -> None:
    r = root.post("/topics/web/messages", content=b"raw bytes",
                  headers={"Content-Type": "application/octet-stream",
                           "X-Raftmq-Key": "rk", "X-Raftmq-Tags": "T",
                           "X-Raftmq-Properties": json.dumps({"a": "1"})})
    assert r.status_code == 200, r.text
    sent = r.json()
    got = root.get(f"/topics/web/queues/{sent['queue']}/messages",
                   params={"offset": sent["offset"], "max": 1}).json()["messages"][0]
    assert (base64.b64decode(got["body"]), got["key"], got["tags"], got["properties"]) == (
        b"raw bytes", "rk", "T", {"a": "1"})


def test_a_batch_keeps_its_order_on_one_queue(root: httpx.Client) -> None:
    r = root.post("/topics/batch/messages/batch", json={
        "messages": [{"text": f"m{i}"} for i in range(20)], "queue": 1})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["queue"] for x in results] == [1] * 20
    offsets = [x["offset"] for x in results]
    assert offsets == list(range(offsets[0], offsets[0] + 20))
    got = root.get("/topics/batch/queues/1/messages",
                   params={"offset": offsets[0], "max": 20}).json()["messages"]
    assert [base64.b64decode(m["body"]).decode() for m in got] == [f"m{i}" for i in range(20)]


def test_a_long_poll_wakes_when_a_message_arrives(root: httpx.Client, url: str) -> None:
    end = end_offsets(root, "poll")[0]
    answer: list[httpx.Response] = []

    def poll() -> None:
        with httpx.Client(base_url=url, auth=(ROOT.user, ROOT.password), timeout=60) as c:
            answer.append(c.get("/topics/poll/queues/0/messages",
                                params={"offset": end, "wait_ms": 20_000}))

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(1.0)  # the poll is waiting at the end of the queue
    assert not answer
    assert root.post("/topics/poll/messages", json={"text": "wake", "queue": 0}).status_code == 200
    t.join(30)
    assert answer and answer[0].status_code == 200
    assert [base64.b64decode(m["body"]) for m in answer[0].json()["messages"]] == [b"wake"]


def test_committed_offsets_are_where_a_group_starts(root: httpx.Client) -> None:
    sent = root.post("/topics/web/messages", json={"text": "one", "queue": 0}).json()
    r = root.post("/groups/webgroup/offsets",
                  json={"offsets": [{"topic": "web", "queue": 0, "offset": sent["offset"]}]})
    assert r.status_code == 200, r.text
    got = root.get("/topics/web/queues/0/messages",
                   params={"group": "webgroup", "max": 1}).json()["messages"]
    assert got[0]["offset"] == sent["offset"]
    group = root.get("/groups/webgroup").json()
    assert {"topic": "web", "queue": 0} .items() <= group["queues"][0].items()
    assert group["queues"][0]["committed"] == sent["offset"]


def test_simple_consumer_receive_ack_and_nack(root: httpx.Client) -> None:
    root.post("/topics/simple/messages/batch",
              json={"messages": [{"text": "s1"}, {"text": "s2"}]})
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        r = root.post("/simple/sgroup/receive",
                      json={"topic": "simple", "max": 8, "wait_ms": 2000,
                            "invisible_ms": 60_000})
        assert r.status_code == 200, r.text
        got += r.json()["messages"]
    assert sorted(base64.b64decode(m["message"]["body"]) for m in got) == [b"s1", b"s2"]
    first, second = got
    assert root.post("/simple/sgroup/ack", json={"receipt": first["receipt"]}).status_code == 200
    # acked: its receipt is no longer current
    again = root.post("/simple/sgroup/ack", json={"receipt": first["receipt"]})
    assert again.status_code == 409 and again.json()["error"] == "STALE_RECEIPT"
    r = root.post("/simple/sgroup/change-invisible",
                  json={"receipt": second["receipt"], "invisible_ms": 60_000})
    assert r.status_code == 200, r.text
    r = root.post("/simple/sgroup/nack", json={"receipt": second["receipt"], "delay_ms": 0})
    assert r.status_code == 200, r.text
    redelivered: list[dict[str, Any]] = []
    while not redelivered and time.monotonic() < deadline + 30:
        redelivered = root.post("/simple/sgroup/receive",
                                json={"topic": "simple", "wait_ms": 2000}).json()["messages"]
    assert redelivered[0]["deliveries"] == 2
    # a receipt of another consumer group is refused, nothing settled
    r = root.post("/simple/other/ack", json={"receipt": redelivered[0]["receipt"]})
    assert r.status_code == 400


def test_topic_admin_create_grow_list_delete(root: httpx.Client) -> None:
    r = root.post("/topics", json={"name": "made", "queues": 2})
    assert r.status_code == 200, r.text
    assert r.json()["total"] == 2
    assert root.post("/topics", json={"name": "made"}).status_code == 409
    assert root.post("/topics/made/queues", json={"queues": 4}).status_code == 200
    listed = {t["name"]: t for t in root.get("/topics").json()["topics"]}
    assert listed["made"]["queues"] == 4
    assert root.delete("/topics/made").status_code == 200
    assert root.get("/topics/made").status_code == 404


def test_cluster_status_transactions_and_dead_letters(root: httpx.Client) -> None:
    status = root.get("/cluster/status")
    assert status.status_code == 200, status.text
    assert set(status.json()["status"]["groups"]) == {"g0", "g1"}
    txs = root.get("/transactions")
    assert txs.status_code == 200 and "halves" in txs.json()["lists"]
    assert root.post("/transactions/no-such-tx/commit").status_code == 404
    assert root.get("/dlq/sgroup").status_code == 200
    assert root.post("/dlq/sgroup/resend", json={"all": True}).json() == {"count": 0}


def test_a_wrong_password_or_a_malformed_login_is_401(url: str) -> None:
    for auth in ((ALICE.user, "wrong"), ("nobody", "x")):
        r = httpx.get(url + "/topics", auth=auth, timeout=30)
        assert r.status_code == 401 and r.json()["error"] == "UNAUTHENTICATED"
        assert r.headers["WWW-Authenticate"].startswith("Basic")
    r = httpx.get(url + "/topics", headers={"Authorization": "Bearer x"}, timeout=30)
    assert r.status_code == 401
    # no login on a cluster with authentication (and no service login): refused
    assert httpx.get(url + "/topics", timeout=30).status_code == 401


def test_the_acls_of_the_user_decide(alice: httpx.Client, root: httpx.Client) -> None:
    assert alice.post("/topics/open/messages", json={"text": "ok"}).status_code == 200
    before = end_offsets(root, "closed")
    r = alice.post("/topics/closed/messages", json={"text": "no", "queue": 0})
    assert r.status_code == 403 and r.json()["error"] == "FORBIDDEN"
    assert end_offsets(root, "closed") == before
    assert alice.post("/topics", json={"name": "alices"}).status_code == 403
    assert alice.get("/topics/closed/queues/0/messages").status_code == 403


@pytest.mark.parametrize("path, kwargs, error", [
    ("/topics/web/messages", {"content": b"{not json"}, "MALFORMED"),
    ("/topics/web/messages", {"json": {"body": "%%%"}}, "MALFORMED"),
    ("/topics/web/messages", {"json": {"text": "x", "body": b64(b"x")}}, "MALFORMED"),
    ("/topics/web/messages", {"json": {"text": "x", "colour": 1}}, "MALFORMED"),
    ("/topics/web/messages", {"json": {"text": 5}}, "MALFORMED"),
    ("/topics/bad name!/messages", {"json": {"text": "x"}}, "INVALID_NAME"),
    ("/topics/web/messages", {"json": {"text": "x", "queue": 99}}, None),
    ("/topics/web/messages/batch", {"json": {"messages": []}}, "MALFORMED"),
    ("/topics/web/messages", {"content": b"x" * (9 << 20)}, "MESSAGE_TOO_LARGE"),
    ("/topics/web/messages", {"json": {"text": "x" * (5 << 20)}}, "MESSAGE_TOO_LARGE"),
])
def test_bad_input_is_a_clear_4xx_and_writes_nothing(
        root: httpx.Client, path: str, kwargs: dict[str, Any], error: str | None) -> None:
    before = end_offsets(root, "web")
    r = root.post(path, **kwargs)
    assert 400 <= r.status_code < 500, r.text
    body = r.json()
    assert body["message"]
    if error is not None:
        assert body["error"] == error
    assert end_offsets(root, "web") == before


def test_unknown_topic_is_404(root: httpx.Client) -> None:
    r = root.post("/topics/nosuch/messages", json={"text": "x"})
    assert r.status_code == 404 and r.json()["error"] == "UNKNOWN_TOPIC"


def test_the_same_process_serves_the_console_beside_the_api(url: str) -> None:
    site = url.removesuffix("/api/v1")
    with httpx.Client(base_url=site, auth=(ROOT.user, ROOT.password), timeout=30) as c:
        page = c.get("/topics")
        assert page.status_code == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        assert "web" in page.text  # a topic the fixture made, listed by the console
        # an unknown API path is a JSON error; an unknown page is not
        api_miss = c.get("/api/v1/no-such-thing")
        assert (api_miss.status_code, api_miss.json()["error"]) == (404, "NOT_FOUND")
        page_miss = c.get("/no-such-page")
        assert page_miss.status_code == 404
        assert not page_miss.headers["content-type"].startswith("application/json")


def test_state_changes_are_audited(root: httpx.Client, alice: httpx.Client,
                                   audit_file: Path) -> None:
    root.post("/topics/web/messages", json={"text": "audited"})
    alice.post("/topics/closed/messages", json={"text": "no"})
    lines = [json.loads(line) for line in audit_file.read_text().splitlines()]
    assert {"user": "root", "action": "produce", "target": "web", "result": "ok"}.items() \
        <= lines[-2].items()
    assert {"user": "alice", "action": "produce", "target": "closed",
            "result": "FORBIDDEN"}.items() <= lines[-1].items()


def test_the_openapi_description_is_valid_and_covers_every_route(root: httpx.Client) -> None:
    from openapi_spec_validator import validate

    served = root.get("/openapi.json").json()
    validate(served)
    assert served == json.loads(json.dumps(openapi_document()))
    for ep in ENDPOINTS:
        assert ep.method.lower() in served["paths"]["/api/v1" + ep.path], ep.name


def test_https_serves_the_api_and_its_logins(cluster: LocalCluster, tmp_path: Path) -> None:
    """`--tls-cert/--tls-key`: Basic logins travel inside TLS; a client that trusts the CA
    gets in, plain HTTP to the same port gets no answer from the API."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    with serving("console", cluster.namesrv_addr, tmp_path / "console.log",
                 "--tls-cert", str(cert_file), "--tls-key", str(key_file)) as address:
        assert address.startswith("https://")
        with ca.cert_pem.tempfile() as ca_file, \
                httpx.Client(base_url=address + "/api/v1", verify=ca_file, timeout=30,
                             auth=(ROOT.user, ROOT.password)) as c:
            assert c.get("/topics").status_code == 200
            assert c.get("/topics", auth=(ROOT.user, "wrong")).status_code == 401
        plain = address.replace("https://", "http://", 1) + "/api/v1/topics"
        with pytest.raises(httpx.HTTPError):
            httpx.get(plain, auth=(ROOT.user, ROOT.password), timeout=10)
