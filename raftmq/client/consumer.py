"""Consumers: a pull consumer with explicit positions, and a push consumer built on it.

Both read with FETCH from the leader of the group hosting a queue; the node holds a
fetch at the end of a queue for up to `wait_ms` (long polling), so an idle consumer costs
one request per hold period per queue.

Offsets follow RocketMQ: a committed offset is the next offset to consume. Clustering
groups commit through the Raft log (COMMIT_OFFSET), so a failover never rewinds them;
broadcast consumers keep their offsets in a local file (`raftmq.client.localoffsets`).

The push consumer hands messages to the handler concurrently, so they finish out of
order; an `OffsetWindow` per queue commits only the lowest unfinished offset, which
means a crash redelivers (at least once) but never skips a message.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import socket
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from transport.connection import ClientClosedError, ConnectionPool, is_retriable
from wire.protocol import (
    MAX_CLIENT_CHARS,
    Code,
    Op,
    RequestError,
    validate_group_name,
    validate_topic_name,
)
from wire.records import Message, decode_record, iter_records, message_id, tag_problem

from .errors import UnavailableError, close_stack
from .lifecycle import StartClose
from .localoffsets import LocalOffsets, default_offsets_dir
from .routes import (
    Routes,
    backoff_delay,
    clock,
    node_addresses,
    normalize_addresses,
    open_routes,
)

__all__ = [
    "CALL_TIMEOUT",
    "LONG_POLL_MS",
    "OffsetWindow",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "allocate_average",
    "allocate_round_robin",
    "check_isolation",
    "commit_offsets",
    "decode_fetch",
    "fetch",
    "fetch_answer",
    "parse_tags",
    "query_offset",
    "queue_bounds",
]

log = logging.getLogger("raftmq.client.consumer")

LONG_POLL_MS = 15_000  # RocketMQ's broker-side hold for a pull at the end of a queue
FETCH_GRACE = 5.0  # seconds a fetch may take beyond its hold before it counts as lost
CALL_TIMEOUT = 30.0  # default bound of a whole commit: outlasts an election's retries
POLL_MARGIN = 0.2  # seconds of a poll's timeout left for the answer to a held fetch
PULL_BATCH = 32
PENDING_OFFSETS_WAIT = 60.0  # seconds a committed-offset query waits for a transaction
FETCH_MAX_BYTES = 1 << 20
MEMBERS_WAIT_MS = 20_000  # how long a node holds a CONSUMERS request with nothing new
FLOW_CONTROL_DELAY = 0.05  # RocketMQ's pause before re-checking a queue over its threshold

Q = TypeVar("Q")
StartFrom = Literal["first", "last"]
Handler = Callable[[list[Message]], Any]


@dataclass(frozen=True, slots=True)
class PullResult:
    """Messages of one FETCH, and where to continue (`next_offset` skips filtered ones)."""

    messages: list[Message]
    next_offset: int
    min_offset: int
    end_offset: int


# ---------------------------------------------------------------- pure parts


class OffsetWindow:
    """The offset a concurrently consuming queue may commit: its lowest unfinished one.

    Offsets are `add`ed in increasing order as messages are handed out and marked
    `done` in any order; `advance` moves past offsets that were never handed out
    (filtered by tag). Committing `committable()` never skips an unfinished message.
    """

    def __init__(self, start: int) -> None:
        self._start = start
        self._high = start  # one past the last offset added or advanced over
        self._pending: dict[int, bool] = {}  # offset -> done, in increasing order
        self._unfinished = 0

    def add(self, offset: int) -> None:
        if offset < self._high:
            raise ValueError(f"offset {offset} is below the window's end {self._high}")
        self._pending[offset] = False
        self._unfinished += 1
        self._high = offset + 1

    def advance(self, next_offset: int) -> None:
        self._high = max(self._high, next_offset)

    def done(self, offset: int) -> None:
        if self._pending.get(offset) is False:
            self._pending[offset] = True
            self._unfinished -= 1

    def committable(self) -> int:
        pending = self._pending
        for offset in list(pending):
            if not pending[offset]:
                return offset
            del pending[offset]
        return self._high

    def reset(self, offset: int) -> None:
        """Forget everything (after a jump forced by OFFSET_TOO_SMALL/LARGE)."""
        self._pending.clear()
        self._unfinished = 0
        self._high = offset

    def __len__(self) -> int:
        """Messages handed out and not finished yet (the flow-control measure)."""
        return self._unfinished

    @property
    def end(self) -> int:
        return self._high


def allocate_average(queues: Iterable[Q], clients: Iterable[str], me: str) -> list[Q]:
    """RocketMQ's default allocation: each client takes one contiguous block of the
    sorted queues, block sizes differing by at most one (earlier clients take the
    larger blocks). A client not in `clients` gets nothing."""
    qs = sorted(queues)  # type: ignore[type-var]
    cs = sorted(set(clients))
    if me not in cs or not qs:
        return []
    i, k, n = cs.index(me), len(cs), len(qs)
    size, extra = divmod(n, k)
    start = i * size + min(i, extra)
    return qs[start : start + size + (1 if i < extra else 0)]


def allocate_round_robin(queues: Iterable[Q], clients: Iterable[str], me: str) -> list[Q]:
    """Deal the sorted queues to the sorted clients like cards: client i takes queues
    i, i+k, i+2k, ... (spreads each client over the queue range)."""
    qs = sorted(queues)  # type: ignore[type-var]
    cs = sorted(set(clients))
    if me not in cs:
        return []
    return qs[cs.index(me) :: len(cs)]


STRATEGIES: dict[str, Callable[[Iterable[Any], Iterable[str], str], list[Any]]] = {
    "average": allocate_average,
    "round_robin": allocate_round_robin,
}


Tags = str | Sequence[str] | None
"""A tag subscription: None or "*" (every message), "TagA", "TagA || TagB" (RocketMQ's
subscription expression) or a list of tags."""


def parse_tags(tags: Tags) -> list[str] | None:
    """The tags a subscription selects, None for all; a clear `ValueError` for anything
    that is not a subscription (a bare string is one expression, never its characters)."""
    if tags is None:
        return None
    if isinstance(tags, str):
        expr = tags.strip()
        if expr in ("", "*"):
            return None
        items = [t.strip() for t in expr.split("||")]
    elif isinstance(tags, Sequence) and not isinstance(tags, (bytes, bytearray)):
        items = list(tags)
        if any(not isinstance(t, str) for t in items):
            raise ValueError(f"tags must be strings, got {tags!r}")
        items = [t.strip() for t in items]
        if items == ["*"]:
            return None
    else:
        raise ValueError(f"tags are a string like 'TagA || TagB' or a list of strings, "
                         f"not {type(tags).__name__}")
    if not items:
        raise ValueError("an empty list of tags selects nothing: pass None or '*' for all")
    for t in items:
        problem = tag_problem(t)
        if problem is not None:
            raise ValueError(f"bad tag subscription {tags!r}: use '*', 'TagA', "
                             f"'TagA || TagB' or a list of tags ({problem})")
    return sorted(set(items))


def decode_fetch(
    topic: str, queue: int, group: str, header: Mapping[str, Any], body: bytes
) -> list[Message]:
    """Messages of a FETCH answer: `msgs` rows [offset, index, start, store_ms] describe
    the records concatenated in the body, in the same order."""
    rows = header.get("msgs") or []
    spans = list(iter_records(body))
    if len(spans) != len(rows):
        raise RequestError(
            Code.MALFORMED, f"FETCH answer lists {len(rows)} messages but carries {len(spans)}"
        )
    out: list[Message] = []
    for (offset, index, start, store_ms), (pos, _size) in zip(rows, spans, strict=True):
        msg, _ = decode_record(
            body, pos, topic=topic, queue=queue, offset=int(offset), store_ms=int(store_ms),
            msg_id=message_id(group, int(index), int(start)),
        )
        out.append(msg)
    return out


# ---------------------------------------------------------------- requests


async def fetch_answer(
    routes: Routes,
    topic: str,
    queue: int,
    offset: int,
    *,
    max_messages: int = PULL_BATCH,
    max_bytes: int = FETCH_MAX_BYTES,
    wait_ms: int = LONG_POLL_MS,
    tags: Sequence[str] | None = None,
    attempts: int = 3,
) -> tuple[str, Mapping[str, Any], bytes]:
    """`fetch` without decoding: (the hosting group, the answer header, the records), for
    readers that decode records in bulk (`decode_fetch` says what the answer holds).
    Tags select by hash on the broker; the exact match is the caller's."""
    header: dict[str, Any] = {
        "topic": topic, "queue": queue, "offset": offset, "max": max_messages,
        "max_bytes": max_bytes, "wait_ms": int(wait_ms),
    }
    if tags:
        header["tags"] = list(tags)
    # the group the route names goes along: only its (ready) leader answers, so a
    # replica whose state lags never calls the topic unknown
    group, frame = await routes.call_queue(
        topic, queue, Op.FETCH, lambda g: {**header, "g": g},
        timeout=wait_ms / 1000 + FETCH_GRACE, attempts=attempts,
    )
    h = frame.header
    return str(h.get("g") or group), h, frame.body


