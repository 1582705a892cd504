"""Cluster administration: topics, their placement, consumer lag, leadership.

Topic creation is a CONTROL entry in each hosting group's log, so every replica agrees on
it; the admin spreads a topic's queues over groups and sends each group's leader the
queue ids it hosts. Nodes then report the topic to the name servers, which is when
clients can route to it, so `create_topic` waits for that by default.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import anyio

from transport.connection import ConnectionPool, is_retriable
from wire.protocol import Code, Frame, RequestError, validate_group_name, validate_topic_name
from wire.records import Message, decode_record, iter_records, message_id, parse_message_id
from wire.requests import (
    ConsumersAnswer,
    ConsumersRequest,
    CreateTopicRequest,
    DeleteGroupAnswer,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DlqAnswer,
    DlqRequest,
    GetMessageAnswer,
    GetMessageRequest,
    GrowTopicRequest,
    OffsetsAnswer,
    OffsetsRequest,
    QueryKeyAnswer,
    QueryKeyRequest,
    StatusAnswer,
    StatusRequest,
    TopicsAnswer,
    TopicsRequest,
)
from wire.requests.transactions import HalfEndAnswer, HalfEndRequest, TxListAnswer, TxListRequest
from wire.trace import TRACE_TOPIC, TraceRecord, decode_steps

from . import membership
from .errors import (
    IncompleteError,
    OutcomeUnknownError,
    TransactionError,
    UnavailableError,
    give_up,
    may_have_applied,
)
from .groupclient import ClientBase
from .membership import GroupMembers
from .pull import CALL_TIMEOUT
from .queuelocks import QueueLock, group_locks
from .reads import (
    commit_offsets,
    decode_fetch,
    fetch,
    offset_for_time,
    query_offset,
    queue_bounds,
)
from .routes import LEADER_WAIT, TopicRoute, backoff_delay, node_addresses

__all__ = ["TX_LISTS", "Admin", "DeadLetter", "GroupQueue", "dead_letter_id", "QueueInfo", "QueueLag", "TopicInfo",
           "TxListing", "place_queues"]

MAX_TRACE_RECORDS = 1024  # one message's trace records read at most (QUERY_KEY's cap)
TX_LISTS = ("halves", "prepared", "txns", "decided", "done")
"""The lists of a TX_LIST answer (see `Admin.tx_list`)."""
TX_LIST_ROUNDS = 5  # rounds of TX_LIST asking again for groups no leader answered for


class TxListing(dict[str, list[dict[str, Any]]]):
    """What `Admin.tx_list` answers: the lists by name, and `truncated`, true when some
    node cut its lists below the limit asked for so its answer fitted in one frame header
    (ask about one id, or one group, for the rest)."""

    truncated: bool = False


@dataclass(frozen=True, slots=True)
class QueueInfo:
    queue: int
    group: str | None
    leader: str | None
    min_offset: int | None
    end_offset: int | None


@dataclass(frozen=True, slots=True)
class TopicInfo:
    topic: str
    total: int
    queues: list[QueueInfo]
    replicas: dict[str, list[str]]


@dataclass(frozen=True, slots=True)
class QueueLag:
    """`lag` counts retained messages not consumed yet: end - max(committed, min)."""

    queue: int
    committed: int  # -1 when the group never committed this queue
    min_offset: int
    end_offset: int
    lag: int


@dataclass(frozen=True, slots=True)
class GroupQueue:
    """One queue a consumer group committed on: where it is and how far behind."""

    topic: str
    queue: int
    committed: int
    min_offset: int | None  # None when the queue's leader could not be reached
    end_offset: int | None

    @property
    def lag(self) -> int | None:
        if self.min_offset is None or self.end_offset is None:
            return None
        return max(0, self.end_offset - max(self.committed, self.min_offset))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message a simple consumer group gave up on (`%DLQ%<group>`), as `Admin.dlq_list`
    lists it: `id` is "<broker group>:<n>" (what `dlq_show`, `dlq_resend` and
    `dlq_purge` take), the source queue and offset, the message's id, how many times it
    was delivered, the last error a consumer gave and when it died (ms). `message` is
    there when shown (`dlq_show`)."""

    id: str
    group: str
    consumer_group: str
    topic: str
    queue: int
    offset: int
    msg_id: str
    store_ms: int
    deliveries: int
    error: str
    dead_ms: int
    message: Message | None = None


def _dead_letter(cg: str, row: Sequence[Any], message: Message | None = None) -> DeadLetter:
    g, did, topic, queue, offset, index, start, store_ms, deliveries, error, dead_ms = row
    return DeadLetter(f"{g}:{did}", str(g), cg, str(topic), int(queue), int(offset),
                      message_id(str(g), int(index), int(start)), int(store_ms),
                      int(deliveries), str(error), int(dead_ms), message)


def dead_letter_id(dlq_id: str) -> tuple[str, int]:
    """("<broker group>", n) of a dead letter's id "<broker group>:<n>"; ValueError for
    anything else."""
    g, sep, n = dlq_id.rpartition(":") if isinstance(dlq_id, str) else ("", "", "")
    if not sep or not g or not n.isdigit() or int(n) < 1:
        raise ValueError(f"a dead letter's id is '<broker group>:<n>' (as dlq list shows), "
                         f"got {dlq_id!r}")
    return g, int(n)


