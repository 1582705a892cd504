"""Access control lists, replicated: who may do what to which topic, consumer group,
transactional id, producer group or the cluster.

An entry says: `principal` (a user name, or `*` for every authenticated user) is
`allow`ed or `deny`ed `operation` (publish, subscribe or admin) on resources of `kind`
(topic, group, cluster, transactional-id, producer-group: a half message's) whose name
equals `name` (pattern `literal`) or starts with it
(pattern `prefix`; an empty prefix matches every name). A request is allowed when some
entry allows it and none denies it: deny wins, and with no entry at all the answer is
no (default deny). Superusers are the node config's, not entries here.

Like users, ACLs live in the metadata group (`broker.doors.security`).

The test mutation `drop-acl-remove` (the state's `mutations`) acknowledges every
`DROP_REMOVE_EVERY`-th removal of a present entry but keeps the entry: a lost change the
chaos workload `security` (`chaos.authcheck`) must catch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from broker.state.parts.base import ControlRecord, ControlResult, Handler, Part, Refused
from wire.protocol import Code
from wire.security import ACL_KINDS as KINDS
from wire.security import OPERATIONS, acl_problem

__all__ = ["KINDS", "OPERATIONS", "Acl", "AclAdd", "AclRemove", "Acls", "acl_from_fields"]

MAX_ACLS = 100_000
DROP_REMOVE_EVERY = 5  # the `drop-acl-remove` test mutation's period


@dataclass(frozen=True, slots=True, order=True)
class Acl:
    """One entry (see the module docstring)."""

    principal: str
    kind: str
    pattern: str
    name: str
    operation: str
    permission: str

    def validate(self) -> None:
        problem = acl_problem(self.principal, self.kind, self.pattern, self.name,
                              self.operation, self.permission)
        if problem is not None:
            raise Refused(*problem)

    def matches(self, principal: str, kind: str, name: str, operation: str) -> bool:
        return (self.principal in ("*", principal) and self.kind == kind
                and self.operation == operation
                and (name == self.name if self.pattern == "literal"
                     else name.startswith(self.name)))

    def to_list(self) -> list[str]:
        return [self.principal, self.kind, self.pattern, self.name, self.operation,
                self.permission]

    def describe(self) -> str:
        what = "cluster" if self.kind == "cluster" else (
            f"{self.kind} {self.name!r}" + (" (prefix)" if self.pattern == "prefix" else ""))
        return f"{self.permission} {self.principal} {self.operation} on {what}"


def _acl(d: Mapping[str, Any]) -> Acl:
    acl = Acl(d.get("principal"), d.get("kind"), d.get("pattern"),  # type: ignore[arg-type]
              d.get("name"), d.get("operation"), d.get("permission"))  # type: ignore[arg-type]
    acl.validate()
    return acl


@dataclass(frozen=True, slots=True)
class _AclChange(ControlRecord):
    """An entry added to or removed from the ACLs (the subclass says which)."""

    acl: Acl

    def validate(self) -> None:
        self.acl.validate()

    def to_map(self) -> dict[str, Any]:
        return {"acl": self.acl.to_list()}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> Self:
        return cls(_from_list(d.get("acl")))


@dataclass(frozen=True, slots=True)
class AclAdd(_AclChange):
    op: ClassVar[str] = "acl_add"


@dataclass(frozen=True, slots=True)
class AclRemove(_AclChange):
    op: ClassVar[str] = "acl_remove"


def _from_list(v: object) -> Acl:
    if not isinstance(v, list) or len(v) != 6:
        raise Refused(Code.MALFORMED, "an ACL is [principal, kind, pattern, name, operation, "
                      "permission]")
    return _acl(dict(zip(("principal", "kind", "pattern", "name", "operation", "permission"),
                         v, strict=True)))


def acl_from_fields(d: Mapping[str, Any]) -> Acl:
    """An ACL from request fields; Refused naming the bad one."""
    return _acl(d)


class Acls(Part):
    """The set of ACL entries."""

    name = "acls"
    version = 2  # 2: the kinds transactional-id and producer-group (an older reader refuses)
    records = (AclAdd, AclRemove)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self._acls: set[Acl] = set()
        mutations: frozenset[str] = getattr(state, "mutations", frozenset())
        self._drop_every = DROP_REMOVE_EVERY if "drop-acl-remove" in mutations else 0
        self._removes = 0

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {AclAdd.op: (AclAdd, self._add), AclRemove.op: (AclRemove, self._remove)}

    def _add(self, rec: AclAdd, index: int) -> ControlResult:
        if rec.acl in self._acls:
            return ControlResult(AclAdd.op, 0)
        if len(self._acls) >= MAX_ACLS:
            raise Refused(Code.MALFORMED, f"at most {MAX_ACLS} ACL entries")
        self._acls.add(rec.acl)
        return ControlResult(AclAdd.op, 1)

    def _remove(self, rec: AclRemove, index: int) -> ControlResult:
        if rec.acl not in self._acls:
            return ControlResult(AclRemove.op, 0)
        if self._drop_every:
            self._removes += 1
            if self._removes % self._drop_every == 0:  # test mutation: acknowledged, kept
                return ControlResult(AclRemove.op, 1)
        self._acls.discard(rec.acl)
        return ControlResult(AclRemove.op, 1)

    def entries(self) -> list[Acl]:
        return sorted(self._acls)

    def allowed(self, principal: str, kind: str, name: str, operation: str) -> bool:
        """Deny wins; no matching entry is a no."""
        verdict = False
        for acl in self._acls:
            if acl.matches(principal, kind, name, operation):
                if acl.permission == "deny":
                    return False
                verdict = True
        return verdict

    def section(self) -> Any:
        return [a.to_list() for a in sorted(self._acls)]

    def load(self, version: int, section: Any) -> None:
        if version not in (1, 2):  # 1: the same rows, of the first three kinds only
            raise ValueError(f"unsupported acls section version {version!r}")
        self._acls = {_from_list(v) for v in section}
