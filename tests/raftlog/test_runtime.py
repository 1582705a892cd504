"""The trio shell around the Raft core: three replicas on real CommitLogs in one process,
wired by an in-memory message bus, driven by real timers and real fsyncs."""

from __future__ import annotations

import errno

import pytest
import trio

from raftlog.commitlog import CommitLogError
from raftlog.runtime import (
    GroupRuntime,
    NotLeader,
    NotReady,
    ProposalInDoubt,
    _for_lack_of_space,
)
from raftlog.types import Entry, EntryType, Role
from tests.runtime_harness import Group, core_of


class Recorder:
    """A state machine that remembers what it applied."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, bytes]] = []

    def apply(self, entry: Entry) -> int:
        if entry.type == EntryType.MESSAGES:
            self.applied.append((entry.index, bytes(entry.data)))
        return entry.index


async def _propose_all(rt: GroupRuntime, payloads: list[bytes]) -> list[int]:
    results: list[int] = [0] * len(payloads)

    async def one(k: int, p: bytes) -> None:
        results[k] = await rt.propose(p)

    async with trio.open_nursery() as n:
        for k, p in enumerate(payloads):
            n.start_soon(one, k, p)
    return results


def test_proposals_commit_on_every_replica_with_group_commit(tmp_path):
    async def main() -> None:
        g = Group(tmp_path, Recorder)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await g.start(n, i)
            leader = await g.leader()
            payloads = [f"m{k}".encode() for k in range(500)]
            indexes = await _propose_all(leader, payloads)
            assert sorted(indexes) == indexes or len(set(indexes)) == 500
            # far fewer fsyncs than entries: concurrent proposals share them
            assert leader.fsyncs < 250
            with trio.fail_after(5):
                while any(len(m.applied) < 500 for m in g.machines.values()):
                    await trio.sleep(0.01)
            seqs = [m.applied for m in g.machines.values()]
            assert seqs[0] == seqs[1] == seqs[2]
            assert sorted(d for _, d in seqs[0]) == sorted(payloads)
            n.cancel_scope.cancel()

    trio.run(main)


def test_leader_loss_fails_waiters_and_a_new_leader_keeps_every_acked_entry(tmp_path):
    async def main() -> None:
        g = Group(tmp_path, Recorder)
        acked: list[bytes] = []
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await g.start(n, i)
            old = await g.leader()
            for k in range(50):
                await old.propose(f"a{k}".encode())
                acked.append(f"a{k}".encode())
            g.stop(old.node_id)
            new = await g.leader(exclude={old.node_id})
            assert new.node_id != old.node_id
            for k in range(50):
                await new.propose(f"b{k}".encode())
                acked.append(f"b{k}".encode())
            with pytest.raises(NotLeader):
                await g.runtimes[6 - old.node_id - new.node_id].propose(b"to a follower")
            with trio.fail_after(5):  # followers learn the last commit on the next heartbeat
                while any(len(g.machines[i].applied) < len(acked)
                          for i in (1, 2, 3) if i != old.node_id):
                    await trio.sleep(0.01)
            n.cancel_scope.cancel()
        # every acknowledged entry is in the survivors' committed logs, in order
        for i in (1, 2, 3):
            if i == old.node_id:
                continue
            got = [d for _, d in g.machines[i].applied]
            assert got == acked

    trio.run(main)


def test_restart_recovers_from_disk_and_preferred_leader_takes_over(tmp_path):
    async def main() -> None:
        g = Group(tmp_path, Recorder, preferred=1)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await g.start(n, i)
            with trio.fail_after(10):
                while not g.runtimes[1].is_leader:
                    await trio.sleep(0.01)
            for k in range(20):
                await g.runtimes[1].propose(f"x{k}".encode())
            g.stop(1)
            other = await g.leader(exclude={1})
            for k in range(20):
                await other.propose(f"y{k}".encode())
            await trio.sleep(0.05)
            await g.start(n, 1)  # recovers its CommitLog and replays it
            with trio.fail_after(10):
                while not (g.runtimes[1].is_leader and core_of(g.runtimes[1]).applied >= 40):
                    await trio.sleep(0.01)
            assert g.runtimes[other.node_id].role == Role.FOLLOWER
            assert [d for _, d in g.machines[1].applied][:40] == [
                *(f"x{k}".encode() for k in range(20)), *(f"y{k}".encode() for k in range(20))
            ]
            n.cancel_scope.cancel()

    trio.run(main)


def test_back_pressure_holds_proposals_while_the_group_is_behind(tmp_path):
    async def main() -> None:
        g = Group(tmp_path, Recorder, max_uncommitted_bytes=1000)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await g.start(n, i)
            leader = await g.leader()
            followers = [i for i in (1, 2, 3) if i != leader.node_id]
            for f in followers:
                g.down.add(f)  # no majority: nothing commits
            done: list[int] = []

            async def one(k: int) -> None:
                try:
                    done.append(await leader.propose(b"z" * 400))
                except NotLeader:
                    pass

            for k in range(10):
                n.start_soon(one, k)
            await trio.sleep(0.05)
            assert leader.status()["uncommitted_bytes"] <= 1400  # the rest wait
            assert not done
            n.cancel_scope.cancel()

    trio.run(main)


def test_read_barrier_confirms_leadership_and_never_serves_a_cut_off_leader(tmp_path):
    async def main() -> None:
        g = Group(tmp_path, Recorder)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await g.start(n, i)
            old = await g.leader()
            for k in range(5):
                await old.propose(f"c{k}".encode())
            commit = core_of(old).commit
            await old.read_barrier()  # a healthy leader confirms at once
            assert core_of(old).applied >= commit
            g.down.add(old.node_id)  # cut off, but still running and still believing
            with pytest.raises(NotLeader):
                with trio.fail_after(10):
                    await old.read_barrier()
            new = await g.leader(exclude={old.node_id})
            await new.propose(b"after the cut")
            await new.read_barrier()
            assert new.machine.applied[-1][1] == b"after the cut"
            n.cancel_scope.cancel()

    trio.run(main)


class ReadinessProbe(Recorder):
    """A Recorder that notes, as it applies each entry, what its runtime (`rt`, set once
    started) then answers a request: None when ready, else the exception's name."""

    def __init__(self) -> None:
        super().__init__()
        self.rt: GroupRuntime | None = None
        # (index, term, refusal, the leader it names)
        self.seen: list[tuple[int, int, str | None, int | None]] = []

    def apply(self, entry: Entry) -> int:
        if self.rt is not None:
            try:
                self.rt.check_ready()
                refusal, named = None, None
            except NotLeader as exc:
                refusal, named = type(exc).__name__, exc.leader
            self.seen.append((entry.index, entry.term, refusal, named))
        return super().apply(entry)