async def fetch(
    routes: Routes,
    topic: str,
    queue: int,
    offset: int,
    *,
    max_messages: int = PULL_BATCH,
    max_bytes: int = FETCH_MAX_BYTES,
    wait_ms: int = LONG_POLL_MS,
    tags: Sequence[str] | None = None,
    attempts: int = 3,
) -> PullResult:
    """One FETCH from the queue's leader (retrying retriable errors).

    OFFSET_TOO_SMALL / OFFSET_TOO_LARGE are raised to the caller with `min` and `end`
    in `RequestError.extra`.
    """
    group, h, body = await fetch_answer(routes, topic, queue, offset, max_messages=max_messages,
                                        max_bytes=max_bytes, wait_ms=wait_ms, tags=tags,
                                        attempts=attempts)
    msgs = decode_fetch(topic, queue, group, h, body)
    if tags:
        wanted = set(tags)
        msgs = [m for m in msgs if m.tags in wanted]
    nxt = int(h.get("next", msgs[-1].offset + 1 if msgs else offset))
    return PullResult(msgs, nxt, int(h.get("min", 0)), int(h.get("end", nxt)))


async def queue_bounds(routes: Routes, topic: str, queue: int) -> tuple[int, int]:
    """(min, end) of a queue: the earliest retained offset and one past the last.

    Asked with a FETCH of one message at offset 0 that does not wait; both an answer and
    an OFFSET_TOO_SMALL error carry the bounds.
    """
    try:
        res = await fetch(routes, topic, queue, 0, max_messages=1, max_bytes=1, wait_ms=0)
    except RequestError as exc:
        if exc.code in (Code.OFFSET_TOO_SMALL, Code.OFFSET_TOO_LARGE) and "min" in exc.extra:
            return int(exc.extra["min"]), int(exc.extra.get("end", exc.extra["min"]))
        raise
    return res.min_offset, res.end_offset


async def query_offset(routes: Routes, group: str, topic: str, queue: int) -> int:
    """The committed offset of a consumer group on a queue, -1 when it has none.

    While a transaction that sends offsets of that queue is undecided (TX_PENDING), its
    outcome decides the answer: asked again until it is, for up to `PENDING_OFFSETS_WAIT`
    seconds (a consume-transform-produce loop restarting after a crash so resumes where
    the last committed transaction left it, never before)."""
    deadline = anyio.current_time() + PENDING_OFFSETS_WAIT
    while True:
        try:
            _, frame = await routes.call_queue(
                topic, queue, Op.QUERY_OFFSET,
                lambda g: {"cg": group, "topic": topic, "queue": queue, "g": g},
            )
            return int(frame.header.get("offset", -1))
        except RequestError as exc:
            if exc.code != Code.TX_PENDING or anyio.current_time() > deadline:
                raise
        await anyio.sleep(0.1)


async def commit_offsets(
    routes: Routes, group: str, offsets: Mapping[tuple[str, int], int], *,
    timeout: float | None = None,
) -> None:
    """Commit offsets through the Raft log: one COMMIT_OFFSET per hosting group, sent
    concurrently, each safe to retry (it carries a request id the broker deduplicates).
    Raises the first failure after all were tried. `timeout` bounds the whole call:
    reaching it fails the groups not answered yet (`UnavailableError` when nothing of
    theirs was sent, else `OutcomeUnknownError`)."""
    deadline = None if timeout is None else clock() + timeout
    by_group: dict[str, list[list[Any]]] = {}
    with anyio.move_on_after(math.inf if timeout is None else timeout) as lookup:
        for (topic, queue), offset in sorted(offsets.items()):
            g = await routes.group_of(topic, queue)
            by_group.setdefault(g, []).append([topic, queue, int(offset)])
    if lookup.cancelled_caught:
        assert timeout is not None
        raise UnavailableError(f"COMMIT_OFFSET for {group}: no route within {timeout:.3g} s; "
                               "nothing was committed")
    errors: list[RequestError] = []

    async def one(g: str, rows: list[list[Any]]) -> None:
        # one id for all attempts: a retry whose first copy was committed after all (by a
        # new leader) must not roll back a commit made in between
        header = {"cg": group, "offsets": rows, "req": list(routes.request_id())}
        try:
            await routes.call_group(g, Op.COMMIT_OFFSET, header, write=True, deadline=deadline)
        except RequestError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for g, rows in by_group.items():
            tg.start_soon(one, g, rows)
    if errors:
        raise errors[0]


def default_client_id() -> str:
    """Unique per consumer instance, readable in CONSUMERS answers: host@pid@random."""
    return f"{socket.gethostname()[:200]}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def checked_client_id(client_id: str | None) -> str:
    """`client_id`, or a unique one when None; ValueError for one the nodes would refuse
    (MALFORMED), said before anything starts."""
    client_id = client_id or default_client_id()
    if not (len(client_id) <= MAX_CLIENT_CHARS and client_id.isprintable()):
        raise ValueError(f"client_id must be 1-{MAX_CLIENT_CHARS} printable characters")
    return client_id


def check_isolation(isolation: str) -> str:
    """Consumers read committed data only: a transaction's messages reach a queue when
    it commits (and never when it aborts), so there is nothing else to read."""
    if isolation != "read_committed":
        raise ValueError(
            f"isolation={isolation!r} is not supported: consumers read committed messages "
            "only ('read_committed'); prepared transactional messages are not in any queue "
            "until their transaction commits")
    return isolation


