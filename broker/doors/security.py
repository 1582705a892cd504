"""Who may ask a node what: client authentication at connection start, then one check per
request, in front of every handler (`Guard.wrap` wraps the service's `handle`; no handler
checks anything itself, so a request type cannot slip past by forgetting to).

Authentication is SCRAM-SHA-256 (RFC 5802 with RFC 7677's hash), Kafka's and
PostgreSQL's mechanism, through the `scramp` package on both sides. It was chosen over
RocketMQ's access-key scheme (an HMAC-SHA1 signature of every request under a secret
key) because the node then stores no secret a thief could use: a SCRAM verifier
(salt, iterations, StoredKey, ServerKey; `broker.state.parts.users`) checks a client's proof
but cannot produce one, while an access-key server must keep every secret key itself.
SCRAM also authenticates the node to the client (the server signature) and costs one
round trip per connection rather than a signature per request; with TLS underneath,
nothing of it can be replayed or read.

The exchange, before any other request on a client connection::

    client -> AUTH (step: "first", msg: client-first-message)
    node   -> OK   (msg: server-first-message)           salt, iterations, nonce
    client -> AUTH (step: "final", msg: client-final-message)   the proof
    node   -> OK   (msg: server-final-message, user)     or UNAUTHENTICATED

Users live in the cluster's metadata group (`NodeConfig.metadata_group`): a node checks
a proof against its own replica of that group, so every node must host one (the default
layout replicates every group on three nodes). Before any user is stored, the one
configured superuser logs in with `superuser_scram`, a verifier in the node config. A
node that holds no replica of the metadata group (a membership change moved it away)
refuses every other login with UNKNOWN_GROUP but still takes that superuser's, checked
against its config, so the group can be hosted there again (HOST_GROUP goes to that
node).
An unknown user gets a made-up salt, derived from the cluster secret (`cluster_secret`,
the same in every node's config) and the name, so the exchange looks the same as for a
known one and fails only at the proof, and every node makes up the same salt for the same
name: asking two nodes does not tell a stored user from an unknown one. A failed login
is answered, then the connection is closed: each guess costs a new connection (and
`max_connections` bounds those).

Authorization (`authorize = true`): every request type maps to the resources it touches
and the operation it needs on each (`RULES`: topic, consumer group, transactional id,
producer group or cluster; publish, subscribe or admin), checked against the ACLs of the
metadata group (`broker.state.parts.acls`; deny wins, default deny); configured superusers
pass. A request type without a rule is refused, so one added later is closed until
someone maps it.

Peers (the peer handshake, mutual TLS) are never asked: they are nodes of the cluster.
Refusals are counted in `raftmq_connections_refused_total` (reasons `auth`,
`unauthenticated`, `acl`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn, Protocol

import trio

from broker.config import NodeConfig
from broker.doors.refusals import refusal
from broker.state.parts.acls import Acl, AclAdd, AclRemove, Acls
from broker.state.parts.base import ErrorResult, Refused
from broker.state.parts.users import Credential, UserDelete, UserPut, Users, parse_verifier
from broker.state.statemachine import BrokerState
from raftlog.runtime import GroupRuntime, NotLeader, ProposalDropped, ProposalLost
from raftlog.types import EntryType
from transport.framing import Caller, Response
from transport.scram import LoginFailed, ServerLogins
from wire.produce import split_batches
from wire.protocol import Code, Frame, Op, RequestError, ok_header
from wire.records import batch_header
from wire.requests.security import (
    AclAddAnswer,
    AclAddRequest,
    AclListAnswer,
    AclListRequest,
    AclRemoveAnswer,
    AclRemoveRequest,
    AuthAnswer,
    AuthRequest,
    UserDeleteAnswer,
    UserDeleteRequest,
    UserListAnswer,
    UserListRequest,
    UserPutAnswer,
    UserPutRequest,
)
from wire.security import ITERATIONS, MECHANISM, make_credential

__all__ = ["ANY_USER", "MECHANISM", "NOT_A_REQUEST", "PEER_ONLY", "REGISTERED_USERS_BYTES",
           "RULES", "Guard", "fake_salt_key", "make_credential"]

log = logging.getLogger("raftmq.security")

#: What the users' verifiers may take of a registration to the name servers: they ride in
#: its header (at most 1 MiB, beside the groups' reports), some 100 bytes a user with a
#: name of ten characters (about 5,000 users), at most 206 (about 2,500 users with the
#: longest names and salts). With more, a registration carries none but the configured
#: superuser's, and the name servers refuse every other login (fail closed) rather than
#: the registration failing whole and the node's routes expiring there.
REGISTERED_USERS_BYTES = 512 << 10
# msgpack of one [name, salt, iterations, StoredKey, ServerKey] row beside its name and
# salt (user names are ASCII): array, string and bin headers, an int, two 32-byte keys
_ROW_OVERHEAD = 1 + 2 + 2 + 5 + 2 * (2 + 32)

FrameHandler = Callable[[Caller, Frame], Awaitable[Response | None]]


def fake_salt_key(cluster_secret: str) -> bytes:
    """The key behind the made-up salts of unknown users: derived from the cluster secret,
    so every node of a cluster makes up the same salt for a name (a random key per
    process would tell unknown names apart by asking two nodes)."""
    return hmac.new(cluster_secret.encode(), b"raftmq-unknown-user-salt",
                    hashlib.sha256).digest()


# ---------------------------------------------------------------------- the rules

#: Markers for requests that name no resource: `ANY_USER` may be made by any
#: authenticated user (cluster metadata every client needs to find its way: routes,
#: topic shapes, node status); `PEER_ONLY` only by nodes (the service refuses clients
#: too); `NOT_A_REQUEST` is never a client's request to a node (the name server's own
#: ops, requests a node sends to a client), so it is refused here.
ANY_USER = "any-user"
PEER_ONLY = "peer-only"
NOT_A_REQUEST = "not-a-request"

Need = tuple[str, str, str]  # (kind, resource name, operation)
Resolver = Callable[[Mapping[str, Any], bytes], list[Need]]

def _text(h: Mapping[str, Any], name: str) -> str:
    v = h.get(name)
    if not isinstance(v, str):
        raise RequestError(Code.MALFORMED, f"field {name!r} must be a string")
    return v


def _on(kind: str, field: str, operation: str) -> Resolver:
    return lambda h, _b: [(kind, _text(h, field), operation)]


def _cluster(operation: str) -> Resolver:
    return lambda _h, _b: [("cluster", "", operation)]


def _produce(h: Mapping[str, Any], body: bytes) -> list[Need]:
    """Publish on the topic of every batch in the request (one or several), and on the
    transactional id of a transaction's batch or the producer group of a half message:
    a batch header naming someone else's id is no way around their ACLs."""
    batches = [memoryview(body)] if "sizes" not in h else split_batches(h["sizes"], body)
    needs: list[Need] = []
    for b in batches:
        header = batch_header(b)
        needs.append(("topic", header.topic, "publish"))
        if header.tx is not None:
            needs.append(("transactional-id", header.tx[0], "publish"))
        if header.half is not None:
            needs.append(("producer-group", header.half[1], "publish"))
    return needs


