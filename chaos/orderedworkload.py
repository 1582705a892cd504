"""The ordered-consumption workload of `raftmq chaos run --workload ordered`: keyed,
sequenced messages handled by orderly push consumers that come and go, recorded in the
forms `chaos.ordercheck` reads (its docstring is the format).

A topic of its own, ``<base>-ordered``, with two queues in every group, and one consumer
group, `GROUP`:

- **producers** (idempotent, in the harness) each keep `KEYS` orders going: an order is
  a key sent to one queue with sequence numbers 0, 1, 2, ..., each sent once the one
  before was acknowledged; a send of unknown outcome ends its order (a new key takes
  its place), a failed one is sent again;
- **consumers**: `WORKERS` slots, each running an orderly `PushConsumer` in a separate
  OS process (``python -m chaos.orderedworkload``) for a few seconds once its consumer
  is up (a process starts slowly on a busy machine), then SIGKILLed or
  (half of the time) closed, and started again. Short lock leases (`LEASE_S`, renewed
  every `RENEW_S`, given up locally after `LOCAL_EXPIRY_S`) so a killed consumer's
  queues move on within seconds. Its handler records each call and fails one in
  `FAIL_EVERY` (retried in place). A holder is one consumer's tenure of one queue: it
  begins in `on_assign` and ends in `on_revoke` (or when its process died).

After the load, `drain` runs `WORKERS` consumers until every acknowledged message was
handled (for `SETTLE_WAIT_S` at most), then closes them.

The test mutation ``release-before-commit`` is handed to the consumers (it is theirs,
not the nodes'): they unlock a released queue before its final commit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import trio

from raftmq.client import Message, Producer, PushConsumer
from wire.protocol import RequestError

from .recorder import Recorder
from .workload import _written_for_sure_not, create_topics

__all__ = ["GROUP", "MUTATION", "OrderedWorkload", "main"]

GROUP = "chaos-ordered"
MUTATION = "release-before-commit"
KEYS = 8  # orders each producer keeps going
WORKERS = 3
WORKER_LIFE_S = (3.0, 8.0)
LEASE_S, RENEW_S, LOCAL_EXPIRY_S = 6.0, 1.0, 4.0
FAIL_EVERY = 25  # one handler call in this many fails
SETTLE_WAIT_S = 60.0
STOP_WAIT_S = 20.0  # a closed consumer's process gets this long to exit, then is killed
GRACE = 10.0
_PAUSE = (0.01, 0.05)
_PAUSE_AFTER_ERROR = 0.2
CONSUMER_SETTINGS: dict[str, Any] = {
    "heartbeat_interval": 0.5, "rebalance_interval": 1.0, "commit_interval": 3.0,
    "long_poll_ms": 500, "suspend": 0.05, "lock_lease": LEASE_S,
    "lock_renew_interval": RENEW_S, "lock_local_expiry": LOCAL_EXPIRY_S,
    "shutdown_timeout": 3.0,
}


def wall_ms() -> float:
    return time.time() * 1000


class OrderedWorkload:
    """The ordered load (module docstring): `run` until a time, `drain` after the heal."""

    def __init__(self, namesrv: str, base: str, groups: int, *, recorder: Recorder,
                 rng: random.Random, producers: int = 2, workers: int = WORKERS,
                 mutations: tuple[str, ...] = (), log: Path | None = None,
                 python: str = sys.executable) -> None:
        if groups < 1:
            raise ValueError("groups must be at least 1")
        self.namesrv = namesrv
        self.topic = f"{base}-ordered"
        self.queues = 2 * groups
        self.recorder = recorder
        self.rng = rng
        self.producers = producers
        self.workers = workers
        self.mutation = MUTATION in mutations
        self.log = log
        self.python = python
        self.queue_groups: dict[str, str] = {}
        self.stats: dict[str, int] = {}
        self.worker_starts = 0
        self._acknowledged: set[tuple[str, int]] = set()
        self._handled: set[tuple[str, int]] = set()
        self._opening: dict[str, tuple[str, int]] = {}  # open handle process -> (key, seq)
        self._holders: dict[str, dict[str, str]] = {}  # worker -> open holder process -> key
        self._ready: dict[str, trio.Event] = {}  # worker -> set once its consumer is up

    def _count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n

    async def setup(self, timeout: float = 30.0) -> dict[str, str]:
        """Create the topic (queues in every group) and learn queue -> group."""
        self.queue_groups = await create_topics(self.namesrv, {self.topic: self.queues}, timeout)
        return dict(self.queue_groups)

    # ------------------------------------------------------------ the run

    async def run(self, stop_at: float) -> None:
        """Producers and consumer slots until `stop_at` (`time.monotonic()`)."""
        if not self.queue_groups:
            await self.setup()
        async with trio.open_nursery() as nursery:
            nursery.cancel_scope.deadline = trio.current_time() + max(
                0.0, stop_at - time.monotonic()) + GRACE
            for k in range(self.producers):
                nursery.start_soon(self._producer, f"order-p{k}", stop_at)
            for slot in range(self.workers):
                nursery.start_soon(self._slot, slot, stop_at)

    async def _producer(self, name: str, stop_at: float) -> None:
        orders = 0

        def new_order() -> list[Any]:
            nonlocal orders
            orders += 1
            return [f"{name}-k{orders}", self.rng.randrange(self.queues), 0]

        keys = [new_order() for _ in range(KEYS)]
        async with Producer(self.namesrv, idempotent=True, send_timeout=3.0) as producer:
            while time.monotonic() < stop_at:
                i = self.rng.randrange(len(keys))
                key, queue, seq = keys[i]
                outcome = await self._send(producer, f"{name}.{key}.{seq}", key, queue, seq)
                if outcome == "ok":
                    keys[i][2] += 1
                elif outcome == "info":
                    keys[i] = new_order()
                if outcome != "ok":
                    await trio.sleep(_PAUSE_AFTER_ERROR)
                await trio.sleep(self.rng.uniform(*_PAUSE))

    async def _send(self, producer: Producer, process: str, key: str, queue: int,
                    seq: int) -> str:
        rec = self.recorder
        rec.invoke(process, "order-send", key, {"seq": seq, "queue": queue})
        self._count("sent")
        try:
            result = await producer.send(self.topic, f"{key}:{seq}", key=key, queue=queue)
        except Exception as exc:  # noqa: BLE001 - sorted into fail and unknown below
            sure = isinstance(exc, RequestError) and _written_for_sure_not(exc)
            rec.complete(process, "fail" if sure else "info", "order-send", key,
                         {"error": repr(exc)})
            self._count("failed" if sure else "unknown")
            return "fail" if sure else "info"
        except BaseException:
            rec.complete(process, "info", "order-send", key, {"error": "cancelled"})
            raise
        rec.complete(process, "ok", "order-send", key, {"offset": result.offset})
        self._count("acknowledged")
        self._acknowledged.add((key, seq))
        return "ok"

    async def _slot(self, slot: int, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            life = self.rng.uniform(*WORKER_LIFE_S)
            graceful = self.rng.random() < 0.5
            await self._one_worker(life, stop_at, graceful)

    # ------------------------------------------------------------ a consumer process

    def _argv(self, name: str) -> list[str]:
        argv = [self.python, "-m", "chaos.orderedworkload", "--namesrv", self.namesrv,
                "--topic", self.topic, "--name", name, "--seed", str(self.rng.getrandbits(32))]
        return argv + (["--mutation", MUTATION] if self.mutation else [])

    async def _one_worker(self, life: float, stop_at: float, graceful: bool,
                          done: trio.Event | None = None) -> None:
        """Run one consumer process for `life` seconds once its consumer is up (a
        process starts slowly on a loaded machine), until `stop_at` at the latest (or
        `done`), then close it (`graceful`: it lets go of its queues) or SIGKILL it."""
        self.worker_starts += 1
        name = f"order-w{self.worker_starts}"
        self._holders[name] = {}
        ready = self._ready[name] = trio.Event()
        stderr: Any = subprocess.DEVNULL
        if self.log is not None:
            with self.log.open("ab") as log:
                log.write(f"--- ordered consumer {name}\n".encode())
            stderr = self.log.open("ab")
        try:
            proc = await trio.lowlevel.open_process(
                self._argv(name), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=stderr, env=dict(os.environ), start_new_session=True)
        finally:
            if stderr is not subprocess.DEVNULL:
                stderr.close()
        assert proc.stdout is not None and proc.stdin is not None
        buffered = b""
        read_all = trio.Event()

        async def read() -> None:
            nonlocal buffered
            assert proc.stdout is not None
            while chunk := await proc.stdout.receive_some(65536):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    self._forward(name, line)
            read_all.set()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                with trio.move_on_after(max(0.0, stop_at - time.monotonic())):
                    await ready.wait()
                    with trio.move_on_after(life):
                        if done is not None:
                            await done.wait()
                        else:
                            await trio.sleep_forever()
                with trio.CancelScope(shield=True):
                    if graceful:
                        self._count("closes")
                        await proc.stdin.aclose()  # the consumer closes and exits
                        with trio.move_on_after(STOP_WAIT_S):
                            await proc.wait()
                    if proc.returncode is None:
                        self._count("kills")
                        proc.send_signal(signal.SIGKILL)  # the point: killed mid-work
                    await proc.wait()
                    with trio.move_on_after(2):
                        await read_all.wait()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.send_signal(signal.SIGKILL)
                    await proc.wait()
                for line in buffered.split(b"\n"):
                    self._forward(name, line)
                dead = wall_ms()  # whatever it still held ended with its process
                for process, key in self._holders.pop(name, {}).items():
                    self.recorder.complete(process, "info", "order-holder", key,
                                           {"ms": dead, "died": True})
                for process in [p for p in self._opening if p.startswith(f"{name}.")]:
                    del self._opening[process]
                self._ready.pop(name, None)

    def _forward(self, name: str, line: bytes) -> None:
        """One line of a consumer process into the history (a torn last line of a killed
        one is dropped); what it says is kept for the drain."""
        try:
            entry = json.loads(line)
        except ValueError:
            return
        if isinstance(entry, dict) and entry.get("ready") is True and name in self._ready:
            self._ready[name].set()  # its consumer is up: its life begins
            return
        if (not isinstance(entry, dict)
                or entry.get("type") not in ("invoke", "ok", "fail", "info")
                or not str(entry.get("process")).startswith(f"{name}.")):
            return
        process, f, kind = entry["process"], entry.get("f"), entry["type"]
        key = str(entry.get("key"))
        holders = self._holders.setdefault(name, {})
        if f == "order-holder":
            if kind == "invoke":
                holders[process] = key
            else:
                holders.pop(process, None)
        elif f == "order-handle" and isinstance(entry.get("value"), dict):
            if kind == "invoke":
                self._opening[process] = (key, int(entry["value"].get("seq", -1)))
            else:
                handled = self._opening.pop(process, None)
                if kind == "ok" and handled is not None:
                    self._handled.add(handled)
                    self._count("handled")
                elif kind == "fail":
                    self._count("handler-failures")
        self.recorder.forward(entry)

    # ------------------------------------------------------------ after the faults

    def pending(self) -> set[tuple[str, int]]:
        return self._acknowledged - self._handled

    async def drain(self, timeout: float) -> bool:
        """Consumers until every acknowledged message was handled (`SETTLE_WAIT_S` or
        half of `timeout` at most), then closed; True when nothing was left."""
        done = trio.Event()
        until = time.monotonic() + min(SETTLE_WAIT_S, timeout / 2)
        async with trio.open_nursery() as nursery:
            for _ in range(self.workers):
                nursery.start_soon(self._one_worker, math.inf, until, True, done)
            while time.monotonic() < until and self.pending():
                await trio.sleep(0.25)
            done.set()
        left = self.pending()
        self._count("drain-left", len(left))
        return not left


# ---------------------------------------------------------------- the consumer process


def _print(entry: dict[str, Any]) -> None:
    entry["time"] = time.monotonic()
    sys.stdout.write(json.dumps(entry, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class _Worker:
    """One orderly consumer's records: tenures of queues (holders) and handler calls."""

    def __init__(self, name: str, rng: random.Random) -> None:
        self.name = name
        self.rng = rng
        self.calls = 0
        self.tenures = 0
        self.holding: dict[int, str] = {}  # queue -> its holder (the open tenure)

    async def on_assign(self, queues: list[tuple[str, int]]) -> None:
        for _topic, queue in queues:
            self.tenures += 1
            holder = f"{self.name}.q{queue}.t{self.tenures}"
            self.holding[queue] = holder
            _print({"process": holder, "type": "invoke", "f": "order-holder", "key": holder,
                    "value": {"ms": wall_ms(), "client": self.name, "queue": queue}})

    async def on_revoke(self, queues: list[tuple[str, int]]) -> None:
        for _topic, queue in queues:
            holder = self.holding.pop(queue, None)
            if holder is not None:
                _print({"process": holder, "type": "ok", "f": "order-holder", "key": holder,
                        "value": {"ms": wall_ms()}})

    async def handle(self, msgs: list[Message]) -> None:
        for m in msgs:
            key, _, seq = m.body.decode().rpartition(":")
            self.calls += 1
            p = f"{self.name}.h{self.calls}"
            _print({"process": p, "type": "invoke", "f": "order-handle", "key": key,
                    "value": {"holder": self.holding.get(m.queue, f"{self.name}.q{m.queue}"),
                              "seq": int(seq), "offset": m.offset, "ms": wall_ms()}})
            await anyio.sleep(self.rng.uniform(0, 0.005))
            if self.rng.randrange(FAIL_EVERY) == 0:
                _print({"process": p, "type": "fail", "f": "order-handle", "key": key,
                        "value": {"ms": wall_ms(), "error": "failed on purpose"}})
                raise RuntimeError("failed on purpose: tried again in place")
            _print({"process": p, "type": "ok", "f": "order-handle", "key": key,
                    "value": {"ms": wall_ms()}})


def main(argv: list[str] | None = None) -> None:
    """``python -m chaos.orderedworkload --namesrv A --topic T --name N --seed S``: one
    orderly push consumer of `GROUP` printing its records as JSON lines on stdout, until
    its stdin closes (then it closes, letting go of its queues) or it is killed."""
    parser = argparse.ArgumentParser(prog="python -m chaos.orderedworkload",
                                     description=main.__doc__)
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mutation", action="append", default=[])
    args = parser.parse_args(argv)
    worker = _Worker(args.name, random.Random(args.seed))

    async def run() -> None:
        consumer = PushConsumer(args.namesrv, GROUP, [args.topic], worker.handle,
                                orderly=True, client_id=args.name, on_assign=worker.on_assign,
                                on_revoke=worker.on_revoke, **CONSUMER_SETTINGS)
        consumer.release_before_commit = MUTATION in args.mutation
        async with consumer:
            sys.stdout.write('{"ready":true}\n')
            sys.stdout.flush()
            await anyio.to_thread.run_sync(sys.stdin.buffer.read, abandon_on_cancel=True)

    anyio.run(run)


if __name__ == "__main__":
    main()
