"""The Kafka-style transaction coordinator's state, kept in the coordinator group's log.

The group `wire.txn.coordinator_group` picks for a transactional id logs its
transactions here: `tx_init` (a producer starts, or restarts: epoch + 1, fencing an
ongoing transaction of the old epoch, which is aborted), `tx_add` (transaction `n`
starts, or gains participant groups), `tx_end` (THE COMMIT POINT: commit or abort is
decided; when this group holds data of the transaction too, the same entry applies its
marker here, as `TxParticipant` would apply the coordinator's `tx_marker`, unless an
earlier transaction of the id still has its marker to write here), and `tx_complete`
(every participant applied its marker; or the next `tx_add` of the id, `completes`).
The leader's tasks
read `unfinished()` to send markers and `timed_out()` (the ongoing ones past their
timeout, kept by deadline so a tick does not scan them all) to abort them; a new leader
finds the same in its log.

States of a transactional id's current transaction: "empty" (initialised, none started),
"ongoing", "prepare_commit" / "prepare_abort" (decided, markers not all applied),
"complete_commit" / "complete_abort". A transaction fenced by a later `tx_init` is kept
apart (`fenced`) until its abort markers are applied; so is a decided transaction whose
markers are still going out when the next one of the same epoch starts (`completing`: at
most one per id, so transaction n + 1 runs while n's markers and tx_complete are written;
markers name (tid, epoch, n), so they never touch n + 1). A `tx_end` may name the groups
the client sent to (`groups`): the decision's participants are their union with the
registered ones, so a group sent to before its `tx_add` applied still gets its marker. Finished transactions enter the
`done` ring of the last `DONE` for `tx list/show`.

An id idle for `tx_id_expiration_ms` (Kafka's `transactional.id.expiration.ms`: no
transaction open or completing, none begun or ended that long; 7 days by default) is
forgotten: the leader's tick proposes `tx_expire` for it, and the record applies only to
ids still idle that long at the record's time. So the memory and snapshot space of ids that
are not used again (a job that made its own ids, say) come back. The next TX_INIT of a
forgotten id gets an epoch above every epoch this part ever granted to an id it forgot
(`floor`), so a producer of the old epoch stays fenced, here and in every participant. An
"empty" state's `started_ms` is when its TX_INIT applied (0 in records from before: such
an id is never forgotten).

Every record is validated before anything changes. The test mutations (the state's
`mutations`): `no-fencing` makes an older epoch count as the current one;
`forget-epochs` starts a forgotten id at epoch 0 again (no floor).

Snapshot section, version 3 (version 2, without "floor", and 1, without "completing"
either, still load)::

    {"txns": [[tid, epoch, n, state, [participants], started_ms, timeout_ms, decided_ms,
               reason]...],                       (sorted by tid)
     "fenced": [... the same ...],               (sorted by tid)
     "completing": [... the same ...],           (sorted by tid; absent when none)
     "done": [[tid, epoch, n, commit, reason, [participants], decided_ms]...], (oldest first)
     "floor": epoch}                   (above every epoch of a forgotten id; absent when 0)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from broker.state.dueheap import DueHeap
from broker.state.parts.base import (
    ControlRecord,
    ControlResult,
    Handler,
    Part,
    Refused,
    int_field,
    name_field,
)
from broker.state.parts.txpart import (
    EXPIRE_BATCH,
    MAX_MS,
    IdleIds,
    TxMarker,
    bool_field,
    epoch_fields,
    tid_field,
)
from wire.protocol import Code, validate_group_name
from wire.txn import kafka_key

__all__ = [
    "DONE",
    "END_REASONS",
    "MAX_PARTICIPANTS",
    "MAX_TIMEOUT_MS",
    "STATES",
    "DoneTxn",
    "TxAdd",
    "TxComplete",
    "TxCoordinator",
    "TxEnd",
    "TxExpire",
    "TxInit",
    "TxnState",
]

DONE = 10_000  # finished transactions remembered
MAX_PARTICIPANTS = 64  # groups per transaction
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000  # what a record may carry; the service's limit is lower
STATES = ("empty", "ongoing", "prepare_commit", "prepare_abort", "complete_commit",
          "complete_abort")
END_REASONS = ("client", "timeout", "operator")
_DECIDED = ("prepare_commit", "prepare_abort", "complete_commit", "complete_abort")


# ---------------------------------------------------------------------- records


def _groups_field(groups: object) -> None:
    if not isinstance(groups, tuple):
        raise Refused(Code.MALFORMED, "groups must be a list of group ids")
    if len(groups) > MAX_PARTICIPANTS:
        raise Refused(Code.TX_LIMIT, f"a transaction spans at most {MAX_PARTICIPANTS} groups")
    for g in groups:
        name_field(validate_group_name, g)


@dataclass(frozen=True, slots=True)
class TxInit(ControlRecord):
    """A producer (re)starts with transactional id `tid`: its epoch goes up by one (the
    first is 0) and transactions of older epochs are fenced."""

    op: ClassVar[str] = "tx_init"
    tid: str
    timeout_ms: int
    ts: int

    def validate(self) -> None:
        tid_field("tid", self.tid)
        int_field("timeout_ms", self.timeout_ms, 1, MAX_TIMEOUT_MS)
        int_field("ts", self.ts, 0, MAX_MS)

    def to_map(self) -> dict[str, Any]:
        return {"tid": self.tid, "timeout_ms": self.timeout_ms, "ts": self.ts}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> TxInit:
        return cls(d.get("tid"), d.get("timeout_ms"), d.get("ts"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TxAdd(ControlRecord):
    """Transaction `n` of `tid` at `epoch` starts (if new) and spans `groups` too.
    `completes`: the leader saw every marker of the id's previous transaction applied,
    so a start completes it as `tx_complete` would (a producer running transactions back
    to back spends no entry on completing each)."""

    op: ClassVar[str] = "tx_add"
    tid: str
    epoch: int
    n: int
    groups: tuple[str, ...]
    ts: int
    completes: bool = False

    def validate(self) -> None:
        tid_field("tid", self.tid)
        epoch_fields(self.epoch, self.n)
        _groups_field(self.groups)
        int_field("ts", self.ts, 0, MAX_MS)
        bool_field("completes", self.completes)

    def to_map(self) -> dict[str, Any]:
        m = {"tid": self.tid, "epoch": self.epoch, "n": self.n,
             "groups": list(self.groups), "ts": self.ts}
        if self.completes:  # absent when false: the bytes of a record without it are unchanged
            m["completes"] = True
        return m

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> TxAdd:
        groups = d.get("groups")
        if isinstance(groups, list):
            groups = tuple(groups)
        return cls(d.get("tid"), d.get("epoch"), d.get("n"), groups,  # type: ignore[arg-type]
                   d.get("ts"), d.get("completes", False))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TxEnd(ControlRecord):
    """The decision on transaction `n` of `tid` at `epoch`: commit or abort, at `ts`,
    by `reason` ("client", "timeout", "operator")."""

    op: ClassVar[str] = "tx_end"
    tid: str
    epoch: int
    n: int
    commit: bool
    ts: int
    reason: str
    groups: tuple[str, ...] = ()  # groups the client sent to: participants too
    # the marker applies in this group within this entry when it is a participant (a
    # record without it, as older leaders wrote, leaves that to a tx_marker entry: a
    # log replays the way it was first applied)
    mark_here: bool = False

    def validate(self) -> None:
        tid_field("tid", self.tid)
        epoch_fields(self.epoch, self.n)
        bool_field("commit", self.commit)
        bool_field("mark_here", self.mark_here)
        int_field("ts", self.ts, 0, MAX_MS)
        if self.reason not in END_REASONS:
            raise Refused(Code.MALFORMED, f"reason must be one of {', '.join(END_REASONS)}, "
                                          f"got {self.reason!r}")
        _groups_field(self.groups)

    def to_map(self) -> dict[str, Any]:
        m = {"tid": self.tid, "epoch": self.epoch, "n": self.n, "commit": self.commit,
             "ts": self.ts, "reason": self.reason}
        if self.groups:  # absent when empty: the bytes of a record without it are unchanged
            m["groups"] = list(self.groups)
        if self.mark_here:  # likewise
            m["mark_here"] = True
        return m

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> TxEnd:
        groups = d.get("groups", ())
        if isinstance(groups, list):
            groups = tuple(groups)
        return cls(d.get("tid"), d.get("epoch"), d.get("n"), d.get("commit"),  # type: ignore[arg-type]
                   d.get("ts"), d.get("reason"), groups,  # type: ignore[arg-type]
                   d.get("mark_here", False))


@dataclass(frozen=True, slots=True)
class TxComplete(ControlRecord):
    """Every participant applied its marker for transaction `n` of `tid` at `epoch`."""

    op: ClassVar[str] = "tx_complete"
    tid: str
    epoch: int
    n: int

    def validate(self) -> None:
        tid_field("tid", self.tid)
        epoch_fields(self.epoch, self.n)

    def to_map(self) -> dict[str, Any]:
        return {"tid": self.tid, "epoch": self.epoch, "n": self.n}

    @classmethod
    def from_map(cls, d: Mapping[str, Any]) -> TxComplete:
        return cls(d.get("tid"), d.get("epoch"), d.get("n"))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TxExpire(IdleIds):
    """Transactional ids idle that long are forgotten here (see the module docstring)."""

    op: ClassVar[str] = "tx_expire"


# ---------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class TxnState:
    """A transactional id's transaction as the coordinator logged it."""

    tid: str
    epoch: int
    n: int
    state: str
    participants: tuple[str, ...]  # sorted group ids
    started_ms: int
    timeout_ms: int
    decided_ms: int
    reason: str  # why it was decided: "client", "timeout", "operator", "fenced" ("" before)

    @property
    def commit(self) -> bool:
        return self.state in ("prepare_commit", "complete_commit")

    @property
    def decided(self) -> bool:
        return self.state in _DECIDED

    def row(self) -> list[Any]:
        return [self.tid, self.epoch, self.n, self.state, list(self.participants),
                self.started_ms, self.timeout_ms, self.decided_ms, self.reason]


