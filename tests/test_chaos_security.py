"""`raftmq chaos run --workload security` end to end: users and ACLs changed under faults
by one admin while test users log in and publish or subscribe through every node; the
run comes out valid, and the `drop-acl-remove` mutation makes it invalid."""

from __future__ import annotations

from broker.parts.acls import DROP_REMOVE_EVERY, Acl, AclAdd, AclRemove, Acls
from broker.statemachine import BrokerState
from raftlog.types import Entry, EntryType


def test_drop_acl_remove_acknowledges_every_fifth_removal_and_keeps_the_entry() -> None:
    acls = [Acl(f"u{i}", "topic", "literal", "t", "publish", "allow") for i in range(10)]
    for mutations, kept in (((), set()), (("drop-acl-remove",), {acls[4], acls[9]})):
        s = BrokerState("g0", mutations=mutations)
        records = [AclAdd(a) for a in acls] + [AclRemove(a) for a in acls]
        results = [s.apply(Entry(term=1, index=i, type=EntryType.CONTROL, data=r.encode()))
                   for i, r in enumerate(records, start=1)]
        assert all(r.applied == 1 for r in results)  # every removal acknowledged
        assert set(s.part(Acls).entries()) == kept
    assert DROP_REMOVE_EVERY == 5
