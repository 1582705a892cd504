"""The broker's transaction requests: both models' ops, answered for `BrokerService`.

Kafka's model (TX_INIT, TX_ADD, TX_OFFSETS, TX_END, TX_STATUS) talks to the group that
coordinates a transactional id (`wire.txn.coordinator_group`, over every group of the
cluster config), except TX_OFFSETS, which goes to the participant group hosting those
queues. RocketMQ's model decides a half message with HALF_END in the group holding it;
PRODUCER_HEARTBEAT registers the connection of a producer that answers check-backs
(TX_CHECK, sent by `broker.duties.transactions`). TX_MARKER is the coordinator's decision, sent
node to node only. TX_LIST shows what the groups this node leads hold.

As everywhere in the service, a request is validated fully before anything is
proposed, so bad input gets a precise error and never reaches the log: its header is
decoded once, by its type in `wire.requests.transactions`, and what depends on the
cluster (its groups, the coordinator of an id, the longest timeout) is checked here; the
state machine (`broker.state.parts.txcoord`, `broker.state.parts.txpart`) then refuses
what depends on the state (fenced epochs, decided transactions) as a Refused result that
changed nothing.

TX_END is answered once the decision is committed and every participant applied its
marker (or, when the request says `wait: false`, once the decision is committed: the
outcome is fixed, the messages become visible a marker round later) (driven at once by `broker.duties.transactions.TxTasks`, not at the next tick; the
transaction is logged complete right after, and a TX_ADD or TX_INIT of the same id
waits for that), or after `END_WAIT_S` with the decision committed and the markers still
going out: the coordinator's leader finishes them whatever happens to this request.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Set
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio

from broker.doors.producer_groups import ProducerRegistry
from broker.runtime.leading import checked
from broker.state.parts.base import ControlResult, pack
from broker.state.parts.txcoord import TxAdd, TxCoordinator, TxEnd, TxInit
from broker.state.parts.txpart import (
    HalfEnd,
    TxMarker,
    TxMarkers,
    TxOffsets,
    TxParticipant,
)
from broker.state.statemachine import BrokerState
from raftlog.runtime import GroupRuntime
from transport.framing import Caller
from wire.protocol import MAX_HEADER, Code, Op, RequestError, ok_header
from wire.requests.transactions import (
    HalfEndAnswer,
    HalfEndRequest,
    Marker,
    ProducerHeartbeatAnswer,
    ProducerHeartbeatRequest,
    TxAddAnswer,
    TxAddRequest,
    TxEndAnswer,
    TxEndRequest,
    TxInitAnswer,
    TxInitRequest,
    TxListAnswer,
    TxListRequest,
    TxMarkerAnswer,
    TxMarkerRequest,
    TxOffsetsAnswer,
    TxOffsetsRequest,
    TxStatusAnswer,
    TxStatusRequest,
)
from wire.txn import coordinator_group

if TYPE_CHECKING:
    from broker.doors.service import BrokerHost
    from broker.runtime.groups import GroupRegistry
    from broker.runtime.leading import GroupLead

__all__ = [
    "END_WAIT_S",
    "MAX_PARTICIPANTS",
    "Finisher",
    "TxService",
    "coordinator",
    "participant",
]

log = logging.getLogger("raftmq.tx")

CRASH_BEFORE_ANSWER_EXIT = 70  # as broker.doors.service's (that module imports this one)
END_WAIT_S = 5.0  # TX_END / TX_INIT wait this long for markers before answering prepare_*
MAX_PARTICIPANTS = 64
REGISTERED_KEPT = 100_000  # (transaction, group) registrations a node remembers
# what a coordinator answers TX_ADD with that the client must see as is
_REGISTER_REFUSALS = (Code.TX_FENCED, Code.TX_UNKNOWN, Code.TX_DECIDED, Code.TX_LIMIT,
                      Code.UNKNOWN_GROUP, Code.MALFORMED)
# a TX_LIST answer's rows travel in its header, which a reader refuses over MAX_HEADER:
# past this size the rows of each list are cut to fewer (and the answer says `truncated`)
LIST_HEADER_BUDGET = MAX_HEADER // 2
UNFINISHED = ("prepare_commit", "prepare_abort")

Response = tuple[dict[str, Any], bytes]
Handler = Callable[[Caller, dict[str, Any], bytes], Awaitable[Response]]


class Finisher(Protocol):
    """What drives a decided transaction's markers (`broker.duties.transactions.TxTasks`)."""

    async def finish(self, gid: str, tid: str) -> None: ...

    async def markers_applied(self, gid: str, tid: str, epoch: int, n: int) -> bool: ...

    def send_markers(self, gid: str, tid: str, epoch: int, n: int) -> None: ...

    def delivered(self, gid: str, tid: str, epoch: int, n: int) -> bool: ...

    async def register(self, tid: str, epoch: int, n: int, gid: str) -> None: ...


