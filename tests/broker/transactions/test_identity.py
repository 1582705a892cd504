"""Transactional identity over real node processes with logins and ACLs on: only the
coordinator grants a transactional id's epochs, so a client's batch header cannot claim
one (and fence the id's owner), and `raftmq tx list` shows what participants hold.

One cluster (three nodes, groups g0 and g1, `authorize = true`) serves the module. The
victim's transactional id is coordinated by g0; the topic both write to lives in g1, so
the participant asks the coordinator over the peer link. The victim runs as the
superuser; mallory may only publish to that one topic; twin may also publish on the
victim's transactional id (another instance of the same application, say), so its made-up
epochs reach the coordinator's check past the ACLs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from broker.doors.security import make_credential
from broker.state.parts.users import format_verifier
from raftmq.client import Admin, Producer
from raftmq.commands import acl as acl_cmd
from raftmq.commands import user as user_cmd
from raftmq.localcluster import LocalCluster
from tests.conftest import steady_leaders, wait_for
from transport.blocking import request
from transport.connection import ConnectionPool
from transport.scram import PASSWORD_ENV, USER_ENV, Credentials
from wire.protocol import Code, Op, RequestError
from wire.records import OutgoingMessage, encode_batch
from wire.txn import coordinator_group

pytestmark = pytest.mark.live

ROOT = Credentials("root", "root's long password")
MALLORY = Credentials("mallory", "mallory's password")
TWIN = Credentials("twin", "twin's password")
TOPIC = "shared"  # one queue, in g1
VICTIM = "victim-tid"
TOP_EPOCH = (1 << 63) - 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    keys = {"authenticate": True, "authorize": True, "superusers": ["root"],
            "superuser_scram": format_verifier(make_credential(ROOT.password)),
            "tx_orphan_ms": 1000, "tx_tick_ms": 200}
    base = tmp_path_factory.mktemp("txid")
    with LocalCluster(base, nodes=3, groups=2, tick_ms=50, node_overrides=keys,
                      credentials=ROOT) as c:
        steady_leaders(c)
        mp = pytest.MonkeyPatch()
        mp.setenv(USER_ENV, ROOT.user)
        mp.setenv(PASSWORD_ENV, ROOT.password)
        ns = ["--namesrv", c.namesrv_addr]
        for who in (MALLORY, TWIN):
            mp.setenv("RAFTMQ_NEW_PASSWORD", who.password)
            assert user_cmd.main(["add", who.user, *ns]) == 0
            assert acl_cmd.main(["add", "--user", who.user, "--allow", "publish",
                                 "--topic", TOPIC, *ns]) == 0
        assert acl_cmd.main(["add", "--user", "twin", "--allow", "publish",
                             "--transactional-id", VICTIM, *ns]) == 0
        request(leader(c), {"op": int(Op.CREATE_TOPIC), "g": "g1", "topic": TOPIC,
                            "queues": 1, "hosted": [0]}, credentials=ROOT)
        wait_for(lambda: routed(c), 30, f"the name server routing {TOPIC}")
        mp.undo()
        yield c


def routed(c: LocalCluster) -> bool:
    """Whether the name server routes TOPIC yet (a node registers a new topic there on
    its next heartbeat; the SDK's `Admin.create_topic` waits for it, a raw request not)."""
    try:
        request(c.namesrv_addr, {"op": int(Op.ROUTE), "topic": TOPIC}, credentials=ROOT)
    except RequestError:
        return False
    return True


def leader(c: LocalCluster, gid: str = "g1") -> str:
    n = wait_for(lambda: c.leaders().get(gid), 60, f"a leader of {gid}")
    return c.node_addr(n)


def end_of(c: LocalCluster) -> int:
    h, _ = request(leader(c), {"op": int(Op.FETCH), "topic": TOPIC, "queue": 0,
                               "offset": 0, "max": 1, "wait_ms": 0}, credentials=ROOT)
    return int(h["end"])


def attack(c: LocalCluster, epoch: int, who: Credentials = TWIN) -> RequestError:
    """A PRODUCE to the topic `who` may publish to, its batch header claiming the victim's
    transactional id at `epoch`: the refusal it gets."""
    batch = encode_batch(TOPIC, 0, [OutgoingMessage(b"evil")], tx=(VICTIM, epoch, 0))

    def refusal() -> RequestError | None:
        """The refusal, or None for one to retry (a node's metadata replica catching up
        after the restart answers UNAVAILABLE)."""
        try:
            request(leader(c), {"op": int(Op.PRODUCE), "g": "g1"}, bytes(batch),
                    credentials=who, timeout=30.0)
        except RequestError as exc:
            return None if exc.retriable else exc
        raise AssertionError(f"a batch claiming epoch {epoch} was accepted")

    return wait_for(refusal, 30, "a refusal that is not to be retried")


def attacks_refused(c: LocalCluster) -> None:
    """Mallory is stopped by the ACLs (no right on the victim's id); twin, allowed on
    it, by the coordinator: it never granted that epoch."""
    err = attack(c, TOP_EPOCH, MALLORY)
    assert err.code == Code.FORBIDDEN, err
    for epoch in (TOP_EPOCH, victim_epoch(c) + 1):  # the next epoch: not granted either
        err = attack(c, epoch)
        assert err.code == Code.TX_UNKNOWN and f"has no epoch {epoch}" in err.message, err


def victim_epoch(c: LocalCluster) -> int:
    deadline = time.monotonic() + 60
    while True:
        try:
            h, _ = request(leader(c, "g0"), {"op": int(Op.TX_STATUS), "g": "g0",
                                             "tid": VICTIM}, credentials=ROOT, timeout=30.0)
            return int(h["epoch"])
        except RequestError as exc:  # leadership moved after the name server last heard
            if exc.code != Code.NOT_LEADER or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def victim_commits(c: LocalCluster, body: bytes) -> None:
    """The victim (a new producer of its id: TX_INIT, a new epoch) commits one message."""
    async def main() -> None:
        async with ConnectionPool(credentials=ROOT) as pool, \
                Producer(c.namesrv_addr, pool=pool, transactional_id=VICTIM) as p:
            async with p.transaction() as tx:
                await tx.send(TOPIC, body)

    anyio.run(main, backend="trio")


def tx_list(c: LocalCluster, tid: str) -> dict[str, list[dict[str, Any]]]:
    async def main() -> dict[str, list[dict[str, Any]]]:
        async with ConnectionPool(credentials=ROOT) as pool, \
                Admin(c.namesrv_addr, pool=pool) as admin:
            return await admin.tx_list(tid)

    return anyio.run(main, backend="trio")


def test_a_batch_header_cannot_claim_an_epoch_the_coordinator_never_granted(
        cluster: LocalCluster) -> None:
    """Issue 24 #3: a PRODUCE whose header claims `tx: [victim, 2**63-1, 0]` used to be
    prepared and raise the participant's fence for the victim's id, so every later send
    of the victim there got TX_FENCED, across restarts. Now it is refused (FORBIDDEN
    without a right on the id, TX_UNKNOWN with one), holds nothing, and the victim's
    transactions go on, also after a full restart."""
    assert coordinator_group(VICTIM, ["g0", "g1"]) == "g0"  # asked over the peer link
    victim_commits(cluster, b"first")
    before = end_of(cluster)
    attacks_refused(cluster)
    assert tx_list(cluster, VICTIM)["prepared"] == []  # nothing held for the attackers
    victim_commits(cluster, b"second")  # epoch 1 now
    assert end_of(cluster) == before + 1
    attacks_refused(cluster)

    cluster.kill_together(cluster.node_ids)
    first, *others = cluster.node_ids
    assert cluster.restart_and_wait(first, timeout=60) is None
    # alone, it cannot learn what its group committed: its users are an old state
    # (mallory was added after its last snapshot), so a login is to be retried, not
    # refused as an unknown user
    with pytest.raises(RequestError) as info:
        request(cluster.node_addr(first), {"op": int(Op.FETCH), "topic": TOPIC, "queue": 0,
                                           "offset": 0, "max": 1, "wait_ms": 0},
                credentials=MALLORY, timeout=30.0)
    assert info.value.code == Code.UNAVAILABLE and "catching up" in info.value.message, \
        info.value
    for i in others:  # each serving before the next starts (its "ready" line)
        assert cluster.restart_and_wait(i, timeout=60) is None
    steady_leaders(cluster)
    attacks_refused(cluster)
    victim_commits(cluster, b"after restart")
    assert end_of(cluster) == before + 2
    assert tx_list(cluster, VICTIM)["prepared"] == []


def test_tx_list_shows_data_a_participant_holds_undecided(cluster: LocalCluster) -> None:
    """An open transaction's batch shows in `prepared` (group, epoch, n, queue, count,
    the log index it pins) until the decision, then no more."""
    tid = f"lister-{uuid.uuid4().hex[:8]}"
    rows: list[dict[str, Any]] = []

    async def main() -> None:
        async with ConnectionPool(credentials=ROOT) as pool, \
                Producer(cluster.namesrv_addr, pool=pool, transactional_id=tid) as p, \
                Admin(cluster.namesrv_addr, pool=pool) as admin:
            async with p.transaction() as tx:
                await tx.send(TOPIC, b"open 1")
                await tx.send(TOPIC, b"open 2")
                rows.extend((await admin.tx_list(tid))["prepared"])

    anyio.run(main, backend="trio")
    [row] = rows
    assert (row["g"], row["tid"], row["n"], row["queues"], row["messages"]) == (
        "g1", tid, 0, [f"{TOPIC}/0"], 2), row
    assert row["first_index"] > 0 and row["prepared_ms"] > 0
    assert tx_list(cluster, tid)["prepared"] == []
