"""The name server's route table, kept free of I/O so expiry and leader choice are testable.

Everything here is soft state, as in RocketMQ: nodes re-register periodically (and at once
when they win an election), and a node's whole registration disappears when it has not
registered for `expiry` seconds. Name servers never talk to each other; every node
registers with every one of them, so any of them can answer a client.

Time is always passed in as `now` (seconds on any monotonic clock), never read here.

Topic tables are large (a node may host 100,000 topics) while registrations are frequent,
so a REGISTER carries them in the frame *body* (the header is limited to 1 MiB) and,
once a name server holds a node's table, only the changes since the version it holds
(the REGISTER type, `wire.requests.namesrv.RegisterRequest`, checks every field of it;
`registration` turns a checked one into a `Registration`):

    header  node, addr, metrics, inc (the node's incarnation: versions restart with it),
            groups: {gid: {role, leader, term, replicas, commit, applied,
                           tv: version of the group's topic table after this registration,
                           base: (optional) the body holds the changes since version
                                 `base`; absent: the body holds the whole table}}
    body    msgpack {gid: {"set": [[queues, [hosted queue ids], [topic names]], ...],
                           "del": [topic names]}}   (empty: no changes for any group)

With logins on, the header also carries `auth` (`broker.doors.security.Guard.registration_auth`):
{at: the applied index of the node's metadata replica, users: [[name, salt, iterations,
StoredKey, ServerKey], ...], salt_key: the key of unknown users' made-up salts}. The name
server checks logins against the freshest `auth` of a live registration (`Registry.auth`).

Topics are grouped by their (queues, hosted) shape, which thousands of topics share, so
the table costs little more than its names on the wire and to decode. A change whose
`base` is not the version held here (a lost registration, a restarted name server, a
restarted node) is not applied: the answer lists the group under `resend` and the node
sends that table whole at once. A group given inline as `topics` (a header map, without
`tv`) is a whole table too; small registrations and tests use that form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from wire.protocol import Code, RequestError, topic_shapes
from wire.requests.namesrv import (
    MAX_USERS,
    RegisterRequest,
    RegisterTable,
    RouteAnswer,
    TopicShape,
)

__all__ = [
    "DEFAULT_EXPIRY",
    "MAX_USERS",
    "GroupReport",
    "RegisteredAuth",
    "Registration",
    "Registry",
    "TableChange",
    "TopicReport",
    "parse_registration",
    "registration",
]

DEFAULT_EXPIRY = 120.0  # RocketMQ's broker channel expiry


@dataclass(slots=True, frozen=True)
class RegisteredAuth:
    """The users a node registered (SCRAM verifiers by name) and where they come from."""

    at: int  # the applied index of the node's metadata replica
    users: Mapping[str, tuple[bytes, int, bytes, bytes]]  # name -> salt, n, StoredKey, ServerKey
    salt_key: bytes  # the key of the made-up salts of unknown users
    over: bool = False  # the node had more users than a registration carries


@dataclass(slots=True, frozen=True)
class TopicReport:
    """How many queues a topic has in total, and which of them this group hosts."""

    queues: int
    hosted: tuple[int, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"queues": self.queues, "hosted": list(self.hosted)}


@dataclass(slots=True, frozen=True)
class GroupReport:
    """One node's view of one Raft group it hosts a replica of."""

    role: str
    leader: int | None
    term: int
    replicas: dict[int, str]
    topics: dict[str, TopicReport]
    commit: int
    applied: int
    tv: int | None = None  # topic table version (None: inline table, or not in sync)
    synced: bool = True  # False: `topics` is an older table kept until the node resends


@dataclass(slots=True, frozen=True)
class TableChange:
    """Changes to a group's topic table since version `base` of the same node incarnation."""

    base: int
    set: dict[str, TopicReport]
    dels: tuple[str, ...]


