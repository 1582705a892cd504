"""The typed user, ACL and login requests and answers (`wire.requests.security`): each
survives the wire, and a bad header gets the code the users and ACL parts always gave it
(a user name or resource name wrong in any way, absence included, INVALID_NAME; the rest
MALFORMED, naming the field) — the parts and the types apply `wire.security`'s rules."""

from __future__ import annotations

from typing import Any

import pytest

from broker.state.parts.acls import Acl
from broker.state.parts.base import Refused
from wire.protocol import Code, RequestError
from wire.requests.base import WireType
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
from wire.security import ACL_FIELDS, make_credential

CRED = make_credential("secret")
ENTRY = ("alice", "topic", "prefix", "orders.", "publish", "allow")

SAMPLES: list[WireType] = [
    UserPutRequest.of("alice", CRED),
    UserPutAnswer(),
    UserDeleteRequest(user="alice"),
    UserDeleteAnswer(deleted=True),
    UserListRequest(),
    UserListAnswer(users=("alice", "bob")),
    AclAddRequest.of(ENTRY),
    AclAddAnswer(added=True),
    AclRemoveRequest.of(ENTRY),
    AclRemoveAnswer(removed=False),
    AclListRequest(),
    AclListAnswer(acls=(ENTRY, ("*", "cluster", "literal", "", "admin", "deny"))),
    AuthRequest(step="first", msg="n,,n=alice,r=abc"),
    AuthAnswer(msg="r=abcdef,s=c2FsdA==,i=4096"),
    AuthAnswer(msg="v=proof", user="alice"),
]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: type(s).__name__)
def test_each_type_survives_the_wire(sample: WireType) -> None:
    assert type(sample).decode(sample.header()) == sample
    assert sample.describe().startswith(sample.OP.name)


def test_an_acl_request_carries_the_entry_acl_list_lists() -> None:
    req = AclAddRequest.of(list(ENTRY))
    assert req.row() == ENTRY and req.header() == dict(zip(ACL_FIELDS, ENTRY, strict=True))
    assert UserPutRequest.of("alice", CRED).salt == CRED.salt


def _put(**fields: Any) -> dict[str, Any]:
    return {**UserPutRequest.of("alice", CRED).header(), **fields}


def _acl(**fields: Any) -> dict[str, Any]:
    return {**dict(zip(ACL_FIELDS, ENTRY, strict=True)), **fields}


def _without(h: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in h.items() if k != name}


@pytest.mark.parametrize(("kind", "header", "code", "says"), [
    (UserPutRequest, _without(_put(), "user"), Code.INVALID_NAME, "user name"),
    (UserPutRequest, _put(user=5), Code.INVALID_NAME, "user name"),
    (UserPutRequest, _put(user="bad name!"), Code.INVALID_NAME, "user name"),
    (UserPutRequest, _without(_put(), "salt"), Code.MALFORMED, "salt"),
    (UserPutRequest, _put(salt="text"), Code.MALFORMED, "salt"),
    (UserPutRequest, _put(salt=b"short"), Code.MALFORMED, "salt"),
    (UserPutRequest, _without(_put(), "iterations"), Code.MALFORMED, "iterations"),
    (UserPutRequest, _put(iterations=True), Code.MALFORMED, "iterations"),
    (UserPutRequest, _put(iterations=1000), Code.MALFORMED, "iterations"),
    (UserPutRequest, _put(stored_key=b"k" * 31), Code.MALFORMED, "stored_key"),
    (UserPutRequest, _without(_put(), "server_key"), Code.MALFORMED, "server_key"),
    (UserPutRequest, _put(server_key=[1]), Code.MALFORMED, "server_key"),
    (UserDeleteRequest, {}, Code.INVALID_NAME, "user name"),
    (UserDeleteRequest, {"user": ""}, Code.INVALID_NAME, "user name"),
    (AclAddRequest, _without(_acl(), "principal"), Code.INVALID_NAME, "user name"),
    (AclAddRequest, _acl(principal="a b"), Code.INVALID_NAME, "user name"),
    (AclAddRequest, _without(_acl(), "kind"), Code.MALFORMED, "kind"),
    (AclAddRequest, _acl(kind="queue"), Code.MALFORMED, "kind"),
    (AclAddRequest, _acl(pattern="glob"), Code.MALFORMED, "pattern"),
    (AclAddRequest, _acl(operation="read"), Code.MALFORMED, "operation"),
    (AclRemoveRequest, _acl(permission=True), Code.MALFORMED, "permission"),
    (AclRemoveRequest, _without(_acl(), "name"), Code.INVALID_NAME, "name"),
    (AclRemoveRequest, _acl(name="no spaces"), Code.INVALID_NAME, "name"),
    (AclAddRequest, _acl(kind="transactional-id", name="a\nb"), Code.INVALID_NAME,
     "transactional id"),
    (AclAddRequest, _acl(kind="cluster", name="x"), Code.MALFORMED, "cluster"),
    (AclAddRequest, _acl(pattern="literal", name=""), Code.MALFORMED, "literal"),
    # the first wrong field decides, in the ACL part's order: the operation before the name
    (AclAddRequest, _acl(operation="read", name="a b"), Code.MALFORMED, "operation"),
    (AclListAnswer, {"acls": [["a", "topic"]]}, Code.MALFORMED, "acls"),
    (UserListAnswer, {"users": [1]}, Code.MALFORMED, "users"),
    (AuthRequest, {"msg": "x"}, Code.MALFORMED, "step"),
    (AuthRequest, {"step": "second", "msg": "x"}, Code.MALFORMED, "step"),
    (AuthRequest, {"step": "first"}, Code.MALFORMED, "msg"),
    (AuthRequest, {"step": "first", "msg": b"x"}, Code.MALFORMED, "msg"),
    (AuthAnswer, {"msg": "x", "user": 3}, Code.MALFORMED, "user"),
])
def test_a_bad_header_is_refused_with_the_parts_code(
        kind: type[WireType], header: dict[str, Any], code: Code, says: str) -> None:
    with pytest.raises(RequestError) as caught:
        kind.decode(header)
    assert caught.value.code == code, caught.value
    assert says in caught.value.message


@pytest.mark.parametrize("fields", [
    _acl(), _acl(principal="*"), _acl(kind="cluster", pattern="literal", name=""),
    _acl(principal="x y"), _acl(kind="queue"), _acl(name="a b"),
    _acl(kind="transactional-id", name="any id: at all"), _acl(kind="cluster", name="x"),
    _without(_acl(), "name"), _acl(pattern="literal", name="", permission="maybe"),
])
def test_the_request_and_the_acl_part_judge_an_entry_alike(fields: dict[str, Any]) -> None:
    """One rule (`wire.security.acl_problem`): what the request refuses, the part's record
    refuses with the same code, and what it takes, the record takes."""
    part: Code | None = None
    try:
        Acl(*(fields.get(f) for f in ACL_FIELDS)).validate()  # type: ignore[arg-type]
    except Refused as exc:
        part = exc.code
    request: Code | None = None
    try:
        AclAddRequest.decode(fields)
    except RequestError as exc:
        request = exc.code
    assert request == part
