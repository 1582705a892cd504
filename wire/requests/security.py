"""Users and ACLs, kept in the cluster's metadata group: USER_PUT, USER_DELETE,
USER_LIST, ACL_ADD, ACL_REMOVE, ACL_LIST; and AUTH, a client's SCRAM-SHA-256 login.

The field rules are `wire.security`'s, which the state machine's users and ACL parts
apply too: a user name that is wrong in any way (left out included) is INVALID_NAME, as
is an ACL's principal or resource name; the rest of a verifier or an ACL entry is
MALFORMED, each field checked in the order the parts check it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from wire.protocol import Code, Op, RequestError
from wire.requests.base import Check, WireType, spec, str_list
from wire.security import (
    ACL_FIELDS,
    KEY_BYTES,
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SALT_BYTES,
    Credential,
    acl_problem,
    user_name_problem,
)

__all__ = [
    "AUTH_STEPS",
    "AclAddAnswer",
    "AclAddRequest",
    "AclListAnswer",
    "AclListRequest",
    "AclRemoveAnswer",
    "AclRemoveRequest",
    "AuthAnswer",
    "AuthRequest",
    "UserDeleteAnswer",
    "UserDeleteRequest",
    "UserListAnswer",
    "UserListRequest",
    "UserPutAnswer",
    "UserPutRequest",
    "check_user_name",
]

AUTH_STEPS = ("first", "final")

AclRow = tuple[str, str, str, str, str, str]


def check_user_name(v: object) -> str:
    """A user name (`wire.security.user_name_problem`), or INVALID_NAME."""
    problem = user_name_problem(v)
    if problem is not None:
        raise RequestError(Code.INVALID_NAME, problem)
    assert isinstance(v, str)
    return v


def _sized(name: str, lo: int, hi: int) -> Check:
    def check(v: bytes) -> bytes:
        if not lo <= len(v) <= hi:
            raise RequestError(Code.MALFORMED, f"{name} must be {lo}..{hi} bytes")
        return v
    return check


def _iterations(v: int) -> int:
    if not MIN_ITERATIONS <= v <= MAX_ITERATIONS:
        raise RequestError(Code.MALFORMED, f"iterations must be an integer "
                           f"{MIN_ITERATIONS}..{MAX_ITERATIONS}, got {v!r}")
    return v


def _acl_rows(v: list[Any]) -> tuple[AclRow, ...]:
    out = []
    for row in v:
        if not (isinstance(row, list) and len(row) == len(ACL_FIELDS)
                and all(isinstance(x, str) for x in row)):
            raise RequestError(Code.MALFORMED, "acls must be [[principal, kind, pattern, "
                               "name, operation, permission], ...]")
        out.append(tuple(row))
    return tuple(out)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- users


@dataclass(frozen=True, slots=True, kw_only=True)
class UserPutRequest(WireType):
    """Create a user or replace its verifier (a password change): the client computes
    the verifier, so the password never leaves it."""

    OP: ClassVar[Op] = Op.USER_PUT
    ROLE: ClassVar[str] = "request"
    user: str = spec(str, "the user name (1-64 of letters, digits and `_.@-`)",
                     check=check_user_name)
    salt: bytes = spec(bytes, f"the SCRAM salt ({SALT_BYTES[0]}..{SALT_BYTES[1]} bytes)",
                       check=_sized("salt", *SALT_BYTES))
    iterations: int = spec(int, f"PBKDF2 iterations ({MIN_ITERATIONS}..{MAX_ITERATIONS})",
                           check=_iterations)
    stored_key: bytes = spec(bytes, f"StoredKey ({KEY_BYTES} bytes)",
                             check=_sized("stored_key", KEY_BYTES, KEY_BYTES))
    server_key: bytes = spec(bytes, f"ServerKey ({KEY_BYTES} bytes)",
                             check=_sized("server_key", KEY_BYTES, KEY_BYTES))

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        check_user_name(h.get("user"))  # INVALID_NAME whatever is wrong, absence included
        return super(UserPutRequest, cls).decode(h)

    @classmethod
    def of(cls, user: str, c: Credential) -> UserPutRequest:
        """The request storing verifier `c` for `user`."""
        return cls(user=user, salt=c.salt, iterations=c.iterations, stored_key=c.stored_key,
                   server_key=c.server_key)


@dataclass(frozen=True, slots=True, kw_only=True)
class UserPutAnswer(WireType):
    OP: ClassVar[Op] = Op.USER_PUT
    ROLE: ClassVar[str] = "answer"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserDeleteRequest(WireType):
    OP: ClassVar[Op] = Op.USER_DELETE
    ROLE: ClassVar[str] = "request"
    user: str = spec(str, "the user name", check=check_user_name)

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        check_user_name(h.get("user"))  # INVALID_NAME whatever is wrong, absence included
        return super(UserDeleteRequest, cls).decode(h)


@dataclass(frozen=True, slots=True, kw_only=True)
class UserDeleteAnswer(WireType):
    OP: ClassVar[Op] = Op.USER_DELETE
    ROLE: ClassVar[str] = "answer"
    deleted: bool = spec(bool, "there was such a user")


@dataclass(frozen=True, slots=True, kw_only=True)
class UserListRequest(WireType):
    OP: ClassVar[Op] = Op.USER_LIST
    ROLE: ClassVar[str] = "request"


@dataclass(frozen=True, slots=True, kw_only=True)
class UserListAnswer(WireType):
    OP: ClassVar[Op] = Op.USER_LIST
    ROLE: ClassVar[str] = "answer"
    users: tuple[str, ...] = spec(list, "the user names, sorted", check=str_list("users"))


# ---------------------------------------------------------------------- ACLs


@dataclass(frozen=True, slots=True, kw_only=True)
class _AclRequest(WireType):
    """One ACL entry's fields (see `broker.state.parts.acls`)."""

    principal: str = spec(str, "a user name, or `*` for every authenticated user")
    kind: str = spec(str, "the resource kind: topic, group, cluster, transactional-id "
                     "or producer-group")
    pattern: str = spec(str, "`literal` (the name) or `prefix` (names starting with it)")
    name: str = spec(str, "the resource name (the cluster's is '')")
    operation: str = spec(str, "publish, subscribe or admin")
    permission: str = spec(str, "allow or deny (deny wins)")

    @classmethod
    def decode(cls, h: Mapping[str, Any]) -> Self:
        problem = acl_problem(*(h.get(f) for f in ACL_FIELDS))
        if problem is not None:
            raise RequestError(*problem)
        return super(_AclRequest, cls).decode(h)

    @classmethod
    def of(cls, row: AclRow | list[str]) -> Self:
        """The request about entry `row` ([principal, kind, pattern, name, operation,
        permission], as ACL_LIST lists it)."""
        return cls(**dict(zip(ACL_FIELDS, row, strict=True)))

    def row(self) -> AclRow:
        return (self.principal, self.kind, self.pattern, self.name, self.operation,
                self.permission)


