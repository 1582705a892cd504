"""The delayed-message workload of `raftmq chaos run --workload delay`: what it does and
records.

Every operation goes into the run's history in the forms `chaos.delaycheck` reads (its
docstring is the format, and says why every time in it is a wall-clock millisecond). A
topic of its own, ``<base>-delay``, with two queues in every group:

- **producers**, plain and idempotent, one process each, send delayed messages one at a
  time to random queues: most with a relative `delay` of 0.5 to 20 s, some by
  `delay_level` 1 to 3 (1 s, 5 s, 10 s), some with `deliver_at` (an aware datetime or
  epoch seconds, now and then one already past, due at once). Plain producers record
  every PRODUCE request that carried a message (`attempt`), since each may store a copy;
- **a transactional producer** sends one to three delayed messages per transaction over
  random queues, most committed, some aborted;
- **readers**, each following every queue from offset 0 (one task per queue, fetches that
  wait briefly at the end), record each answer that returned messages with the wall
  clock when it came (`seen_ms`) and each message's offset and store time.

Near the end of the load a new message's delay is cut to what falls due within
`TAIL_S` seconds of its end, so a run does not wait out 20 s delays after the heal (a
level whose delay is longer is then sent as a plain `delay` instead).

The readers go on after the load, through the heal, until `drain` begins. `drain` waits
until everything sent could be due (the latest due time any send could have, plus
`DUE_SLACK_S`) while they go on, stops them, and reads every queue from offset 0 to its
end (``delay-drain``); while acknowledged messages are missing it reads on from the end
it reached, for `MISSING_WAIT_S` at most, so a message merely slow to move is not taken
for lost, and one that is lost costs a run that many seconds.
"""

from __future__ import annotations

import math
import random
import time
from datetime import UTC, datetime
from typing import Any

import trio

from raftmq.client import Producer, PullConsumer
from raftmq.client.consumer import fetch
from raftmq.client.delays import DELAY_LEVELS, due_fields
from raftmq.client.errors import ProducerFencedError, TransactionAbortedError
from raftmq.client.producer import SendAttempt
from wire.protocol import Code, RequestError

from .recorder import Recorder
from .workload import _written_for_sure_not, create_topics, queue_key

__all__ = ["DelayWorkload"]

MIN_DELAY_S = 0.5
MAX_DELAY_S = 20.0
LEVELS = (1, 2, 3)  # 1 s, 5 s, 10 s
TAIL_S = 3.0  # new messages fall due at most this long after the load ends
DUE_SLACK_S = 3.0  # after the latest due time: a leader's wake-up and one commit, with room
MISSING_WAIT_S = 15.0  # the drain reads on this long at most while acknowledged ones miss
READ_WAIT_MS = 200  # a reader's fetch waits this long at the end of a queue
READ_N = 256
DRAIN_N = 256
GRACE = 10.0  # seconds after the load's end before sends still going are cancelled
_PAUSE_AFTER_ERROR = 0.2
_COMMIT = 0.75  # share of transactions committed (the others aborted)
_READERS_GROUP = "chaos-delay-readers"


def wall_ms() -> int:
    """The wall clock in ms, the clock a leader decides due times by."""
    return time.time_ns() // 1_000_000


