"""The name server's route table, kept free of I/O so expiry and leader choice are testable.

Everything here is soft state, as in RocketMQ: nodes re-register periodically (and at once
when they win an election), and a node's whole registration disappears when it has not
registered for `expiry` seconds. Name servers never talk to each other; every node
registers with every one of them, so any of them can answer a client.

Time is always passed in as `now` (seconds on any monotonic clock), never read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.protocol import Code, RequestError, parse_address

__all__ = [
    "DEFAULT_EXPIRY",
    "GroupReport",
    "Registration",
    "Registry",
    "TopicReport",
    "parse_registration",
]

DEFAULT_EXPIRY = 120.0  # RocketMQ's broker channel expiry


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


@dataclass(slots=True)
class Registration:
    """The latest REGISTER of one node, with the time it arrived."""

    node: int
    addr: str
    metrics: str | None
    groups: dict[str, GroupReport]
    at: float = 0.0


@dataclass(slots=True)
class _Claim:
    """Who leads a group according to the freshest term any live member reported."""

    term: int
    leader: int | None
    reporter: Registration | None  # None when nobody reports a leader


# ------------------------------------------------------------------ validation


def _malformed(message: str) -> RequestError:
    return RequestError(Code.MALFORMED, message)


def _int(value: object, what: str, *, minimum: int | None = 0) -> int:
    # bool is an int subclass; a True node id is a client bug, not node 1
    if not isinstance(value, int) or isinstance(value, bool):
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


def _topic(name: str, value: object, where: str) -> TopicReport:
    t = _map(value, f"{where} topic {name!r}")
    queues = _int(t.get("queues"), f"{where} topic {name!r} queues", minimum=1)
    hosted_raw = t.get("hosted")
    if not isinstance(hosted_raw, list | tuple):
        raise _malformed(f"{where} topic {name!r} hosted must be a list of queue ids")
    hosted = []
    for q in hosted_raw:
        q = _int(q, f"{where} topic {name!r} queue id")
        if q >= queues:
            raise _malformed(f"{where} topic {name!r} hosts queue {q} of only {queues}")
        hosted.append(q)
    return TopicReport(queues, tuple(sorted(set(hosted))))


def _group(gid: object, value: object) -> GroupReport:
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
    replicas = {
        _int(n, f"{where} replica node id"): _addr(a, f"{where} replica {n!r} address")
        for n, a in _map(g.get("replicas", {}), f"{where} replicas").items()
    }
    topics = {}
    for name, t in _map(g.get("topics", {}), f"{where} topics").items():
        if not isinstance(name, str):
            raise _malformed(f"{where} topic names must be strings, got {name!r}")
        topics[name] = _topic(name, t, where)
    return GroupReport(
        role=role,
        leader=leader,
        term=_int(g.get("term"), f"{where} term"),
        replicas=replicas,
        topics=topics,
        commit=_int(g.get("commit", 0), f"{where} commit"),
        applied=_int(g.get("applied", 0), f"{where} applied"),
    )


def parse_registration(header: Mapping[str, Any]) -> Registration:
    """Validate a REGISTER header up front, so a bad node cannot poison the table.

    Raises `RequestError(Code.MALFORMED)` naming the offending field.
    """
    node = _int(header.get("node"), "node")
    addr = _addr(header.get("addr"), "addr")
    metrics = header.get("metrics")
    if metrics is not None:
        metrics = _addr(metrics, "metrics")
    groups = {gid: _group(gid, g) for gid, g in _map(header.get("groups", {}), "groups").items()}
    return Registration(node=node, addr=addr, metrics=metrics, groups=groups)


# ------------------------------------------------------------------ registry


class Registry:
    """Live registrations by node id, and the routes and cluster view derived from them."""

    def __init__(self, expiry: float = DEFAULT_EXPIRY) -> None:
        if expiry <= 0:
            raise ValueError(f"expiry must be positive, got {expiry}")
        self.expiry = expiry
        self._nodes: dict[int, Registration] = {}

    def register(self, reg: Registration, now: float) -> None:
        """Replace the node's previous registration wholesale: it reports its full state."""
        reg.at = now
        self._nodes[reg.node] = reg

    def expire(self, now: float) -> list[int]:
        """Forget nodes silent for longer than `expiry`; returns their ids."""
        dead = [n for n, r in self._nodes.items() if now - r.at > self.expiry]
        for n in dead:
            del self._nodes[n]
        return sorted(dead)

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
        most advanced member's (topic metadata only grows with the applied index)."""
        for reg in regs:
            if reg.node == claim.leader:
                return reg
        return max(regs, key=lambda r: (r.groups[gid].applied, r.groups[gid].term, r.at))

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

    def route(self, topic: str, now: float) -> dict[str, Any]:
        """ROUTE answer fields: every queue of `topic`, its group and that group's leader.

        Raises `RequestError(Code.UNKNOWN_TOPIC)` when no live node hosts the topic.
        """
        total = 0
        entries: dict[int, tuple[bool, str, str | None]] = {}
        replica_addrs: dict[str, list[str]] = {}
        terms: dict[str, int] = {}
        for gid, regs in sorted(self._members(now).items()):
            claim = self._claim(gid, regs)
            view = self._view(gid, regs, claim)
            t = view.groups[gid].topics.get(topic)
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
        return {
            "total": total,
            "queues": [[q, gid, addr] for q, (_, gid, addr) in sorted(entries.items())],
            "replicas": replica_addrs,
            "terms": terms,  # the term of each group's leader claim: newer outranks older
        }

    def cluster(self, now: float) -> dict[str, Any]:
        """CLUSTER answer fields: every live node and every group as the registry sees it."""
        nodes = {
            reg.node: {"addr": reg.addr, "metrics": reg.metrics, "age": max(0.0, now - reg.at)}
            for reg in self.live(now)
        }
        groups: dict[str, Any] = {}
        for gid, regs in sorted(self._members(now).items()):
            claim = self._claim(gid, regs)
            view = self._view(gid, regs, claim)
            vg = view.groups[gid]
            replicas = self._replicas(gid, regs, view)
            groups[gid] = {
                "leader": claim.leader,
                "leader_addr": self._leader_addr(gid, claim, replicas),
                "term": claim.term,
                "replicas": replicas,
                "topics": {name: t.to_wire() for name, t in sorted(vg.topics.items())},
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
        return {"nodes": nodes, "groups": groups}

    def __len__(self) -> int:
        return len(self._nodes)