@dataclass(frozen=True, slots=True, kw_only=True)
class AclAddRequest(_AclRequest):
    OP: ClassVar[Op] = Op.ACL_ADD
    ROLE: ClassVar[str] = "request"


@dataclass(frozen=True, slots=True, kw_only=True)
class AclAddAnswer(WireType):
    OP: ClassVar[Op] = Op.ACL_ADD
    ROLE: ClassVar[str] = "answer"
    added: bool = spec(bool, "the entry was not there yet")


@dataclass(frozen=True, slots=True, kw_only=True)
class AclRemoveRequest(_AclRequest):
    OP: ClassVar[Op] = Op.ACL_REMOVE
    ROLE: ClassVar[str] = "request"


@dataclass(frozen=True, slots=True, kw_only=True)
class AclRemoveAnswer(WireType):
    OP: ClassVar[Op] = Op.ACL_REMOVE
    ROLE: ClassVar[str] = "answer"
    removed: bool = spec(bool, "the entry was there")


@dataclass(frozen=True, slots=True, kw_only=True)
class AclListRequest(WireType):
    OP: ClassVar[Op] = Op.ACL_LIST
    ROLE: ClassVar[str] = "request"


@dataclass(frozen=True, slots=True, kw_only=True)
class AclListAnswer(WireType):
    OP: ClassVar[Op] = Op.ACL_LIST
    ROLE: ClassVar[str] = "answer"
    acls: tuple[AclRow, ...] = spec(list, "`[principal, kind, pattern, name, operation, "
                                    "permission]` each", check=_acl_rows)


# ---------------------------------------------------------------------- AUTH


def _step(v: str) -> str:
    if v not in AUTH_STEPS:
        raise RequestError(Code.MALFORMED, "AUTH needs step 'first' or 'final' and msg")
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthRequest(WireType):
    """SCRAM-SHA-256 (RFC 5802/7677) in two rounds, before any other request on a client
    connection (see `broker.doors.security`)."""

    OP: ClassVar[Op] = Op.AUTH
    ROLE: ClassVar[str] = "request"
    step: str = spec(str, "`first`, then `final`", check=_step)
    msg: str = spec(str, "the client-first message, then the client-final one (the proof)")


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthAnswer(WireType):
    OP: ClassVar[Op] = Op.AUTH
    ROLE: ClassVar[str] = "answer"
    msg: str = spec(str, "the server-first message (salt, iterations, nonce), then the "
                    "server-final one (the server's proof)")
    user: str | None = spec(str, "after `final`: the user now logged in", default=None)
