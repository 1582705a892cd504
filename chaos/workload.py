"""The queue workload of `raftmq chaos run`: producers and readers that record every operation.

Clients are real SDK objects talking to a real cluster; each operation is written to the
run's history (`chaos.recorder.Recorder`) as an invoke and exactly one completion, one open
operation per process. A *process* is one logical client (an int id): producer objects host
``workers`` processes each, so one `Producer` can batch the sends of several of them. Keys
are queue names ``f"{topic}/{queue}"``.

append (key = queue, invoke value = a fresh message id, also the message body)
    Sent with an explicit queue, so the SDK's retries stay on that queue (an idempotent
    producer resends the same bytes there). Outcomes:

    - ``ok {"offset": n}``: acknowledged at offset n;
    - ``fail``: refused before any PRODUCE request left the client (a bad message, no route
      to the topic, the producer closed): nothing can have been written;
    - ``info``: anything else. A timeout or a lost connection may hide a write, and once a
      request was sent even a later definite error does not clear an earlier attempt, so
      every error from the acknowledgement is unknown;
    - ``attempt`` lines (plain producers only), written before the SDK sends each
      PRODUCE request that carries the message (`Producer(on_attempt=...)`): the first
      send, every retry and redirect. Each may store one copy, so a plain message stored
      more often than it was sent was duplicated by the cluster, not by a retry;
    - ``ok {"dup": d}`` without an offset: acknowledged, but the answer had no offset
      (``SendResult.offset == -1``: an idempotent resend the leader recognised without
      remembering where the first copy went). The message is committed by the time of the
      acknowledgement, so it must show up in the log (else it is lost) and take effect
      within the operation, at an offset nobody told us. Recording it as ``info`` would
      let an acknowledged message vanish unnoticed.

read (key = queue, invoke value ``{"offset": o, "n": n}``, ok value = the message ids)
    One FETCH of at most n messages from offset o that does not wait at the end of the
    queue. n is kept within the broker's per-fetch count limit and the byte limit is far
    above n messages, so an answer shorter than n means the end of the log, as the strict
    `QueueLogModel` assumes. An offset past the end (OFFSET_TOO_LARGE, which the leader says
    only after confirming its leadership) is the empty read it stands for. Every error,
    timeouts included, is ``fail``: a read changes nothing, so a read whose answer was never
    seen is simply left out of the history.

commit / read of a consumer offset (key = ``[consumer group, queue key]``)
    ``commit`` (invoke value = the offset; a fresh, growing number, so every write is
    recognisable) goes through the group's Raft log; ``ok`` once applied, any error
    ``info`` (a proposal may still be applied). ``read`` asks the leader, which confirms
    its leadership first; ok value = the committed offset, or null when none. Errors are
    ``fail``. These feed the consumer-offset (register) model, one partition per key.

admin (processes with the ADMIN role; `admin_clients` of them)
    Changes to replicated admin state under faults, each recorded so that a lost or
    rolled-back change is caught:

    - on a topic of its own (``<topic>-admin``, every queue in one group; key
      ``topic:<name>``, `topic_key`): ``create`` and ``grow`` (invoke value = queue
      count), ``delete`` and ``read`` (ok value = queue count, or null while it does not
      exist), for `chaos.models.TopicConfigModel`. Each write is one request of one
      attempt (no retry, no redirect), so a definite refusal is an observation of the
      state: ok ``"exists"`` (create), ``"refused"`` (grow below the current count),
      ``"missing"`` (delete); an error that may hide a write is ``info``, one that
      cannot is ``fail``. A read asks the group's leader, which confirms its leadership
      first (TOPICS with "g");
    - on the consumer offsets above: an offset reset (`Admin.reset_offsets` of a consumer
      group on the topic) is a ``commit`` of each queue's new offset (invoke value from a
      dry run just before), and a consumer group's deletion (DELETE_GROUP, one attempt
      per Raft group) a ``delete`` of each of its queues' keys, one process per key.

Message ids say who sent them: ``p<process>-<seq>`` from a plain producer, ``i<process>-<seq>``
from an idempotent one (`is_idempotent_message`), so the analysis can tell duplicates that
at-least-once delivery allows from those idempotence forbids using the history alone.

Readers follow the tail (most reads start a little below the last known end, so many come
back short and pin down where the log ended) and sometimes re-read an older range.
A fault can aim reads at one node (`Workload.read_from_node`, used by the `stale-leader`
nemesis): a client whose routes still name a replaced leader, reading one message at an
offset acknowledged after that leader was cut off. Producers cross-check acknowledgements: after a share (`verify_acks`) of the appends
acknowledged with an offset, the same process reads one message at that offset at once
(a read of its own write at the tail: a wrong offset or a stale leader shows there). After
the faults are healed, `Workload.drain` reads every queue from offset 0 to its end.
Times are `time.monotonic()` seconds, the `Recorder`'s clock.
"""

