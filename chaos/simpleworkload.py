"""The simple-consumer workload of `raftmq chaos run --workload simple`: what it does and
records.

Every operation goes into the run's history in the forms `chaos.simplecheck` reads (its
docstring is the format, and says why every time in it is a wall-clock millisecond). A
topic of its own, ``<base>-simple``, with two queues in every group, and one consumer
group, `GROUP`:

- **producers**, one plain and one idempotent, send uniquely named messages to random
  queues (plain ones record every PRODUCE request, as `chaos.delayworkload`'s do); about
  one in `ALWAYS_FAIL` is an *always-fail* body (its name ends in ``-fail``) that every
  consumer nacks, or lets time out, so it reaches `MAX_DELIVERIES` and the dead letters;
- **consumers**, each a `SimpleConsumer` of its own, all of `GROUP`, with invisible times
  of 1 to 3 s, the backoff `BACKOFF` and `MAX_DELIVERIES` deliveries: two in the harness
  (one sweeping the queues with ``wait=0``, one long-polling), and a **worker** in a
  separate OS process (``python -m chaos.simpleworkload``) that the harness SIGKILLs every
  few seconds and starts again, so messages held by a killed consumer come back. Each
  message received is acked, most of the time; nacked with an error (`NACK`); held past
  its invisible time and acked late (`STALL`: refused as stale if it was delivered again
  meanwhile, taken if not); sent to the dead letters as poison (`POISON`); or given more
  time with `change_invisible` and then acked (`CHANGE`).

Every RECEIVE request that got no answer, or an error one, is recorded
(``simple-lost``): the connection pool of each consumer is a `RecordingPool`. A delivery
its answer carried was made and never seen, which the checker must know to tell a
delivery count that skipped from one whose delivery was lost on the way.

With ``fifo=True`` (`raftmq chaos run --workload fifo`) the same load runs on a topic
and consumer group of its own (``<base>-fifo``, `FIFO_GROUP`) with FIFO message groups:
each producer owns `FIFO_GROUPS` message groups, each always sent to one queue, and
sends to one group at a time, numbering its messages 1, 2, 3 ... (the body is
``<group>-<seq>``, the send record carries ``group`` and ``seq``), so the receipts part
must hand each group out one message at a time, in offset order (`chaos.fifocheck`).

The consumers in the harness go on after the load, through the heal, until `drain`
stops them. `drain` first has them settle everything (acks, and nacks of always-fail
bodies only) until every acknowledged message is acked or a dead letter, for
`SETTLE_WAIT_S` at most, then stops them and reads the group's dead letters
(`Admin.dlq_list`, each shown with `Admin.dlq_show`: ``simple-dlq``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import trio

from raftmq.client import Admin, Producer
from raftmq.client.errors import StaleReceiptError
from raftmq.client.producer import SendAttempt
from raftmq.client.simple import ReceivedMessage, SimpleConsumer
from transport.connection import DEFAULT_TIMEOUT, ConnectionPool
from wire.protocol import Code, Op, RequestError

from .recorder import Recorder
from .workload import _written_for_sure_not, create_topics, queue_key

__all__ = ["RecordingPool", "SimpleWorkload", "main"]

GROUP = "chaos-simple"
FIFO_GROUP = "chaos-fifo"
FIFO_GROUPS = 16  # message groups per producer
FIFO_PAUSE = (0.05, 0.25)  # between sends: a group's messages go out one at a time
INVISIBLE_S = (1.0, 3.0)
BACKOFF = (0.5, 1.0, 2.0)
MAX_DELIVERIES = 4
ALWAYS_FAIL = 15  # one body in this many always fails
NACK, STALL, POISON, CHANGE = 0.10, 0.08, 0.04, 0.08  # shares of the messages received
# a handler's time before it acks: a redelivered message is then held for a moment, so
# the late ack of a stalled earlier delivery can meet it in flight (the window in which a
# stale receipt must be refused)
HANDLING_S = (0.0, 0.3)
RECEIVE_MAX = 4
MAX_HELD = 16  # messages a consumer holds unsettled at most before it receives more
LONG_POLL_S = 1.0
SETTLE_WAIT_S = 30.0  # the drain waits this long at most for every message to be settled
WORKER_LIFE_S = (3.0, 6.0)  # a worker is killed after this long
GRACE = 10.0  # seconds after the load's end before sends still going are cancelled
_PAUSE_AFTER_ERROR = 0.2


def wall_ms() -> int:
    """The wall clock in ms, the clock a leader times deliveries by."""
    return time.time_ns() // 1_000_000


Emit = Callable[[dict[str, Any]], None]
"""Where a consumer's history entries go: the harness's recorder, or a worker's stdout."""


