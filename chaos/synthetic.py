"""Long, realistic chaos histories without a cluster: for measuring and testing the analysis.

`write_history` simulates the queue workload of `chaos.workload` (plain producers with
``attempt`` lines, idempotent producers, readers following the tail with some re-reads,
consumer-offset clients, a final drain from offset 0) against an in-memory correct queue
log, with faults on a schedule: during a fault some appends time out (``info``), and about
half of those took effect anyway. Every operation takes effect at a random point between
its call and its return, in one global time order, so the history is linearizable and
every acknowledged message is in the drained log; `corrupt` makes it otherwise on purpose.
The lines are written as they happen (in time order), so memory stays small whatever the
length. Shapes and rates follow a real 60 s run of `raftmq chaos run` (about 2,000
operations a second on 6 queues). With `dead_after`, group g0 (queues 0, 3, ...) loses its
quorum for good that many seconds in: from then on every append to its queues times out
without taking effect, its reads fail, and the final drain cannot read them (as in a
two-hour run whose harness lost a group's quorum: 116,000 timed-out appends a queue).
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["write_history"]

_READ_N = 32
_DRAIN_N = 256


class _Sim:
    def __init__(self, out: IO[str], rng: random.Random, queues: int, seconds: float,
                 fault_every: float, corrupt: str | None, dead_after: float | None) -> None:
        self.out = out
        self.dead_after = dead_after
        self.dead_at = float("inf")
        self.rng = rng
        self.queues = [f"chaos/{q}" for q in range(queues)]
        self.logs: dict[str, list[str]] = {q: [] for q in self.queues}
        self.offsets: dict[tuple[str, str], int | None] = {}
        self.seconds = seconds
        self.fault_every = fault_every
        self.corrupt = corrupt
        self.events: list[tuple[float, int, Any]] = []
        self.tie = 0
        self.seq: dict[int, int] = {}
        self.next_commit = 0
        self.faulty_until = 0.0
        self.lines = 0

    def push(self, at: float, item: Any) -> None:
        self.tie += 1
        heapq.heappush(self.events, (at, self.tie, item))

    def write(self, entry: dict[str, Any]) -> None:
        self.out.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self.lines += 1

    def latency(self, at: float) -> float:
        base = self.rng.expovariate(1 / 0.02)
        return base + (self.rng.uniform(0.0, 0.5) if at < self.faulty_until else 0.0)

    def dead(self, queue: str, at: float) -> bool:
        """Whether `queue`'s group has lost its quorum for good at `at` (group g0's)."""
        return at >= self.dead_at and self.queues.index(queue) % 3 == 0

    def operation(self, process: int, role: str, at: float) -> Iterator[tuple[float, Any]]:
        """One operation of `process` as (time, action) steps; actions write or apply."""
        rng = self.rng
        if role in ("plain", "idempotent"):
            queue = rng.choice(self.queues)
            n = self.seq.get(process, 0)
            self.seq[process] = n + 1
            msg = f"{'i' if role == 'idempotent' else 'p'}{process}-{n}"
            lat = self.latency(at)
            timed_out = at < self.faulty_until and rng.random() < 0.05
            effect = not timed_out or rng.random() < 0.5
            dead = self.dead(queue, at)
            if dead:
                timed_out, effect = True, False
            self.write({"process": process, "type": "invoke", "f": "append", "key": queue,
                        "value": msg, "time": at})
            if role == "plain":
                self.write({"process": process, "type": "attempt", "f": "append",
                            "key": queue, "value": msg, "time": at})
            box: dict[str, int] = {}
            if effect:
                yield at + rng.uniform(0, lat), ("append", queue, msg, box)
            if timed_out:  # a dead group's requests are refused: the client gives up soon
                wait = 0.2 if dead else 3.0
                yield at + lat + wait, ("info", process, "append", queue, {"error": "timeout"})
            else:
                yield at + lat, ("ack", process, queue, box)
        elif role == "reader":
            queue = rng.choice(self.queues)
            tail = len(self.logs[queue])
            if tail and rng.random() < 0.1:
                offset = rng.randrange(tail)
            else:
                offset = max(0, tail - rng.randrange(_READ_N))
            spec = {"offset": offset, "n": _READ_N}
            self.write({"process": process, "type": "invoke", "f": "read", "key": queue,
                        "value": spec, "time": at})
            lat = self.latency(at)
            if self.dead(queue, at):
                yield at + lat, ("fail", process, "read", queue, {"error": "unavailable"})
                return
            box2: dict[str, list[str]] = {}
            yield at + rng.uniform(0, lat), ("read", queue, offset, _READ_N, box2)
            yield at + lat, ("ok-read", process, queue, box2)
        else:  # offsets
            key = [f"chaos-cg{rng.randrange(2)}", rng.choice(self.queues)]
            lat = self.latency(at)
            if rng.random() < 0.5:
                self.next_commit += 1
                value = self.next_commit
                self.write({"process": process, "type": "invoke", "f": "commit", "key": key,
                            "value": value, "time": at})
                yield at + rng.uniform(0, lat), ("commit", tuple(key), value)
                yield at + lat, ("done", process, "commit", key, None)
            else:
                self.write({"process": process, "type": "invoke", "f": "read", "key": key,
                            "value": None, "time": at})
                box3: dict[str, Any] = {}
                yield at + rng.uniform(0, lat), ("read-offset", tuple(key), box3)
                yield at + lat, ("offset-read", process, key, box3)

    def apply(self, action: tuple) -> None:
        kind = action[0]
        if kind == "append":
            _, queue, msg, box = action
            log = self.logs[queue]
            box["offset"] = len(log)
            log.append(msg)
            if self.corrupt == "duplicate" and len(log) == 100:
                log.append(msg)  # stored twice without a second attempt
        elif kind == "read":
            _, queue, offset, n, box = action
            got = self.logs[queue][offset : offset + n]
            if self.corrupt == "stale" and len(got) > 1 and self.rng.random() < 0.001:
                got = got[:1]  # a short read in the middle of the log
            box["ids"] = got
        elif kind == "commit":
            _, key, value = action
            self.offsets[key] = value
        elif kind == "read-offset":
            _, key, box = action
            box["value"] = self.offsets.get(key)
        elif kind == "ack":
            _, process, queue, box = action
            offset = box["offset"]
            if self.corrupt == "lost" and offset == 100:
                self.logs[queue][offset] = "lost"  # acknowledged, then overwritten
            self.write({"process": process, "type": "ok", "f": "append", "key": queue,
                        "value": {"offset": offset}, "time": self.now})
        elif kind in ("info", "fail"):
            _, process, f, key, value = action
            self.write({"process": process, "type": kind, "f": f, "key": key,
                        "value": value, "time": self.now})
        elif kind == "ok-read":
            _, process, queue, box = action
            self.write({"process": process, "type": "ok", "f": "read", "key": queue,
                        "value": box["ids"], "time": self.now})
        elif kind == "done":
            _, process, f, key, value = action
            self.write({"process": process, "type": "ok", "f": f, "key": key,
                        "value": value, "time": self.now})
        elif kind == "offset-read":
            _, process, key, box = action
            self.write({"process": process, "type": "ok", "f": "read", "key": key,
                        "value": box["value"], "time": self.now})

    def run(self, roles: list[str], start: float) -> float:
        gens: dict[int, Iterator[tuple[float, Any]]] = {}
        for process, _role in enumerate(roles):
            self.push(start + self.rng.uniform(0, 0.01), ("next", process))
        next_fault = start + self.fault_every
        if self.dead_after is not None:
            self.dead_at = start + self.dead_after
        fault_no = 0
        end = start + self.seconds
        self.now = start
        while self.events:
            at, _tie, item = heapq.heappop(self.events)
            self.now = at
            if at >= next_fault and next_fault < end:
                fault_no += 1
                group = f"g{fault_no % 3}"
                value = {"nodes": [1 + fault_no % 3], "leaders": {group: 1 + fault_no % 3}}
                self.write({"process": "nemesis", "type": "invoke", "f": "kill",
                            "value": value, "time": next_fault})
                self.faulty_until = next_fault + 5.0
                self.write({"process": "nemesis", "type": "info", "f": "kill",
                            "time": self.faulty_until})
                next_fault += self.fault_every
            if item[0] == "next":
                process = item[1]
                if at >= end:
                    continue
                gens[process] = self.operation(process, roles[process], at)
                item = ("step", process)
            if item[0] == "step":
                process = item[1]
                step = next(gens[process], None)
                if step is None:
                    self.push(at + self.rng.uniform(0, 0.002), ("next", process))
                else:
                    self.push(step[0], ("act", process, step[1]))
                continue
            _, process, action = item
            self.apply(action)
            self.push(at, ("step", process))
        return self.now

    def drain(self, at: float, first_process: int) -> None:
        for k, queue in enumerate(self.queues):
            process = first_process + k
            offset = 0
            if self.dead(queue, at):
                self.write({"process": process, "type": "invoke", "f": "read", "key": queue,
                            "value": {"offset": 0, "n": _DRAIN_N}, "time": at})
                self.write({"process": process, "type": "fail", "f": "read", "key": queue,
                            "value": {"error": "unavailable"}, "time": at + 0.001})
                continue
            while True:
                got = self.logs[queue][offset : offset + _DRAIN_N]
                self.write({"process": process, "type": "invoke", "f": "read", "key": queue,
                            "value": {"offset": offset, "n": _DRAIN_N}, "time": at})
                at += 0.001
                self.write({"process": process, "type": "ok", "f": "read", "key": queue,
                            "value": got, "time": at})
                offset += len(got)
                if len(got) < _DRAIN_N:
                    break


def write_history(
    path: str | Path,
    *,
    seconds: float,
    seed: int = 0,
    queues: int = 6,
    fault_every: float = 15.0,
    corrupt: str | None = None,
    dead_after: float | None = None,
) -> dict[str, Any]:
    """Write a `seconds`-long history to `path` and return the run facts `analyze_run` takes.

    `corrupt`: None (a correct cluster), "lost" (an acknowledged message overwritten),
    "duplicate" (one message stored twice without a retry) or "stale" (rare short reads in
    the middle of the log, which only the linearizability check sees). `dead_after`:
    seconds after which group g0 loses its quorum for good (see the module docstring); the
    facts then say the drain did not finish."""
    if corrupt not in (None, "lost", "duplicate", "stale"):
        raise ValueError(f"unknown corruption {corrupt!r}")
    roles = (["plain"] * 8 + ["idempotent"] * 8 + ["reader"] * 3 + ["offsets"] * 2)
    rng = random.Random(seed)
    with Path(path).open("w", encoding="utf-8") as out:
        sim = _Sim(out, rng, queues, seconds, fault_every, corrupt, dead_after)
        end = sim.run(roles, 1000.0)
        sim.drain(end + 1.0, len(roles))
    groups = {q: f"g{k % 3}" for k, q in enumerate(sim.queues)}
    drained = dead_after is None or dead_after >= seconds
    return {"queue_groups": groups, "unexpected_exits": {}, "drained": drained,
            "lines": sim.lines}
