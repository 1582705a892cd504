"""Every request type is behind its check (`broker.doors.security.RULES`).

The protocol's request types are enumerated (the transactions' included): each must
have a rule, and for each the guard
in front of a real handler must refuse an unauthenticated caller and a user without
ACLs before the handler runs, unless the rule says any user may (cluster metadata). With
the ACLs the rule asks for, the same request reaches the handler: the check is the rule,
not a blanket no. ACL matching itself: literal and prefix, allow and deny, deny wins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from broker.config import NodeConfig
from broker.doors.security import ANY_USER, NOT_A_REQUEST, PEER_ONLY, RULES, Guard, make_credential
from broker.state.parts.acls import KINDS, Acl, AclAdd, Acls
from broker.state.parts.users import UserPut
from broker.state.statemachine import BrokerState
from raftlog.types import Entry, EntryType
from transport.framing import Caller
from transport.scram import Credentials, Exchange
from wire.protocol import Code, Frame, Op, RequestError
from wire.records import OutgoingMessage, encode_batch

ALL_OPS = sorted(int(op) for op in Op)
TX_OPS = range(60, 70)  # the transaction ops (issue 14)


def test_every_request_type_has_a_rule() -> None:
    assert set(TX_OPS) <= set(ALL_OPS)  # the transactions' ops are among those checked
    missing = [op for op in ALL_OPS if op not in RULES]
    assert missing == [], f"request types without an authorization rule: {missing}"


class Group:
    def __init__(self) -> None:
        self.machine = BrokerState("g0")
        self.is_leader = True
        self.is_current = True  # has applied an entry of its term (see the test below)
        self.leader = 1
        self.group_id = "g0"
        self.index = 0

    def apply(self, data: bytes) -> None:
        self.index += 1
        self.machine.apply(Entry(term=1, index=self.index, type=EntryType.CONTROL, data=data))


class Host:
    def __init__(self, tmp: Path) -> None:
        self.config = NodeConfig.from_dict({
            "node_id": 1, "listen": "127.0.0.1:7101", "data": str(tmp),
            "peers": {1: "127.0.0.1:7101"}, "groups": [{"id": "g0", "replicas": [1]}],
            "authenticate": True, "authorize": True, "superusers": ["root"],
            "cluster_secret": "this test node's own secret"})
        self.g0 = Group()
        self.groups = {"g0": self.g0}
        cred = make_credential("nobody's password", iterations=4096)
        self.g0.apply(UserPut("nobody", cred.salt, cred.iterations, cred.stored_key,
                              cred.server_key).encode())
        self.refusals: list[str] = []

    def peer_addr(self, node: int | None) -> str | None:
        return None

    def count_refusal(self, reason: str) -> None:
        self.refusals.append(reason)


BATCH = encode_batch("t.orders", 0, [OutgoingMessage(b"x")])


def request(op: int) -> Frame:
    """A request of type `op` with every field some rule reads."""
    header: dict[str, Any] = {"op": op, "id": 7, "topic": "t.orders", "cg": "cg.main",
                              "offsets": [["t.orders", 0, 1]], "g": "g0", "tid": "app-1",
                              "pg": "pg.main"}
    return Frame(header, bytes(BATCH) if op == Op.PRODUCE else b"")


def call(guard: Guard, caller: Caller, op: int) -> tuple[bool, RequestError | None]:
    reached: list[int] = []

    async def handler(_c: Caller, frame: Frame) -> tuple[dict[str, Any], bytes]:
        reached.append(frame.header["op"])
        return {"code": 0}, b""

    async def main() -> RequestError | None:
        try:
            await guard.wrap(handler)(caller, request(op))
        except RequestError as exc:
            return exc
        return None

    err = trio.run(main)
    return bool(reached), err


NOBODY = Credentials("nobody", "nobody's password")


def logged_in(guard: Guard, creds: Credentials = NOBODY) -> Caller:
    """A connection that logged in as `creds` through the guard's own AUTH steps (a
    login holds only while its user keeps the verifier it proved)."""
    caller = Caller("test")
    ex = Exchange(creds)

    async def handler(_c: Caller, _frame: Frame) -> tuple[dict[str, Any], bytes]:
        raise AssertionError("AUTH is the guard's own")

    async def main() -> None:
        step = guard.wrap(handler)
        first, _ = await step(caller, Frame(ex.first(), b""))
        final, _ = await step(caller, Frame(ex.final(first["msg"]), b""))
        ex.check(final["msg"])

    trio.run(main)
    assert caller.principal == creds.user
    return caller


@pytest.mark.parametrize("op", ALL_OPS)
def test_no_request_type_reaches_its_handler_unchecked(tmp_path: Path, op: int) -> None:
    host = Host(tmp_path)
    guard = Guard(host)
    owned = op in guard.owned_ops
    if op != Op.AUTH:  # anyone may try to log in
        reached, err = call(guard, Caller("test"), op)
        assert not reached and err is not None and err.code == Code.UNAUTHENTICATED, op
    nobody = logged_in(guard)
    reached, err = call(guard, nobody, op)
    rule = RULES[op]
    if rule == ANY_USER:
        return
    assert not reached and err is not None and err.code == Code.FORBIDDEN, (op, err)
    assert host.refusals[-1] == "acl"
    if rule in (PEER_ONLY, NOT_A_REQUEST) or owned:
        return
    for kind in KINDS:  # the ACLs the rule asks for: now it passes
        for operation in ("publish", "subscribe", "admin"):
            pattern, name = ("literal", "") if kind == "cluster" else ("prefix", "")
            host.g0.apply(AclAdd(Acl("nobody", kind, pattern, name, operation,
                                     "allow")).encode())
    reached, err = call(guard, nobody, op)
    assert reached and err is None, (op, err)
    assert call(guard, Caller("peer", peer=2), op)[0]  # nodes are never asked
    ghost = Caller("test", principal="ghost")  # logged in, then removed: logged out
    reached, err = call(guard, ghost, op)
    assert not reached and err is not None and err.code == Code.UNAUTHENTICATED, (op, err)
    assert ghost.principal is None and host.refusals[-1] == "unauthenticated"


def needs(op: Op, header: dict[str, Any], body: bytes = b"") -> list[tuple[str, str, str]]:
    rule = RULES[op]
    assert callable(rule)
    return rule(header, body)


def test_a_transactional_id_and_a_producer_group_are_resources() -> None:
    """Issue 24 #8: publish on the cluster let a user TX_INIT any transactional id and
    decide any half message as the operator. Now every request and batch naming an id
    needs publish on that id, a half message's end its producer group, and an
    operator's decision cluster admin."""
    tid = ("transactional-id", "app-1", "publish")
    for op in (Op.TX_INIT, Op.TX_ADD, Op.TX_END, Op.TX_STATUS):
        assert needs(op, {"tid": "app-1"}) == [tid], op
    assert tid in needs(Op.TX_OFFSETS, {"tid": "app-1", "cg": "cg", "offsets": [["t", 0, 1]]})
    tx_batch = encode_batch("t", 0, [b"x"], tx=("app-1", 0, 0))
    half = encode_batch("t", 0, [b"x"], half=("h1", "pg.a"))
    assert needs(Op.PRODUCE, {}, bytes(tx_batch)) == [("topic", "t", "publish"), tid]
    assert needs(Op.PRODUCE, {"sizes": [len(half)]}, bytes(half)) == [
        ("topic", "t", "publish"), ("producer-group", "pg.a", "publish")]
    pg = [("producer-group", "pg.a", "publish")]
    assert needs(Op.HALF_END, {"pg": "pg.a"}) == pg
    assert needs(Op.HALF_END, {"pg": "pg.a", "source": "client"}) == pg
    assert needs(Op.PRODUCER_HEARTBEAT, {"pg": "pg.a"}) == pg
    for header in ({"pg": "", "source": "operator"}, {"pg": "pg.a", "source": "operator"}):
        assert needs(Op.HALF_END, header) == [("cluster", "", "admin")]