class RecordingPool(ConnectionPool):
    """A consumer's connection pool that reports every RECEIVE request answered by no
    answer or an error one (`on_lost(header, sent_ms, error)`): its receive may have been
    applied, and what it delivered never seen."""

    def __init__(self, on_lost: Callable[[Mapping[str, Any], int, str], None]) -> None:
        super().__init__()
        self.on_lost = on_lost

    async def request(self, addr: str, op: Op | int, header: Mapping[str, Any] | None = None,
                      body: bytes | bytearray | memoryview = b"", *,
                      timeout: float = DEFAULT_TIMEOUT) -> Any:
        if op != Op.RECEIVE:
            return await super().request(addr, op, header, body, timeout=timeout)
        sent = wall_ms()
        try:
            return await super().request(addr, op, header, body, timeout=timeout)
        except BaseException as exc:
            self.on_lost(header or {}, sent, repr(exc))
            raise


class Consumer:
    """One simple consumer's loop: receive, settle each message as the module docstring
    says, record it all through `emit`. `draining` (set from outside) makes it ack
    everything but the always-fail bodies."""

    def __init__(self, namesrv: str, topic: str, name: str, emit: Emit, rng: random.Random,
                 *, wait: float = 0.0, cg: str = GROUP) -> None:
        self.namesrv = namesrv
        self.cg = cg
        self.topic = topic
        self.name = name
        self.emit = emit
        self.rng = rng
        self.wait = wait
        self.draining = False
        self._ids = itertools.count(1)
        self._since: int | None = None
        self._invisible_ms = 0  # the shortest invisible time asked since `_since`

    def _entry(self, process: str, kind: str, f: str, key: Any, value: Any) -> None:
        self.emit({"process": process, "type": kind, "f": f, "key": key, "value": value,
                   "time": time.monotonic()})

    def _lost(self, header: Mapping[str, Any], sent: int, error: str) -> None:
        key = queue_key(str(header.get("topic")), int(header.get("queue") or 0))
        p = f"{self.name}.lost"
        self._entry(p, "invoke", "simple-lost", key, {"cg": self.cg, "sent_ms": sent})
        self._entry(p, "info", "simple-lost", key, {"error": error, "ms": wall_ms()})

    async def run(self) -> None:
        """Receive and settle until cancelled."""
        held = anyio.Semaphore(MAX_HELD)
        async with RecordingPool(self._lost) as pool, SimpleConsumer(
                self.namesrv, self.cg, invisible=INVISIBLE_S[1], wait=self.wait,
                max_deliveries=MAX_DELIVERIES, backoff=BACKOFF,
                pool=pool) as consumer, anyio.create_task_group() as tg:
            while True:
                invisible = round(self.rng.uniform(*INVISIBLE_S), 3)
                got = await self._receive(consumer, invisible)
                if got is None:
                    await anyio.sleep(_PAUSE_AFTER_ERROR)
                    continue
                if not got:
                    await anyio.sleep(0.05)
                for m in got:
                    await held.acquire()
                    tg.start_soon(self._settle, consumer, m, invisible, held)

    async def _receive(self, consumer: SimpleConsumer, invisible: float
                       ) -> list[ReceivedMessage] | None:
        invisible_ms = int(round(invisible * 1000))
        if self._since is None:
            self._since, self._invisible_ms = wall_ms(), invisible_ms
        self._invisible_ms = min(self._invisible_ms, invisible_ms)
        p = self.name
        self._entry(p, "invoke", "simple-receive", self.topic, {
            "cg": self.cg, "consumer": self.name, "max": RECEIVE_MAX,
            "invisible_ms": self._invisible_ms, "max_deliveries": MAX_DELIVERIES,
            "since_ms": self._since})
        try:
            got = await consumer.receive(self.topic, RECEIVE_MAX, invisible=invisible,
                                         wait=self.wait)
        except Exception as exc:  # noqa: BLE001 - what it had got may be lost: unknown
            self._entry(p, "info", "simple-receive", self.topic, {"error": repr(exc)})
            return None
        except BaseException:
            self._entry(p, "info", "simple-receive", self.topic, {"error": "cancelled"})
            raise
        self._entry(p, "ok", "simple-receive", self.topic, {"ms": wall_ms(), "messages": [
            [m.queue, m.offset, m.body.decode("utf-8", "replace"), m.deliveries,
             m.receipt.handle] for m in got]})
        # a long poll still running, or messages it brought kept for the next receive:
        # what the next one returns may have been delivered since this one began, with
        # this one's invisible time
        if not (consumer._polling.get(self.topic) or consumer._buffered.get(self.topic)):
            self._since = None
        return got

    async def _settle(self, consumer: SimpleConsumer, m: ReceivedMessage, invisible: float,
                      held: anyio.Semaphore) -> None:
        try:
            got = time.monotonic()
            body = m.body.decode("utf-8", "replace")
            x = self.rng.random()
            if body.endswith("-fail"):
                if x < 0.7:
                    await self._call(consumer, "simple-nack", m, {
                        "delay_ms": None, "backoff_ms": [int(b * 1000) for b in BACKOFF],
                        "error": "always fails"}, lambda: consumer.nack(m, error="always fails"))
                return  # else: its invisible time runs out
            if self.draining:
                await self._ack(consumer, m, got, invisible)
                return
            if x < POISON:
                await self._call(consumer, "simple-dead", m, {"error": "poison"},
                                 lambda: consumer.dead_letter(m, "poison"))
            elif x < POISON + NACK:
                delay = None if self.rng.random() < 0.5 else 0.2
                await self._call(consumer, "simple-nack", m, {
                    "delay_ms": None if delay is None else 200,
                    "backoff_ms": [int(b * 1000) for b in BACKOFF], "error": "failed"},
                    lambda: consumer.nack(m, delay=delay, error="failed"))
            elif x < POISON + NACK + STALL:
                await anyio.sleep(invisible + self.rng.uniform(0.2, 1.0))
                await self._ack(consumer, m, got, invisible)
            elif x < POISON + NACK + STALL + CHANGE:
                more = round(invisible + 1.0, 3)
                if await self._call(consumer, "simple-change", m,
                                    {"invisible_ms": int(more * 1000)},
                                    lambda: consumer.change_invisible(m, more)):
                    await anyio.sleep(self.rng.uniform(0.5, invisible))
                await self._ack(consumer, m, got, invisible)
            else:
                await anyio.sleep(self.rng.uniform(*HANDLING_S))
                await self._ack(consumer, m, got, invisible)
        finally:
            held.release()

    async def _ack(self, consumer: SimpleConsumer, m: ReceivedMessage, got: float,
                   invisible: float) -> None:
        late = time.monotonic() - got > invisible
        await self._call(consumer, "simple-ack", m, {"late": late}, lambda: consumer.ack(m))

    async def _call(self, consumer: SimpleConsumer, f: str, m: ReceivedMessage,
                    extra: dict[str, Any], call: Callable[[], Any]) -> bool:
        """One settling call, recorded; True when it was answered ok."""
        p = f"{self.name}.{next(self._ids)}"
        key = queue_key(self.topic, m.queue)
        self._entry(p, "invoke", f, key, {
            "cg": self.cg, "offset": m.offset, "handle": m.receipt.handle,
            "body": m.body.decode("utf-8", "replace"), "sent_ms": wall_ms(), **extra})
        try:
            await call()
        except StaleReceiptError as exc:
            self._entry(p, "fail", f, key, {"error": repr(exc), "stale": True})
            return False
        except RequestError as exc:
            if exc.code == Code.STALE_RECEIPT:
                self._entry(p, "fail", f, key, {"error": repr(exc), "stale": True})
            else:
                self._entry(p, "info", f, key, {"error": repr(exc)})
            return False
        except Exception as exc:  # noqa: BLE001 - unknown
            self._entry(p, "info", f, key, {"error": repr(exc)})
            return False
        except BaseException:
            self._entry(p, "info", f, key, {"error": "cancelled"})
            raise
        self._entry(p, "ok", f, key, {"ms": wall_ms()})
        return True


