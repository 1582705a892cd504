"""Property tests of the transaction parts: random interleavings of prepares, markers,
half-message ends and checks, offsets, coordinator records, snapshots and restores.

Two replicas apply the same entries, one of them restored from its own snapshot at
random points: their results and snapshots must be identical. A model of what was
prepared and decided checks the queues after every step: nothing of an aborted or
rolled-back transaction, nor anything undecided, ever enters a ConsumeQueue; every
committed record enters exactly once, in its transaction's order; no batch of a fenced
epoch is accepted; a fence is raised by markers only (the coordinator's word: its
`tx_end` counts as one in its own group), never by a
batch's or offsets' epoch (a client's); and no decision ever flips."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.parts import txpart
from broker.state.parts.base import ControlResult, ErrorResult, ProduceResult
from broker.state.parts.txcoord import TxAdd, TxComplete, TxEnd, TxInit
from broker.state.parts.txpart import HalfChecked, HalfEnd, TxMarker, TxOffsets
from broker.state.statemachine import BrokerState, control_create_topic, control_delete_topic
from raftlog.types import Entry, EntryType
from wire.protocol import Code
from wire.records import STORED_PREFIX, decode_record, encode_batch
from wire.txn import TxKey, half_key, kafka_key

TIDS = ("ta", "tb")
TXIDS = ("h0", "h1", "h2")
PGS = ("pg0", "pg1")
QUEUES = (("t", 0), ("t", 1), ("u", 0))
U = 2  # the queue of topic u, which is deleted and created again

small = st.integers(0, 1)
queue = st.integers(0, len(QUEUES) - 1)
delta = st.sampled_from((0, 0, 0, -1, 1))  # from the coordinator's current epoch
OPS = st.one_of(
    # decide the i-th prepared transaction (what markers and ends mostly are)
    st.tuples(st.just("decide"), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("decide"), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("decide"), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("kbatch"), st.sampled_from(TIDS), small, small, queue, st.integers(1, 3)),
    st.tuples(st.just("half"), st.sampled_from(TXIDS), st.sampled_from(PGS), queue,
              st.integers(1, 2)),
    st.tuples(st.just("add_cur"), st.sampled_from(TIDS), delta, small,
              st.lists(st.sampled_from(("g1", "g2", "g3")), max_size=2)),
    st.tuples(st.just("end_cur"), st.sampled_from(TIDS), delta, small, st.booleans()),
    st.tuples(st.just("complete_cur"), st.sampled_from(TIDS)),
    st.tuples(st.just("add_next"), st.sampled_from(TIDS),
              st.lists(st.sampled_from(("g1", "g2", "g3")), max_size=2)),
    st.tuples(st.just("kbatch"), st.sampled_from(TIDS), small, small, queue, st.integers(1, 3)),
    st.tuples(st.just("half"), st.sampled_from(TXIDS), st.sampled_from(PGS), queue,
              st.integers(1, 2)),
    st.tuples(st.just("plain"), queue),
    st.tuples(st.just("marker"), st.sampled_from(TIDS), small, small, st.booleans(),
              st.integers(0, 1)),
    st.tuples(st.just("half_end"), st.sampled_from(TXIDS), st.booleans(),
              st.sampled_from(("client", "check", "expired", "operator")),
              st.sampled_from((*PGS, ""))),
    st.tuples(st.just("half_checked"), st.sampled_from(TXIDS)),
    st.tuples(st.just("offsets"), st.sampled_from(TIDS), small, small, queue,
              st.integers(0, 50)),
    st.tuples(st.just("init"), st.sampled_from(TIDS)),
    st.tuples(st.just("add"), st.sampled_from(TIDS), small, small,
              st.lists(st.sampled_from(("g1", "g2", "g3")), max_size=2)),
    st.tuples(st.just("end"), st.sampled_from(TIDS), small, small, st.booleans()),
    st.tuples(st.just("complete"), st.sampled_from(TIDS), small, small),
    st.tuples(st.just("restore")),
    st.tuples(st.just("recreate_u")),  # delete topic u (and what hangs off it), create it anew
)


class Run:
    """Two replicas fed the same entries, and the model checks."""

    def __init__(self, mutations: tuple[str, ...] = ()) -> None:
        self.mutations = mutations
        self.a = BrokerState("g1", mutations=mutations)
        self.b = BrokerState("g1", mutations=mutations)
        self.index = 0
        self.data: dict[int, bytes] = {}
        self.body_no = 0
        self.ordinary: dict[bytes, int] = {}  # body -> queue no
        self.prepared: dict[TxKey, list[tuple[int, bytes]]] = {}  # key -> (queue no, body)
        self.decisions: dict[TxKey, bool] = {}
        self.coord: dict[tuple[str, int, int], bool] = {}
        self.fence: dict[str, int] = {}
        self.violations: list[str] = []
        self.entry(EntryType.CONTROL, control_create_topic("t", 2, [0, 1]))
        self.entry(EntryType.CONTROL, control_create_topic("u", 1, [0]))

    def entry(self, etype: EntryType, data: bytes) -> Any:
        self.index += 1
        if etype == EntryType.MESSAGES:
            self.data[self.index] = data
        e = Entry(self.index, 1, etype, data)
        before = [p.section() for p in self.a.parts]
        ra, rb = self.a.apply(e), self.b.apply(e)
        assert ra == rb, (ra, rb)
        if isinstance(ra, ErrorResult) and [p.section() for p in self.a.parts] != before:
            self.violations.append(f"refused {ra} changed the state")
        return ra

    def bodies(self, n: int) -> list[bytes]:
        out = []
        for _ in range(n):
            self.body_no += 1
            out.append(f"m{self.body_no}".encode())
        return out

    def batch(self, q: int, bodies: list[bytes], **kw: Any) -> Any:
        topic, qn = QUEUES[q]
        return self.entry(EntryType.MESSAGES, STORED_PREFIX.pack(self.index) + encode_batch(
            topic, qn, bodies, **kw))

    def step(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "kbatch":
            _, tid, epoch, n, q, count = op
            bodies = self.bodies(count)
            res = self.batch(q, bodies, tx=(tid, epoch, n))
            if isinstance(res, ProduceResult):
                if epoch < self.fence.get(tid, -1):
                    self.violations.append(f"a batch of fenced epoch {epoch} of {tid} stored")
                self.prepared.setdefault(kafka_key(tid, epoch, n), []).extend(
                    (q, b) for b in bodies)
        elif kind == "half":
            _, txid, pg, q, count = op
            bodies = self.bodies(count)
            res = self.batch(q, bodies, half=(txid, pg))
            if isinstance(res, ProduceResult):
                self.prepared.setdefault(half_key(txid), []).extend((q, b) for b in bodies)
        elif kind == "plain":
            bodies = self.bodies(1)
            self.batch(op[1], bodies)
            self.ordinary[bodies[0]] = op[1]
        elif kind == "marker":
            _, tid, epoch, n, commit, extra = op
            retry = self.a.txpart.decision(kafka_key(tid, epoch, n)) is not None
            self.entry(EntryType.CONTROL, TxMarker(tid, epoch, n, commit, epoch + extra).encode())
            if not retry:  # a retried marker changes nothing, its fence neither
                self.fence[tid] = max(self.fence.get(tid, -1), epoch + extra)
        elif kind == "half_end":
            _, txid, commit, source, pg = op
            if pg == "" and source not in ("expired", "operator"):
                pg = "pg0"
            self.entry(EntryType.CONTROL, HalfEnd(txid, commit, source, pg).encode())
        elif kind == "half_checked":
            self.entry(EntryType.CONTROL, HalfChecked(op[1], self.index).encode())
        elif kind == "offsets":
            _, tid, epoch, n, q, offset = op
            topic, qn = QUEUES[q]
            res = self.entry(EntryType.CONTROL, TxOffsets(tid, epoch, n, "cg",
                                                          ((topic, qn, offset),), 1).encode())
            if isinstance(res, ControlResult):
                if epoch < self.fence.get(tid, -1):
                    self.violations.append(f"offsets of fenced epoch {epoch} of {tid} stored")
        elif kind == "init":
            self.entry(EntryType.CONTROL, TxInit(op[1], 60_000, self.index).encode())
        elif kind == "add":
            _, tid, epoch, n, groups = op
            self.entry(EntryType.CONTROL, TxAdd(tid, epoch, n, tuple(groups), self.index).encode())
        elif kind == "end":
            _, tid, epoch, n, commit = op
            key = kafka_key(tid, epoch, n)
            before = self.a.txpart.decision(key)
            # both kinds of record meet in a log: those of leaders that apply the marker
            # in their own group with the decision, and those of older ones
            self.entry(EntryType.CONTROL, TxEnd(tid, epoch, n, commit, self.index, "client",
                                                mark_here=self.index % 3 != 0).encode())
            here = self.a.txpart.decision(key)
            if before is None and here is not None:
                # this group is a participant of its own coordinator's decision: the
                # tx_end applied the marker here, the coordinator's epoch its fence
                if here.commit is not commit:
                    self.violations.append(f"tx_end {commit} of {key} decided {here.commit}")
                self.fence[tid] = max(self.fence.get(tid, -1), epoch)
        elif kind == "complete":
            _, tid, epoch, n = op
            self.entry(EntryType.CONTROL, TxComplete(tid, epoch, n).encode())
        elif kind == "decide":
            _, i, commit = op
            # the undecided ones mostly; now and then a retry of a decided one
            keys = sorted(k for k in self.prepared if k not in self.decisions)
            if not keys or i == 5:
                keys = sorted(self.prepared)
            if keys:
                key = keys[i % len(keys)]
                if key[0] == "k":
                    _k, tid, epoch, n = key  # type: ignore[misc]
                    self.step(("marker", tid, epoch, n, commit, 0))
                else:
                    pg = self.a.txpart.half(key[1])
                    self.step(("half_end", key[1], commit, "client",
                               pg.producer_group if pg is not None else "pg0"))
        elif kind in ("add_cur", "end_cur"):
            t = self.a.txcoord.txn(op[1])
            if t is None:
                self.step(("init", op[1]))
                t = self.a.txcoord.txn(op[1])
            epoch = max(0, (t.epoch if t is not None else 0) + op[2])
            if kind == "add_cur":
                self.step(("add", op[1], epoch, op[3], op[4]))
            else:
                self.step(("end", op[1], epoch, op[3], op[4]))
        elif kind == "add_next":
            # the next transaction of the id, completing a decided one whose marker this
            # group applied (the leader sends `completes` only once every marker is)
            t = self.a.txcoord.txn(op[1])
            if t is None:
                return self.step(("init", op[1]))
            done = t.state in ("prepare_commit", "prepare_abort") and (
                "g1" not in t.participants
                or self.a.txpart.decision(kafka_key(t.tid, t.epoch, t.n)) is not None)
            self.entry(EntryType.CONTROL, TxAdd(t.tid, t.epoch, t.n + 1, tuple(op[2]),
                                                self.index, completes=done).encode())
        elif kind == "complete_cur":
            for u in self.a.txcoord.unfinished():
                if u.tid == op[1]:
                    self.step(("complete", u.tid, u.epoch, u.n))
                    break
        elif kind == "recreate_u":
            self.entry(EntryType.CONTROL, control_delete_topic("u"))
            self.entry(EntryType.CONTROL, control_create_topic("u", 1, [0]))
            self.ordinary = {b: q for b, q in self.ordinary.items() if q != U}
            for key, items in self.prepared.items():
                self.prepared[key] = [(q, b) for q, b in items if q != U]
        elif kind == "restore":
            snap = self.b.snapshot()
            assert snap == self.a.snapshot()
            self.b = BrokerState.restore("g1", snap, mutations=self.mutations)
        self.check()

    def check_due(self, state: BrokerState) -> None:
        """What a leader's tick finds due is what filtering every prepared transaction
        finds, at every time that matters (each one's own, and one before and after)."""
        part = state.txpart
        kafka, halves = part.pending_kafka(), part.pending_halves()
        times = {t + d for k in kafka for t in (k[3],) for d in (-1, 0, 1)}
        times |= {t + d for h in halves for t in (h.prepared_ms, h.last_check_ms)
                  for d in (-1, 0, 1)}
        for now in sorted(times)[:12]:
            for orphan_ms in (0, 5):
                want = [k for k in kafka if now - k[3] > orphan_ms]
                if part.kafka_due(now - orphan_ms) != want:
                    self.violations.append(f"kafka due at {now}: {part.kafka_due(now)}")
            for first, every in ((0, 0), (1, 2), (3, 1)):
                want_h = [h for h in halves if (now >= h.prepared_ms + first if h.checks == 0
                                                else now >= h.last_check_ms + every)]
                if part.halves_due(now, first, every) != want_h:
                    self.violations.append(f"halves due at {now}: "
                                           f"{part.halves_due(now, first, every)}")
        coord = state.txcoord
        ongoing = coord.ongoing()
        for t in ongoing:
            for now in (t.started_ms + t.timeout_ms + d for d in (0, 1)):
                want_t = [u for u in ongoing if now > u.started_ms + u.timeout_ms]
                if coord.timed_out(now) != want_t:
                    self.violations.append(f"timed out at {now}: {coord.timed_out(now)}")
        deciding = [t for t in coord.txns.values()
                    if t.state in ("prepare_commit", "prepare_abort")]
        want_u = sorted([*deciding, *coord.fenced.values(), *coord.completing.values()],
                        key=lambda t: (t.tid, t.epoch, t.n))
        if coord.unfinished() != want_u:
            self.violations.append(f"unfinished {coord.unfinished()} != {want_u}")

    def queue_bodies(self, q: int) -> list[bytes]:
        topic, qn = QUEUES[q]
        lo, end = self.a.queue_range(topic, qn)
        if lo == end:
            return []
        entries, _ = self.a.lookup(topic, qn, lo, end - lo, 1 << 40)
        out = []
        for e in entries:
            msg, _ = decode_record(self.data[e.index], e.start, topic=topic, queue=qn,
                                   offset=e.offset, store_ms=e.store_ms, msg_id="")
            out.append(msg.body)
        return out

    def check(self) -> None:
        self.check_due(self.a)
        self.check_due(self.b)  # restored from snapshots at times: its heaps rebuilt
        # fences come from the coordinator's markers only, never a client's batch or offsets
        for tid in TIDS:
            if self.a.txpart.fence(tid) != self.fence.get(tid, -1):
                self.violations.append(f"fence of {tid} {self.a.txpart.fence(tid)} is not "
                                       f"the markers' {self.fence.get(tid, -1)}")
        # decisions never flip, in the participant and in the coordinator
        for key in self.prepared.keys() | self.decisions.keys():
            d = self.a.txpart.decision(key)
            if d is None:
                if key in self.decisions:
                    self.violations.append(f"decision of {key} forgotten")
                continue
            if self.decisions.setdefault(key, d.commit) != d.commit:
                self.violations.append(f"decision of {key} flipped")
        for tid in TIDS:
            t = self.a.txcoord.txn(tid)
            states = [t] if t is not None else []
            states += [u for u in self.a.txcoord.unfinished() if u.tid == tid]
            for u in states:
                if u.decided and self.coord.setdefault((u.tid, u.epoch, u.n), u.commit) != u.commit:
                    self.violations.append(f"coordinator decision of {u} flipped")
        # what the queues hold
        seen: dict[bytes, int] = {}
        for q in range(len(QUEUES)):
            for pos, body in enumerate(self.queue_bodies(q)):
                if body in seen:
                    self.violations.append(f"{body!r} in a queue twice")
                seen[body] = pos
        for key, items in self.prepared.items():
            commit = self.decisions.get(key)
            for _q, body in items:
                if commit is True and body not in seen:
                    self.violations.append(f"committed {body!r} of {key} lost")
                if commit is not True and body in seen:
                    what = "aborted" if commit is False else "undecided"
                    self.violations.append(f"{what} {body!r} of {key} visible")
            if commit:
                for q in {q for q, _ in items}:
                    order = [seen[b] for qq, b in items if qq == q and b in seen]
                    if order != sorted(order):
                        self.violations.append(f"records of {key} reordered in queue {q}")
        prepared_bodies = {b for items in self.prepared.values() for _, b in items}
        for body in seen:
            if body not in self.ordinary and body not in prepared_bodies:
                self.violations.append(f"unexpected {body!r}")

    def finish(self) -> None:
        assert self.a.snapshot() == self.b.snapshot()
        restored = BrokerState.restore("g1", self.a.snapshot(), mutations=self.mutations)
        assert restored.snapshot() == self.a.snapshot()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=10, max_size=50))
