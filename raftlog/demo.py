"""`raftmq demo`: one Raft group of three replicas on real CommitLogs, in one process.

It shows the foundation working end to end with real files and real fsync: an election,
batched proposals committed only once fsynced on a majority, a leader crash (its process
state thrown away, its files recovered from disk), a new election, the old leader catching
up, and finally the three CommitLogs compared byte for byte.

The driver here is the smallest possible shell around the core (the `Ready` loop with
group commit); the networked trio runtime is the node process, not this demo.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections import deque
from pathlib import Path

from rich.console import Console
from rich.table import Table

from raftlog.commitlog import CommitLog
from raftlog.core import NotLeader, ProposalDropped, RaftNode
from raftlog.hardstate import load_hardstate, save_hardstate
from raftlog.types import EntryType, HardState, Membership, Message, Role

__all__ = ["LocalGroup", "main"]


class LocalGroup:
    """Three replicas wired back to back; `round()` is one turn of every Ready loop."""

    def __init__(self, root: Path, ids: tuple[int, ...] = (1, 2, 3), seed: int = 7) -> None:
        self.root = root
        self.ids = ids
        self.rng = random.Random(seed)
        self.inbox: deque[Message] = deque()
        self.nodes: dict[int, RaftNode] = {}
        self.logs: dict[int, CommitLog] = {}
        self.applied: dict[int, int] = {}
        self.fsyncs = 0
        for i in ids:
            self.start(i)

    def _dir(self, i: int) -> Path:
        return self.root / f"n{i}"

    def start(self, i: int) -> None:
        d = self._dir(i)
        d.mkdir(parents=True, exist_ok=True)
        hs = load_hardstate(d / "hardstate")
        if not hs.configs:
            hs = HardState(configs=((0, 0, Membership(frozenset(self.ids))),))
            save_hardstate(d / "hardstate", hs)
        log = CommitLog.open(d, segment_size=1 << 20)
        self.logs[i] = log
        self.nodes[i] = RaftNode(i, log, hs, rng=random.Random(self.rng.random()))
        self.applied[i] = 0

    def crash(self, i: int) -> None:
        """Drop the replica's memory; only what reached its files survives."""
        self.nodes.pop(i)
        self.logs.pop(i).close()
        self.inbox = deque(m for m in self.inbox if m.dst != i)

    def round(self, tick: bool) -> None:
        for m in list(self.inbox):
            if m.dst in self.nodes:
                self.nodes[m.dst].step(m)
        self.inbox.clear()
        for i, node in self.nodes.items():
            if tick:
                node.tick()
            rd = node.ready()
            log = self.logs[i]
            if rd.hard_state is not None:
                save_hardstate(self._dir(i) / "hardstate", rd.hard_state)
            log.store(rd.entries)
            self.inbox.extend(rd.messages)
            if rd.apply:
                self.applied[i] = rd.apply[-1].index
        # Group commit: one fsync per replica covers everything appended this round.
        for i, node in self.nodes.items():
            log = self.logs[i]
            if log.last_index() > node.persisted_index:
                durable = log.sync()
                self.fsyncs += 1
                node.persisted(durable, log.term(durable))

    def leader(self) -> RaftNode | None:
        leaders = [n for n in self.nodes.values() if n.role == Role.LEADER]
        return leaders[0] if len(leaders) == 1 else None

    def elect(self) -> RaftNode:
        """Run until exactly one leader exists; return it."""
        self.run_until(lambda: self.leader() is not None)
        leader = self.leader()
        assert leader is not None
        return leader

    def run_until(self, done, limit: int = 5000) -> int:
        for k in range(limit):
            if done():
                return k
            self.round(tick=k % 4 == 0)
        raise RuntimeError("the group made no progress")

    def produce(self, count: int, size: int, per_round: int) -> float:
        """Propose `count` entries; return seconds until all are committed."""
        start = time.perf_counter()
        sent = 0
        target = 0
        while True:
            leader = self.leader()
            if leader is not None and sent < count:
                try:
                    for _ in range(min(per_round, count - sent)):
                        target = leader.propose(self.rng.randbytes(size), EntryType.MESSAGES)
                        sent += 1
                except (NotLeader, ProposalDropped):
                    pass
            if sent == count and leader is not None and leader.commit >= target:
                return time.perf_counter() - start
            self.round(tick=False)

    def close(self) -> None:
        for log in self.logs.values():
            log.close()


def _table(group: LocalGroup, title: str) -> Table:
    t = Table(title=title)
    for col in ("replica", "role", "term", "last index", "commit", "applied", "fsynced"):
        t.add_column(col)
    for i in group.ids:
        n = group.nodes.get(i)
        if n is None:
            t.add_row(str(i), "[red]down[/red]", "", "", "", "", "")
            continue
        t.add_row(
            str(i),
            n.role.name.lower(),
            str(n.term),
            str(n.last_index),
            str(n.commit),
            str(group.applied[i]),
            str(n.persisted_index),
        )
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="raftmq demo", description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, help="directory for the replicas (default: temporary)")
    ap.add_argument("--entries", type=int, default=3000, help="entries to commit per phase")
    ap.add_argument("--size", type=int, default=1024, help="bytes per entry")
    args = ap.parse_args(argv)
    con = Console()
    root = args.data or Path(tempfile.mkdtemp(prefix="raftmq-demo-"))
    group = LocalGroup(root)
    try:
        first = group.elect()
        con.print(f"[bold]elected[/bold] replica {first.id} in term {first.term}; data in {root}")
        secs = group.produce(args.entries, args.size, per_round=256)
        con.print(
            f"committed {args.entries} x {args.size} B entries in {secs:.2f} s "
            f"({args.entries / secs:,.0f}/s, each fsynced on a majority; {group.fsyncs} fsyncs)"
        )
        con.print(_table(group, "after the first phase"))

        con.print(f"[bold red]crashing the leader[/bold red] (replica {first.id})")
        group.crash(first.id)
        t0 = time.perf_counter()
        second = group.elect()
        con.print(f"replica {second.id} leads term {second.term} after {time.perf_counter() - t0:.3f} s")
        group.produce(args.entries, args.size, per_round=256)
        con.print(f"restarting replica {first.id} from its files")
        group.start(first.id)
        target = group.elect().commit
        group.run_until(lambda: all(group.applied[i] >= target for i in group.ids))
        con.print(_table(group, "after failover and catch-up"))

        commit = min(group.nodes[i].commit for i in group.ids)
        images = {i: bytes(group.logs[i].read_raw(1, commit + 1)) for i in group.ids}
        same = len(set(images.values())) == 1
        size = len(images[group.ids[0]])
        verdict = "[green]identical[/green]" if same else "[red]DIFFERENT[/red]"
        con.print(f"committed prefix 1..{commit} ({size:,} bytes) on the three CommitLogs: {verdict}")
        return 0 if same else 1
    finally:
        group.close()
        if args.data is None:
            shutil.rmtree(root, ignore_errors=True)
