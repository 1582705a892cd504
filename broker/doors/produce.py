"""PRODUCE: a producer's batches stored as one entry of their group, each with its own
outcome.

One request may carry many batches (`wire.produce`); they are walked and checked here,
copied once into the entry that is proposed, and answered batch by batch: a batch
refused here or by the state machine is not stored and leaves the others alone, so a
client retries only what failed. A write is answered once applied, i.e. committed on a
majority. An unknown topic or queue is refused only after a majority confirmed this node
still leads (a deposed leader must not refuse a topic its successor created), and a
transactional batch's group is registered with the transaction's coordinator before it
is prepared here (`TxService.register`).

The node's deliberate test mutations that concern produce (acknowledging before the
commit, storing a batch twice) are carried out here, read from the host at each request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from broker.config import NodeConfig
from broker.doors.base import UNKNOWN, Handler, Response
from broker.doors.refusals import refusal
from broker.doors.transactions import TxService
from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead
from broker.runtime.metrics import NodeMetrics
from broker.state.statemachine import BatchOutcomes, BrokerState, ErrorResult, ProduceResult
from raftlog.runtime import GroupRuntime, NotLeader, ProposalDropped, ProposalLost
from raftlog.types import EntryType
from transport.framing import Caller
from wire.produce import cut_batches, encode_error, encode_ok
from wire.protocol import Code, Op, RequestError, ok_header, validate_topic_name
from wire.records import STORED_PREFIX, BatchHeader, RecordRef, WalkedEntry, walk_batch
from wire.requests import ProduceAnswer, ProduceRequest

__all__ = ["ProduceDoor", "ProduceHost"]


class ProduceHost(Protocol):
    """What produce uses of its node: the message size limit, and the deliberate test
    mutations (see `broker.config`), which the node sets after building its doors."""

    config: NodeConfig
    ack_before_commit: bool
    commit_before_durable_prepare: bool
    duplicate_every: int
    batches_led: int

    def spawn(self, work: Awaitable[Any]) -> None: ...


class ProduceDoor:
    """PRODUCE for one node."""

    def __init__(self, lead: GroupLead, groups: GroupRegistry, host: ProduceHost,
                 metrics: NodeMetrics, tx: TxService) -> None:
        self.lead = lead
        self.groups = groups
        self.host = host
        self.metrics = metrics
        self.tx = tx

    def handlers(self) -> dict[int, Handler]:
        return {Op.PRODUCE: self._produce}

    async def _produce(self, _caller: Caller, h: dict[str, Any], body: bytes) -> Response:
        # the group and its leadership first, before the fields, as always
        g = self.lead.group(h.get("g"))
        state = self.lead.leading(g)
        req = ProduceRequest.decode(h)
        if not req.sizes:  # the single-batch form (older clients)
            (outcome,) = await self._produce_batches(g, state, [body])
            if isinstance(outcome, RequestError):
                raise outcome
            answer = ProduceAnswer(base=outcome.base_offset, n=outcome.count,
                                   index=outcome.index, dup=outcome.dup, shift=outcome.shift)
            return ok_header(0, **answer.header()), b""
        outcomes = await self._produce_batches(g, state, cut_batches(req.sizes, body))
        return ok_header(0, **ProduceAnswer(results=tuple(
            encode_error(o) if isinstance(o, RequestError)
            else encode_ok(o.base_offset, o.count, o.index, o.dup, o.shift)
            for o in outcomes
        )).header()), b""

    async def store(self, g: GroupRuntime, state: BrokerState,
                    bodies: Sequence[bytes | memoryview]) -> list[ProduceResult | RequestError]:
        """Store batches the node itself wrote (trace records) exactly as a producer's are
        stored: checked, proposed as one entry, counted; each batch's outcome."""
        return await self._produce_batches(g, state, bodies)

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
        max_bytes = self.host.config.max_message_bytes
        draft = g.draft(STORED_PREFIX.size + sum(len(b) for b in bodies))
        data = draft.data
        now_ms = int(time.time() * 1000)
        STORED_PREFIX.pack_into(data, 0, now_ms)
        max_delay_ms = int(self.host.config.max_delay_s * 1000)
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
                # a queue of this group has a name its creation checked: the name rule and
                # why a queue is not here are looked into only for one that is not
                hosted = state.hosts(header.topic, header.queue)
                if not hosted:
                    validate_topic_name(header.topic)
                if header.delayed:
                    check_delay(header, now_ms, max_delay_ms)
                if not hosted:
                    try:
                        state.queue_range(header.topic, header.queue)
                    except RequestError as exc:  # UNKNOWN_TOPIC / UNKNOWN_QUEUE
                        if exc.code not in UNKNOWN or confirmed:
                            raise
                        # a deposed leader that does not know it yet must not refuse a
                        # topic its successor created: confirmed first (refusals only)
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
        host = self.host
        if host.ack_before_commit or (
                host.commit_before_durable_prepare
                and all(header.prepared for header, _refs in walks)):
            # Deliberately wrong (chaos tests only): acknowledge what is not yet committed
            # (`commit-before-durable-prepare`: prepared batches only, so a coordinator
            # may decide commit before they are durable on a majority).
            host.spawn(g.propose_many([draft], EntryType.MESSAGES))
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
                if host.duplicate_every:
                    host.batches_led += 1
                    if host.batches_led % host.duplicate_every == 0:
                        # Deliberately wrong (chaos tests only): store the batch twice.
                        host.spawn(g.propose(
                            bytes(draft.data[: STORED_PREFIX.size]) + bytes(draft.data[a:b]),
                            EntryType.MESSAGES))
        if stored:
            self._produced(g, stored_msgs, stored_bytes, latency_s)
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

    def _produced(self, g: GroupRuntime, messages: int, nbytes: int,
                  latency_s: float) -> None:
        """Count what one request stored, once per request (a request of many
        single-message batches must not pay a locked increment per batch): messages,
        bytes, and the request's latency (its batches share one proposal, so one
        latency), as the histogram's help says."""
        msgs, stored_bytes, latency = self.metrics.produce_series(g.group_id)
        msgs.inc(messages)
        stored_bytes.inc(nbytes)
        latency.observe(latency_s)


def check_delay(header: BatchHeader, now_ms: int, max_delay_ms: int) -> None:
    """Refuse a delayed batch due further ahead than this node takes (MALFORMED, never
    "deliver now"). A time already past is due at once: a producer's clock a little
    ahead of the leader's must not fail its sends."""
    ahead = header.delay_ms or header.deliver_ms - now_ms
    if ahead > max_delay_ms:
        what = (f"a delay of {header.delay_ms} ms" if header.delay_ms
                else f"a delivery time {ahead} ms ahead")
        raise RequestError(Code.MALFORMED, f"{what} is beyond this cluster's maximum delay "
                                           f"of {max_delay_ms} ms (max_delay_s)")
