"""The broker's request handlers: what a node answers to clients.

Every handler validates its request fully before touching a Raft group, so bad input gets
a precise error and never reaches the log. Writes (produce, topic config, consumer
offsets) are proposed to the group's leader and answered only once applied, i.e.
committed — fsynced on a majority. Reads are served by the leader from its applied state
and its own CommitLog, as the stored bytes, with long polling for consumers at the end of
a queue.

A stored entry that fails its CRCs is never served: the read answers BUSY (retriable)
and the group refetches the entry from a peer (`GroupRuntime.report_corrupt`). Peers
ask for such entries with READ_RAW, answered from this node's CommitLog whatever its
role, and served while the node repairs entries of its own, to peers only: the caller
must have proved it is a node of the cluster (`transport.peerauth`), and a client asking
gets FORBIDDEN.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import trio

from broker.config import NodeConfig
from broker.doors.consumers import ConsumerRegistry
from broker.doors.refusals import refusal
from broker.doors.transactions import TxService
from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead
from broker.runtime.metrics import NodeMetrics
from broker.state.statemachine import (
    MAX_QUEUES,
    BatchOutcomes,
    BrokerState,
    ControlResult,
    ErrorResult,
    ProduceResult,
    control_create_topic,
    control_delete_group,
    control_delete_topic,
    control_grow_topic,
    control_offsets,
    control_prefer_leader,
)
from raftlog.commitlog import CommitLogError, CorruptEntry
from raftlog.runtime import (
    GroupRuntime,
    NotLeader,
    ProposalDropped,
    ProposalLost,
)
from raftlog.types import Entry, EntryType
from transport.framing import Caller
from wire.produce import encode_error, encode_ok, split_batches
from wire.protocol import (
    Code,
    Frame,
    Op,
    RequestError,
    header_field,
    is_int,
    ok_header,
    request_id_field,
    validate_group_name,
    validate_topic_name,
)
from wire.records import (
    STORED_PREFIX,
    BatchHeader,
    RecordRef,
    WalkedEntry,
    parse_message_id,
    tag_hash,
    walk_batch,
    walk_entry,
)
from wire.requests import (
    CommitOffsetAnswer,
    CommitOffsetRequest,
    FetchRequest,
    QueryOffsetAnswer,
    QueryOffsetRequest,
)

__all__ = ["CRASH_BEFORE_ANSWER_EXIT", "BrokerService"]

log = logging.getLogger("raftmq.service")

Response = tuple[dict[str, Any], bytes]
#: A per-op handler: the connection's caller (who asks: a client, or a node that proved
#: itself), the request's header and body.
Handler = Callable[[Caller, dict[str, Any], bytes], Awaitable[Response]]

MAX_FETCH_COUNT = 1024
MAX_FETCH_BYTES = 8 << 20
#: A READ_RAW answer holds entries up to this size (and always its first entry), well
#: under the client frame limit.
READ_RAW_MAX_BYTES = 4 << 20
MAX_WAIT_MS = 60_000
DEFAULT_WAIT_MS = 15_000  # RocketMQ's long-poll hold
READ_CACHE_BYTES = 32 << 20  # recently read committed entries kept for the next fetches
CRASH_BEFORE_ANSWER_EXIT = 70  # exit code of the `crash-before-answer` test mutation
# the requests that change replicated state: `crash-before-answer` applies to each
_WRITES = frozenset({
    Op.PRODUCE, Op.COMMIT_OFFSET, Op.CREATE_TOPIC, Op.DELETE_TOPIC, Op.GROW_TOPIC,
    Op.DELETE_GROUP, Op.TX_INIT, Op.TX_ADD, Op.TX_OFFSETS, Op.TX_END, Op.TX_MARKER,
    Op.HALF_END,
})


#: Requests only a node proven by the peer handshake may make: raw entries bypass the
#: consumer's view, Raft traffic belongs on the peer link (never a request), and a
#: transaction marker is the coordinator's decision, never a client's.
_PEER_ONLY = frozenset({int(Op.READ_RAW), int(Op.RAFT), int(Op.TX_MARKER)})
_UNKNOWN = frozenset({Code.UNKNOWN_TOPIC, Code.UNKNOWN_QUEUE})  # confirmed before refused


def _check_queue(q: int) -> int:
    if not 0 <= q < MAX_QUEUES:
        raise RequestError(Code.UNKNOWN_QUEUE, f"queue {q} is out of range")
    return q


def _queue_id(h: dict[str, Any]) -> int:
    return _check_queue(header_field(h, "queue", int))


def _topic(h: dict[str, Any]) -> str:
    """The "topic" field: MALFORMED when missing or not a string, INVALID_NAME if bad."""
    return validate_topic_name(header_field(h, "topic", str))


def _cg(h: dict[str, Any]) -> str:
    """The consumer group field "cg", checked like `_topic`."""
    return validate_group_name(header_field(h, "cg", str))


class BrokerHost(Protocol):
    """What the service uses of the node that hosts it (`broker.node.Node` is one) beside
    its groups: its config and metrics, and a few hooks. The service imports nothing of
    the node; the node builds the service."""

    config: NodeConfig
    metrics: NodeMetrics
    # the deliberate test mutations the service carries out (see `broker.config`)
    ack_before_commit: bool
    commit_before_durable_prepare: bool
    skip_read_barrier: bool
    crash_before_answer: bool
    duplicate_every: int
    batches_led: int

    def spawn(self, work: Awaitable[Any]) -> None: ...

    def topics_changed(self) -> None: ...

    def reachable_peers(self) -> list[int]: ...

    def peer_addr(self, node: int | None) -> str | None: ...

    def preferred_leader(self, gid: str) -> int | None: ...

    async def host_group(self, gid: str, voters: tuple[int, ...]) -> bool: ...

    async def drop_group(self, gid: str) -> bool: ...

    def status(self, caller: Caller | None = None) -> dict[str, Any]: ...


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception in `group` that is not itself a group."""
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


