"""Who is who on a secured cluster (TLS, logins and ACLs on), tried from raw sockets: a
peer certificate names the node it belongs to, so neither the name server's certificate
nor another node's can act as a node; an answer to the node's own request (TX_CHECK)
acts only as a user who still exists, and a removed user's connections are closed;
the first login step looks the same for a stored and an unknown user on every node."""

from __future__ import annotations

import secrets
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import scramp

from broker.doors.security import make_credential
from broker.state.parts.users import format_verifier
from raftmq.client import Admin, Producer
from raftmq.client.transactions import CheckRequest
from raftmq.localcluster import NAMESRV, LocalCluster, node_name
from transport.blocking import Connection, request
from transport.connection import ConnectionPool
from transport.peerauth import proof
from transport.scram import Credentials
from transport.tls import client_context
from wire.protocol import Code, FrameDecoder, Op, RequestError, encode_frame
from wire.records import OutgoingMessage, encode_batch

pytestmark = pytest.mark.live

ROOT = Credentials("root", "root's long password")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    keys = {"authenticate": True, "authorize": True, "superusers": [ROOT.user],
            "superuser_scram": format_verifier(make_credential(ROOT.password)),
            "tx_check_first_ms": 300, "tx_check_interval_ms": 300}
    with LocalCluster(tmp_path_factory.mktemp("identity"), nodes=3, groups=1, tick_ms=50,
                      tls=True, node_overrides=keys, credentials=ROOT) as c:
        c.wait_ready(timeout=60)
        c.wait_preferred_leaders(timeout=60)
        yield c


def ctx(c: LocalCluster) -> ssl.SSLContext | None:
    return c.client_ssl_context()


def as_root(c: LocalCluster, header: dict[str, Any], node: int | None = None) -> dict[str, Any]:
    """A request of the superuser to the metadata group's leader (or to `node`)."""
    n = node if node is not None else c.leaders()["g0"]
    assert n is not None
    h, _ = request(c.node_addr(n), header, ssl_context=ctx(c), credentials=ROOT, timeout=10)
    return h


def add_user(c: LocalCluster, creds: Credentials, *acls: dict[str, Any]) -> None:
    cred = make_credential(creds.password)
    as_root(c, {"op": int(Op.USER_PUT), "user": creds.user, "salt": cred.salt,
                "iterations": cred.iterations, "stored_key": cred.stored_key,
                "server_key": cred.server_key})
    for acl in acls:
        as_root(c, {"op": int(Op.ACL_ADD), "principal": creds.user, "pattern": "literal",
                    "permission": "allow", **acl})
    wait_login(c, creds, works=True)


def wait_login(c: LocalCluster, creds: Credentials, *, works: bool) -> None:
    """Until a fresh login as `creds` succeeds (or fails) on every node: each node's
    replica of the metadata group has applied the change."""
    deadline = time.monotonic() + 30
    for n in c.node_ids:
        while True:
            try:
                request(c.node_addr(n), {"op": int(Op.TOPICS)}, ssl_context=ctx(c),
                        credentials=creds, timeout=10)
                ok = True
            except RequestError as exc:
                assert exc.code == Code.UNAUTHENTICATED, exc
                ok = False
            except OSError:  # closed or slow before any answer (a busy machine): no verdict
                ok = not works
            if ok == works:
                break
            assert time.monotonic() < deadline, f"node {n}: login of {creds.user} still {ok}"
            time.sleep(0.1)


# ---------------------------------------------------------------------- node identity


def read_frame(s: ssl.SSLSocket, dec: FrameDecoder) -> dict[str, Any]:
    while (frame := dec.next_frame()) is None:
        data = s.recv(65536)
        if not data:
            return {"closed": True}
        dec.feed(data)
    return frame.header