def test_a_transactional_id_acl_takes_any_printable_id() -> None:
    s = BrokerState("g0")
    acl = Acl("etl", "transactional-id", "literal", "spark job: 7/2", "publish", "allow")
    s.apply(Entry(term=1, index=1, type=EntryType.CONTROL, data=AclAdd(acl).encode()))
    acls = BrokerState.restore("g0", s.snapshot()).part(Acls)
    assert acls.allowed("etl", "transactional-id", "spark job: 7/2", "publish")
    assert not acls.allowed("etl", "transactional-id", "spark job: 7/3", "publish")
    assert not acls.allowed("etl", "topic", "spark job: 7/2", "publish")


def test_an_unknown_request_type_is_refused(tmp_path: Path) -> None:
    guard = Guard(Host(tmp_path))
    reached, err = call(guard, logged_in(guard), 250)
    assert not reached and err is not None and err.code == Code.FORBIDDEN
    assert call(guard, Caller("test", principal="root"), 250)[0]  # a superuser passes


def test_acls_literal_prefix_and_deny_wins() -> None:
    s = BrokerState("g0")
    for i, acl in enumerate([
        Acl("alice", "topic", "prefix", "orders.", "publish", "allow"),
        Acl("alice", "topic", "literal", "orders.secret", "publish", "deny"),
        Acl("*", "group", "literal", "readers", "subscribe", "allow"),
    ], start=1):
        s.apply(Entry(term=1, index=i, type=EntryType.CONTROL, data=AclAdd(acl).encode()))
    acls = BrokerState.restore("g0", s.snapshot()).part(Acls)
    assert acls.allowed("alice", "topic", "orders.eu", "publish")
    assert not acls.allowed("alice", "topic", "orders.secret", "publish")  # deny wins
    assert not acls.allowed("alice", "topic", "orders.eu", "subscribe")  # default deny
    assert not acls.allowed("alice", "topic", "payments", "publish")
    assert not acls.allowed("bob", "topic", "orders.eu", "publish")
    assert acls.allowed("bob", "group", "readers", "subscribe")  # '*': every user
    assert not acls.allowed("bob", "group", "readers2", "subscribe")  # literal is exact


