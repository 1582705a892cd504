"""The leader-side transaction duties of one node, beside the state machine.

A registered duty (`broker.duties.registry`): for each group this node leads, once it is
ready, and every `tx_tick_ms` after, from the group's applied state:

* coordinator: every decided transaction whose markers are not all written
  (prepare_commit / prepare_abort) gets TX_MARKER sent to each participant's leader
  (over `broker.runtime.peer_rpc`, or proposed here directly when this node leads that
  participant too; none to the coordinator's own group when its tx_end applied the
  marker there already), retried with backoff until each is applied, then tx_complete is
  proposed; every ongoing transaction past its timeout is aborted (tx_end, reason
  "timeout"). A new leader picks all this up at its first tick: the state is in the log.
* participant: a Kafka transaction's prepared data older than `tx_orphan_ms` asks its
  coordinator (TX_STATUS, linearizable) and aborts the data if the coordinator has moved
  past it (another epoch or transaction number, or never heard of it), commits it if the
  coordinator says it committed, and aborts it when the coordinator has not started its
  transaction within the longest transaction timeout (`tx_timeout_max_ms`: hanging). An
  unresolved one is asked about again after a doubling delay (1 s .. 60 s), not at every
  tick. A participant registers itself with the coordinator
  before it prepares a transaction's first data (`TxService.register`), so the
  decision's markers reach it; orphans are data prepared before that rule (or whose
  marker came while its batch was in flight long ago): they must not pin the log forever.
* check-back: each pending half message due for a check (`tx_check_first_ms` after it
  was prepared, then every `tx_check_interval_ms`) is rolled back ("expired") after
  `tx_check_max` checks; otherwise one more check is logged first (half_checked, so the
  count survives a failover and the state read after it has applied everything before
  it), the state is read again (a decided half is never checked), and a live member of
  its producer group connected to this node is asked (TX_CHECK); a commit or rollback
  answer is logged as the decision (source "check"). A half message whose property
  `CHECK_IMMUNITY_TIME_IN_SECONDS` says its local transaction takes longer is first
  checked that many seconds after it was stored (RocketMQ's check immunity). No member, no answer or "unknown":
  nothing more until the next interval.

* expiry: transactional ids idle for `tx_id_expiration_ms` are forgotten by their
  coordinator (tx_expire) and their fences by each participant (tx_forget_fences), at
  most `EXPIRE_BATCH` ids per record, one record at a time per group.

TX_END and TX_INIT do not wait for a tick: they call `finish`, which runs the same
marker work at once (one run per transaction, shared by every waiter). The markers of
one transactional id go out in its transactions' order: a transaction's wait for every
earlier one of the same id to be written first, so a producer's transactions enter each
queue in the order it made them. A new leader's
first tick comes as soon as its duties start, so it takes over without delay.

Every task lives in the nursery `serve` holds (structured concurrency): nothing outlives
the node. A group's ticks stop when this node stops leading it; a task already started
for it ends by itself, as its proposals are refused and its `still()` turns False.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from functools import partial
from typing import Any

import trio

from broker.doors.transactions import TxService, coordinator, now_ms, participant
from broker.duties.base import Duty, DutyHost
from broker.runtime.leading import GroupLead
from broker.state.parts.txcoord import TxComplete, TxEnd, TxExpire
from broker.state.parts.txpart import MAX_MARKERS, HalfChecked, IdleIds, TxForgetFences
from raftlog.runtime import NotLeader, ProposalDropped, ProposalLost
from transport.framing import CallerGone
from wire.protocol import Code, Op, RequestError
from wire.records import decode_record
from wire.requests.transactions import (
    Marker,
    TxAddRequest,
    TxCheckAnswer,
    TxCheckRequest,
    TxMarkerRequest,
    TxStatusAnswer,
    TxStatusRequest,
)
from wire.txn import coordinator_group, kafka_key

__all__ = ["CHECK_TIMEOUT_S", "RPC_TIMEOUT_S", "TxTasks", "orphan_retry", "orphan_verdict"]

log = logging.getLogger("raftmq.tx")

CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"  # a half message's property, RocketMQ's
MAX_IMMUNITY_S = 86_400
IMMUNITY_CACHE = 10_000
RPC_TIMEOUT_S = 5.0
CHECK_TIMEOUT_S = 3.0
BACKOFF_MIN_S = 0.02
BACKOFF_MAX_S = 1.0
COMPLETE_GRACE_S = 0.2
"""How long a transaction whose markers are all applied waits for its producer's next
transaction to complete it (that tx_add says so) before logging tx_complete itself."""
ORPHAN_RETRY_MIN_MS = 1_000  # an orphan the coordinator says to wait for: asked again after
ORPHAN_RETRY_MAX_MS = 60_000  # ... doubling up to this
_LOST = (NotLeader, ProposalDropped, ProposalLost)
#: What this node asks other groups' leaders (or itself, when it leads them too).
PeerRequest = TxMarkerRequest | TxStatusRequest | TxAddRequest


def orphan_verdict(epoch: int, n: int, status: TxStatusAnswer | Mapping[str, Any], *,
                   stale: bool = False) -> tuple[bool, int] | None:
    """What to do with prepared data of transaction (epoch, n) of an id no marker came
    for, given its coordinator's TX_STATUS answer: (commit, fence) for the marker to log
    in the participant, or None to ask again later. The fence is the coordinator's epoch,
    never the data's own: an epoch in a batch header is a client's word.

    Whatever the epochs say, data is resolved once the coordinator can say: an epoch it
    never granted (or an id it never heard of) is aborted, so such data cannot pin the
    log forever. `stale`: the data was prepared longer ago than the longest transaction
    timeout; a transaction the coordinator has still not started by then never will be
    with this data (its client would have registered it at once), so it is aborted
    rather than waited for (a hanging transaction, Kafka's KIP-890). A later batch of it
    is then refused here as decided, so no commit can include part of it."""
    if not isinstance(status, TxStatusAnswer):
        status = TxStatusAnswer.decode(status)
    ce, cn, st = status.epoch, status.n, status.state
    if any((u[0], u[1]) == (epoch, n) for u in status.unfinished):
        return None  # decided, its markers still going out: they will come
    fence = max(ce, 0)
    if (ce, cn) == (epoch, n):
        if st not in ("complete_commit", "complete_abort"):
            return None  # still open or completing: its markers will come
        return st == "complete_commit", fence
    if epoch > ce:
        # an epoch the coordinator never granted (or an id it never heard of): data
        # prepared before brokers checked epochs (`TxService.check_granted`)
        return False, fence
    if (ce, cn) > (epoch, n):
        return False, fence  # the coordinator moved past it
    if stale:
        return False, fence  # the coordinator never got there: hanging, aborted
    return None  # the coordinator has not got there yet


def orphan_retry(wait: tuple[int, int] | None, now: int) -> tuple[int, int]:
    """(not before, delay), both ms, for an orphan asked about at `now`, whose previous
    ask left `wait` (None: the first): the delay doubles from ORPHAN_RETRY_MIN_MS up to
    ORPHAN_RETRY_MAX_MS, so a transaction open longer than `tx_orphan_ms` is not asked
    about at every tick."""
    delay = ORPHAN_RETRY_MIN_MS if wait is None else min(wait[1] * 2, ORPHAN_RETRY_MAX_MS)
    return now + delay, delay


class _Outgoing:
    """A marker ((tid, epoch, n, commit, fence)) waiting to go to a participant; `done`
    is set once it is applied there, or no longer needs to be (`still` says False)."""

    __slots__ = ("done", "marker", "still")

    def __init__(self, marker: Marker, still: Callable[[], bool]) -> None:
        self.marker = marker
        self.still = still
        self.done = trio.Event()


class TxTasks(Duty):
    """The transaction duties of one node: `serve` holds the tasks they start (for the
    requests too: `TxService.finisher`), `run(gid)` ticks for a group led here."""

    name = "transactions"

    def __init__(self, host: DutyHost) -> None:
        super().__init__(host)
        self.config = host.config
        self.groups = host.registry
        self.rpc = host.rpc
        self._nursery: trio.Nursery | None = None
        self._running: dict[Hashable, trio.Event] = {}  # job key -> set when it ends
        # finish job key -> set once every participant applied the marker (waited on by
        # TX_END, answered before the transaction is logged complete)
        self._delivered: dict[Hashable, trio.Event] = {}
        # finish job key -> set to end its wait for the next transaction (`_complete`)
        self._hurry: dict[Hashable, trio.Event] = {}
        self._leader_hint: dict[str, int] = {}  # group -> node believed to lead it
        self._outbox: dict[str, list[_Outgoing]] = {}  # participant -> markers to send
        self._senders: set[str] = set()  # participants a `_send_markers` task serves
        self._wake = trio.Event()
        # half txid -> until when it is immune from check-back (read from its record once)
        self._immunity: dict[str, int] = {}
        # group -> its orphans (tid, epoch, n) -> (not asked again before, ms; the delay
        # after it)
        self._orphan_wait: dict[str, dict[tuple[str, int, int], tuple[int, int]]] = {}

    @property
    def tx(self) -> TxService:
        return self.host.tx_service

    @property
    def lead(self) -> GroupLead:
        return self.host.tx_service.lead

    @property
    def group_ids(self) -> list[str]:
        return [gc.id for gc in self.config.groups]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Hold the nursery every transaction task runs in, for the node's life: those a
        tick starts and those a request starts (TX_END, TX_INIT: `finish`). A task of a
        group no longer led here ends by itself (its proposals are refused, `still()`
        says False), so one a request shares is not cut off while it is answered."""
        async with trio.open_nursery() as nursery:  # `rpc` runs in the node's nursery
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    async def run(self, gid: str) -> None:
        """Tick for `gid`, led here: at once (a new leader takes over without delay), then
        every `tx_tick_ms` or when woken."""
        interval = self.config.tx_tick_ms / 1000
        try:
            while True:
                wake = self._wake
                try:
                    self.tick(gid)
                except Exception:  # a bug here must not stop the duty
                    log.exception("transaction tick failed")
                with trio.move_on_after(interval):
                    await wake.wait()
        finally:
            # no longer led here: the next leader asks about its orphans afresh
            self._orphan_wait.pop(gid, None)

    # ------------------------------------------------------------------ jobs

    def _spawn(self, key: Hashable, job: Callable[[], Awaitable[None]]) -> trio.Event:
        """Run `job` once at a time per `key` in the nursery; the event says it ended."""
        done = self._running.get(key)
        if done is not None:
            return done
        done = self._running[key] = trio.Event()
        nursery = self._nursery
        assert nursery is not None

        async def run() -> None:
            try:
                await job()
            except _LOST:
                pass  # leadership moved: the new leader takes over
            except RequestError as exc:
                log.info("transaction task stopped", extra={"fields": {
                    "task": repr(key), "error": str(exc)}})
            except Exception:
                log.exception("transaction task %r failed", key)
            finally:
                del self._running[key]
                self._delivered.pop(key, None)
                done.set()

        nursery.start_soon(run)
        return done

    async def finish(self, gid: str, tid: str) -> None:
        """Send the markers of `tid`'s decided transactions (coordinator `gid`, led here:
        the current one, and one of an older epoch it fenced) and log them complete;
        returns when done, or when that cannot go on here."""
        if self._nursery is None:
            return
        g = self.groups.get(gid)
        if g is None or not g.is_leader:
            return
        for t in coordinator(self.groups.states[gid]).unfinished():
            if t.tid == tid:
                await self._hurry_job(gid, t.tid, t.epoch, t.n).wait()

    async def markers_applied(self, gid: str, tid: str, epoch: int, n: int) -> bool:
        """Drive the markers of transaction (epoch, n) of `tid` (decided, coordinator
        `gid` led here); True once every participant applied its marker, False when that
        cannot be known here (leadership lost, or the markers were done before)."""
        if self._nursery is None or self._unfinished(gid, tid, epoch, n) is None:
            return False
        key = ("finish", gid, tid, epoch, n)
        delivered = self._delivered.setdefault(key, trio.Event())
        done = self._finish_job(gid, tid, epoch, n)
        async with trio.open_nursery() as nursery:
            async def first_of(event: trio.Event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(first_of, delivered)
            nursery.start_soon(first_of, done)
        return delivered.is_set()

    def send_markers(self, gid: str, tid: str, epoch: int, n: int) -> None:
        """Start sending the markers of decided transaction (epoch, n) of `tid` now,
        without waiting for them (TX_END with wait=false)."""
        if self._nursery is not None and self._unfinished(gid, tid, epoch, n) is not None:
            self._finish_job(gid, tid, epoch, n)

    def _finish_job(self, gid: str, tid: str, epoch: int, n: int) -> trio.Event:
        return self._spawn(("finish", gid, tid, epoch, n),
                           partial(self._complete, gid, tid, epoch, n))

    def wake(self) -> None:
        """Tick now in every group led here."""
        self._wake.set()
        self._wake = trio.Event()

    def tick(self, gid: str) -> None:
        """Start whatever is due in group `gid`, if this node leads it."""
        now = now_ms()
        if len(self._immunity) > IMMUNITY_CACHE:  # halves decided while immune: read again
            self._immunity.clear()
        g = self.groups.get(gid)
        if g is None or not g.is_leader:
            return
        state = self.groups.states[gid]
        coord = coordinator(state)
        for txn in coord.unfinished():
            self._finish_job(gid, txn.tid, txn.epoch, txn.n)
        for txn in coord.timed_out(now):
            key = (gid, txn.tid, txn.epoch, txn.n)
            self._spawn(("timeout", *key), partial(self._time_out, *key))
        part = participant(state)
        waits = self._orphan_wait.setdefault(gid, {})
        seen: set[tuple[str, int, int]] = set()  # orphans still due here
        # only what is due: a tick costs O(due log n), not a sort of every transaction
        for tid, epoch, n, prepared_ms, _first in part.kafka_due(
                now - self.config.tx_orphan_ms):
            seen.add((tid, epoch, n))
            if now < waits.get((tid, epoch, n), (0, 0))[0]:
                continue  # asked a moment ago: not again at every tick
            self._spawn(("orphan", gid, tid, epoch, n),
                        partial(self._orphan, gid, tid, epoch, n, prepared_ms))
        if len(seen) != len(waits):  # resolved meanwhile
            self._orphan_wait[gid] = {k: v for k, v in waits.items() if k in seen}
        for half in part.halves_due(now, self.config.tx_check_first_ms,
                                    self.config.tx_check_interval_ms):
            self._spawn(("check", gid, half.txid), partial(self._check, gid, half.txid))
        idle_since = now - self.config.tx_id_expiration_ms
        for kind, idle in ((TxExpire, coord.idle_ids), (TxForgetFences, part.idle_fences)):
            if (kind.op, gid) not in self._running and (tids := idle(idle_since)):
                self._spawn((kind.op, gid), partial(self._forget_idle, gid, kind, tids, now))

    # ------------------------------------------------------------------ coordinator

    def _unfinished(self, gid: str, tid: str, epoch: int, n: int) -> Any:
        """Transaction (epoch, n) of `tid` if this node leads coordinator `gid` and its
        markers are still to be written, else None."""
        g = self.groups.get(gid)
        if g is None or not g.is_leader:
            return None
        for t in coordinator(self.groups.states[gid]).unfinished():
            if (t.tid, t.epoch, t.n) == (tid, epoch, n):
                return t
        return None

    async def _complete(self, gid: str, tid: str, epoch: int, n: int) -> None:
        if not await self._after_earlier(gid, tid, epoch, n):
            return
        txn = self._unfinished(gid, tid, epoch, n)
        if txn is None:
            return
        cur = coordinator(self.groups.states[gid]).txn(tid)
        # a transaction fenced by a newer epoch carries that epoch to its participants
        fence = max(epoch, cur.epoch if cur is not None else epoch)
        marker: Marker = (tid, epoch, n, txn.state == "prepare_commit", fence)

        def still() -> bool:
            return self._unfinished(gid, tid, epoch, n) is not None

        # the coordinator's own group has the marker already when its tx_end applied it
        here = participant(self.groups.states[gid]).decision(kafka_key(tid, epoch, n))
        async with trio.open_nursery() as nursery:
            for p in txn.participants:
                if p != gid or here is None:
                    nursery.start_soon(self._deliver, p, marker, still)
        if not still():
            return
        key = ("finish", gid, tid, epoch, n)
        self._delivered.setdefault(key, trio.Event()).set()
        # a producer running transactions back to back starts its next one at once, and
        # that tx_add completes this one (`TxService.add`): wait a moment for it before
        # logging tx_complete, unless someone waits for this job (`_hurry`)
        hurry = self._hurry.setdefault(key, trio.Event())
        if txn.reason != "client":
            hurry.set()  # aborted by the coordinator itself: no next one is on its way
        try:
            with trio.move_on_after(COMPLETE_GRACE_S):
                async with trio.open_nursery() as nursery:
                    async def done_elsewhere() -> None:
                        g = self.groups[gid]
                        while still():
                            await g.wait_applied_change()
                        nursery.cancel_scope.cancel()

                    async def hurried() -> None:
                        await hurry.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(done_elsewhere)
                    nursery.start_soon(hurried)
        finally:
            self._hurry.pop(key, None)
        if not still():
            return
        await self.lead.propose(self.groups[gid], TxComplete(tid=tid, epoch=epoch, n=n))

    def delivered(self, gid: str, tid: str, epoch: int, n: int) -> bool:
        """Whether every participant applied the marker of decided transaction (epoch, n)
        of `tid` (coordinator `gid`, led here), as far as this leader saw."""
        event = self._delivered.get(("finish", gid, tid, epoch, n))
        return event is not None and event.is_set()

    def _hurry_job(self, gid: str, tid: str, epoch: int, n: int) -> trio.Event:
        """The finish job of (epoch, n) of `tid`, told someone waits for its end: it logs
        tx_complete now rather than wait for the next transaction to complete it."""
        event = self._hurry.get(("finish", gid, tid, epoch, n))
        if event is not None:
            event.set()
        return self._finish_job(gid, tid, epoch, n)

    async def _after_earlier(self, gid: str, tid: str, epoch: int, n: int) -> bool:
        """Wait until no earlier transaction of `tid` has markers left to write; False if
        one is left when its job ended (leadership moved, or it failed: the next tick
        starts them again, in order).

        A producer's transactions enter every queue in their order, as Kafka keeps a
        producer's order within a partition: the markers of (epoch, n) never go before
        those of an earlier transaction of the same id. Without this wait, a new
        coordinator leader that finds transactions n and n+1 both decided starts both
        marker jobs in one tick, and trio's scheduling order (random on purpose) may put
        n+1's markers first in a participant's outbox, so its records enter first."""
        while True:
            earlier = [t for t in coordinator(self.lead.led_state(gid)).unfinished()
                       if t.tid == tid and (t.epoch, t.n) < (epoch, n)]
            if not earlier:
                return True
            first = min(earlier, key=lambda t: (t.epoch, t.n))
            await self._hurry_job(gid, tid, first.epoch, first.n).wait()
            if self._unfinished(gid, tid, first.epoch, first.n) is not None:
                return False

    async def _deliver(self, pgid: str, marker: Marker, still: Callable[[], bool]) -> None:
        """Get the marker applied in participant `pgid`, retrying until it is (or this
        node stops leading the coordinator, or the markers are all written). Markers
        for one group wait in its outbox while a request to it is in flight, and the
        next request takes them all: one entry there for many transactions."""
        item = _Outgoing(marker, still)
        self._outbox.setdefault(pgid, []).append(item)
        if pgid not in self._senders:
            assert self._nursery is not None
            self._senders.add(pgid)
            self._nursery.start_soon(self._send_markers, pgid)
        await item.done.wait()

    async def _send_markers(self, pgid: str) -> None:
        """Empty `pgid`'s outbox, a request (up to MAX_MARKERS markers) at a time."""
        backoff = BACKOFF_MIN_S
        box = self._outbox.setdefault(pgid, [])
        try:
            while box:
                taken, box[:MAX_MARKERS] = box[:MAX_MARKERS], []
                batch = []
                for item in taken:
                    if item.still():
                        batch.append(item)
                    else:  # nothing more to do here for it (finished, or not leading)
                        item.done.set()
                if not batch:
                    continue
                if len(batch) == 1:
                    req = TxMarkerRequest.single(pgid, batch[0].marker)
                else:
                    req = TxMarkerRequest(g=pgid, markers=tuple(item.marker for item in batch))
                try:
                    await self.call_group(pgid, req)
                except RequestError as exc:
                    if exc.code not in (Code.NOT_LEADER, Code.TIMEOUT, Code.UNAVAILABLE,
                                        Code.CONNECTION_LOST, Code.BUSY,
                                        Code.PROPOSAL_DROPPED):
                        log.warning("transaction markers refused", extra={"fields": {
                            "group": pgid, "tids": sorted({i.marker[0] for i in batch}),
                            "error": str(exc)}})
                    box[:0] = batch  # again, first, with whatever came meanwhile
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    continue
                backoff = BACKOFF_MIN_S
                for item in batch:
                    item.done.set()
        finally:
            self._senders.discard(pgid)
            for item in box:  # stopped (the node shuts down): nobody waits in vain
                item.done.set()
            box.clear()

    async def _time_out(self, gid: str, tid: str, epoch: int, n: int) -> None:
        txn = coordinator(self.lead.led_state(gid)).txn(tid)
        if txn is None or txn.state != "ongoing" or (txn.epoch, txn.n) != (epoch, n):
            return
        try:
            await self.lead.propose(self.groups[gid], TxEnd(
                tid=tid, epoch=epoch, n=n, commit=False, ts=now_ms(), reason="timeout",
                mark_here=self.config.tx_records_v2))
        except RequestError as exc:  # decided meanwhile by its client
            log.info("timeout abort refused", extra={"fields": {"tid": tid,
                                                                "error": exc.message}})
            return
        log.info("transaction timed out: aborted", extra={"fields": {
            "tid": tid, "epoch": epoch, "n": n}})
        await self._complete(gid, tid, epoch, n)

    async def _forget_idle(self, gid: str, kind: type[IdleIds], tids: list[str],
                           now: int) -> None:
        """Log that `tids`, idle in `gid` since `tx_id_expiration_ms` before `now`, are
        forgotten (`kind`: TxExpire or TxForgetFences); an id used meanwhile stays."""
        self.lead.led_state(gid)
        result = await self.lead.propose(self.groups[gid], kind(
            tids=tuple(tids), ts=now, after_ms=self.config.tx_id_expiration_ms))
        log.info("idle transactional ids forgotten", extra={"fields": {
            "group": gid, "record": kind.op, "ids": result.applied}})

    # ------------------------------------------------------------------ peers

    def _guess_leader(self, gid: str) -> int | None:
        g = self.groups.get(gid)
        if g is not None and g.is_open and g.leader is not None:
            return g.leader
        hint = self._leader_hint.get(gid)
        if hint is not None:
            return hint
        for gc in self.config.groups:
            if gc.id == gid:
                return gc.preferred_leader or gc.replicas[0]
        return None

    def _next_guess(self, gid: str, tried: int | None) -> None:
        """No hint came: try the group's next replica of the config."""
        for gc in self.config.groups:
            if gc.id == gid:
                reps = list(gc.replicas)
                i = reps.index(tried) if tried in reps else -1
                self._leader_hint[gid] = reps[(i + 1) % len(reps)]

    async def call_group(self, gid: str, req: PeerRequest) -> dict[str, Any]:
        """Send `req` to `gid`'s leader: handled here when this node leads it, else over
        peer RPC; the answer's header. One attempt; a NOT_LEADER answer updates where
        the next goes."""
        g = self.groups.get(gid)
        if g is not None and g.is_leader:
            return await self._local(gid, req)
        node = self._guess_leader(gid)
        if node is None or node == self.host.node_id:
            raise RequestError(Code.NOT_LEADER, f"no known leader of {gid}")
        try:
            frame = await self.rpc.request(node, {"op": int(req.OP), **req.header()},
                                           timeout=RPC_TIMEOUT_S)
        except RequestError as exc:
            if exc.code == Code.NOT_LEADER:
                hint = self.rpc.node_at(exc.extra.get("leader"))
                if exc.extra.get("ready") is False:
                    self._leader_hint[gid] = node  # leads, not ready yet: ask it again
                elif hint is not None and hint != node:
                    self._leader_hint[gid] = hint
                else:
                    self._next_guess(gid, node)
            elif exc.code in (Code.UNAVAILABLE, Code.TIMEOUT, Code.CONNECTION_LOST,
                              Code.UNKNOWN_GROUP):
                self._next_guess(gid, node)
            raise
        self._leader_hint[gid] = node
        return frame.header

    async def register(self, tid: str, epoch: int, n: int, gid: str) -> None:
        """Have `tid`'s coordinator add participant `gid` to transaction (epoch, n)
        (TX_ADD, one attempt); its refusal (TX_FENCED, TX_UNKNOWN, ...) as RequestError."""
        cg = coordinator_group(tid, self.group_ids)
        await self.call_group(cg, TxAddRequest(g=cg, tid=tid, epoch=epoch, n=n, groups=(gid,)))

    async def _local(self, gid: str, req: PeerRequest) -> dict[str, Any]:
        """`req` handled here, this node leading `gid`: what its door would answer."""
        g = self.groups[gid]
        try:
            if isinstance(req, TxMarkerRequest) and req.markers is not None:
                r = await self.tx.markers(g, req.markers)
                return {"code": 0, "dup": r.dup}
            if isinstance(req, TxMarkerRequest):
                r = await self.tx.marker(g, *req.decisions()[0])
                return {"code": 0, "dup": r.dup}
            if isinstance(req, TxStatusRequest):
                return {"code": 0, **(await self.tx.status(g, req.tid)).header()}
            await self.tx.add(g, req.tid, req.epoch, req.n, req.groups)
            return {"code": 0}
        except _LOST as exc:
            raise RequestError(Code.NOT_LEADER, str(exc) or "leadership moved") from None

    # ------------------------------------------------------------------ participant

    async def _orphan(self, gid: str, tid: str, epoch: int, n: int, prepared_ms: int) -> None:
        """Resolve prepared data of (tid, epoch, n) left without a marker. Unresolved
        (the coordinator says wait, or cannot be asked), it is asked again after a
        delay that doubles up to ORPHAN_RETRY_MAX_MS, not at every tick."""
        waits = self._orphan_wait.setdefault(gid, {})
        waits[tid, epoch, n] = orphan_retry(waits.get((tid, epoch, n)), now_ms())
        cg = coordinator_group(tid, self.group_ids)
        status = TxStatusAnswer.decode(await self.call_group(cg, TxStatusRequest(g=cg, tid=tid)))
        stale = now_ms() - prepared_ms > self.config.tx_timeout_max_ms
        verdict = orphan_verdict(epoch, n, status, stale=stale)
        if verdict is None:
            return
        commit, fence = verdict
        g = self.groups[gid]
        self.lead.led_state(gid)
        log.info("orphaned transaction data resolved", extra={"fields": {
            "group": gid, "tid": tid, "epoch": epoch, "n": n, "commit": commit}})
        await self.tx.marker(g, tid, epoch, n, commit, fence)

    # ------------------------------------------------------------------ check-back

    async def _immune_until(self, g: Any, half: Any) -> int:
        """Until when (ms) half message `half` is not checked: its store time plus its
        `CHECK_IMMUNITY_TIME_IN_SECONDS` property (RocketMQ's: a local transaction known
        to take longer than the first check's delay). Read once from the stored record
        and remembered while it is pending here; a value that is not a whole number of
        seconds in 0..MAX_IMMUNITY_S counts as none."""
        until = self._immunity.get(half.txid)
        if until is None:
            entry = await g.read_committed(half.index)
            msg, _ = decode_record(entry.data, half.start, topic=half.topic, queue=half.queue,
                                   offset=0, store_ms=0, msg_id=half.msg_id)
            raw = msg.properties.get(CHECK_IMMUNITY, "")
            seconds = int(raw) if raw.isdigit() and int(raw) <= MAX_IMMUNITY_S else 0
            until = self._immunity[half.txid] = half.prepared_ms + 1000 * seconds
        return until

    async def _check(self, gid: str, txid: str) -> None:
        part = participant(self.lead.led_state(gid))
        half = part.half(txid)
        if half is None:
            self._immunity.pop(txid, None)
            return
        g = self.groups[gid]
        if half.checks == 0 and now_ms() < await self._immune_until(g, half):
            return  # a long local transaction: not asked yet
        self._immunity.pop(txid, None)
        if half.checks >= self.config.tx_check_max:
            log.info("half message expired: rolled back", extra={"fields": {
                "group": gid, "txid": txid, "checks": half.checks}})
            await self.tx.half_end(g, txid, False, "expired", "")
            return
        await self.lead.propose(g, HalfChecked(txid=txid, ts=now_ms()))
        half = participant(self.lead.led_state(gid)).half(txid)
        if half is None:  # decided meanwhile: never check a decided transaction
            return
        member = self.tx.producers.pick(half.producer_group, time.monotonic())
        if member is None:
            return
        check = TxCheckRequest(g=gid, txid=txid, topic=half.topic, queue=half.queue,
                               msg_id=half.msg_id, pg=half.producer_group, checks=half.checks)
        try:
            frame = await member.caller.request(check.OP, check.header(),
                                                timeout=CHECK_TIMEOUT_S)
        except CallerGone:
            self.tx.producers.forget(half.producer_group, member.client)
            return
        except RequestError as exc:
            log.info("check-back unanswered", extra={"fields": {
                "txid": txid, "client": member.client, "error": exc.message}})
            return
        try:
            answer = TxCheckAnswer.decode(frame.header).state
        except RequestError as exc:
            log.info("check-back answer malformed", extra={"fields": {
                "txid": txid, "client": member.client, "error": exc.message}})
            return
        if answer not in ("commit", "rollback"):
            return
        try:  # the answer decides as its connection's user, checked now like a HALF_END
            self.host.guard.check_answer(member.caller, Op.HALF_END, {
                "g": gid, "txid": txid, "commit": answer == "commit", "source": "check",
                "pg": half.producer_group})
        except RequestError as exc:
            self.tx.producers.forget(half.producer_group, member.client)
            log.info("check-back answer refused", extra={"fields": {
                "txid": txid, "client": member.client, "error": exc.message}})
            return
        try:
            await self.tx.half_end(self.groups[gid], txid, answer == "commit", "check",
                                   half.producer_group)
        except RequestError as exc:  # decided meanwhile by its producer
            log.info("check-back answer not applied", extra={"fields": {
                "txid": txid, "error": exc.message}})