@dataclass(slots=True)
class Registration:
    """The latest REGISTER of one node, with the time it arrived."""

    node: int
    addr: str
    metrics: str | None
    groups: dict[str, GroupReport]
    at: float = 0.0
    host: str | None = None  # the machine it runs on (shards of one host share it)
    inc: int | None = None  # the node's incarnation; table versions count within it
    auth: RegisteredAuth | None = None  # with logins on: the users it knows
    changes: dict[str, TableChange] = field(default_factory=dict)  # resolved by `register`


@dataclass(slots=True)
class _Claim:
    """Who leads a group according to the freshest term any live member reported."""

    term: int
    leader: int | None
    reporter: Registration | None  # None when nobody reports a leader


# ------------------------------------------------------------------ registrations


def _reports(shapes: tuple[TopicShape, ...]) -> dict[str, TopicReport]:
    """A table by name: one `TopicReport` per shape, shared by all its names."""
    topics: dict[str, TopicReport] = {}
    for shape in shapes:
        topics.update(dict.fromkeys(shape.names, _report(shape.queues, shape.hosted)))
    return topics


def _report(queues: int, hosted: tuple[int, ...]) -> TopicReport:
    return TopicReport(queues, tuple(sorted(set(hosted))))


def registration(request: RegisterRequest, tables: Mapping[str, RegisterTable]) -> Registration:
    """The registration a decoded REGISTER (`RegisterRequest.decode`, checked against the
    wire's rules, and its body, `RegisterRequest.decode_body`) makes. Changes against an
    earlier table version are kept aside for `Registry.register`."""
    groups: dict[str, GroupReport] = {}
    changes: dict[str, TableChange] = {}
    for gid, g in request.groups.items():
        if g.tv is None:  # an inline table
            topics = {name: _report(q, hosted) for name, q, hosted in g.topics}
        else:
            table = tables.get(gid, RegisterTable())
            topics = _reports(table.set)
            if g.base is not None:
                changes[gid] = TableChange(g.base, topics, table.dels)
                topics = {}
        groups[gid] = GroupReport(role=g.role, leader=g.leader, term=g.term,
                                  replicas=dict(g.replicas), topics=topics, commit=g.commit,
                                  applied=g.applied, tv=g.tv)
    auth = None
    if request.auth is not None:
        a = request.auth
        users = {name: (salt, n, stored, server) for name, salt, n, stored, server in a.users}
        auth = RegisteredAuth(a.at, users, a.salt_key, a.over)
    return Registration(node=request.node, addr=request.addr, metrics=request.metrics,
                        host=request.host, groups=groups, inc=request.inc, changes=changes,
                        auth=auth)


def parse_registration(header: Mapping[str, Any], body: bytes = b"") -> Registration:
    """Validate a REGISTER (header and body) up front, so a bad node cannot poison the
    table (the rules are the wire's: `wire.requests.namesrv`).

    Raises `RequestError(Code.MALFORMED)` naming the offending field.
    """
    request = RegisterRequest.decode(header)
    return registration(request, request.decode_body(body))


# ------------------------------------------------------------------ registry


