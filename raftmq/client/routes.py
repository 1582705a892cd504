"""Where to send a request: topic routes from the name servers, group leaders, retries.

Name servers are independent peers with soft state, so a client asks any of them and
moves to the next on failure. Their view of leaders can lag a leader change by a
registration round, while a node answering NOT_LEADER knows better: its `leader` hint is
trusted over the name servers for a while (`HINT_TTL`), and an address that just failed
for a group is not taken back from a name server straight away (`FAILED_TTL`). When no
leader is known, the group's replicas are tried in turn; a follower answers NOT_LEADER
with a hint, which finds the leader within one round trip.

After a leader dies the client does not wait for the name servers: the first failure on
the leader's connection sends the request at once to another replica, whose NOT_LEADER
names the new leader as soon as it knows it (with the term, and a newer term is followed
at once even to an address that failed in an older one). Until then the request backs
off as usual, but a backoff ends early when the group's leader changes (`wait_backoff`),
whichever request or route refresh learned it.

A leader elected a moment ago answers NOT_LEADER naming itself with `ready` false until
it has applied an entry of its own term (its state may lack what its predecessor
committed): the request stays with that leader and is retried after a backoff, within
`LEADER_WAIT` like any election, so no caller sees it.
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from transport.connection import DEFAULT_TIMEOUT, ConnectionPool, TransportError, is_retriable
from wire.protocol import DEFAULT_MAX_FRAME, Code, Frame, Op, RequestError, parse_address
from wire.requests.namesrv import ClusterAnswer, ClusterRequest, RouteAnswer, RouteRequest

from .errors import UnavailableError, give_up, leaderless, may_have_applied

__all__ = [
    "FAILED_TTL",
    "HINT_TTL",
    "LEADER_WAIT",
    "ROUTE_REFRESH",
    "QueueRoute",
    "Routes",
    "TopicRoute",
    "backoff_delay",
    "electing",
    "merge_cluster_topics",
    "node_addresses",
    "normalize_addresses",
    "open_routes",
    "parse_route",
]

log = logging.getLogger("raftmq.client")

ROUTE_REFRESH = 30.0  # RocketMQ's client route refresh period
HINT_TTL = 10.0  # how long a NOT_LEADER hint outranks the name servers' leader
# the least time between two CLUSTER requests asking the name servers who leads now
LEADERS_REFRESH_MIN = 0.1
FAILED_TTL = 5.0  # how long an address that failed for a group is not re-learned as leader
DEFAULT_ATTEMPTS = 4
LEADER_WAIT = 10.0
"""Seconds a request with retries keeps retrying while its group has no leader (`errors.
leaderless`), its attempts spent or not: an election takes one or two election
timeouts (1-2 s by default), more on a busy machine, and a few quick attempts alone
would give up before it ends."""

clock = time.monotonic
"""The client's clock. It only measures intervals (route age, hint and failure ages,
linger), so any monotonic source will do; `anyio.current_time()` looks the event loop up
on every call, which was a tenth of a message's cost on the send path."""


@dataclass(frozen=True, slots=True)
class QueueRoute:
    queue: int
    group: str
    leader: str | None  # the name servers' view at fetch time


@dataclass(slots=True)
class TopicRoute:
    """A ROUTE answer: which group hosts each queue of a topic, and the groups' replicas."""

    topic: str
    total: int
    queues: dict[int, QueueRoute]
    replicas: dict[str, list[str]]
    fetched_at: float = 0.0
    stale: bool = False
    terms: dict[str, int] = field(default_factory=dict)  # term of each group's leader claim
    _ids: list[int] | None = None

    @property
    def queue_ids(self) -> list[int]:
        """Sorted queue ids (all of 0..total-1 when the answer listed none); cached."""
        if self._ids is None:
            self._ids = sorted(self.queues) or list(range(self.total))
        return self._ids

    def group_of(self, queue: int) -> str | None:
        qr = self.queues.get(queue)
        return qr.group if qr is not None else None

    @property
    def groups(self) -> list[str]:
        return sorted({qr.group for qr in self.queues.values()})


def parse_route(topic: str, header: Mapping[str, Any], now: float = 0.0) -> TopicRoute:
    """Build a `TopicRoute` from ROUTE answer fields, refusing malformed ones plainly."""
    try:
        answer = RouteAnswer.decode(header)
    except RequestError as exc:
        raise RequestError(Code.MALFORMED, f"bad ROUTE answer for {topic!r}: "
                           f"{exc.message}") from None
    queues = {q: QueueRoute(q, g, leader or None) for q, g, leader in answer.queues}
    replicas = {g: list(addrs) for g, addrs in (answer.replicas or {}).items()}
    return TopicRoute(topic, answer.total, queues, replicas, now,
                      terms=dict(answer.terms or {}))