def _tx_offsets(h: Mapping[str, Any], b: bytes) -> list[Need]:
    """A transaction's offsets: a commit's needs, and publish on its transactional id."""
    return [*_offset_topics(h, b), ("transactional-id", _text(h, "tid"), "publish")]


def _half_end(h: Mapping[str, Any], _b: bytes) -> list[Need]:
    """Publish on the half message's producer group; deciding as the operator (any
    producer group's, or none) is cluster admin."""
    if h.get("source") == "operator":
        return [("cluster", "", "admin")]
    return [("producer-group", _text(h, "pg"), "publish")]


def _offset_topics(h: Mapping[str, Any], _b: bytes) -> list[Need]:
    """Subscribe on the group and on every topic whose offsets are committed."""
    rows = h.get("offsets")
    if not isinstance(rows, list):
        raise RequestError(Code.MALFORMED, "field 'offsets' must be a list")
    needs: list[Need] = [("group", _text(h, "cg"), "subscribe")]
    for row in rows:
        if not isinstance(row, list) or not row or not isinstance(row[0], str):
            raise RequestError(Code.MALFORMED, "an offsets row is [topic, queue, offset]")
        needs.append(("topic", row[0], "subscribe"))
    return needs


def _simple(h: Mapping[str, Any], _b: bytes) -> list[Need]:
    """A simple consumer's receive, ack, nack or change of invisible time: subscribe on
    its consumer group and on the topic."""
    return [("group", _text(h, "cg"), "subscribe"), ("topic", _text(h, "topic"), "subscribe")]


