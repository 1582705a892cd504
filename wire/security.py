"""What clients, the CLI and nodes share about users and ACLs: the rule for user names, a
SCRAM-SHA-256 verifier and its text form, and the rule for an ACL entry's fields.

They sit below the broker so that `raftmq user`, `raftmq acl` and `raftmq dev` make and
check verifiers without loading the state machine and the Raft runtime; the broker's
users and ACL parts take these same definitions.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

import scramp

from wire.protocol import Code

__all__ = ["ACL_FIELDS", "ACL_KINDS", "ACL_PATTERNS", "ACL_PERMISSIONS", "ITERATIONS",
           "KEY_BYTES", "MAX_ITERATIONS", "MECHANISM", "MIN_ITERATIONS", "OPERATIONS",
           "SALT_BYTES", "Credential", "acl_problem", "credential_problem",
           "format_verifier", "make_credential", "read_verifier", "user_name_problem"]

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096  # RFC 7677's minimum, what `raftmq user add` uses
OPERATIONS = ("publish", "subscribe", "admin")  # what an ACL allows or denies
ACL_KINDS = ("topic", "group", "cluster", "transactional-id", "producer-group")
ACL_PATTERNS = ("literal", "prefix")
ACL_PERMISSIONS = ("allow", "deny")
ACL_FIELDS = ("principal", "kind", "pattern", "name", "operation", "permission")
MIN_ITERATIONS = 4096  # RFC 7677's minimum for SCRAM-SHA-256
MAX_ITERATIONS = 10_000_000
KEY_BYTES = 32  # SHA-256 digest size: StoredKey and ServerKey
SALT_BYTES = (16, 64)

_USER = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_RESOURCE = re.compile(r"[A-Za-z0-9_%|.-]{0,255}")
VERIFIER_PREFIX = "SCRAM-SHA-256$"
_MECH = scramp.ScramMechanism(MECHANISM)


def user_name_problem(name: object) -> str | None:
    """Why `name` is no user name (1-64 of letters, digits and `_ . @ -`), or None."""
    if isinstance(name, str) and _USER.fullmatch(name):
        return None
    return f"a user name is 1-64 characters of letters, digits and _.@-; got {name!r}"


@dataclass(frozen=True, slots=True)
class Credential:
    """A user's SCRAM-SHA-256 verifier."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def make_credential(password: str, iterations: int = ITERATIONS) -> Credential:
    """A fresh verifier of `password` (random salt): what the client sends to store, so
    the password never leaves it."""
    salt, stored_key, server_key, n = _MECH.make_auth_info(password, iteration_count=iterations)
    return Credential(salt, n, stored_key, server_key)


def format_verifier(c: Credential) -> str:
    """PostgreSQL's text form of a verifier: `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:
    <ServerKey>` (base64), for a node config's `superuser_scram`."""
    def b(x: bytes) -> str:
        return base64.b64encode(x).decode()
    return f"{VERIFIER_PREFIX}{c.iterations}:{b(c.salt)}${b(c.stored_key)}:{b(c.server_key)}"


def credential_problem(c: Credential) -> str | None:
    """Why `c` is no usable verifier (field sizes and iteration bounds), or None."""
    lo, hi = SALT_BYTES
    if not lo <= len(c.salt) <= hi:
        return f"salt must be {lo}..{hi} bytes"
    if not MIN_ITERATIONS <= c.iterations <= MAX_ITERATIONS:
        return f"iterations must be an integer {MIN_ITERATIONS}..{MAX_ITERATIONS}"
    for name, key in (("stored_key", c.stored_key), ("server_key", c.server_key)):
        if len(key) != KEY_BYTES:
            return f"{name} must be {KEY_BYTES}..{KEY_BYTES} bytes"
    return None


def read_verifier(text: str) -> Credential:
    """`format_verifier`'s output back; ValueError naming what is wrong."""
    try:
        if not text.startswith(VERIFIER_PREFIX):
            raise ValueError(f"does not start with {VERIFIER_PREFIX!r}")
        head, keys = text[len(VERIFIER_PREFIX):].split("$")
        iterations, salt = head.split(":")
        stored, server = keys.split(":")
        c = Credential(base64.b64decode(salt, validate=True), int(iterations),
                       base64.b64decode(stored, validate=True),
                       base64.b64decode(server, validate=True))
        problem = credential_problem(c)
        if problem is not None:
            raise ValueError(problem)
    except (ValueError, binascii.Error) as exc:
        raise ValueError(f"not a SCRAM-SHA-256 verifier "
                         f"(SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>): "
                         f"{exc}") from None
    return c


def _choice_problem(field: str, v: object, choices: tuple[str, ...]) -> str | None:
    if v in choices:
        return None
    return f"{field} must be one of {', '.join(choices)}; got {v!r}"


def acl_problem(principal: object, kind: object, pattern: object, name: object,
                operation: object, permission: object) -> tuple[Code, str] | None:
    """Why these fields are no ACL entry (`broker.state.parts.acls`), as the code and
    reason to refuse it with, or None. Checked in this order: the principal (`*` or a
    user name: INVALID_NAME), the kind, pattern, operation and permission (MALFORMED),
    the resource name (INVALID_NAME; a transactional id's is 0-255 printable
    characters, any other 0-255 of letters, digits and `_%|.-`), then how they combine:
    the cluster has no name (literal ''), any other literal pattern needs one."""
    if principal != "*":
        problem = user_name_problem(principal)
        if problem is not None:
            return Code.INVALID_NAME, problem
    for field, v, choices in (("kind", kind, ACL_KINDS), ("pattern", pattern, ACL_PATTERNS),
                              ("operation", operation, OPERATIONS),
                              ("permission", permission, ACL_PERMISSIONS)):
        problem = _choice_problem(field, v, choices)
        if problem is not None:
            return Code.MALFORMED, problem
    if kind == "transactional-id":  # any id a producer may use, or a prefix
        if not isinstance(name, str) or len(name) > 255 or not name.isprintable():
            return Code.INVALID_NAME, ("a transactional id is 0-255 printable characters; "
                                       f"got {name!r}")
    elif not isinstance(name, str) or not _RESOURCE.fullmatch(name):
        return Code.INVALID_NAME, ("resource name must be 0-255 characters of letters, "
                                   f"digits and _%|.-; got {name!r}")
    if kind == "cluster" and (pattern, name) != ("literal", ""):
        return Code.MALFORMED, "the cluster resource has no name: literal ''"
    if pattern == "literal" and kind != "cluster" and not name:
        return Code.MALFORMED, "a literal pattern needs a name (a prefix '' matches every name)"
    return None
