"""The reads: FETCH, GET_MESSAGE, QUERY_KEY, OFFSET_FOR_TIME, and READ_RAW between nodes.

Reads are served by the leader from its applied state and its own CommitLog, as the
stored bytes, with long polling for consumers at the end of a queue. The leader answers
once a majority confirmed it still leads (ReadIndex), so a leader replaced without
knowing it yet neither reports an old end nor serves a topic deleted meanwhile. Every
consumer group tails the same recent batches, so the entries read last stay in memory
(`READ_CACHE_BYTES`) and each is read and verified once, not per fetch.

A stored entry that fails its CRCs is never served: the read answers BUSY (retriable)
and the group refetches the entry from a peer (`GroupRuntime.report_corrupt`). Peers
ask for such entries with READ_RAW, answered from this node's CommitLog whatever its
role, and served while the node repairs entries of its own, to peers only: the caller
must have proved it is a node of the cluster (`transport.peerauth`; the service refuses
a client FORBIDDEN before this door is asked).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgpack
import trio

from broker.config import NodeConfig
from broker.doors.base import (
    MAX_WAIT_MS,
    Handler,
    QueueHosts,
    Response,
    check_queue,
    confirm_led,
)
from broker.runtime.groups import GroupRegistry
from broker.runtime.leading import GroupLead
from broker.runtime.metrics import NodeMetrics
from broker.state.consumequeue import CQEntry
from broker.state.statemachine import BrokerState
from raftlog.commitlog import CommitLogError, CorruptEntry
from raftlog.runtime import GroupRuntime
from raftlog.types import Entry, EntryType
from raftmq.filter import FilterError, Predicate
from raftmq.filter import compile as compile_filter
from transport.framing import Caller
from wire.protocol import Code, Op, RequestError, ok_header
from wire.records import RECORD_HEADER, tag_hash, walk_entry
from wire.requests import (
    FetchRequest,
    GetMessageAnswer,
    GetMessageRequest,
    OffsetForTimeAnswer,
    OffsetForTimeRequest,
    QueryKeyAnswer,
    QueryKeyRequest,
    ReadRawAnswer,
    ReadRawRequest,
)

__all__ = ["MAX_FETCH_BYTES", "MAX_FETCH_COUNT", "READ_CACHE_BYTES", "READ_RAW_MAX_BYTES",
           "ReadDoor", "filter_properties", "filter_scan", "record_tag"]

MAX_FETCH_COUNT = 1024
MAX_FETCH_BYTES = 8 << 20
#: A READ_RAW answer holds entries up to this size (and always its first entry), well
#: under the client frame limit.
READ_RAW_MAX_BYTES = 4 << 20
READ_CACHE_BYTES = 32 << 20  # recently read committed entries kept for the next fetches


def filter_scan(max_count: int) -> int:
    """How many ConsumeQueue entries one pass of a filtered fetch looks at, at most: as
    many as a tag filter scans (`ConsumeQueue.read`), so a rare match costs the client
    more requests, never one long one."""
    return max(10 * max_count, 1000)


class ReadDoor:
    """The reads of one node, and the cache of entries they read last."""

    def __init__(self, lead: GroupLead, groups: GroupRegistry, hosts: QueueHosts,
                 config: NodeConfig, metrics: NodeMetrics) -> None:
        self.lead = lead
        self.groups = groups
        self.hosts = hosts
        self.config = config
        self.metrics = metrics
        self._cache: OrderedDict[tuple[str, int], bytes | memoryview] = OrderedDict()
        self._cached = 0  # bytes held by _cache

    def handlers(self) -> dict[int, Handler]:
        return {
            Op.FETCH: self._fetch,
            Op.GET_MESSAGE: self._get_message,
            Op.QUERY_KEY: self._query_key,
            Op.OFFSET_FOR_TIME: self._offset_for_time,
            Op.READ_RAW: self._read_raw,
        }

    async def _read(self, g: GroupRuntime, index: int) -> bytes | memoryview:
        """The data of committed entry `index`, CRC-checked when read from the CommitLog.

        Consumers fetch a producer's batch a few dozen messages at a time, and every
        consumer group tails the same recent batches: the last `READ_CACHE_BYTES` of
        entries read stay in memory so each is read and verified once, not per fetch.
        Committed entries never change, so the cache needs no invalidation.
        """
        key = (g.group_id, index)
        cache = self._cache
        data = cache.get(key)
        if data is not None:
            cache.move_to_end(key)
            return data
        data = (await _entry(g, index)).data
        cache[key] = data
        self._cached += len(data)
        while self._cached > READ_CACHE_BYTES and len(cache) > 1:
            self._cached -= len(cache.popitem(last=False)[1])
        return data

    # ------------------------------------------------------------------ fetch

    async def _fetch(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = FetchRequest.decode(h)
        topic, queue, offset = req.topic, check_queue(req.queue), req.offset
        max_count = min(max(req.max, 1), MAX_FETCH_COUNT)
        max_bytes = min(max(req.max_bytes, 1), MAX_FETCH_BYTES)
        wait_ms = min(max(req.wait_ms, 0), MAX_WAIT_MS)
        tag_hashes = {tag_hash(t) for t in req.tags} if req.tags else None
        predicate: Predicate | None = None
        if req.sql is not None:
            try:  # strict: text after the expression is a mistake, not ignored
                predicate = compile_filter(req.sql, strict=True)
            except FilterError as exc:
                raise RequestError(Code.MALFORMED, f"bad SQL92 filter: {exc}") from None
        # confirmed leader (ReadIndex) before answering: a leader replaced without knowing
        # it yet must neither report an old end nor serve a topic deleted meanwhile
        g = await self.hosts.led_group(topic, queue, req.g)
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
                try:
                    if predicate is None:
                        found, nxt = state.lookup(topic, queue, offset, max_count, max_bytes,
                                                  tag_hashes)
                    else:
                        found, nxt = await self._filtered(g, state, topic, queue, offset, end,
                                                          max_count, max_bytes, tag_hashes,
                                                          predicate)
                    if found:
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
                    if predicate is not None:
                        # a SQL92 pass read its bounded share of records and found nothing:
                        # answer now, past them, rather than read on in this request
                        return ok_header(0, g=g.group_id, next=offset, min=lo, end=end,
                                         msgs=[]), b""
                    continue
            with trio.move_on_at(deadline):
                await g.wait_applied_change()
                continue
            return ok_header(0, g=g.group_id, next=offset, min=lo, end=end, msgs=[]), b""

    async def _filtered(
        self, g: GroupRuntime, state: BrokerState, topic: str, queue: int, offset: int, end: int,
        max_count: int, max_bytes: int, tag_hashes: set[int] | None, predicate: Predicate,
    ) -> tuple[list[CQEntry], int]:
        """The entries from `offset` whose records `predicate` (a SQL92 filter) matches,
        as `lookup` gives them, and the offset to go on from: at most `max_count` of them
        and `max_bytes` of records (at least one), looking at no more than
        `filter_scan(max_count)` entries of the queue. Each candidate's properties are
        read from its stored record (through the read cache), its body left alone."""
        out: list[CQEntry] = []
        used = filtered = 0
        pos = offset
        stop = min(end, offset + filter_scan(max_count))
        data: bytes | memoryview = b""
        data_index = -1
        try:
            while pos < stop:
                found, nxt = state.lookup(topic, queue, pos, max_count, max_bytes, tag_hashes,
                                          stop - pos)
                full = False
                for e in found:
                    if e.offset >= stop:  # (a lookup without tags reads whole counts)
                        nxt = e.offset
                        break
                    if e.index != data_index:
                        data, data_index = await self._read(g, e.index), e.index
                    if not predicate(filter_properties(data, e.start)):
                        filtered += 1
                        continue
                    if out and used + e.size > max_bytes:
                        nxt, full = e.offset, True  # the next fetch starts with it
                        break
                    out.append(e)
                    used += e.size
                    if len(out) >= max_count:
                        nxt, full = e.offset + 1, True
                        break
                if nxt <= pos:  # (never: a lookup below the end moves on)
                    break
                pos = nxt
                if full:
                    break
        finally:
            if filtered:
                self.metrics.fetch_filtered.labels(g.group_id).inc(filtered)
        return out, pos

    async def _answer_fetch(
        self, g: GroupRuntime, found: list, nxt: int, lo: int, end: int
    ) -> Response:
        msgs, body = await self.records(g, found)
        nmsgs, nbytes = self.metrics.fetch_series(g.group_id)
        nmsgs.inc(len(msgs))
        nbytes.inc(len(body))
        return ok_header(0, g=g.group_id, next=nxt, min=lo, end=end, msgs=msgs), body

    async def records(
        self, g: GroupRuntime, found: Sequence[CQEntry]
    ) -> tuple[list[tuple[int, int, int, int]], bytes]:
        """The stored records of ConsumeQueue entries `found` of group `g` (through the
        read cache), concatenated, and a FETCH row (offset, Raft index, start, store
        time) for each: what every door that answers messages reads them with."""
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
        return msgs, b"".join(parts)

    async def properties(self, g: GroupRuntime, found: Sequence[CQEntry]
                         ) -> list[tuple[str, dict[str, str]]]:
        """The tag and the filter properties (`filter_properties`) of each stored record
        of `found` (through the read cache), bodies left alone: what a simple consumer's
        receive learns of new messages before it proposes (their message groups, and
        which ones its filter leaves out)."""
        out = []
        data: bytes | memoryview = b""
        data_index = -1
        for e in found:
            if e.index != data_index:
                data, data_index = await self._read(g, e.index), e.index
            out.append((record_tag(data, e.start), filter_properties(data, e.start)))
        return out

    # ------------------------------------------------------------------ lookups

    async def _get_message(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = GetMessageRequest.decode(h)
        msg_id = req.msg_id
        gid, index, start = req.parts
        g = self.lead.group(gid)
        state = self.lead.leading(g)
        first, last = g.log_bounds()
        if not first <= index <= min(last, state.applied_index):
            raise RequestError(Code.NOT_FOUND, f"no message {msg_id}")
        entry = await _entry(g, index)
        if entry.type != EntryType.MESSAGES:
            raise RequestError(Code.NOT_FOUND, f"no message {msg_id}")
        found = [header for header, refs in walk_entry(entry.data,
                                                       self.config.max_message_bytes)
                 if any(r.start == start for r in refs)]
        if not found:
            raise RequestError(Code.NOT_FOUND, f"no message {msg_id}")
        header = found[0]
        offset = state.locate(header.topic, header.queue, index, start)
        e = state.entry_of(header.topic, header.queue, offset)
        h2, body = await self._answer_fetch(g, [e], offset + 1,
                                            *state.queue_range(header.topic, header.queue))
        answer = GetMessageAnswer(topic=header.topic, queue=header.queue, g=h2["g"],
                                  msgs=tuple(h2["msgs"]))
        return ok_header(0, **answer.header()), body

    async def _query_key(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = QueryKeyRequest.decode(h)
        topic, key = req.topic, req.key
        limit = min(max(req.max, 1), MAX_FETCH_COUNT)
        parts: list[bytes] = []
        msgs: list[list[Any]] = []
        if not any(state.topic(topic) for state in self.groups.states.values()):
            await confirm_led(self.groups)
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
        answer = QueryKeyAnswer(msgs=tuple(msgs), searched=tuple(led))
        return ok_header(0, **answer.header()), b"".join(parts)

    async def _offset_for_time(self, _caller: Caller, h: dict[str, Any],
                               _body: bytes) -> Response:
        """Where (topic, queue) reaches store time `ms`, from the confirmed leader's state
        (ReadIndex, as FETCH): the ConsumeQueue records carry each message's store time,
        so no entry is read from the log."""
        req = OffsetForTimeRequest.decode(h)
        topic, queue = req.topic, check_queue(req.queue)
        g = await self.hosts.led_group(topic, queue, req.g)
        cq = self.lead.leading(g).queues.queue(topic, queue)
        answer = OffsetForTimeAnswer(g=g.group_id, offset=cq.first_offset_at_or_after_ms(req.ms),
                                     min=cq.min_offset, end=cq.end_offset)
        return ok_header(0, **answer.header()), b""

    # ------------------------------------------------------------------ repairs

    async def _read_raw(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        """A peer repairing entries [index, hi) asks for their stored bytes (any replica's
        copy of an entry with the same index and term is the same: Log Matching); it gets
        a prefix of the range, at least entry `index`, one request for a damaged segment's
        hundreds of entries rather than one each."""
        g = self.lead.group(h.get("g"))  # the group first, before the fields, as always
        req = ReadRawRequest.decode(h)
        index, hi = req.index, req.end
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
        return ok_header(0, **ReadRawAnswer(term=term).header()), raw


def filter_properties(data: bytes | memoryview, start: int) -> dict[str, str]:
    """What a SQL92 filter sees of the stored record at `start` of `data`: its
    properties, plus RocketMQ's system properties `TAGS` (its tag) and `KEYS` (its key)
    when it has them. A property the producer set itself under either name is kept, as
    the consumer receives it (it is never replaced by the system value). The body is not
    read; undecodable properties (the produce path refuses them) count as none."""
    _size, _born, klen, tlen, plen, _blen = RECORD_HEADER.unpack_from(data, start)
    if not (klen or tlen or plen):
        return {}
    p = start + RECORD_HEADER.size
    props: dict[str, str] = {}
    if plen:
        raw = memoryview(data)[p + klen + tlen : p + klen + tlen + plen]
        try:
            decoded = msgpack.unpackb(raw, raw=False)
        except Exception:  # msgpack raises several unrelated types
            decoded = None
        if isinstance(decoded, dict):
            props = {k: v for k, v in decoded.items() if isinstance(k, str)
                     and isinstance(v, str)}
    if tlen and "TAGS" not in props:
        props["TAGS"] = str(memoryview(data)[p + klen : p + klen + tlen], "utf-8",
                            "replace")
    if klen and "KEYS" not in props:
        props["KEYS"] = str(memoryview(data)[p : p + klen], "utf-8", "replace")
    return props


def record_tag(data: bytes | memoryview, start: int) -> str:
    """The tag of the stored record at `start` of `data` ("" for none)."""
    _size, _born, klen, tlen, _plen, _blen = RECORD_HEADER.unpack_from(data, start)
    if not tlen:
        return ""
    p = start + RECORD_HEADER.size + klen
    return str(memoryview(data)[p : p + tlen], "utf-8", "replace")


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