def _dlq(h: Mapping[str, Any], _b: bytes) -> list[Need]:
    """A consumer group's dead letters: listing and showing them is the group's
    (subscribe), resending and purging them its administrator's (admin, as deleting
    the group is)."""
    operation = "subscribe" if h.get("action") in ("list", "show") else "admin"
    return [("group", _text(h, "cg"), operation)]


def _offsets(h: Mapping[str, Any], _b: bytes) -> list[Need]:
    """One group's offsets: subscribe on it; every group's: cluster admin."""
    if h.get("cg") is None:
        return [("cluster", "", "admin")]
    return [("group", _text(h, "cg"), "subscribe")]


def _trace(h: Mapping[str, Any], _b: bytes) -> list[Need]:
    """A traced client's report: what its traced sends or reads needed -- publish on the
    topic for a producer's, subscribe on the topic and the group for a consumer's. (The
    trace topic itself is written by the node; reading it needs subscribe on it.)"""
    if h.get("role") == "producer":
        return [("topic", _text(h, "topic"), "publish")]
    return [("group", _text(h, "cg"), "subscribe"), ("topic", _text(h, "topic"), "subscribe")]


RULES: dict[int, Resolver | str] = {
    Op.HELLO: PEER_ONLY, Op.RAFT: PEER_ONLY, Op.READ_RAW: PEER_ONLY,
    Op.AUTH: ANY_USER,  # (handled before authentication is asked for)
    Op.PRODUCE: _produce,
    Op.FETCH: _on("topic", "topic", "subscribe"),
    Op.COMMIT_OFFSET: _offset_topics,
    Op.QUERY_OFFSET: _on("group", "cg", "subscribe"),
    Op.CREATE_TOPIC: _on("topic", "topic", "admin"),
    Op.DELETE_TOPIC: _on("topic", "topic", "admin"),
    Op.GROW_TOPIC: _on("topic", "topic", "admin"),
    Op.TOPICS: ANY_USER, Op.STATUS: ANY_USER,
    Op.GET_MESSAGE: _cluster("subscribe"),  # by id: any topic's message
    Op.QUERY_KEY: _on("topic", "topic", "subscribe"),
    Op.OFFSET_FOR_TIME: _on("topic", "topic", "subscribe"),
    Op.TRANSFER_LEADER: _cluster("admin"),
    Op.OFFSETS: _offsets,
    Op.DELETE_GROUP: _on("group", "cg", "admin"),
    Op.HEARTBEAT: _on("group", "cg", "subscribe"),
    Op.CONSUMERS: _on("group", "cg", "subscribe"),
    Op.MEMBERSHIP: _cluster("admin"), Op.HOST_GROUP: _cluster("admin"),
    Op.DROP_GROUP: _cluster("admin"),
    Op.USER_PUT: _cluster("admin"), Op.USER_DELETE: _cluster("admin"),
    Op.USER_LIST: _cluster("admin"),
    Op.ACL_ADD: _cluster("admin"), Op.ACL_REMOVE: _cluster("admin"),
    Op.ACL_LIST: _cluster("admin"),
    Op.REGISTER: NOT_A_REQUEST, Op.ROUTE: NOT_A_REQUEST, Op.CLUSTER: NOT_A_REQUEST,
    # transactions: a transactional id is a resource of its own (Kafka's TransactionalId
    # write: TX_INIT fences the id's producer), a half message's producer group too
    Op.TX_INIT: _on("transactional-id", "tid", "publish"),
    Op.TX_ADD: _on("transactional-id", "tid", "publish"),
    Op.TX_OFFSETS: _tx_offsets, Op.TX_END: _on("transactional-id", "tid", "publish"),
    Op.TX_MARKER: PEER_ONLY, Op.TX_STATUS: _on("transactional-id", "tid", "publish"),
    Op.HALF_END: _half_end, Op.TX_LIST: _cluster("admin"),
    Op.TX_CHECK: NOT_A_REQUEST,  # the node asks the producer, never the other way
    Op.PRODUCER_HEARTBEAT: _on("producer-group", "pg", "publish"),
    Op.RECEIVE: _simple, Op.ACK: _simple, Op.NACK: _simple, Op.CHANGE_INVISIBLE: _simple,
    Op.SEND_BACK: _simple,
    Op.DLQ: _dlq,
    # queue locks fence offset commits: the permission a commit needs
    Op.LOCK: _simple, Op.UNLOCK: _simple, Op.LOCKS: _offsets,
    Op.TRACE: _trace,
}