class _ClientBase(StartClose):
    """Owns a connection pool (unless given one), route cache and task group; open it
    with `async with` or `start()`/`close()`."""

    def __init__(
        self, namesrv: Sequence[str] | str, pool: ConnectionPool | None, timeout: float
    ) -> None:
        self.namesrv = normalize_addresses(namesrv)
        self.timeout = timeout
        self._pool = pool
        self._routes: Routes | None = None
        self._stack: AsyncExitStack | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    async def _open(self) -> None:
        if self._stack is not None:
            raise RuntimeError(f"a {type(self).__name__} can be entered once")
        self._stack, self._routes, self._tg = await open_routes(
            self._pool, self.namesrv, self.timeout
        )

    async def _close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self._closed = True
        assert self._stack is not None and self._tg is not None
        self._tg.cancel_scope.cancel()
        return await close_stack(self._stack, exc)

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._close(exc_type, exc, tb)

    @property
    def routes(self) -> Routes:
        if self._routes is None or self._closed:
            raise ClientClosedError(f"the {type(self).__name__} is not open (use `async with`)")
        return self._routes


async def heartbeat(routes: Routes, header: dict[str, Any], timeout: float) -> None:
    """One HEARTBEAT to every node of the cluster; a failure is only logged (the next
    beat tries again, and the ttl covers three of them)."""
    try:
        cluster = await routes.cluster()
    except RequestError as exc:
        log.debug("heartbeat: no cluster view (%s)", exc)
        return

    async def one(addr: str) -> None:
        try:
            await routes.pool.request(addr, Op.HEARTBEAT, header, timeout=timeout)
        except RequestError as exc:
            log.debug("heartbeat to %s failed: %s", addr, exc)

    async with anyio.create_task_group() as tg:
        for addr in node_addresses(cluster):
            tg.start_soon(one, addr)


QueuesCallback = Callable[[list[tuple[str, int]]], Any]
"""`on_assign` / `on_revoke`: called with the (topic, queue) pairs gained or given up."""