def normalize_addresses(addrs: Sequence[str] | str) -> list[str]:
    """Accept a list or a comma/space separated string of host:port; validate each."""
    items = re.split(r"[,\s]+", addrs) if isinstance(addrs, str) else list(addrs)
    out = [a.strip() for a in items if a and a.strip()]
    if not out:
        raise ValueError("at least one name server address is needed")
    for a in out:
        parse_address(a)
    return out


def node_addresses(cluster: Mapping[str, Any]) -> list[str]:
    """Every node address in a CLUSTER answer."""
    nodes = cluster.get("nodes") or {}
    return sorted({str(n["addr"]) for n in nodes.values() if isinstance(n, dict) and n.get("addr")})


def merge_cluster_topics(cluster: dict[str, Any], body: bytes) -> None:
    """Put the topic listing of a CLUSTER answer's body (`{gid: [[queues, hosted, names],
    ...]}`) into its groups as `topics: {name: {"queues", "hosted"}}`, sorted by name."""
    try:
        listing = ClusterAnswer.decode_body(body)
    except RequestError as exc:
        raise RequestError(Code.MALFORMED, f"bad CLUSTER topic listing: {exc.message}") from None
    groups = cluster.setdefault("groups", {})
    for gid, shapes in listing.items():
        topics: dict[str, Any] = {}
        for queues, hosted, names in shapes:
            for name in names:
                topics[name] = {"queues": queues, "hosted": list(hosted)}
        g = groups.get(gid)
        if isinstance(g, dict):
            g["topics"] = dict(sorted(topics.items()))


def electing(exc: RequestError, since: float) -> bool:
    """Whether a request that failed with `exc`, first tried at `since` (`clock`), is
    still within `LEADER_WAIT` of an election: retried whatever its attempt count."""
    return leaderless(exc) and clock() - since < LEADER_WAIT


def backoff_delay(attempt: int, base: float = 0.05, cap: float = 1.0) -> float:
    """Exponential backoff with jitter, so clients retrying after one failure spread out."""
    return min(cap, base * (2 ** max(0, attempt - 1))) * (0.5 + random.random() / 2)


@dataclass(slots=True)
class _Group:
    leader: str | None = None
    term: int = -1  # the term `leader` belongs to, when known
    hinted_at: float = -math.inf
    replicas: list[str] = field(default_factory=list)
    probe: int = 0
    failed: dict[str, float] = field(default_factory=dict)
    changed: anyio.Event | None = None  # made by a backoff waiting for a new leader
    # its leader failed us, or none is known: ask the name servers before its next request
    doubted: bool = False


def _leader_changed(g: _Group) -> None:
    """Wake the requests backing off for this group: they have a new leader to try."""
    if g.changed is not None:
        g.changed.set()
        g.changed = None


