"""Authorization on a real three-node cluster (`authorize = true`): `raftmq acl` entries
in the metadata group decide who publishes and subscribes where; a user with the wrong
permission for an operation is refused with a clear error, nothing changes, and the
refusal is counted."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from broker.doors.security import make_credential
from broker.state.parts.users import format_verifier
from raftmq.commands import acl as acl_cmd
from raftmq.commands import user as user_cmd
from raftmq.localcluster import LocalCluster
from tests.live_cluster import scrape_metrics
from transport.blocking import request
from transport.scram import PASSWORD_ENV, USER_ENV, Credentials
from wire.protocol import Code, Op, RequestError
from wire.records import OutgoingMessage, encode_batch

pytestmark = pytest.mark.live

ROOT = Credentials("root", "root's long password")
ALICE = Credentials("alice", "alice's password")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    keys = {"authenticate": True, "authorize": True, "superusers": ["root"],
            "superuser_scram": format_verifier(make_credential(ROOT.password))}
    base = tmp_path_factory.mktemp("acl")
    with LocalCluster(base, nodes=3, groups=1, tick_ms=50, node_overrides=keys, credentials=ROOT) as c:
        c.wait_ready(timeout=60)
        c.wait_preferred_leaders(timeout=60)  # no hand-back in the middle of a test
        mp = pytest.MonkeyPatch()
        mp.setenv(USER_ENV, ROOT.user)
        mp.setenv(PASSWORD_ENV, ROOT.password)
        mp.setenv("RAFTMQ_NEW_PASSWORD", ALICE.password)
        ns = ["--namesrv", c.namesrv_addr]
        assert user_cmd.main(["add", "alice", *ns]) == 0
        for args in (["--allow", "publish", "--topic", "orders.", "--prefix"],
                     ["--deny", "publish", "--topic", "orders.secret"],
                     ["--allow", "subscribe", "--topic", "orders.eu"],
                     ["--allow", "subscribe", "--group", "readers"]):
            assert acl_cmd.main(["add", "--user", "alice", *args, *ns]) == 0
        leader = c.node_addr(c.leaders()["g0"] or 1)
        # orders.eu's queue 1 is the one the lock cases take: a lock left held there
        # must not fence the commit cases on queue 0, whatever order they run in
        for topic, queues in (("orders.eu", 2), ("orders.secret", 1), ("payments", 1)):
            request(leader, {"op": int(Op.CREATE_TOPIC), "g": "g0", "topic": topic,
                             "queues": queues, "hosted": list(range(queues))},
                    credentials=ROOT)
        mp.undo()
        yield c


def leader(c: LocalCluster) -> tuple[str, int]:
    n = c.leaders()["g0"]
    assert n is not None
    return c.node_addr(n), n


def end_of(c: LocalCluster, topic: str) -> int:
    h, _ = request(leader(c)[0], {"op": int(Op.FETCH), "topic": topic, "queue": 0,
                                  "offset": 0, "max": 1, "wait_ms": 0}, credentials=ROOT)
    return int(h["end"])


def acl_refusals(c: LocalCluster, node: int) -> float:
    addr = c.configs[node - 1].metrics
    assert addr is not None
    return scrape_metrics(addr).get('raftmq_connections_refused_total{reason="acl"}', 0)


def produce(c: LocalCluster, topic: str) -> dict[str, object]:
    batch = encode_batch(topic, 0, [OutgoingMessage(b"m")])
    return request(leader(c)[0], {"op": int(Op.PRODUCE), "g": "g0"}, bytes(batch),
                   credentials=ALICE)[0]


def test_an_allowed_prefix_publishes(cluster: LocalCluster) -> None:
    before = end_of(cluster, "orders.eu")
    produce(cluster, "orders.eu")
    assert end_of(cluster, "orders.eu") == before + 1


@pytest.mark.parametrize("topic, why", [
    ("orders.secret", "no ACL allows publish on topic 'orders.secret'"),  # deny wins
    ("payments", "no ACL allows publish on topic 'payments'"),  # default deny
])
def test_publishing_without_permission_is_refused_and_stores_nothing(
        cluster: LocalCluster, topic: str, why: str) -> None:
    before, node = end_of(cluster, topic), leader(cluster)[1]
    refusals = acl_refusals(cluster, node)
    with pytest.raises(RequestError) as info:
        produce(cluster, topic)
    assert info.value.code == Code.FORBIDDEN and why in info.value.message
    assert end_of(cluster, topic) == before
    assert acl_refusals(cluster, node) == refusals + 1


@pytest.mark.parametrize("op, header, allowed", [
    (Op.FETCH, {"topic": "orders.eu", "queue": 0, "offset": 0, "wait_ms": 0}, True),
    (Op.FETCH, {"topic": "payments", "queue": 0, "offset": 0, "wait_ms": 0}, False),
    (Op.OFFSET_FOR_TIME, {"topic": "orders.eu", "queue": 0, "ms": 0}, True),
    (Op.OFFSET_FOR_TIME, {"topic": "payments", "queue": 0, "ms": 0}, False),
    (Op.COMMIT_OFFSET, {"cg": "readers", "offsets": [["orders.eu", 0, 0]]}, True),
    (Op.COMMIT_OFFSET, {"cg": "others", "offsets": [["orders.eu", 0, 0]]}, False),
    (Op.COMMIT_OFFSET, {"cg": "readers", "offsets": [["payments", 0, 0]]}, False),
    # a transaction's offsets need subscribe on the consumer group, as a commit does
    (Op.TX_OFFSETS, {"g": "g0", "tid": "alice-t", "epoch": 0, "n": 0, "cg": "others",
                     "offsets": [["orders.eu", 0, 0]]}, False),
    (Op.TX_OFFSETS, {"g": "g0", "tid": "alice-t", "epoch": 0, "n": 0, "cg": "readers",
                     "offsets": [["payments", 0, 0]]}, False),
    # queue locks fence commits: the permission a commit needs, on the group and topic
    (Op.LOCK, {"cg": "readers", "topic": "orders.eu", "queues": [1], "client": "a"}, True),
    (Op.LOCK, {"cg": "others", "topic": "orders.eu", "queues": [1], "client": "a"}, False),
    (Op.LOCK, {"cg": "readers", "topic": "payments", "queues": [0], "client": "a"}, False),
    (Op.UNLOCK, {"cg": "others", "topic": "orders.eu", "queues": [1], "client": "a"}, False),
    (Op.UNLOCK, {"cg": "readers", "topic": "orders.eu", "queues": [1], "client": "a"}, True),
    (Op.LOCKS, {"cg": "readers"}, True),
    (Op.LOCKS, {"cg": "others"}, False),
    (Op.LOCKS, {}, False),  # every group's locks: cluster admin
    (Op.CREATE_TOPIC, {"g": "g0", "topic": "orders.new", "queues": 1, "hosted": [0]}, False),
    (Op.DELETE_TOPIC, {"g": "g0", "topic": "orders.eu"}, False),
    (Op.TRANSFER_LEADER, {"g": "g0", "to": 1}, False),
    (Op.USER_LIST, {}, False),
    (Op.ACL_LIST, {}, False),
    (Op.STATUS, {}, True),
    # a traced client's report needs what its traced sends or reads needed; reading the
    # trace topic needs subscribe on it (alice has none)
    (Op.TRACE, {"g": "g0", "topic": "orders.eu", "role": "producer", "client": "a",
                "slot": 0, "slots": 1, "events": [["sent", 0, 0, 1, -1]]}, True),
    (Op.TRACE, {"g": "g0", "topic": "payments", "role": "producer", "client": "a",
                "slot": 0, "slots": 1, "events": [["sent", 0, 0, 1, -1]]}, False),
    (Op.TRACE, {"g": "g0", "topic": "orders.eu", "role": "consumer", "cg": "readers",
                "client": "a", "slot": 0, "slots": 1, "events": [["acked", 0, 0, 1, 1]]},
     True),
    (Op.TRACE, {"g": "g0", "topic": "orders.eu", "role": "consumer", "cg": "others",
                "client": "a", "slot": 0, "slots": 1, "events": [["acked", 0, 0, 1, 1]]},
     False),
    (Op.QUERY_KEY, {"topic": "rmq_sys_trace", "key": "g0:1:8"}, False),
])
def test_each_operation_needs_its_permission(cluster: LocalCluster, op: Op,
                                             header: dict[str, object], allowed: bool) -> None:
    addr = leader(cluster)[0]
    try:
        request(addr, {"op": int(op), **header}, credentials=ALICE)
    except RequestError as exc:
        assert not allowed and exc.code == Code.FORBIDDEN, exc
    else:
        assert allowed, f"{op.name} was allowed"
    topics, _ = request(addr, {"op": int(Op.TOPICS)}, credentials=ROOT)
    assert "orders.new" not in topics["topics"] and "orders.eu" in topics["topics"]


def test_acl_list_shows_the_entries(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(USER_ENV, ROOT.user)
    monkeypatch.setenv(PASSWORD_ENV, ROOT.password)
    assert acl_cmd.main(["list", "--namesrv", cluster.namesrv_addr]) == 0
    out = capsys.readouterr().out
    assert "deny  alice            publish   topic orders.secret" in out
    assert "allow alice            publish   topic orders.*" in out
    args = ["--user", "alice", "--allow", "subscribe", "--group", "readers",
            "--namesrv", cluster.namesrv_addr]
    assert acl_cmd.main(["remove", *args]) == 0
    assert acl_cmd.main(["remove", *args]) == 0
    assert "no such entry" in capsys.readouterr().out
    assert acl_cmd.main(["add", *args]) == 0


def test_transactions_need_publish_on_their_transactional_id(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24 #8: publish on the cluster let any user TX_INIT any transactional id
    (fencing another application's producer) and decide any half message as the
    operator. A transaction now needs publish on its transactional id (Kafka's
    TransactionalId write), in every request and batch naming it; a half message's end
    publish on its producer group; an operator's decision admin on the cluster."""
    import trio

    from raftmq.client import Producer
    from transport.connection import ConnectionPool

    async def transact(tid: str) -> None:
        async with ConnectionPool(credentials=ALICE) as pool, \
                Producer(cluster.namesrv_addr, pool=pool, transactional_id=tid) as p:
            async with p.transaction() as tx:
                await tx.send("orders.eu", b"in a transaction", queue=0)

    def as_alice(header: dict[str, object], body: bytes = b"") -> Code | None:
        try:
            request(leader(cluster)[0], header, body, credentials=ALICE)
        except RequestError as exc:
            return exc.code
        return None

    monkeypatch.setenv(USER_ENV, ROOT.user)
    monkeypatch.setenv(PASSWORD_ENV, ROOT.password)
    ns = ["--namesrv", cluster.namesrv_addr]
    added = [["--allow", "publish", "--cluster"],  # the old rule: no longer enough
             ["--allow", "publish", "--transactional-id", "alice-", "--prefix"],
             ["--allow", "publish", "--producer-group", "pg-alice"]]
    assert acl_cmd.main(["add", "--user", "alice", *added[0], *ns]) == 0
    before = end_of(cluster, "orders.eu")
    with pytest.raises(Exception) as info:  # noqa: PT011 - the SDK may wrap it
        trio.run(transact, "alice-1")
    assert "FORBIDDEN" in repr(info.value) or "FORBIDDEN" in str(info.value.__cause__), info
    assert end_of(cluster, "orders.eu") == before  # the refused one left nothing
    assert acl_cmd.main(["add", "--user", "alice", *added[1], *ns]) == 0
    trio.run(transact, "alice-1")
    deadline = time.monotonic() + 20  # the commit marker lands in the queue's group
    while end_of(cluster, "orders.eu") != before + 1:
        assert time.monotonic() < deadline, end_of(cluster, "orders.eu")
        time.sleep(0.05)
    # another application's id stays closed: its init, and a batch naming it on a topic
    # alice may publish to
    assert as_alice({"op": int(Op.TX_INIT), "g": "g0", "tid": "bob-1",
                     "timeout_ms": 60_000}) == Code.FORBIDDEN
    batch = encode_batch("orders.eu", 0, [OutgoingMessage(b"x")], tx=("bob-1", 0, 0))
    assert as_alice({"op": int(Op.PRODUCE), "g": "g0"}, bytes(batch)) == Code.FORBIDDEN
    # half messages: their producer group's publish; the operator's say: cluster admin
    end = {"op": int(Op.HALF_END), "g": "g0", "txid": "h-1", "commit": False}
    assert as_alice({**end, "pg": "pg-alice"}) == Code.FORBIDDEN
    assert acl_cmd.main(["add", "--user", "alice", *added[2], *ns]) == 0
    assert as_alice({**end, "pg": "pg-alice"}) == Code.TX_UNKNOWN  # allowed: no such half
    assert as_alice({**end, "pg": "pg-bob"}) == Code.FORBIDDEN
    assert as_alice({**end, "pg": "", "source": "operator"}) == Code.FORBIDDEN
    half = encode_batch("orders.eu", 0, [OutgoingMessage(b"x")], half=("h-2", "pg-bob"))
    assert as_alice({"op": int(Op.PRODUCE), "g": "g0"}, bytes(half)) == Code.FORBIDDEN
    assert as_alice({"op": int(Op.PRODUCER_HEARTBEAT), "pg": "pg-bob",
                     "client": "c"}) == Code.FORBIDDEN
    assert end_of(cluster, "orders.eu") == before + 1
    for args in added:
        assert acl_cmd.main(["remove", "--user", "alice", *args, *ns]) == 0