def _strategy(strategy: str | Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    if callable(strategy):
        return strategy
    if strategy in STRATEGIES:
        return STRATEGIES[strategy]
    raise ValueError(f"unknown strategy {strategy!r}: 'average' or 'round_robin'")


async def _call_back(fn: QueuesCallback | None, queues: list[tuple[str, int]]) -> None:
    """Run a rebalance callback to completion: awaited when async, in a worker thread
    when plain (so it may make a blocking client's calls, which need the loop free)."""
    if fn is None:
        return
    if _is_async_callable(fn):
        await fn(list(queues))
    else:
        await anyio.to_thread.run_sync(fn, list(queues))


class _GroupClient(_ClientBase):
    """What a consumer sharing its group's queues with others needs: the group's live
    members, and a watch that sets `_members_changed` as soon as a node says they
    changed. Subclasses set `group`, `client_id` and `rebalance_interval`."""

    group: str
    client_id: str
    rebalance_interval: float
    _allocate: Callable[..., list[Any]]

    def __init__(
        self, namesrv: Sequence[str] | str, pool: ConnectionPool | None, timeout: float
    ) -> None:
        super().__init__(namesrv, pool, timeout)
        self._members_changed: anyio.Event | _NeverSet = _NeverSet()  # an Event once running

    async def _watch_members(self, tg: anyio.abc.TaskGroup) -> None:
        """Keep one `_watch_node` per node of the cluster (nodes added later too)."""
        watched: set[str] = set()
        while True:
            try:
                for addr in node_addresses(await self.routes.cluster()):
                    if addr not in watched:
                        watched.add(addr)
                        tg.start_soon(self._watch_node, addr)
            except RequestError as exc:
                log.debug("%s: no cluster view to watch (%s)", self.client_id, exc)
            await anyio.sleep(self.rebalance_interval)

    async def _watch_node(self, addr: str) -> None:
        """Hold a CONSUMERS request at `addr` that the node answers when the group's
        members differ from what this client saw there (a join, a leave, an expiry):
        the rebalance follows at once, instead of at the next `rebalance_interval`."""
        known: list[str] | None = None
        failures = 0
        while True:
            asked = anyio.current_time()
            try:
                frame = await self.routes.pool.request(
                    addr, Op.CONSUMERS,
                    {"cg": self.group, "known": known or [], "wait_ms": MEMBERS_WAIT_MS},
                    timeout=self.timeout + MEMBERS_WAIT_MS / 1000)
            except RequestError as exc:
                failures += 1
                log.debug("%s: watching members at %s: %s", self.client_id, addr, exc)
                await anyio.sleep(backoff_delay(failures, base=0.1, cap=5.0))
                continue
            failures = 0
            members = [str(c) for c in frame.header.get("clients") or []]
            if known is not None and members != known:
                self._members_changed.set()
            elif known is not None and anyio.current_time() - asked < MEMBERS_WAIT_MS / 10_000:
                await anyio.sleep(1.0)  # answered at once with nothing new: do not spin
            known = members

    async def _desired(
        self, topics: Iterable[str], clients: list[str], *, share: bool = True
    ) -> tuple[set[tuple[str, int]], set[str]]:
        """This member's share of `topics`' queues among `clients` (every queue without
        `share`: broadcast), and the topics whose route was known: a topic without one
        says nothing of the queues held of it."""
        desired: set[tuple[str, int]] = set()
        known: set[str] = set()
        for topic in sorted(topics):
            try:
                route = await self.routes.route(topic)
            except RequestError as exc:
                log.warning("%s: no route for %s (%s)", self.client_id, topic, exc)
                continue
            known.add(topic)
            queues = list(range(route.total))
            mine = self._allocate(queues, clients, self.client_id) if share else queues
            desired.update((topic, q) for q in mine)
        return desired, known

    async def clients(self) -> list[str]:
        """The group's live consumers: the union of what every reachable node has seen,
        plus this one (its heartbeat may not have arrived everywhere yet)."""
        cluster = await self.routes.cluster()
        seen: set[str] = {self.client_id}
        pool = self.routes.pool

        async def one(addr: str) -> None:
            try:
                frame = await pool.request(addr, Op.CONSUMERS, {"cg": self.group},
                                           timeout=self.timeout)
            except RequestError as exc:
                log.debug("CONSUMERS from %s failed: %s", addr, exc)
                return
            seen.update(str(c) for c in frame.header.get("clients") or [])

        async with anyio.create_task_group() as tg:
            for addr in node_addresses(cluster):
                tg.start_soon(one, addr)
        return sorted(seen)


# ---------------------------------------------------------------- pull consumer


class PullConsumer(_GroupClient):
    """Reads queues at positions the caller controls; use as `async with`.

    `assign` the queues to read, then `poll` (all assigned queues) or `pull` (one).
    A queue's first position is the group's committed offset, or when it has none the
    queue's first retained offset (`start_from="first"`) or its end (`"last"`).
    `commit_all` commits the position after the last message returned.
    `isolation` is "read_committed", the only level served (`check_isolation`).

    Queues come one of two ways, as in Kafka. `assign` is manual: two pull consumers
    of one group each read what they assign, the group does not share queues among them.
    `subscribe` lets the group share its topics' queues among its subscribed members
    (pull and push consumers alike, by `strategy`): the share is recomputed inside
    `poll`, as soon as a node reports that the members changed and every
    `rebalance_interval`, calling `on_revoke` with the queues given up (commit them
    there) before `on_assign` with the queues gained. A consumer does one or the other.
    While open, a pull consumer is a member its group can see (it heartbeats every
    `heartbeat_interval`), so `Admin.reset_offsets` and `delete_group` refuse while it
    runs; with manual assignment a push consumer never counts it when sharing queues.
    """

    def __init__(
        self,
        namesrv: Sequence[str] | str,
        group: str,
        *,
        start_from: StartFrom = "first",
        wait_ms: int = LONG_POLL_MS,
        max_bytes: int = FETCH_MAX_BYTES,
        timeout: float = 3.0,
        pool: ConnectionPool | None = None,
        isolation: str = "read_committed",
        client_id: str | None = None,
        heartbeat_interval: float = 10.0,
        rebalance_interval: float = 10.0,
        strategy: Literal["average", "round_robin"] | Callable[..., list[Any]] = "average",
    ) -> None:
        super().__init__(namesrv, pool, timeout)
        self.isolation = check_isolation(isolation)
        self.group = validate_group_name(group)
        if start_from not in ("first", "last"):
            raise ValueError("start_from is 'first' or 'last'")
        self.client_id = checked_client_id(client_id)
        if not heartbeat_interval > 0 or not rebalance_interval > 0:
            raise ValueError("heartbeat_interval and rebalance_interval must be > 0")
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self._allocate = _strategy(strategy)
        # group-managed assignment (`subscribe`): topic -> tags, the queues the group gave
        # this consumer, the callbacks, and when the share was last computed
        self._subscribed: dict[str, list[str] | None] = {}
        self._owned: list[tuple[str, int]] = []
        self._on_assign: QueuesCallback | None = None
        self._on_revoke: QueuesCallback | None = None
        self._shared_at = -math.inf
        self._watching = False
        self.start_from = start_from
        self.wait_ms = wait_ms
        self.max_bytes = max_bytes
        self._assigned: dict[str, tuple[list[int] | None, list[str] | None]] = {}
        self._positions: dict[tuple[str, int], int] = {}
        self.unreadable: dict[tuple[str, int], RequestError] = {}
        """Queues the last polls could not read (no leader reachable, or no answer for
        the consumer's `timeout`), with the error."""
        self._silent: dict[tuple[str, int], float] = {}  # unanswered since (`clock`)
        self._paused: set[tuple[str, int | None]] = set()  # (topic, None): all its queues

    def pause(self, topic: str, queues: Iterable[int] | None = None) -> None:
        """`poll` skips these queues of `topic` (all of them when None) until `resume`
        (Kafka's `pause`); their positions stay where they are. `pull` still reads them."""
        validate_topic_name(topic)
        if queues is None:
            self._paused.add((topic, None))
        else:
            self._paused.update((topic, int(q)) for q in queues)

    def resume(self, topic: str, queues: Iterable[int] | None = None) -> None:
        """Undo `pause`: every pause of `topic` when `queues` is None, else those queues'
        own (a pause of the whole topic is lifted by `resume(topic)` only)."""
        if queues is None:
            self._paused = {k for k in self._paused if k[0] != topic}
        else:
            self._paused.difference_update((topic, int(q)) for q in queues)

    def paused(self) -> list[tuple[str, int | None]]:
        """What is paused: (topic, queue), or (topic, None) for all of a topic's queues."""
        return sorted(self._paused, key=lambda k: (k[0], -1 if k[1] is None else k[1]))

    def _is_paused(self, key: tuple[str, int]) -> bool:
        return (key[0], None) in self._paused or key in self._paused

    def silent(self) -> list[tuple[str, int]]:
        """Queues no poll has had an answer from since they were last read, but not yet
        for long enough to count as `unreadable` (a poll shorter than the consumer's
        `timeout` does not decide that a queue cannot be read)."""
        return sorted(k for k in self._silent if k not in self.unreadable)

    async def __aenter__(self) -> Self:
        await self._open()
        assert self._tg is not None
        self._members_changed = anyio.Event()
        self._tg.start_soon(self._beat)
        if self._subscribed:
            self._watch()
        return self

    def _watch(self) -> None:
        if not self._watching and self._tg is not None:
            self._watching = True
            self._tg.start_soon(self._watch_members, self._tg)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._routes is not None and not self._closed:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.timeout):
                await self._heartbeat(0)  # gone from its group now, not at its expiry
        return await self._close(exc_type, exc, tb)

    async def _beat(self) -> None:
        while True:
            await self._heartbeat(int(self.heartbeat_interval * 3000))
            await anyio.sleep(self.heartbeat_interval)

    async def _heartbeat(self, ttl_ms: int) -> None:
        """A heartbeat: as a subscribed member, counted when the group shares queues; with
        manual assignment, visible to its group (an offset reset refuses) but never given
        queues by another member's rebalance."""
        if self._subscribed:
            await heartbeat(self.routes, {"cg": self.group, "client": self.client_id,
                                          "topics": sorted(self._subscribed),
                                          "ttl_ms": ttl_ms}, self.timeout)
        else:
            await heartbeat(self.routes, {"cg": self.group, "client": self.client_id,
                                          "topics": sorted(self._assigned), "ttl_ms": ttl_ms,
                                          "manual": True}, self.timeout)

    def assign(
        self, topic: str, queues: Iterable[int] | None = None, *, tags: Tags = None
    ) -> None:
        """Read `queues` of `topic` (all of them when None), only messages with one of
        `tags` when given ("*", "TagA", "TagA || TagB" or a list; see `parse_tags`).
        Replaces an earlier assignment of the topic."""
        validate_topic_name(topic)
        if self._subscribed:
            raise ValueError("this consumer subscribed: its group assigns its queues "
                             "(unsubscribe() first to assign queues yourself)")
        self._assigned[topic] = (
            sorted(set(queues)) if queues is not None else None,
            parse_tags(tags),
        )

    def unassign(self, topic: str) -> None:
        self._assigned.pop(topic, None)
        for key in [k for k in self._positions if k[0] == topic]:
            del self._positions[key]

    def subscribe(
        self,
        topics: Sequence[str] | Mapping[str, Tags],
        *,
        on_assign: QueuesCallback | None = None,
        on_revoke: QueuesCallback | None = None,
    ) -> None:
        """Let the group share the queues of `topics` (a list, or topic -> tags as for a
        `PushConsumer`) among its subscribed members (Kafka's `subscribe`). Each `poll`
        first takes up a new share when the members changed: `on_revoke(queues)` runs
        with the (topic, queue) pairs given up, before they go (commit what you have
        processed of them there: the next owner starts at the committed offset), then
        `on_assign(queues)` with those gained. Callbacks may be async; plain ones run in
        a worker thread, so a blocking client's own calls work inside them. Replaces an
        earlier subscription."""
        if self._assigned:
            raise ValueError("this consumer assigned queues itself: unassign() them "
                             "before subscribing")
        if isinstance(topics, str):
            raise ValueError(f"topics is a list of topics or a mapping topic -> tags, not "
                             f"the string {topics!r}")
        wanted: dict[str, list[str] | None] = (
            {t: parse_tags(v) for t, v in topics.items()} if isinstance(topics, Mapping)
            else dict.fromkeys(topics))
        if not wanted:
            raise ValueError("subscribe to at least one topic")
        for t in wanted:
            validate_topic_name(t)
        self._subscribed = wanted
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._shared_at = -math.inf  # share at the next poll
        self._watch()
        if self._tg is not None:  # known to the others now, not at the next beat
            self._tg.start_soon(self._heartbeat, int(self.heartbeat_interval * 3000))

    async def unsubscribe(self) -> None:
        """Give up the group's share: `on_revoke` with every queue owned, then this
        consumer leaves the group's sharing (it stays visible, with nothing assigned)."""
        owned, self._owned = self._owned, []
        if owned:
            await _call_back(self._on_revoke, owned)
        for key in owned:
            self._positions.pop(key, None)
        self._subscribed = {}
        if self._routes is not None and not self._closed:
            await self._heartbeat(int(self.heartbeat_interval * 3000))

    async def _share(self) -> None:
        """Take up the group's current share of the subscribed topics' queues (see
        `subscribe`); a topic without a route keeps the queues owned of it."""
        clients = await self.clients()
        desired, known = await self._desired(self._subscribed, clients)
        desired.update(k for k in self._owned if k[0] not in known)
        with anyio.CancelScope(shield=True):  # all of a new share, or none of it
            lost = sorted(set(self._owned) - desired)
            gained = sorted(desired - set(self._owned))
            if lost or gained:
                log.info("%s: new share among %d clients: -%s +%s", self.client_id,
                         len(clients), lost, gained)
            if lost:
                await _call_back(self._on_revoke, lost)
                for key in lost:
                    self._positions.pop(key, None)
                    self.unreadable.pop(key, None)
                    self._silent.pop(key, None)
            self._owned = sorted(desired)
            if gained:
                await _call_back(self._on_assign, gained)

    async def assignment(self) -> list[tuple[str, int]]:
        """The (topic, queue) pairs `poll` reads, with "all queues" resolved by route
        (subscribed: the group's share, as of the last `poll`)."""
        if self._subscribed:
            return list(self._owned)
        out: list[tuple[str, int]] = []
        for topic, (queues, _tags) in sorted(self._assigned.items()):
            if queues is None:
                route = await self.routes.route(topic)
                queues = list(range(route.total))
            out += [(topic, q) for q in queues]
        return out

    def position(self, topic: str, queue: int) -> int | None:
        """The next offset `poll`/`pull` will read, None until first used."""
        return self._positions.get((topic, queue))

    def seek(self, topic: str, queue: int, offset: int) -> None:
        self._positions[(topic, queue)] = offset

    async def committed(self, topic: str, queue: int) -> int:
        """The group's committed offset of a queue, -1 when none."""
        return await query_offset(self.routes, self.group, topic, queue)

    async def bounds(self, topic: str, queue: int) -> tuple[int, int]:
        """(earliest retained offset, end offset) of a queue."""
        return await queue_bounds(self.routes, topic, queue)

    async def _initial_position(self, topic: str, queue: int) -> int:
        committed = await self.committed(topic, queue)
        if committed >= 0:
            return committed
        lo, end = await self.bounds(topic, queue)
        return lo if self.start_from == "first" else end

    async def pull(
        self,
        topic: str,
        queue: int,
        offset: int | None = None,
        max: int = PULL_BATCH,
        wait_ms: int | None = None,
        *,
        tags: Tags = None,
    ) -> PullResult:
        """Fetch up to `max` messages from `offset` (default: this consumer's position,
        initialised from the committed offset), holding up to `wait_ms` at the end.

        An offset below the earliest retained one jumps to it (with a warning), one
        beyond the end jumps to the end. The position moves to `next_offset`.
        """
        key = (topic, queue)
        res = await self._read(topic, queue, offset, max, wait_ms, tags)
        self._positions[key] = res.next_offset
        return res

    async def _read(
        self, topic: str, queue: int, offset: int | None, max: int, wait_ms: int | None,
        tags: Tags,
    ) -> PullResult:
        """`pull` without moving the position."""
        routes = self.routes
        key = (topic, queue)
        if offset is None:
            offset = self._positions.get(key)
            if offset is None:
                offset = await self._initial_position(topic, queue)
                self._positions.setdefault(key, offset)
        selected = parse_tags(tags)
        if tags is None and topic in self._assigned:
            selected = self._assigned[topic][1]
        elif tags is None and topic in self._subscribed:
            selected = self._subscribed[topic]
        wait = self.wait_ms if wait_ms is None else wait_ms
        for _ in range(3):
            try:
                return await fetch(
                    routes, topic, queue, offset, max_messages=max, max_bytes=self.max_bytes,
                    wait_ms=wait, tags=selected,
                )
            except RequestError as exc:
                jump = _out_of_range(exc, topic, queue, offset)
                if jump is None:
                    raise
                offset = jump
        raise RequestError(Code.INTERNAL, f"{topic}:{queue} offset kept moving out of range")

    async def poll(self, timeout: float = 1.0, *, max_messages: int = PULL_BATCH) -> list[Message]:
        """What is available now across every assigned queue, up to `max_messages` in all
        (Kafka's `poll`): every queue is read at once, and when none has anything the
        call waits for the first message, then collects what the other queues have by
        then. Queues take turns, so a deep one cannot starve the rest.

        `timeout` bounds the whole call (route lookups, connects and retries included;
        0 makes one sweep that does not wait, bounded by the consumer's `timeout`).

        Messages come sorted by (topic, queue, offset), and each queue's position moves
        past exactly the messages returned. A queue that cannot be read now (no leader
        reachable, or no answer to the polls for the consumer's `timeout`) is skipped and
        listed in `unreadable` until a poll reads it (one not answering for less long is
        in `silent()`); other errors are raised when no queue returned anything.
        """
        if not self._assigned and not self._subscribed:
            raise RuntimeError("assign() or subscribe() to a topic before polling")
        if max_messages < 1:
            raise ValueError("max_messages must be >= 1")
        if timeout < 0:
            raise ValueError("timeout must not be negative")
        deadline = clock() + (timeout if timeout > 0 else self.timeout)
        targets: list[tuple[str, int]] = []
        with anyio.move_on_after(deadline - clock()):
            if self._subscribed and (self._members_changed.is_set()
                                     or clock() - self._shared_at >= self.rebalance_interval):
                self._members_changed = anyio.Event()
                self._shared_at = clock()
                try:
                    await self._share()
                except RequestError as exc:
                    log.warning("%s: sharing the group's queues failed: %s",
                                self.client_id, exc)
                    self._shared_at = -math.inf
            targets = [k for k in await self.assignment() if not self._is_paused(k)]
        if not targets:  # everything paused: wait as a poll with nothing to read does
            if timeout > 0:
                await anyio.sleep(max(0.0, deadline - clock()))
            return []
        found = await self._sweep(targets, max_messages, 0, deadline, first_only=False)
        left = deadline - clock()
        hold = left - min(POLL_MARGIN, left / 4)
        if not any(r.messages for r in found.values()) and timeout > 0 and hold > 0:
            waited = await self._sweep(targets, max_messages, int(hold * 1000), deadline,
                                       first_only=True, answered=set(found))
            found.update(waited)
            if any(r.messages for r in waited.values()) and clock() < deadline:
                rest = [k for k in targets if k not in waited or not waited[k].messages]
                # only collecting: a queue the deadline cuts off here is not unreadable
                found.update(await self._sweep(rest, max_messages, 0, deadline,
                                               first_only=False, answered=set(rest)))
        return self._take(found, max_messages)

    async def _sweep(
        self, targets: list[tuple[str, int]], max_messages: int, wait_ms: int,
        deadline: float, *, first_only: bool, answered: Container[tuple[str, int]] = (),
    ) -> dict[tuple[str, int], PullResult]:
        """Read every target at once, until `deadline` (`clock()`) at the latest; with
        `first_only`, stop the others as soon as one answers with messages (their
        positions do not move). A target that gave no answer is unreadable for now,
        unless it is in `answered` (it did answer earlier in the same poll)."""
        results: dict[tuple[str, int], PullResult] = {}
        errors: list[RequestError] = []
        failed: set[tuple[str, int]] = set()
        began = clock()

        async def one(topic: str, queue: int, scope: anyio.CancelScope) -> None:
            try:
                res = await self._read(topic, queue, None, max_messages, wait_ms, None)
            except RequestError as exc:
                failed.add((topic, queue))
                if is_retriable(exc):
                    log.debug("poll: %s:%d unavailable (%s)", topic, queue, exc)
                    self.unreadable[(topic, queue)] = exc
                else:
                    errors.append(exc)
                return
            self.unreadable.pop((topic, queue), None)
            self._silent.pop((topic, queue), None)
            results[(topic, queue)] = res
            if first_only and res.messages:
                scope.cancel()

        limit = min(wait_ms / 1000 + FETCH_GRACE, deadline - clock())
        with anyio.move_on_after(limit) as cut:
            async with anyio.create_task_group() as tg:
                for topic, queue in targets:
                    tg.start_soon(one, topic, queue, tg.cancel_scope)
        if cut.cancelled_caught:  # unanswered for the consumer's timeout: unreadable
            now = clock()
            for key in targets:
                if key not in results and key not in failed and key not in answered:
                    since = self._silent.setdefault(key, began)
                    if now - since >= self.timeout:
                        self.unreadable[key] = UnavailableError(
                            f"no answer for {key[0]}/{key[1]} for {now - since:.3g} s")
        if errors and not any(r.messages for r in results.values()):
            raise errors[0]
        return results

    def _take(self, found: dict[tuple[str, int], PullResult], limit: int) -> list[Message]:
        """Up to `limit` messages, one queue at a time in turn; positions move past what
        is taken (and past filtered-out offsets of a queue taken to its answer's end)."""
        keys = sorted(found)
        taken: dict[tuple[str, int], int] = dict.fromkeys(keys, 0)
        total = 0
        progress = True
        while total < limit and progress:
            progress = False
            for k in keys:
                if total < limit and taken[k] < len(found[k].messages):
                    taken[k] += 1
                    total += 1
                    progress = True
        out: list[Message] = []
        for k in keys:
            res, n = found[k], taken[k]
            out += res.messages[:n]
            if n == len(res.messages):
                self._positions[k] = res.next_offset
            else:
                self._positions[k] = res.messages[n - 1].offset + 1 if n else (
                    res.messages[0].offset)
        return out

    async def commit(self, topic: str, queue: int, offset: int, *,
                     timeout: float | None = None) -> None:
        """Commit `offset` (the next one to consume) for the group, through the Raft log.

        `timeout` (default `CALL_TIMEOUT`) bounds the whole call, retries during an
        election included: past it, `UnavailableError` (nothing committed) or
        `OutcomeUnknownError` (a request was out: committing again is safe)."""
        await commit_offsets(self.routes, self.group, {(topic, queue): offset},
                             timeout=CALL_TIMEOUT if timeout is None else timeout)

    async def commit_all(self, *, timeout: float | None = None) -> None:
        """Commit the current position of every queue read so far (`timeout` as for
        `commit`)."""
        if self._positions:
            await commit_offsets(self.routes, self.group, dict(self._positions),
                                 timeout=CALL_TIMEOUT if timeout is None else timeout)