def test_random_interleavings_keep_replicas_identical_and_queues_committed_only(
    ops: list[tuple[Any, ...]],
) -> None:
    run = Run()
    for op in ops:
        run.step(op)
    assert run.violations == []
    run.finish()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(TXIDS), min_size=1, max_size=4, unique=True),
       st.lists(st.tuples(st.sampled_from(TXIDS), st.booleans()), max_size=12))
def test_half_messages_are_decided_once(txids: list[str], ends: list[tuple[str, bool]]) -> None:
    run = Run()
    for i, txid in enumerate(txids):
        run.step(("half", txid, "pg0", i % len(QUEUES), 1))
    for txid, commit in ends:
        before = run.a.txpart.decision(half_key(txid))
        res = run.entry(EntryType.CONTROL, HalfEnd(txid, commit, "client", "pg0").encode())
        if before is not None and before.commit != commit:
            assert isinstance(res, ErrorResult)
        run.check()
    assert run.violations == []


# ---------------------------------------------------------------------- the checks can fail


def test_the_checks_catch_served_prepared_data() -> None:
    run = Run(mutations=("serve-prepared",))
    for op in [("kbatch", "ta", 0, 0, 0, 2), ("marker", "ta", 0, 0, False, 0)]:
        run.step(op)
    assert any("aborted" in v for v in run.violations), run.violations
    run = Run(mutations=("serve-prepared",))
    run.step(("half", "h0", "pg0", 1, 1))
    assert any("undecided" in v for v in run.violations), run.violations