def test_a_new_leader_is_ready_only_once_an_entry_of_its_own_term_is_applied(tmp_path):
    """Raft thesis §6.4: a leader's state is complete only once an entry of its term
    commits. After a restart of every replica nothing is known committed, so the new
    leader applies its predecessor's entries only after its own NOOP commits; until its
    machine applied that far it refuses (NotReady, naming itself), and then it is ready."""
    async def main() -> None:
        g = Group(tmp_path, ReadinessProbe)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await g.start(n, i)
            old = await g.leader()
            await g.wait(lambda: old.is_ready)
            for k in range(20):
                await old.propose(f"r{k}".encode())
            for i in (1, 2, 3):
                await g.stop_and_wait(i)
            for i in (1, 2, 3):
                await g.start(n, i)
                g.machines[i].rt = g.runtimes[i]
            new = await g.leader()
            await g.wait(lambda: new.is_ready)
            probe = g.machines[new.node_id]
            assert len(probe.applied) == 20  # all its predecessor committed, before ready
            old_entries = [s for s in probe.seen if s[1] < new.term]
            assert len(old_entries) >= 20
            # meanwhile it refused, naming itself as the leader to retry
            assert {(r, named) for *_, r, named in old_entries} == {("NotReady", new.node_id)}
            new.check_ready()  # ready now: no refusal
            for i in (1, 2, 3):
                if i != new.node_id:
                    assert not g.runtimes[i].is_ready
                    with pytest.raises(NotLeader) as refused:
                        g.runtimes[i].check_ready()
                    assert not isinstance(refused.value, NotReady)
            n.cancel_scope.cancel()

    trio.run(main)