class Registry:
    """Live registrations by node id, and the routes and cluster view derived from them."""

    def __init__(self, expiry: float = DEFAULT_EXPIRY) -> None:
        if expiry <= 0:
            raise ValueError(f"expiry must be positive, got {expiry}")
        self.expiry = expiry
        self._nodes: dict[int, Registration] = {}

    def register(self, reg: Registration, now: float) -> list[str]:
        """Replace the node's previous registration: roles and terms wholesale, topic
        tables whole or by applying changes to the version held here.

        Returns the groups whose changes could not be applied (their base is not the
        version held here): the node must send those tables whole. Until it does, the
        older table is kept, marked unsynced, so routes do not vanish meanwhile.
        """
        prev = self._nodes.get(reg.node)
        same_life = prev is not None and reg.inc is not None and prev.inc == reg.inc
        resend: list[str] = []
        for gid, change in reg.changes.items():
            old = prev.groups.get(gid) if prev is not None else None
            g = reg.groups[gid]
            if same_life and old is not None and old.synced and old.tv == change.base:
                topics = old.topics  # the previous registration is dropped: reuse its table
                for name in change.dels:
                    topics.pop(name, None)
                topics.update(change.set)
                reg.groups[gid] = replace(g, topics=topics)
            else:
                resend.append(gid)
                reg.groups[gid] = replace(g, topics=old.topics if old is not None else {},
                                          tv=None, synced=False)
        reg.changes = {}
        reg.at = now
        self._nodes[reg.node] = reg
        return sorted(resend)

    def expire(self, now: float) -> list[int]:
        """Forget nodes silent for longer than `expiry`; returns their ids."""
        dead = [n for n, r in self._nodes.items() if now - r.at > self.expiry]
        for n in dead:
            del self._nodes[n]
        return sorted(dead)

    def auth(self, now: float) -> RegisteredAuth | None:
        """The users of the freshest live registration that carries any (the highest
        metadata index; None when no live node has logins on: nothing to check)."""
        found = [r.auth for r in self.live(now) if r.auth is not None]
        return max(found, key=lambda a: a.at) if found else None

    def is_live(self, node: int, now: float) -> bool:
        reg = self._nodes.get(node)
        return reg is not None and now - reg.at <= self.expiry

    def live(self, now: float) -> list[Registration]:
        """Registrations not yet expired at `now`, by node id (expiry is applied lazily too)."""
        self.expire(now)
        return [self._nodes[n] for n in sorted(self._nodes)]

    # ---------------------------------------------------------- derived views

    def _members(self, now: float) -> dict[str, list[Registration]]:
        members: dict[str, list[Registration]] = {}
        for reg in self.live(now):
            for gid in reg.groups:
                members.setdefault(gid, []).append(reg)
        return members

    @staticmethod
    def _claim(gid: str, regs: list[Registration]) -> _Claim:
        """The leader of the highest term anyone reports.

        Raft elects at most one leader per term, so the highest-term report is the newest
        truth: a dead old leader's claim loses to its successor's. A leader's own claim
        is preferred, then a follower's report of who it follows, then the latest arrival.
        """
        best: tuple[int, int, float] | None = None
        claim = _Claim(max(r.groups[gid].term for r in regs), None, None)
        for reg in regs:
            g = reg.groups[gid]
            if g.role == "leader":
                leader, own = reg.node, 1
            elif g.leader is not None:
                leader, own = g.leader, 0
            else:
                continue
            key = (g.term, own, reg.at)
            if best is None or key > best:
                best = key
                claim = _Claim(g.term, leader, reg)
        return claim

    @staticmethod
    def _view(gid: str, regs: list[Registration], claim: _Claim) -> Registration:
        """The member whose report of topics and indexes to trust: the leader's, else the
        most advanced member's (topic metadata only grows with the applied index). Members
        whose table is waiting for a whole resend are used only when no other is left."""
        regs = [r for r in regs if r.groups[gid].synced] or regs
        for reg in regs:
            if reg.node == claim.leader:
                return reg
        return max(regs, key=lambda r: (r.groups[gid].applied, r.groups[gid].term, r.at))

    @staticmethod
    def _topics_view(gid: str, regs: list[Registration], view: Registration) -> Registration:
        """The member whose topic table to trust: `view` (the leader's) unless another
        member has applied more of the log. A leader elected a moment ago (after a
        full restart, say) may not have applied what its predecessor committed yet, and
        its table then lacks topics that exist; applied entries are committed, so the
        member that applied most has the newest table."""
        regs = [r for r in regs if r.groups[gid].synced] or regs
        best = max(regs, key=lambda r: (r.groups[gid].applied, r.groups[gid].term, r.at))
        return best if best.groups[gid].applied > view.groups[gid].applied else view

    @staticmethod
    def _replicas(
        gid: str, regs: list[Registration], view: Registration
    ) -> dict[int, str]:
        replicas = dict(view.groups[gid].replicas)
        for reg in regs:  # a live node's own address beats anyone's memory of it
            replicas[reg.node] = reg.addr
        return dict(sorted(replicas.items()))

    def _leader_addr(self, gid: str, claim: _Claim, replicas: dict[int, str]) -> str | None:
        if claim.leader is None:
            return None
        reg = self._nodes.get(claim.leader)
        if reg is not None:
            return reg.addr
        # the leader's own registration lapsed or never reached us: use the reporter's map
        if claim.reporter is not None:
            addr = claim.reporter.groups[gid].replicas.get(claim.leader)
            if addr is not None:
                return addr
        return replicas.get(claim.leader)

    def route(self, topic: str, now: float) -> RouteAnswer:
        """The ROUTE answer: every queue of `topic`, its group and that group's leader.

        Raises `RequestError(Code.UNKNOWN_TOPIC)` when no live node hosts the topic.
        """
        total = 0
        entries: dict[int, tuple[bool, str, str | None]] = {}
        replica_addrs: dict[str, list[str]] = {}
        terms: dict[str, int] = {}
        for gid, regs in sorted(self._members(now).items()):
            claim = self._claim(gid, regs)
            view = self._view(gid, regs, claim)
            t = self._topics_view(gid, regs, view).groups[gid].topics.get(topic)
            if t is None:
                continue
            replicas = self._replicas(gid, regs, view)
            leader_addr = self._leader_addr(gid, claim, replicas)
            replica_addrs[gid] = list(replicas.values())
            terms[gid] = claim.term
            total = max(total, t.queues)
            for q in t.hosted:
                # a queue should live in one group; if two claim it, prefer a led group
                cand = (leader_addr is not None, gid, leader_addr)
                old = entries.get(q)
                if old is None or (cand[0] and not old[0]):
                    entries[q] = cand
        if not replica_addrs:
            raise RequestError(
                Code.UNKNOWN_TOPIC,
                f"topic {topic!r} is not hosted by any live node registered here",
            )
        return RouteAnswer(
            total=total,
            queues=tuple((q, gid, addr) for q, (_, gid, addr) in sorted(entries.items())),
            replicas=replica_addrs,
            terms=terms,  # the term of each group's leader claim: newer outranks older
        )

    def cluster(
        self, now: float, *, topics: bool = True,
        shapes: dict[str, list[list[Any]]] | None = None,
    ) -> dict[str, Any]:
        """CLUSTER answer fields: every live node and every group as the registry sees it.

        With `topics=False` groups carry only `topic_count`, not every topic: that answer
        stays small and cheap however many topics there are (leaders, readiness checks).
        A `shapes` dict gets every group's topic table in the compact form of
        `topic_shapes` (the CLUSTER body), from the same pass over the groups.
        """
        nodes = {
            reg.node: {"addr": reg.addr, "metrics": reg.metrics, "host": reg.host,
                       "age": max(0.0, now - reg.at)}
            for reg in self.live(now)
        }
        groups: dict[str, Any] = {}
        for gid, regs in sorted(self._members(now).items()):
            claim = self._claim(gid, regs)
            view = self._view(gid, regs, claim)
            vg = self._topics_view(gid, regs, view).groups[gid]
            replicas = self._replicas(gid, regs, view)
            groups[gid] = {
                "leader": claim.leader,
                "leader_addr": self._leader_addr(gid, claim, replicas),
                "term": claim.term,
                "replicas": replicas,
                "topic_count": len(vg.topics),
                "commit": vg.commit,
                "applied": vg.applied,
                "members": {
                    reg.node: {
                        "role": reg.groups[gid].role,
                        "term": reg.groups[gid].term,
                        "commit": reg.groups[gid].commit,
                        "applied": reg.groups[gid].applied,
                    }
                    for reg in regs
                },
            }
            if topics:
                groups[gid]["topics"] = {n: t.to_wire() for n, t in sorted(vg.topics.items())}
            if shapes is not None:
                shapes[gid] = topic_shapes(vg.topics)
        return {"nodes": nodes, "groups": groups}

    def __len__(self) -> int:
        return len(self._nodes)