def _out_of_range(exc: RequestError, topic: str, queue: int, offset: int) -> int | None:
    """Where to continue after an out-of-range fetch, or None for other errors."""
    if exc.code == Code.OFFSET_TOO_SMALL and "min" in exc.extra:
        lo = int(exc.extra["min"])
        log.warning(
            "%s:%d offset %d is below the earliest retained offset %d; skipping ahead",
            topic, queue, offset, lo,
        )
        return lo
    if exc.code == Code.OFFSET_TOO_LARGE and "end" in exc.extra:
        end = int(exc.extra["end"])
        log.warning("%s:%d offset %d is beyond the end %d; moving back", topic, queue, offset, end)
        return end
    return None


# ---------------------------------------------------------------- push consumer


@dataclass(eq=False)
class _QueueState:
    topic: str
    queue: int
    tags: list[str] | None
    offset: int
    window: OffsetWindow
    committed: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    released: bool = False
    running: int = 0
    idle: anyio.Event | None = None
    # message key -> this queue's unfinished works holding it, oldest first: a work runs
    # only at the head of each of its keys' lines (see `PushConsumer._submit`)
    lines: dict[str, deque[_Work]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.queue)


@dataclass(slots=True)
class _Work:
    state: _QueueState
    messages: list[Message]
    attempt: int = 0

    @property
    def keys(self) -> set[str]:
        return {m.key for m in self.messages if m.key}