def place_queues(total: int, groups: Sequence[str]) -> dict[str, list[int]]:
    """Queue q goes to groups[q % len(groups)]: an even spread, a queue in one group."""
    if total < 1:
        raise ValueError("a topic needs at least one queue")
    if not groups:
        raise ValueError("no groups to place queues in")
    if len(set(groups)) != len(groups):
        raise ValueError(f"groups listed twice in {list(groups)}")
    placement: dict[str, list[int]] = {}
    for q in range(total):
        placement.setdefault(groups[q % len(groups)], []).append(q)
    return placement


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _bounded(write: bool) -> Callable[
        [Callable[Concatenate[Admin, _P], Awaitable[_R]]],
        Callable[Concatenate[Admin, _P], Awaitable[_R]]]:
    """Bound a whole Admin call, retries and waits included, by the Admin's
    `call_timeout`: past it a read raises `UnavailableError`, a change
    `OutcomeUnknownError` (a request may have been out: look before repeating it)."""
    def wrap(fn: Callable[Concatenate[Admin, _P], Awaitable[_R]]
             ) -> Callable[Concatenate[Admin, _P], Awaitable[_R]]:
        @functools.wraps(fn)
        async def bounded(self: Admin, *args: _P.args, **kwargs: _P.kwargs) -> _R:
            with anyio.move_on_after(self.call_timeout):
                return await fn(self, *args, **kwargs)
            what = (f"{fn.__name__}: not finished within the Admin's call_timeout "
                    f"({self.call_timeout:.3g} s)")
            if write:
                raise OutcomeUnknownError(f"{what}; it may have been applied: check before "
                                          "doing it again")
            raise UnavailableError(what)
        return bounded
    return wrap


