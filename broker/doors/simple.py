"""The simple consumer's requests: RECEIVE, ACK, NACK, CHANGE_INVISIBLE and DLQ.

Per-message consumption is replicated state (`broker.state.parts.receipts`): every
receive, ack and nack is a record in the queue's group's log, so a failover loses no
delivery count and never hands a message in flight to a second consumer. What a receive
hands out is chosen where the record is applied, the same on every replica; the door
learns it from the result, reads the records as FETCH does (`ReadDoor.records`) and
answers them with their delivery counts and handles.

RECEIVE is answered by the queue's leader. Before it proposes a receive, the leader reads
the new messages it may hand out (their properties, through the read cache): which carry
a message group (`wire.records.MESSAGE_GROUP_PROPERTY`) and which the receiver's filter
(`tags`, `sql`, compiled once per request as FETCH does) leaves out. The record carries
those facts up to where it read, so the part can hold a message group's next message while
one is in flight, and pass filtered-out messages for the consumer group for good, the same
on every replica. A receive that passed filtered-out messages and found nothing answers at
once, as a filtered FETCH does, so one request reads a bounded share of the queue.

 While the leader's applied state has nothing
for the group (no new message, none in flight visible again), it holds the request (a
long poll, woken by the next apply or by the moment the first message in flight becomes
visible) before it proposes anything, so an idle consumer writes nothing to the log. The
leader's clock goes into each record; the part never lets time go back.

ACK carries the receipts of one queue, one record however many; a retried ACK or NACK
carries a request id and is applied once. A stale receipt (its message delivered again,
acked or dead-lettered since) is skipped and named in the answer. CHANGE_INVISIBLE of a
stale one is refused STALE_RECEIPT.

DLQ: `list` answers the dead letters of a consumer group held by the groups this node
leads (after a barrier each, as OFFSETS does); `show`, `resend` and `purge` go to the
leader of the group holding the ids.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import trio

from broker.doors.base import MAX_WAIT_MS, Handler, QueueHosts, Response, check_queue
from broker.doors.reads import filter_scan
from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead, checked
from broker.state.consumequeue import CQEntry
from broker.state.parts.base import ControlResult
from broker.state.parts.deadletters import PurgeDead, ResendDead
from broker.state.parts.receipts import (
    DEFAULT_BACKOFF_MS,
    MAX_SCAN,
    Ack,
    ChangeInvisible,
    Delivery,
    Nack,
    Receive,
    SendBack,
)
from broker.state.statemachine import BrokerState
from raftlog.runtime import GroupRuntime, NotLeader
from raftmq.filter import FilterError, Predicate
from raftmq.filter import compile as compile_filter
from transport.framing import Caller
from wire.protocol import Code, Op, RequestError, ok_header
from wire.records import MESSAGE_GROUP_PROPERTY, message_group_problem, tag_hash
from wire.requests import (
    AckAnswer,
    AckRequest,
    ChangeInvisibleAnswer,
    ChangeInvisibleRequest,
    DlqAnswer,
    DlqRequest,
    NackAnswer,
    NackRequest,
    ReceiveAnswer,
    ReceiveRequest,
    SendBackAnswer,
    SendBackRequest,
)

__all__ = ["MAX_DLQ_ROWS", "RecordReader", "SimpleDoor", "now_ms"]

MAX_DLQ_ROWS = 10_000  # dead letters one DLQ list answers per group at most


def now_ms() -> int:
    """The leader's clock, as the receipts' records carry it."""
    return int(time.time() * 1000)


class RecordReader(Protocol):
    """How the door reads the records it hands out (`broker.doors.reads.ReadDoor`)."""

    async def records(self, g: GroupRuntime, found: list[CQEntry]
                      ) -> tuple[list[tuple[int, int, int, int]], bytes]: ...

    async def properties(self, g: GroupRuntime, found: list[CQEntry]
                         ) -> list[tuple[str, dict[str, str]]]: ...


class Selector:
    """What one receive's filter keeps: a tag among `tags` (exactly) and a SQL92 match."""

    def __init__(self, tags: tuple[str, ...], sql: str | None) -> None:
        self.tags = frozenset(tags)
        self.hashes = {tag_hash(t) for t in tags}
        self.predicate: Predicate | None = None
        if sql is not None:
            try:  # strict: text after the expression is a mistake, not ignored
                self.predicate = compile_filter(sql, strict=True)
            except FilterError as exc:
                raise RequestError(Code.MALFORMED, f"bad SQL92 filter: {exc}") from None

    @property
    def filters(self) -> bool:
        return bool(self.tags) or self.predicate is not None

    def keeps(self, tag: str, props: dict[str, str]) -> bool:
        return ((not self.tags or tag in self.tags)
                and (self.predicate is None or self.predicate(props)))


