"""The name server's ops: ROUTE, CLUSTER and REGISTER, with the rules of REGISTER's nested
group entries, logins and topic tables (its body), so the name server (`namesrv`), the
node's registrar and the SDK's routes apply one set of rules.

A REGISTER is large and frequent: its topic tables travel in the frame body, grouped by
shape (`TopicShape`: thousands of topics share a queue count and hosted queues), and,
once a name server holds a group's table, only the changes since the version it holds
(`RegisterGroup.base`). What a table version means, and when a name server asks for a
table whole again (`RegisterAnswer.resend`), is the name server's business
(`namesrv.registry`); this module says only what a well-formed registration is. Every
malformed part is MALFORMED, naming the field (and the group) at fault.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, TypeVar

import msgpack

from wire.protocol import (
    Code,
    Op,
    RequestError,
    host_name_problem,
    is_int,
    parse_address,
    topic_shapes,
)
from wire.requests.base import Check, WireType, spec, str_list

__all__ = [
    "MAX_USERS",
    "ClusterAnswer",
    "ClusterRequest",
    "FrozenMap",
    "RegisterAnswer",
    "RegisterAuth",
    "RegisterGroup",
    "RegisterRequest",
    "RegisterTable",
    "RouteAnswer",
    "RouteRequest",
    "TopicShape",
    "shapes_of",
]

MAX_USERS = 100_000  # users one registration may carry


K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """A read-only map: what a frozen request holds where the wire has a map (no one
    can change a decoded request behind the checks it passed)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        self._items: dict[K, V] = dict(items or {})

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return repr(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))


# ------------------------------------------------------------------ field rules


def _malformed(message: str) -> RequestError:
    return RequestError(Code.MALFORMED, message)