def claim_node(c: LocalCluster, target: int, claim: int, cert_of: str) -> list[dict[str, Any]]:
    """Dial node `target` over TLS with the certificate of `cert_of` ("namesrv", "n3")
    and the cluster secret, run the dialer's side of the peer handshake as node `claim`
    (purpose `rpc`), then ask READ_RAW for entry 1 of g0; every answer, in order, up to
    the first refusal or the close."""
    assert c.tls_ca is not None and c.tls_dir is not None
    context = client_context(str(c.tls_ca), str(c.tls_dir / f"{cert_of}.pem"),
                             str(c.tls_dir / f"{cert_of}.key"))
    secret = c.configs[0].cluster_secret.encode()
    host, port = c.node_addr(target).rsplit(":", 1)
    answers: list[dict[str, Any]] = []
    dec = FrameDecoder(1 << 24)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as s:
        nd = secrets.token_bytes(16)
        s.sendall(encode_frame({"op": int(Op.HELLO), "node": claim, "nonce": nd,
                                "purpose": "rpc"}))
        answers.append(read_frame(s, dec))
        if answers[-1].get("code") != 0:
            return answers
        na = answers[-1]["nonce"]
        s.sendall(encode_frame({"op": int(Op.HELLO), "node": claim,
                                "proof": proof(secret, "dial", claim, target, nd, na)}))
        answers.append(read_frame(s, dec))
        if answers[-1].get("code") != 0:
            return answers
        s.sendall(encode_frame({"op": int(Op.READ_RAW), "id": 1, "g": "g0", "index": 1}))
        answers.append(read_frame(s, dec))
    return answers


@pytest.mark.parametrize("cert_of, claim", [(NAMESRV, 2), (node_name(3), 2)])
def test_a_certificate_acts_only_as_the_node_it_names(cluster: LocalCluster, cert_of: str,
                                                      claim: int) -> None:
    """The name server's certificate, or node 3's, with the cluster secret, claiming to be
    node 2: refused at the HELLO, saying why; no READ_RAW is answered."""
    answers = claim_node(cluster, 1, claim, cert_of)
    assert len(answers) == 1, answers  # no handshake, no READ_RAW
    assert answers[0]["code"] == Code.FORBIDDEN
    assert "raftmq-n2" in answers[0]["msg"] and "not node 2" in answers[0]["msg"]


def test_a_node_certificate_claiming_its_own_id_is_a_peer(cluster: LocalCluster) -> None:
    """The same exchange with node 2's own certificate passes: READ_RAW answers."""
    answers = claim_node(cluster, 1, 2, node_name(2))
    assert [a.get("code") for a in answers] == [0, 0, 0]
    assert answers[2]["term"] >= 1


def test_only_a_node_registers_for_itself(cluster: LocalCluster) -> None:
    """Node 3's certificate cannot register node 9's routes with the name server."""
    assert cluster.tls_ca is not None and cluster.tls_dir is not None
    n3 = client_context(str(cluster.tls_ca), str(cluster.tls_dir / "n3.pem"),
                        str(cluster.tls_dir / "n3.key"))
    with pytest.raises(RequestError) as info:
        request(cluster.namesrv_addr, {"op": int(Op.REGISTER), "node": 9,
                                       "addr": "127.0.0.1:1", "inc": 1, "groups": {}},
                ssl_context=n3)
    assert info.value.code == Code.FORBIDDEN and "raftmq-n9" in info.value.message


# ---------------------------------------------------------------------- enumeration


def server_first(c: LocalCluster, node: int, user: str) -> dict[str, str]:
    """The server-first message's fields from node `node` (0: the name server)."""
    client = scramp.ScramClient(["SCRAM-SHA-256"], user, "any password")
    addr = c.node_addr(node) if node else c.namesrv_addr
    h, _ = request(addr, {"op": int(Op.AUTH), "step": "first",
                                       "msg": client.get_client_first()},
                   ssl_context=ctx(c), timeout=10)
    return dict(part.split("=", 1) for part in str(h["msg"]).split(","))