class SimpleWorkload:
    """The simple-consumer load (module docstring): `run` until a time, `follow` with
    the harness's consumers until `drain`."""

    def __init__(
        self,
        namesrv: str,
        base: str,
        groups: int,
        *,
        recorder: Recorder,
        rng: random.Random,
        producers: int = 1,
        idempotent_producers: int = 1,
        consumers: int = 2,
        workers: bool = True,
        pause: tuple[float, float] = (0.03, 0.15),
        send_timeout: float = 3.0,
        log: Path | None = None,
        python: str = sys.executable,
        fifo: bool = False,
    ) -> None:
        if groups < 1:
            raise ValueError("groups must be at least 1")
        self.namesrv = namesrv
        self.fifo = fifo
        self.cg = FIFO_GROUP if fifo else GROUP
        self.prefix = "fifo" if fifo else "simple"  # of its topic and process names
        self.topic = f"{base}-{self.prefix}"
        self.queues = 2 * groups
        self.recorder = recorder
        self.rng = rng
        self.producers = producers
        self.idempotent_producers = idempotent_producers
        self.workers = workers
        self.pause = FIFO_PAUSE if fifo else pause
        self.send_timeout = send_timeout
        self.log = log
        self.python = python
        self.queue_groups: dict[str, str] = {}
        self.stats: dict[str, int] = {}
        self.worker_starts = 0
        self.consumers = [
            Consumer(namesrv, self.topic, f"{self.prefix}-c{k}", self._record,
                     random.Random(rng.getrandbits(64)), wait=LONG_POLL_S if k % 2 else 0.0,
                     cg=self.cg)
            for k in range(consumers)]
        self._acknowledged: dict[tuple[str, int], str] = {}  # (queue, offset) -> body
        self._acked: set[tuple[str, int]] = set()
        self._maybe: set[tuple[str, int]] = set()  # last ack unknown
        self._acking: dict[str, tuple[str, int]] = {}  # open ack's process -> message
        self._sending: dict[bytes, tuple[str, str]] = {}  # body -> (process, key)
        self._follow_scope: trio.CancelScope | None = None

    def _count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n

    # ------------------------------------------------------------ setup

    async def setup(self, timeout: float = 30.0) -> dict[str, str]:
        """Create the topic (queues in every group) and learn queue -> group."""
        self.queue_groups = await create_topics(self.namesrv, {self.topic: self.queues}, timeout)
        return dict(self.queue_groups)

    # ------------------------------------------------------------ the record

    def _record(self, entry: dict[str, Any]) -> None:
        """A consumer's entry into the history; what it says about acks is kept for the
        drain (which messages are settled)."""
        self._observe(entry)
        self.recorder.forward(entry)

    def _observe(self, entry: dict[str, Any]) -> None:
        f, kind, process, v = entry.get("f"), entry.get("type"), entry.get("process"), \
            entry.get("value")
        if f == "simple-ack" and isinstance(process, str):
            if kind == "invoke" and isinstance(v, dict):
                self._acking[process] = (str(entry.get("key")), int(v["offset"]))
            elif kind in ("ok", "info", "fail"):
                msg = self._acking.pop(process, None)
                if msg is not None and kind == "ok":
                    self._acked.add(msg)
                    self._count("acked")
                elif msg is not None and kind == "info":
                    self._maybe.add(msg)
        elif f == "simple-receive" and kind == "ok" and isinstance(v, dict):
            for queue, offset, *_rest in v.get("messages") or []:
                self._maybe.discard((queue_key(self.topic, int(queue)), int(offset)))
                self._count("deliveries")
        elif f == "simple-lost" and kind == "info":
            self._count("lost-requests")

    # ------------------------------------------------------------ the run

    async def run(self, stop_at: float) -> None:
        """Producers and the killed-and-restarted worker until `stop_at`
        (`time.monotonic()`); sends still going `GRACE` seconds later are cancelled."""
        if not self.queue_groups:
            await self.setup()
        async with trio.open_nursery() as nursery:
            nursery.cancel_scope.deadline = trio.current_time() + max(
                0.0, stop_at - time.monotonic()) + GRACE
            for k in range(self.producers):
                nursery.start_soon(self._producer, f"{self.prefix}-p{k}", False, stop_at, k)
            for k in range(self.idempotent_producers):
                nursery.start_soon(self._producer, f"{self.prefix}-i{k}", True, stop_at,
                                   self.producers + k)
            if self.workers:
                nursery.start_soon(self._workers, stop_at)

    async def follow(self) -> None:
        """The harness's consumers, from now until `drain` stops them."""
        with trio.CancelScope() as scope:
            self._follow_scope = scope
            async with trio.open_nursery() as nursery:
                for c in self.consumers:
                    nursery.start_soon(c.run)

    def _on_attempt(self, attempt: SendAttempt) -> None:
        for m in attempt.messages:
            sending = self._sending.get(m if isinstance(m, bytes) else m.body)
            if sending is not None:
                process, key = sending
                self.recorder.attempt(process, "simple-send", key, None)

    async def _producer(self, process: str, idempotent: bool, stop_at: float,
                        number: int) -> None:
        """Send until `stop_at`; with `fifo`, the `number`-th producer's message groups
        go to queues of their own in turn, each group numbered from 1."""
        seq = 0
        seqs = [0] * FIFO_GROUPS
        async with Producer(self.namesrv, idempotent=idempotent, send_timeout=self.send_timeout,
                            on_attempt=None if idempotent else self._on_attempt) as producer:
            while time.monotonic() < stop_at:
                always_fail = self.rng.randrange(ALWAYS_FAIL) == 0
                fail = "-fail" if always_fail else ""
                if self.fifo:
                    k = self.rng.randrange(FIFO_GROUPS)
                    seqs[k] += 1
                    group = f"{process}-g{k}"
                    queue = (number * FIFO_GROUPS + k) % self.queues
                    sent = await self._send(producer, process, f"{group}-{seqs[k]}{fail}",
                                            idempotent, always_fail, queue,
                                            {"group": group, "seq": seqs[k]})
                else:
                    seq += 1
                    sent = await self._send(producer, process, f"{process}-{seq}{fail}",
                                            idempotent, always_fail,
                                            self.rng.randrange(self.queues))
                if not sent:
                    await trio.sleep(_PAUSE_AFTER_ERROR)
                await trio.sleep(self.rng.uniform(*self.pause))

    async def _send(self, producer: Producer, process: str, body: str, idempotent: bool,
                    always_fail: bool, queue: int,
                    fifo: dict[str, Any] | None = None) -> bool:
        key = queue_key(self.topic, queue)
        rec = self.recorder
        rec.invoke(process, "simple-send", key, {
            "body": body, "producer": "idempotent" if idempotent else "plain",
            "always_fail": always_fail, **(fifo or {})})
        self._count("sent")
        self._sending[body.encode()] = (process, key)
        try:
            result = await producer.send(self.topic, body, queue=queue,
                                         message_group=None if fifo is None else fifo["group"])
        except Exception as exc:  # noqa: BLE001 - sorted into fail and unknown below
            sure = isinstance(exc, RequestError) and _written_for_sure_not(exc)
            rec.complete(process, "fail" if sure else "info", "simple-send", key,
                         {"error": repr(exc)})
            self._count("failed" if sure else "unknown")
            return False
        except BaseException:
            rec.complete(process, "info", "simple-send", key, {"error": "cancelled"})
            raise
        finally:
            del self._sending[body.encode()]
        rec.complete(process, "ok", "simple-send", key, {"offset": result.offset})
        self._count("acknowledged")
        self._acknowledged[(key, result.offset)] = body
        return True

    # ---------------- the worker process

    def _worker_argv(self, name: str) -> list[str]:
        return [self.python, "-m", "chaos.simpleworkload", "--namesrv", self.namesrv,
                "--topic", self.topic, "--name", name, "--cg", self.cg,
                "--seed", str(self.rng.getrandbits(32))]

    async def _workers(self, stop_at: float) -> None:
        """Run a worker, SIGKILL it after a few seconds, start another; until `stop_at`."""
        while time.monotonic() < stop_at:
            life = self.rng.uniform(*WORKER_LIFE_S)
            await self._one_worker(min(stop_at, time.monotonic() + life))

    async def _one_worker(self, until: float) -> None:
        self.worker_starts += 1
        name = f"{self.prefix}-w{self.worker_starts}"
        env = dict(os.environ)
        if self.log is not None:
            with self.log.open("ab") as log:
                log.write(f"--- {self.prefix} consumer worker {name}\n".encode())
                proc = await trio.lowlevel.open_process(
                    self._worker_argv(name), stdout=subprocess.PIPE, stderr=log, env=env,
                    start_new_session=True)
        else:
            proc = await trio.lowlevel.open_process(
                self._worker_argv(name), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=env, start_new_session=True)
        assert proc.stdout is not None
        buffered = b""
        try:
            with trio.move_on_after(max(0.0, until - time.monotonic())):
                while True:
                    chunk = await proc.stdout.receive_some(65536)
                    if not chunk:
                        break
                    buffered += chunk
                    *lines, buffered = buffered.split(b"\n")
                    for line in lines:
                        self._forward(name, line)
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.send_signal(signal.SIGKILL)  # the point: a consumer killed mid-work
                await proc.wait()
                rest = b""
                with trio.move_on_after(1):
                    while chunk := await proc.stdout.receive_some(65536):
                        rest += chunk
                for line in (buffered + rest).split(b"\n"):
                    self._forward(name, line)
                await proc.stdout.aclose()
                for process in [p for p in self._acking if p.startswith(f"{name}.")]:
                    self._maybe.add(self._acking.pop(process))  # killed before the answer

    def _forward(self, name: str, line: bytes) -> None:
        """One line of a worker into the history (a torn last line of a killed worker is
        dropped); its processes are named after the worker."""
        try:
            entry = json.loads(line)
        except ValueError:
            return
        if (not isinstance(entry, dict) or entry.get("type") not in (
                "invoke", "ok", "fail", "info", "attempt")
                or not (entry.get("process") == name
                        or str(entry.get("process")).startswith(f"{name}."))):
            return
        self._record(entry)

    # ------------------------------------------------------------ after the faults

    def pending(self) -> set[tuple[str, int]]:
        """Acknowledged messages not acked (nor perhaps acked) yet, as (queue, offset)."""
        return set(self._acknowledged) - self._acked - self._maybe

    async def drain(self, timeout: float) -> bool:
        """Have the consumers settle everything until every acknowledged message is acked
        or a dead letter (at most `SETTLE_WAIT_S`, or half of `timeout`), stop them, and
        read the dead letters; True when they were read."""
        began = time.monotonic()
        for c in self.consumers:
            c.draining = True
        settle_by = began + min(SETTLE_WAIT_S, timeout / 2)
        async with Admin(self.namesrv) as admin:
            while time.monotonic() < settle_by:
                left = self.pending()
                if not left:
                    break
                try:
                    dead = {(queue_key(d.topic, d.queue), d.offset)
                            for d in await admin.dlq_list(self.cg)}
                except RequestError:
                    dead = set()
                if not left - dead:
                    break
                await trio.sleep(0.5)
            else:
                self._count("drain-gave-up-waiting")
            if self._follow_scope is not None:
                self._follow_scope.cancel()
            deadline = max(began + timeout, time.monotonic() + timeout / 4)
            return await self._read_dlq(admin, deadline)

    async def _read_dlq(self, admin: Admin, deadline: float) -> bool:
        p = f"{self.prefix}-dlq"
        rec = self.recorder
        rec.invoke(p, "simple-dlq", self.cg, {"cg": self.cg, "max_deliveries": MAX_DELIVERIES})
        error = "no time left"
        while time.monotonic() < deadline:
            try:
                with trio.fail_after(max(0.1, deadline - time.monotonic())):
                    entries = []
                    for d in await admin.dlq_list(self.cg, limit=10_000):
                        shown = await admin.dlq_show(self.cg, d.id)
                        body = (shown.message.body.decode("utf-8", "replace")
                                if shown.message is not None else "")
                        entries.append([d.id, queue_key(d.topic, d.queue), d.offset, body,
                                        d.deliveries, d.error])
            except (RequestError, trio.TooSlowError) as exc:
                error = repr(exc)
                await trio.sleep(_PAUSE_AFTER_ERROR)
                continue
            rec.complete(p, "ok", "simple-dlq", self.cg, {"ms": wall_ms(), "entries": entries})
            self._count("dead-letters", len(entries))
            return True
        rec.complete(p, "info", "simple-dlq", self.cg, {"error": error})
        return False


# ---------------------------------------------------------------- the worker process


def _print(entry: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(entry, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    """``python -m chaos.simpleworkload --namesrv A --topic T --name N --cg G --seed S``:
    one simple consumer of consumer group G (`GROUP` by default; sweeping with
    ``wait=0``) that prints its history entries as JSON lines on stdout, each stamped
    with `time.monotonic()`, the clock the harness uses too, and its processes named
    ``N...``; it runs until killed."""
    parser = argparse.ArgumentParser(prog="python -m chaos.simpleworkload",
                                     description=main.__doc__)
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--cg", default=GROUP)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    consumer = Consumer(args.namesrv, args.topic, args.name, _print, random.Random(args.seed),
                        cg=args.cg)
    anyio.run(consumer.run)


if __name__ == "__main__":
    main()