@dataclass(frozen=True, slots=True)
class DoneTxn:
    """A finished transaction, in the `done` ring."""

    tid: str
    epoch: int
    n: int
    commit: bool
    reason: str
    participants: tuple[str, ...]
    decided_ms: int


def _state_of(row: Any) -> TxnState:
    tid, epoch, n, state, parts, started, timeout, decided, reason = row
    if state not in STATES or not isinstance(tid, str):
        raise ValueError(f"bad transaction row {row!r}")
    return TxnState(tid, int(epoch), int(n), state, tuple(str(g) for g in parts),
                    int(started), int(timeout), int(decided), str(reason))



_WHY = {
    "client": "by its producer",
    "operator": "by an operator",
    "fenced": "when a newer producer took over its transactional id (its init fenced it)",
}


def _already_decided(t: TxnState) -> str:
    """Why a request for decided transaction `t` is refused, in words a user can act on:
    a commit refused because the coordinator aborted at the transaction's timeout says so,
    with the timeout."""
    what = "committed" if t.commit else "aborted"
    if t.reason == "timeout":
        why = (f"by the coordinator: it was not committed within its transaction timeout "
               f"of {t.timeout_ms} ms (transaction_timeout_ms)")
    else:
        why = _WHY.get(t.reason, "")
    return f"transaction {t.n} of {t.tid!r} was already {what}" + (f" {why}" if why else "")

