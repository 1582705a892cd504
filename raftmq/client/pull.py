"""The pull consumer: explicit positions, `poll` for messages of the queues it holds."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self

import anyio
import anyio.abc

from transport.connection import ConnectionPool, is_retriable
from wire.protocol import Code, RequestError, validate_group_name, validate_topic_name
from wire.records import Message
from wire.requests import HeartbeatRequest

from .allocation import strategy_of
from .errors import LockLostError, UnavailableError
from .groupclient import (
    GroupClient,
    QueuesCallback,
    call_back,
    check_isolation,
    checked_client_id,
)
from .reads import (
    FETCH_GRACE,
    FETCH_MAX_BYTES,
    LONG_POLL_MS,
    PULL_BATCH,
    MessageSelector,
    PullResult,
    Selector,
    commit_offsets,
    fetch,
    out_of_range_offset,
    query_offset,
    queue_bounds,
    selector_of,
)
from .routes import clock
from .trace import Tracer

log = logging.getLogger("raftmq.client.consumer")

CALL_TIMEOUT = 30.0  # default bound of a whole commit: outlasts an election's retries
POLL_MARGIN = 0.2  # seconds of a poll's timeout left for the answer to a held fetch
StartFrom = Literal["first", "last"]


class PullConsumer(GroupClient):
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
        trace: bool = False,
    ) -> None:
        super().__init__(namesrv, pool, timeout)
        self.isolation = check_isolation(isolation)
        self.group = validate_group_name(group)
        if start_from not in ("first", "last"):
            raise ValueError("start_from is 'first' or 'last'")
        self.client_id = checked_client_id(client_id)
        if trace:
            self.tracer = Tracer("consumer", self.client_id, self.group, commits=True)
        if not heartbeat_interval > 0 or not rebalance_interval > 0:
            raise ValueError("heartbeat_interval and rebalance_interval must be > 0")
        self.heartbeat_interval = heartbeat_interval
        self.rebalance_interval = rebalance_interval
        self._allocate = strategy_of(strategy)
        # group-managed assignment (`subscribe`): topic -> selector, the queues the group
        # gave this consumer, the callbacks, and when the share was last computed
        self._subscribed: dict[str, MessageSelector] = {}
        self._owned: list[tuple[str, int]] = []
        self._on_assign: QueuesCallback | None = None
        self._on_revoke: QueuesCallback | None = None
        self._shared_at = -math.inf
        self._watching = False
        self.start_from = start_from
        self.wait_ms = wait_ms
        self.max_bytes = max_bytes
        self._assigned: dict[str, tuple[list[int] | None, MessageSelector]] = {}
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
            # gone from its group now, not at its expiry
            await self._beats.leave(self.routes, self._member(), self.timeout)
        return await self._close(exc_type, exc, tb)

    async def _beat(self) -> None:
        while True:
            await self._heartbeat()
            await anyio.sleep(self.heartbeat_interval)

    async def _heartbeat(self) -> None:
        await self._beats.beat(self.routes, self._member(), self.timeout)

    def _member(self) -> HeartbeatRequest:
        """A heartbeat: as a subscribed member, counted when the group shares queues;
        with manual assignment, visible to its group (an offset reset refuses) but never
        given queues by another member's rebalance."""
        ttl_ms = int(self.heartbeat_interval * 3000)
        if self._subscribed:
            return HeartbeatRequest(cg=self.group, client=self.client_id,
                                    topics=tuple(sorted(self._subscribed)), ttl_ms=ttl_ms)
        return HeartbeatRequest(cg=self.group, client=self.client_id,
                                topics=tuple(sorted(self._assigned)), ttl_ms=ttl_ms,
                                manual=True)

    def assign(
        self, topic: str, queues: Iterable[int] | None = None, *, tags: Selector = None,
        sql: str | None = None,
    ) -> None:
        """Read `queues` of `topic` (all of them when None), only messages with one of
        `tags` when given ("*", "TagA", "TagA || TagB" or a list; see `parse_tags`, or a
        `MessageSelector`) and that the SQL92 filter `sql` matches when given (decided
        on the node; `FilterError` here, naming the position, for a bad one).
        Replaces an earlier assignment of the topic."""
        validate_topic_name(topic)
        if self._subscribed:
            raise ValueError("this consumer subscribed: its group assigns its queues "
                             "(unsubscribe() first to assign queues yourself)")
        self._assigned[topic] = (
            sorted(set(queues)) if queues is not None else None,
            _selection(tags, sql),
        )

    def unassign(self, topic: str) -> None:
        self._assigned.pop(topic, None)
        for key in [k for k in self._positions if k[0] == topic]:
            del self._positions[key]

    def subscribe(
        self,
        topics: Sequence[str] | Mapping[str, Selector],
        *,
        on_assign: QueuesCallback | None = None,
        on_revoke: QueuesCallback | None = None,
    ) -> None:
        """Let the group share the queues of `topics` (a list, or topic -> tags or a
        `MessageSelector` as for a `PushConsumer`) among its subscribed members (Kafka's `subscribe`). Each `poll`
        first takes up a new share when the members changed: `on_revoke(queues)` runs
        with the (topic, queue) pairs given up, before they go (commit what you have
        processed of them there: the next owner starts at the committed offset), then
        `on_assign(queues)` with those gained. Callbacks may be async; plain ones run in
        a worker thread, so a blocking client's own calls work inside them. Replaces an
        earlier subscription. Push consumers of the group hold queue locks: a commit of a
        queue one of them has locked is refused (`LockLostError`); raised by `on_revoke`,
        the queues are given up all the same."""
        if self._assigned:
            raise ValueError("this consumer assigned queues itself: unassign() them "
                             "before subscribing")
        if isinstance(topics, str):
            raise ValueError(f"topics is a list of topics or a mapping topic -> tags, not "
                             f"the string {topics!r}")
        wanted: dict[str, MessageSelector] = (
            {t: selector_of(v) for t, v in topics.items()} if isinstance(topics, Mapping)
            else dict.fromkeys(topics, MessageSelector()))
        if not wanted:
            raise ValueError("subscribe to at least one topic")
        for t in wanted:
            validate_topic_name(t)
        self._subscribed = wanted
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._shared_at = -math.inf  # share at the next poll
        self._watch()
        if self._tg is not None:  # known to the others now, not at the next beat
            self._tg.start_soon(self._heartbeat)

    async def unsubscribe(self) -> None:
        """Give up the group's share: `on_revoke` with every queue owned, then this
        consumer leaves the group's sharing (it stays visible, with nothing assigned)."""
        owned, self._owned = self._owned, []
        if owned:
            await call_back(self._on_revoke, owned)
        for key in owned:
            self._positions.pop(key, None)
        self._subscribed = {}
        if self._routes is not None and not self._closed:
            await self._heartbeat()

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
                try:
                    await call_back(self._on_revoke, lost)
                except LockLostError as exc:
                    # a push consumer of the group locked a queue given up here before
                    # on_revoke committed it: it is that consumer's now, read again
                    # there from the last commit; retrying would only be refused again
                    log.warning("%s: on_revoke: %s", self.client_id, exc)
                for key in lost:
                    self._positions.pop(key, None)
                    self.unreadable.pop(key, None)
                    self._silent.pop(key, None)
            self._owned = sorted(desired)
            if gained:
                await call_back(self._on_assign, gained)

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
        tags: Selector = None,
        sql: str | None = None,
    ) -> PullResult:
        """Fetch up to `max` messages from `offset` (default: this consumer's position,
        initialised from the committed offset), holding up to `wait_ms` at the end.
        `tags` and `sql` (a SQL92 filter, decided on the node) select messages as for
        `assign`; without either, the queue's assignment or subscription selects them.
        Messages a filter left out are skipped: `next_offset` lies past them.

        An offset below the earliest retained one jumps to it (with a warning), one
        beyond the end jumps to the end. The position moves to `next_offset`.
        """
        key = (topic, queue)
        res = await self._read(topic, queue, offset, max, wait_ms,
                               None if tags is None and sql is None else _selection(tags, sql))
        self._positions[key] = res.next_offset
        if self.tracer is not None:
            self.tracer.delivered(res.messages)
        return res

    async def _read(
        self, topic: str, queue: int, offset: int | None, max: int, wait_ms: int | None,
        selector: MessageSelector | None,
    ) -> PullResult:
        """`pull` without moving the position; `selector` None: the queue's own."""
        routes = self.routes
        key = (topic, queue)
        if offset is None:
            offset = self._positions.get(key)
            if offset is None:
                offset = await self._initial_position(topic, queue)
                self._positions.setdefault(key, offset)
        selected = selector
        if selected is None and topic in self._assigned:
            selected = self._assigned[topic][1]
        elif selected is None and topic in self._subscribed:
            selected = self._subscribed[topic]
        if selected is None:
            selected = MessageSelector()
        wait = self.wait_ms if wait_ms is None else wait_ms
        for _ in range(3):
            try:
                return await fetch(
                    routes, topic, queue, offset, max_messages=max, max_bytes=self.max_bytes,
                    wait_ms=wait, tags=selected.tag_list, sql=selected.sql,
                )
            except RequestError as exc:
                jump = out_of_range_offset(exc, topic, queue, offset)
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
        taken = self._take(found, max_messages)
        if self.tracer is not None:
            self.tracer.delivered(taken)
        return taken

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
        if self.tracer is not None:
            self.tracer.committed({(topic, queue): offset})

    async def commit_all(self, *, timeout: float | None = None) -> None:
        """Commit the current position of every queue read so far (`timeout` as for
        `commit`)."""
        if self._positions:
            offsets = dict(self._positions)
            await commit_offsets(self.routes, self.group, offsets,
                                 timeout=CALL_TIMEOUT if timeout is None else timeout)
            if self.tracer is not None:
                self.tracer.committed(offsets)


def _selection(tags: Selector, sql: str | None) -> MessageSelector:
    """A call's `tags` (tags or a selector) and `sql` as one selector."""
    if sql is None:
        return selector_of(tags)
    if isinstance(tags, MessageSelector):
        if tags.sql is not None:
            raise ValueError("give the SQL92 filter once: in the MessageSelector or as sql")
        return MessageSelector(tags.tags, sql)
    return MessageSelector(tags, sql)
