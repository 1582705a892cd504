"""The security checker of a chaos run: what a `--workload security` history proves about
the replicated users and ACLs (`broker.state.parts.users`, `broker.state.parts.acls`).

Pure: `check_lines` takes the JSON lines of a history (any other lines are skipped, so a
run of `--workload all` is checked in the same pass) and returns a JSON-able dict;
`check_file` streams a history file. One pass keeps the changes, logins and authorization
probes (small: a few per second of run), then judges them.

History records
---------------
Written with `chaos.recorder.Recorder`: an ``invoke`` line, then one completion (``ok``,
``fail`` or ``info``) of the same process; an operation left open counts as ``info``.

Changes, made one after the other by one process (so their order is their invocation
order), each ``ok`` (acknowledged), ``fail`` (certainly not made) or ``info`` (unknown):

``user-put`` (key = user)
    Create the user or change its password: invoke value ``{"password": p}`` (every
    password is run-unique).
``user-remove`` (key = user)
    Remove the user.
``acl-add`` / ``acl-remove`` (key = the entry joined by ``/``)
    Invoke value ``[principal, kind, pattern, name, operation, permission]``.

Observations by test users, through any node:

``login`` (key = user)
    Invoke value ``{"node", "password", "final"}``: ``ok`` (logged in), ``fail`` (refused:
    wrong password or unknown user), ``info`` (unknown).
``authz`` (key = user)
    Invoke value ``{"node", "topic", "operation": "publish" | "subscribe", "final"}``,
    made on a logged-in connection: ``ok`` (authorization passed: the node answered
    anything but FORBIDDEN), ``fail {"denied": true}`` (FORBIDDEN), ``fail`` without it
    (the login failed: not an authorization outcome), ``info`` (unknown).
``sec-final`` (key = node)
    After the final heal, what the node's own replica holds: ``ok {"users": [names],
    "acls": [[...], ...]}``. The last read of each node counts. The workload reads until
    every node agrees and holds a last acknowledged entry (a barrier: every change
    before it is applied there); ``final`` logins and authorization probes come after,
    and are judged against the state every change asked before them makes.

What is checked
---------------
Changes are applied in invocation order: an acknowledged one certainly, a failed one
never, an unknown one perhaps (it lands before every later change or never: the admin
waits for each change before the next). So each user's and each entry's final value is
that of its last acknowledged change (or absent), or of any unknown change after that.
Counted violations (`VIOLATIONS`):

- ``lost_changes``: a node's final users or ACLs hold a value the acknowledged changes
  exclude (an acknowledged add missing, an acknowledged removal undone, something never
  added present);
- ``replicas_disagree``: the final reads of two nodes differ;
- ``login_never_added``: a login succeeded for a user whose creation was never asked;
- ``login_bad_password``: a login succeeded with a password never set for that user;
- ``login_stale``: a final login succeeded with a password (or for a user) the settled
  state cannot have (a removed user, a replaced password); ``login_refused_valid``: a
  final login was refused with the one password the settled state can have;
- ``attacks_got_through``: an attack of `chaos.attackers` (``attack`` records) got past
  what must stop it (``fail``); ``memory_over_bound``: a node's resident memory
  (``node-memory`` records) went over `chaos.attackers.MEMORY_BOUND_MIB`;
- ``authz_wrongly_allowed``: an operation passed that every ACL state a replica could be
  in at the time denies (a replica may lag, so any earlier state counts; a final probe:
  every possible settled state); ``authz_wrongly_denied``: a final probe was refused
  that every possible settled state allows.

The settled state of a final probe is the one every change asked before it makes (each
unknown one in or out): the nodes had all applied them when it was made.

Logins and operations during the run are judged against every state up to their time,
never a later one: followers lag behind (a node checks a login against its own replica),
so a removed user may still log in on a lagging node for a while (docs/security.md).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import entrychecks
from .attackers import MEMORY_BOUND_MIB

__all__ = ["Checker", "SEC_OPS", "VIOLATIONS", "check_file", "check_lines", "check_records"]

CHANGE_OPS = frozenset({"user-put", "user-remove", "acl-add", "acl-remove"})
ATTACK_OPS = frozenset({"attack", "node-memory"})
SEC_OPS = CHANGE_OPS | ATTACK_OPS | {"login", "authz", "sec-final"}
VIOLATIONS = (
    "attacks_got_through",
    "memory_over_bound",
    "lost_changes",
    "replicas_disagree",
    "login_never_added",
    "login_bad_password",
    "login_stale",
    "login_refused_valid",
    "authz_wrongly_allowed",
    "authz_wrongly_denied",
)
_EXAMPLES = 20
_ACL_FIELDS = 6

Element = tuple[str, Any]  # ("user", name) or ("acl", (principal, kind, ...))
ABSENT = None  # a user's or entry's value when not there (an entry present is True)


@dataclass(slots=True)
class _Op:
    f: str
    key: Any
    value: Any
    call: float


@dataclass(slots=True)
class _Change:
    f: str
    seq: int
    element: Element
    value: Any  # the password, True (entry added) or ABSENT
    call: float
    status: str = "open"  # ok | fail | info | open


@dataclass(slots=True)
class _Probe:
    f: str  # login | authz
    user: str
    value: dict[str, Any]
    call: float
    ret: float = math.inf
    status: str = "open"
    result: Any = None


@dataclass(slots=True)
class _Tallied:
    kind: str
    status: str


@dataclass(slots=True)
class _History:
    """Every change in invocation order, and each element's own changes in that order."""

    changes: list[_Change] = field(default_factory=list)
    by_element: dict[Element, list[_Change]] = field(default_factory=dict)