from __future__ import annotations

import functools
import random
import time
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from broker.doors.reads import MAX_FETCH_BYTES, MAX_FETCH_COUNT
from raftmq.client import Admin, ClientClosedError, Producer, PullConsumer, TransportError
from raftmq.client.consumer import commit_offsets, decode_fetch, fetch, query_offset
from raftmq.client.errors import may_have_applied
from raftmq.client.producer import SendAttempt
from transport.connection import is_retriable
from wire.protocol import Code, Op, RequestError
from wire.requests import (
    CreateTopicRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    GrowTopicRequest,
    TopicsAnswer,
    TopicsRequest,
    WireType,
)

from .recorder import Recorder

__all__ = [
    "ADMIN",
    "APPEND",
    "COMMIT",
    "DRAINER",
    "IDEMPOTENT",
    "OFFSETS",
    "PLAIN",
    "Process",
    "READ",
    "READER",
    "TOPIC_KEY_PREFIX",
    "TOPIC_OPS",
    "Workload",
    "is_idempotent_message",
    "message_id",
    "queue_groups",
    "queue_key",
    "topic_key",
]

APPEND = "append"
READ = "read"
COMMIT = "commit"
PLAIN = "plain"
IDEMPOTENT = "idempotent"
READER = "reader"
OFFSETS = "offsets"
DRAINER = "drain"
ADMIN = "admin"
TOPIC_KEY_PREFIX = "topic:"  # no topic name holds ":", so no queue key starts like this
TOPIC_OPS = ("create", "grow", "delete", READ)
ADMIN_MAX_QUEUES = 4  # the admin topic grows up to this many queues
# what a definite refusal of each topic write says about the state (see the docstring)
_REFUSAL_MEANS = {("create", Code.TOPIC_EXISTS): "exists", ("grow", Code.MALFORMED): "refused",
                  ("delete", Code.UNKNOWN_TOPIC): "missing"}

READ_MAX_BYTES = MAX_FETCH_BYTES  # thousands of times what n short message ids take
DRAIN_BATCH = 256
TOPIC_GONE_AFTER = 10.0  # seconds of UNKNOWN_TOPIC in the drain before the topic counts as gone
_PAUSE_AFTER_ERROR = 0.05  # keeps a client from spinning while its group has no leader
_CONSUMER_GROUP = "chaos-readers"  # only names the clients; readers never commit


def queue_key(topic: str, queue: int) -> str:
    """The history key of a queue."""
    return f"{topic}/{queue}"


def topic_key(topic: str) -> str:
    """The history key of a topic's configuration."""
    return f"{TOPIC_KEY_PREFIX}{topic}"


def _written_for_sure_not(exc: BaseException) -> bool:
    """Whether a write that failed with `exc` was certainly not applied: no error of the
    chain says it may have been (an OutcomeUnknownError raised after several tries names
    only the last one as its cause), and the first is a connection that sent nothing,
    or a NOT_LEADER / UNKNOWN_GROUP answered before any proposal. Anything else may hide
    a write (PROPOSAL_DROPPED too: a leader may lose its term after appending)."""
    seen: set[int] = set()  # a chain may loop back on itself: walk each link once
    while True:
        if not isinstance(exc, RequestError) or may_have_applied(exc):
            return False
        seen.add(id(exc))
        if not isinstance(exc.__cause__, RequestError) or id(exc.__cause__) in seen:
            break
        exc = exc.__cause__
    if isinstance(exc, TransportError):
        return not exc.sent
    return exc.code in (Code.NOT_LEADER, Code.UNKNOWN_GROUP, Code.UNAVAILABLE)


def message_id(process: int, seq: int, *, idempotent: bool) -> str:
    """A run-unique message id that names its sender's kind (see the module docstring)."""
    return f"{'i' if idempotent else 'p'}{process}-{seq}"


def is_idempotent_message(msg: object) -> bool:
    """Whether `msg` was sent by an idempotent producer of this workload."""
    return isinstance(msg, str) and msg.startswith("i")


async def queue_groups(namesrv: str, topic: str) -> dict[str, str]:
    """Queue key -> Raft group hosting it, from the name server's route of `topic`."""
    failure: RequestError | None = None
    async with PullConsumer(namesrv, _CONSUMER_GROUP) as client:
        try:
            route = await client.routes.route(topic, refresh=True)
        except RequestError as exc:  # raised out here, not inside the client's ExceptionGroup
            failure = exc
    if failure is not None:
        raise failure
    out = {}
    for q in route.queue_ids:
        group = route.group_of(q)
        if group is not None:
            out[queue_key(topic, q)] = group
    return out