class PushConsumer(_GroupClient):
    """Calls `handler` for every message of `topics`; use `async with` or `await run()`.

    The handler receives a list of messages (at most `consume_batch`, default 1) and
    may be a plain or an async function; plain ones run in worker threads. It fails by
    raising or returning False: the messages are redelivered in place after a backoff,
    up to `max_reconsume_times`, then passed to `on_give_up` (plain or async; awaited).
    The offset passes a message only once the handler or `on_give_up` completed on it:
    with no `on_give_up`, or one that raises, it is retried (backoff capped at 60 s).
    Up to `consume_concurrency` handler calls run at once; a queue stops being pulled
    while more than `per_queue_threshold` of its messages are unfinished.

    Order: messages with the same key are handled one at a time in their queue's order,
    retries included: while a message waits for its redelivery, the later messages of its
    key wait behind it (other keys go on). Keyless messages have no order among
    themselves. (A producer sends one key to one queue, so this is the key's send order.)

    `mode="clustering"` shares the queues among the group's consumers (`strategy`
    "average" or "round_robin", recomputed from the clients seen by heartbeats as soon
    as a node reports that the group's members changed, and every `rebalance_interval`) and commits offsets through the log every `commit_interval`
    and when a queue is released. `mode="broadcast"` reads every queue in every
    consumer and keeps its offsets in a file of its own on this host, in `offsets_dir`
    (default `$RAFTMQ_OFFSETS_DIR` or `~/.raftmq/offsets`), so a restart goes on where it
    stopped; two live broadcast consumers of one group need different directories.

    `topics` is a list, or a mapping topic -> tags to filter on: None or "*" (all
    messages), "TagA", "TagA || TagB" or a list of tags (see `parse_tags`).
    `isolation` is "read_committed", the only level served (`check_isolation`).
    """

    def __init__(
        self,
        namesrv: Sequence[str] | str,
        group: str,
        topics: Sequence[str] | Mapping[str, Tags],
        handler: Handler,
        *,
        mode: Literal["clustering", "broadcast"] = "clustering",
        strategy: Literal["average", "round_robin"] | Callable[..., list[Any]] = "average",
        pull_batch: int = PULL_BATCH,
        per_queue_threshold: int = 1000,
        consume_batch: int = 1,
        consume_concurrency: int = 20,
        commit_interval: float = 5.0,
        heartbeat_interval: float = 10.0,
        rebalance_interval: float = 10.0,
        start_from: StartFrom = "first",
        long_poll_ms: int = LONG_POLL_MS,
        max_reconsume_times: int = 16,
        reconsume_delay: float = 1.0,
        on_give_up: Callable[[list[Message]], Any] | None = None,
        shutdown_timeout: float = 5.0,
        client_id: str | None = None,
        timeout: float = 3.0,
        pool: ConnectionPool | None = None,
        isolation: str = "read_committed",
        offsets_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(namesrv, pool, timeout)
        self.isolation = check_isolation(isolation)
        self.group = validate_group_name(group)
        self._offset_file = LocalOffsets(
            offsets_dir if offsets_dir is not None else default_offsets_dir(), self.group
        ) if mode == "broadcast" else None
        if isinstance(topics, Mapping):
            self.topics = {t: parse_tags(v) for t, v in topics.items()}
        elif isinstance(topics, str):
            raise ValueError(f"topics is a list of topics or a mapping topic -> tags, not "
                             f"the string {topics!r}")
        else:
            self.topics = {t: None for t in topics}
        if not self.topics:
            raise ValueError("subscribe to at least one topic")
        for t in self.topics:
            validate_topic_name(t)
        if mode not in ("clustering", "broadcast"):
            raise ValueError("mode is 'clustering' or 'broadcast'")
        self._allocate = _strategy(strategy)
        if start_from not in ("first", "last"):
            raise ValueError("start_from is 'first' or 'last'")
        if min(pull_batch, per_queue_threshold, consume_batch, consume_concurrency) < 1:
            raise ValueError("batch sizes, threshold and concurrency must be >= 1")
        self.handler = handler
        self.mode = mode
        self.pull_batch = pull_batch
        self.per_queue_threshold = per_queue_threshold
        self.consume_batch = consume_batch
        self.consume_concurrency = consume_concurrency
        self.commit_interval = commit_interval
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self.start_from = start_from
        self.long_poll_ms = long_poll_ms
        self.max_reconsume_times = max_reconsume_times
        self.reconsume_delay = reconsume_delay
        self.on_give_up = on_give_up
        self.shutdown_timeout = shutdown_timeout
        self.client_id = checked_client_id(client_id)
        self._handler_is_async = _is_async_callable(handler)
        self._states: dict[tuple[str, int], _QueueState] = {}
        self._local_offsets: dict[tuple[str, int], int] = {}
        self._rebalance_lock: anyio.Lock | None = None
        self._work_send: MemoryObjectSendStream[_Work] | None = None
        self._control: anyio.CancelScope | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._resumed: anyio.Event | None = None  # unset while paused

    @property
    def clustering(self) -> bool:
        return self.mode == "clustering"

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> PushConsumer:
        if self._offset_file is not None:
            self._local_offsets = await anyio.to_thread.run_sync(self._offset_file.open)
        try:
            await self._open()
        except BaseException:
            if self._offset_file is not None:
                self._offset_file.close()
            raise
        assert self._tg is not None
        self._rebalance_lock = anyio.Lock()
        self._limiter = anyio.CapacityLimiter(self.consume_concurrency)
        send, receive = anyio.create_memory_object_stream[_Work](float("inf"))
        self._work_send = send
        for _ in range(self.consume_concurrency):
            self._tg.start_soon(self._worker, receive.clone())
        receive.close()
        self._control = anyio.CancelScope()
        self._tg.start_soon(self._control_loops, self._control)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        try:
            if self._control is not None:
                self._control.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.shutdown_timeout * 2):
                await self._release_all()
                if self.clustering:
                    await self._heartbeat(leaving=True)
        finally:
            if self._work_send is not None:
                self._work_send.close()
            if self._offset_file is not None:
                self._offset_file.close()
        return await self._close(exc_type, exc, tb)

    async def run(self) -> None:
        """Consume until cancelled."""
        async with self:
            await anyio.sleep_forever()

    def assignment(self) -> list[tuple[str, int]]:
        """The (topic, queue) pairs this consumer currently reads."""
        return sorted(self._states)

    def pause(self) -> None:
        """Hand the handler no more messages until `resume()` (RocketMQ's `suspend`):
        calls already running finish, nothing more is pulled, and offsets stay where the
        finished messages put them. Heartbeats and rebalancing go on, so the consumer
        keeps its queues; a queue it loses meanwhile is released as usual."""
        if self._resumed is None or self._resumed.is_set():
            self._resumed = anyio.Event()

    def resume(self) -> None:
        """Go on after `pause()`."""
        if self._resumed is not None:
            self._resumed.set()

    @property
    def paused(self) -> bool:
        return self._resumed is not None and not self._resumed.is_set()

    async def _unpaused(self) -> None:
        while self._resumed is not None and not self._resumed.is_set():
            await self._resumed.wait()

    def offsets(self) -> dict[tuple[str, int], int]:
        """The committable offset of every queue read (the lowest unfinished one)."""
        return {k: st.window.committable() for k, st in sorted(self._states.items())}

    # ------------------------------------------------------------ membership

    async def _control_loops(self, scope: anyio.CancelScope) -> None:
        with scope:
            async with anyio.create_task_group() as tg:
                if self.clustering:
                    await self._heartbeat()
                    tg.start_soon(self._every, self.heartbeat_interval, self._heartbeat)
                    tg.start_soon(self._watch_members, tg)
                tg.start_soon(self._rebalance_loop)
                tg.start_soon(self._every, self.commit_interval, self.commit_now, False)

    async def _rebalance_loop(self) -> None:
        """Rebalance now, then as soon as a node says the group's members changed
        (`_watch_node`), and every `rebalance_interval` in any case."""
        while True:
            self._members_changed = anyio.Event()
            try:
                await self.rebalance()
            except Exception as exc:
                log.warning("%s: rebalance failed: %s", self.client_id, exc)
            with anyio.move_on_after(self.rebalance_interval):
                await self._members_changed.wait()

    async def _every(
        self, period: float, fn: Callable[[], Awaitable[Any]], immediately: bool = False
    ) -> None:
        if not immediately:
            await anyio.sleep(period)
        while True:
            try:
                await fn()
            except Exception as exc:
                log.warning("%s: %s failed: %s", self.client_id, getattr(fn, "__name__", fn), exc)
            await anyio.sleep(period)

    async def _heartbeat(self, leaving: bool = False) -> None:
        """Tell every node this client is alive (ttl 0 when leaving, so it drops us now)."""
        ttl_ms = 0 if leaving else int(self.heartbeat_interval * 3000)
        await heartbeat(self.routes, {"cg": self.group, "client": self.client_id,
                                      "topics": sorted(self.topics), "ttl_ms": ttl_ms},
                        self.timeout)

    async def rebalance(self) -> None:
        """Recompute this consumer's queues now; release lost ones before taking new ones
        (so the previous owner's final commit is in before a new owner reads)."""
        assert self._rebalance_lock is not None
        async with self._rebalance_lock:
            clients = await self.clients() if self.clustering else [self.client_id]
            desired, known = await self._desired(self.topics, clients, share=self.clustering)
            current = set(self._states)
            lost = {k for k in current - desired if k[0] in known}
            gained = sorted(desired - current)
            if lost or gained:
                log.info("%s: rebalance among %d clients: -%s +%s", self.client_id,
                         len(clients), sorted(lost), gained)
            if lost:
                await self._release([self._states[k] for k in lost])
            for topic, queue in gained:
                try:
                    await self._acquire(topic, queue)
                except RequestError as exc:
                    log.warning("%s: cannot start %s:%d yet: %s", self.client_id, topic, queue, exc)

    async def _acquire(self, topic: str, queue: int) -> None:
        assert self._tg is not None
        if self.clustering:
            committed = await query_offset(self.routes, self.group, topic, queue)
        else:
            committed = self._local_offsets.get((topic, queue), -1)
        start = committed
        if start < 0:
            lo, end = await queue_bounds(self.routes, topic, queue)
            start = lo if self.start_from == "first" else end
        st = _QueueState(topic, queue, self.topics[topic], start, OffsetWindow(start), committed)
        self._states[st.key] = st
        self._tg.start_soon(self._pull_loop, st)

    async def _release(self, states: Sequence[_QueueState]) -> None:
        for st in states:
            st.released = True
            st.scope.cancel()
        with anyio.move_on_after(self.shutdown_timeout):
            for st in states:
                if st.running:
                    st.idle = anyio.Event()
                    await st.idle.wait()
        try:
            await self._commit(states)
        except Exception as exc:
            log.warning("%s: final commit of released queues failed: %s", self.client_id, exc)
        for st in states:
            if self._states.get(st.key) is st:
                del self._states[st.key]

    async def _release_all(self) -> None:
        if self._rebalance_lock is None:
            return
        async with self._rebalance_lock:
            await self._release(list(self._states.values()))

    # ------------------------------------------------------------ offsets

    async def commit_now(self) -> None:
        """Commit every owned queue's committable offset that moved since the last commit."""
        await self._commit(list(self._states.values()))

    async def _commit(self, states: Sequence[_QueueState]) -> None:
        todo = {st.key: (st, st.window.committable()) for st in states}
        todo = {k: v for k, v in todo.items() if v[1] > v[0].committed}
        if not todo:
            return
        if self.clustering:
            await commit_offsets(self.routes, self.group, {k: off for k, (_, off) in todo.items()})
        else:
            assert self._offset_file is not None
            offsets = {**self._local_offsets, **{k: off for k, (_, off) in todo.items()}}
            await anyio.to_thread.run_sync(self._offset_file.save, offsets)
            self._local_offsets = offsets
        for st, off in todo.values():
            st.committed = max(st.committed, off)

    # ------------------------------------------------------------ pulling and consuming

    async def _pull_loop(self, st: _QueueState) -> None:
        assert self._work_send is not None
        failures = 0
        with st.scope:
            while not st.released:
                if self.paused:
                    await self._unpaused()
                    continue
                if len(st.window) > self.per_queue_threshold:
                    await anyio.sleep(FLOW_CONTROL_DELAY)
                    continue
                try:
                    res = await fetch(
                        self.routes, st.topic, st.queue, st.offset,
                        max_messages=self.pull_batch, wait_ms=self.long_poll_ms, tags=st.tags,
                    )
                except Exception as exc:
                    if not isinstance(exc, RequestError):
                        log.exception("%s: pull %s:%d", self.client_id, st.topic, st.queue)
                        exc = RequestError(Code.INTERNAL, repr(exc))
                    jump = _out_of_range(exc, st.topic, st.queue, st.offset)
                    if jump is not None:
                        # messages still in flight were below the retained range anyway
                        st.offset = jump
                        st.window.reset(jump)
                        continue
                    failures += 1
                    level = logging.DEBUG if is_retriable(exc) else logging.WARNING
                    log.log(level, "%s: pull %s:%d failed: %s", self.client_id, st.topic,
                            st.queue, exc)
                    await anyio.sleep(backoff_delay(failures, base=0.1, cap=5.0))
                    continue
                failures = 0
                if res.next_offset < st.offset:
                    log.warning("%s: %s:%d answered next %d below %d; ignoring", self.client_id,
                                st.topic, st.queue, res.next_offset, st.offset)
                msgs = [m for m in res.messages if m.offset >= st.window.end]
                for m in msgs:
                    st.window.add(m.offset)
                st.window.advance(res.next_offset)
                st.offset = max(st.offset, res.next_offset)
                for i in range(0, len(msgs), self.consume_batch):
                    self._submit(_Work(st, msgs[i : i + self.consume_batch]))

    def _submit(self, work: _Work) -> None:
        """Queue `work` behind the unfinished works of its queue that share a message key
        with it, or hand it to the workers now if none does: one key's messages are
        handled one at a time, in offset order, a retry holding its place."""
        st = work.state
        for k in work.keys:
            st.lines.setdefault(k, deque()).append(work)
        if self._at_head(work):
            self._dispatch(work)

    @staticmethod
    def _at_head(work: _Work) -> bool:
        return all(work.state.lines[k][0] is work for k in work.keys)

    def _dispatch(self, work: _Work) -> None:
        if work.state.released or self._work_send is None:
            return
        try:
            self._work_send.send_nowait(work)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def _done(self, work: _Work) -> None:
        """`work` is finished: the next work of each of its keys may run."""
        st = work.state
        self._finish(st, work.messages)
        nexts: list[_Work] = []
        for k in work.keys:
            line = st.lines[k]
            line.popleft()
            if line:
                nexts.append(line[0])
            else:
                del st.lines[k]
        for nxt in {id(w): w for w in nexts}.values():
            if self._at_head(nxt):
                self._dispatch(nxt)

    async def _worker(self, receive: MemoryObjectReceiveStream[_Work]) -> None:
        async with receive:
            async for work in receive:
                st = work.state
                await self._unpaused()
                if st.released:
                    continue
                st.running += 1
                try:
                    ok = await self._invoke(work.messages)
                finally:
                    st.running -= 1
                    if st.running == 0 and st.idle is not None:
                        st.idle.set()
                if ok or (0 <= self.max_reconsume_times <= work.attempt
                          and await self._give_up(work.messages)):
                    self._done(work)
                else:
                    assert self._tg is not None
                    work.attempt += 1  # the same work: it keeps its place in its keys' lines
                    self._tg.start_soon(self._reconsume_later, work)

    @staticmethod
    def _finish(st: _QueueState, msgs: list[Message]) -> None:
        for m in msgs:
            st.window.done(m.offset)

    async def _give_up(self, msgs: list[Message]) -> bool:
        """Hand messages the handler kept failing to `on_give_up` (awaited when it is a
        coroutine function or returns an awaitable, run in a worker thread when plain);
        whether it ran to completion. Only then may the offset pass them: without an
        `on_give_up`, or when it raises, they stay unfinished and are tried again at the
        capped backoff, holding back their queue's committed offset: nothing is skipped
        that user code has not handled."""
        ids = [m.msg_id for m in msgs]
        if self.on_give_up is None:
            log.error("%s: %s failed %d times and no on_give_up is set: trying again (the "
                      "queue's committed offset stays below them)", self.client_id, ids,
                      self.max_reconsume_times + 1)
            return False
        try:
            if _is_async_callable(self.on_give_up):
                await self.on_give_up(msgs)
            else:
                result = await anyio.to_thread.run_sync(self.on_give_up, msgs,
                                                        limiter=self._limiter,
                                                        abandon_on_cancel=True)
                if inspect.isawaitable(result):
                    await result
        except Exception:
            log.exception("%s: on_give_up failed on %s: trying them again", self.client_id, ids)
            return False
        return True

    async def _reconsume_later(self, work: _Work) -> None:
        await anyio.sleep(min(60.0, self.reconsume_delay * 2 ** (work.attempt - 1)))
        self._dispatch(work)

    async def _invoke(self, msgs: list[Message]) -> bool:
        try:
            if self._handler_is_async:
                result = await self.handler(msgs)
            else:
                # abandoned when the consumer closes (after `shutdown_timeout`): a stuck
                # handler must not hold the close; its messages stay unfinished, so their
                # offsets are not committed and they are delivered again
                result = await anyio.to_thread.run_sync(self.handler, msgs, limiter=self._limiter,
                                                        abandon_on_cancel=True)
                if inspect.isawaitable(result):
                    result = await result
        except Exception:
            log.exception("%s: handler failed on %s", self.client_id, [m.msg_id for m in msgs])
            return False
        return result is not False


class _NeverSet:
    """Stands for an event before there is an event loop to make one in."""

    def set(self) -> None:
        pass

    def is_set(self) -> bool:
        return False


def _is_async_callable(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