def _int(value: object, what: str, *, minimum: int | None = 0) -> int:
    # a bool is not an integer here: a True node id is a bug, not node 1
    if not is_int(value):
        raise _malformed(f"{what} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise _malformed(f"{what} must be >= {minimum}, got {value}")
    return value


def _addr(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _malformed(f"{what} must be a 'host:port' string, got {value!r}")
    try:
        parse_address(value)
    except ValueError as exc:
        raise _malformed(f"{what}: {exc}") from None
    return value


def _map(value: object, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise _malformed(f"{what} must be a map, got {type(value).__name__}")
    return value


def _bytes(value: object, what: str, lo: int, hi: int) -> bytes:
    if not isinstance(value, bytes) or not lo <= len(value) <= hi:
        raise _malformed(f"{what} must be {lo}-{hi} bytes")
    return value


def _hosted(queues: object, hosted: object, what: str) -> tuple[int, tuple[int, ...]]:
    """A topic's queue count (>= 1) and the ids of the queues a group hosts, each below it."""
    total = _int(queues, f"{what} queues", minimum=1)
    if not isinstance(hosted, list | tuple):
        raise _malformed(f"{what} hosted must be a list of queue ids")
    ids = []
    for q in hosted:
        q = _int(q, f"{what} queue id")
        if q >= total:
            raise _malformed(f"{what} hosts queue {q} of only {total}")
        ids.append(q)
    return total, tuple(ids)


class TopicShape(NamedTuple):
    """Topics of one shape in a topic table, `[queues, [hosted queue ids], [names]]` on
    the wire (`wire.protocol.topic_shapes`): a REGISTER body's `set`, the CLUSTER body."""

    queues: int
    hosted: tuple[int, ...]
    names: tuple[str, ...]


def shapes_of(topics: Mapping[str, Any]) -> tuple[TopicShape, ...]:
    """A table of topics (objects with `queues` and `hosted`) by shape."""
    return tuple(TopicShape(q, tuple(h), tuple(names))
                 for q, h, names in topic_shapes(topics))


def _shapes(value: object, where: str) -> tuple[TopicShape, ...]:
    """`[[queues, hosted, names], ...]`, each shape checked once for all its names, so a
    large table costs one pass over the names."""
    if not isinstance(value, list | tuple):
        raise _malformed(f"{where} set must be a list of [queues, hosted, names]")
    out = []
    for item in value:
        if not isinstance(item, list | tuple) or len(item) != 3:
            raise _malformed(f"{where} set entries must be [queues, hosted, names]")
        queues, hosted, names = item
        if not isinstance(names, list | tuple):
            raise _malformed(f"{where} set names must be a list of topic names")
        shown = str(names[0]) if names else "?"
        total, ids = _hosted(queues, hosted, f"{where} topic {shown!r}")
        if not all(type(n) is str for n in names):
            raise _malformed(f"{where} topic names must be strings")
        out.append(TopicShape(total, ids, tuple(names)))
    return tuple(out)


# ------------------------------------------------------------------ ROUTE


def _route_rows(v: Any) -> tuple[tuple[int, str, str | None], ...]:
    out = []
    for row in v:
        if not (isinstance(row, list | tuple) and len(row) == 3 and is_int(row[0])
                and isinstance(row[1], str) and (row[2] is None or isinstance(row[2], str))):
            raise _malformed("queues must be [[queue, group, leader address or null], ...]")
        out.append((row[0], row[1], row[2]))
    return tuple(out)


def _addr_lists(v: Any) -> dict[str, list[str]]:
    out = {}
    for gid, addrs in v.items():
        if not (isinstance(gid, str) and isinstance(addrs, list | tuple)
                and all(isinstance(a, str) for a in addrs)):
            raise _malformed("replicas must be {group: [addresses]}")
        out[gid] = list(addrs)
    return out


def _terms(v: Any) -> dict[str, int]:
    if not all(isinstance(gid, str) and is_int(t) for gid, t in v.items()):
        raise _malformed("terms must be {group: term}")
    return dict(v)


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteRequest(WireType):
    OP: ClassVar[Op] = Op.ROUTE
    ROLE: ClassVar[str] = "request"
    topic: str = spec(str, "the topic (any string: one no live node hosts, a name no "
                      "topic may have included, is UNKNOWN_TOPIC)")


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteAnswer(WireType):
    OP: ClassVar[Op] = Op.ROUTE
    ROLE: ClassVar[str] = "answer"
    total: int = spec(int, "the topic's queue count")
    queues: tuple[tuple[int, str, str | None], ...] = spec(
        list, "`[queue, group, leader address or null]` per queue, by queue id",
        default=(), check=_route_rows)
    replicas: Mapping[str, list[str]] | None = spec(
        dict, "`{group: [addresses]}`: every replica of each group, for leader hints",
        default=None, check=_addr_lists)
    terms: Mapping[str, int] | None = spec(
        dict, "`{group: term}` of each group's leader claim: a newer term outranks an "
        "older one", default=None, check=_terms)


# ------------------------------------------------------------------ CLUSTER


def _topic_listing(v: Any) -> dict[str, tuple[TopicShape, ...]]:
    out = {}
    for gid, shapes in _map(v, "CLUSTER body").items():
        if not isinstance(gid, str):
            raise _malformed(f"CLUSTER body group ids must be strings, got {gid!r}")
        out[gid] = _shapes(shapes, f"group {gid!r}")
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterRequest(WireType):
    OP: ClassVar[Op] = Op.CLUSTER
    ROLE: ClassVar[str] = "request"
    topics: bool = spec(bool, "list every group's topics, in the body (an answer that "
                        "grows with the topics; without it groups carry `topic_count`)",
                        default=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterAnswer(WireType):
    """With `topics` the body is msgpack `{group: [[queues, [hosted], [names]], ...]}`
    (`encode_body`, `decode_body`)."""

    OP: ClassVar[Op] = Op.CLUSTER
    ROLE: ClassVar[str] = "answer"
    nodes: Mapping[Any, Any] = spec(dict, "`{node id: {addr, metrics, host, age}}`: every "
                                    "live node, the host it runs on (`None` from a node "
                                    "that did not say), `age` seconds since it registered")
    groups: Mapping[Any, Any] = spec(
        dict, "`{group: {leader, leader_addr, term, replicas, topic_count, commit, "
        "applied, members: {node id: {role, term, commit, applied}}}}`")

    @staticmethod
    def encode_body(listing: Mapping[str, Any]) -> bytes:
        """The topic listing, `{group: topic shapes}` (`shapes_of`, `topic_shapes`)."""
        return msgpack.packb(dict(listing), use_bin_type=True)

    @staticmethod
    def decode_body(body: bytes) -> dict[str, tuple[TopicShape, ...]]:
        """The topic listing of an answer's body; MALFORMED if it is not one."""
        if not body:
            return {}
        try:
            listing = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise _malformed(f"undecodable CLUSTER body: {exc}") from None
        return _topic_listing(listing)


# ------------------------------------------------------------------ REGISTER


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterGroup:
    """One group in a REGISTER: the node's view of its replica, and either the version of
    the group's topic table (whose table, or changes since `base`, is in the body) or,
    without a version, the table inline (`topics`; small registrations and tests)."""

    role: str  # leader, follower, candidate, ...
    term: int
    leader: int | None = None  # the leader this replica knows of
    replicas: Mapping[int, str] = FrozenMap()  # node id -> address
    commit: int = 0
    applied: int = 0  # that of the table beside it
    tv: int | None = None  # the table's version after this registration
    base: int | None = None  # the body holds the changes since this version (with tv)
    topics: tuple[tuple[str, int, tuple[int, ...]], ...] = ()  # inline: (name, queues, hosted)

    @classmethod
    def decode(cls, gid: object, value: object) -> RegisterGroup:
        if not isinstance(gid, str) or not gid:
            raise _malformed(f"group ids must be non-empty strings, got {gid!r}")
        where = f"group {gid!r}"
        g = _map(value, where)
        role = g.get("role")
        if not isinstance(role, str):
            raise _malformed(f"{where} role must be a string, got {role!r}")
        leader = g.get("leader")
        if leader is not None:
            leader = _int(leader, f"{where} leader")
        replicas = FrozenMap({
            _int(n, f"{where} replica node id"): _addr(a, f"{where} replica {n!r} address")
            for n, a in _map(g.get("replicas", {}), f"{where} replicas").items()})
        tv, base = g.get("tv"), None
        topics = []
        if tv is None:  # an inline table (a base without a version means nothing)
            for name, t in _map(g.get("topics", {}), f"{where} topics").items():
                if not isinstance(name, str):
                    raise _malformed(f"{where} topic names must be strings, got {name!r}")
                t = _map(t, f"{where} topic {name!r}")
                topics.append((name, *_hosted(t.get("queues"), t.get("hosted"),
                                              f"{where} topic {name!r}")))
        else:
            tv = _int(tv, f"{where} tv")
            if g.get("base") is not None:
                base = _int(g["base"], f"{where} base")
        return cls(role=role, term=_int(g.get("term"), f"{where} term"), leader=leader,
                   replicas=replicas, commit=_int(g.get("commit", 0), f"{where} commit"),
                   applied=_int(g.get("applied", 0), f"{where} applied"), tv=tv, base=base,
                   topics=tuple(topics))

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "leader": self.leader, "term": self.term,
                               "replicas": dict(self.replicas), "commit": self.commit,
                               "applied": self.applied}
        if self.tv is not None:
            out["tv"] = self.tv
        if self.base is not None:
            out["base"] = self.base
        if self.topics:
            out["topics"] = {name: {"queues": q, "hosted": list(h)}
                             for name, q, h in self.topics}
        return out


def _groups(v: Any) -> FrozenMap[str, RegisterGroup]:
    return FrozenMap({gid: RegisterGroup.decode(gid, g) for gid, g in v.items()})


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterAuth:
    """The users a node with logins on registers, so a name server checks logins itself
    (`broker.doors.security.Guard.registration_auth`)."""

    at: int  # the applied index of the node's metadata replica: the freshest is believed
    users: tuple[tuple[str, bytes, int, bytes, bytes], ...]  # name, salt, iterations,
    #   StoredKey, ServerKey: SCRAM verifiers, never passwords
    salt_key: bytes  # the key of the made-up salts of unknown users
    over: bool = False  # the node has more users than a registration carries

    @classmethod
    def decode(cls, value: object) -> RegisterAuth:
        a = _map(value, "auth")
        rows = a.get("users")
        if not isinstance(rows, list) or len(rows) > MAX_USERS:
            raise _malformed(f"auth users must be a list of at most {MAX_USERS}")
        users = []
        for row in rows:
            if not (isinstance(row, list) and len(row) == 5 and isinstance(row[0], str)
                    and 0 < len(row[0]) <= 64):
                raise _malformed("an auth user is [name, salt, iterations, StoredKey, "
                                 "ServerKey]")
            users.append((row[0], _bytes(row[1], "a salt", 1, 1024),
                          _int(row[2], "iterations", minimum=1),
                          _bytes(row[3], "a StoredKey", 32, 32),
                          _bytes(row[4], "a ServerKey", 32, 32)))
        return cls(at=_int(a.get("at"), "auth at", minimum=-1), users=tuple(users),
                   salt_key=_bytes(a.get("salt_key"), "auth salt_key", 32, 32),
                   over=a.get("over") is True)

    def to_wire(self) -> dict[str, Any]:
        return {"at": self.at, "users": [list(u) for u in self.users],
                "salt_key": self.salt_key, "over": self.over}


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterTable:
    """One group's topic table in a REGISTER body: whole (`set`), or the changes since the
    group's `base` (`set` added or changed, `dels` removed)."""

    set: tuple[TopicShape, ...] = ()
    dels: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"set": [[s.queues, list(s.hosted), list(s.names)]
                                       for s in self.set]}
        if self.dels:
            out["del"] = list(self.dels)
        return out


def _host_name(v: Any) -> str:
    problem = host_name_problem(v)
    if problem is not None:
        raise RequestError(Code.MALFORMED, f"host: {problem}")
    return v


def _address(name: str) -> Check:
    def check(v: Any) -> str:
        return _addr(v, name)
    return check


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterRequest(WireType):
    """The body is msgpack `{group: {"set": [[queues, [hosted], [names]], ...], "del":
    [names]}}` for groups with a version (`tv`): whole tables, or changes since `base`
    (`encode_body`, `decode_body`). The group entries and `auth` are checked field by
    field (`RegisterGroup.decode`, `RegisterAuth.decode`)."""

    OP: ClassVar[Op] = Op.REGISTER
    ROLE: ClassVar[str] = "request"
    node: int = spec(int, "the node's id (with TLS, its certificate must name it)",
                     check=lambda v: _int(v, "node"))
    addr: str = spec(str, "where clients and peers reach the node, `host:port`",
                     check=_address("addr"))
    metrics: str | None = spec(str, "its metrics endpoint, `host:port`", default=None,
                               check=_address("metrics"))
    host: str | None = spec(str, "the machine it runs on (its config's `[hosts]` entry; "
                            "shards of one host share it)", default=None, check=_host_name)
    inc: int | None = spec(int, "the node's incarnation: table versions count within one",
                           default=None)
    groups: Mapping[str, RegisterGroup] = spec(
        dict, "`{group: {role, leader, term, replicas: {node id: addr}, commit, applied, "
        "tv?, base?, topics?}}`: its replicas; `tv` the group's table version (the table, "
        "or with `base` the changes since that version, in the body), or without `tv` "
        "the table inline in `topics: {name: {queues, hosted}}`",
        default=FrozenMap(), check=_groups)
    auth: RegisterAuth | None = spec(
        dict, "with logins on: `{at, users: [[name, salt, iterations, StoredKey, "
        "ServerKey]...], salt_key, over}`, the users a name server checks logins "
        "against", default=None, check=RegisterAuth.decode)

    def header(self) -> dict[str, Any]:
        out = WireType.header(self)
        if "groups" in out:
            out["groups"] = {gid: g.to_wire() for gid, g in self.groups.items()}
        if self.auth is not None:
            out["auth"] = self.auth.to_wire()
        return out

    @staticmethod
    def encode_body(tables: Mapping[str, RegisterTable]) -> bytes:
        return msgpack.packb({gid: t.to_wire() for gid, t in tables.items()},
                             use_bin_type=True) if tables else b""

    def decode_body(self, body: bytes) -> dict[str, RegisterTable]:
        """The table of each group with a version (`tv`): from the body, or empty when it
        has none there. MALFORMED for a table of a group not in the header or without a
        version, and for deletions from a whole table (no `base`)."""
        tables: Mapping[Any, Any] = {}
        if body:
            try:
                raw = msgpack.unpackb(body, raw=False, strict_map_key=False)
            except Exception as exc:  # msgpack raises several unrelated types
                raise _malformed(f"undecodable REGISTER body: {exc}") from None
            tables = _map(raw, "REGISTER body")
            for gid, t in tables.items():
                if gid not in self.groups:
                    raise _malformed(f"REGISTER body has a table for group {gid!r} not "
                                     "in the header")
                _map(t, f"REGISTER body group {gid!r}")
        out: dict[str, RegisterTable] = {}
        for gid, g in self.groups.items():
            where = f"group {gid!r}"
            table = tables.get(gid)
            if g.tv is None:
                if table is not None:
                    raise _malformed(f"{where} has a table in the body but no version (tv)")
                continue
            table = table or {}
            shapes = _shapes(table.get("set", []), where)
            dels = table.get("del", [])
            if not isinstance(dels, list | tuple) or not all(type(n) is str for n in dels):
                raise _malformed(f"{where} del must be a list of topic names")
            if dels and g.base is None:
                raise _malformed(f"{where} deletes topics from a whole table (no base)")
            out[gid] = RegisterTable(set=shapes, dels=tuple(dels))
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterAnswer(WireType):
    OP: ClassVar[Op] = Op.REGISTER
    ROLE: ClassVar[str] = "answer"
    resend: tuple[str, ...] = spec(
        list, "groups whose changes the name server could not apply (it holds another "
        "version): send their tables whole", default=(), check=str_list("resend"))