class GuardHost(Protocol):
    """What the guard needs of its node."""

    config: NodeConfig

    @property
    def groups(self) -> Mapping[str, GroupRuntime[BrokerState]]: ...

    def peer_addr(self, node: int | None) -> str | None: ...

    def count_refusal(self, reason: str) -> None: ...

    def users_changed(self) -> None: ...


class Guard:
    """Authentication (and, when configured, authorization) in front of a node's service."""

    def __init__(self, node: GuardHost) -> None:
        self.node = node
        cfg = node.config
        self.authenticate = cfg.authenticate
        self.authorize = cfg.authorize
        self.superusers = frozenset(cfg.superusers)
        self._bootstrap: dict[str, Credential] = {}
        if cfg.superuser_scram:
            self._bootstrap[cfg.superusers[0]] = parse_verifier(cfg.superuser_scram)
        self._fake_key = fake_salt_key(cfg.cluster_secret)  # made-up salts, unknown users
        self.failures = LoginFailures(cfg.login_failures_before_delay, cfg.login_delay_max)
        self._logins = ServerLogins()
        # the open connections logged in as each user, closed when the user is removed
        self._sessions: dict[str, weakref.WeakSet[Caller]] = {}
        # the verifier (stored key) each connection proved its password against: a login
        # holds only while the user still has it, so removing a user and adding it again,
        # or changing its password, also ends the logins made before
        self._proved: weakref.WeakKeyDictionary[Caller, bytes] = weakref.WeakKeyDictionary()
        self._registered_over = False  # the users outgrew a registration (logged once)
        self._own: dict[int, Callable[[Caller, dict[str, Any]], Awaitable[Response]]] = {
            Op.AUTH: self._auth,
            Op.USER_PUT: self._user_put,
            Op.USER_DELETE: self._user_delete,
            Op.USER_LIST: self._user_list,
            Op.ACL_ADD: self._acl_add,
            Op.ACL_REMOVE: self._acl_remove,
            Op.ACL_LIST: self._acl_list,
        }

    @property
    def owned_ops(self) -> frozenset[int]:
        """The request types the guard answers itself."""
        return frozenset(self._own)

    def wrap(self, handler: FrameHandler) -> FrameHandler:
        """`handler` behind the checks: what the node serves client connections with."""

        async def guarded(caller: Caller, frame: Frame) -> Response | None:
            h = frame.header
            op = h.get("op")
            if isinstance(op, int) and not isinstance(op, bool):
                self.check(caller, op, h, frame.body)
                own = self._own.get(op)
                if own is not None:
                    header, body = await own(caller, h)
                    header["id"] = h.get("id", 0)
                    return header, body
            return await handler(caller, frame)

        return guarded

    # ------------------------------------------------------------------ the check

    def check(self, caller: Caller, op: int, header: Mapping[str, Any],
              body: bytes = b"") -> None:
        """Raise unless `caller` may make request `op` now: authenticated first (when
        authentication is on), except for AUTH itself, as a user this node's replica
        still has (a removed user's open connection is logged out); then, with authorization on,
        allowed by the ACLs on every resource `RULES` maps it to (superusers always
        are). Peers always may. Without authorization, managing users and ACLs still
        takes a superuser."""
        if caller.is_peer or op == Op.AUTH:
            return
        if not self.authenticate:
            return
        user = caller.principal
        if user is None:
            self.node.count_refusal("unauthenticated")
            raise RequestError(Code.UNAUTHENTICATED, "authenticate first: this cluster takes "
                               f"requests from {MECHANISM}-authenticated users only (AUTH)")
        if user in self.superusers:
            return
        if not self._login_holds(caller, user, self._users()):
            caller.principal = None
            self.node.count_refusal("unauthenticated")
            raise RequestError(Code.UNAUTHENTICATED, f"user {user!r} was removed or its "
                               "password changed after this connection logged in: "
                               "authenticate again (AUTH)")
        if not self.authorize:
            if op in _SECURITY_OPS:
                self._deny(user, op, "only a superuser may manage users and ACLs")
            return
        rule = RULES.get(op)
        if rule is None or rule in (PEER_ONLY, NOT_A_REQUEST):
            self._deny(user, op, "this request type is not one a client may make here")
        if rule == ANY_USER:
            return
        assert callable(rule)
        acls = self._acls()
        for kind, name, operation in rule(header, body):
            if not acls.allowed(user, kind, name, operation):
                where = "the cluster" if kind == "cluster" else f"{kind} {name!r}"
                self._deny(user, op, f"no ACL allows {operation} on {where}")

    def visibility(self, caller: Caller) -> Callable[[str, str], bool] | None:
        """What `caller` may see of the topics and consumer groups in an answer that
        lists them (STATUS): None for everything (no authorization, a peer, a superuser,
        cluster admin), else a test `(kind, name) -> bool`: a topic it may publish,
        subscribe or administer; a group it may subscribe to or administer (what OFFSETS
        of one group asks)."""
        user = caller.principal
        if caller.is_peer or not self.authorize:
            return None
        if user is None:  # (the check before any handler refuses it first)
            return lambda _kind, _name: False
        if user in self.superusers:
            return None
        acls = self._acls()
        if acls.allowed(user, "cluster", "", "admin"):
            return None

        def see(kind: str, name: str) -> bool:
            ops = ("publish", "subscribe", "admin") if kind == "topic" else ("subscribe", "admin")
            return any(acls.allowed(user, kind, name, op) for op in ops)

        return see

    def check_answer(self, caller: Caller, op: int, header: Mapping[str, Any]) -> None:
        """Raise unless the answer `caller` gave to this node's own request may act as
        request `op` with `header` would (a TX_CHECK's commit or rollback is a HALF_END):
        checked now, when it would take effect, as the connection's user, so a user
        removed or denied since it registered cannot decide anything."""
        self.check(caller, op, header)

    def _deny(self, user: str, op: int, why: str) -> NoReturn:
        self.node.count_refusal("acl")
        raise RequestError(Code.FORBIDDEN, f"{_op_name(op)}: user {user!r}: {why}")

    # ------------------------------------------------------------------ AUTH

    def _metadata(self) -> BrokerState:
        gid = self.node.config.metadata_group
        g = self.node.groups.get(gid) if gid is not None else None
        if g is None:
            raise RequestError(Code.UNKNOWN_GROUP, f"this node holds no replica of the "
                               f"metadata group {gid!r}, where users and ACLs are kept; "
                               "connect to a node that does")
        if not g.is_current:
            # after a restart its users and ACLs are an old state until the commit index
            # is learned again: a user added since would be "unknown", a grant "missing"
            raise RequestError(Code.UNAVAILABLE, f"this node's replica of the metadata "
                               f"group {gid!r}, where users and ACLs are kept, is catching "
                               "up with its leader; retry")
        return g.machine

    def _users(self) -> Users:
        return self._metadata().part(Users)

    def _acls(self) -> Acls:
        return self._metadata().part(Acls)

    def _lookup(self, name: str) -> Credential:
        try:
            users: Users | None = self._users()
        except RequestError:
            # No metadata replica here (it was moved away, or is being re-created): only
            # the configured superuser, whose verifier is this node's own config, can be
            # checked, so an operator can still host the metadata group here again.
            if name not in self._bootstrap:
                raise
            users = None
        cred = (users.credential(name) if users is not None else None) or self._bootstrap.get(name)
        if cred is not None:
            return cred
        fake = hmac.new(self._fake_key, name.encode(), hashlib.sha256).digest()
        return Credential(fake[:16], ITERATIONS, fake, fake)  # no password matches it

    async def _auth(self, caller: Caller, h: dict[str, Any]) -> Response:
        AuthRequest.decode(h)  # the name server's logins (`ServerLogins.step`) check it alike
        step, msg = self._logins.step(caller, h)
        if step == "first":
            if not self._bootstrap:
                self._users()  # fails before anything when this node cannot check

            def lookup(name: str) -> tuple[bytes, bytes, bytes, int]:
                c = self._lookup(name)
                self._proved[caller] = c.stored_key  # what the final step proves
                return c.salt, c.stored_key, c.server_key, c.iterations

            answer = AuthAnswer(msg=self._logins.first(caller, msg, lookup))
            return ok_header(0, **answer.header()), b""
        try:
            user, final = self._logins.final(caller, msg)
        except LoginFailed as failed:
            # guesses from there failed in a row: each next failure is answered later (a
            # right password never waits, so no one is locked out by another's guesses)
            delay = self.failures.delay(caller.remote)
            self.failures.failed(caller.remote)
            self.node.count_refusal("auth")
            caller.hang_up()  # one try per connection: guessing costs a new connection
            log.info("authentication failed", extra={"fields": {"user": failed.user,
                                                                "remote": caller.remote}})
            if delay:
                self.node.count_refusal("login_delayed")
                await trio.sleep(delay)
            raise RequestError(Code.UNAUTHENTICATED, "authentication failed: unknown user or "
                               "wrong password") from None
        self.failures.succeeded(caller.remote)
        try:
            caller.log_in(user)  # the node's limits for logged-in connections apply now
        except RequestError:
            caller.hang_up()
            raise
        self._sessions.setdefault(user, weakref.WeakSet()).add(caller)
        return ok_header(0, **AuthAnswer(msg=final, user=user).header()), b""

    # ------------------------------------------------------------------ revocation

    def _login_holds(self, caller: Caller, user: str, users: Users) -> bool:
        """Whether `caller`'s login as `user` still holds: the user exists with the
        verifier the login proved (removed and added again, or a new password, is not
        the login's user any more)."""
        cred = users.credential(user)
        return cred is not None and self._proved.get(caller) == cred.stored_key

    def close_removed(self) -> int:
        """Close every open connection logged in as a user this node's replica no longer
        has (the configured superusers excepted); how many were closed."""
        try:
            users = self._users()
        except RequestError:
            return 0  # no replica to judge by: the per-request check still holds
        closed = 0
        for user in list(self._sessions):
            if user in self.superusers:  # as in `check`: they pass whatever the table says
                continue
            callers = self._sessions[user]
            gone = [c for c in list(callers)
                    if c.principal == user and not self._login_holds(c, user, users)]
            for caller in gone:
                callers.discard(caller)
                caller.principal = None
                caller.disconnect()
                closed += 1
            if not len(callers):
                del self._sessions[user]
        if closed:
            log.info("closed the connections of removed users", extra={"fields": {
                "connections": closed}})
        return closed

    async def run(self) -> None:
        """The guard's duty: when the users the metadata group holds change, close the
        connections of users it removed (so a removed user's open connection can neither
        make requests nor answer the node's own, TX_CHECK) and register with the name
        servers at once (they check logins against the users nodes register)."""
        if not self.authenticate:
            return
        seen = -1
        while True:
            gid = self.node.config.metadata_group
            g = self.node.groups.get(gid) if gid is not None else None
            with trio.move_on_after(1.0):  # the group may come and go (membership)
                if g is None:
                    await trio.sleep_forever()
                await g.wait_applied_change()
            if g is None or not g.is_open:
                continue
            changes = g.machine.part(Users).changes
            if changes != seen:
                seen = changes
                self.close_removed()
                self.node.users_changed()

    def registration_auth(self) -> dict[str, Any] | None:
        """What a name server needs to check logins itself (None with authentication off):
        every user's SCRAM verifier (and the configured superuser's), the applied index
        of this node's metadata replica they come from (a name server believes the
        freshest), and the key of the made-up salts of unknown users, so a name server
        answers the first login step as every node does. Registrations travel over TLS
        to name servers that took this node's certificate (`namesrv.server`)."""
        if not self.authenticate:
            return None
        users: dict[str, list[Any]] = {}
        at = -1
        gid = self.node.config.metadata_group
        g = self.node.groups.get(gid) if gid is not None else None
        over = False
        if g is not None and g.is_open:
            at = int(g.status()["applied"])  # that of this table: name servers trust the highest
            table = g.machine.part(Users).section()
            size = sum(len(row[0]) + len(row[1]) + _ROW_OVERHEAD for row in table)
            over = size > REGISTERED_USERS_BYTES
            if over != self._registered_over:  # said once, when it starts (or stops)
                self._registered_over = over
                if over:
                    log.warning("the users' verifiers exceed what a registration carries: "
                                "the name servers take only the configured superuser's "
                                "login", extra={"fields": {"users": len(table), "bytes": size,
                                                           "max": REGISTERED_USERS_BYTES}})
            if not over:
                for name, *verifier in table:
                    users[name] = verifier
        for name, c in self._bootstrap.items():
            users.setdefault(name, [c.salt, c.iterations, c.stored_key, c.server_key])
        return {"at": at, "users": [[n, *v] for n, v in sorted(users.items())],
                "salt_key": self._fake_key, "over": over}

    # ------------------------------------------------------------------ users

    def _metadata_leader(self) -> GroupRuntime[BrokerState]:
        gid = self.node.config.metadata_group
        g = self.node.groups.get(gid) if gid is not None else None
        if g is None:
            raise RequestError(Code.UNKNOWN_GROUP, f"this node holds no replica of the "
                               f"metadata group {gid!r}")
        if not g.is_leader:
            raise RequestError(Code.NOT_LEADER, f"this node does not lead the metadata group "
                               f"{gid}", leader=self.node.peer_addr(g.leader), g=gid)
        try:
            g.check_ready()  # elected a moment ago: NOT_LEADER naming itself, ready false
        except NotLeader as exc:
            raise refusal(exc, self.node.peer_addr, g=g.group_id) from None
        return g

    async def propose(self, data: bytes) -> Any:
        """Propose a control record to the metadata group; its result, or RequestError."""
        g = self._metadata_leader()
        try:
            result = await g.propose(data, EntryType.CONTROL)
        except (NotLeader, ProposalDropped, ProposalLost) as exc:
            raise refusal(exc, self.node.peer_addr, g=g.group_id) from None
        if isinstance(result, ErrorResult):
            raise RequestError(result.code, result.message)
        return result

    async def _user_put(self, caller: Caller, h: dict[str, Any]) -> Response:
        req = UserPutRequest.decode(h)
        try:
            rec = UserPut(req.user, req.salt, req.iterations, req.stored_key, req.server_key)
        except Refused as exc:
            raise RequestError(exc.code, exc.message) from None
        await self.propose(rec.encode())
        return ok_header(0, **UserPutAnswer().header()), b""

    async def _user_delete(self, caller: Caller, h: dict[str, Any]) -> Response:
        req = UserDeleteRequest.decode(h)
        try:
            rec = UserDelete(req.user)
        except Refused as exc:
            raise RequestError(exc.code, exc.message) from None
        result = await self.propose(rec.encode())
        return ok_header(0, **UserDeleteAnswer(deleted=bool(result.applied)).header()), b""

    async def _user_list(self, caller: Caller, h: dict[str, Any]) -> Response:
        UserListRequest.decode(h)
        answer = UserListAnswer(users=tuple(self._users().names()))
        return ok_header(0, **answer.header()), b""

    # ------------------------------------------------------------------ ACLs

    @staticmethod
    def _acl(req: AclAddRequest | AclRemoveRequest) -> Acl:
        acl = Acl(*req.row())
        try:
            acl.validate()  # the rule the request type applied: wire.security.acl_problem
        except Refused as exc:
            raise RequestError(exc.code, exc.message) from None
        return acl

    async def _acl_add(self, caller: Caller, h: dict[str, Any]) -> Response:
        acl = self._acl(AclAddRequest.decode(h))
        result = await self.propose(AclAdd(acl).encode())
        return ok_header(0, **AclAddAnswer(added=bool(result.applied)).header()), b""

    async def _acl_remove(self, caller: Caller, h: dict[str, Any]) -> Response:
        acl = self._acl(AclRemoveRequest.decode(h))
        result = await self.propose(AclRemove(acl).encode())
        return ok_header(0, **AclRemoveAnswer(removed=bool(result.applied)).header()), b""

    async def _acl_list(self, caller: Caller, h: dict[str, Any]) -> Response:
        AclListRequest.decode(h)
        answer = AclListAnswer(acls=tuple(
            (a.principal, a.kind, a.pattern, a.name, a.operation, a.permission)
            for a in self._acls().entries()))
        return ok_header(0, **answer.header()), b""


