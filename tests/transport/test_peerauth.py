"""The peer handshake (`transport.peerauth`): the proofs, and both sides run back to back
over an in-memory stream pair."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from transport.framing import FrameStream
from transport.peerauth import PeerRefused, accept_peer, check, dial_peer, proof
from wire.protocol import Code

S = b"the cluster secret of this test"
ND, NA = b"d" * 16, b"a" * 16


def test_a_proof_binds_the_secret_the_role_both_nodes_and_both_nonces() -> None:
    p = proof(S, "dial", 1, 2, ND, NA)
    assert check(S, p, "dial", 1, 2, ND, NA)
    assert not check(b"another secret", p, "dial", 1, 2, ND, NA)
    assert not check(S, p, "accept", 1, 2, ND, NA)  # one side's proof is not the other's
    assert not check(S, p, "dial", 3, 2, ND, NA)
    assert not check(S, p, "dial", 1, 2, ND, b"b" * 16)  # a fresh nonce: no replay
    assert not check(S, p.hex(), "dial", 1, 2, ND, NA)
    assert not check(S, None, "dial", 1, 2, ND, NA)


def handshake(dialer_secret: bytes, acceptor_secret: bytes, *, purpose: str = "raft"
              ) -> tuple[BaseException | None, object]:
    """Node 1 dials node 2; returns (the dialer's error, the acceptor's result or error)."""
    out: dict[str, object] = {}

    async def dial(fs: FrameStream) -> None:
        try:
            await dial_peer(fs, dialer_secret, 1, 2, purpose=purpose, timeout=5)
            out["dial"] = None
        except (PeerRefused, trio.BrokenResourceError) as exc:
            out["dial"] = exc
        await fs.aclose()

    async def accept(fs: FrameStream) -> None:
        hello = await fs.receive()
        assert hello is not None
        try:
            out["accept"] = await accept_peer(fs, hello, acceptor_secret, 2,
                                              {1: "", 2: ""}, timeout=5)
        except PeerRefused as exc:
            out["accept"] = exc
        await fs.aclose()

    async def main() -> None:
        a, b = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dial, FrameStream(a))
            nursery.start_soon(accept, FrameStream(b))

    trio.run(main)
    err = out["dial"]
    assert err is None or isinstance(err, BaseException)
    return err, out["accept"]


def test_peers_sharing_the_secret_agree_on_who_and_what_for() -> None:
    assert handshake(S, S) == (None, (1, "raft"))
    assert handshake(S, S, purpose="rpc") == (None, (1, "rpc"))


def test_a_dialer_without_the_secret_is_refused_by_the_acceptor() -> None:
    """The dialer sees the acceptor's proof fail first and stops; the acceptor never
    accepts it either way."""
    dial_err, accepted = handshake(b"a guess at the secret", S)
    assert isinstance(dial_err, PeerRefused) and "cluster secret" in str(dial_err)
    assert isinstance(accepted, PeerRefused)


def test_an_unknown_purpose_or_a_missing_nonce_is_malformed() -> None:
    async def main() -> None:
        a, b = trio.testing.memory_stream_pair()
        client, server = FrameStream(a), FrameStream(b)
        for hello in ({"op": 1, "node": 1, "nonce": ND, "purpose": "gossip"},
                      {"op": 1, "node": 1}):
            await client.send(hello)
            frame = await server.receive()
            assert frame is not None
            with pytest.raises(PeerRefused):
                await accept_peer(server, frame, S, 2, {1: "", 2: ""})
            answer = await client.receive()
            assert answer is not None and answer.header["code"] == Code.MALFORMED

    trio.run(main)


@pytest.mark.parametrize("subject, node", [
    ((((("commonName", "raftmq-n2"),),)), 2),
    (((("organizationName", "x"),), (("commonName", "raftmq-n17"),)), 17),
    (((("commonName", "raftmq-namesrv"),),), None),
    (((("commonName", "raftmq-n02"),),), None),
    (((("commonName", "raftmq-n"),),), None),
    (((("commonName", "raftmq-n1"),), (("commonName", "raftmq-n2"),)), None),
    (((("organizationName", "raftmq-n2"),),), None),
])
def test_a_certificate_names_a_node_by_its_common_name(subject: object, node: int | None) -> None:
    from transport.peerauth import certificate_node, node_certificate_name

    assert certificate_node({"subject": subject}) == node
    assert certificate_node(None) is None and node_certificate_name(5) == "raftmq-n5"


@pytest.mark.parametrize("alt, node", [
    ((("DNS", "raftmq-n3"), ("DNS", "host3.example")), 3),  # a SAN names it
    ((("DNS", "raftmq-n2"),), 2),  # agrees with the common name
    ((("DNS", "raftmq-n4"),), None),  # disagrees: names no node
    ((("IP Address", "127.0.0.1"),), 2),  # other SAN kinds say nothing
    ((("URI", "raftmq-n4"),), 2),
])
def test_a_certificate_may_name_its_node_in_a_dns_subject_alternative_name(
        alt: object, node: int | None) -> None:
    from transport.peerauth import certificate_node

    subject = ((("commonName", "raftmq-n2"),),) if node != 3 else ((("commonName", "h"),),)
    assert certificate_node({"subject": subject, "subjectAltName": alt}) == node
