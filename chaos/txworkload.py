"""The transactional workload of `raftmq chaos run --workload txn`: what it does and records.

Every operation is written to the run's history in the forms `chaos.txcheck` reads (its
docstring is the format); this module is the load that makes them. Three topics of its
own, each with queues in every group: ``<base>-tx`` (transactions and half messages),
``<base>-txin`` (pipeline input) and ``<base>-txout`` (pipeline output).

- Transactional producers (`Producer(transactional_id=...)`), one id each: transactions
  of 1-10 messages over random queues of ``<base>-tx`` (so over several groups), each
  planned to commit (most), abort, be abandoned or turn zombie. *Abandoned*: the
  producer is dropped mid-transaction without ending it (a killed producer) and a new
  producer with the same id takes over, whose init fences and aborts what was left.
  *Zombie*: the same with an epoch's first transaction, but once the successor's init
  completed and it began its own first transaction, the old producer asks to commit,
  which must be refused (`no-fencing` lets it through: the coordinator takes it for the
  successor's transaction of the same number, a zombie commit).
- Half-message producers (`Producer(producer_group=..., check_listener=...)`): each half
  has a local transaction outcome drawn up front (commit, rollback or unknown) that the
  check listener answers for it, always; most halves are ended by the producer as the
  local transaction said (after holding it prepared a moment, for readers to find if it
  were served), the others never (a crash: check-back decides; an "unknown" one expires
  and is rolled back). Every check-back answered is a ``check`` record. Some are held
  past the first check-back, so checks race the end; a check-back of a half whose end
  the broker already acknowledged is answered the *opposite* of the local outcome half
  the time: it must change nothing (the checker then finds the half lost, or a rolled-back
  one delivered, if a decision ever flipped).
- The pipeline: a feeder produces inputs to ``<base>-txin``; a worker, a separate OS
  process (`chaos.pipeline`, run with ``python -m``), reads them with the consumer
  group's committed offset, writes one output per input to ``<base>-txout`` and commits
  the input offsets in the same transaction. The harness SIGKILLs it every few seconds
  and starts a new one with the same transactional id; its records come through its
  stdout, with its own times (the monotonic clock is the machine's).
- Producers killed between their first send and its TX_ADD (`_killed_before_add`):
  each a fresh transactional id whose one prepared batch the coordinator never hears of;
  it must never become visible.
- Readers fetch (read committed, the only isolation served) from every queue during the
  run (``tx-read``), so a message served before its commit, or never committed, is seen.

After the faults are healed, `drain` waits until no half message or transaction is left
undecided (bounded), asks the broker how each half it did not end itself was decided
(``half-status``), reads the pipeline group's committed offsets (``pipe-offsets``) and
reads every queue of the three topics from offset 0 to its end (``tx-drain``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from raftmq.client import Admin, Producer, PullConsumer
from raftmq.client.consumer import fetch, query_offset
from raftmq.client.errors import ProducerFencedError, TransactionAbortedError
from raftmq.client.transactions import CheckRequest, Transaction
from wire.protocol import Code, Op, RequestError
from wire.records import OutgoingMessage, encode_batch
from wire.requests import ProduceRequest

from .recorder import Recorder
from .workload import _written_for_sure_not, create_topics, queue_key

__all__ = ["TX_NODE_SETTINGS", "TxWorkload"]

TX_NODE_SETTINGS = {
    # check-back within seconds, so short runs see it decide (and expire) halves
    "tx_check_first_ms": 1_000,
    "tx_check_interval_ms": 1_000,
    "tx_check_max": 3,
    "tx_orphan_ms": 10_000,
    # idle ids (the killed producers' below) are forgotten, and come back, within a run
    "tx_id_expiration_ms": 5_000,
}
"""Node settings of a run with the txn workload."""

PIPE_GROUP = "chaos-pipeline"
_READERS_GROUP = "chaos-tx-readers"
_PAUSE_AFTER_ERROR = 0.1
DRAIN_BATCH = 256
GRACE = 10.0  # seconds after the end of the load before what is still going is cancelled
_PLANS = (("commit", 0.75), ("abort", 0.15), ("abandon", 0.1))
ZOMBIES = 0.3  # share of an epoch's first transactions that turn zombie
_LOCALS = (("commit", 0.45), ("rollback", 0.35), ("unknown", 0.2))
_FLIP = 0.5  # a check-back of a half already ended: how often the listener answers opposite
_HOLD_LONG = 0.15  # halves held prepared past the first check-back (1 s in these runs)
KILLED_TIMEOUT_MS = 2_000  # transaction timeout of the producers killed before TX_ADD
# an id of one of those is used again this long after, by then aborted at its timeout and
# idle past tx_id_expiration_ms: forgotten, unless faults held that up
REUSE_AFTER = 10.0


def _never_ended(tx: Transaction) -> None:
    """`tx` belonged to a producer that was killed: nothing of it may be sent any more,
    not even the abort its producer's close would send."""
    if tx.state == "open":
        tx.state = "aborted"