class Routes:
    """Route cache and leader book-keeping shared by one client object's requests."""

    def __init__(
        self,
        pool: ConnectionPool,
        namesrv: Sequence[str] | str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        refresh_interval: float = ROUTE_REFRESH,
    ) -> None:
        self.pool = pool
        self.namesrv = normalize_addresses(namesrv)
        self.timeout = timeout
        self.refresh_interval = refresh_interval
        self._ns_index = 0
        self._topics: dict[str, TopicRoute] = {}
        self._groups: dict[str, _Group] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._refreshing: set[str] = set()  # topics whose route is refreshed in the background
        self._leaders_refresh: anyio.Event | None = None  # a CLUSTER for leaders in flight
        self._leaders_at = -math.inf  # when the last one ended
        self.client_id = random.getrandbits(63) | 1  # names this client's requests, > 0
        self._request_seq = 0

    def request_id(self) -> tuple[int, int]:
        """A new id for a request that changes state and is not idempotent by itself: sent
        with every retry of it, so the broker applies it at most once."""
        self._request_seq += 1
        return self.client_id, self._request_seq

    # ------------------------------------------------------------ name servers

    async def namesrv_request(self, op: Op, header: Mapping[str, Any] | None = None) -> Frame:
        """Ask the name servers in turn, starting with the last one that answered.

        UNKNOWN_TOPIC from one is not final (peers converge independently); it is raised
        only if no other name server knows the topic either.
        """
        errors: list[RequestError] = []
        n = len(self.namesrv)
        for i in range(n):
            idx = (self._ns_index + i) % n
            try:
                frame = await self.pool.request(
                    self.namesrv[idx], op, header, timeout=self.timeout
                )
            except RequestError as exc:
                if is_retriable(exc) or exc.code == Code.UNKNOWN_TOPIC:
                    errors.append(exc)
                    continue
                raise
            self._ns_index = idx
            return frame
        for err in errors:
            if err.code == Code.UNKNOWN_TOPIC:
                raise err
        # A name server request is a read: none answering is "unavailable", never an
        # unknown outcome, whatever the connection last did.
        raise UnavailableError(
            f"no name server answered ({', '.join(self.namesrv)}): {errors[-1].message}",
            name_servers=list(self.namesrv),
        ) from errors[-1]

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The route of `topic`, refreshed when asked, stale, or older than the period.

        Concurrent refreshes of one topic share one ROUTE request. If every name server
        is unreachable, a cached route is used rather than failing.
        """
        cached = self._topics.get(topic)
        if cached is not None and not refresh and self._fresh(cached):
            return cached
        lock = self._locks.setdefault(topic, anyio.Lock())
        async with lock:
            current = self._topics.get(topic)
            if current is not None and current is not cached and self._fresh(current):
                return current
            try:
                frame = await self.namesrv_request(Op.ROUTE, RouteRequest(topic=topic).header())
            except RequestError as exc:
                if exc.code == Code.UNKNOWN_TOPIC:
                    self._topics.pop(topic, None)
                    raise
                if current is not None and is_retriable(exc):
                    log.debug("route refresh for %s failed (%s); using the cached one", topic, exc)
                    return current
                raise
            route = parse_route(topic, frame.header, clock())
            self.learn_route(route)
            self._topics[topic] = route
            return route

    def cached(self, topic: str) -> TopicRoute | None:
        """The cached route of `topic` if it is fresh, without any I/O."""
        route = self._topics.get(topic)
        return route if route is not None and self._fresh(route) else None

    def usable(self, topic: str, spawn: Callable[..., Any]) -> TopicRoute | None:
        """The cached route of `topic` to send by now, without I/O: a fresh one, or one
        past its refresh period that nothing showed wrong, whose refresh `spawn` then
        starts in the background. A producer feeding thousands of topics so never waits
        for the name server on the send path once it knows a route (RocketMQ's client
        refreshes routes on a timer, never per send); a route found wrong is still
        fetched before use."""
        route = self._topics.get(topic)
        if route is None or route.stale:
            return None
        if clock() - route.fetched_at >= self.refresh_interval and topic not in self._refreshing:
            self._refreshing.add(topic)
            spawn(self._refresh_in_background, topic)
        return route

    async def _refresh_in_background(self, topic: str) -> None:
        try:
            await self.route(topic, refresh=True)
        except RequestError as exc:  # the next send fetches it (or learns it is gone)
            log.debug("background route refresh for %s failed: %s", topic, exc)
        finally:
            self._refreshing.discard(topic)

    def _fresh(self, route: TopicRoute) -> bool:
        return not route.stale and clock() - route.fetched_at < self.refresh_interval

    async def cluster(self, *, topics: bool = False) -> dict[str, Any]:
        """The CLUSTER answer (nodes and groups); also learns groups' leaders and replicas.

        Each group has `topic_count`; only with `topics` does it list every topic as
        `topics: {name: {queues, hosted}}`, an answer that grows with the topics, which
        leader look-ups and node lists do not need.
        """
        frame = await self.namesrv_request(Op.CLUSTER, ClusterRequest(topics=topics).header())
        try:
            answer = ClusterAnswer.decode(frame.header)
        except RequestError as exc:
            raise RequestError(Code.MALFORMED, f"bad CLUSTER answer: {exc.message}") from None
        cluster = {"nodes": dict(answer.nodes), "groups": dict(answer.groups)}
        if topics:
            merge_cluster_topics(cluster, frame.body)
        self.learn_cluster(cluster)
        return cluster

    # ------------------------------------------------------------ leaders

    def _group(self, group: str) -> _Group:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Group()
        return g

    def learn_route(self, route: TopicRoute, now: float | None = None) -> None:
        now = clock() if now is None else now
        for group, addrs in route.replicas.items():
            if addrs:
                self._group(group).replicas = list(addrs)
        seen: set[str] = set()
        for qr in route.queues.values():
            if qr.group not in seen:
                seen.add(qr.group)
                self._learn_leader(qr.group, qr.leader, now, route.terms.get(qr.group))

    def learn_cluster(self, cluster: Mapping[str, Any], now: float | None = None) -> None:
        now = clock() if now is None else now
        for group, info in (cluster.get("groups") or {}).items():
            if not isinstance(info, dict):
                continue
            reps = info.get("replicas") or {}
            addrs = [str(a) for a in (reps.values() if isinstance(reps, dict) else reps) if a]
            if addrs:
                self._group(str(group)).replicas = sorted(addrs)
            term = info.get("term")
            self._learn_leader(str(group), info.get("leader_addr"), now,
                               term if isinstance(term, int) else None)

    def _learn_leader(self, group: str, addr: Any, now: float, term: int | None = None) -> None:
        g = self._group(group)
        newer = term is not None and term > g.term  # Raft: one leader per term, newest wins
        if term is not None and term < g.term:
            return  # older news than what a node already told us
        if not newer and now - g.hinted_at < HINT_TTL and g.leader is not None:
            return  # a node told us more recently than the name servers' registration
        leader = str(addr) if addr else None
        if (leader is not None and not newer
                and now - g.failed.get(leader, -math.inf) < FAILED_TTL):
            leader = None  # it failed us in this term; a newer term clears that
        if leader is not None and (leader != g.leader or newer):
            _leader_changed(g)
        g.leader = leader
        if leader is not None and term is not None:
            g.term = term
            if newer:
                g.hinted_at = -math.inf

    def leader(self, group: str) -> str | None:
        g = self._groups.get(group)
        return g.leader if g is not None else None

    def replicas(self, group: str) -> list[str]:
        g = self._groups.get(group)
        return list(g.replicas) if g is not None else []

    def target(self, group: str) -> str | None:
        """The address to send a group's request to: its leader, else the next replica.

        Replicas are probed in turn, but one that failed for the group more recently than
        another is passed over: after a leader dies, the probe asks a live follower (whose
        NOT_LEADER hint names the new leader) rather than the dead address again.
        """
        g = self._groups.get(group)
        if g is None:
            return None
        if g.leader is not None:
            return g.leader
        if not g.replicas:
            return None
        n = len(g.replicas)
        in_turn = [g.replicas[(g.probe + i) % n] for i in range(n)]
        addr = min(in_turn, key=lambda a: g.failed.get(a, -math.inf))  # first of the oldest
        g.probe += 1
        return addr

    def on_error(self, group: str, addr: str, exc: RequestError, now: float | None = None) -> bool:
        """Update leader knowledge after `addr` failed a request for `group`.

        Returns True when a different address is worth trying at once, as a redirect
        rather than a counted, backed-off attempt: a NOT_LEADER hint naming a leader of
        a newer term, or one that did not itself fail for the group in the last
        `FAILED_TTL` seconds; or, when the leader's own connection failed or timed out,
        another replica to ask who leads now (it may already know a newer leader).
        """
        now = clock() if now is None else now
        g = self._group(group)
        if exc.code == Code.NOT_LEADER and exc.extra.get("ready") is False:
            # the leader itself, elected a moment ago and still applying what its
            # predecessor committed: right address, retried after a backoff (an election)
            hint_term = exc.extra.get("term")
            if isinstance(hint_term, int) and hint_term > g.term:
                g.term = hint_term
                if g.leader != addr:
                    _leader_changed(g)
            g.leader = addr
            g.hinted_at = now
            g.failed.pop(addr, None)
            return False
        if exc.code == Code.NOT_LEADER and not isinstance(exc, TransportError):
            self._mark_stale(group)
            hint = exc.extra.get("leader")
            hint_term = exc.extra.get("term")
            if isinstance(hint_term, int) and hint_term < g.term and g.leader not in (None, addr):
                # an older view than ours (the node has not heard of the new leader yet)
                g.failed[addr] = now
                return True
            if isinstance(hint, str) and hint and hint != addr:
                # a follower may still name a leader we just lost (paused, cut off):
                # follow it, but as a counted, backed-off attempt rather than at once;
                # a newer term than ours is a new leader: go at once, whatever failed
                newer = isinstance(hint_term, int) and hint_term > g.term
                recent = now - g.failed.pop(hint, -math.inf) < FAILED_TTL
                g.failed[addr] = now
                if newer or (hint != g.leader and not recent):
                    _leader_changed(g)
                g.leader = hint
                g.hinted_at = now
                if isinstance(hint_term, int):
                    g.term = max(g.term, hint_term)
                return newer or not recent
            self._forget(g, addr, now)
            return False
        if isinstance(exc, TransportError) or exc.code in (Code.TIMEOUT, Code.PROPOSAL_DROPPED):
            self._mark_stale(group)
            was_leader = g.leader == addr
            self._forget(g, addr, now)
            if was_leader and exc.code != Code.PROPOSAL_DROPPED:
                # the leader is gone or stuck: a follower may know its successor already
                return any(now - g.failed.get(a, -math.inf) >= FAILED_TTL for a in g.replicas)
        # BUSY and SEQUENCE_GAP: the leader is right; the caller backs off and resends
        return False

    async def wait_backoff(self, group: str | None, delay: float) -> None:
        """Sleep `delay` seconds before retrying a request to `group`, but no longer than
        until a new leader of the group is learned: then the retry goes at once."""
        if group is None:
            await anyio.sleep(delay)
            return
        g = self._group(group)
        if g.changed is None:
            g.changed = anyio.Event()
        with anyio.move_on_after(delay):
            await g.changed.wait()

    @staticmethod
    def _forget(g: _Group, addr: str, now: float) -> None:
        g.failed[addr] = now
        if g.leader == addr:
            g.leader = None
            g.hinted_at = -math.inf

    def _mark_stale(self, group: str) -> None:
        """Leadership trouble in `group` (its leader failed us or none is known): ask the
        name servers who leads it before its next request (`refresh_leaders`). The topics'
        routes stay usable: a leader change moves no queue, and refetching every route of
        the group, one ROUTE per topic on the send path, made a producer of 10,000 topics
        stall for seconds after every election. A route whose shape is wrong is marked by
        what finds it (a missing queue, an unknown topic)."""
        self._group(group).doubted = True

    def doubted(self, group: str) -> bool:
        """Whether `group`'s leader should be asked of the name servers before its next
        request (`refresh_leaders`)."""
        g = self._groups.get(group)
        return g is not None and g.doubted

    async def refresh_leaders(self) -> None:
        """Learn every group's leader and replicas from the name servers: one small CLUSTER
        request (no topic listing), shared by all the callers that ask while it is out,
        and at most one per `LEADERS_REFRESH_MIN` seconds. A name server that does not
        answer leaves things as they were: the caller's retries go on probing replicas."""
        pending = self._leaders_refresh
        if pending is not None:
            await pending.wait()
            return
        if clock() - self._leaders_at < LEADERS_REFRESH_MIN:
            return
        done = self._leaders_refresh = anyio.Event()
        try:
            with anyio.move_on_after(self.timeout):
                await self.cluster()
                for g in self._groups.values():
                    g.doubted = False
        except RequestError as exc:
            log.debug("asking the name servers for leaders failed: %s", exc)
        finally:
            self._leaders_at = clock()
            self._leaders_refresh = None
            done.set()

    # ------------------------------------------------------------ calls with retries

    async def group_of(self, topic: str, queue: int) -> str:
        """The group hosting a queue; a queue missing from the route is a transient gap
        (its group's registration may have lapsed), so the route is refreshed."""
        route = await self.route(topic)
        group = route.group_of(queue)
        if group is None:
            if not 0 <= queue < route.total:
                raise RequestError(
                    Code.UNKNOWN_QUEUE,
                    f"topic {topic!r} has no queue {queue}: its queues are 0..{route.total - 1}",
                )
            route.stale = True
            raise RequestError(
                Code.UNKNOWN_QUEUE,
                f"no live group routes queue {queue} of {topic!r} now",
                transient=True,
            )
        return group

    async def call(
        self,
        resolve: Callable[[], Awaitable[str]],
        op: Op,
        header: Mapping[str, Any] | Callable[[str], Mapping[str, Any]],
        body: bytes = b"",
        *,
        timeout: float | None = None,
        attempts: int = DEFAULT_ATTEMPTS,
        max_redirects: int = 5,
        write: bool = False,
        deadline: float | None = None,
    ) -> tuple[str, Frame]:
        """Send to the leader of the group `resolve()` names, retrying retriable errors.

        Following a NOT_LEADER hint does not use up an attempt (up to `max_redirects`);
        other retriable failures back off and count, and with `attempts` > 1 a group
        without a leader is retried for `LEADER_WAIT` s however many attempts that
        takes. Returns (group, answer). When the
        attempts are spent, see `errors.give_up`: a `write` that may have been applied
        raises `OutcomeUnknownError`, a request no leader answered `UnavailableError`.

        `deadline` (a `clock()` time) bounds the whole call: route lookups, connects,
        every attempt (each request gets at most the time left) and backoffs. Reaching
        it ends the call as spent attempts do, a write caught in flight being in doubt.
        """
        timeout = self.timeout if timeout is None else timeout
        attempt = redirects = 0
        uncertain = sending = False
        started = clock()
        group: str | None = None
        last: RequestError | None = None
        with anyio.move_on_after(math.inf if deadline is None else deadline - started):
            while True:
                addr: str | None = None
                try:
                    group = await resolve()
                    if self.doubted(group):
                        await self.refresh_leaders()
                    addr = self.target(group)
                    if addr is None:
                        self._mark_stale(group)
                        raise RequestError(
                            Code.NOT_LEADER, f"no known replica of group {group}", transient=True
                        )
                    hdr = header(group) if callable(header) else header
                    wait = timeout if deadline is None else min(timeout, deadline - clock())
                    sending = True
                    return group, await self.pool.request(addr, op, hdr, body, timeout=wait)
                except RequestError as exc:
                    sending = False
                    last = exc
                    uncertain = write and (uncertain or may_have_applied(exc))
                    retriable = is_retriable(exc)
                    if retriable and group is not None and addr is not None:
                        if self.on_error(group, addr, exc) and redirects < max_redirects:
                            redirects += 1
                            continue
                    attempt += 1
                    if not retriable or (attempt >= attempts
                                         and not (attempts > 1 and electing(exc, started))):
                        final = give_up(exc, f"{op.name} to group {group}", uncertain=uncertain)
                        if final is exc:
                            raise  # not "from exc": a chain from itself never ends
                        raise final from exc
                    log.debug("%s to %s failed (%s); retry %d", op.name, addr, exc, attempt)
                    await self.wait_backoff(group, backoff_delay(attempt))
        bound = (deadline or started) - started
        cause = RequestError(Code.TIMEOUT, f"no answer within the call's {bound:.3g} s"
                             + ("" if last is None else f"; last: {last.message}"))
        raise give_up(cause, f"{op.name} to group {group}",
                      uncertain=write and (uncertain or sending)) from last

    async def call_queue(
        self,
        topic: str,
        queue: int,
        op: Op,
        header: Mapping[str, Any] | Callable[[str], Mapping[str, Any]],
        body: bytes = b"",
        **kwargs: Any,
    ) -> tuple[str, Frame]:
        """`call` to the leader of the group hosting `topic`'s `queue`."""

        async def resolve() -> str:
            return await self.group_of(topic, queue)

        return await self.call(resolve, op, header, body, **kwargs)

    async def call_group(
        self,
        group: str,
        op: Op,
        header: Mapping[str, Any] | Callable[[str], Mapping[str, Any]],
        body: bytes = b"",
        **kwargs: Any,
    ) -> Frame:
        """`call` to the leader of a named group."""

        async def resolve() -> str:
            g = self._groups.get(group)
            if g is None or (g.leader is None and not g.replicas):
                cluster = await self.cluster()
                known = sorted(str(k) for k in cluster.get("groups") or {})
                if group not in known:
                    raise RequestError(Code.UNKNOWN_GROUP,
                                       f"no group {group!r} in the cluster (known: {known})")
            return group

        return (await self.call(resolve, op, header, body, **kwargs))[1]


async def open_routes(
    pool: ConnectionPool | None, namesrv: Sequence[str] | str, timeout: float,
    *, max_frame: int = DEFAULT_MAX_FRAME,
) -> tuple[AsyncExitStack, Routes, anyio.abc.TaskGroup]:
    """What a client object holds while open: an exit stack owning a new connection pool
    (when `pool` is None; frames up to `max_frame`) and a task group, and a route cache
    over the pool. Nothing is left open if this fails."""
    stack = AsyncExitStack()
    await stack.__aenter__()
    try:
        if pool is None:
            pool = await stack.enter_async_context(ConnectionPool(max_frame=max_frame))
        routes = Routes(pool, namesrv, timeout=timeout)
        tg = await stack.enter_async_context(anyio.create_task_group())
    except BaseException:
        await stack.aclose()
        raise
    return stack, routes, tg
