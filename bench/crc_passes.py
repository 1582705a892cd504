"""Body-CRC passes per Raft entry, from proposal to every replica's disk and apply.

    python -m bench.crc_passes [--entries 300] [--body 4096] [--replicas 3]

Three real `GroupRuntime`s (CommitLogs on a temp directory, fsync=always) in one process,
linked by a bus that carries every Raft message through the peer wire format
(`message_to_wire`, bytes, `message_from_wire`) as the node's links do. The leader
proposes `--entries` entries of `--body` bytes each, one at a time, and the run waits
until every replica applied them. Every ``crc32c`` computed over at least `--body` bytes
is a pass over an entry body (headers and index records are 29 and 28 bytes). Each pass
is put to the replica that made it (a context variable each replica's tasks inherit; a
message is decoded in the receiver's name), and the result gives passes per entry for
the leader, for each follower, and for one leader plus one follower. Prints one JSON
object.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import crc32c
import trio

from raftlog.core import RaftConfig
from raftlog.runtime import GroupOptions, GroupRuntime
from raftlog.types import Entry, EntryType, Message
from raftlog.wire import message_from_wire, message_to_wire

_REPLICA: contextvars.ContextVar[int] = contextvars.ContextVar("replica", default=0)


class _Count:
    """Wraps ``crc32c.crc32c`` (looked up at call time everywhere in raftlog) to count
    the calls over at least `min_len` bytes, by replica."""

    def __init__(self, min_len: int) -> None:
        self.min_len = min_len
        self.passes: dict[int, int] = {}
        self._real = crc32c.crc32c

    def __call__(self, data: Any, value: int = 0) -> int:
        if len(data) >= self.min_len:
            who = _REPLICA.get()
            self.passes[who] = self.passes.get(who, 0) + 1
        return self._real(data, value)

    def __enter__(self) -> _Count:
        crc32c.crc32c = self  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        crc32c.crc32c = self._real


class _Machine:
    def __init__(self) -> None:
        self.applied = 0

    def apply(self, entry: Entry, context: object = None) -> None:
        if entry.type == EntryType.MESSAGES:
            self.applied += 1


async def _run(entries: int, body: int, replicas: int, root: Path) -> dict[str, Any]:
    ids = tuple(range(1, replicas + 1))
    runtimes: dict[int, GroupRuntime] = {}
    machines = {i: _Machine() for i in ids}

    def send(_group: str, m: Message) -> None:
        fields, data = message_to_wire(m)
        rt = runtimes.get(m.dst)
        if rt is not None:
            token = _REPLICA.set(m.dst)  # decoding is the receiver's work
            try:
                received = message_from_wire(fields, bytes(data))
            finally:
                _REPLICA.reset(token)
            rt.step(received)

    # a long election timeout: on a loaded machine a 100 ms stall would end the term, and
    # the new term's catch-up reads (and checks) entries back from disk, not a pass we count
    opts = GroupOptions(raft=RaftConfig(election_ticks=300))
    for i in ids:
        rt = GroupRuntime(
            "g", i, root / f"n{i}", ids, machines[i], send, opts, rng=random.Random(i)
        )
        rt.open()
        runtimes[i] = rt

    async def drive(rt: GroupRuntime) -> None:
        _REPLICA.set(rt.node_id)  # inherited by every task of this replica
        async with trio.open_nursery() as inner:
            inner.start_soon(rt.run)
            while True:
                await trio.sleep(0.01)
                rt.tick()

    async with trio.open_nursery() as nursery:
        for rt in runtimes.values():
            nursery.start_soon(drive, rt)
        with trio.fail_after(30):
            while not any(rt.is_leader for rt in runtimes.values()):
                await trio.sleep(0.01)
        leader = next(rt for rt in runtimes.values() if rt.is_leader)
        await leader.propose(b"w" * body)  # warm up: the first entry of the term is in
        with trio.fail_after(30):
            while any(m.applied < 1 for m in machines.values()):
                await trio.sleep(0.01)
        payload = random.Random(0).randbytes(body)
        _REPLICA.set(leader.node_id)  # proposing is the leader's work
        with _Count(body) as count:
            for _ in range(entries):
                await leader.propose(payload)
            with trio.fail_after(60):
                while any(m.applied < entries + 1 for m in machines.values()):
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    lead = leader.node_id
    by_replica = {i: count.passes.get(i, 0) / entries for i in ids}
    followers = [by_replica[i] for i in ids if i != lead]
    follower = sum(followers) / len(followers) if followers else 0.0
    return {
        "bench": "crc_passes",
        "entries": entries,
        "body_bytes": body,
        "replicas": replicas,
        "per_entry_leader": round(by_replica[lead], 3),
        "per_entry_followers": [round(f, 3) for f in followers],
        "per_entry_leader_plus_one_follower": round(by_replica[lead] + follower, 3),
        "per_entry_group": round(sum(by_replica.values()), 3),
        "unattributed": count.passes.get(0, 0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.crc_passes", description=__doc__)
    ap.add_argument("--entries", type=int, default=300)
    ap.add_argument("--body", type=int, default=4096)
    ap.add_argument("--replicas", type=int, default=3)
    args = ap.parse_args(argv)
    if args.body < 64 or args.entries < 1 or args.replicas < 1:
        ap.error("--body must be at least 64 bytes, --entries and --replicas at least 1")
    with tempfile.TemporaryDirectory(prefix="raftmq-crc-") as tmp:
        out = trio.run(_run, args.entries, args.body, args.replicas, Path(tmp))
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