async def create_topics(namesrv: str, queues: dict[str, int],
                        timeout: float = 30.0) -> dict[str, str]:
    """Create each topic with its number of queues (spread over every group; an existing
    one is fine) and learn which group hosts each queue: queue key -> group. Everything
    fails and is retried while the cluster settles, for up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        failure: RequestError | None = None
        try:
            async with Admin(namesrv) as admin:
                try:
                    for topic, n in queues.items():
                        await admin.create_topic(topic, n, exist_ok=True)
                except RequestError as exc:  # raised out here, not in an ExceptionGroup
                    failure = exc
            if failure is not None:
                raise failure
            found: dict[str, str] = {}
            for topic in queues:
                found.update(await queue_groups(namesrv, topic))
            if len(found) == sum(queues.values()):
                return found
        except RequestError:
            if time.monotonic() >= deadline:
                raise
        attempt += 1
        await trio.sleep(min(1.0, 0.1 * attempt))


@dataclass(frozen=True, slots=True)
class Process:
    """One logical client of the history: its id and what it does."""

    process: int
    role: str  # PLAIN, IDEMPOTENT, READER, OFFSETS or DRAINER


class Workload:
    """Plain and idempotent producers appending to every queue while readers follow the tail.

    `producers` plain and `idempotent_producers` idempotent `Producer` objects each run
    `workers` processes; `readers` reader processes each have their own consumer client.
    `read_n` is the n of the readers' reads, `reread` the share of reads that start at a
    random older offset instead of near the tail. `offset_clients` processes commit and
    read the offsets of `offset_groups` consumer groups on every queue. `pause` seconds
    between a process's operations bound the load (0: as fast as the cluster answers).
    """

    def __init__(
        self,
        namesrv: str,
        topic: str,
        queues: int,
        *,
        producers: int = 2,
        idempotent_producers: int = 2,
        readers: int = 2,
        offset_clients: int = 2,
        offset_groups: int = 2,
        admin_clients: int = 1,
        admin_pause: float = 0.1,
        recorder: Recorder,
        seed: int = 0,
        rng: random.Random | None = None,
        workers: int = 2,
        read_n: int = 32,
        reread: float = 0.1,
        pause: float = 0.0,
        send_timeout: float = 3.0,
        retries: int = 2,
        linger_ms: float = 1.0,
        verify_acks: float = 0.25,
    ) -> None:
        if queues < 1 or workers < 1:
            raise ValueError("queues and workers must be at least 1")
        if min(producers, idempotent_producers, readers, offset_clients, offset_groups,
               admin_clients) < 0:
            raise ValueError("client counts must not be negative")
        if not 1 <= read_n <= MAX_FETCH_COUNT:
            raise ValueError(f"read_n must be in 1..{MAX_FETCH_COUNT} (the broker's fetch limit)")
        if not 0.0 <= reread <= 1.0 or pause < 0 or not 0.0 <= verify_acks <= 1.0:
            raise ValueError("reread and verify_acks are shares in [0, 1] and pause is not "
                             "negative")
        self.namesrv = namesrv
        self.topic = topic
        self.queues = queues
        self.recorder = recorder
        self.seed = seed
        self.rng = rng if rng is not None else random.Random(seed)
        self.workers = workers
        self.read_n = read_n
        self.reread = reread
        self.pause = pause
        self.send_timeout = send_timeout
        self.retries = retries
        self.linger_ms = linger_ms
        self.verify_acks = verify_acks
        self.producers = producers
        self.idempotent_producers = idempotent_producers
        self.readers = readers
        self.offset_clients = offset_clients
        self.admin_clients = admin_clients
        self.admin_pause = admin_pause
        self.admin_topic = f"{topic}-admin"
        self._admin_epoch = 0  # bumped after each unknown outcome: see `_unknown_admin_write`
        self.consumer_groups = [f"chaos-cg{i}" for i in range(offset_groups)]
        self.roles: dict[int, str] = {}
        """Process id -> PLAIN, IDEMPOTENT, READER, OFFSETS or DRAINER, per process used."""
        self.queue_groups: dict[str, str] = {}
        """Queue key -> group, learned by `setup` (for the analysis)."""
        self.drained: dict[str, bool] = {}
        """Queue key -> whether `drain` read it to its end."""
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._tail = [0] * queues  # highest end of each queue any operation revealed
        self._seq: Counter[int] = Counter()
        self._next_offset = 0  # committed offsets are unique: every write is recognisable
        self._running = False
        self._last_error_code: dict[int, int] = {}  # process -> code of its last failed read
        self._sending: dict[bytes, tuple[int, str, str]] = {}  # body -> process, key, id
        self._acked: dict[int, int] = {}  # process -> offset of its last acknowledged append
        # queue -> (invoked, offset) of the latest-invoked acknowledged append
        self._last_ack: dict[int, tuple[float, int]] = {}

    # ------------------------------------------------------------ processes

    def _new_process(self, role: str) -> Process:
        process = len(self.roles)
        self.roles[process] = role
        return Process(process, role)

    def process_ids(self, role: str) -> list[int]:
        """Processes with `role`, e.g. the `IDEMPOTENT` ones, which
        `analyze(idempotent_processes=...)` accepts instead of reading message ids."""
        return [p for p, r in self.roles.items() if r == role]

    # ------------------------------------------------------------ the run

    async def setup(self, timeout: float = 30.0) -> dict[str, str]:
        """Create the topic with `queues` queues (an existing one with the same layout is
        fine) and learn which group hosts each queue, since the analysis measures
        availability per group; returns queue key -> group.

        Retriable errors are retried for up to `timeout` seconds; a topic that exists with
        another layout raises TOPIC_EXISTS."""
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            try:
                await self._create_topic()
                groups = await queue_groups(self.namesrv, self.topic)
            except RequestError as exc:
                if not (is_retriable(exc) or exc.code == Code.UNKNOWN_TOPIC):
                    raise
                if time.monotonic() >= deadline:
                    raise
            else:
                if len(groups) == self.queues or time.monotonic() >= deadline:
                    self.queue_groups = groups
                    return dict(groups)
            attempt += 1
            await trio.sleep(min(1.0, 0.1 * attempt))

    async def _create_topic(self) -> None:
        failure: RequestError | None = None
        async with Admin(self.namesrv) as admin:
            try:
                await admin.create_topic(self.topic, self.queues, exist_ok=True)
            except RequestError as exc:  # raised out here, not inside an ExceptionGroup
                failure = exc
        if failure is not None:
            raise failure

    async def run(self, stop_at: float) -> None:
        """Run every client until `stop_at` (a `time.monotonic()` time), then wait for the
        operations already started to finish and close the clients."""
        if self._running:
            raise RuntimeError("a Workload runs once at a time")
        if not self.queue_groups:
            await self.setup()
        self._running = True
        self.started_at = time.monotonic()
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.producers):
                    nursery.start_soon(self._producer, False, stop_at)
                for _ in range(self.idempotent_producers):
                    nursery.start_soon(self._producer, True, stop_at)
                for _ in range(self.readers):
                    nursery.start_soon(self._reader, self._new_process(READER), stop_at)
                if self.consumer_groups:
                    for _ in range(self.offset_clients):
                        nursery.start_soon(self._offsets, self._new_process(OFFSETS), stop_at)
                for _ in range(self.admin_clients):
                    nursery.start_soon(self._admin, self._new_process(ADMIN), stop_at)
        finally:
            self.stopped_at = time.monotonic()
            self._running = False

    async def _producer(self, idempotent: bool, stop_at: float) -> None:
        role = IDEMPOTENT if idempotent else PLAIN
        clients = [self._new_process(role) for _ in range(self.workers)]
        async with Producer(
            self.namesrv,
            idempotent=idempotent,
            linger_ms=self.linger_ms,
            send_timeout=self.send_timeout,
            retries=self.retries,
            on_attempt=None if idempotent else self._record_attempt,
        ) as producer, PullConsumer(self.namesrv, _CONSUMER_GROUP) as consumer:
            async with trio.open_nursery() as nursery:
                for client in clients:
                    nursery.start_soon(self._append_loop, producer, consumer, client, stop_at)

    async def _append_loop(
        self, producer: Producer, consumer: PullConsumer, client: Process, stop_at: float
    ) -> None:
        while time.monotonic() < stop_at:
            queue = self.rng.randrange(self.queues)
            if not await self.append(producer, client, queue):
                await trio.sleep(_PAUSE_AFTER_ERROR)
                continue
            acked = self._acked.pop(client.process, None)
            if acked is not None and self.rng.random() < self.verify_acks:
                await self.read(consumer, client, queue, acked, 1)  # its own write, at once
            if self.pause:
                await trio.sleep(self.pause)

    async def append(self, producer: Producer, client: Process, queue: int) -> bool:
        """One recorded append of a fresh message to `queue`; True when acknowledged."""
        process = client.process
        seq = self._seq[process]
        self._seq[process] += 1
        msg = message_id(process, seq, idempotent=client.role == IDEMPOTENT)
        key = queue_key(self.topic, queue)
        rec = self.recorder
        invoked = time.monotonic()
        rec.invoke(process, APPEND, key, msg)
        body = msg.encode()
        self._sending[body] = (process, key, msg)
        try:
            return await self._append(producer, process, key, msg, queue, invoked)
        finally:
            del self._sending[body]

    def _record_attempt(self, attempt: SendAttempt) -> None:
        """`Producer(on_attempt=...)` of plain producers: one ``attempt`` line per message
        of the request, in the history of the process that is sending it."""
        for m in attempt.messages:
            sending = self._sending.get(m if isinstance(m, bytes) else m.body)
            if sending is not None:
                process, key, msg = sending
                self.recorder.attempt(process, APPEND, key, msg)

    async def _append(
        self, producer: Producer, process: int, key: str, msg: str, queue: int, invoked: float
    ) -> bool:
        rec = self.recorder
        try:
            future = await producer.send_async(self.topic, msg, queue=queue)
        except (RequestError, ClientClosedError, TypeError, ValueError) as exc:
            # raised before the message was handed to a sender: no request carried it
            rec.complete(process, "fail", APPEND, key, {"error": str(exc)})
            return False
        except BaseException:
            rec.complete(process, "info", APPEND, key, {"error": "cancelled"})
            raise
        try:
            result = await future
        except Exception as exc:  # noqa: BLE001 - whatever it was, the outcome is unknown
            rec.complete(process, "info", APPEND, key, {"error": str(exc)})
            return False
        except BaseException:
            rec.complete(process, "info", APPEND, key, {"error": "cancelled"})
            raise
        if result.queue != queue:
            # the SDK promised to keep an explicit queue; the offset belongs to another log
            rec.complete(process, "info", APPEND, key, {"error": f"sent to queue {result.queue}"})
            return False
        if result.offset < 0:  # committed, offset not said: no "offset" key (= unknown)
            rec.complete(process, "ok", APPEND, key, {"dup": result.dup})
            return True
        rec.complete(process, "ok", APPEND, key, {"offset": result.offset})
        self._tail[queue] = max(self._tail[queue], result.offset + 1)
        self._acked[process] = result.offset
        if invoked > self._last_ack.get(queue, (-1.0, 0))[0]:
            self._last_ack[queue] = (invoked, result.offset)
        return True

    async def _reader(self, client: Process, stop_at: float) -> None:
        async with PullConsumer(self.namesrv, _CONSUMER_GROUP) as consumer:
            while time.monotonic() < stop_at:
                queue = self.rng.randrange(self.queues)
                tail = self._tail[queue]
                if tail and self.rng.random() < self.reread:
                    offset = self.rng.randrange(tail)
                else:
                    offset = max(0, tail - self.rng.randrange(self.read_n))
                if await self.read(consumer, client, queue, offset, self.read_n) is None:
                    await trio.sleep(_PAUSE_AFTER_ERROR)
                elif self.pause:
                    await trio.sleep(self.pause)

    async def read(
        self, consumer: PullConsumer, client: Process, queue: int, offset: int, n: int,
        *, missing_topic_is_empty: bool = False, too_small_is_empty: bool = False,
        at: str | None = None, timeout: float = 5.0,
    ) -> list[str] | None:
        """One recorded read of at most `n` messages from `offset`; None when it failed.

        With `missing_topic_is_empty`, UNKNOWN_TOPIC is recorded as an empty read: the
        drain sets it once the cluster has said so for `TOPIC_GONE_AFTER` seconds, for a
        topic whose creation was acknowledged. A topic that vanished took its messages
        with it, and the accounting must see them as lost, not as "never read".
        With `too_small_is_empty` (the drain's: it reads from offset 0, where every
        acknowledged message must still be), OFFSET_TOO_SMALL is recorded as an empty
        read for the same reason: messages gone from the start of a queue (say, every
        replica's log lost them) are lost, not "never read".
        With `at` (a node's client address) the read is one FETCH sent there, whoever
        leads, answered within `timeout` seconds; without, the SDK finds the leader.
        """
        process = client.process
        key = queue_key(self.topic, queue)
        rec = self.recorder
        rec.invoke(process, READ, key, {"offset": offset, "n": n})
        try:
            if at is None:
                res = await fetch(
                    consumer.routes, self.topic, queue, offset,
                    max_messages=n, max_bytes=READ_MAX_BYTES, wait_ms=0,
                )
                messages = res.messages
            else:
                header = {"topic": self.topic, "queue": queue, "offset": offset, "max": n,
                          "max_bytes": READ_MAX_BYTES, "wait_ms": 0}
                frame = await consumer.routes.pool.request(at, Op.FETCH, header,
                                                           timeout=timeout)
                group = str(frame.header.get("g") or "")
                messages = decode_fetch(self.topic, queue, group, frame.header, frame.body)
        except RequestError as exc:
            if exc.code == Code.OFFSET_TOO_LARGE or (
                missing_topic_is_empty and exc.code == Code.UNKNOWN_TOPIC
            ) or (too_small_is_empty and exc.code == Code.OFFSET_TOO_SMALL):
                rec.complete(process, "ok", READ, key, [])
                return []
            self._last_error_code[process] = exc.code
            rec.complete(process, "fail", READ, key, {"error": str(exc)})
            return None
        except Exception as exc:  # noqa: BLE001 - a read that failed changed nothing
            rec.complete(process, "fail", READ, key, {"error": repr(exc)})
            return None
        except BaseException:
            rec.complete(process, "fail", READ, key, {"error": "cancelled"})
            raise
        ids = [m.body.decode("utf-8", "replace") for m in messages]
        rec.complete(process, "ok", READ, key, ids)
        if ids:
            self._tail[queue] = max(self._tail[queue], offset + len(ids))
        return ids

    def acked_since(self, since: float, groups: Collection[str]) -> dict[int, int]:
        """Queue -> offset of an acknowledged append invoked after `since` (a
        `time.monotonic()` instant), for the queues of `groups` that have one. Invoked,
        not answered, after `since`: an answer may have been on its way from a leader
        that was stopped at `since`; a request sent after it can only have been
        committed by a leader that was still running."""
        out = {}
        for queue, (when, offset) in self._last_ack.items():
            if when > since and self.queue_groups.get(queue_key(self.topic, queue)) in groups:
                out[queue] = offset
        return out

    async def read_from_node(self, addr: str, targets: Mapping[int, int],
                             timeout: float) -> None:
        """Read one message at `targets[queue]` of each queue from the node at `addr`
        (its client address), whether or not it leads the queue's group: a client with
        stale routes. One new reader process per queue; each read is recorded and may
        take up to `timeout` seconds."""
        async with PullConsumer(self.namesrv, _CONSUMER_GROUP) as consumer:
            async with trio.open_nursery() as nursery:
                for queue, offset in sorted(targets.items()):
                    nursery.start_soon(functools.partial(
                        self.read, consumer, self._new_process(READER), queue, offset, 1,
                        at=addr, timeout=timeout))

    async def _offsets(self, client: Process, stop_at: float) -> None:
        async with PullConsumer(self.namesrv, _CONSUMER_GROUP) as consumer:
            while time.monotonic() < stop_at:
                group = self.rng.choice(self.consumer_groups)
                queue = self.rng.randrange(self.queues)
                if self.rng.random() < 0.5:
                    done = await self.commit(consumer, client, group, queue)
                else:
                    done = await self.read_offset(consumer, client, group, queue)
                if not done:
                    await trio.sleep(_PAUSE_AFTER_ERROR)
                elif self.pause:
                    await trio.sleep(self.pause)

    async def commit(
        self, consumer: PullConsumer, client: Process, group: str, queue: int
    ) -> bool:
        """One recorded commit of a fresh offset for `group` on `queue`; True when applied."""
        self._next_offset += 1
        offset = self._next_offset
        key = [group, queue_key(self.topic, queue)]
        rec = self.recorder
        rec.invoke(client.process, COMMIT, key, offset)
        try:
            await commit_offsets(consumer.routes, group, {(self.topic, queue): offset})
        except Exception as exc:  # noqa: BLE001 - a proposal may have been made: unknown
            rec.complete(client.process, "info", COMMIT, key, {"error": str(exc)})
            return False
        except BaseException:
            rec.complete(client.process, "info", COMMIT, key, {"error": "cancelled"})
            raise
        rec.complete(client.process, "ok", COMMIT, key, None)
        return True

    async def read_offset(
        self, consumer: PullConsumer, client: Process, group: str, queue: int
    ) -> bool:
        """One recorded read of `group`'s committed offset on `queue`; True when answered."""
        key = [group, queue_key(self.topic, queue)]
        rec = self.recorder
        rec.invoke(client.process, READ, key, None)
        try:
            offset = await query_offset(consumer.routes, group, self.topic, queue)
        except Exception as exc:  # noqa: BLE001 - a read that failed changed nothing
            rec.complete(client.process, "fail", READ, key, {"error": str(exc)})
            return False
        except BaseException:
            rec.complete(client.process, "fail", READ, key, {"error": "cancelled"})
            raise
        rec.complete(client.process, "ok", READ, key, None if offset < 0 else offset)
        return True

    # ------------------------------------------------------------ admin state

    async def _admin(self, client: Process, stop_at: float) -> None:
        groups = sorted(set(self.queue_groups.values()))
        if not groups:
            return
        home = groups[0]  # the admin topic lives in one group: one log orders its changes
        known = 0  # the queue count last seen, to ask for one more
        async with Admin(self.namesrv) as admin:
            while time.monotonic() < stop_at:
                draw = self.rng.random()
                if draw < 0.35:
                    got = await self.read_topic(admin, client, home)
                    known = got if isinstance(got, int) else known
                elif draw < 0.5:
                    await self.topic_write(admin, client, home, "create", self.rng.randint(1, 2))
                elif draw < 0.7:
                    n = known + 1 if known < ADMIN_MAX_QUEUES else self.rng.randint(1, known)
                    await self.topic_write(admin, client, home, "grow", n)
                elif draw < 0.85:
                    await self.topic_write(admin, client, home, "delete")
                elif self.consumer_groups and draw < 0.93:
                    await self.reset_offsets(admin, self.rng.choice(self.consumer_groups))
                elif self.consumer_groups:
                    await self.delete_group(admin, self.rng.choice(self.consumer_groups))
                await trio.sleep(self.admin_pause)

    async def read_topic(self, admin: Admin, client: Process, group: str) -> int | None | bool:
        """One recorded read of the admin topic's queue count at `group`'s leader
        (None: it does not exist); False when the read failed."""
        key = topic_key(self.admin_topic)
        rec = self.recorder
        rec.invoke(client.process, READ, key, None)
        req = TopicsRequest(g=group)
        try:
            frame = await admin.routes.call_group(group, req.OP, req.header(), attempts=1,
                                                  max_redirects=0)
            topics = TopicsAnswer.decode(frame.header).topics
        except Exception as exc:  # noqa: BLE001 - a read that failed changed nothing
            rec.complete(client.process, "fail", READ, key, {"error": str(exc)})
            return False
        except BaseException:
            rec.complete(client.process, "fail", READ, key, {"error": "cancelled"})
            raise
        info = topics.get(self.admin_topic)
        queues = None if info is None else int(info["queues"])
        rec.complete(client.process, "ok", READ, key, queues)
        return queues

    async def topic_write(self, admin: Admin, client: Process, group: str, f: str,
                          queues: int | None = None) -> None:
        """One recorded create, grow or delete of the admin topic, one attempt."""
        key = topic_key(self.admin_topic)
        req: WireType
        if f == "delete":
            req = DeleteTopicRequest(g=group, topic=self.admin_topic)
        else:
            assert queues is not None
            kind = CreateTopicRequest if f == "create" else GrowTopicRequest
            req = kind(g=group, topic=self.admin_topic, queues=queues,
                       hosted=tuple(range(queues)))
        rec = self.recorder
        rec.invoke(client.process, f, key, queues)
        try:
            await admin.routes.call_group(group, req.OP, req.header(), write=True, attempts=1,
                                          max_redirects=0)
        except RequestError as exc:
            seen = _REFUSAL_MEANS.get((f, exc.code))
            if seen is not None:
                rec.complete(client.process, "ok", f, key, seen)
            elif _written_for_sure_not(exc):
                rec.complete(client.process, "fail", f, key, {"error": str(exc)})
            else:
                self._unknown_admin_write(client, f, key, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - whatever it was, the outcome is unknown
            self._unknown_admin_write(client, f, key, str(exc))
            return
        except BaseException:
            rec.complete(client.process, "info", f, key, {"error": "cancelled"})
            raise
        rec.complete(client.process, "ok", f, key, "ok")

    def _unknown_admin_write(self, client: Process, f: str, key: Any, error: str) -> None:
        """Record a topic write whose outcome is unknown, and go on with a topic of a new
        name. Such a write stays open to the end of the history (it may still take
        effect), so each one more multiplies the orders the checker must try for the
        key's later operations: a fresh key keeps a long run's topic check bounded."""
        self.recorder.complete(client.process, "info", f, key, {"error": error})
        self._admin_epoch += 1
        self.admin_topic = f"{self.topic}-admin{self._admin_epoch}"

    async def reset_offsets(self, admin: Admin, group: str) -> None:
        """`group`'s offsets on every queue moved to the earliest retained message, as
        commits of the new offsets (from a dry run; one process per queue)."""
        try:
            plan = await admin.reset_offsets(group, self.topic, "earliest", dry_run=True)
        except Exception:  # noqa: BLE001 - nothing was written: nothing to record
            return
        rec = self.recorder
        keys = {q: ([group, queue_key(self.topic, q)], self._new_process(ADMIN).process)
                for q in plan}
        for q, (key, process) in keys.items():
            rec.invoke(process, COMMIT, key, plan[q][1])
        kind, value = "ok", None
        try:
            done = await admin.reset_offsets(group, self.topic, "earliest")
        except BaseException as exc:
            kind, value, done = "info", {"error": str(exc) or "cancelled"}, {}
            if not isinstance(exc, Exception):
                for key, process in keys.values():
                    rec.complete(process, kind, COMMIT, key, value)
                raise
        for q, (key, process) in keys.items():
            moved = done.get(q)
            if kind == "ok" and moved is not None and moved[1] != plan[q][1]:
                # the earliest offset moved since the dry run: not the value recorded
                rec.complete(process, "info", COMMIT, key, {"error": f"reset to {moved[1]}"})
            else:
                rec.complete(process, kind, COMMIT, key, value)

    async def delete_group(self, admin: Admin, group: str) -> None:
        """Delete `group`'s offsets in each Raft group hosting a queue of the topic (one
        DELETE_GROUP attempt each): a ``delete`` of each of those queues' keys."""
        by_group: dict[str, list[str]] = {}
        for qkey, g in sorted(self.queue_groups.items()):
            by_group.setdefault(g, []).append(qkey)
        rec = self.recorder
        for g, qkeys in sorted(by_group.items()):
            keys = [([group, qkey], self._new_process(ADMIN).process) for qkey in qkeys]
            for key, process in keys:
                rec.invoke(process, "delete", key, None)
            kind, value = "ok", None
            try:
                req = DeleteGroupRequest(g=g, cg=group)
                await admin.routes.call_group(g, req.OP, req.header(), write=True, attempts=1,
                                              max_redirects=0)
            except BaseException as exc:
                kind = "fail" if _written_for_sure_not(exc) else "info"
                value = {"error": str(exc) or "cancelled"}
                if not isinstance(exc, Exception):
                    kind = "info"
                    for key, process in keys:
                        rec.complete(process, kind, "delete", key, value)
                    raise
            for key, process in keys:
                rec.complete(process, kind, "delete", key, value)

    # ------------------------------------------------------------ after the faults

    async def drain(self, timeout: float) -> bool:
        """Read every queue from offset 0 until a read comes back short, retrying errors
        until `timeout` seconds have passed; True when every queue was read to its end
        (`drained` says which were).

        Call it after `run` returned, so every read is invoked after every append returned
        (what the accounting needs to call a queue drained).
        """
        if self._running:
            raise RuntimeError("drain after run has returned")
        deadline = time.monotonic() + timeout
        self.drained = {queue_key(self.topic, q): False for q in range(self.queues)}
        async with PullConsumer(self.namesrv, _CONSUMER_GROUP) as consumer:
            async with trio.open_nursery() as nursery:
                for q in range(self.queues):
                    nursery.start_soon(self._drain_queue, consumer, q, deadline)
        return all(self.drained.values())

    async def _drain_queue(self, consumer: PullConsumer, queue: int, deadline: float) -> None:
        client = self._new_process(DRAINER)
        offset = 0
        failures = 0
        gone_since: float | None = None
        with trio.move_on_after(max(0.0, deadline - time.monotonic())):
            while True:
                gone = gone_since is not None and time.monotonic() - gone_since >= TOPIC_GONE_AFTER
                ids = await self.read(consumer, client, queue, offset, DRAIN_BATCH,
                                      missing_topic_is_empty=gone, too_small_is_empty=True)
                if ids is None:
                    if self._last_error_code.pop(client.process, None) == Code.UNKNOWN_TOPIC:
                        gone_since = time.monotonic() if gone_since is None else gone_since
                    else:
                        gone_since = None
                    failures += 1
                    await trio.sleep(min(1.0, 0.05 * 2**min(failures, 5)))
                    continue
                failures = 0
                offset += len(ids)
                if len(ids) < DRAIN_BATCH:
                    self.drained[queue_key(self.topic, queue)] = True
                    return

    # ------------------------------------------------------------ figures

    def stats(self) -> dict[str, Any]:
        """Operation counts by (f, outcome) and rates over the run, for logs and results.

        Taken from the recorder, so they cover everything recorded so far (faults too, as
        ``<fault>:fault``); ``read`` counts queue and offset reads together. Call it right
        after `run` for the run's own rates."""
        counts = {f"{f}:{kind}": n for (f, kind), n in sorted(self.recorder.counts.items())}
        out: dict[str, Any] = {"counts": counts, "processes": dict(Counter(self.roles.values()))}
        if self.started_at is not None and self.stopped_at is not None:
            seconds = max(1e-9, self.stopped_at - self.started_at)
            out["seconds"] = round(seconds, 3)
            for f in (APPEND, READ, COMMIT):
                done = sum(
                    n for (g, kind), n in self.recorder.counts.items()
                    if g == f and kind in ("ok", "fail", "info")
                )
                out[f"{f}_per_second"] = round(done / seconds, 1)
        return out