def test_an_unknown_user_gets_the_same_salt_from_every_node(cluster: LocalCluster) -> None:
    """Asking every node for an unknown name's salt tells nothing: the made-up salt is the
    same everywhere, as a stored user's is, with the same iteration count."""
    for user in ("nobody-at-all", ROOT.user):
        answers = [server_first(cluster, n, user) for n in cluster.node_ids]
        assert len({a["s"] for a in answers}) == 1, (user, answers)
        assert {a["i"] for a in answers} == {"4096"}


# ---------------------------------------------------------------------- answers


def wait_denied(c: LocalCluster, creds: Credentials, pg: str = "probe-pg") -> None:
    """Until a PRODUCER_HEARTBEAT (publish on producer group `pg`) of `creds` is
    FORBIDDEN on every node: each node's replica applied the ACL's removal."""
    deadline = time.monotonic() + 30
    for n in c.node_ids:
        while True:
            try:
                request(c.node_addr(n), {"op": int(Op.PRODUCER_HEARTBEAT), "pg": pg,
                                         "client": "probe", "ttl_ms": 100},
                        ssl_context=ctx(c), credentials=creds, timeout=10)
            except RequestError as exc:
                if exc.code == Code.FORBIDDEN:
                    break
                raise
            assert time.monotonic() < deadline, f"node {n} still allows {creds.user}"
            time.sleep(0.1)


@pytest.mark.parametrize("revoke", ["user", "acl"])
def test_a_revoked_user_cannot_decide_its_half_message(cluster: LocalCluster,
                                                        revoke: str) -> None:
    """A producer prepares a half message and answers check-backs with "commit", but only
    after root removed the user (or the ACL that lets it publish on its producer group) and every
    node applied it: the node never takes the answer (a removed user's connections are
    closed; a denied one's answer is refused), so the half message is rolled back when
    its checks run out, and nothing is visible."""
    user = Credentials(f"dave-{revoke}", "dave's password")
    topic, pg = f"dave-topic-{revoke}", f"dave-pg-{revoke}"
    pg_acl = {"operation": "publish", "kind": "producer-group", "name": pg}
    add_user(cluster, user, pg_acl, {"operation": "publish", "kind": "topic", "name": topic})
    revoked = anyio.Event()
    asked: list[CheckRequest] = []

    async def listener(req: CheckRequest) -> str:
        asked.append(req)
        await revoked.wait()
        return "commit"

    def revoke_now() -> None:
        if revoke == "user":
            as_root(cluster, {"op": int(Op.USER_DELETE), "user": user.user})
            wait_login(cluster, user, works=False)
        else:
            as_root(cluster, {"op": int(Op.ACL_REMOVE), "principal": user.user,
                              "pattern": "literal", "permission": "allow", **pg_acl})
            wait_denied(cluster, user, pg)

    async def main() -> dict[str, Any]:
        async with ConnectionPool(ssl_context=ctx(cluster), credentials=user) as pool, \
                ConnectionPool(ssl_context=ctx(cluster), credentials=ROOT) as root_pool, \
                Producer(cluster.namesrv_addr, producer_group=pg, pool=pool,
                         check_listener=listener) as producer, \
                Admin(cluster.namesrv_addr, pool=root_pool) as admin:
            await admin.create_topic(topic, 1, ["g0"])  # and waits until it is routed
            half = await producer.prepare(topic, b"a half message", queue=0)
            with anyio.fail_after(60):
                while not asked:
                    await anyio.sleep(0.05)
            await anyio.to_thread.run_sync(revoke_now)
            revoked.set()  # now the listener answers "commit", to this check and any later
            with anyio.fail_after(90):  # until its checks run out (tx_check_max of 300 ms)
                while any(h["txid"] == half.txid for h in (await admin.tx_list())["halves"]):
                    await anyio.sleep(0.2)
            shown: dict[str, Any] = await admin.tx_show(half.txid)
            return shown

    shown = anyio.run(main)
    [decision] = shown["decided"]
    assert decision["commit"] is False and decision["source"] == "expired", decision
    h, _ = request(cluster.node_addr(cluster.leaders()["g0"] or 1),
                   {"op": int(Op.FETCH), "topic": topic, "queue": 0, "offset": 0,
                    "max": 10, "wait_ms": 0}, ssl_context=ctx(cluster), credentials=ROOT)
    assert h["msgs"] == [] and h["end"] == 0, h


