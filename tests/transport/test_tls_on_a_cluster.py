"""TLS on every link of a real three-node cluster (`LocalCluster(tls=True)`, the same
cluster `raftmq dev --tls` starts): nodes elect over mutual TLS and register with the
name server over TLS; a client trusting the cluster CA produces and reads back; and every
way in without the right certificate is turned away with a clear error, changes nothing,
and is counted in the node's metrics (`raftmq_connections_refused_total`)."""

from __future__ import annotations

import datetime
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trustme

from raftmq.client import Producer
from raftmq.localcluster import LocalCluster
from tests.live_cluster import scrape_metrics
from transport.blocking import request
from transport.tls import CA_ENV, client_context
from wire.protocol import Code, FrameDecoder, Op, RequestError, encode_frame

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("tls"), nodes=3, groups=1, tick_ms=50,
                      tls=True) as c:
        c.wait_ready(timeout=60)  # leaders elected over mTLS, registered over TLS
        yield c


def cluster_ca(c: LocalCluster) -> trustme.CA:
    """The cluster's own CA (with its key), to issue certificates a test needs."""
    assert c.tls_dir is not None
    return trustme.CA.from_pem((c.tls_dir / "ca.pem").read_bytes(),
                               (c.tls_dir / "ca.key").read_bytes())


def refused(c: LocalCluster, node: int) -> dict[str, float]:
    addr = c.configs[node - 1].metrics
    assert addr is not None
    m = scrape_metrics(addr)
    return {k.split('"')[1]: v for k, v in m.items()
            if k.startswith("raftmq_connections_refused_total{")}


def wait_count(c: LocalCluster, node: int, reason: str, at_least: float) -> None:
    deadline = time.monotonic() + 10  # the refusal is counted as the connection closes
    while refused(c, node).get(reason, 0) < at_least:
        assert time.monotonic() < deadline, refused(c, node)
        time.sleep(0.05)


def term_of(c: LocalCluster, node: int) -> int:
    h, _ = request(c.node_addr(node), {"op": Op.STATUS}, ssl_context=c.client_ssl_context())
    return int(h["groups"]["g0"]["term"])


def test_a_client_trusting_the_cluster_ca_produces_over_tls(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cluster.tls_ca is not None
    monkeypatch.setenv(CA_ENV, str(cluster.tls_ca))  # the SDK's default pool reads it

    async def main() -> None:
        from raftmq.client import Admin

        async with Admin(cluster.namesrv_addr) as admin:
            await admin.create_topic("secure", queues=1)
        async with Producer(cluster.namesrv_addr) as producer:
            result = await producer.send("secure", b"over tls")
        assert result.queue == 0

    trio.run(main)


def test_a_plaintext_client_on_a_tls_port_is_told_and_refused(cluster: LocalCluster) -> None:
    before = refused(cluster, 1).get("plaintext", 0)
    for addr in (cluster.node_addr(1), cluster.namesrv_addr):
        with pytest.raises(RequestError) as info:
            request(addr, {"op": Op.STATUS}, ssl_context=None)
        assert info.value.code == Code.FORBIDDEN and "TLS" in info.value.message
    wait_count(cluster, 1, "plaintext", before + 1)


def test_a_client_that_does_not_trust_the_ca_refuses_the_node(cluster: LocalCluster) -> None:
    stranger = ssl.create_default_context()
    trustme.CA().configure_trust(stranger)
    with pytest.raises(ssl.SSLCertVerificationError):
        request(cluster.node_addr(1), {"op": Op.STATUS}, ssl_context=stranger)


def client_with_cert(c: LocalCluster, leaf: trustme.LeafCert) -> ssl.SSLContext:
    ctx = client_context(str(c.tls_ca))
    leaf.configure_cert(ctx)
    return ctx


@pytest.mark.parametrize("kind", ["untrusted", "expired"])
def test_a_bad_client_certificate_is_refused_in_the_handshake(
        cluster: LocalCluster, kind: str) -> None:
    if kind == "untrusted":
        leaf = trustme.CA().issue_cert("raftmq-n9")
    else:
        past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
        leaf = cluster_ca(cluster).issue_cert(
            "raftmq-n9", not_before=past - datetime.timedelta(days=30), not_after=past)
    before = refused(cluster, 2).get("tls", 0)
    with pytest.raises((ssl.SSLError, ConnectionError)):  # the node's alert, or its close
        request(cluster.node_addr(2), {"op": Op.STATUS},
                ssl_context=client_with_cert(cluster, leaf), timeout=10)
    wait_count(cluster, 2, "tls", before + 1)


def hello_then_raft(c: LocalCluster, node: int, ctx: ssl.SSLContext) -> dict[str, object]:
    """Dial like node 3 would (HELLO), then send a RAFT vote request with a huge term;
    returns the first answer."""
    host, port = c.node_addr(node).rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as s:
        s.sendall(encode_frame({"op": int(Op.HELLO), "node": 3, "nonce": b"n" * 16,
                                "purpose": "raft"}))
        s.sendall(encode_frame({"op": int(Op.RAFT), "g": "g0",
                                "m": {"type": 1, "src": 3, "dst": node, "term": 10**6}}))
        dec = FrameDecoder(1 << 20)
        while (frame := dec.next_frame()) is None:
            data = s.recv(65536)
            assert data, "closed without a word"
            dec.feed(data)
        return frame.header


def test_a_node_without_a_cluster_certificate_cannot_join_or_send_raft(
        cluster: LocalCluster) -> None:
    """TLS trusting the CA but no certificate of its own: the HELLO is refused (FORBIDDEN,
    saying why), the Raft message behind it goes nowhere (the term does not move)."""
    term = term_of(cluster, 1)
    before = refused(cluster, 1).get("peer_certificate", 0)
    answer = hello_then_raft(cluster, 1, client_context(str(cluster.tls_ca)))
    assert answer["code"] == Code.FORBIDDEN and "cluster CA" in str(answer["msg"])
    wait_count(cluster, 1, "peer_certificate", before + 1)
    assert term <= term_of(cluster, 1) < 10**6  # an election of its own may happen meanwhile


def test_a_foreign_node_with_another_cas_certificate_is_refused(cluster: LocalCluster) -> None:
    foreign = trustme.CA()
    ctx = client_with_cert(cluster, foreign.issue_cert("127.0.0.1"))
    term = term_of(cluster, 1)
    before = refused(cluster, 1).get("tls", 0)
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        hello_then_raft(cluster, 1, ctx)
    wait_count(cluster, 1, "tls", before + 1)
    assert term <= term_of(cluster, 1) < 10**6  # an election of its own may happen meanwhile


def test_dev_pki_files_are_reused(tmp_path: Path) -> None:
    from raftmq.devtls import make_dev_pki

    first = make_dev_pki(tmp_path, ["n1"])
    ca = first.ca.read_bytes()
    again = make_dev_pki(tmp_path, ["n1"])
    assert again == first and again.ca.read_bytes() == ca


def test_only_a_node_may_register_with_the_name_server(cluster: LocalCluster) -> None:
    """A TLS client without a cluster certificate cannot redirect routes."""
    with pytest.raises(RequestError) as info:
        request(cluster.namesrv_addr, {"op": int(Op.REGISTER), "node": 9,
                                       "addr": "127.0.0.1:1", "inc": 1, "groups": {}},
                ssl_context=client_context(str(cluster.tls_ca)))
    assert info.value.code == Code.FORBIDDEN and "cluster CA" in info.value.message
    assert 9 not in {int(n) for n in cluster.cluster_info(topics=False)["nodes"]}