def _possible(changes: Iterable[_Change]) -> set[Any]:
    """The values an element can have after `changes` (its own, in order)."""
    values: set[Any] = {ABSENT}
    for c in changes:
        if c.status == "ok":
            values = {c.value}
        elif c.status != "fail":
            values.add(c.value)
    return values


def _matches(acl: tuple[str, ...], user: str, topic: str, operation: str) -> bool:
    principal, kind, pattern, name, op, _permission = acl
    return (principal in ("*", user) and kind == "topic" and op == operation
            and (topic == name if pattern == "literal" else topic.startswith(name)))


class Checker:
    """Fed one history entry at a time (`chaos.entrychecks`), judged by `result`."""

    def __init__(self) -> None:
        self.open: dict[Any, tuple[_Op, Any]] = {}
        self.history = _History()
        self.probes: list[_Probe] = []
        self.final: dict[str, dict[str, Any]] = {}  # node -> last read
        self.final_read_at = math.inf
        self.malformed: list[str] = []
        self.attacks: list[tuple[str, str, Any]] = []  # (kind, status, completion value)
        self.rss_mib: dict[str, float] = {}  # node -> the most it was seen to hold

    def line(self, entry: Any, where: str) -> None:
        if not isinstance(entry, dict):
            return
        process, kind, f = entry.get("process"), entry.get("type"), entry.get("f")
        t = entry.get("time")
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            t = 0.0
        if kind == "invoke":
            if f not in SEC_OPS:
                self.open.pop(process, None)
                return
            try:
                self.open[process] = (_Op(str(f), entry.get("key"), entry.get("value"),
                                          float(t)), self._start(str(f), entry, float(t)))
            except (TypeError, ValueError, KeyError) as exc:
                self.malformed.append(f"{where}: {f} {entry.get('key')!r}: {exc}")
            return
        if kind not in ("ok", "fail", "info"):
            return
        found = self.open.pop(process, None)
        if found is None:
            return
        op, thing = found
        self._end(op, thing, str(kind), entry.get("value"), float(t))

    def _start(self, f: str, entry: dict[str, Any], t: float) -> Any:
        key, value = entry.get("key"), entry.get("value")
        if f in CHANGE_OPS:
            if f.startswith("user-"):
                if not isinstance(key, str):
                    raise TypeError("a user change is keyed by the user's name")
                element: Element = ("user", key)
                new = value.get("password") if f == "user-put" and isinstance(value, dict) else ABSENT
                if f == "user-put" and not isinstance(new, str):
                    raise TypeError("user-put needs a password")
            else:
                if not (isinstance(value, list) and len(value) == _ACL_FIELDS
                        and all(isinstance(v, str) for v in value)):
                    raise TypeError("an ACL change's value is its six fields")
                element = ("acl", tuple(value))
                new = True if f == "acl-add" else ABSENT
            change = _Change(f, len(self.history.changes), element, new, t)
            self.history.changes.append(change)
            self.history.by_element.setdefault(element, []).append(change)
            return change
        if f in ("login", "authz"):
            if not isinstance(key, str) or not isinstance(value, dict):
                raise TypeError(f"{f} is keyed by a user, with an object value")
            if f == "authz" and value.get("operation") not in ("publish", "subscribe"):
                raise ValueError("authz operation is publish or subscribe")
            if f == "authz" and not isinstance(value.get("topic"), str):
                raise TypeError("authz needs a topic")
            if f == "login" and not isinstance(value.get("password"), str):
                raise TypeError("login needs a password")
            probe = _Probe(f, key, value, t)
            self.probes.append(probe)
            return probe
        return None  # sec-final, attack, node-memory: the completion carries it

    def _end(self, op: _Op, thing: Any, kind: str, value: Any, t: float) -> None:
        if op.f == "attack":
            self.attacks.append((str(op.key), kind, value))
        elif op.f == "node-memory":
            rss = value.get("rss_mib") if isinstance(value, dict) else None
            if kind == "ok" and isinstance(rss, (int, float)):
                node = str(op.key)
                self.rss_mib[node] = max(self.rss_mib.get(node, 0.0), float(rss))
        elif isinstance(thing, _Change):
            thing.status = kind
        elif isinstance(thing, _Probe):
            thing.status, thing.ret, thing.result = kind, t, value
        elif op.f == "sec-final" and kind == "ok":
            if not (isinstance(value, dict) and isinstance(value.get("users"), list)
                    and isinstance(value.get("acls"), list)):
                self.malformed.append(f"sec-final {op.key!r}: needs users and acls lists")
                return
            self.final[str(op.key)] = {
                "users": sorted(str(u) for u in value["users"]),
                "acls": sorted(tuple(str(x) for x in a) for a in value["acls"]
                               if isinstance(a, list)),
            }

    # ------------------------------------------------------------------ verdict

    def result(self) -> dict[str, Any]:
        for op, thing in self.open.values():  # never completed: unknown
            if isinstance(thing, (_Change, _Probe)):
                thing.status = "info"
            elif op.f == "attack":
                self.attacks.append((str(op.key), "info", None))
        self.open.clear()
        found: dict[str, list[Any]] = {kind: [] for kind in VIOLATIONS}
        found["attacks_got_through"] = [f"{k}: {v}" for k, status, v in self.attacks
                                        if status == "fail"]
        found["memory_over_bound"] = [f"node {n}: {mib:.0f} MiB" for n, mib in
                                      sorted(self.rss_mib.items()) if mib > MEMORY_BOUND_MIB]
        final_values = {e: _possible(cs) for e, cs in self.history.by_element.items()}
        self._final_state(found, final_values)
        first_put: dict[str, float] = {}  # user -> when a put of it was first asked
        password_set: dict[tuple[str, str], float] = {}  # (user, password) -> same
        for c in self.history.changes:
            if c.element[0] == "user" and c.value is not ABSENT:
                first_put.setdefault(c.element[1], c.call)
                password_set.setdefault((c.element[1], c.value), c.call)
        allowed_from = self._allowed_from({
            _triple(p) for p in self.probes if p.f == "authz" and p.status == "ok"})
        for p in self.probes:
            if p.f == "login":
                self._login(found, p, first_put, password_set)
            else:
                self._authz(found, p, allowed_from)
        counts = {kind: len(items) for kind, items in found.items()}
        problems = [f"{kind}: {n}" for kind, n in counts.items() if n]
        problems += [f"malformed security record: {m}" for m in self.malformed[:_EXAMPLES]]
        if self.history.changes and not self.final:
            problems.append("no node's users and ACLs were read after the final heal")
        return {
            "valid": not problems,
            "problems": problems,
            **counts,
            "changes": self._tally(self.history.changes, lambda c: c.f),
            "logins": self._tally([p for p in self.probes if p.f == "login"], _probe_kind),
            "authz": self._tally([p for p in self.probes if p.f == "authz"], _probe_kind),
            "final_nodes": sorted(self.final),
            "attacks": self._tally([_Tallied(k, st) for k, st, _ in self.attacks],
                                   lambda a: a.kind),
            "rss_mib_max": dict(sorted(self.rss_mib.items())),
            "memory_bound_mib": MEMORY_BOUND_MIB,
            "malformed": len(self.malformed),
            "examples": {kind: items[:_EXAMPLES] for kind, items in found.items() if items},
        }

    @staticmethod
    def _tally(items: Iterable[Any], name: Any) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for item in items:
            row = out.setdefault(name(item), {})
            row[item.status] = row.get(item.status, 0) + 1
        return dict(sorted(out.items()))

    def _final_state(self, found: dict[str, list[Any]], final_values: dict[Element, set[Any]]
                     ) -> None:
        for node, read in sorted(self.final.items()):
            users, acls = set(read["users"]), set(read["acls"])
            elements = set(final_values) | {("user", u) for u in users} | {
                ("acl", a) for a in acls}
            for e in sorted(elements, key=repr):
                possible = final_values.get(e, {ABSENT})
                present = (e[1] in users) if e[0] == "user" else (e[1] in acls)
                if present not in {v is not ABSENT for v in possible}:
                    found["lost_changes"].append({
                        "node": node, e[0]: "/".join(e[1]) if e[0] == "acl" else e[1],
                        "present": present, "acknowledged": self._last_ok(e)})
        reads = list(self.final.items())
        for node, read in reads[1:]:
            if read != reads[0][1]:
                first = reads[0][1]
                found["replicas_disagree"].append({
                    "nodes": [reads[0][0], node],
                    "users": sorted(set(first["users"]) ^ set(read["users"])),
                    "acls": ["/".join(a) for a in sorted(set(first["acls"]) ^ set(read["acls"]))],
                })

    def _last_ok(self, e: Element) -> str:
        last = "nothing"
        for c in self.history.by_element.get(e, ()):
            if c.status == "ok":
                last = f"{'put' if c.value is not ABSENT else 'remove'} #{c.seq}"
        return last

    def _login(self, found: dict[str, list[Any]], p: _Probe, first_put: dict[str, float],
               password_set: dict[tuple[str, str], float]) -> None:
        password = p.value["password"]
        name = {"user": p.user, "node": p.value.get("node"), "password": password,
                "final": bool(p.value.get("final"))}
        if p.status == "ok":
            if not first_put.get(p.user, math.inf) < p.ret:
                found["login_never_added"].append(name)
            elif not password_set.get((p.user, password), math.inf) < p.ret:
                found["login_bad_password"].append(name)
        if not p.value.get("final"):
            return
        possible = self._values_at(("user", p.user), p.call)
        if p.status == "ok" and password not in possible:
            found["login_stale"].append({**name, "possible": sorted(map(str, possible))})
        elif p.status == "fail" and possible == {password}:
            found["login_refused_valid"].append(name)

    def _values_at(self, e: Element, t: float) -> set[Any]:
        """The values `e` can have once every change asked before `t` is applied (a
        final probe's time: the nodes had settled on every change before it)."""
        changes = self.history.by_element.get(e, [])
        return _possible(changes[:bisect.bisect_left([c.call for c in changes], t)])

    def _relevant(self, triple: tuple[str, str, str]) -> list[Element]:
        return [e for e in self.history.by_element if e[0] == "acl" and _matches(e[1], *triple)]

    def _authz(self, found: dict[str, list[Any]], p: _Probe,
               allowed_from: dict[tuple[str, str, str], float]) -> None:
        denied = p.status == "fail" and isinstance(p.result, dict) and p.result.get("denied")
        if p.status != "ok" and not denied:
            return
        name = {"user": p.user, "node": p.value.get("node"), "topic": p.value["topic"],
                "operation": p.value["operation"], "final": bool(p.value.get("final"))}
        if p.value.get("final"):
            relevant = self._relevant(_triple(p))
            allow = [self._values_at(e, p.call) for e in relevant if e[1][5] == "allow"]
            deny = [self._values_at(e, p.call) for e in relevant if e[1][5] == "deny"]
            can_allow = (any(True in v for v in allow)
                         and all(ABSENT in v for v in deny))
            can_deny = (all(ABSENT in v for v in allow) or any(True in v for v in deny))
            if p.status == "ok" and not can_allow:
                found["authz_wrongly_allowed"].append(name)
            elif denied and not can_deny:
                found["authz_wrongly_denied"].append(name)
            return
        if p.status == "ok" and not allowed_from.get(_triple(p), math.inf) < p.ret:
            found["authz_wrongly_allowed"].append(name)

    def _allowed_from(self, triples: set[tuple[str, str, str]]
                      ) -> dict[tuple[str, str, str], float]:
        """Per (user, topic, operation), when the first change was asked after which some
        state of the ACLs (a prefix of the changes, each unknown one in or out) allows
        it; absent: none ever did. One sweep over the changes, so a request that
        returned at t passed rightly iff that time is before t."""
        relevant = {t: self._relevant(t) for t in triples}
        touches: dict[Element, list[tuple[str, str, str]]] = {}
        for t, elements in relevant.items():
            for e in elements:
                touches.setdefault(e, []).append(t)
        possible: dict[Element, set[Any]] = {e: {ABSENT} for e in touches}
        out: dict[tuple[str, str, str], float] = {}
        for c in self.history.changes:
            if len(out) == len(triples):
                break
            hit = touches.get(c.element)
            if not hit:
                continue
            if c.status == "ok":
                possible[c.element] = {c.value}
            elif c.status != "fail":
                possible[c.element].add(c.value)
            for t in hit:
                if t not in out and (
                        any(True in possible[e] for e in relevant[t] if e[1][5] == "allow")
                        and all(ABSENT in possible[e] for e in relevant[t]
                                if e[1][5] == "deny")):
                    out[t] = c.call
        return out


def _triple(p: _Probe) -> tuple[str, str, str]:
    return p.user, p.value["topic"], p.value["operation"]


def _probe_kind(p: _Probe) -> str:
    return ("final " if p.value.get("final") else "") + (
        p.f if p.f == "login" else p.value["operation"])


def check_records(entries: Iterable[Any]) -> dict[str, Any]:
    """The verdict over history entries (decoded JSON objects), in history order."""
    return entrychecks.check_records(Checker(), entries)


def check_lines(lines: Iterable[str]) -> dict[str, Any]:
    """The verdict over the JSON lines of a history; lines that are not JSON are skipped
    (the queue analysis reports them)."""
    return entrychecks.check_lines(Checker(), lines, SEC_OPS)


def check_file(path: str | Path) -> dict[str, Any]:
    """`check_lines` over a history file, read as it is walked."""
    return entrychecks.check_file(Checker(), path, SEC_OPS)