class Admin(ClientBase):
    """Administrative requests; use as `async with Admin(namesrv) as admin:`.

    `timeout` bounds each request; `call_timeout` each whole call, retries during an
    election and waits (`create_topic`'s `wait`) included: past it a read raises
    `UnavailableError`, a change `OutcomeUnknownError`. Leadership and membership changes
    (`transfer_leader`, `add_replica`, `remove_replica`, `replace_replica`) and
    `group_members` are bounded by their own waits instead (`membership.LEADER_WAIT`,
    `catch_up_timeout`, `wait`): a catch-up may take minutes."""

    def __init__(
        self,
        namesrv: Sequence[str] | str,
        *,
        timeout: float = 3.0,
        call_timeout: float = CALL_TIMEOUT,
        pool: ConnectionPool | None = None,
    ) -> None:
        if not call_timeout > 0:
            raise ValueError("call_timeout must be > 0")
        super().__init__(namesrv, pool, timeout)
        self.call_timeout = call_timeout

    @_bounded(write=True)
    async def create_topic(
        self,
        topic: str,
        queues: int = 4,
        groups: Sequence[str] | None = None,
        *,
        exist_ok: bool = False,
        wait: float = 10.0,
    ) -> dict[str, list[int]]:
        """Create `topic` with `queues` queues and return the placement {group: queues}.

        Without `groups`, queue q goes to sorted(all groups)[q % G]; with `groups`, to
        groups[q % len(groups)] in the order given. TOPIC_EXISTS is raised unless
        `exist_ok` (an answer to a retry after an unknown outcome counts as created).
        Then waits up to `wait` seconds until the name servers route every queue
        (0: do not wait).
        """
        validate_topic_name(topic)
        # groups and leaders only: the answer stays small however many topics exist
        cluster = await self.routes.cluster()
        known = sorted(str(g) for g in (cluster.get("groups") or {}))
        if groups is None:
            chosen = known
        else:
            chosen = [validate_group_name(g) for g in groups]
            missing = [g for g in chosen if g not in known]
            if missing:
                raise RequestError(Code.UNKNOWN_GROUP, f"no live group {missing} (known: {known})")
        if not chosen:
            raise RequestError(Code.UNKNOWN_GROUP, "the name servers know no live group")
        placement = place_queues(queues, chosen)
        existed: list[str] = []
        errors: list[RequestError] = []

        async def one(group: str, hosted: list[int]) -> None:
            req = CreateTopicRequest(g=group, topic=topic, queues=queues, hosted=tuple(hosted))
            try:
                if await self._create_in_group(req):
                    existed.append(group)
            except RequestError as exc:  # raised plainly below, not in an ExceptionGroup
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for group, hosted in placement.items():
                tg.start_soon(one, group, hosted)
        if errors:
            raise errors[0]
        if existed and not exist_ok:
            raise RequestError(Code.TOPIC_EXISTS, f"topic {topic!r} already exists in {existed}")
        if wait > 0:
            await self._wait_routed(topic, queues, wait)
        return placement

    async def _create_in_group(self, req: CreateTopicRequest) -> bool:
        """Send CREATE_TOPIC to the group's leader; True if it already existed before.
        Retriable failures are retried for `LEADER_WAIT` seconds, so the request rides
        out an election (a few tries would give up before the group has a new leader)."""
        group = req.g
        uncertain = False
        attempt = 0
        deadline = anyio.current_time() + LEADER_WAIT
        while True:
            try:
                await self.routes.call_group(group, req.OP, req.header(), attempts=1,
                                             write=True)
                return False
            except RequestError as exc:
                if exc.code == Code.TOPIC_EXISTS:
                    if not exc.extra.get("same"):
                        raise  # a different configuration: never "ok", even with exist_ok
                    return not uncertain
                # a timed-out try may have been applied: a later TOPIC_EXISTS is ours,
                # and a later failure says nothing of it (`give_up`)
                uncertain = uncertain or may_have_applied(exc)
                attempt += 1
                if not is_retriable(exc) or anyio.current_time() >= deadline:
                    final = give_up(exc, f"CREATE_TOPIC to group {group}", uncertain=uncertain)
                    if final is exc:
                        raise
                    raise final from exc
                await self.routes.wait_backoff(group, backoff_delay(attempt))

    async def _wait_routed(self, topic: str, total: int, wait: float) -> TopicRoute:
        attempt = 0
        last: Exception | None = None
        with anyio.move_on_after(wait):
            while True:
                try:
                    route = await self.routes.route(topic, refresh=True)
                    if route.total == total and len(route.queues) == total:
                        return route
                except RequestError as exc:
                    if exc.code != Code.UNKNOWN_TOPIC and not is_retriable(exc):
                        raise
                    last = exc
                attempt += 1
                await anyio.sleep(backoff_delay(attempt, base=0.05, cap=0.5))
        raise RequestError(
            Code.TIMEOUT,
            f"topic {topic!r} was created but the name servers do not route all its queues "
            f"after {wait:g} s ({last})",
        )

    @_bounded(write=False)
    async def describe_topic(self, topic: str) -> TopicInfo:
        """The route of a topic with each queue's min and end offset (None when its
        leader cannot be reached)."""
        route = await self.routes.route(topic, refresh=True)
        infos: dict[int, QueueInfo] = {}

        async def one(q: int) -> None:
            qr = route.queues.get(q)
            lo = end = None
            if qr is not None:
                try:
                    lo, end = await queue_bounds(self.routes, topic, q)
                except RequestError:
                    pass
            infos[q] = QueueInfo(
                q, qr.group if qr else None, self.routes.leader(qr.group) if qr else None, lo, end
            )

        async with anyio.create_task_group() as tg:
            for q in range(route.total):
                tg.start_soon(one, q)
        return TopicInfo(topic, route.total, [infos[q] for q in sorted(infos)],
                         dict(route.replicas))

    @_bounded(write=False)
    async def list_topics(self) -> dict[str, dict[str, Any]]:
        """{topic: {"queues": total, "hosted": {group: [queues]}}}, merged from the TOPICS
        answer of every reachable node (fresher than the name servers' registrations)."""
        cluster = await self.routes.cluster()  # node addresses only
        merged: dict[str, dict[str, Any]] = {}

        def merge(name: str, info: dict[str, Any]) -> None:
            t = merged.setdefault(name, {"queues": 0, "hosted": {}})
            t["queues"] = max(t["queues"], int(info.get("queues", 0)))
            for g, qs in (info.get("hosted") or {}).items():
                t["hosted"][g] = sorted(set(t["hosted"].get(g, [])) | set(qs))

        async def one(addr: str) -> None:
            req = TopicsRequest()
            try:
                frame = await self.routes.pool.request(addr, req.OP, req.header(),
                                                       timeout=self.timeout)
                answer = TopicsAnswer.decode(frame.header)
            except RequestError:
                return
            for name, info in answer.topics.items():
                merge(str(name), info)

        async with anyio.create_task_group() as tg:
            for addr in node_addresses(cluster):
                tg.start_soon(one, addr)
        if not merged:  # no node answered: fall back to what the name servers hold
            cluster = await self.routes.cluster(topics=True)
            for gid, g in (cluster.get("groups") or {}).items():
                for name, info in (g.get("topics") or {}).items():
                    hosted = info.get("hosted", [])
                    if isinstance(hosted, list):
                        info = {"queues": info.get("queues", 0), "hosted": {gid: hosted}}
                    merge(str(name), info)
        return dict(sorted(merged.items()))

    @_bounded(write=False)
    async def describe_cluster(self, *, topics: bool = True) -> dict[str, Any]:
        """The CLUSTER answer: nodes (addr, metrics, age) and groups (leader, term,
        replicas, topic_count, commit/applied, members, and with `topics` every topic).
        `topics=False` keeps the answer small when there are many topics."""
        return await self.routes.cluster(topics=topics)

    @_bounded(write=False)
    async def node_status(self, addr: str) -> dict[str, Any]:
        """One node's STATUS answer (`wire.requests.StatusAnswer`'s fields)."""
        req = StatusRequest()
        frame = await self.routes.pool.request(addr, req.OP, req.header(), timeout=self.timeout)
        StatusAnswer.decode(frame.header)  # MALFORMED if it is not one
        return _fields(frame)

    @_bounded(write=False)
    async def consumers(self, group: str) -> list[str]:
        """The consumer group's live clients, pull consumers (manual assignment)
        included: the union over every reachable node."""
        cluster = await self.routes.cluster()
        seen: set[str] = set()

        req = ConsumersRequest(cg=group)

        async def one(addr: str) -> None:
            try:
                frame = await self.routes.pool.request(addr, req.OP, req.header(),
                                                       timeout=self.timeout)
                answer = ConsumersAnswer.decode(frame.header)
            except RequestError:
                return
            seen.update(answer.clients)
            seen.update(answer.manual)

        async with anyio.create_task_group() as tg:
            for addr in node_addresses(cluster):
                tg.start_soon(one, addr)
        return sorted(seen)

    @_bounded(write=False)
    async def committed_offset(self, group: str, topic: str, queue: int) -> int:
        """A consumer group's committed offset of one queue (-1 when none)."""
        return await query_offset(self.routes, group, topic, queue)

    @_bounded(write=False)
    async def get_message(self, msg_id: str) -> Message:
        """The message with id `msg_id` (ids name their group, so one request answers),
        or RequestError NOT_FOUND."""
        group, _index, _start = parse_message_id(msg_id)
        req = GetMessageRequest(msg_id=msg_id)
        frame = await self.routes.call_group(group, req.OP, req.header())
        answer = GetMessageAnswer.decode(frame.header)
        msgs = decode_fetch(answer.topic, answer.queue, group, frame.header, frame.body)
        if len(msgs) != 1:
            raise RequestError(Code.MALFORMED, f"GET_MESSAGE answered {len(msgs)} messages")
        return msgs[0]

    @_bounded(write=False)
    async def query_key(self, topic: str, key: str, *, max_per_group: int = 32) -> list[Message]:
        """The newest messages with `key` in `topic` (RocketMQ's key index), oldest first
        per queue; every group hosting the topic is asked at its leader."""
        route = await self.routes.route(topic)
        found: list[Message] = []
        errors: list[RequestError] = []

        req = QueryKeyRequest(topic=topic, key=key, max=max_per_group)

        async def one(group: str) -> None:
            try:
                frame = await self.routes.call_group(group, req.OP, req.header())
                rows = QueryKeyAnswer.decode(frame.header).msgs
            except RequestError as exc:  # raised plainly below, not in an ExceptionGroup
                errors.append(exc)
                return
            spans = list(iter_records(frame.body))
            for (gid, queue, offset, index, start, store_ms), (pos, _s) in zip(
                    rows, spans, strict=True):
                if gid != group:
                    continue  # another group's answer, if this node leads it too
                msg, _ = decode_record(frame.body, pos, topic=topic, queue=int(queue),
                                       offset=int(offset), store_ms=int(store_ms),
                                       msg_id=message_id(gid, int(index), int(start)))
                found.append(msg)

        async with anyio.create_task_group() as tg:
            for group in route.groups:
                tg.start_soon(one, group)
        if errors:
            raise errors[0]
        return sorted(found, key=lambda m: (m.queue, m.offset))

    @_bounded(write=False)
    async def trace(self, msg_id: str) -> list[TraceRecord]:
        """The life of one traced message (`raftmq.client.trace`): its trace records,
        sent and stored first, then deliveries and acks, each in time order; records a
        retried report wrote twice appear once. [] when nothing traced it. The records
        sit in the message's own group (its id names it), found by the key index; reading
        them needs subscribe on the trace topic."""
        group, _index, _start = parse_message_id(msg_id)
        req = QueryKeyRequest(topic=TRACE_TOPIC, key=msg_id, max=MAX_TRACE_RECORDS)
        try:
            frame = await self.routes.call_group(group, req.OP, req.header())
        except RequestError as exc:
            if exc.code in (Code.UNKNOWN_TOPIC, Code.UNKNOWN_QUEUE):
                return []  # nothing traced in that group yet
            raise
        rows = QueryKeyAnswer.decode(frame.header).msgs
        seen: dict[TraceRecord, None] = {}
        for row, (pos, _s) in zip(rows, iter_records(frame.body), strict=True):
            if row[0] != group:
                continue  # another group's answer, if this node leads it too
            msg, _ = decode_record(frame.body, pos, topic=TRACE_TOPIC, queue=int(row[1]),
                                   offset=int(row[2]), store_ms=int(row[5]), msg_id="")
            if msg.key == msg_id:
                seen.update(dict.fromkeys(decode_steps(msg.body)))
        return sorted(seen, key=TraceRecord.sort_key)

    @_bounded(write=False)
    async def offsets_for_times(
        self, times: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], int]:
        """Kafka's `offsets_for_times`: for each (topic, queue), the first offset whose
        message was stored at or after the time given (epoch ms); the queue's end offset
        when none was, its earliest retained offset when every retained one was. One
        request per queue, to its leader, all at once; the first failure is raised
        (MALFORMED for a negative time, UNKNOWN_TOPIC, UNKNOWN_QUEUE)."""
        for (topic, _queue), ms in times.items():
            validate_topic_name(topic)
            if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
                raise RequestError(Code.MALFORMED, f"{topic}: time must be epoch "
                                   f"milliseconds >= 0, got {ms!r}")
        found: dict[tuple[str, int], int] = {}
        errors: list[RequestError] = []

        async def one(topic: str, queue: int, ms: int) -> None:
            try:
                found[(topic, queue)] = await offset_for_time(self.routes, topic, queue, ms)
            except RequestError as exc:  # raised plainly below, not in an ExceptionGroup
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for (topic, queue), ms in times.items():
                tg.start_soon(one, topic, queue, ms)
        if errors:
            raise errors[0]
        return {tq: found[tq] for tq in times}

    @_bounded(write=False)
    async def messages_stored_between(self, topic: str, start_ms: int, end_ms: int, *,
                                      limit: int = 1000) -> list[Message]:
        """The messages of every queue of `topic` stored at or after `start_ms` and
        before `end_ms` (epoch ms): per queue, the offsets from where it reaches
        `start_ms` to where it reaches `end_ms` (`offsets_for_times`). At most `limit`
        per queue, the first ones; sorted by store time."""
        if not (isinstance(start_ms, int) and isinstance(end_ms, int)) or end_ms < start_ms:
            raise RequestError(Code.MALFORMED, f"the window {start_ms!r}..{end_ms!r} must be "
                               "epoch milliseconds, its end not before its start")
        route = await self.routes.route(topic)
        queues = range(route.total)
        starts = await self.offsets_for_times({(topic, q): start_ms for q in queues})
        ends = await self.offsets_for_times({(topic, q): end_ms for q in queues})
        found: list[Message] = []

        async def one(q: int) -> None:
            offset, stop = starts[(topic, q)], min(ends[(topic, q)],
                                                   starts[(topic, q)] + limit)
            while offset < stop:
                res = await fetch(self.routes, topic, q, offset,
                                  max_messages=min(stop - offset, 1024), wait_ms=0)
                found.extend(m for m in res.messages if m.offset < stop)
                if res.next_offset <= offset:
                    break
                offset = res.next_offset

        async with anyio.create_task_group() as tg:
            for q in queues:
                tg.start_soon(one, q)
        return sorted(found, key=lambda m: (m.store_ms, m.queue, m.offset))

    @_bounded(write=False)
    async def consumer_lag(self, group: str, topic: str) -> dict[int, QueueLag]:
        """Per queue: committed offset, bounds and how many retained messages are left."""
        route = await self.routes.route(topic)
        out: dict[int, QueueLag] = {}
        errors: list[RequestError] = []

        async def one(q: int) -> None:
            try:
                committed = await query_offset(self.routes, group, topic, q)
                lo, end = await queue_bounds(self.routes, topic, q)
            except RequestError as exc:
                errors.append(exc)
                return
            out[q] = QueueLag(q, committed, lo, end, max(0, end - max(committed, lo)))

        async with anyio.create_task_group() as tg:
            for q in range(route.total):
                tg.start_soon(one, q)
        if errors:
            raise errors[0]
        return dict(sorted(out.items()))

    # ------------------------------------------------------------ topic changes

    @_bounded(write=True)
    async def delete_topic(self, topic: str, *, wait: float = 10.0) -> list[str]:
        """Delete `topic` in every group hosting it (its messages become unreachable, its
        consumer offsets and key index go); returns those groups. Waits up to `wait` s
        until the name servers stop routing it."""
        validate_topic_name(topic)
        info = (await self.list_topics()).get(topic)
        if info is None:
            raise RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist")
        groups = sorted(info.get("hosted") or {})
        for group in groups:
            try:
                req = DeleteTopicRequest(g=group, topic=topic, req=self.routes.request_id())
                await self.routes.call_group(group, req.OP, req.header(), write=True)
            except RequestError as exc:
                if exc.code != Code.UNKNOWN_TOPIC:  # gone already: a retried delete
                    raise
        with anyio.move_on_after(wait):
            attempt = 0
            while True:
                try:
                    await self.routes.route(topic, refresh=True)
                except RequestError as exc:
                    if exc.code == Code.UNKNOWN_TOPIC:
                        break
                attempt += 1
                await anyio.sleep(backoff_delay(attempt, base=0.05, cap=0.5))
        return groups

    @_bounded(write=True)
    async def add_queues(self, topic: str, queues: int, *, wait: float = 10.0
                         ) -> dict[str, list[int]]:
        """Grow `topic` to `queues` queues in total; the new ones are placed over every
        group the way `create_topic` places queues. Returns the new queues by group.
        Existing queues keep their messages and offsets; keys hash over the new total
        from now on (as in Kafka, a key's later messages may go to another queue)."""
        validate_topic_name(topic)
        info = (await self.list_topics()).get(topic)
        if info is None:
            raise RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist")
        current = int(info["queues"])
        if queues <= current:
            raise ValueError(f"topic {topic!r} has {current} queues already: queues can only "
                             f"be added (ask for more than {current})")
        cluster = await self.routes.cluster()
        known = sorted(str(g) for g in (cluster.get("groups") or {}))
        if not known:
            raise RequestError(Code.UNKNOWN_GROUP, "the name servers know no live group")
        placement = place_queues(queues, known)
        hosted = {g: set(qs) for g, qs in (info.get("hosted") or {}).items()}
        added: dict[str, list[int]] = {}
        for group, qs in placement.items():
            new = [q for q in qs if q >= current]
            if new:
                added[group] = new
                hosted.setdefault(group, set()).update(new)
        for group, ids in sorted(hosted.items()):
            grow = GrowTopicRequest(g=group, topic=topic, queues=queues,
                                    hosted=tuple(sorted(ids)), req=self.routes.request_id())
            await self.routes.call_group(group, grow.OP, grow.header(), write=True)
        if wait > 0:
            await self._wait_routed(topic, queues, wait)
        return added

    # ------------------------------------------------------------ consumer groups

    @_bounded(write=False)
    async def queue_locks(self, group: str | None = None) -> list[QueueLock]:
        """The queue locks of consumer group `group` (every group's with None) that the
        broker groups' leaders hold: who holds each queue, and until when (orderly
        consumption and rebalances; expired ones too, `live` False)."""
        return await group_locks(self.routes, group)

    @_bounded(write=False)
    async def group_offsets(self, group: str | None = None) -> dict[str, dict[tuple[str, int], int]]:
        """Committed offsets by consumer group: {cg: {(topic, queue): offset}}, from the
        leader of every broker group (one OFFSETS request per node).

        Raises `IncompleteError` when some broker group's offsets could not be read (no
        node answered as its leader): `unreadable` names those groups, `partial` holds
        the offsets of the others, in the shape this returns."""
        if group is not None:
            validate_group_name(group)
        cluster = await self.routes.cluster()
        out: dict[str, dict[tuple[str, int], int]] = {}
        read: set[str] = set()
        failures: list[str] = []

        req = OffsetsRequest(cg=group)

        async def one(addr: str) -> None:
            try:
                frame = await self.routes.pool.request(addr, req.OP, req.header(),
                                                       timeout=self.timeout)
                answer = OffsetsAnswer.decode(frame.header)
            except RequestError as exc:
                failures.append(f"{addr}: {exc.code.name}")
                return
            read.update(answer.led)
            for _gid, cg, topic, queue, offset in answer.rows:
                out.setdefault(cg, {})[(topic, queue)] = offset

        async with anyio.create_task_group() as tg:
            for addr in node_addresses(cluster):
                tg.start_soon(one, addr)
        result = {cg: dict(sorted(v.items())) for cg, v in sorted(out.items())}
        missing = sorted(str(g) for g in (cluster.get("groups") or {}) if str(g) not in read)
        if missing:
            why = f" (unanswered: {', '.join(sorted(failures))})" if failures else ""
            raise IncompleteError(
                f"no leader answered for broker group(s) {', '.join(missing)}: the offsets "
                f"they hold are not included{why}", unreadable=missing, partial=result)
        return result

    @_bounded(write=False)
    async def describe_group(self, group: str) -> tuple[list[str], list[GroupQueue]]:
        """(live members, each queue the group committed on with bounds and lag).

        Raises `IncompleteError` when a broker group's offsets could not be read, or a
        queue's bounds: `unreadable` names them (broker groups such as "g1", queues as
        "topic/queue"), `partial` is the (members, rows) that could be read, where a row
        whose bounds are missing has None for them."""
        members = await self.consumers(group)
        unreadable: list[str] = []
        try:
            offsets = (await self.group_offsets(group)).get(group, {})
        except IncompleteError as exc:
            unreadable += exc.unreadable
            partial = exc.partial
            assert isinstance(partial, dict)
            offsets = partial.get(group, {})
        rows: dict[tuple[str, int], GroupQueue] = {}

        async def one(topic: str, queue: int, committed: int) -> None:
            lo = end = None
            try:
                lo, end = await queue_bounds(self.routes, topic, queue)
            except RequestError:
                unreadable.append(f"{topic}/{queue}")
            rows[(topic, queue)] = GroupQueue(topic, queue, committed, lo, end)

        async with anyio.create_task_group() as tg:
            for (topic, queue), committed in offsets.items():
                tg.start_soon(one, topic, queue, committed)
        described = (members, [rows[k] for k in sorted(rows)])
        if unreadable:
            groups = sorted(u for u in unreadable if "/" not in u)
            queues = sorted(u for u in unreadable if "/" in u)
            parts = ([f"the offsets held by broker group(s) {', '.join(groups)}"] if groups
                     else []) + ([f"the bounds of {', '.join(queues)}"] if queues else [])
            raise IncompleteError(f"could not read {' and '.join(parts)}",
                                  unreadable=groups + queues, partial=described)
        return described

    async def _require_idle(self, group: str) -> None:
        members = await self.consumers(group)
        if members:
            raise RequestError(
                Code.BUSY, f"consumer group {group!r} has {len(members)} live member(s) "
                f"({', '.join(members)}): stop them first")

    @_bounded(write=True)
    async def reset_offsets(
        self, group: str, topic: str, to: str | int, *, dry_run: bool = False,
    ) -> dict[int, tuple[int, int]]:
        """Move `group`'s committed offsets on every queue of `topic` to `to`: "earliest",
        "latest", an offset (kept within each queue's bounds) or `"@<epoch ms>"` (the
        first message stored at or after that time). Only while the
        group has no live members (as Kafka requires). Returns {queue: (old, new)} (old
        is -1 when the group had none); `dry_run` changes nothing."""
        validate_group_name(group)
        route = await self.routes.route(topic)
        await self._require_idle(group)
        plan: dict[int, tuple[int, int]] = {}

        async def one(q: int) -> None:
            old = await query_offset(self.routes, group, topic, q)
            lo, end = await queue_bounds(self.routes, topic, q)
            if to == "earliest":
                new = lo
            elif to == "latest":
                new = end
            elif isinstance(to, int):
                new = min(max(to, lo), end)
            elif isinstance(to, str) and to.startswith("@") and to[1:].isdigit():
                new = await offset_for_time(self.routes, topic, q, int(to[1:]))
            else:
                raise ValueError(f"reset to {to!r}: earliest, latest, an offset or @<epoch ms>")
            plan[q] = (old, new)

        errors: list[Exception] = []

        async def guarded(q: int) -> None:
            try:
                await one(q)
            except (RequestError, ValueError) as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for q in range(route.total):
                tg.start_soon(guarded, q)
        if errors:
            raise errors[0]
        plan = dict(sorted(plan.items()))
        if not dry_run:
            await self._require_idle(group)  # nobody joined while we looked
            await commit_offsets(self.routes, group, {(topic, q): new
                                                      for q, (_old, new) in plan.items()})
        return plan

    @_bounded(write=True)
    async def delete_group(self, group: str) -> int:
        """Forget every offset `group` committed, in every broker group; only while it has
        no live members. Returns how many offsets were deleted."""
        validate_group_name(group)
        await self._require_idle(group)
        cluster = await self.routes.cluster()
        deleted = 0
        for gid in sorted(str(g) for g in (cluster.get("groups") or {})):
            req = DeleteGroupRequest(g=gid, cg=group, req=self.routes.request_id())
            frame = await self.routes.call_group(gid, req.OP, req.header(), write=True)
            deleted += DeleteGroupAnswer.decode(frame.header).deleted
        return deleted

    # ------------------------------------------------------------ dead letters

    @_bounded(write=False)
    async def dlq_list(self, group: str, *, limit: int = 1000) -> list[DeadLetter]:
        """The dead letters of simple consumer group `group` (`%DLQ%<group>`), from the
        leader of every broker group, by broker group and id; at most `limit` per broker
        group. `IncompleteError` when some broker group's leader did not answer
        (`partial`: the others')."""
        validate_group_name(group)
        cluster = await self.routes.cluster()
        out: list[DeadLetter] = []
        read: set[str] = set()
        failures: list[str] = []
        req = DlqRequest(action="list", cg=group, limit=limit)

        async def one(addr: str) -> None:
            try:
                frame = await self.routes.pool.request(addr, req.OP, req.header(),
                                                       timeout=self.timeout)
                answer = DlqAnswer.decode(frame.header)
            except RequestError as exc:
                failures.append(f"{addr}: {exc.code.name}")
                return
            fresh = set(answer.led) - read
            read.update(fresh)
            out.extend(_dead_letter(group, row) for row in answer.rows if row[0] in fresh)

        async with anyio.create_task_group() as tg:
            for addr in node_addresses(cluster):
                tg.start_soon(one, addr)
        out.sort(key=lambda d: (d.group, dead_letter_id(d.id)[1]))
        missing = sorted(str(g) for g in (cluster.get("groups") or {}) if str(g) not in read)
        if missing:
            why = f" (unanswered: {', '.join(sorted(failures))})" if failures else ""
            raise IncompleteError(
                f"no leader answered for broker group(s) {', '.join(missing)}: their dead "
                f"letters are not included{why}", unreadable=missing, partial=out)
        return out

    @_bounded(write=False)
    async def dlq_show(self, group: str, id: str) -> DeadLetter:
        """One dead letter of `group` with its message; NOT_FOUND when it is not held
        (never was, or resent, purged, or gone with retention)."""
        validate_group_name(group)
        g, n = dead_letter_id(id)
        req = DlqRequest(action="show", cg=group, g=g, ids=(n,))
        frame = await self.routes.call_group(g, req.OP, req.header())
        answer = DlqAnswer.decode(frame.header)
        if not answer.rows:
            raise RequestError(Code.NOT_FOUND, f"no dead letter {id} of {group!r}")
        row = answer.rows[0]
        msg, _ = decode_record(frame.body, 0, topic=str(row[2]), queue=int(row[3]),
                               offset=int(row[4]), store_ms=int(row[7]),
                               msg_id=message_id(g, int(row[5]), int(row[6])))
        return _dead_letter(group, row, msg)

    @_bounded(write=True)
    async def dlq_resend(self, group: str, ids: Sequence[str] | str) -> int:
        """Put dead letters of `group` (their ids, or "all") back into their source queues
        as new messages: the group's simple consumers receive them again, and so does
        every other consumer group of the topic. Returns how many were resent (ids no
        longer held are skipped)."""
        return await self._dlq_change("resend", group, ids)

    @_bounded(write=True)
    async def dlq_purge(self, group: str, ids: Sequence[str] | str) -> int:
        """Drop dead letters of `group` (their ids, or "all"); returns how many."""
        return await self._dlq_change("purge", group, ids)

    async def _dlq_change(self, action: str, group: str, ids: Sequence[str] | str) -> int:
        validate_group_name(group)
        if ids == "all":
            chosen = [d.id for d in await self.dlq_list(group, limit=10_000)]
        elif isinstance(ids, str):
            raise ValueError('ids is a list of dead-letter ids, or "all"')
        else:
            chosen = list(ids)
        by_group: dict[str, list[int]] = {}
        for did in chosen:
            g, n = dead_letter_id(did)
            by_group.setdefault(g, []).append(n)
        done = 0
        for g, ns in sorted(by_group.items()):
            for i in range(0, len(ns), 1024):
                req = DlqRequest(action=action, cg=group, g=g, ids=tuple(ns[i:i + 1024]),
                                 req=self.routes.request_id())
                frame = await self.routes.call_group(g, req.OP, req.header(), write=True)
                done += DlqAnswer.decode(frame.header).done
        return done

    # ------------------------------------------------------------ transactions

    @_bounded(write=False)
    async def tx_list(self, id: str | None = None, *, group: str | None = None,
                      limit: int = 1000) -> TxListing:
        """What the cluster knows of transactions, from the leader of every group (one
        TX_LIST per node): `halves` (half messages waiting for a decision), `txns`
        (transactions the coordinators hold, not finished or recently finished),
        `prepared` (Kafka-style transactions' data each participant holds undecided:
        what keeps retention from passing it), `decided` (the latest decisions of each
        participant, newest first) and `done`
        (the coordinators' latest finished transactions). `id` keeps only the rows of
        one transactional id or half message txid; `group` one broker group.

        Raises `IncompleteError` when some group's leader did not answer, even asked
        again over a few rounds (a leader may be moving); `partial` is what the others
        said."""
        if group is not None:
            validate_group_name(group)
        if limit < 1:
            raise ValueError("limit is at least 1")
        cluster = await self.routes.cluster()
        out = TxListing({k: [] for k in TX_LISTS})
        read: set[str] = set()
        failures: list[str] = []
        req = TxListRequest(g=group, tx=id or "", limit=limit)

        async def one(addr: str) -> None:
            try:
                frame = await self.routes.pool.request(addr, req.OP, req.header(),
                                                       timeout=self.timeout)
                answer = TxListAnswer.decode(frame.header)
            except RequestError as exc:
                failures.append(f"{addr}: {exc.code.name}")
                return
            fresh = set(answer.led) - read  # each group's rows once
            read.update(fresh)
            if fresh and answer.truncated:
                out.truncated = True
            for key in TX_LISTS:
                out[key] += [dict(row) for row in getattr(answer, key)
                             if str(row.get("g")) in fresh]

        wanted = [str(g) for g in (cluster.get("groups") or {})
                  if group is None or str(g) == group]
        for attempt in range(1, TX_LIST_ROUNDS + 1):  # a leader may be moving: ask again
            failures.clear()
            async with anyio.create_task_group() as tg:
                for addr in node_addresses(cluster):
                    tg.start_soon(one, addr)
            if all(g in read for g in wanted) or attempt == TX_LIST_ROUNDS:
                break
            await anyio.sleep(backoff_delay(attempt, base=0.2))
        out["halves"].sort(key=lambda r: (r.get("prepared_ms", 0), str(r.get("txid"))))
        out["prepared"].sort(key=lambda r: (str(r.get("g")), str(r.get("tid")),
                                            r.get("epoch", 0), r.get("n", 0)))
        out["txns"].sort(key=lambda r: (str(r.get("tid")), r.get("epoch", 0), r.get("n", 0)))
        out["decided"].sort(key=lambda r: (str(r.get("g")), -int(r.get("index") or 0)))
        out["done"].sort(key=lambda r: (str(r.get("tid")), -int(r.get("epoch") or 0),
                                        -int(r.get("n") or 0)))
        missing = sorted(g for g in wanted if g not in read)
        if missing:
            why = f" (unanswered: {', '.join(sorted(failures))})" if failures else ""
            raise IncompleteError(
                f"no leader answered for broker group(s) {', '.join(missing)}: their "
                f"transactions are not included{why}", unreadable=missing, partial=out)
        return out

    @_bounded(write=False)
    async def tx_show(self, id: str) -> dict[str, list[dict[str, Any]]]:
        """Every row `tx_list` has about one transactional id or half message txid;
        TX_UNKNOWN when no group knows it (never seen, or forgotten long ago)."""
        if not isinstance(id, str) or not id:
            raise ValueError("a transactional id or txid is a non-empty string")
        listed = await self.tx_list(id)
        rows = {k: [r for r in v if id in (r.get("txid"), r.get("tid"), r.get("id"))]
                for k, v in listed.items()}
        if not any(rows.values()):
            raise TransactionError(Code.TX_UNKNOWN, f"no group knows a transaction {id!r} "
                                   "(never seen, or decided long ago and forgotten)")
        return rows

    @_bounded(write=True)
    async def tx_commit(self, txid: str) -> bool:
        """Deliver a half message no producer decided (the operator's decision).
        True if it was committed already; TX_DECIDED if rolled back, TX_UNKNOWN if no
        group knows it."""
        return await self._end_half(txid, True)

    @_bounded(write=True)
    async def tx_rollback(self, txid: str) -> bool:
        """Drop a half message no producer decided. True if it was rolled back already;
        TX_DECIDED if it was committed, TX_UNKNOWN if no group knows it."""
        return await self._end_half(txid, False)

    async def _end_half(self, txid: str, commit: bool) -> bool:
        rows = await self.tx_show(txid)
        groups = sorted({str(r["g"]) for r in rows["halves"] if r.get("txid") == txid}
                        | {str(r["g"]) for r in rows["decided"]
                           if r.get("kind") == "half" and r.get("id") == txid})
        if not groups:
            raise TransactionError(Code.TX_UNKNOWN, f"{txid!r} is not a half message "
                                   "(a transactional id? those are decided by their producer "
                                   "or their timeout)")
        req = HalfEndRequest(g=groups[0], txid=txid, commit=commit, pg="", source="operator")
        frame = await self.routes.call_group(groups[0], req.OP, req.header(), write=True)
        return HalfEndAnswer.decode(frame.header).dup

    async def transfer_leader(self, group: str, to: int, *, prefer: bool = True) -> None:
        """Move `group`'s leadership to node `to`, a voter of it. With `prefer` (the
        default) `to` becomes the group's preferred leader, through the log, so the move
        sticks; without, leadership returns to the preferred leader once it has caught up.
        UNKNOWN_GROUP or NOT_A_MEMBER (not a voter) when it cannot be done."""
        await membership.transfer_leader(self.routes, group, to, prefer=prefer)

    async def group_members(self, group: str, *,
                            wait: float = membership.LEADER_WAIT) -> GroupMembers:
        """`group`'s voters, learners, leader, preferred leader and each member's lag,
        from its leader; waits up to `wait` seconds for the group to have one."""
        return await membership.group_members(self.routes, group, wait=wait)

    async def add_replica(self, group: str, node: int, *,
                          catch_up_timeout: float = membership.CATCH_UP_TIMEOUT) -> GroupMembers:
        """Give `node` a replica of `group`: it hosts an empty one, catches up as a
        learner, then becomes a voter (see `raftmq.client.membership`)."""
        return await membership.add_replica(self.routes, group, node,
                                            catch_up_timeout=catch_up_timeout)

    async def remove_replica(self, group: str, node: int) -> GroupMembers:
        """Take `node`'s replica out of `group` and have the node delete it. Refused
        (MEMBERSHIP_REFUSED) for the leader, or when the voters left would have no
        reachable majority."""
        return await membership.remove_replica(self.routes, group, node)

    async def replace_replica(self, group: str, old: int, new: int, *,
                              catch_up_timeout: float = membership.CATCH_UP_TIMEOUT
                              ) -> GroupMembers:
        """Replace `old`'s replica of `group` by one on `new` (add, catch up, promote,
        remove); `new == old` re-creates the replica of a node whose disk was replaced."""
        return await membership.replace_replica(self.routes, group, old, new,
                                                catch_up_timeout=catch_up_timeout)


def _fields(frame: Frame) -> dict[str, Any]:
    return {k: v for k, v in frame.header.items() if k not in ("id", "code")}