def closed_by_node(conn: Connection, wait: float = 30) -> bool:
    """Whether the node closes `conn` within `wait` seconds (nothing is sent on it)."""
    sock = conn._sock
    assert sock is not None
    sock.settimeout(wait)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        pass
    return True


def test_a_removed_users_open_connection_is_closed(cluster: LocalCluster) -> None:
    """Logged in and idle on every node when root removes the user: each node closes the
    connection as it applies the removal, without waiting for a request."""
    user = Credentials("frank", "frank's password")
    add_user(cluster, user)
    conns = [Connection(cluster.node_addr(n), timeout=10, ssl_context=ctx(cluster),
                        credentials=user) for n in cluster.node_ids]
    try:
        for conn in conns:
            conn.request({"op": int(Op.TOPICS)})  # logged in
        as_root(cluster, {"op": int(Op.USER_DELETE), "user": user.user})
        for conn in conns:
            assert closed_by_node(conn), "still open 30 s after the removal"
    finally:
        for conn in conns:
            conn.close()


# ---------------------------------------------------------------------- what STATUS shows


def test_status_shows_only_the_topics_and_groups_the_user_may_see(cluster: LocalCluster) -> None:
    """Erin may subscribe to one topic and one group: STATUS lists that topic's queue
    range and that group's offsets, not the others' (root still sees everything)."""
    user = Credentials("erin", "erin's password")
    add_user(cluster, user, {"operation": "subscribe", "kind": "topic", "name": "erin-topic"},
             {"operation": "subscribe", "kind": "group", "name": "erin-group"})
    for topic in ("erin-topic", "hidden-topic"):
        as_root(cluster, {"op": int(Op.CREATE_TOPIC), "g": "g0", "topic": topic,
                          "queues": 1, "hosted": [0]})
    for cg, topic in (("erin-group", "erin-topic"), ("hidden-group", "hidden-topic")):
        as_root(cluster, {"op": int(Op.COMMIT_OFFSET), "cg": cg, "offsets": [[topic, 0, 0]]})
    leader = cluster.leaders()["g0"]
    assert leader is not None
    mine, _ = request(cluster.node_addr(leader), {"op": int(Op.STATUS)}, ssl_context=ctx(cluster),
                      credentials=user)
    everything = as_root(cluster, {"op": int(Op.STATUS)}, node=leader)
    g0, all_g0 = mine["groups"]["g0"], everything["groups"]["g0"]
    assert {"erin-topic", "hidden-topic"} <= set(all_g0["queues"])
    assert {"erin-group", "hidden-group"} <= set(all_g0["offsets"])
    assert set(g0["queues"]) == {"erin-topic"}
    assert set(g0["offsets"]) == {"erin-group"}


# ---------------------------------------------------------------------- the name server