_SECURITY_OPS = frozenset({Op.USER_PUT, Op.USER_DELETE, Op.USER_LIST, Op.ACL_ADD,
                           Op.ACL_REMOVE, Op.ACL_LIST})


class LoginFailures:
    """Failed logins in a row per remote host, for slowing the next ones down.

    After `free` failures in a row from one host, each further failed login from
    there is answered only after a delay that doubles with every failure, from 0.1 s
    up to `max_delay`; a success (never delayed: a right password must not wait on
    someone else's guesses, nor time out and so never reset the count) forgets the
    host. This slows guesses made one after another; guesses in parallel are bounded
    by the connections a node keeps before a login. At most `capacity` hosts are
    remembered (the least recently seen is forgotten first), so the bookkeeping is
    bounded however many addresses an attacker has."""

    def __init__(self, free: int, max_delay: float, capacity: int = 4096) -> None:
        self.free = free
        self.max_delay = max_delay
        self.capacity = capacity
        self._failed: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failed)

    @staticmethod
    def _host(remote: str) -> str:
        return remote.rpartition(":")[0] or remote

    def delay(self, remote: str) -> float:
        """Seconds to wait before answering a failed login from `remote` (0: none)."""
        n = self._failed.get(self._host(remote), 0)
        if n < self.free:
            return 0.0
        return min(self.max_delay, 0.1 * 2.0 ** min(n - self.free, 32))

    def failed(self, remote: str) -> None:
        host = self._host(remote)
        self._failed[host] = self._failed.pop(host, 0) + 1
        while len(self._failed) > self.capacity:
            self._failed.popitem(last=False)

    def succeeded(self, remote: str) -> None:
        self._failed.pop(self._host(remote), None)


def _op_name(op: int) -> str:
    try:
        return Op(op).name
    except ValueError:
        return f"op {op}"