class TxCoordinator(Part):
    """Transactional ids coordinated by this group: their current transactions, the
    fenced ones still aborting, and the ring of finished ones."""

    name = "txcoord"
    version = 3
    records = (TxInit, TxAdd, TxEnd, TxComplete, TxExpire)

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        mutations: frozenset[str] = getattr(state, "mutations", frozenset())
        self.no_fencing = "no-fencing" in mutations
        self.forget_epochs = "forget-epochs" in mutations
        self.txns: dict[str, TxnState] = {}
        self.fenced: dict[str, TxnState] = {}  # prepare_abort of an older epoch
        # the previous transaction of the same epoch, decided, its markers still going out
        # while the next one runs (markers name (tid, epoch, n): they cannot touch it)
        self.completing: dict[str, TxnState] = {}
        self.done: deque[DoneTxn] = deque()
        # ongoing transactions by deadline, for a leader's tick (`timed_out`): derived
        # from `txns`, never snapshotted
        self._deadlines: DueHeap[str] = DueHeap(self._deadline)
        self._deciding: set[str] = set()  # ids whose current transaction is prepare_*
        self.floor = 0  # the first epoch of an id: above every epoch of one forgotten
        # ids by the time they went idle (`idle_ids`): derived, never snapshotted
        self._idle: DueHeap[str] = DueHeap(self._idle_since)

    def _set(self, t: TxnState) -> None:
        """`t` is its id's current transaction now."""
        self.txns[t.tid] = t
        if t.state == "ongoing":
            self._deadlines.push(t.started_ms + t.timeout_ms, t.tid)
        if t.state in ("prepare_commit", "prepare_abort"):
            self._deciding.add(t.tid)
        else:
            self._deciding.discard(t.tid)
        self._track_idle(t.tid)

    def _idle_since(self, tid: str) -> int | None:
        """Since when `tid` is idle (ms): initialised and unused since its TX_INIT, or
        its last transaction complete since its decision; None while anything of it is
        open or still writing markers, or its time is unknown (0)."""
        t = self.txns.get(tid)
        if t is None or tid in self.fenced or tid in self.completing:
            return None
        at = (t.started_ms if t.state == "empty" else
              t.decided_ms if t.state in ("complete_commit", "complete_abort") else 0)
        return at or None

    def _track_idle(self, tid: str) -> None:
        at = self._idle_since(tid)
        if at is not None:
            self._idle.push(at, tid)

    def _deadline(self, tid: str) -> int | None:
        t = self.txns.get(tid)
        return t.started_ms + t.timeout_ms if t is not None and t.state == "ongoing" else None

    def handlers(self) -> Mapping[str, tuple[type[ControlRecord], Handler]]:
        return {TxInit.op: (TxInit, self._init), TxAdd.op: (TxAdd, self._add),
                TxEnd.op: (TxEnd, self._end), TxComplete.op: (TxComplete, self._complete),
                TxExpire.op: (TxExpire, self._expire)}

    # ------------------------------------------------------------------ apply

    def _init(self, rec: TxInit, index: int) -> ControlResult:
        cur = self.txns.get(rec.tid)
        if rec.tid in self.fenced or rec.tid in self.completing or (
                cur is not None and cur.state in ("prepare_commit", "prepare_abort")):
            raise Refused(Code.BUSY, "previous transaction still completing")
        epoch = (0 if self.forget_epochs else self.floor) if cur is None else cur.epoch + 1
        if cur is not None and cur.state == "ongoing":
            if cur.participants:
                self.fenced[rec.tid] = replace(cur, state="prepare_abort", decided_ms=rec.ts,
                                               reason="fenced")
            else:
                self._finish(replace(cur, state="complete_abort", decided_ms=rec.ts,
                                     reason="fenced"))
        self._set(TxnState(rec.tid, epoch, 0, "empty", (), rec.ts, rec.timeout_ms, 0, ""))
        return ControlResult(TxInit.op, 1)

    def _current(self, tid: str, epoch: int) -> TxnState:
        """The current transaction of `tid` if `epoch` is its epoch (or `no-fencing`)."""
        cur = self.txns.get(tid)
        if cur is None:
            raise Refused(Code.TX_UNKNOWN, f"transactional id {tid!r} is not initialised "
                                           f"here (never, or it expired after "
                                           f"tx_id_expiration_ms idle): register it again "
                                           f"(TX_INIT; the SDK's producer does so before "
                                           f"its next transaction)")
        if epoch < cur.epoch and not self.no_fencing:
            raise Refused(Code.TX_FENCED, f"transactional id {tid!r} epoch {epoch} is fenced "
                                          f"by epoch {cur.epoch}: a newer producer holds it")
        if epoch > cur.epoch:
            raise Refused(Code.TX_UNKNOWN, f"transactional id {tid!r} has no epoch {epoch}")
        return cur

    def _expects(self, cur: TxnState, n: int) -> bool:
        """Whether transaction `n` may start now: the next number, nothing open, and at
        most one decided transaction of the epoch still writing its markers (it moves
        aside, to `completing`, when `n` starts)."""
        if cur.state == "empty":
            return n == 0
        if n != cur.n + 1:
            return False
        if cur.state in ("prepare_commit", "prepare_abort"):
            return cur.tid not in self.completing
        return cur.state in ("complete_commit", "complete_abort")

    def _start(self, cur: TxnState, n: int, parts: tuple[str, ...], ts: int) -> TxnState:
        """Transaction `n` starts (`_expects` said it may); a predecessor still writing
        its markers is kept in `completing` until its tx_complete."""
        if cur.state in ("prepare_commit", "prepare_abort"):
            self.completing[cur.tid] = cur
        return TxnState(cur.tid, cur.epoch, n, "ongoing", parts, ts, cur.timeout_ms, 0, "")

    def _add(self, rec: TxAdd, index: int) -> ControlResult:
        cur = self._current(rec.tid, rec.epoch)
        if cur.state == "ongoing" and rec.n == cur.n:
            parts = tuple(sorted(set(cur.participants) | set(rec.groups)))
            if len(parts) > MAX_PARTICIPANTS:
                raise Refused(Code.TX_LIMIT, f"a transaction spans at most "
                                             f"{MAX_PARTICIPANTS} groups")
            added = len(parts) - len(cur.participants)
            self._set(replace(cur, participants=parts))
            return ControlResult(TxAdd.op, added, dup=not added)
        if self._expects(cur, rec.n):
            parts = tuple(sorted(set(rec.groups)))
            if rec.completes and cur.state in ("prepare_commit", "prepare_abort"):
                cur = self._finish(cur)  # its markers are all applied: done, not aside
            self._set(self._start(cur, rec.n, parts, rec.ts))
            return ControlResult(TxAdd.op, len(parts))
        self._refuse_other(cur, rec.n)
        raise AssertionError("unreachable")

    def _refuse_other(self, cur: TxnState, n: int) -> None:
        """Refuse a request for transaction `n` that is not the current open one."""
        if n == cur.n and cur.decided:
            raise Refused(Code.TX_DECIDED, _already_decided(cur))
        if n == cur.n + 1 and (cur.state in ("prepare_commit", "prepare_abort")
                               or cur.tid in self.completing):
            raise Refused(Code.BUSY, "previous transaction still completing")
        raise Refused(Code.TX_UNKNOWN, f"transaction {n} of {cur.tid!r} is not open "
                                       f"(current: {cur.n}, {cur.state})")

    def _end(self, rec: TxEnd, index: int) -> ControlResult:
        cur = self._current(rec.tid, rec.epoch)
        # the decision names every group the client says it sent to, registered or not
        parts = tuple(sorted(set(rec.groups) | set(cur.participants if cur.n == rec.n
                                                  else ())))
        if len(parts) > MAX_PARTICIPANTS:
            raise Refused(Code.TX_LIMIT, f"a transaction spans at most {MAX_PARTICIPANTS} "
                                         f"groups")
        if cur.state == "ongoing" and rec.n == cur.n:
            decided = replace(cur, state="prepare_commit" if rec.commit else "prepare_abort",
                              decided_ms=rec.ts, reason=rec.reason, participants=parts)
            if not parts:
                decided = self._finish(decided)
            self._set(decided)
            if rec.mark_here:
                self._mark_here(decided, rec.ts, index)
            return ControlResult(TxEnd.op, 1)
        aside = self.completing.get(rec.tid)
        if aside is not None and aside.n == rec.n:
            cur = aside  # decided, its markers still going out: a retried end
        if rec.n == cur.n and cur.decided:
            if cur.commit == rec.commit:
                return ControlResult(TxEnd.op, dup=True)
            raise Refused(Code.TX_DECIDED, _already_decided(cur))
        if self._expects(cur, rec.n):  # never added: decided at once (done, if nothing sent)
            started = self._start(cur, rec.n, parts, rec.ts)
            decided = replace(started, state="prepare_commit" if rec.commit else
                              "prepare_abort", decided_ms=rec.ts, reason=rec.reason)
            self._set(self._finish(decided) if not parts else decided)
            if rec.mark_here:
                self._mark_here(decided, rec.ts, index)
            return ControlResult(TxEnd.op, 1)
        self._refuse_other(cur, rec.n)
        raise AssertionError("unreachable")

    def _mark_here(self, t: TxnState, ts: int, index: int) -> None:
        """Decided transaction `t` has data in this very group too: its marker applies
        here with the decision, in the same entry (no marker entry, no round trip), as a
        marker from the coordinator would (fence: the current epoch). Not while an
        earlier transaction of the id still has its marker to write here: a producer's
        transactions enter a queue in their order, so the leader's duty sends this one
        after that one, as for any participant."""
        if self.state.group not in t.participants:
            return
        part = self.state.txpart
        for earlier in (self.completing.get(t.tid), self.fenced.get(t.tid)):
            if earlier is not None and self.state.group in earlier.participants and (
                    part.decision(kafka_key(t.tid, earlier.epoch, earlier.n)) is None):
                return
        part.apply_marker(TxMarker(t.tid, t.epoch, t.n, t.commit, t.epoch, ts), index)

    def _complete(self, rec: TxComplete, index: int) -> ControlResult:
        cur = self.txns.get(rec.tid)
        if (cur is not None and (cur.epoch, cur.n) == (rec.epoch, rec.n)
                and cur.state in ("prepare_commit", "prepare_abort")):
            self._set(self._finish(cur))
            return ControlResult(TxComplete.op, 1)
        for aside in (self.fenced, self.completing):
            old = aside.get(rec.tid)
            if old is not None and (old.epoch, old.n) == (rec.epoch, rec.n):
                del aside[rec.tid]
                self._finish(old)
                self._track_idle(rec.tid)  # nothing of it aside any more: idle, maybe
                return ControlResult(TxComplete.op, 1)
        return ControlResult(TxComplete.op, dup=True)  # completed already, or unknown

    def _expire(self, rec: TxExpire, index: int) -> ControlResult:
        gone = 0
        for tid in rec.tids:
            at = self._idle_since(tid)
            if at is not None and at + rec.after_ms <= rec.ts:
                t = self.txns.pop(tid)
                self.floor = max(self.floor, t.epoch + 1)
                gone += 1
        return ControlResult(TxExpire.op, gone, dup=not gone)

    def _finish(self, t: TxnState) -> TxnState:
        """`t` (decided) completed: its complete_* state, recorded in the done ring."""
        t = replace(t, state="complete_commit" if t.commit else "complete_abort")
        self.done.append(DoneTxn(t.tid, t.epoch, t.n, t.commit, t.reason, t.participants,
                                 t.decided_ms))
        while len(self.done) > DONE:
            self.done.popleft()
        return t

    # ------------------------------------------------------------------ queries

    def txn(self, tid: str) -> TxnState | None:
        """The current transaction (or the initialised epoch) of `tid`."""
        return self.txns.get(tid)

    def find(self, tid: str, epoch: int, n: int) -> TxnState | None:
        """Transaction (epoch, n) of `tid` while this part still holds it: the current
        one, or an earlier one still writing its markers (fenced or completing)."""
        for t in (self.txns.get(tid), self.completing.get(tid), self.fenced.get(tid)):
            if t is not None and (t.epoch, t.n) == (epoch, n):
                return t
        return None

    def unfinished(self) -> list[TxnState]:
        """Decided transactions whose markers are not all applied (prepare_*), fenced ones
        included, by tid."""
        out = [self.txns[tid] for tid in self._deciding]  # not a scan of every id
        out += self.fenced.values()
        out += self.completing.values()
        return sorted(out, key=lambda t: (t.tid, t.epoch, t.n))

    def ongoing(self) -> list[TxnState]:
        """Open transactions (for timeouts), by tid."""
        return sorted((t for t in self.txns.values() if t.state == "ongoing"),
                      key=lambda t: t.tid)

    def timed_out(self, now: int) -> list[TxnState]:
        """The ongoing transactions whose timeout passed before `now` (ms), by tid:
        `ongoing()` filtered, in O(due log n), for a leader's every tick."""
        return [self.txns[tid] for tid in self._deadlines.due(now - 1)]

    def idle_ids(self, until: int, limit: int = EXPIRE_BATCH) -> list[str]:
        """Up to `limit` ids idle since `until` (ms) or before, by tid; O(due log n), for
        a leader's every tick."""
        return self._idle.due(until, limit)

    def done_ring(self) -> list[DoneTxn]:
        """The last finished transactions, oldest first."""
        return list(self.done)

    # ------------------------------------------------------------------ snapshot

    def section(self) -> Any:
        return {
            "txns": [t.row() for _, t in sorted(self.txns.items())],
            "fenced": [t.row() for _, t in sorted(self.fenced.items())],
            **({"completing": [t.row() for _, t in sorted(self.completing.items())]}
               if self.completing else {}),
            "done": [[d.tid, d.epoch, d.n, d.commit, d.reason, list(d.participants),
                      d.decided_ms] for d in self.done],
            **({"floor": self.floor} if self.floor else {}),
        }

    def load(self, version: int, section: Any) -> None:
        if version not in (1, 2, 3):  # 2 added `completing`, 3 `floor`: older readers refuse
            raise ValueError(f"unsupported txcoord section version {version!r}")
        for row in section["txns"]:
            t = _state_of(row)
            self.txns[t.tid] = t
            if t.state in ("prepare_commit", "prepare_abort"):
                self._deciding.add(t.tid)
        self._deadlines.rebuild((t.started_ms + t.timeout_ms, t.tid)
                                for t in self.txns.values() if t.state == "ongoing")
        for row in section["fenced"]:
            t = _state_of(row)
            if t.state != "prepare_abort":
                raise ValueError(f"fenced transaction of {t.tid!r} in state {t.state!r}")
            self.fenced[t.tid] = t
        for row in section.get("completing", ()):  # absent: none
            t = _state_of(row)
            if t.state not in ("prepare_commit", "prepare_abort"):
                raise ValueError(f"completing transaction of {t.tid!r} in state {t.state!r}")
            self.completing[t.tid] = t
        for tid, epoch, n, commit, reason, parts, decided in section["done"]:
            if not isinstance(commit, bool):
                raise ValueError(f"bad finished transaction of {tid!r}")
            self.done.append(DoneTxn(str(tid), int(epoch), int(n), commit, str(reason),
                                     tuple(str(g) for g in parts), int(decided)))
        self.floor = int(section.get("floor", 0))
        self._idle.rebuild((at, tid) for tid in self.txns
                           if (at := self._idle_since(tid)) is not None)