def test_a_login_ends_when_its_user_is_put_again_with_another_verifier(
        tmp_path: Path) -> None:
    """Removed and added again, or a new password: the login proved a verifier the user
    no longer has, so it no longer holds, whatever the order the changes applied in."""
    host = Host(tmp_path)
    guard = Guard(host)
    caller = logged_in(guard)
    assert call(guard, caller, Op.STATUS)[0]
    same = make_credential(NOBODY.password, iterations=4096)  # same password, new salt
    host.g0.apply(UserPut("nobody", same.salt, same.iterations, same.stored_key,
                          same.server_key).encode())
    reached, err = call(guard, caller, Op.STATUS)
    assert not reached and err is not None and err.code == Code.UNAUTHENTICATED
    assert "password changed" in err.message and caller.principal is None
    assert call(guard, logged_in(guard), Op.STATUS)[0]  # a new login proves the new one


def test_a_replica_catching_up_answers_retry_not_unknown_user_or_forbidden(
        tmp_path: Path) -> None:
    """Until the metadata replica has applied an entry of its current term (after a
    restart the commit index must be learned again), its users and ACLs may be an old
    state: a login and a request are answered UNAVAILABLE, to be retried, instead of a
    verdict drawn from that state."""
    host = Host(tmp_path)
    guard = Guard(host)
    caller = logged_in(guard)
    host.g0.is_current = False
    reached, err = call(guard, caller, Op.STATUS)
    assert not reached and err is not None and err.code == Code.UNAVAILABLE, err
    assert err.retriable and "catching up" in err.message
    assert caller.principal == "nobody"  # not logged out on an old state's say-so
    with pytest.raises(RequestError) as info:
        logged_in(guard)
    assert info.value.code == Code.UNAVAILABLE and host.refusals.count("auth") == 0
    host.g0.is_current = True
    assert call(guard, caller, Op.STATUS)[0]
    assert call(guard, logged_in(guard), Op.STATUS)[0]
