"""The peer handshake: a node proves it belongs to the cluster before it is a peer.

Peers and clients share one listener, so a connection is a peer's only once both ends
have shown they know the cluster secret (`cluster_secret` in the node config), with an
HMAC-SHA256 challenge-response in which neither sends the secret::

    dialer   -> HELLO  (node: i, nonce: Nd, purpose)
    acceptor -> OK     (node: j, nonce: Na, proof: mac("accept", i, j, Nd, Na))
    dialer   -> HELLO  (node: i, proof: mac("dial", i, j, Nd, Na))
    acceptor -> OK     (or FORBIDDEN, and the connection closes)

Each side checks the other's proof over both fresh nonces, so a recorded exchange cannot
be replayed, and the direction label keeps one side's proof from serving as the other's.
`purpose` says what the connection is for after the handshake: `raft` (the pair's Raft
link) or `rpc` (requests such as READ_RAW, answered as from a peer).

The HMAC arithmetic is pure (`proof`, `check`); `dial_peer` and `accept_peer` run it
over a `FrameStream`. With TLS configured, a node also refuses a HELLO from a connection
that did not present a certificate from the cluster CA (`broker.node`, mutual TLS), so a
would-be peer needs both the certificate and the secret.

Over TLS the certificate also says *which* node it belongs to: its subject's common name
is `raftmq-n<id>` (`node_certificate_name`; `raftmq dev --tls` issues them so). Both ends
check it against the node id the handshake claims (`certificate_node`): the acceptor
against the HELLO's `node`, the dialer against the node it meant to reach. A certificate
naming another node, or none (the name server's `raftmq-namesrv`, a client's), cannot act
as a node, whatever secret comes with it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping

import trio

from wire.protocol import Code, Frame, Op, error_header, ok_header

from .framing import FrameStream
from .tls import is_tls, peer_certificate

__all__ = [
    "DEV_CLUSTER_SECRET",
    "HANDSHAKE_TIMEOUT",
    "PURPOSES",
    "PeerGone",
    "PeerRefused",
    "accept_peer",
    "certificate_node",
    "check",
    "dial_peer",
    "node_certificate_name",
    "proof",
    "refuse_peer",
]

log = logging.getLogger(__name__)

#: What a node config uses when it names no secret: enough for a local or test cluster,
#: where every node is started from the same files; a real deployment sets its own.
DEV_CLUSTER_SECRET = "raftmq-dev-cluster-secret"
HANDSHAKE_TIMEOUT = 5.0
PURPOSES = ("raft", "rpc")
_NONCE = 16


class PeerRefused(Exception):
    """The handshake failed: the other end is not (or could not prove it is) a peer."""


class PeerGone(PeerRefused):
    """The other end closed the connection before the handshake finished (a peer that
    is down behind a proxy looks like this)."""


def proof(secret: bytes, role: str, dialer: int, acceptor: int, dial_nonce: bytes,
          accept_nonce: bytes) -> bytes:
    """The MAC one side sends: over its role, both node ids and both nonces."""
    msg = b"|".join((b"raftmq-peer", role.encode(), str(dialer).encode(),
                     str(acceptor).encode(), dial_nonce, accept_nonce))
    return hmac.new(secret, msg, hashlib.sha256).digest()


def check(secret: bytes, given: object, role: str, dialer: int, acceptor: int,
          dial_nonce: bytes, accept_nonce: bytes) -> bool:
    """Whether `given` is the proof `role` should have sent (compared in constant time)."""
    if not isinstance(given, bytes):
        return False
    want = proof(secret, role, dialer, acceptor, dial_nonce, accept_nonce)
    return hmac.compare_digest(given, want)


_NAME_PREFIX = "raftmq-n"


def node_certificate_name(node: int) -> str:
    """The subject common name a certificate of node `node` carries."""
    return f"{_NAME_PREFIX}{node}"


def certificate_node(cert: Mapping[str, object] | None) -> int | None:
    """The node id a verified peer certificate (`ssl.SSLSocket.getpeercert()`'s form)
    names, in its subject's common name or a DNS subject alternative name
    (`raftmq-n<id>`, as certificates issued for hosts carry their names in SANs); None
    when it names no node (a name server's, a client's, or none at all). Names that
    name different nodes name none."""
    if not cert:
        return None
    names: list[object] = []
    subject = cert.get("subject", ())
    for rdn in subject if isinstance(subject, tuple) else ():
        for attr in rdn if isinstance(rdn, tuple) else ():
            if isinstance(attr, tuple) and len(attr) == 2 and attr[0] == "commonName":
                names.append(attr[1])
    alt = cert.get("subjectAltName", ())
    for entry in alt if isinstance(alt, tuple) else ():
        if isinstance(entry, tuple) and len(entry) == 2 and entry[0] == "DNS":
            names.append(entry[1])
    found = {n for n in map(_node_of_name, names) if n is not None}
    return found.pop() if len(found) == 1 else None


def _node_of_name(value: object) -> int | None:
    """The id in a name `raftmq-n<id>` (decimal, no leading zero), else None."""
    if not isinstance(value, str) or not value.startswith(_NAME_PREFIX):
        return None
    digits = value[len(_NAME_PREFIX):]
    if digits.isdigit() and digits.isascii() and not (len(digits) > 1 and digits[0] == "0"):
        return int(digits)
    return None


def _identity_mismatch(fs: FrameStream, node: int) -> str | None:
    """Why the TLS certificate of `fs`'s other end does not name `node` (None when it
    does, or when the stream is plain: without TLS the secret alone identifies peers)."""
    if not is_tls(fs.stream):
        return None
    cert = peer_certificate(fs.stream)
    named = certificate_node(cert)
    if named == node:
        return None
    if cert is None:
        return f"node {node} presented no certificate"
    shown = "no node" if named is None else f"node {named}"
    return (f"the certificate names {shown}, not node {node} (a node's certificate "
            f"has the subject CN {node_certificate_name(node)!r})")


def _node(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


async def _answer(fs: FrameStream) -> Frame:
    frame = await fs.receive()
    if frame is None:
        raise PeerGone("the other end closed the connection during the handshake")
    h = frame.header
    if h.get("code", 0) != 0:
        raise PeerRefused(f"refused: {h.get('msg')}")
    return frame


async def dial_peer(fs: FrameStream, secret: bytes, me: int, peer: int, *,
                    purpose: str = "raft", timeout: float = HANDSHAKE_TIMEOUT) -> None:
    """Run the dialer's side on a fresh connection to node `peer`; raises `PeerRefused`
    (or `trio.TooSlowError`, or the stream's errors) unless both ends proved the secret."""
    nd = secrets.token_bytes(_NONCE)
    with trio.fail_after(timeout):
        await fs.send({"op": int(Op.HELLO), "node": me, "nonce": nd, "purpose": purpose})
        h = (await _answer(fs)).header
        na = h.get("nonce")
        if h.get("node") != peer or not isinstance(na, bytes) or len(na) != _NONCE:
            raise PeerRefused(f"node {peer} answered the handshake as {h.get('node')!r}")
        mismatch = _identity_mismatch(fs, peer)
        if mismatch is not None:
            raise PeerRefused(f"dialing node {peer}: {mismatch}")
        if not check(secret, h.get("proof"), "accept", me, peer, nd, na):
            raise PeerRefused(f"node {peer} does not know the cluster secret")
        await fs.send({"op": int(Op.HELLO), "node": me,
                       "proof": proof(secret, "dial", me, peer, nd, na)})
        await _answer(fs)


async def accept_peer(fs: FrameStream, hello: Frame, secret: bytes, me: int,
                      peers: Mapping[int, str], *, timeout: float = HANDSHAKE_TIMEOUT) -> tuple[int, str]:
    """Run the acceptor's side after reading the first frame, a HELLO. Returns (peer node
    id, purpose); raises `PeerRefused` after telling the other end why (it should then
    be closed)."""
    h = hello.header
    peer, nd, purpose = _node(h.get("node")), h.get("nonce"), h.get("purpose", "raft")
    if peer is None or peer == me or peer not in peers:
        await _refuse(fs, Code.MALFORMED, f"HELLO from {h.get('node')!r}: not a peer of this node")
    assert peer is not None
    if not isinstance(nd, bytes) or len(nd) != _NONCE or purpose not in PURPOSES:
        await _refuse(fs, Code.MALFORMED, f"HELLO from node {peer}: needs a {_NONCE}-byte "
                      f"nonce and a purpose in {PURPOSES}")
    assert isinstance(nd, bytes)
    mismatch = _identity_mismatch(fs, peer)
    if mismatch is not None:
        await _refuse(fs, Code.FORBIDDEN, f"HELLO as node {peer}: {mismatch}")
    na = secrets.token_bytes(_NONCE)
    try:
        with trio.fail_after(timeout):
            await fs.send(ok_header(0, node=me, nonce=na,
                                    proof=proof(secret, "accept", peer, me, nd, na)))
            frame = await fs.receive()
    except trio.TooSlowError:
        raise PeerRefused(f"node {peer} did not finish the handshake in time") from None
    if frame is None or frame.header.get("op") != Op.HELLO or frame.header.get("node") != peer:
        raise PeerRefused(f"node {peer} broke off the handshake")
    if not check(secret, frame.header.get("proof"), "dial", peer, me, nd, na):
        await _refuse(fs, Code.FORBIDDEN, f"node {peer}: wrong proof of the cluster secret")
    with trio.move_on_after(timeout):
        await fs.send(ok_header(0))
    return peer, str(purpose)


async def refuse_peer(fs: FrameStream, message: str) -> None:
    """Turn away a would-be peer before the handshake (FORBIDDEN, with `message`)."""
    try:
        await _refuse(fs, Code.FORBIDDEN, message)
    except PeerRefused:
        pass


async def _refuse(fs: FrameStream, code: Code, message: str) -> None:
    log.warning("peer handshake refused", extra={"fields": {"reason": message}})
    with trio.move_on_after(2):
        try:
            await fs.send(error_header(0, code, message))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
    raise PeerRefused(message)
