"""The Raft core over a store whose prefix retention has deleted (first_index > 1)."""

from __future__ import annotations

import random

from raftlog.core import RaftConfig, RaftNode
from raftlog.sim.disk import SimStore
from raftlog.types import Entry, Message, MsgType, Role
from tests.raft_harness import Cluster


class PrefixStore(SimStore):
    """A SimStore whose entries below `first` have been deleted (only their base term is
    still known, as the CommitLog keeps it in its base file)."""

    __slots__ = ("first",)

    def __init__(self, inner: SimStore) -> None:
        super().__init__(inner.hard_state)
        self.log = inner.log
        self.durable_len = inner.durable_len
        self.first = 1

    def delete_before(self, index: int) -> None:
        self.first = max(self.first, min(index, self.durable_len + 1))

    def first_index(self) -> int:
        return self.first

    def term(self, index: int) -> int:
        if 0 < index < self.first - 1:
            raise IndexError(f"term({index}): deleted")
        return super().term(index)

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < self.first:
            raise IndexError(f"entries({lo}, ...): deleted below {self.first}")
        return super().entries(lo, hi, max_bytes)


def _with_prefix_stores(c: Cluster) -> dict[int, PrefixStore]:
    stores = {i: PrefixStore(st) for i, st in c.stores.items()}
    c.stores.update(stores)
    return stores


def _restart(c: Cluster, i: int, applied: int) -> None:
    st = c.stores[i]
    st.crash()
    c.nodes[i] = RaftNode(i, st, st.hard_state, RaftConfig(), rng=random.Random(i), applied=applied)
    c.applied[i] = []


def test_restart_on_a_compacted_log_and_catch_up_a_lagging_follower() -> None:
    c = Cluster(3, seed=3)
    stores = _with_prefix_stores(c)
    for i in c.nodes:
        c.start(i)  # rebuild the cores over the wrapped stores
    first_leader = c.elect()
    for k in range(25):
        c.propose(f"a{k}".encode())
    lagger = next(i for i in c.nodes if i != first_leader.id)
    others = [i for i in c.nodes if i != lagger]
    c.isolate(lagger)
    for k in range(15):
        c.propose(f"b{k}".encode())
    leader = c.leader()
    lowest = leader.min_follower_match()
    assert lowest is not None and lowest < leader.last_index  # the lagger
    # the others delete a prefix the lagger has all of, and restart from a snapshot
    snap = {i: c.nodes[i].commit for i in others}
    for i in others:
        stores[i].delete_before(20)
        _restart(c, i, applied=snap[i])
    c.heal()
    new = c.elect()
    assert new.id in others
    assert not new.needs_snapshot
    c.propose(b"after")
    c.tick(2)
    assert c.nodes[lagger].commit == new.commit
    assert stores[lagger].log == stores[new.id].log
    assert c.payloads(lagger)[-16:] == [f"b{k}".encode() for k in range(15)] + [b"after"]
    # the restarted replicas applied only what followed their snapshot
    for i in others:
        assert c.applied[i] and all(e.index > snap[i] for e in c.applied[i])
        assert c.payloads(i)[-1] == b"after"


def test_a_follower_behind_the_first_index_is_reported_not_crashed() -> None:
    c = Cluster(3, seed=5)
    stores = _with_prefix_stores(c)
    for i in c.nodes:
        c.start(i)
    c.elect()
    leader = c.leader()
    follower = next(i for i in c.nodes if i != leader.id)
    c.propose(b"x")
    c.isolate(follower)
    for k in range(30):
        c.propose(f"m{k}".encode())
    for i in c.nodes:
        if i != follower:
            stores[i].delete_before(20)
    c.heal()
    c.tick(5)
    leader = c.leader()
    assert leader.needs_snapshot == {follower}
    assert c.nodes[follower].commit < 20
    # the rest of the group keeps working
    index = c.propose(b"still")
    c.tick(2)
    assert all(c.nodes[i].commit >= index for i in c.nodes if i != follower)
    assert c.nodes[follower].role == Role.FOLLOWER and c.nodes[follower].leader == leader.id


def test_fast_backup_stops_at_the_first_index() -> None:
    c = Cluster(3, seed=7)
    stores = _with_prefix_stores(c)
    for i in c.nodes:
        c.start(i)
    first = c.elect()
    first.transfer_leadership(next(i for i in c.nodes if i != first.id))
    c.stabilize()
    for k in range(40):
        c.propose(f"m{k}".encode())
    leader = c.leader()
    assert leader.term >= 2 and leader.term_at(20) == leader.term
    other = next(i for i in c.nodes if i != leader.id)
    stores[leader.id].delete_before(25)
    # a follower claiming an older conflicting term below our first index
    pr = leader._progress[other]
    pr.match = 0
    pr.become_probe()
    pr.next = 31
    leader.step(
        Message(MsgType.APPEND_RESP, other, leader.id, leader.term, reject=True,
                log_index=30, hint_term=leader.term - 1, hint_index=20)
    )
    leader.ready()
    assert leader.needs_snapshot == {other}