def test_the_checks_catch_missing_fencing() -> None:
    run = Run(mutations=("no-fencing",))
    # the coordinator's marker fences epochs below 2; a batch of epoch 1 comes after
    for op in [("marker", "ta", 2, 0, False, 0), ("kbatch", "ta", 1, 0, 0, 1)]:
        run.step(op)
    assert any("fenced" in v for v in run.violations), run.violations


# ---------------------------------------------------------------------- decided halves

LATE = st.one_of(
    # a late decision from any source: the client's retried end, a check-back answered
    # after the decision, an expiry or an operator's, either way
    st.tuples(st.just("end"), st.booleans(),
              st.sampled_from(("client", "check", "expired", "operator"))),
    st.tuples(st.just("checked")),  # a check logged by a leader that had not applied it yet
    st.tuples(st.just("others"), st.integers(1, 3)),  # decisions of other halves
    st.tuples(st.just("restore")),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.sampled_from(("client", "check", "expired", "operator")),
       st.lists(LATE, max_size=12))
def test_a_decided_half_is_never_decided_the_other_way(
    commit: bool, source: str, late: list[tuple[Any, ...]],
) -> None:
    """Once a half message is decided, whatever comes after -- the opposite decision from
    any source, a check logged late, the decision leaving the ring of remembered ones,
    a restore -- leaves its queue as the decision made it, and the decision itself."""
    saved = txpart.DECISIONS
    txpart.DECISIONS = 4  # small: late ends also arrive after it is forgotten
    try:
        run = Run()
        run.step(("half", "h0", "pg0", 0, 2))
        if not commit and source in ("expired", "operator"):
            pg = ""
        else:
            pg = "pg0"
        if commit and source == "expired":
            source = "check"  # an expiry only rolls back
        res = run.entry(EntryType.CONTROL, HalfEnd("h0", commit, source, pg).encode())
        assert isinstance(res, ControlResult) and not res.dup
        held = run.queue_bodies(0)
        others = 0
        for op in late:
            if op[0] == "end":
                _, c, src = op
                before = [p.section() for p in run.a.parts]
                res = run.entry(EntryType.CONTROL, HalfEnd(
                    "h0", c, src, "" if src in ("expired", "operator") else "pg0").encode())
                if isinstance(res, ControlResult):
                    assert res.dup and c == commit, res  # only a retry of the same decision
                else:
                    assert res.code in (Code.TX_DECIDED, Code.TX_UNKNOWN), res
                    if res.code == Code.TX_DECIDED:
                        assert c != commit
                    assert [p.section() for p in run.a.parts] == before
            elif op[0] == "checked":
                before = [run.a.txpart.section(), run.a.queues.section()]
                run.entry(EntryType.CONTROL, HalfChecked("h0", run.index).encode())
                assert [run.a.txpart.section(), run.a.queues.section()] == before
            elif op[0] == "others":
                for _ in range(op[1]):
                    others += 1
                    txid = f"o{others}"
                    run.batch(1, run.bodies(1), half=(txid, "pg0"))
                    run.entry(EntryType.CONTROL, HalfEnd(txid, False, "client", "pg0").encode())
            else:
                snap = run.a.snapshot()
                run.a = BrokerState.restore("g1", snap)
                run.b = BrokerState.restore("g1", snap)
            assert run.queue_bodies(0) == held
            d = run.a.txpart.decision(half_key("h0"))
            assert d is None or (d.commit, d.source) == (commit, source)
            assert run.a.txpart.half("h0") is None  # never pending again
        assert (held != []) == commit
    finally:
        txpart.DECISIONS = saved