def _draw(rng: random.Random, table: tuple[tuple[str, float], ...]) -> str:
    x = rng.random()
    for name, share in table:
        if x < share:
            return name
        x -= share
    return table[-1][0]


class TxWorkload:
    """The transactional load (module docstring); `run` until a time, then `drain`."""

    def __init__(
        self,
        namesrv: str,
        base: str,
        groups: int,
        *,
        recorder: Recorder,
        rng: random.Random,
        producers: int = 3,
        half_producers: int = 2,
        readers: int = 2,
        pipeline: bool = True,
        killed_before_add: bool = True,
        pipeline_kill_every: tuple[float, float] = (3.0, 7.0),
        send_timeout: float = 3.0,
        pause: float = 0.02,
        transaction_timeout_ms: int = 10_000,
        python: str = sys.executable,
        log: Path | None = None,
    ) -> None:
        if groups < 1:
            raise ValueError("groups must be at least 1")
        self.namesrv = namesrv
        self.topic = f"{base}-tx"
        self.in_topic = f"{base}-txin"
        self.out_topic = f"{base}-txout"
        self.queues = {self.topic: 2 * groups, self.in_topic: groups, self.out_topic: groups}
        self.recorder = recorder
        self.rng = rng
        self.producers = producers
        self.half_producers = half_producers
        self.readers = readers
        self.pipeline = pipeline
        self.killed_before_add = killed_before_add
        self.pipeline_kill_every = pipeline_kill_every
        self.send_timeout = send_timeout
        self.pause = pause
        self.transaction_timeout_ms = transaction_timeout_ms
        self.python = python
        self.log = log  # where the pipeline workers' stderr goes (appended)
        self.queue_groups: dict[str, str] = {}
        self.drained: dict[str, bool] = {}
        self.stats: dict[str, int] = {}
        self._next_process = 1_000_000  # apart from the queue workload's process ids
        self._txns = 0
        self._local: dict[str, tuple[str, str]] = {}  # txid -> (body, local outcome)
        self._ended: set[str] = set()  # halves whose end the broker acknowledged
        self._undecided: dict[str, str] = {}  # txid -> body of halves the producer left
        self._tails: dict[str, int] = {}
        self.pipeline_starts = 0

    def _process(self) -> int:
        self._next_process += 1
        return self._next_process

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    # ------------------------------------------------------------ setup

    async def setup(self, timeout: float = 30.0) -> dict[str, str]:
        """Create the three topics (queues in every group) and learn queue -> group."""
        self.queue_groups = await create_topics(self.namesrv, dict(self.queues), timeout)
        return dict(self.queue_groups)

    # ------------------------------------------------------------ the run

    async def run(self, stop_at: float) -> None:
        if not self.queue_groups:
            await self.setup()
        async with trio.open_nursery() as nursery:
            # operations still going GRACE seconds after `stop_at` are cancelled (and
            # recorded as such): a client stuck retrying must not hold the run up
            nursery.cancel_scope.deadline = trio.current_time() + max(
                0.0, stop_at - time.monotonic()) + GRACE
            for k in range(self.producers):
                nursery.start_soon(self._transactions, f"{self.topic}-t{k}", stop_at)
            for k in range(self.half_producers):
                nursery.start_soon(self._halves, f"chaos-pg{k}", stop_at)
            for _ in range(self.readers):
                nursery.start_soon(self._reader, stop_at)
            if self.pipeline:
                nursery.start_soon(self._feeder, stop_at)
                nursery.start_soon(self._pipeline, stop_at)
            if self.killed_before_add:
                nursery.start_soon(self._killed_before_add, stop_at)

    # ---------------- Kafka's model

    async def _transactions(self, tid: str, stop_at: float) -> None:
        """One transactional id's producers, one after another; the abandoned ones stay
        open (in `stack`, closed when the run ends) as a killed process's would."""
        async with AsyncExitStack() as stack:
            await self._transactions_in(stack, tid, stop_at)

    async def _transactions_in(self, stack: AsyncExitStack, tid: str, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            producer = Producer(self.namesrv, transactional_id=tid, send_timeout=self.send_timeout,
                                transaction_timeout_ms=self.transaction_timeout_ms)
            try:
                await stack.enter_async_context(producer)
            except RequestError:
                await trio.sleep(_PAUSE_AFTER_ERROR)
                continue
            process = self._process()
            left: tuple[Transaction, int, str] | None = None
            while time.monotonic() < stop_at and left is None:
                left = await self._one_txn(producer, process, tid)
                if self.pause:
                    await trio.sleep(self.pause)
            if left is None:
                return
            # killed: when the run ends its producer closes without the abort a live one
            # sends (a two-hour run holds about a thousand of them: aborted one by one,
            # each failing after its timeout, they held the run up for hours)
            stack.callback(_never_ended, left[0])
            # abandoned (or zombie): a successor takes the id over; its first transaction
            # inits, which fences `producer`
            tx, old_process, plan = left
            if plan == "zombie":
                await self._zombie(tx, old_process, tid, stop_at)

    async def _killed_before_add(self, stop_at: float) -> None:
        """Producers killed between their first send and its TX_ADD, most with an id never
        used before (as Spark jobs without a `queryName` make): the prepared batch is
        stored, the coordinator never hears of the group. Nothing but its producer's
        commit could commit it, so it must never be read (the checker's aborted reads);
        how the cluster resolves such data is the product's business, not this one's.
        Every other one, when there is one, takes the id of the oldest one at least
        `REUSE_AFTER` old (a job run again under its old id after a pause): by then the
        cluster has usually forgotten the id, and its new epoch must still be above every
        earlier one (the checker's reused epochs)."""
        process = self._process()
        k = 0
        used: list[tuple[float, str]] = []  # (when, id) of the ids not reused yet
        while time.monotonic() < stop_at:
            k += 1
            tid = f"{self.topic}-gone-{process}-{k}"
            if used and used[0][0] < time.monotonic() - REUSE_AFTER and k % 2:
                tid = used.pop(0)[1]
                self._count("id-reused")
            used.append((time.monotonic(), tid))
            await self._one_killed_before_add(process, tid, f"{tid}-{k}")
            await trio.sleep(self.rng.uniform(1.0, 3.0))

    async def _one_killed_before_add(self, process: int, tid: str, body: str) -> None:
        async with Producer(self.namesrv, transactional_id=tid, send_timeout=self.send_timeout,
                            transaction_timeout_ms=KILLED_TIMEOUT_MS) as producer:
            tx = await self._begin(producer, process, tid)
            if tx is None:
                return
            queue = self.rng.randrange(self.queues[self.topic])
            rec = self.recorder
            rec.invoke(process, "txn", tid, {"id": body, "epoch": tx.epoch, "n": tx.n,
                                             "sends": [[self.topic, queue, body]],
                                             "plan": "abandon"})
            # the transaction's first send, as the SDK makes it, without the TX_ADD the
            # SDK sends beside it
            data = encode_batch(self.topic, queue, [OutgoingMessage(body.encode())],
                                tx=(tid, tx.epoch, tx.n))
            try:
                await producer._check_open().call_queue(
                    self.topic, queue, Op.PRODUCE, lambda g: ProduceRequest(g=g).header(),
                    data, write=True,
                    timeout=self.send_timeout)
            except Exception:  # noqa: BLE001, S110 - stored or not, it is never committed
                pass
            finally:
                self._count("killed-before-add")
                rec.complete(process, "fail", "txn", tid,
                             {"error": "killed between its first send and TX_ADD"})
                _never_ended(tx)  # killed: not even the abort a closing producer sends

    async def _begin(self, producer: Producer, process: int, tid: str) -> Transaction | None:
        """Begin a transaction, recording the init (``tx-init``) when it registers the id."""
        owner = producer._txn
        init = owner is not None and owner.epoch < 0
        rec = self.recorder
        if init:
            rec.invoke(process, "tx-init", tid, None)
        try:
            tx = await producer.begin()
        except Exception as exc:  # noqa: BLE001 - an init may or may not have happened
            if init:
                rec.complete(process, "info", "tx-init", tid, {"error": repr(exc)})
            return None
        except BaseException:
            if init:
                rec.complete(process, "info", "tx-init", tid, {"error": "cancelled"})
            raise
        if init:
            rec.complete(process, "ok", "tx-init", tid, {"epoch": tx.epoch})
        return tx

    async def _one_txn(self, producer: Producer, process: int, tid: str,
                       plan: str | None = None) -> tuple[Transaction, int, str] | None:
        """One transaction (`plan`, or one drawn); returns it when it was left open
        (abandoned or zombie). Zombies are a transaction's first of its epoch, like the
        successor's, so a coordinator that ignored epochs would take the zombie's commit
        for the successor's transaction."""
        tx = await self._begin(producer, process, tid)
        if tx is None:
            await trio.sleep(_PAUSE_AFTER_ERROR)
            return None
        if plan is None:
            plan = ("zombie" if tx.n == 0 and self.rng.random() < ZOMBIES
                    else _draw(self.rng, _PLANS))
        if not await self._send_all(tx, process, tid, plan, self.rng.randint(1, 10)):
            return None
        rec = self.recorder
        if plan in ("abandon", "zombie"):
            if plan == "abandon":
                rec.complete(process, "fail", "txn", tid, {"error": "abandoned"})
            return tx, process, plan
        if plan == "abort":
            try:
                await tx.abort()
            except Exception as exc:  # noqa: BLE001 - never asked to commit: aborted
                rec.complete(process, "fail", "txn", tid, {"error": repr(exc)})
            except BaseException:
                rec.complete(process, "fail", "txn", tid, {"error": "cancelled"})
                raise
            else:
                rec.complete(process, "ok", "txn", tid, {"outcome": "abort"})
            return None
        await self._commit(tx, process, tid)
        return None

    async def _send_all(self, tx: Transaction, process: int, tid: str, plan: str,
                        size: int) -> bool:
        """Record transaction `tx` (with `size` messages over random queues) and send its
        messages; False (recorded as failed, and aborted) when a send failed."""
        self._txns += 1
        name = f"k{self._txns}"
        queues = self.queues[self.topic]
        sends: list[tuple[str, int, str]] = [
            (self.topic, self.rng.randrange(queues), f"{name}.{i}") for i in range(size)]
        rec = self.recorder
        value = {"id": name, "epoch": tx.epoch, "n": tx.n, "sends": [list(s) for s in sends],
                 "plan": plan}
        rec.invoke(process, "txn", tid, value)
        try:
            futures = [await tx.send_async(t, body, queue=q) for t, q, body in sends]
            for fut in futures:
                await fut
        except Exception as exc:  # noqa: BLE001 - no commit asked: it cannot commit
            rec.complete(process, "fail", "txn", tid, {"error": repr(exc)})
            with trio.move_on_after(self.send_timeout * 2):
                try:
                    await tx.abort()
                except Exception:  # noqa: BLE001, S110 - the timeout aborts it anyway
                    pass
            self._count("send-failed")
            return False
        except BaseException:
            rec.complete(process, "fail", "txn", tid, {"error": "cancelled"})
            raise
        return True

    async def _commit(self, tx: Transaction, process: int, tid: str) -> None:
        rec = self.recorder
        rec.attempt(process, "txn", tid, {"commit": True})
        try:
            await tx.commit()
        except (TransactionAbortedError, ProducerFencedError) as exc:
            rec.complete(process, "fail", "txn", tid, {"error": repr(exc)})
            self._count("commit-refused")
        except Exception as exc:  # noqa: BLE001 - the decision may have been taken
            rec.complete(process, "info", "txn", tid, {"error": repr(exc)})
            self._count("commit-unknown")
        except BaseException:
            rec.complete(process, "info", "txn", tid, {"error": "cancelled"})
            raise
        else:
            rec.complete(process, "ok", "txn", tid, {"outcome": "commit"})

    async def _zombie(self, tx: Transaction, old_process: int, tid: str, stop_at: float) -> None:
        """A successor registers `tid` (its init recorded) and begins its own first
        transaction; then the old producer, still holding its open transaction, asks to
        commit it, and tries one more transaction: all of that must be refused (the last
        may be refused by the SDK itself, once the broker told it that it is fenced).
        Then the successor commits."""
        successor = Producer(self.namesrv, transactional_id=tid, send_timeout=self.send_timeout,
                             transaction_timeout_ms=self.transaction_timeout_ms)
        process = self._process()
        async with successor:
            while True:
                mine = await self._begin(successor, process, tid)
                if mine is not None:
                    break
                if time.monotonic() > stop_at:
                    self.recorder.complete(old_process, "fail", "txn", tid, {"error": "not tried"})
                    return
                await trio.sleep(_PAUSE_AFTER_ERROR)
            sent = await self._send_all(mine, process, tid, "commit", self.rng.randint(1, 3))
            self._count("zombie")
            await self._commit(tx, old_process, tid)
            await self._one_txn(tx.producer, old_process, tid, "commit")
            if sent:
                await self._commit(mine, process, tid)

    # ---------------- RocketMQ's model

    def _listener(self, process: int) -> Callable[[CheckRequest], Any]:
        async def answer(req: CheckRequest) -> str:
            body, local = self._local.get(req.txid, (None, "unknown"))
            if req.txid in self._ended and self.rng.random() < _FLIP:
                # decided and acknowledged: a check-back now (one that was in flight) must
                # change nothing whatever it hears, so it sometimes hears the opposite
                local = {"commit": "rollback", "rollback": "commit"}.get(local, local)
            key = queue_key(req.topic, req.queue)
            self.recorder.invoke(process, "check", key,
                                 {"body": body, "txid": req.txid, "checks": req.checks})
            self.recorder.complete(process, "ok", "check", key, {"answer": local})
            return local

        return answer

    async def _halves(self, group: str, stop_at: float) -> None:
        listener = self._process()
        process = self._process()
        seq = 0
        async with Producer(self.namesrv, producer_group=group, send_timeout=self.send_timeout,
                            check_listener=self._listener(listener)) as producer:
            while time.monotonic() < stop_at:
                seq += 1
                await self._one_half(producer, process, f"h{process}-{seq}")
                if self.pause:
                    await trio.sleep(self.pause)

    async def _one_half(self, producer: Producer, process: int, body: str) -> None:
        local = _draw(self.rng, _LOCALS)
        plan = local if local != "unknown" and self.rng.random() < 0.7 else "crash"
        queue = self.rng.randrange(self.queues[self.topic])
        key = queue_key(self.topic, queue)
        rec = self.recorder
        rec.invoke(process, "half", key, {"id": body, "topic": self.topic, "queue": queue,
                                          "body": body, "local": local, "plan": plan})
        try:
            handle = await producer.prepare(self.topic, body, queue=queue)
        except RequestError as exc:
            kind = "fail" if _written_for_sure_not(exc) else "info"
            rec.complete(process, kind, "half", key, {"error": repr(exc)})
            await trio.sleep(_PAUSE_AFTER_ERROR)
            return
        except Exception as exc:  # noqa: BLE001
            rec.complete(process, "info", "half", key, {"error": repr(exc)})
            return
        except BaseException:
            rec.complete(process, "info", "half", key, {"error": "cancelled"})
            raise
        self._local[handle.txid] = (body, local)
        if plan == "crash":
            self._undecided[handle.txid] = body
            rec.complete(process, "ok", "half", key, {"outcome": "prepared", "txid": handle.txid})
            return
        # prepared for a while, for readers to look; now and then past the first
        # check-back, so that checks race the producer's end
        hold = (self.rng.uniform(0.8, 1.5) if self.rng.random() < _HOLD_LONG
                else self.rng.uniform(0.05, 0.3))
        try:
            await trio.sleep(hold)
        except BaseException:  # the listener knows it: check-back may commit it
            rec.complete(process, "info", "half", key, {"error": "cancelled", "txid": handle.txid})
            raise
        rec.attempt(process, "half", key, None)
        try:
            if plan == "commit":
                await handle.commit()
            else:
                await handle.rollback()
        except Exception as exc:  # noqa: BLE001 - delivered or not: check-back answers local
            self._undecided[handle.txid] = body
            rec.complete(process, "info", "half", key, {"error": repr(exc), "txid": handle.txid})
            return
        except BaseException:
            rec.complete(process, "info", "half", key, {"error": "cancelled", "txid": handle.txid})
            raise
        self._ended.add(handle.txid)
        rec.complete(process, "ok", "half", key, {"outcome": plan, "txid": handle.txid})

    # ---------------- readers

    async def _reader(self, stop_at: float) -> None:
        process = self._process()
        keys = [(t, q) for t in (self.topic, self.out_topic) for q in range(self.queues[t])]
        async with PullConsumer(self.namesrv, _READERS_GROUP) as consumer:
            while time.monotonic() < stop_at:
                topic, queue = self.rng.choice(keys)
                tail = self._tails.get(queue_key(topic, queue), 0)
                offset = max(0, tail - self.rng.randrange(16))
                if await self._read(consumer, process, "tx-read", topic, queue, offset, 64) is None:
                    await trio.sleep(_PAUSE_AFTER_ERROR)
                else:
                    await trio.sleep(0.01)

    async def _read(self, consumer: PullConsumer, process: int, f: str, topic: str, queue: int,
                    offset: int, n: int) -> list[str] | None:
        key = queue_key(topic, queue)
        rec = self.recorder
        rec.invoke(process, f, key, {"offset": offset, "n": n})
        try:
            res = await fetch(consumer.routes, topic, queue, offset, max_messages=n, wait_ms=0)
        except RequestError as exc:
            if exc.code == Code.OFFSET_TOO_LARGE:
                rec.complete(process, "ok", f, key, [])
                return []
            rec.complete(process, "fail", f, key, {"error": repr(exc)})
            return None
        except Exception as exc:  # noqa: BLE001 - a read changes nothing
            rec.complete(process, "fail", f, key, {"error": repr(exc)})
            return None
        except BaseException:
            rec.complete(process, "fail", f, key, {"error": "cancelled"})
            raise
        bodies = [m.body.decode("utf-8", "replace") for m in res.messages]
        rec.complete(process, "ok", f, key, bodies)
        self._tails[key] = max(self._tails.get(key, 0), offset + len(bodies))
        return bodies

    # ---------------- the pipeline

    async def _feeder(self, stop_at: float) -> None:
        process = self._process()
        seq = 0
        rec = self.recorder
        async with Producer(self.namesrv, idempotent=True, send_timeout=self.send_timeout) as p:
            while time.monotonic() < stop_at:
                seq += 1
                body = f"in{seq}"
                queue = self.rng.randrange(self.queues[self.in_topic])
                key = queue_key(self.in_topic, queue)
                rec.invoke(process, "pipe-in", key, {"body": body})
                try:
                    result = await p.send(self.in_topic, body, queue=queue)
                except Exception as exc:  # noqa: BLE001 - stored or not: the drain says
                    rec.complete(process, "info", "pipe-in", key, {"error": repr(exc)})
                    await trio.sleep(_PAUSE_AFTER_ERROR)
                    continue
                except BaseException:
                    rec.complete(process, "info", "pipe-in", key, {"error": "cancelled"})
                    raise
                rec.complete(process, "ok", "pipe-in", key, {"offset": result.offset})
                await trio.sleep(0.05)

    def _pipeline_argv(self) -> list[str]:
        return [self.python, "-m", "chaos.pipeline", "--namesrv", self.namesrv,
                "--input", self.in_topic, "--output", self.out_topic,
                "--queues", str(self.queues[self.in_topic]),
                "--out-queues", str(self.queues[self.out_topic]),
                "--group", PIPE_GROUP, "--tid", f"{self.in_topic}-worker",
                "--send-timeout", str(self.send_timeout)]

    async def _pipeline(self, stop_at: float) -> None:
        """Run the worker, SIGKILL it after a few seconds, start another; until `stop_at`."""
        while time.monotonic() < stop_at:
            life = self.rng.uniform(*self.pipeline_kill_every)
            await self._one_worker(min(stop_at, time.monotonic() + life))

    async def _one_worker(self, until: float) -> None:
        process = self._process()
        self.pipeline_starts += 1
        env = dict(os.environ)
        if self.log is not None:
            with self.log.open("ab") as log:
                log.write(f"--- pipeline worker {process}\n".encode())
                proc = await trio.lowlevel.open_process(
                    self._pipeline_argv(), stdout=subprocess.PIPE, stderr=log, env=env,
                    start_new_session=True)
        else:
            proc = await trio.lowlevel.open_process(
                self._pipeline_argv(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=env, start_new_session=True)
        assert proc.stdout is not None
        try:
            with trio.move_on_after(max(0.0, until - time.monotonic())):
                buffered = b""
                while True:
                    chunk = await proc.stdout.receive_some(65536)
                    if not chunk:
                        break
                    buffered += chunk
                    *lines, buffered = buffered.split(b"\n")
                    for line in lines:
                        self._forward(process, line)
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.send_signal(signal.SIGKILL)  # the point: a worker killed mid-work
                await proc.wait()
                # what it printed before dying is still in the pipe
                rest = b""
                with trio.move_on_after(1):
                    while chunk := await proc.stdout.receive_some(65536):
                        rest += chunk
                for line in (buffered + rest).split(b"\n"):
                    self._forward(process, line)
                await proc.stdout.aclose()

    def _forward(self, process: int, line: bytes) -> None:
        """One line of the worker into the history, under `process`, at its own time
        (a torn last line of a killed worker is dropped)."""
        try:
            entry = json.loads(line)
        except ValueError:
            return
        if not isinstance(entry, dict) or entry.get("type") not in (
                "invoke", "ok", "fail", "info", "attempt"):
            return
        self.recorder.forward({**entry, "process": process})

    # ------------------------------------------------------------ after the faults

    async def drain(self, timeout: float) -> bool:
        """Wait (at most half of `timeout`) until nothing is undecided, record how the
        halves the producers left were decided and the pipeline's committed offsets,
        then read every queue from 0 to its end; True when every queue was read."""
        began = time.monotonic()
        await self._settle(began + timeout / 3)
        with trio.move_on_after(timeout / 6):
            await self._half_status()
        async with PullConsumer(self.namesrv, _READERS_GROUP) as consumer:
            if self.pipeline:
                with trio.move_on_after(timeout / 6):
                    await self._pipe_offsets(consumer)
            # the reads get what is left, and at least half of it
            deadline = max(began + timeout, time.monotonic() + timeout / 2)
            self.drained = {queue_key(t, q): False for t, n in self.queues.items()
                            for q in range(n)}
            async with trio.open_nursery() as nursery:
                for topic, n in self.queues.items():
                    for q in range(n):
                        nursery.start_soon(self._drain_queue, consumer, topic, q, deadline)
        return all(self.drained.values())

    async def _settle(self, until: float) -> None:
        """Until no half message waits for a decision and no transaction is still being
        decided or completed (as `tx_list` says), or `until`."""
        async with Admin(self.namesrv) as admin:
            while time.monotonic() < until:
                try:
                    rows = await admin.tx_list()
                except Exception:  # noqa: BLE001 - a group without a leader yet: again
                    await trio.sleep(0.5)
                    continue
                busy = [t for t in rows.get("txns", [])
                        if str(t.get("state", "")).startswith(("prepare", "ongoing"))]
                if not rows.get("halves") and not busy:
                    return
                await trio.sleep(0.5)

    async def _half_status(self) -> None:
        """How each half its producer did not end was decided (``half-status``), from
        the participants' rings of decisions (one `tx_list`, retried until it answers;
        when its lists were cut to fit, one more for each half it did not name)."""
        if not self._undecided:
            return
        async with Admin(self.namesrv) as admin:
            while True:
                try:
                    rows = await admin.tx_list(limit=10_000)
                    break
                except Exception:  # noqa: BLE001 - a group without a leader: again
                    await trio.sleep(0.5)
            decided = {str(r.get("id")): r for r in rows.get("decided", [])}
            if rows.truncated:  # cut to fit one answer: ask about the rest
                for txid in sorted(set(self._undecided) - set(decided)):
                    decided.update(await self._decided_rows(admin, txid))
        process = self._process()
        rec = self.recorder
        for txid, body in sorted(self._undecided.items()):
            rec.invoke(process, "half-status", txid, {"body": body})
            row = decided.get(txid)
            if row is None:
                rec.complete(process, "ok", "half-status", txid, {"commit": None, "source": None})
            else:
                rec.complete(process, "ok", "half-status", txid,
                             {"commit": bool(row.get("commit")), "source": row.get("source")})

    @staticmethod
    async def _decided_rows(admin: Admin, txid: str) -> dict[str, dict[str, Any]]:
        """The participants' decision about one half message, by its txid (retried until
        every group answers)."""
        while True:
            try:
                rows = await admin.tx_list(txid)
                return {str(r.get("id")): r for r in rows.get("decided", [])
                        if str(r.get("id")) == txid}
            except Exception:  # noqa: BLE001 - a group without a leader: again
                await trio.sleep(0.5)

    async def _pipe_offsets(self, consumer: PullConsumer) -> None:
        """The pipeline group's committed offsets (``pipe-offsets``); retried until
        every queue answered (cancelled: no record, the pipeline rules are not judged)."""
        process = self._process()
        offsets: dict[str, int | None] = {}
        for q in range(self.queues[self.in_topic]):
            while True:
                try:
                    got = await query_offset(consumer.routes, PIPE_GROUP, self.in_topic, q)
                    break
                except RequestError:
                    await trio.sleep(0.2)
            offsets[queue_key(self.in_topic, q)] = None if got < 0 else got
        rec = self.recorder
        rec.invoke(process, "pipe-offsets", PIPE_GROUP, None)
        rec.complete(process, "ok", "pipe-offsets", PIPE_GROUP, offsets)

    async def _drain_queue(self, consumer: PullConsumer, topic: str, queue: int,
                           deadline: float) -> None:
        process = self._process()
        offset = 0
        with trio.move_on_after(max(0.0, deadline - time.monotonic())):
            while True:
                got = await self._read(consumer, process, "tx-drain", topic, queue, offset,
                                       DRAIN_BATCH)
                if got is None:
                    await trio.sleep(0.2)
                    continue
                offset += len(got)
                if len(got) < DRAIN_BATCH:
                    self.drained[queue_key(topic, queue)] = True
                    return