class BrokerService:
    """Dispatches client requests for one node."""

    def __init__(self, groups: GroupRegistry, node: BrokerHost) -> None:
        self.groups = groups
        self.node = node
        self.consumers = ConsumerRegistry()
        self._member_waits: dict[str, trio.Event] = {}  # cg -> set when its members change
        self._read_cache: OrderedDict[tuple[str, int], bytes | memoryview] = OrderedDict()
        self._read_cached = 0  # bytes held by _read_cache
        self._handlers: dict[int, Handler] = {
            Op.PRODUCE: self._produce,
            Op.FETCH: self._fetch,
            Op.COMMIT_OFFSET: self._commit_offset,
            Op.QUERY_OFFSET: self._query_offset,
            Op.CREATE_TOPIC: self._create_topic,
            Op.TOPICS: self._topics,
            Op.STATUS: self._status,
            Op.GET_MESSAGE: self._get_message,
            Op.QUERY_KEY: self._query_key,
            Op.TRANSFER_LEADER: self._transfer_leader,
            Op.DELETE_TOPIC: self._delete_topic,
            Op.GROW_TOPIC: self._grow_topic,
            Op.OFFSETS: self._offsets,
            Op.DELETE_GROUP: self._delete_group,
            Op.HEARTBEAT: self._heartbeat,
            Op.CONSUMERS: self._consumers_of,
            Op.READ_RAW: self._read_raw,
            Op.MEMBERSHIP: self._membership,
            Op.HOST_GROUP: self._host_group,
            Op.DROP_GROUP: self._drop_group,
        }
        self.lead = GroupLead(groups, lambda gid: any(gc.id == gid for gc in node.config.groups),
                              lambda: node.skip_read_barrier)
        self.tx = TxService(self)
        self._handlers.update(self.tx.handlers())

    async def handle(self, caller: Caller, frame: Frame) -> Response | None:
        h = frame.header
        op = h.get("op")
        rid = h.get("id", 0)
        if isinstance(op, int) and op in _PEER_ONLY and not caller.is_peer:
            raise RequestError(Code.FORBIDDEN, f"{Op(op).name} is served to the nodes of the "
                               "cluster only, on a connection opened with the peer handshake")
        handler = self._handlers.get(op) if isinstance(op, int) else None
        if handler is None:
            raise RequestError(Code.UNKNOWN_OP, f"unknown request type {op!r}")
        try:
            header, body = await handler(caller, h, frame.body)
            if self.node.crash_before_answer and op in _WRITES and h.get("test_exit") is True:
                # Deliberately wrong (tests only, on request): die between the commit and
                # the answer, so the client must retry a write that is already committed.
                log.critical("crash-before-answer: exiting before answering %s", Op(op).name)
                os._exit(CRASH_BEFORE_ANSWER_EXIT)
        except (NotLeader, ProposalDropped, ProposalLost) as exc:
            raise refusal(exc, self.groups.peer_addr) from None
        header["id"] = rid
        return header, body

    # ------------------------------------------------------------------ helpers

    async def _hosting(self, topic: str, queue: int, gid: object = None, *,
                       confirm: bool = True) -> GroupRuntime:
        """The group led (and ready) here that hosts (topic, queue). With `confirm`, a
        majority has also confirmed this node still leads it (ReadIndex) before the
        caller answers from its state, so a deposed leader that does not know it yet
        neither serves a topic deleted meanwhile nor calls one created meanwhile
        unknown.

        `gid` is the group the client's route names (the SDK sends it): only that
        group's ready leader answers, so a follower whose state lags never calls a topic
        unknown. Without it (older clients), the topic is looked up in every group
        hosted here, and an unknown topic or queue is refused only by a node that leads
        a group, once each group it leads is ready and confirmed (`_confirm_led`): a
        lagging follower of a group this node does not lead can still miss a topic."""
        if gid is not None:
            g = self.lead.group(gid)
            state = self.lead.leading(g)
            if not state.hosts(topic, queue):
                await g.read_barrier()  # confirmed before it refuses, whatever `confirm`
                cfg = self.lead.leading(g).topic(topic)
                if cfg is None:
                    raise RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist")
                if queue >= cfg.queues:
                    raise RequestError(Code.UNKNOWN_QUEUE, f"topic {topic!r} has no queue "
                                       f"{queue}: its queues are 0..{cfg.queues - 1}")
                if queue not in cfg.hosted:  # the route is stale: look where it lives here
                    return await self._hosting(topic, queue, confirm=confirm)
                return g  # created meanwhile, and confirmed just now
        else:
            try:
                g = self._hosted(topic, queue)
            except RequestError as exc:
                if exc.code not in _UNKNOWN:
                    raise
                await self._confirm_led()
                g = self._hosted(topic, queue)
            self.lead.leading(g)
        if confirm:
            await self.lead.read_barrier(g)
        return g

    async def _confirm_led(self) -> None:
        """Before a topic or queue missing from this node's state is refused as unknown:
        this node leads a group (else NOT_LEADER, naming a leader of a group it hosts),
        every group it leads is ready (else NOT_LEADER with ready false), and a majority
        confirmed each (ReadIndex, together; NotLeader if one was lost meanwhile)."""
        led = [g for g in self.groups.values() if g.is_leader]
        if not led:
            hint = next((g.leader for g in self.groups.values() if g.leader is not None), None)
            raise NotLeader(hint)
        for g in led:
            g.check_ready()
        try:
            async with trio.open_nursery() as nursery:
                for g in led:
                    nursery.start_soon(g.read_barrier)
        except BaseExceptionGroup as group:
            # a barrier refused (leadership lost, a full disk) is the request's refusal,
            # as one group's would be; anything else stays the error it is
            lost, rest = group.split(NotLeader)
            if lost is None or rest is not None:
                raise
            raise _first_leaf(lost) from None

    def _hosted(self, topic: str, queue: int) -> GroupRuntime:
        """The group on this node that hosts (topic, queue), by the state applied so far."""
        known = False
        for gid, state in self.groups.states.items():
            cfg = state.topic(topic)
            if cfg is not None:
                known = True
                if queue in cfg.hosted:
                    return self.groups[gid]
                if queue >= cfg.queues:
                    raise RequestError(
                        Code.UNKNOWN_QUEUE, f"topic {topic!r} has no queue {queue}: its queues "
                        f"are 0..{cfg.queues - 1}"
                    )
        if known:
            # hosted by a group this node is not a replica of
            raise RequestError(Code.NOT_LEADER, f"{topic}/{queue} is not hosted on this node",
                               leader=None)
        raise RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist")

    @staticmethod
    def _result(result: Any) -> Any:
        if isinstance(result, ErrorResult):
            raise RequestError(result.code, result.message)
        return result

    async def _read(self, g: GroupRuntime, index: int) -> bytes | memoryview:
        """The data of committed entry `index`, CRC-checked when read from the CommitLog.

        Consumers fetch a producer's batch a few dozen messages at a time, and every
        consumer group tails the same recent batches: the last `READ_CACHE_BYTES` of
        entries read stay in memory so each is read and verified once, not per fetch.
        Committed entries never change, so the cache needs no invalidation.
        """
        key = (g.group_id, index)
        cache = self._read_cache
        data = cache.get(key)
        if data is not None:
            cache.move_to_end(key)
            return data
        data = (await self._entry(g, index)).data
        cache[key] = data
        self._read_cached += len(data)
        while self._read_cached > READ_CACHE_BYTES and len(cache) > 1:
            self._read_cached -= len(cache.popitem(last=False)[1])
        return data

    @staticmethod
    async def _entry(g: GroupRuntime, index: int) -> Entry:
        """Entry `index` from the CommitLog (read off the event loop); a corrupt one is
        sent for repair (BUSY). One below the log's first index (retention removed it
        after a ConsumeQueue lookup found it, maybe while the read waited for the log, or
        a refill was abandoned: `raftlog.core`) is gone: OFFSET_TOO_SMALL, naming the
        log's first index (`first`), so that the caller skips ahead."""
        try:
            return await g.read_committed(index)
        except CorruptEntry:  # already sent for repair
            raise RequestError(Code.BUSY, f"entry {index} of {g.group_id} is corrupt here and "
                               "being repaired from a peer; retry") from None
        except CommitLogError:
            first, _last = g.log_bounds()
            if index >= first:
                raise
            raise RequestError(Code.OFFSET_TOO_SMALL, f"entry {index} of {g.group_id} is no "
                               f"longer in the log (it starts at {first})", first=first) from None

    # ------------------------------------------------------------------ produce

    async def _produce(self, _caller: Caller, h: dict[str, Any], body: bytes) -> Response:
        g = self.lead.group(h.get("g"))
        state = self.lead.leading(g)
        if "sizes" not in h:  # the single-batch request of older clients
            (outcome,) = await self._produce_batches(g, state, [body])
            if isinstance(outcome, RequestError):
                raise outcome
            return ok_header(0, base=outcome.base_offset, n=outcome.count, index=outcome.index,
                             dup=outcome.dup, shift=outcome.shift), b""
        outcomes = await self._produce_batches(g, state, split_batches(h["sizes"], body))
        return ok_header(0, results=[
            encode_error(o) if isinstance(o, RequestError)
            else encode_ok(o.base_offset, o.count, o.index, o.dup, o.shift)
            for o in outcomes
        ]), b""

    async def _produce_batches(
        self, g: GroupRuntime, state: BrokerState, bodies: Sequence[bytes | memoryview]
    ) -> list[ProduceResult | RequestError]:
        """Store producer batches of group `g` as one entry; each batch's outcome, in
        order. A batch refused here or by the state machine is not stored and leaves the
        others alone; NotLeader or ProposalDropped before anything is proposed fail the
        whole request (nothing was written)."""
        # The batches are copied once, back to back into the stored entry itself (behind
        # the slot for the store timestamp, filled in place), and walked there; the walk
        # travels with the proposal to this replica's apply, which so does not walk them
        # again. A refused batch is overwritten by the next one, so the entry holds the
        # accepted batches only.
        outcomes: list[ProduceResult | RequestError | None] = [None] * len(bodies)
        max_bytes = self.node.config.max_message_bytes
        draft = g.draft(STORED_PREFIX.size + sum(len(b) for b in bodies))
        data = draft.data
        STORED_PREFIX.pack_into(data, 0, int(time.time() * 1000))
        walks: list[tuple[BatchHeader, list[RecordRef]]] = []
        slots: list[int] = []  # request position of each batch in the entry
        spans: list[tuple[int, int]] = []  # its place in the entry's data
        pos = STORED_PREFIX.size
        confirmed = False  # a majority confirmed this node leads (read barrier)
        for i, body in enumerate(bodies):
            end = pos + len(body)
            data[pos:end] = body
            try:
                header, refs = walk_batch(data[:end], pos, max_bytes, check_properties=True)
                validate_topic_name(header.topic)
                try:
                    state.queue_range(header.topic, header.queue)
                except RequestError as exc:  # UNKNOWN_TOPIC / UNKNOWN_QUEUE
                    if exc.code not in _UNKNOWN or confirmed:
                        raise
                    # a deposed leader that does not know it yet must not refuse a topic
                    # its successor created: confirmed first (the refusal path only)
                    await g.read_barrier()
                    confirmed = True
                    state = self.lead.leading(g)
                    state.queue_range(header.topic, header.queue)
                if header.tx is not None:  # the client's word: the coordinator decides
                    await self.tx.register(g, *header.tx)
                    state = self.lead.leading(g)
            except RequestError as exc:
                outcomes[i] = exc
                continue
            walks.append((header, refs))
            slots.append(i)
            spans.append((pos, end))
            pos = end
        if not walks:
            return outcomes  # type: ignore[return-value]
        if pos < len(data):  # some were refused: an entry of the others, copied once more
            kept = g.draft(pos)
            kept.data[:] = data[:pos]
            draft = kept
        if self.node.ack_before_commit or (
                self.node.commit_before_durable_prepare
                and all(header.prepared for header, _refs in walks)):
            # Deliberately wrong (chaos tests only): acknowledge what is not yet committed
            # (`commit-before-durable-prepare`: prepared batches only, so a coordinator
            # may decide commit before they are durable on a majority).
            self.node.spawn(g.propose_many([draft], EntryType.MESSAGES))
            for i, (header, _refs) in zip(slots, walks, strict=True):
                outcomes[i] = ProduceResult(-1, header.n, -1)
            return outcomes  # type: ignore[return-value]
        t0 = time.perf_counter()
        (result,) = await g.propose_many([draft], EntryType.MESSAGES,
                                         contexts=[WalkedEntry(walks, max_bytes)])
        latency_s = time.perf_counter() - t0
        per_batch = (result.results if isinstance(result, BatchOutcomes)
                     else [result] * len(slots))  # one outcome for the whole entry
        stored_msgs = stored_bytes = stored = 0
        for i, (a, b), r in zip(slots, spans, per_batch, strict=True):
            outcomes[i] = self._batch_outcome(r)
            if isinstance(r, ProduceResult):
                stored += 1
                stored_msgs += r.count
                stored_bytes += b - a
                if self.node.duplicate_every:
                    self.node.batches_led += 1
                    if self.node.batches_led % self.node.duplicate_every == 0:
                        # Deliberately wrong (chaos tests only): store the batch twice.
                        self.node.spawn(g.propose(
                            bytes(draft.data[: STORED_PREFIX.size]) + bytes(draft.data[a:b]),
                            EntryType.MESSAGES))
        if stored:
            self._produced(g, stored, stored_msgs, stored_bytes, latency_s)
        assert all(o is not None for o in outcomes)
        return outcomes  # type: ignore[return-value]

    def _batch_outcome(self, result: Any) -> ProduceResult | RequestError:
        """What `propose_many` gave for one batch, as the batch's outcome."""
        if isinstance(result, ProduceResult):
            return result
        if isinstance(result, ErrorResult):
            return RequestError(result.code, result.message)
        if isinstance(result, NotLeader):  # the batch is in this node's log and may yet commit
            return refusal(result, self.groups.peer_addr, in_doubt=True)
        if isinstance(result, (ProposalDropped, ProposalLost)):
            return refusal(result, self.groups.peer_addr)
        if isinstance(result, BaseException):
            raise result
        return RequestError(Code.INTERNAL, f"unexpected result {result!r} for a batch")

    def _produced(self, g: GroupRuntime, batches: int, messages: int, nbytes: int,
                  latency_s: float) -> None:
        """Count what one request stored: the counters once per request (a request of
        many single-message batches must not pay a locked increment per batch), the
        commit latency once per batch stored, as the histogram has always counted."""
        msgs, stored_bytes, latency = self.node.metrics.produce_series(g.group_id)
        msgs.inc(messages)
        stored_bytes.inc(nbytes)
        for _ in range(batches):
            latency.observe(latency_s)

    # ------------------------------------------------------------------ fetch

    async def _fetch(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = FetchRequest.decode(h)
        topic, queue, offset = req.topic, _check_queue(req.queue), req.offset
        max_count = min(max(req.max, 1), MAX_FETCH_COUNT)
        max_bytes = min(max(req.max_bytes, 1), MAX_FETCH_BYTES)
        wait_ms = min(max(req.wait_ms, 0), MAX_WAIT_MS)
        tag_hashes = {tag_hash(t) for t in req.tags} if req.tags else None
        # confirmed leader (ReadIndex) before answering: a leader replaced without knowing
        # it yet must neither report an old end nor serve a topic deleted meanwhile
        g = await self._hosting(topic, queue, req.g)
        deadline = trio.current_time() + wait_ms / 1000
        while True:
            state = self.lead.leading(g)
            lo, end = state.queue_range(topic, queue)
            if offset < lo:  # the earliest offset only grows: true for newer states too
                raise RequestError(Code.OFFSET_TOO_SMALL,
                                   f"offset {offset} outside [{lo}, {end}] of {topic}/{queue}",
                                   min=lo, end=end)
            if offset > end:
                raise RequestError(Code.OFFSET_TOO_LARGE,
                                   f"offset {offset} outside [{lo}, {end}] of {topic}/{queue}",
                                   min=lo, end=end)
            if offset < end:
                found, nxt = state.lookup(topic, queue, offset, max_count, max_bytes, tag_hashes)
                if found:
                    try:
                        return await self._answer_fetch(g, found, nxt, lo, end)
                    except RequestError as exc:
                        if exc.code != Code.OFFSET_TOO_SMALL or "first" not in exc.extra:
                            raise
                        # its entry is gone from the log: skip to the first message whose
                        # entry is still there
                        skip = state.queues.queue(topic, queue).first_offset_at_or_after_index(
                            int(exc.extra["first"]))
                        raise RequestError(
                            Code.OFFSET_TOO_SMALL, f"offset {offset} of {topic}/{queue}: "
                            f"{exc.message}", min=max(skip, offset + 1), end=end) from None
                offset = nxt  # only filtered-out messages up to `nxt`
                if nxt < end:
                    continue
            with trio.move_on_at(deadline):
                await g.wait_applied_change()
                continue
            return ok_header(0, g=g.group_id, next=offset, min=lo, end=end, msgs=[]), b""

    async def _answer_fetch(
        self, g: GroupRuntime, found: list, nxt: int, lo: int, end: int
    ) -> Response:
        # one slice per run of records that lie end to end in one entry (a batch's
        # records do), not one per message; rows as tuples (msgpack arrays all the same)
        parts: list[bytes | memoryview] = []
        msgs = []
        cached_index, cached = -1, memoryview(b"")
        run_start = run_end = 0
        for offset, index, start, size, _tag_hash, store_ms in found:
            if index != cached_index or start != run_end:
                if run_end > run_start:
                    parts.append(cached[run_start:run_end])
                if index != cached_index:
                    cached_index, cached = index, memoryview(await self._read(g, index))
                run_start = start
            run_end = start + size
            msgs.append((offset, index, start, store_ms))
        if run_end > run_start:
            parts.append(cached[run_start:run_end])
        body = b"".join(parts)
        nmsgs, nbytes = self.node.metrics.fetch_series(g.group_id)
        nmsgs.inc(len(msgs))
        nbytes.inc(len(body))
        return ok_header(0, g=g.group_id, next=nxt, min=lo, end=end, msgs=msgs), body

    # ------------------------------------------------------------------ offsets

    async def _commit_offset(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Commit offsets through the log. The client retries a commit whose answer it did
        not get, so a commit carries a request id ("req": [client id, sequence]) that the
        state machine deduplicates: a retry whose first copy was committed after all (by a
        new leader) must not overwrite an offset committed in between."""
        commit = CommitOffsetRequest.decode(h)
        cg, req = commit.cg, commit.req
        by_group: dict[str, list[tuple[str, int, int]]] = {}
        for topic, queue, offset in commit.offsets:
            g = await self._hosting(topic, _check_queue(queue), confirm=False)  # a write
            self.tx.check_no_pending(self.groups.states[g.group_id], cg, topic, queue)
            by_group.setdefault(g.group_id, []).append((topic, queue, offset))
        dup = False
        for gid, offs in by_group.items():
            await self.lead.check_commit_bounds(self.groups[gid], offs)
        for gid, offs in by_group.items():
            result = self._result(await self.groups[gid].propose(
                control_offsets(cg, offs, req), EntryType.CONTROL))
            dup = dup or (isinstance(result, ControlResult) and result.dup)
        return ok_header(0, **CommitOffsetAnswer(dup=dup).header()), b""

    async def _query_offset(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        q = QueryOffsetRequest.decode(h)
        cg, topic, queue = q.cg, q.topic, _check_queue(q.queue)
        # confirmed (ReadIndex): a committed offset is never read back older than it is
        g = await self._hosting(topic, queue, q.g)
        state = self.lead.leading(g)
        self.tx.check_no_pending(state, cg, topic, queue)
        off = state.consumer_offset(cg, topic, queue)
        answer = QueryOffsetAnswer(offset=-1 if off is None else off)
        return ok_header(0, **answer.header()), b""

    # ------------------------------------------------------------------ admin

    async def _create_topic(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        g = self.lead.group(h.get("g"))
        topic = _topic(h)
        queues = header_field(h, "queues", int)
        hosted = header_field(h, "hosted", list)
        if not 1 <= queues <= MAX_QUEUES:
            raise RequestError(Code.MALFORMED, f"queues must be 1..{MAX_QUEUES}")
        if not hosted or any(not is_int(q) or not 0 <= q < queues for q in hosted):
            raise RequestError(Code.MALFORMED, f"hosted must list queue ids in [0, {queues})")
        self.lead.leading(g)
        result = self._result(await g.propose(
            control_create_topic(topic, queues, sorted(set(hosted))), EntryType.CONTROL))
        assert isinstance(result, ControlResult)
        self.node.topics_changed()  # routes should not wait for the next heartbeat
        if result.applied == 0:  # the same topic, same queues, was already there
            raise RequestError(Code.TOPIC_EXISTS,
                               f"topic {topic!r} already exists here with this configuration",
                               same=True)
        return ok_header(0), b""

    async def _delete_topic(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        g = self.lead.group(h.get("g"))
        topic = _topic(h)
        req = request_id_field(h)
        self.lead.leading(g)
        self._result(await g.propose(control_delete_topic(topic, req), EntryType.CONTROL))
        self.node.topics_changed()
        return ok_header(0), b""

    async def _grow_topic(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        g = self.lead.group(h.get("g"))
        topic = _topic(h)
        queues = header_field(h, "queues", int)
        hosted = header_field(h, "hosted", list)
        if not 1 <= queues <= MAX_QUEUES:
            raise RequestError(Code.MALFORMED, f"queues must be 1..{MAX_QUEUES}")
        if any(not is_int(q) or not 0 <= q < queues for q in hosted):
            raise RequestError(Code.MALFORMED, f"hosted must list queue ids in [0, {queues})")
        req = request_id_field(h)
        self.lead.leading(g)
        self._result(await g.propose(control_grow_topic(topic, queues, hosted, req),
                                     EntryType.CONTROL))
        self.node.topics_changed()
        return ok_header(0), b""

    async def _offsets(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Committed offsets in the groups this node leads, read after a barrier each."""
        only = validate_group_name(h["cg"]) if h.get("cg") is not None else None
        rows: list[list[Any]] = []
        led: list[str] = []
        for gid, g in list(self.groups.items()):
            if not g.is_leader:
                continue
            try:
                await g.read_barrier()
            except NotLeader:
                continue
            led.append(gid)
            for (cg, topic, queue), off in self.groups.states[gid].consumer_offsets(only).items():
                rows.append([gid, cg, topic, queue, off])
        return ok_header(0, rows=rows, led=led), b""

    async def _delete_group(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        g = self.lead.group(h.get("g"))
        cg = _cg(h)
        req = request_id_field(h)
        self.lead.leading(g)
        result = self._result(await g.propose(control_delete_group(cg, req), EntryType.CONTROL))
        assert isinstance(result, ControlResult)
        return ok_header(0, deleted=result.applied), b""

    async def _topics(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Every topic of every group hosted here, as this node knows them; with "g", only
        that group's, from its leader once it confirmed its leadership (ReadIndex): a
        linearizable read of the group's topics."""
        topics: dict[str, dict[str, Any]] = {}
        states = self.groups.states
        if "g" in h:
            g = self.lead.group(h.get("g"))
            self.lead.leading(g)
            await self.lead.read_barrier(g)
            states = {g.group_id: self.lead.leading(g)}
        for gid, state in states.items():
            for name, cfg in state.topics().items():
                t = topics.setdefault(name, {"queues": cfg.queues, "hosted": {}})
                t["hosted"][gid] = list(cfg.hosted)
        return ok_header(0, topics=topics), b""

    async def _status(self, caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        return ok_header(0, **self.node.status(caller)), b""

    async def _transfer_leader(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Move the group's leadership to node `to`; with `prefer`, first log `to` as the
        group's preferred leader, so the core does not hand leadership back."""
        g = self.lead.group(h.get("g"))
        to = header_field(h, "to", int)
        prefer = header_field(h, "prefer", bool, False)
        self.lead.leading(g)
        voters = sorted(g.membership.voters)
        if to not in voters:
            raise RequestError(Code.NOT_A_MEMBER, f"node {to} is not a voter of group "
                               f"{g.group_id} (voters: {voters})")
        if prefer:
            self._result(await g.propose(control_prefer_leader(to), EntryType.CONTROL))
        try:
            g.transfer_leadership(to)
        except ValueError as exc:
            raise RequestError(Code.NOT_A_MEMBER, str(exc)) from None
        return ok_header(0, voters=voters), b""

    # ------------------------------------------------------------------ membership

    def _members_view(self, g: GroupRuntime) -> dict[str, Any]:
        """The membership as this leader sees it; NOT_LEADER (retriable, with the hint)
        when it lost the leadership while the request waited (a barrier, a change)."""
        self.lead.leading(g)
        m = g.membership
        st = g.status()
        nodes = sorted(self.node.config.peers)
        return {
            "leader": g.leader, "voters": sorted(m.voters), "learners": sorted(m.learners),
            "matches": g.peer_matches(), "active": sorted(g.recently_active()),
            "commit": st["commit"], "last": st["last"],
            "preferred": self.node.preferred_leader(g.group_id),
            "addresses": {n: self.groups.peer_addr(n) for n in nodes},
            "peers": nodes,
        }

    async def _membership(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """Show or change a group's membership, at its leader: one single-server change
        (add a learner, promote a caught-up learner, remove a member) at a time, refused
        when it would leave the group without a reachable majority. Changes already made
        answer OK (a retried request must not fail for having worked)."""
        g = self.lead.group(h.get("g"))
        action = header_field(h, "action", str)
        if action not in ("show", "add-learner", "promote", "remove"):
            raise RequestError(Code.MALFORMED, f"action must be show, add-learner, promote or "
                               f"remove, not {action!r}")
        self.lead.leading(g)
        if action == "show":
            await g.read_barrier()  # still the leader, as a majority confirms
            return ok_header(0, **self._members_view(g)), b""
        node = header_field(h, "node", int)
        me = self.node.config.node_id
        if node not in self.node.config.peers:
            raise RequestError(Code.NOT_A_MEMBER, f"node {node} is not in the cluster's peers "
                               f"table (known nodes: {sorted(self.node.config.peers)})")
        m = g.membership
        voters = sorted(m.voters)
        if action == "add-learner":
            if node in m.voters:
                raise RequestError(Code.MEMBERSHIP_REFUSED, f"node {node} is already a voter "
                                   f"of group {g.group_id} (voters: {voters})")
            if node in m.learners:
                return ok_header(0, **self._members_view(g)), b""
        elif action == "promote":
            if node in m.voters:
                return ok_header(0, **self._members_view(g)), b""
            if node not in m.learners:
                raise RequestError(Code.NOT_A_MEMBER, f"node {node} is not a learner of group "
                                   f"{g.group_id} (learners: {sorted(m.learners)})")
        else:
            if node not in m.members:
                return ok_header(0, **self._members_view(g)), b""
            if node == me:
                raise RequestError(Code.MEMBERSHIP_REFUSED, f"node {node} leads group "
                                   f"{g.group_id}: move its leadership to another voter first "
                                   f"(raftmq cluster transfer-leader {g.group_id} NODE)")
            if node in m.voters:
                self._check_quorum_after_removal(g.group_id, node, voters)
        try:
            await g.change_membership(action, node)  # type: ignore[arg-type]
        except ValueError as exc:
            raise RequestError(Code.MEMBERSHIP_REFUSED, str(exc)) from None
        return ok_header(0, **self._members_view(g)), b""

    def _check_quorum_after_removal(self, gid: str, node: int, voters: list[int]) -> None:
        rest = [v for v in voters if v != node]
        if not rest:
            raise RequestError(Code.MEMBERSHIP_REFUSED, f"node {node} is the last voter of "
                               f"group {gid}: a group needs at least one")
        me = self.node.config.node_id
        # connected, and heard from lately (a paused node keeps its connections)
        reachable = (set(self.node.reachable_peers()) | {me}) & self.groups[gid].recently_active()
        live = [v for v in rest if v in reachable]
        if len(live) < len(rest) // 2 + 1:
            raise RequestError(Code.MEMBERSHIP_REFUSED, f"removing node {node} from group {gid} "
                               f"would leave voters {rest}, of which only {live} are reachable: "
                               f"a majority ({len(rest) // 2 + 1}) must be, or the group "
                               "stops. Bring a node back (or add one) first")

    async def _host_group(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        gid = validate_group_name(header_field(h, "g", str))
        known = sorted(gc.id for gc in self.node.config.groups)
        if gid not in known:
            raise RequestError(Code.UNKNOWN_GROUP, f"no group {gid!r} in the cluster "
                               f"(known: {known})")
        raw = header_field(h, "voters", list)
        if not raw or not all(is_int(v) and v in self.node.config.peers for v in raw):
            raise RequestError(Code.MALFORMED, f"voters must be node ids of the cluster's "
                               f"peers {sorted(self.node.config.peers)}, got {raw!r}")
        created = await self.node.host_group(gid, tuple(sorted(set(raw))))
        return ok_header(0, created=created), b""

    async def _drop_group(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        gid = validate_group_name(header_field(h, "g", str))
        try:
            dropped = await self.node.drop_group(gid)
        except ValueError as exc:
            raise RequestError(Code.MEMBERSHIP_REFUSED, f"{exc}: remove it from the group "
                               "first (raftmq cluster remove-replica)") from None
        return ok_header(0, dropped=dropped), b""

    # ------------------------------------------------------------------ lookups

    async def _get_message(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        msg_id = header_field(h, "msg_id", str)
        gid, index, start = parse_message_id(msg_id)
        g = self.lead.group(gid)
        state = self.lead.leading(g)
        first, last = g.log_bounds()
        if not first <= index <= min(last, state.applied_index):
            raise RequestError(Code.NOT_FOUND, f"no message {msg_id}")
        entry = await self._entry(g, index)
        if entry.type != EntryType.MESSAGES:
            raise RequestError(Code.NOT_FOUND, f"no message {msg_id}")
        found = [header for header, refs in walk_entry(entry.data,
                                                       self.node.config.max_message_bytes)
                 if any(r.start == start for r in refs)]
        if not found:
            raise RequestError(Code.NOT_FOUND, f"no message {msg_id}")
        header = found[0]
        offset = state.locate(header.topic, header.queue, index, start)
        e = state.entry_of(header.topic, header.queue, offset)
        h2, body = await self._answer_fetch(g, [e], offset + 1,
                                            *state.queue_range(header.topic, header.queue))
        return ok_header(0, topic=header.topic, queue=header.queue, **{
            k: v for k, v in h2.items() if k in ("g", "msgs")}), body

    async def _query_key(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        topic = _topic(h)
        key = header_field(h, "key", str)
        limit = min(max(header_field(h, "max", int, 32), 1), MAX_FETCH_COUNT)
        parts: list[bytes] = []
        msgs: list[list[Any]] = []
        if not any(state.topic(topic) for state in self.groups.states.values()):
            await self._confirm_led()
            if not any(state.topic(topic) for state in self.groups.states.values()):
                raise RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} does not exist")
        hosting = [gid for gid, state in self.groups.states.items() if state.topic(topic)]
        led = [gid for gid in hosting if self.groups[gid].is_leader]
        if not led:
            self.lead.leading(self.groups[hosting[0]])  # NOT_LEADER with a hint
        for gid in led:
            self.lead.leading(self.groups[gid])  # each one ready (else NOT_LEADER, ready false)
        for gid in led:  # the groups led elsewhere answer there: "searched" tells which
            state, g = self.groups.states[gid], self.groups[gid]
            for queue, offset in state.keys(topic, key)[-limit:]:
                lo, end = state.queue_range(topic, queue)
                if not lo <= offset < end:
                    continue
                e = state.entry_of(topic, queue, offset)
                hdr, body = await self._answer_fetch(g, [e], offset + 1, lo, end)
                parts.append(body)
                msgs.append([gid, queue, *hdr["msgs"][0]])
        return ok_header(0, msgs=msgs, searched=led), b"".join(parts)

    async def _read_raw(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """A peer repairing entries [index, hi) asks for their stored bytes (any replica's
        copy of an entry with the same index and term is the same: Log Matching); it gets
        a prefix of the range, at least entry `index`, one request for a damaged segment's
        hundreds of entries rather than one each."""
        g = self.lead.group(h.get("g"))
        index = header_field(h, "index", int)
        hi = header_field(h, "hi", int, index + 1)
        if hi <= index:
            raise RequestError(Code.MALFORMED, f"hi {hi} must be above index {index}")
        if not g.is_open:
            raise RequestError(Code.BUSY, f"group {g.group_id} is not open")
        first, last = g.log_bounds()
        if index < first:
            raise RequestError(Code.NOT_FOUND, f"entry {index} was removed (first is {first})",
                               gone=True)
        if index > last or index in g.unrepaired:
            raise RequestError(Code.NOT_FOUND, f"entry {index} is not readable here (last is "
                               f"{last})", gone=False)
        try:
            term, raw = await g.read_raw(index, hi, READ_RAW_MAX_BYTES)
        except CorruptEntry:  # already sent for repair
            raise RequestError(Code.NOT_FOUND, f"entry {index} is corrupt here too",
                               gone=False) from None
        except CommitLogError as exc:
            raise RequestError(Code.BUSY, str(exc)) from None
        return ok_header(0, term=term), raw

    # ------------------------------------------------------------------ consumer groups

    async def _heartbeat(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        cg = _cg(h)
        client = header_field(h, "client", str)  # checked and bounded by the registry
        now = time.monotonic()
        before = self.consumers.members(cg, now)
        self.consumers.heartbeat(cg, client, header_field(h, "ttl_ms", int, 30_000), now,
                                 manual=header_field(h, "manual", bool, False))
        if self.consumers.members(cg, now) != before:
            self._members_changed(cg)
        return ok_header(0), b""

    def _members_changed(self, cg: str) -> None:
        """Wake the CONSUMERS requests held for `cg` (see `_consumers_of`)."""
        changed = self._member_waits.pop(cg, None)
        if changed is not None:
            changed.set()

    async def _consumers_of(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """The live members of a group. With `known` (the list the caller last saw) and
        `wait_ms`, the answer waits until the list differs from it, or the wait ends: a
        member learns of a join or a leave when it happens, not at its next poll."""
        cg = _cg(h)
        known = h.get("known")
        wait_ms = header_field(h, "wait_ms", int, 0)
        if not 0 <= wait_ms <= MAX_WAIT_MS:
            raise RequestError(Code.MALFORMED, f"wait_ms must be 0-{MAX_WAIT_MS}")
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            now = time.monotonic()
            members = self.consumers.members(cg, now)
            if not isinstance(known, list) or members != known or now >= deadline:
                return ok_header(0, clients=members,
                                 manual=self.consumers.manual_members(cg, now)), b""
            expiry = self.consumers.next_expiry(cg)
            changed = self._member_waits.setdefault(cg, trio.Event())
            with trio.move_on_at(min(deadline, expiry + 0.001 if expiry else deadline)):
                await changed.wait()