class ContextRecorder(Recorder):
    """A Recorder that also says which context, if any, came back with each entry."""

    def apply(self, entry: Entry, context: object = None) -> tuple[int, object]:
        super().apply(entry)
        return entry.index, context


def test_propose_many_returns_each_entrys_own_result_with_its_context(tmp_path):
    async def main() -> None:
        g = Group(tmp_path, ContextRecorder)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await g.start(n, i)
            leader = await g.leader()
            await leader.propose(b"first")
            results = await leader.propose_many([b"a", b"b", b"c"], contexts=["x", None, "z"])
            first = results[0][0]
            assert results == [(first, "x"), (first + 1, None), (first + 2, "z")]
            with trio.fail_after(5):
                while any(len(m.applied) < 4 for m in g.machines.values()):
                    await trio.sleep(0.01)
            for m in g.machines.values():
                assert m.applied[1:] == [(first, b"a"), (first + 1, b"b"), (first + 2, b"c")]
            follower = next(rt for rt in g.runtimes.values() if rt is not leader)
            with pytest.raises(NotLeader):
                await follower.propose_many([b"never"])
            with pytest.raises(ValueError):
                await leader.propose_many([b"a", b"b"], contexts=["only one"])
            n.cancel_scope.cancel()

    trio.run(main)


class _DeafLeaderGroup(Group):
    """A Group whose replicas in `deaf` hear nothing, but still send."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deaf: set[int] = set()

    def send(self, group: str, m) -> None:
        if m.dst not in self.deaf:
            super().send(group, m)


def test_a_proposal_cut_off_after_reaching_the_followers_is_in_doubt_and_may_commit(tmp_path):
    """The leader appends and sends the entry, then hears no acknowledgement and steps
    down: its caller must not be told "not leader, nothing written", since the followers
    hold the entry and the next leader commits it."""

    async def main() -> None:
        g = _DeafLeaderGroup(tmp_path, Recorder)
        async with trio.open_nursery() as n:
            for i in (1, 2, 3):
                await g.start(n, i)
            old = await g.leader()
            await old.propose(b"before")
            g.deaf.add(old.node_id)
            with pytest.raises(NotLeader) as info:
                with trio.fail_after(10):
                    await old.propose(b"in doubt")
            assert isinstance(info.value, ProposalInDoubt), info.value
            g.deaf.clear()
            new = await g.leader(exclude={old.node_id})
            await new.read_barrier()  # the new leader's term committed what it holds
            assert b"in doubt" in [d for _, d in new.machine.applied]
            n.cancel_scope.cancel()

    trio.run(main)


def test_a_full_disk_is_recognised_behind_the_commitlogs_own_errors() -> None:
    """`open_when_space` waits on a full disk also when the CommitLog wrapped the ENOSPC
    in its own error (rewriting the index does), and on nothing else."""
    full = OSError(errno.ENOSPC, "No space left on device")
    assert _for_lack_of_space(full)
    assert _for_lack_of_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    try:
        try:
            raise full
        except OSError as exc:
            raise CommitLogError(f"creating index.tmp failed: {exc}") from exc
    except CommitLogError as wrapped:
        assert _for_lack_of_space(wrapped)
    assert not _for_lack_of_space(OSError(errno.EIO, "I/O error"))
    assert not _for_lack_of_space(CommitLogError("entry 7 lies outside its segment"))