def test_name_server_lookups_need_a_login(cluster: LocalCluster) -> None:
    """ROUTE and CLUSTER without a login are UNAUTHENTICATED (they list every topic and
    node); the superuser logs in there as on a node; an unknown name gets the nodes' own
    made-up salt; a user added on the nodes logs in there too once a node registered it,
    and is refused there once removed."""
    ns = cluster.namesrv_addr
    for header in ({"op": int(Op.ROUTE), "topic": "anything"}, {"op": int(Op.CLUSTER)}):
        with pytest.raises(RequestError) as info:
            request(ns, header, ssl_context=ctx(cluster))
        assert info.value.code == Code.UNAUTHENTICATED and "authenticate first" in info.value.message
    h, _ = request(ns, {"op": int(Op.CLUSTER), "topics": False}, ssl_context=ctx(cluster),
                   credentials=ROOT)
    assert set(h["nodes"]) == {1, 2, 3}
    with pytest.raises(RequestError) as info:
        request(ns, {"op": int(Op.CLUSTER)}, ssl_context=ctx(cluster),
                credentials=Credentials(ROOT.user, "a guess"))
    assert info.value.code == Code.UNAUTHENTICATED
    assert server_first(cluster, 0, "nobody-at-all")["s"] == server_first(
        cluster, 1, "nobody-at-all")["s"]
    grace = Credentials("grace", "grace's password")
    add_user(cluster, grace)
    wait_lookup(cluster, grace, works=True)
    as_root(cluster, {"op": int(Op.USER_DELETE), "user": grace.user})
    wait_lookup(cluster, grace, works=False)


def wait_lookup(c: LocalCluster, creds: Credentials, *, works: bool) -> None:
    deadline = time.monotonic() + 60  # a registration at once, or at the next round
    while True:
        try:
            request(c.namesrv_addr, {"op": int(Op.ROUTE), "topic": "t"}, ssl_context=ctx(c),
                    credentials=creds)
            ok = True
        except RequestError as exc:
            assert exc.code in (Code.UNAUTHENTICATED, Code.UNKNOWN_TOPIC), exc
            ok = exc.code != Code.UNAUTHENTICATED
        if ok == works:
            return
        assert time.monotonic() < deadline, f"name server login of {creds.user} still {ok}"
        time.sleep(0.2)


# ---------------------------------------------------------------------- caps


def test_heartbeat_client_ids_are_capped(cluster: LocalCluster) -> None:
    """A client id of 300 characters (or 512 KiB) is MALFORMED and not kept: CONSUMERS
    does not list it; one of 255 is kept."""
    leader = cluster.leaders()["g0"] or 1
    for client in ("c" * 300, "x" * (1 << 19)):
        with pytest.raises(RequestError) as info:
            as_root(cluster, {"op": int(Op.HEARTBEAT), "cg": "capped", "client": client,
                              "ttl_ms": 600_000}, node=leader)
        assert info.value.code == Code.MALFORMED and "client id" in info.value.message
    as_root(cluster, {"op": int(Op.HEARTBEAT), "cg": "capped", "client": "k" * 255,
                      "ttl_ms": 600_000}, node=leader)
    h = as_root(cluster, {"op": int(Op.CONSUMERS), "cg": "capped"}, node=leader)
    assert h["clients"] == ["k" * 255]


@pytest.mark.parametrize("fields", [{"key": "k" * 2000}, {"tags": "t" * 300},
                                    {"properties": {"p": "v" * 40_000}}],
                         ids=["key", "tags", "properties"])
def test_keys_tags_and_properties_are_capped(cluster: LocalCluster,
                                             fields: dict[str, Any]) -> None:
    """A message whose key, tags or properties exceed their caps is MALFORMED and stores
    nothing (a key is kept in memory by every replica's key index)."""
    topic = "capped-" + next(iter(fields))
    as_root(cluster, {"op": int(Op.CREATE_TOPIC), "g": "g0", "topic": topic,
                      "queues": 1, "hosted": [0]})
    batch = encode_batch(topic, 0, [OutgoingMessage(b"body", **fields)])
    with pytest.raises(RequestError) as info:
        request(cluster.node_addr(cluster.leaders()["g0"] or 1), {"op": int(Op.PRODUCE), "g": "g0"},
                batch, ssl_context=ctx(cluster), credentials=ROOT)
    assert info.value.code == Code.MALFORMED and "limited to" in info.value.message
    h = as_root(cluster, {"op": int(Op.FETCH), "topic": topic, "queue": 0, "offset": 0,
                          "wait_ms": 0})
    assert h["end"] == 0
