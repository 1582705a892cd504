"""Client credentials, replicated: SCRAM-SHA-256 verifiers, never passwords.

A user is stored as RFC 5802's server-side verifier: a random salt, the PBKDF2 iteration
count, `StoredKey = H(HMAC(SaltedPassword, "Client Key"))` and `ServerKey =
HMAC(SaltedPassword, "Server Key")`. From these a node can check a client's proof and
prove itself to the client, but cannot recover the password or log in as the user (the
proof needs `ClientKey`, which StoredKey is a hash of). The client computes the verifier
(`raftmq user add` does, with scramp) so the password never leaves it either.

Users live in the cluster's metadata group (`NodeConfig.metadata_group`, see
`broker.doors.security`); this part exists in every group's state but only that group's
records are proposed and read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from broker.state.parts.base import ControlRecord, ControlResult, Handler, Part, Refused, int_field
from wire.protocol import Code
from wire.security import (
    KEY_BYTES,
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SALT_BYTES,
    Credential,
    format_verifier,
    read_verifier,
    user_name_problem,
)

__all__ = ["Credential", "UserDelete", "UserPut", "Users", "format_verifier", "parse_verifier",
           "validate_user_name"]


def validate_user_name(name: object) -> str:
    """A user name: 1-64 of letters, digits and `_ . @ -` (Refused(INVALID_NAME) if not)."""
    problem = user_name_problem(name)
    if problem is not None:
        raise Refused(Code.INVALID_NAME, problem)
    assert isinstance(name, str)
    return name


def parse_verifier(text: str) -> Credential:
    """`format_verifier`'s output back; Refused(MALFORMED) naming what is wrong."""
    try:
        return read_verifier(text)
    except ValueError as exc:
        raise Refused(Code.MALFORMED, str(exc)) from None


def _bytes(name: str, v: object, lo: int, hi: int) -> bytes:
    if not isinstance(v, bytes) or not lo <= len(v) <= hi:
        raise Refused(Code.MALFORMED, f"{name} must be {lo}..{hi} bytes")
    return v


@dataclass(frozen=True, slots=True)
class UserPut(ControlRecord):
    """Create user `name`, or replace its credential (a password change)."""

    op: ClassVar[str] = "user_put"
    name: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def validate(self) -> None:
        validate_user_name(self.name)
        _bytes("salt", self.salt, *SALT_BYTES)
        int_field("iterations", self.iterations, MIN_ITERATIONS, MAX_ITERATIONS)
        _bytes("stored_key", self.stored_key, KEY_BYTES, KEY_BYTES)
        _bytes("server_key", self.server_key, KEY_BYTES, KEY_BYTES)

    def to_map(self) -> dict[str, Any]:
        return {"name": self.name, "salt": self.salt, "iterations": self.iterations,
                "stored_key": self.stored_key, "server_key": self.server_key}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> UserPut:
        return cls(d.get("name"), d.get("salt"), d.get("iterations"),  # type: ignore[arg-type]
                   d.get("stored_key"), d.get("server_key"))  # type: ignore[arg-type]

    @property
    def credential(self) -> Credential:
        return Credential(self.salt, self.iterations, self.stored_key, self.server_key)


@dataclass(frozen=True, slots=True)
class UserDelete(ControlRecord):
    """Remove user `name` (applied=0 when there was none)."""

    op: ClassVar[str] = "user_del"
    name: str

    def validate(self) -> None:
        validate_user_name(self.name)

    def to_map(self) -> dict[str, Any]:
        return {"name": self.name}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> UserDelete:
        return cls(d.get("name"))  # type: ignore[arg-type]


class Users(Part):
    """name -> SCRAM verifier."""

    name = "users"
    version = 1
    records = (UserPut, UserDelete)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self._users: dict[str, Credential] = {}
        # how often the table changed in this process (not replicated: a cheap way for
        # the node to notice a change, e.g. to tell the name servers)
        self.changes = 0

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {UserPut.op: (UserPut, self._put), UserDelete.op: (UserDelete, self._delete)}

    def _put(self, rec: UserPut, index: int) -> ControlResult:
        self._users[rec.name] = rec.credential
        self.changes += 1
        return ControlResult(UserPut.op, 1)

    def _delete(self, rec: UserDelete, index: int) -> ControlResult:
        self.changes += 1
        return ControlResult(UserDelete.op, int(self._users.pop(rec.name, None) is not None))

    def credential(self, name: str) -> Credential | None:
        return self._users.get(name)

    def names(self) -> list[str]:
        return sorted(self._users)

    def section(self) -> Any:
        return [[n, c.salt, c.iterations, c.stored_key, c.server_key]
                for n, c in sorted(self._users.items())]

    def load(self, version: int, section: Any) -> None:
        if version != 1:
            raise ValueError(f"unsupported users section version {version!r}")
        users: dict[str, Credential] = {}
        for name, salt, iterations, stored_key, server_key in section:
            rec = UserPut(name, salt, iterations, stored_key, server_key)  # validates
            users[rec.name] = rec.credential
        self._users = users
        self.changes += 1