def coordinator(state: BrokerState) -> TxCoordinator:
    return state.part(TxCoordinator)


def participant(state: BrokerState) -> TxParticipant:
    return state.part(TxParticipant)


def now_ms() -> int:
    return int(time.time() * 1000)


def row(obj: Any, **extra: Any) -> dict[str, Any]:
    """A state-machine view (dataclass or named tuple) as a map for the wire."""
    if is_dataclass(obj) and not isinstance(obj, type):
        d = asdict(obj)
    elif hasattr(obj, "_asdict"):
        d = obj._asdict()
    else:
        d = dict(obj)
    out = {**extra}
    for k, v in d.items():
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


class _Adding:
    """A TX_ADD of one transaction on its way into the coordinator's log: `groups` it
    will name (growing while it is `gathering`, i.e. waiting for its barrier); `done` is
    set once it is applied, refused or lost."""

    __slots__ = ("done", "gathering", "groups")

    def __init__(self, groups: set[str]) -> None:
        self.groups = groups
        self.gathering = True
        self.done = trio.Event()


class TxService:
    """The transaction handlers of one node's `BrokerService`."""

    def __init__(self, lead: GroupLead, groups: GroupRegistry, node: BrokerHost) -> None:
        self.lead = lead
        self.groups = groups
        self.node = node
        self.producers = ProducerRegistry()
        self.finisher: Finisher | None = None  # the node's `TxTasks`, once running
        # (tid, epoch, n, group) this node registered with the coordinator (`register`),
        # least recently used first, at most REGISTERED_KEPT
        self._registered: OrderedDict[tuple[str, int, int, str], None] = OrderedDict()
        # TX_ADDs being logged here, by (coordinator, tid, epoch, n), for `add` to join
        self._adds: dict[tuple[str, str, int, int], list[_Adding]] = {}

    def handlers(self) -> dict[int, Handler]:
        return {
            Op.TX_INIT: self._init,
            Op.TX_ADD: self._add,
            Op.TX_OFFSETS: self._offsets,
            Op.TX_END: self._end,
            Op.TX_MARKER: self._marker,
            Op.TX_STATUS: self._status,
            Op.HALF_END: self._half_end,
            Op.TX_LIST: self._list,
            Op.PRODUCER_HEARTBEAT: self._producer_heartbeat,
        }

    # ------------------------------------------------------------------ helpers

    @property
    def group_ids(self) -> list[str]:
        """Every group of the cluster config: what the coordinator hash is taken over."""
        return [gc.id for gc in self.node.config.groups]

    def _known_group(self, gid: str) -> str:
        """`gid` (a valid group name: the request type checked it), a group of the
        cluster's, or UNKNOWN_GROUP."""
        if gid not in self.group_ids:
            raise RequestError(Code.UNKNOWN_GROUP, f"no group {gid!r} in the cluster "
                               f"(groups: {sorted(self.group_ids)})")
        return gid

    def _participants(self, groups: tuple[str, ...]) -> list[str]:
        """A transaction's participant groups as a request names them: known, at most
        MAX_PARTICIPANTS (TX_LIMIT), sorted."""
        known = sorted({self._known_group(x) for x in groups})
        if len(known) > MAX_PARTICIPANTS:
            raise RequestError(Code.TX_LIMIT, f"a transaction spans at most {MAX_PARTICIPANTS} "
                               f"groups, not {len(known)}")
        return known

    def _coordinating(self, gid: str, tid: str) -> GroupRuntime:
        """Group `gid` of the request, checked to coordinate `tid` (and led here)."""
        g = self.lead.group(gid)
        want = coordinator_group(tid, self.group_ids)
        if g.group_id != want:
            raise RequestError(Code.NOT_COORDINATOR, f"group {g.group_id} does not coordinate "
                               f"transactional id {tid!r}: group {want} does",
                               coordinator=want)
        self.lead.leading(g)
        return g

    async def _finish(self, gid: str, tid: str) -> None:
        """Drive `tid`'s markers from its coordinator `gid`, for at most END_WAIT_S."""
        if self.finisher is None:
            return
        with trio.move_on_after(END_WAIT_S):
            await self.finisher.finish(gid, tid)

    async def register(self, g: GroupRuntime, tid: str, epoch: int, n: int) -> None:
        """Make participant `g` (led here) part of transaction (epoch, n) of `tid` at its
        coordinator (TX_ADD, sent by this node) before data of it is prepared here.

        A batch header or TX_OFFSETS is the client's word; the coordinator's answer
        decides: an epoch it never granted is refused (TX_UNKNOWN), an older one
        (TX_FENCED), a decided transaction (TX_DECIDED). Registered data always gets its
        decision's marker, so a commit is never torn by an orphan check (a client need
        not name the group in TX_END) and no data hangs waiting for a TX_ADD that never
        comes: the coordinator knows the transaction and aborts it at its timeout. Done
        once per transaction and group on this node; UNAVAILABLE (retriable) when the
        coordinator cannot be asked."""
        key = (tid, epoch, n, g.group_id)
        if key in self._registered:
            self._registered.move_to_end(key)
            return
        if self.finisher is None:
            raise RequestError(Code.UNAVAILABLE, "this node cannot reach transaction "
                               "coordinators yet; retry")
        try:
            await self.finisher.register(tid, epoch, n, g.group_id)
        except RequestError as exc:
            if exc.code in _REGISTER_REFUSALS:
                raise
            raise RequestError(Code.UNAVAILABLE, f"could not register group {g.group_id} "
                               f"with the coordinator of transactional id {tid!r} "
                               f"({exc.code.name}: {exc.message}); retry") from None
        self._registered[key] = None
        while len(self._registered) > REGISTERED_KEPT:
            self._registered.popitem(last=False)
        self.lead.leading(g)

    # ------------------------------------------------------------------ Kafka's model

    async def _init(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = TxInitRequest.decode(h)
        tid, timeout_ms = req.tid, req.timeout_ms
        limit = self.node.config.tx_timeout_max_ms
        if timeout_ms > limit:
            raise RequestError(Code.TX_LIMIT, f"timeout_ms {timeout_ms} is over this cluster's "
                               f"maximum transaction timeout ({limit} ms, tx_timeout_max_ms)")
        g = self._coordinating(req.g, tid)
        gid = g.group_id
        await self._finish(gid, tid)  # a previous transaction still completing goes first
        await self.lead.propose(g, checked(TxInit, tid=tid, timeout_ms=timeout_ms,
                                           ts=now_ms()))
        txn = coordinator(self.lead.leading(g)).txn(tid)
        assert txn is not None
        epoch = txn.epoch
        await self._finish(gid, tid)  # the abort of a transaction the new epoch fenced
        return ok_header(0, **TxInitAnswer(epoch=epoch).header()), b""

    async def _add(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = TxAddRequest.decode(h)
        groups = self._participants(req.groups)
        g = self._coordinating(req.g, req.tid)
        await self.add(g, req.tid, req.epoch, req.n, groups)
        return ok_header(0, **TxAddAnswer().header()), b""

    async def add(self, g: GroupRuntime, tid: str, epoch: int, n: int,
                  groups: list[str] | tuple[str, ...]) -> None:
        """Transaction (epoch, n) of `tid` (coordinator `g`, led here) spans `groups`
        (sorted, known): logged unless the state read after a barrier says so already (a
        participant registering the group its client registered too adds no entry).

        The client's TX_ADD and each participant's registration arrive together (they
        leave with the sends), so they share entries: one arriving while an add of the
        same transaction waits for its barrier joins it (its groups go in that entry), one
        arriving while an add that names its groups is being logged waits for it. So a
        transaction costs about one tx_add entry however many groups register. Waiting
        for a committed add is as good as a barrier: participants of an open transaction
        only grow, and the decision, whenever it comes, names every one of them."""
        key = (g.group_id, tid, epoch, n)
        wanted = frozenset(groups)
        while True:
            joined = next((a for a in self._adds.get(key, ())
                           if a.gathering or wanted <= a.groups), None)
            if joined is None:
                break
            joined.groups |= wanted
            await joined.done.wait()
            if self._covered(g, tid, epoch, n, wanted):
                return
            # refused or lost: this request finds out for itself, as if it came alone
        mine = _Adding(set(wanted))
        self._adds.setdefault(key, []).append(mine)
        try:
            await self.lead.read_barrier(g)
            coord = coordinator(self.lead.leading(g))
            txn = coord.txn(tid)
            if self._covered(g, tid, epoch, n, mine.groups):
                return  # participants of an open transaction only grow: true until decided
            if txn is not None and txn.state in UNFINISHED and tid in coord.completing:
                # two earlier transactions still completing: the older must finish first
                # (one previous transaction may complete while the next one runs)
                await self._finish(g.group_id, tid)
            mine.gathering = False
            txn = coordinator(self.lead.leading(g)).txn(tid)
            # the previous transaction's markers all applied (its client waited for that):
            # this entry completes it, and the duty logs no tx_complete of its own
            completes = (self.node.config.tx_records_v2
                         and txn is not None and txn.state in UNFINISHED
                         and (txn.epoch, txn.n) == (epoch, n - 1)
                         and self.finisher is not None
                         and self.finisher.delivered(g.group_id, tid, epoch, n - 1))
            await self.lead.propose(g, checked(TxAdd, tid=tid, epoch=epoch, n=n,
                                               groups=tuple(sorted(mine.groups)),
                                               ts=now_ms(), completes=completes))
        finally:
            adds = self._adds.get(key, [])
            adds.remove(mine)
            if not adds:
                self._adds.pop(key, None)
            mine.done.set()

    def _covered(self, g: GroupRuntime, tid: str, epoch: int, n: int,
                 groups: Set[str]) -> bool:
        """Whether `g`'s state has `groups` in open transaction (epoch, n) of `tid`."""
        txn = coordinator(self.lead.leading(g)).txn(tid)
        return (txn is not None and txn.state == "ongoing"
                and (txn.epoch, txn.n) == (epoch, n) and groups <= set(txn.participants))

    async def _offsets(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = TxOffsetsRequest.decode(h)
        tid, epoch, n, cg = req.tid, req.epoch, req.n, req.cg
        g = self.lead.group(req.g)
        state = self.lead.leading(g)
        offsets: list[tuple[str, int, int]] = []
        confirmed = False
        for topic, queue, offset in req.offsets:
            if not state.hosts(topic, queue) and not confirmed:
                # a deposed leader that does not know it yet must not refuse a queue its
                # successor created: confirmed (ReadIndex) before refusing
                await g.read_barrier()
                confirmed, state = True, self.lead.leading(g)
            if state.topic(topic) is None:
                raise RequestError(Code.UNKNOWN_TOPIC, f"topic {topic!r} is not in group "
                                   f"{g.group_id}: send its offsets to the group hosting it")
            if not state.hosts(topic, queue):
                raise RequestError(Code.UNKNOWN_QUEUE, f"queue {queue} of {topic!r} is not "
                                   f"hosted by group {g.group_id}: send its offsets to the "
                                   "group hosting it")
            offsets.append((topic, queue, offset))
        await self.lead.check_commit_bounds(g, offsets)
        await self.register(g, tid, epoch, n)
        await self.lead.propose(g, checked(TxOffsets, tid=tid, epoch=epoch, n=n, cg=cg,
                                           offsets=tuple(offsets), ts=now_ms()))
        return ok_header(0, **TxOffsetsAnswer().header()), b""

    async def _end(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = TxEndRequest.decode(h)
        tid, epoch, n, commit = req.tid, req.epoch, req.n, req.commit
        # wait=false: answer once decided (prepare_*), the markers going out meanwhile
        wait = req.wait
        # the groups the client sent to: participants whether or not a TX_ADD named them
        groups = self._participants(req.groups)
        g = self._coordinating(req.g, tid)
        result = await self.lead.propose(g, checked(
            TxEnd, tid=tid, epoch=epoch, n=n, commit=commit, ts=now_ms(), reason="client",
            groups=tuple(groups), mark_here=self.node.config.tx_records_v2))
        if self.node.crash_before_answer and h.get("test_exit") is True:  # not the op's field
            # Deliberately (tests only, on request): die once the decision is committed,
            # before any marker is sent, so a new leader must finish the transaction.
            log.critical("crash-before-answer: exiting between a decision and its markers")
            os._exit(CRASH_BEFORE_ANSWER_EXIT)
        state = self._end_state(g, tid, epoch, n, commit)
        if state in UNFINISHED and self.finisher is not None and not wait:
            self.finisher.send_markers(g.group_id, tid, epoch, n)
        elif state in UNFINISHED and self.finisher is not None:
            # answered once every participant applied its marker; logging the transaction
            # complete goes on meanwhile (the next TX_ADD or TX_INIT waits for it)
            applied = False
            with trio.move_on_after(END_WAIT_S):
                applied = await self.finisher.markers_applied(g.group_id, tid, epoch, n)
            state = self._end_state(g, tid, epoch, n, commit)
            if applied and state in UNFINISHED:
                state = "complete_commit" if commit else "complete_abort"
        return ok_header(0, **TxEndAnswer(state=state, dup=result.dup).header()), b""

    def _end_state(self, g: GroupRuntime, tid: str, epoch: int, n: int, commit: bool) -> str:
        """Where transaction (epoch, n) of `tid` stands after its decision `commit`."""
        txn = coordinator(self.lead.leading(g)).find(tid, epoch, n)
        if txn is not None:
            return str(txn.state)
        # moved on since (a new transaction began): this one was completed
        return "complete_commit" if commit else "complete_abort"

    async def _marker(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = TxMarkerRequest.decode(h)
        g = self.lead.group(req.g)
        self.lead.leading(g)
        if req.markers is not None:  # several transactions' markers for this group: one entry
            result = await self.markers(g, req.markers)
        else:
            result = await self.marker(g, *req.decisions()[0])
        return ok_header(0, **TxMarkerAnswer(dup=result.dup).header()), b""

    async def markers(self, g: GroupRuntime, markers: tuple[Marker, ...]) -> ControlResult:
        """Apply several decisions ([tid, epoch, n, commit, fence] each) in participant
        `g` (led here) as one entry."""
        return await self.lead.propose(g, checked(
            TxMarkers, markers=tuple(checked(TxMarker, *m) for m in markers), ts=now_ms()))

    async def marker(self, g: GroupRuntime, tid: str, epoch: int, n: int, commit: bool,
                     fence: int) -> ControlResult:
        """Apply a coordinator's decision in participant `g` (led here)."""
        return await self.lead.propose(g, checked(
            TxMarker, tid=tid, epoch=epoch, n=n, commit=commit, fence=fence, ts=now_ms()))

    async def _status(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = TxStatusRequest.decode(h)
        g = self._coordinating(req.g, req.tid)
        return ok_header(0, **(await self.status(g, req.tid)).header()), b""

    async def status(self, g: GroupRuntime, tid: str) -> TxStatusAnswer:
        """`tid` as its coordinator `g` (led here) knows it, after a read barrier: a
        participant resolving an orphan must not act on a deposed leader's view."""
        await self.lead.read_barrier(g)
        coord = coordinator(self.lead.leading(g))
        txn = coord.txn(tid)
        if txn is None:
            return TxStatusAnswer(epoch=-1, n=-1, state="empty", participants=(),
                                  timeout_ms=0, unfinished=())
        # earlier transactions still writing their markers: a participant holding their
        # data must wait for those markers, not take the moved-on id for an abort
        earlier = tuple((t.epoch, t.n, str(t.state)) for t in (
            coord.completing.get(tid), coord.fenced.get(tid)) if t is not None)
        state = str(txn.state)
        if (state in UNFINISHED and self.finisher is not None
                and self.finisher.delivered(g.group_id, tid, txn.epoch, txn.n)):
            # every marker applied (as TX_END answered): complete, whether or not the
            # entry saying so (the next transaction's tx_add, or tx_complete) is in yet
            state = "complete_commit" if txn.commit else "complete_abort"
        return TxStatusAnswer(epoch=txn.epoch, n=txn.n, state=state,
                              participants=tuple(txn.participants),
                              timeout_ms=txn.timeout_ms, unfinished=earlier)

    # ------------------------------------------------------------------ RocketMQ's model

    async def _half_end(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = HalfEndRequest.decode(h)
        g = self.lead.group(req.g)
        self.lead.leading(g)
        result = await self.half_end(g, req.txid, req.commit, req.source, req.pg)
        return ok_header(0, **HalfEndAnswer(dup=result.dup).header()), b""

    async def half_end(self, g: GroupRuntime, txid: str, commit: bool, source: str,
                       pg: str) -> ControlResult:
        return await self.lead.propose(g, checked(
            HalfEnd, txid=txid, commit=commit, source=source, producer_group=pg))

    async def _producer_heartbeat(self, caller: Caller, h: dict[str, Any],
                                  _body: bytes) -> Response:
        req = ProducerHeartbeatRequest.decode(h)
        self.producers.heartbeat(req.pg, req.client, caller, req.ttl_ms, time.monotonic())
        return ok_header(0, **ProducerHeartbeatAnswer().header()), b""

    # ------------------------------------------------------------------ both

    async def _list(self, _caller: Caller, h: dict[str, Any], _body: bytes) -> Response:
        req = TxListRequest.decode(h)
        only = self._known_group(req.g) if req.g is not None else None
        led: list[str] = []
        for gid, g in list(self.groups.items()):
            if (only is not None and gid != only) or not g.is_leader:
                continue
            try:
                await g.read_barrier()
            except Exception:  # noqa: BLE001 - NotLeader: another node answers for it
                continue
            led.append(gid)
        listing = tx_listing([(gid, self.groups.states[gid]) for gid in led], req.tx, req.limit)
        answer = TxListAnswer(
            led=tuple(listing["led"]), halves=tuple(listing["halves"]),
            prepared=tuple(listing["prepared"]), txns=tuple(listing["txns"]),
            decided=tuple(listing["decided"]), done=tuple(listing["done"]),
            limit=listing["limit"], truncated=listing["truncated"])
        return ok_header(0, **answer.header()), b""

    # ------------------------------------------------------------------ offsets

    def check_no_pending(self, state: BrokerState, cg: str, topic: str, queue: int) -> None:
        """TX_PENDING while a transaction holds undecided offsets of that queue for `cg`."""
        if participant(state).pending_offsets(cg, topic, queue):
            raise RequestError(Code.TX_PENDING, f"offsets of {cg} on {topic}/{queue} are part "
                               "of a transaction not decided yet; ask again shortly")


def tx_listing(states: list[tuple[str, BrokerState]], ident: str, limit: int,
               budget: int = LIST_HEADER_BUDGET) -> dict[str, Any]:
    """The fields of a TX_LIST answer about `states` (group id, state): at most `limit`
    rows per list and group, fewer (`truncated`) when that many would not fit `budget`
    bytes of header, which a reader refuses, closing the connection."""
    wanted = limit
    while True:
        out: dict[str, Any] = {"led": [gid for gid, _ in states], "halves": [],
                               "prepared": [], "txns": [], "decided": [], "done": []}
        for gid, state in states:
            _list_group(gid, state, ident, limit, out)
        size = len(pack(out))
        if size <= budget or limit == 1:
            return {**out, "limit": limit, "truncated": limit < wanted}
        limit = max(1, min(limit // 2, limit * budget // size))


def _list_group(gid: str, state: BrokerState, ident: str, limit: int,
                out: dict[str, list[Any]]) -> None:
    part, coord = participant(state), coordinator(state)
    halves = [row(v, g=gid) for v in part.pending_halves()
              if not ident or v.txid == ident]
    for h in halves:
        h.pop("start", None)  # internal: where its record lies in its entry
    out["halves"] += halves[:limit]
    # Kafka transactions' data held here undecided: what pins this group's log
    out["prepared"] += [row(v, g=gid) for v in part.prepared_kafka(ident)[:limit]]
    txns = [t for t in [*coord.txns.values(), *coord.fenced.values()]
            if t.state != "empty" and (not ident or t.tid == ident)]
    txns.sort(key=lambda t: (t.tid, t.epoch, t.n))
    out["txns"] += [row(t, g=gid) for t in txns[:limit]]
    decided: list[dict[str, Any]] = []
    for key, d in reversed(part.decided.items()):  # newest first
        if len(decided) >= limit:
            break
        if ident and key[1] != ident:
            continue
        r: dict[str, Any] = {"g": gid, "kind": "kafka" if key[0] == "k" else "half",
                             "id": key[1]}
        if key[0] == "k":
            r["epoch"], r["n"] = key[2], key[3]  # type: ignore[misc]
        decided.append({**r, **row(d)})
    out["decided"] += decided
    done = [row(d, g=gid) for d in reversed(coord.done_ring())
            if not ident or d.tid == ident]
    out["done"] += done[:limit]