class SimpleDoor:
    """The simple consumer requests of one node."""

    def __init__(self, lead: GroupLead, groups: GroupRegistry, hosts: QueueHosts,
                 reader: RecordReader) -> None:
        self.lead = lead
        self.groups = groups
        self.hosts = hosts
        self.reader = reader

    def handlers(self) -> dict[int, Handler]:
        return {
            Op.RECEIVE: self._receive,
            Op.ACK: self._ack,
            Op.NACK: self._nack,
            Op.CHANGE_INVISIBLE: self._change_invisible,
            Op.DLQ: self._dlq,
            Op.SEND_BACK: self._send_back,
        }

    # ------------------------------------------------------------------ receive

    async def _receive(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = ReceiveRequest.decode(h)
        topic, queue, cg = req.topic, check_queue(req.queue), req.cg

        def record(now: int, facts: tuple[int | None, tuple[tuple[int, str], ...],
                                          tuple[int, ...]] = (None, (), ())) -> Receive:
            # bad bounds: the code apply would answer
            return checked(Receive, cg, topic, queue, now, req.invisible_ms, req.max,
                           req.client, req.max_deliveries, req.cap, req.retries, *facts)

        record(now_ms())
        selector = Selector(req.tags, req.sql)
        wait_ms = min(max(req.wait_ms, 0), MAX_WAIT_MS)
        g = await self.hosts.led_group(topic, queue, req.g)
        deadline = trio.current_time() + wait_ms / 1000
        dead = 0
        while True:
            receipts = self.lead.leading(g).receipts
            now = now_ms()
            if receipts.available(cg, topic, queue, now, req.cap, req.retries):
                facts = (None, (), ()) if req.retries else await self._scan(
                    g, self.lead.leading(g), cg, topic, queue, req.max, req.cap, selector)
                before = receipts.next_offset(cg, topic, queue)
                result = await self.lead.propose(g, record(now, facts))
                dead += result.skipped
                if result.items:
                    return await self._answer(g, result, dead)
                receipts = self.lead.leading(g).receipts
                if selector.filters and receipts.next_offset(cg, topic, queue) > before:
                    # passed a bounded share of filtered-out messages: answer now
                    answer = ReceiveAnswer(g=g.group_id, msgs=(), dead=dead)
                    return ok_header(0, **answer.header()), b""
                continue  # burials or held messages only: look again
            wake = deadline
            visible = receipts.next_visible_ms(cg, topic, queue)
            if visible is not None:
                wake = min(wake, trio.current_time() + max(visible - now, 1) / 1000)
            if trio.current_time() >= deadline:
                answer = ReceiveAnswer(g=g.group_id, msgs=(), dead=dead)
                return ok_header(0, **answer.header()), b""
            with trio.move_on_at(wake):
                await g.wait_applied_change()

    async def _scan(self, g: GroupRuntime, state: BrokerState, cg: str, topic: str,
                    queue: int, want: int, cap: int, selector: Selector
                    ) -> tuple[int, tuple[tuple[int, str], ...], tuple[int, ...]]:
        """Read the new messages a receive may hand out, from the group's `next`: (upto,
        their message groups, the offsets the filter leaves out), as far as the receive
        can use them: until it would hand out `want` (a message of a group already in
        flight or held waits and counts as none), the group's room under `cap` is used,
        or, with a filter, `filter_scan(want)` messages were looked at."""
        receipts = state.receipts
        lo, end = state.queue_range(topic, queue)
        start = max(receipts.next_offset(cg, topic, queue), lo)
        room = receipts.room(cg, topic, queue, cap)
        stop = min(end, start + min(filter_scan(want) if selector.filters else room, MAX_SCAN))
        blocked = receipts.blocked_groups(cg, topic, queue)
        groups: list[tuple[int, str]] = []
        skip: list[int] = []
        pos = start
        handed = 0
        try:
            while pos < stop and handed < want and room > 0:
                found, _nxt = state.lookup(topic, queue, pos, min(stop - pos, 256), 1 << 30)
                if not found:
                    break
                facts = await self.reader.properties(g, found)
                for e, (tag, props) in zip(found, facts, strict=True):
                    if handed >= want or room <= 0:
                        break
                    pos = e.offset + 1
                    if ((selector.hashes and e.tag_hash not in selector.hashes)
                            or not selector.keeps(tag, props)):
                        skip.append(e.offset)
                        continue
                    room -= 1
                    grp = props.get(MESSAGE_GROUP_PROPERTY)
                    if grp is None or message_group_problem(grp) is not None:
                        handed += 1
                        continue
                    groups.append((e.offset, grp))
                    if grp not in blocked:
                        handed += 1
                        blocked.add(grp)
        except RequestError as exc:  # retention is removing what the scan reached
            if exc.code != Code.OFFSET_TOO_SMALL:
                raise
            if pos == start:
                raise RequestError(Code.BUSY, f"{topic}/{queue}: the messages from offset "
                                   f"{pos} are being removed by retention; retry") from None
            # what was read so far goes in the record
        return pos, tuple(groups), tuple(skip)

    async def _answer(self, g: GroupRuntime, result: ControlResult, dead: int) -> Response:
        chosen: list[Delivery] = list(result.items)
        found = [CQEntry(d.offset, d.index, d.start, d.size, d.tag_hash, d.store_ms)
                 for d in chosen]
        rows, body = await self.reader.records(g, found)
        msgs = tuple((*row, d.deliveries, d.handle) for row, d in zip(rows, chosen, strict=True))
        answer = ReceiveAnswer(g=g.group_id, msgs=msgs, dead=dead)
        return ok_header(0, **answer.header()), body

    # ------------------------------------------------------------------ ack, nack

    async def _ack(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = AckRequest.decode(h)
        queue = check_queue(req.queue)
        rec = checked(Ack, req.cg, req.topic, queue, req.items)
        g = await self.hosts.led_group(req.topic, queue, req.g, confirm=False)  # a write
        result = await self.lead.propose(g, rec, req.req)
        answer = AckAnswer(acked=result.applied, stale=result.items, skipped=result.skipped,
                           dup=result.dup)
        return ok_header(0, **answer.header()), b""

    async def _nack(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = NackRequest.decode(h)
        queue = check_queue(req.queue)
        rec = checked(Nack, req.cg, req.topic, queue, req.items, now_ms(), req.delay_ms,
                      req.backoff_ms or DEFAULT_BACKOFF_MS, req.max_deliveries, req.error,
                      req.dead)
        g = await self.hosts.led_group(req.topic, queue, req.g, confirm=False)
        result = await self.lead.propose(g, rec, req.req)
        answer = NackAnswer(
            nacked=result.applied, skipped=result.skipped, dup=result.dup,
            dead=tuple(it[1] for it in result.items if it[0] == "dead"),
            stale=tuple((it[1], it[2]) for it in result.items if it[0] == "stale"))
        return ok_header(0, **answer.header()), b""

    async def _send_back(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = SendBackRequest.decode(h)
        queue = check_queue(req.queue)
        rec = checked(SendBack, req.cg, req.topic, queue, req.offset, now_ms(),
                      req.backoff_ms or DEFAULT_BACKOFF_MS, req.max_deliveries, req.error,
                      req.dead)
        g = await self.hosts.led_group(req.topic, queue, req.g, confirm=False)  # a write
        result = await self.lead.propose(g, rec, req.req)
        answer = SendBackAnswer(parked=bool(result.applied), dup=result.dup,
                                dead=any(it[0] == "dead" for it in result.items))
        return ok_header(0, **answer.header()), b""

    async def _change_invisible(self, _caller: Caller, h: dict[str, Any],
                                _body: bytes) -> Response:
        req = ChangeInvisibleRequest.decode(h)
        queue = check_queue(req.queue)
        rec = checked(ChangeInvisible, req.cg, req.topic, queue, req.offset, req.handle,
                      now_ms(), req.invisible_ms)
        g = await self.hosts.led_group(req.topic, queue, req.g, confirm=False)
        result = await self.lead.propose(g, rec)
        answer = ChangeInvisibleAnswer(visible_ms=result.items[0])
        return ok_header(0, **answer.header()), b""

    # ------------------------------------------------------------------ dead letters

    async def _dlq(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = DlqRequest.decode(h)
        if req.action == "list":
            return await self._dlq_list(req)
        if req.g is None:
            raise RequestError(Code.MALFORMED, f"missing field 'g': DLQ {req.action} goes to "
                               "the group holding the dead letters")
        g = self.lead.group(req.g)
        if req.action == "show":
            return await self._dlq_show(g, req)
        kind = ResendDead if req.action == "resend" else PurgeDead
        rec = checked(kind, req.cg, req.ids)
        self.lead.leading(g)
        result = await self.lead.propose(g, rec, req.req)
        offsets = result.items if req.action == "resend" else ()
        answer = DlqAnswer(done=result.applied, offsets=offsets, dup=result.dup)
        return ok_header(0, **answer.header()), b""

    async def _dlq_list(self, req: DlqRequest) -> Response:
        limit = min(max(req.limit, 1), MAX_DLQ_ROWS)
        rows: list[tuple[Any, ...]] = []
        led: list[str] = []
        for gid, g in list(self.groups.items()):
            if not g.is_leader or (req.g is not None and gid != req.g):
                continue
            try:
                await g.read_barrier()
            except NotLeader:
                continue
            led.append(gid)
            state = self.groups.states[gid]
            for n, (_cg, did, d) in enumerate(state.deadletters.of(req.cg)):
                if n >= limit:
                    break
                rows.append(_row(gid, did, d))
        return ok_header(0, **DlqAnswer(rows=tuple(rows), led=tuple(led)).header()), b""

    async def _dlq_show(self, g: GroupRuntime, req: DlqRequest) -> Response:
        if not 0 < len(req.ids) <= 1024:
            raise RequestError(Code.MALFORMED, "ids must name 1-1024 dead letters")
        self.lead.leading(g)
        await self.lead.read_barrier(g)
        state = self.lead.leading(g)
        held = [(did, d) for did in req.ids
                if (d := state.deadletters.get(req.cg, did)) is not None]
        found = [CQEntry(d.offset, d.index, d.start, d.size, d.tag_hash, d.store_ms)
                 for _did, d in held]
        _rows, body = await self.reader.records(g, found)
        answer = DlqAnswer(rows=tuple(_row(g.group_id, did, d) for did, d in held))
        return ok_header(0, **answer.header()), body


def _row(gid: str, did: int, d: Any) -> tuple[Any, ...]:
    return (gid, did, d.topic, d.queue, d.offset, d.index, d.start, d.store_ms, d.deliveries,
            d.error, d.dead_ms)