class DelayWorkload:
    """The delayed-message load (module docstring): `run` until a time, `follow` with
    readers until `drain`."""

    def __init__(
        self,
        namesrv: str,
        base: str,
        groups: int,
        *,
        recorder: Recorder,
        rng: random.Random,
        producers: int = 2,
        idempotent_producers: int = 2,
        transactional: int = 1,
        readers: int = 2,
        pause: tuple[float, float] = (0.05, 0.25),
        max_delay: float = MAX_DELAY_S,
        send_timeout: float = 3.0,
    ) -> None:
        if groups < 1:
            raise ValueError("groups must be at least 1")
        if not MIN_DELAY_S <= max_delay:
            raise ValueError(f"max_delay must be at least {MIN_DELAY_S} s")
        self.namesrv = namesrv
        self.topic = f"{base}-delay"
        self.queues = 2 * groups
        self.recorder = recorder
        self.rng = rng
        self.producers = producers
        self.idempotent_producers = idempotent_producers
        self.transactional = transactional
        self.readers = readers
        self.pause = pause
        self.max_delay = max_delay
        self.send_timeout = send_timeout
        self.queue_groups: dict[str, str] = {}
        self.stats: dict[str, int] = {}
        self.drained: dict[str, bool] = {}
        self._latest_due_ms = 0  # the latest any send so far could fall due
        self._acked: dict[int, set[str]] = {}  # queue -> acknowledged bodies
        self._seen: dict[int, set[str]] = {}  # queue -> bodies the drain read
        self._sending: dict[bytes, tuple[str, str]] = {}  # body -> (process, key)
        self._stop_at = math.inf
        self._follow_scope: trio.CancelScope | None = None

    def _count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n

    # ------------------------------------------------------------ setup

    async def setup(self, timeout: float = 30.0) -> dict[str, str]:
        """Create the topic (queues in every group) and learn queue -> group."""
        self.queue_groups = await create_topics(self.namesrv, {self.topic: self.queues}, timeout)
        return dict(self.queue_groups)

    # ------------------------------------------------------------ what to send

    def _rule(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """A message's rule as recorded (`chaos.delaycheck`) and as the SDK takes it,
        its due time kept within `TAIL_S` of the load's end."""
        room = self._stop_at + TAIL_S - time.monotonic()
        longest = max(MIN_DELAY_S, min(self.max_delay, room))
        x = self.rng.random()
        if x < 0.2:
            fits = [n for n in LEVELS if DELAY_LEVELS[n - 1] <= longest]
            if fits:
                level = self.rng.choice(fits)
                delay_ms, _at = due_fields(delay_level=level)
                return {"delay_ms": delay_ms, "level": level}, {"delay_level": level}
        if 0.2 <= x < 0.45:
            ahead = (-1.0 if self.rng.random() < 0.1
                     else self.rng.uniform(MIN_DELAY_S, longest))
            at_s = time.time() + ahead
            at: datetime | float = (datetime.fromtimestamp(at_s, UTC)
                                    if self.rng.random() < 0.5 else at_s)
            _delay, at_ms = due_fields(deliver_at=at)
            return {"at_ms": at_ms}, {"deliver_at": at}
        seconds = round(self.rng.uniform(MIN_DELAY_S, longest), 3)
        delay_ms, _at = due_fields(delay=seconds)
        return {"delay_ms": delay_ms}, {"delay": seconds}

    def _could_be_due(self, rule: dict[str, Any], after_ms: int) -> None:
        """A message with `rule` stored no later than `after_ms` is due by then."""
        due = rule["at_ms"] if "at_ms" in rule else after_ms + rule["delay_ms"]
        self._latest_due_ms = max(self._latest_due_ms, due)

    # ------------------------------------------------------------ the run

    async def run(self, stop_at: float) -> None:
        """Producers until `stop_at` (`time.monotonic()`); sends still going `GRACE`
        seconds later are cancelled (recorded as unknown)."""
        if not self.queue_groups:
            await self.setup()
        self._stop_at = stop_at
        async with trio.open_nursery() as nursery:
            nursery.cancel_scope.deadline = trio.current_time() + max(
                0.0, stop_at - time.monotonic()) + GRACE
            for k in range(self.producers):
                nursery.start_soon(self._producer, f"delay-p{k}", False, stop_at)
            for k in range(self.idempotent_producers):
                nursery.start_soon(self._producer, f"delay-i{k}", True, stop_at)
            for k in range(self.transactional):
                nursery.start_soon(self._transactions, f"{self.topic}-t{k}", stop_at)

    async def follow(self) -> None:
        """The readers, from now until `drain` stops them (or this is cancelled)."""
        with trio.CancelScope() as scope:
            self._follow_scope = scope
            async with PullConsumer(self.namesrv, _READERS_GROUP) as consumer:
                async with trio.open_nursery() as nursery:
                    for k in range(self.readers):
                        for q in range(self.queues):
                            nursery.start_soon(self._reader, consumer, f"delay-r{k}-{q}", q)

    def _on_attempt(self, attempt: SendAttempt) -> None:
        for m in attempt.messages:
            sending = self._sending.get(m if isinstance(m, bytes) else m.body)
            if sending is not None:
                process, key = sending
                self.recorder.attempt(process, "delay-send", key, None)

    async def _producer(self, process: str, idempotent: bool, stop_at: float) -> None:
        seq = 0
        async with Producer(self.namesrv, idempotent=idempotent, send_timeout=self.send_timeout,
                            on_attempt=None if idempotent else self._on_attempt) as producer:
            while time.monotonic() < stop_at:
                seq += 1
                if not await self._send(producer, process, f"{process}-{seq}", idempotent):
                    await trio.sleep(_PAUSE_AFTER_ERROR)
                await trio.sleep(self.rng.uniform(*self.pause))

    async def _send(self, producer: Producer, process: str, body: str, idempotent: bool) -> bool:
        queue = self.rng.randrange(self.queues)
        key = queue_key(self.topic, queue)
        rule, kwargs = self._rule()
        rec = self.recorder
        rec.invoke(process, "delay-send", key, {
            "body": body, "producer": "idempotent" if idempotent else "plain",
            "sent_ms": wall_ms(), **rule})
        self._count("sent")
        self._sending[body.encode()] = (process, key)
        try:
            result = await producer.send(self.topic, body, queue=queue, **kwargs)
        except Exception as exc:  # noqa: BLE001 - sorted into fail and unknown below
            sure = isinstance(exc, RequestError) and _written_for_sure_not(exc)
            rec.complete(process, "fail" if sure else "info", "delay-send", key,
                         {"error": repr(exc)})
            self._count("failed" if sure else "unknown")
            if not sure:
                self._could_be_due(rule, wall_ms())
            return False
        except BaseException:
            rec.complete(process, "info", "delay-send", key, {"error": "cancelled"})
            self._could_be_due(rule, wall_ms())
            raise
        finally:
            del self._sending[body.encode()]
        ack = wall_ms()
        rec.complete(process, "ok", "delay-send", key,
                     {"msg_id": result.msg_id, "offset": result.offset, "ack_ms": ack})
        self._count("acknowledged")
        self._could_be_due(rule, ack)
        self._acked.setdefault(queue, set()).add(body)
        return True

    async def _transactions(self, tid: str, stop_at: float) -> None:
        """Transactions of delayed messages, one after another; a producer whose
        transaction went wrong is replaced (its successor's init fences it)."""
        process = f"delay-{tid}"
        k = 0
        while time.monotonic() < stop_at:
            async with Producer(self.namesrv, transactional_id=tid,
                                send_timeout=self.send_timeout) as producer:
                while time.monotonic() < stop_at:
                    k += 1
                    if not await self._one_txn(producer, process, tid, f"{tid}-{k}"):
                        await trio.sleep(_PAUSE_AFTER_ERROR)
                        break
                    await trio.sleep(self.rng.uniform(*self.pause))

    async def _one_txn(self, producer: Producer, process: str, tid: str, name: str) -> bool:
        """One transaction; False when anything went wrong (the producer is then
        replaced)."""
        try:
            tx = await producer.begin()
        except Exception:  # noqa: BLE001 - nothing recorded yet: try again
            return False
        plan = "commit" if self.rng.random() < _COMMIT else "abort"
        messages = []
        for i in range(self.rng.randint(1, 3)):
            rule, kwargs = self._rule()
            queue = self.rng.randrange(self.queues)
            messages.append(({"body": f"{name}.{i}", "topic": self.topic, "queue": queue,
                              **rule}, kwargs))
        rec = self.recorder
        rec.invoke(process, "delay-txn", tid, {"id": name, "plan": plan,
                                               "messages": [m for m, _k in messages]})
        self._count("transactions")
        try:
            for m, kwargs in messages:
                await tx.send(self.topic, m["body"], queue=m["queue"], **kwargs)
        except Exception as exc:  # noqa: BLE001 - no commit asked: it cannot commit
            rec.complete(process, "fail", "delay-txn", tid, {"error": repr(exc)})
            with trio.move_on_after(self.send_timeout * 2):
                try:
                    await tx.abort()
                except Exception:  # noqa: BLE001, S110 - its timeout aborts it anyway
                    pass
            return False
        except BaseException:
            rec.complete(process, "fail", "delay-txn", tid, {"error": "cancelled"})
            raise
        if plan == "abort":
            try:
                await tx.abort()
            except Exception as exc:  # noqa: BLE001 - never asked to commit: aborted
                rec.complete(process, "fail", "delay-txn", tid, {"error": repr(exc)})
                return False
            except BaseException:
                rec.complete(process, "fail", "delay-txn", tid, {"error": "cancelled"})
                raise
            rec.complete(process, "ok", "delay-txn", tid, {"outcome": "abort",
                                                           "ack_ms": wall_ms()})
            return True
        rec.attempt(process, "delay-txn", tid, {"commit": True, "sent_ms": wall_ms()})
        try:
            await tx.commit()
        except (TransactionAbortedError, ProducerFencedError) as exc:
            rec.complete(process, "fail", "delay-txn", tid, {"error": repr(exc)})
            return False
        except Exception as exc:  # noqa: BLE001 - the decision may have been taken
            rec.complete(process, "info", "delay-txn", tid, {"error": repr(exc)})
            for m, _k in messages:
                self._could_be_due(m, wall_ms())
            return False
        except BaseException:
            rec.complete(process, "info", "delay-txn", tid, {"error": "cancelled"})
            for m, _k in messages:
                self._could_be_due(m, wall_ms())
            raise
        ack = wall_ms()
        rec.complete(process, "ok", "delay-txn", tid, {"outcome": "commit", "ack_ms": ack})
        for m, _k in messages:
            self._could_be_due(m, ack)
            self._acked.setdefault(m["queue"], set()).add(m["body"])
        return True

    # ---------------- readers

    async def _reader(self, consumer: PullConsumer, process: str, queue: int) -> None:
        offset = 0
        while True:
            try:
                got = await self._read(consumer, process, "delay-read", queue, offset, READ_N,
                                       READ_WAIT_MS, record_empty=False)
            except RequestError as exc:  # OFFSET_TOO_SMALL: retention went past it
                offset = max(offset, int(exc.extra.get("min") or 0))
                continue
            if got is None:
                await trio.sleep(_PAUSE_AFTER_ERROR)
                continue
            offset += len(got)

    async def _read(self, consumer: PullConsumer, process: str, f: str, queue: int,
                    offset: int, n: int, wait_ms: int, *, record_empty: bool) -> list[str] | None:
        """One fetch of `queue` from `offset`, recorded (an empty one only with
        `record_empty`); the bodies, or None when it failed. OFFSET_TOO_SMALL is raised
        to a reader (it goes on from the first offset kept) and is an empty read to the
        drain, which reads from 0 where every message must still be: one gone from the
        start of its queue is lost, not unread."""
        try:
            res = await fetch(consumer.routes, self.topic, queue, offset, max_messages=n,
                              wait_ms=wait_ms)
        except RequestError as exc:
            if exc.code == Code.OFFSET_TOO_SMALL and not record_empty:
                raise
            if exc.code not in (Code.OFFSET_TOO_LARGE, Code.OFFSET_TOO_SMALL):
                return None
            messages = []
        except Exception:  # noqa: BLE001 - a read changes nothing: left out
            return None
        else:
            messages = res.messages
        seen = wall_ms()
        if not messages and not record_empty:
            return []
        key = queue_key(self.topic, queue)
        rec = self.recorder
        rec.invoke(process, f, key, {"offset": offset, "n": n})
        rec.complete(process, "ok", f, key, {"seen_ms": seen, "messages": [
            [m.offset, m.body.decode("utf-8", "replace"), m.store_ms] for m in messages]})
        return [m.body.decode("utf-8", "replace") for m in messages]

    # ------------------------------------------------------------ after the faults

    async def drain(self, timeout: float) -> bool:
        """Wait (at most half of `timeout`) until everything sent could be due, stop the
        readers, then read every queue from 0 to its end, reading on while acknowledged
        messages are missing (`MISSING_WAIT_S`); True when every queue was read to its
        end."""
        began = time.monotonic()
        due_in = (self._latest_due_ms - wall_ms()) / 1000 + DUE_SLACK_S
        await trio.sleep(max(0.0, min(due_in, timeout / 2)))
        if self._follow_scope is not None:
            self._follow_scope.cancel()
        deadline = max(began + timeout, time.monotonic() + timeout / 2)
        self.drained = {queue_key(self.topic, q): False for q in range(self.queues)}
        async with PullConsumer(self.namesrv, _READERS_GROUP) as consumer:
            async with trio.open_nursery() as nursery:
                for q in range(self.queues):
                    nursery.start_soon(self._drain_queue, consumer, q, deadline)
        return all(self.drained.values())

    async def _drain_queue(self, consumer: PullConsumer, queue: int, deadline: float) -> None:
        process = f"delay-drain-{queue}"
        offset = 0
        seen = self._seen.setdefault(queue, set())
        missing_until: float | None = None
        with trio.move_on_after(max(0.0, deadline - time.monotonic())):
            while True:
                got = await self._read(consumer, process, "delay-drain", queue, offset,
                                       DRAIN_N, 0, record_empty=True)
                if got is None:
                    await trio.sleep(_PAUSE_AFTER_ERROR)
                    continue
                offset += len(got)
                seen.update(got)
                if len(got) == DRAIN_N:
                    continue
                self.drained[queue_key(self.topic, queue)] = True
                missing = self._acked.get(queue, set()) - seen
                if not missing:
                    return
                if missing_until is None:
                    missing_until = time.monotonic() + MISSING_WAIT_S
                    self._count("drain-waited-for-missing")
                if time.monotonic() >= missing_until:
                    return
                await trio.sleep(0.5)
