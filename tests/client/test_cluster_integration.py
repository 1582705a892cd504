"""End-to-end: real name server and node processes on loopback, driven by the client SDK.

Each scenario starts a `LocalCluster` (3 nodes, 3 groups g0..g2, preferred leaders spread
one per node) in a temporary directory and checks what a user relies on:

* messages sent to a topic spread over every group are consumed exactly once, in offset
  order per queue, which is the order they were sent in;
* kill -9 of a node leading a group while producers (plain and idempotent) and a consumer
  run: a new leader is registered within seconds, clients resume, and every acknowledged
  message is in the log and consumed; the idempotent producer's retries across the
  failover leave no duplicate;
* a consumer group's committed offsets survive the failover of the group holding them;
* after a killed node returns, the preferred leaders take their groups back.

Measured figures (failover and rebalance times, duplicates of the plain producer) are
printed; run with `-s` to see them.
"""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from raftmq.client import Admin, Message, Producer, PullConsumer, PushConsumer, RequestError
from raftmq.localcluster import LocalCluster
from tests.live_cluster import (
    DRAIN_TIMEOUT,
    SendLog,
    _balanced,
    assert_no_unexpected_exits,
    check_log,
    drain,
    leader_of,
    preferred,
    produce_until,
    wait_balanced,
    wait_new_leader,
)

pytestmark = pytest.mark.live


GROUPS = ("g0", "g1", "g2")
READY_TIMEOUT = 60.0  # generous: another test run may share the two cores
FAILOVER_BOUND = 10.0


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


def _figure(name: str, value: object) -> None:
    print(f"[figure] {name}: {value}")


# ------------------------------------------------------------------ cluster helpers


def _start(base: Path) -> LocalCluster:
    cluster = LocalCluster(base)
    cluster.start()
    try:
        cluster.wait_ready(timeout=READY_TIMEOUT)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = _start(tmp_path / "cluster")
    try:
        yield c
    finally:
        c.stop()


# ------------------------------------------------------------------ 1. spread topic


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_produce_and_consume_across_three_groups(cluster: LocalCluster) -> None:
    """6 queues over g0..g2; N messages; a two-member consumer group reads each exactly
    once, per queue in offset order, which is the send order."""
    ns = cluster.namesrv_addr
    topic, n = "spread", 3000
    # a leader handing its group back to the preferred node mid-stream would make the
    # producer move a batch to another queue, and "offset order = send order" assumes not
    await anyio.to_thread.run_sync(wait_balanced, cluster)
    async with Admin(ns) as admin:
        placement = await admin.create_topic(topic, 6)
    assert placement == {"g0": [0, 3], "g1": [1, 4], "g2": [2, 5]}

    consumed: dict[str, list[Message]] = defaultdict(list)

    def handler_for(name: str) -> Callable[[list[Message]], Any]:
        async def handle(msgs: list[Message]) -> None:
            consumed[name].extend(msgs)

        return handle

    members = [
        PushConsumer(ns, "cg-spread", [topic], handler_for(name), consume_concurrency=1,
                     pull_batch=64, rebalance_interval=0.5, heartbeat_interval=5.0,
                     commit_interval=1.0, long_poll_ms=2000, client_id=name)
        for name in ("member-a", "member-b")
    ]
    async with members[0] as a, members[1] as b:
        # produce only once the group has settled, so no queue changes hands mid-stream
        t0 = time.monotonic()
        with anyio.fail_after(30):
            while not (
                len(a.assignment()) == 3 and len(b.assignment()) == 3
                and set(a.assignment()) | set(b.assignment()) == {(topic, q) for q in range(6)}
            ):
                await anyio.sleep(0.05)
        _figure("consumer group settled (s)", round(time.monotonic() - t0, 2))

        sent = SendLog("m")
        t0 = time.monotonic()
        async with Producer(ns) as producer:
            futs = []
            for i in range(n):
                body = f"m-{i}"
                sent.order[body] = i
                futs.append((body, await producer.send_async(topic, body)))
            for body, fut in futs:
                await fut.wait()
                sent.record(body, fut)
        _figure(f"sent and acked {n} (s)", round(time.monotonic() - t0, 2))
        assert not sent.failed and len(sent.acked) == n

        t0 = time.monotonic()
        with anyio.fail_after(DRAIN_TIMEOUT):
            while sum(len(v) for v in consumed.values()) < n:
                await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # anything beyond n would be a duplicate: let it show
        _figure(f"consumed {n} (s after last ack)", round(time.monotonic() - t0, 2))

    all_msgs = [m for msgs in consumed.values() for m in msgs]
    bodies = Counter(m.body.decode() for m in all_msgs)
    assert len(all_msgs) == n, f"{len(all_msgs) - n} extra deliveries"
    assert set(bodies) == set(sent.acked) and max(bodies.values()) == 1

    by_queue: dict[int, list[Message]] = defaultdict(list)
    owners: dict[int, set[str]] = defaultdict(set)
    for name, msgs in consumed.items():
        for m in msgs:
            by_queue[m.queue].append(m)  # in the order this member was handed them
            owners[m.queue].add(name)
    assert sorted(by_queue) == list(range(6))
    assert all(len(o) == 1 for o in owners.values()), f"queues changed hands: {owners}"
    assert {len(qs) for qs in _invert(owners).values()} == {3}
    for q, msgs in by_queue.items():
        assert [m.offset for m in msgs] == list(range(len(msgs)))
        for m in msgs:
            res = sent.acked[m.body.decode()]
            assert (res.queue, res.offset, res.msg_id) == (q, m.offset, m.msg_id)
        sends = sorted((sent.order[m.body.decode()], m.offset) for m in msgs)
        assert [off for _, off in sends] == list(range(len(msgs))), (
            f"queue {q}: offset order is not send order"
        )
        assert {sent.acked[m.body.decode()].group for m in msgs} == {placement_group(q)}
    assert_no_unexpected_exits(cluster)


def placement_group(queue: int) -> str:
    return GROUPS[queue % len(GROUPS)]


def _invert(owners: dict[int, set[str]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for q, names in owners.items():
        for name in names:
            out[name].append(q)
    return out


# ------------------------------------------------------------------ 2 + 3. failover


@dataclass
class FailoverRun:
    victim: int
    group: str
    new_leader: int
    failover_s: float
    resume_s: dict[str, float]  # producer -> first ack from `group` after the kill
    plain: SendLog
    idem: SendLog
    consumed: list[Message]
    consumer_catch_up_s: float
    log: dict[int, list[Message]]
    rebalance_s: float
    exits: dict[str, int]
    at_failover: dict[str, int]  # acked (per producer) and consumed when it was registered


async def _failover_scenario(cluster: LocalCluster) -> FailoverRun:
    ns = cluster.namesrv_addr
    topic = "failover"
    async with Admin(ns) as admin:
        await admin.create_topic(topic, 6)

    consumed: list[Message] = []

    async def handle(msgs: list[Message]) -> None:
        consumed.extend(msgs)

    plain, idem = SendLog("plain"), SendLog("idem")
    stop = anyio.Event()
    consumer = PushConsumer(ns, "cg-failover", [topic], handle, commit_interval=1.0,
                            rebalance_interval=2.0, heartbeat_interval=2.0)
    async with consumer, Producer(ns) as p_plain, Producer(
        ns, idempotent=True, retries=10
    ) as p_idem, anyio.create_task_group() as tg:
        tg.start_soon(produce_until, p_plain, topic, plain, stop)
        tg.start_soon(produce_until, p_idem, topic, idem, stop)
        with anyio.fail_after(30):
            while min(len(plain.acked), len(idem.acked)) < 300 or len(consumed) < 300:
                await anyio.sleep(0.1)

        group = "g0"
        victim = await anyio.to_thread.run_sync(leader_of, cluster, group)
        kill_at = time.monotonic()
        await anyio.to_thread.run_sync(cluster.kill, victim, signal.SIGKILL)
        new_leader = await anyio.to_thread.run_sync(
            wait_new_leader, cluster, group, victim, 3 * FAILOVER_BOUND
        )
        failover_s = time.monotonic() - kill_at
        at_failover = {"plain": len(plain.acked), "idem": len(idem.acked),
                       "consumed": len(consumed)}

        registered_at = kill_at + failover_s

        # both producers get acks from the failed-over group again (counted from when
        # its new leader was registered, so no late ack of the dead leader counts);
        # the consumer moves on
        def resumed(log: SendLog) -> float | None:
            times = [t for b, t in log.ack_time.items()
                     if t > registered_at and log.acked[b].group == group]
            return min(times) - kill_at if times else None

        with anyio.fail_after(60):
            while (resumed(plain) is None or resumed(idem) is None
                   or len(consumed) < at_failover["consumed"] + 300):
                await anyio.sleep(0.1)
        await anyio.sleep(2.0)  # keep the stream going on the new leader a little
        stop.set()

    resume_s = {"plain": resumed(plain) or -1.0, "idem": resumed(idem) or -1.0}

    # every acknowledged message must reach the consumer group: if the member above
    # left before seeing some, a new member continues from the group's committed offsets
    acked = set(plain.acked) | set(idem.acked)
    seen = {m.body.decode() for m in consumed}
    t0 = time.monotonic()

    async def handle_rest(msgs: list[Message]) -> None:
        consumed.extend(msgs)
        seen.update(m.body.decode() for m in msgs)

    if not acked <= seen:
        async with PushConsumer(ns, "cg-failover", [topic], handle_rest, commit_interval=1.0):
            with anyio.move_on_after(DRAIN_TIMEOUT):
                while not acked <= seen:
                    await anyio.sleep(0.1)
    catch_up_s = time.monotonic() - t0

    log = await drain(ns, topic, "cg-failover-audit")

    await anyio.to_thread.run_sync(cluster.restart, victim)
    await anyio.to_thread.run_sync(cluster.wait_ready, READY_TIMEOUT)
    rebalance_s = await anyio.to_thread.run_sync(wait_balanced, cluster)
    exits = cluster.unexpected_exits()
    return FailoverRun(
        victim, group, new_leader, failover_s, resume_s, plain, idem, consumed, catch_up_s,
        log, rebalance_s, exits, at_failover,
    )


@pytest.fixture(scope="module")
def failover_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FailoverRun]:
    cluster = _start(tmp_path_factory.mktemp("failover"))
    try:
        initial_balance = wait_balanced(cluster)
        _figure("initial leader balance (s after ready)", round(initial_balance, 2))
        run = anyio.run(_failover_scenario, cluster, backend="trio")
        plain_dups = sum(
            n - 1 for n in Counter(
                m.body.decode() for msgs in run.log.values() for m in msgs
                if m.body.startswith(b"plain-")
            ).values()
        )
        _figure("killed node / group / new leader", (run.victim, run.group, run.new_leader))
        _figure("failover: kill -> new leader registered (s)", round(run.failover_s, 3))
        _figure("first ack from the failed-over group after the kill (s)",
                {k: round(v, 3) for k, v in run.resume_s.items()})
        _figure("plain producer: acked / failed / duplicates in the log",
                (len(run.plain.acked), len(run.plain.failed), plain_dups))
        _figure("idempotent producer: acked / failed / dedup answers",
                (len(run.idem.acked), len(run.idem.failed), run.idem.dedup_answers))
        _figure("consumer deliveries / distinct bodies",
                (len(run.consumed), len({m.body for m in run.consumed})))
        _figure("consumer catch-up after producers stopped (s)", round(run.consumer_catch_up_s, 2))
        _figure("rebalance after restart of the killed node (s)", round(run.rebalance_s, 2))
        _figure("acked and consumed when the new leader was registered", run.at_failover)
        yield run
    finally:
        cluster.stop()


def test_leader_kill_mid_stream_loses_no_acknowledged_message(failover_run: FailoverRun) -> None:
    run = failover_run
    assert not run.exits, f"unexpected exits besides the killed node: {run.exits}"
    assert run.new_leader != run.victim
    # both producers and the consumer carried on through the failover
    assert all(v > 0 for v in run.resume_s.values()), run.resume_s
    check_log(run.log)
    stored: dict[str, set[tuple[int, int, str | None]]] = {}  # a plain producer may duplicate
    for q, msgs in run.log.items():
        for m in msgs:
            stored.setdefault(m.body.decode(), set()).add((q, m.offset, m.msg_id))
    for log in (run.plain, run.idem):
        assert len(log.acked) > run.at_failover[log.name], f"{log.name} stopped at the kill"
        lost = sorted(set(log.acked) - set(stored), key=log.order.__getitem__)
        assert not lost, f"{log.name}: {len(lost)} acknowledged messages lost, e.g. {lost[:5]}"
        for body, res in log.acked.items():
            if res.offset >= 0:  # the ack says where the message is: it is there
                assert (res.queue, res.offset, res.msg_id) in stored[body], body
    seen = {m.body.decode() for m in run.consumed}
    missed = (set(run.plain.acked) | set(run.idem.acked)) - seen
    assert not missed, f"{len(missed)} acknowledged messages never consumed"
    assert seen <= set(stored), "the consumer saw a body that is not in the log"


def test_idempotent_retries_across_failover_make_no_duplicates(
    failover_run: FailoverRun,
) -> None:
    run = failover_run
    per_queue: dict[int, list[int]] = {}
    idem_bodies: Counter[str] = Counter()
    for q, msgs in run.log.items():
        seqs = [run.idem.order[m.body.decode()] for m in msgs if m.body.startswith(b"idem-")]
        idem_bodies.update(f"idem-{s}" for s in seqs)
        per_queue[q] = seqs
    dups = {b: n for b, n in idem_bodies.items() if n > 1}
    assert not dups, f"idempotent producer duplicated {len(dups)} messages, e.g. {list(dups)[:5]}"
    # one batch in flight per queue, resent to the same queue: the log keeps send order
    for q, seqs in per_queue.items():
        assert seqs == sorted(seqs), f"queue {q}: idempotent messages out of send order"
    # what the plain producer duplicated is reported, not judged
    plain = Counter(m.body for msgs in run.log.values() for m in msgs
                    if m.body.startswith(b"plain-"))
    print(f"[figure] plain producer duplicates: {sum(n - 1 for n in plain.values())}")
    assert set(run.plain.acked) <= {b.decode() for b in plain}


# ------------------------------------------------------------------ 4. offsets


@pytest.mark.anyio
async def test_committed_offsets_survive_failover(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic, group = "offsets", "cg-offsets"
    async with Admin(ns) as admin:
        await admin.create_topic(topic, 3)  # queue q in g<q>
    async with Producer(ns) as producer:
        for q in range(3):
            await producer.send_batch(topic, [f"q{q}-{i}" for i in range(200)], queue=q)

    await anyio.to_thread.run_sync(wait_balanced, cluster)  # the victim below still leads
    leaders = cluster.leaders()
    queue = 1
    g = placement_group(queue)
    victim = leaders[g]
    assert victim is not None
    committed_at = 137
    async with PullConsumer(ns, group) as c:
        got: list[Message] = []
        while len(got) < committed_at:
            res = await c.pull(topic, queue, max=min(32, committed_at - len(got)), wait_ms=0)
            got += res.messages
        assert [m.offset for m in got] == list(range(committed_at))
        await c.commit_all()  # answered once committed on a majority of the group
        # other queues of the group commit too, through the other groups' logs
        await c.commit(topic, 0, 50)
        await c.commit(topic, 2, 20)

    # kill the queue's leader right after the commit was acknowledged
    t0 = time.monotonic()
    cluster.kill(victim)
    new_leader = wait_new_leader(cluster, g, victim, 3 * FAILOVER_BOUND)
    failover_s = time.monotonic() - t0
    _figure(f"offsets: {g} leader {victim} -> {new_leader} (s)", round(failover_s, 3))
    # the victim may have led another group too: wait until every group is led again
    cluster.wait_ready(timeout=READY_TIMEOUT)

    t0 = time.monotonic()
    async with PullConsumer(ns, group) as fresh:
        with anyio.fail_after(30):
            while True:  # the route may still name the dead leader for a moment
                try:
                    committed = await fresh.committed(topic, queue)
                    break
                except RequestError as exc:
                    if not exc.retriable:
                        raise
                    await anyio.sleep(0.2)
        assert committed == committed_at
        res = await fresh.pull(topic, queue, max=32, wait_ms=0)
        assert res.messages and res.messages[0].offset == committed_at
        assert res.messages[0].body == f"q{queue}-{committed_at}".encode()
        assert await fresh.committed(topic, 0) == 50
        assert await fresh.committed(topic, 2) == 20
    _figure("offsets: first read from the new leader (s after it was registered)",
            round(time.monotonic() - t0, 3))

    # the same through a push consumer, which starts from the committed offsets
    pushed: list[Message] = []

    async def handle(msgs: list[Message]) -> None:
        pushed.extend(msgs)

    async with PushConsumer(ns, group, [topic], handle, rebalance_interval=1.0):
        with anyio.fail_after(30):
            while len(pushed) < (200 - committed_at) + (200 - 50) + (200 - 20):
                await anyio.sleep(0.05)
    firsts = {q: min(m.offset for m in pushed if m.queue == q) for q in range(3)}
    assert firsts == {0: 50, 1: committed_at, 2: 20}
    assert_no_unexpected_exits(cluster)


# ------------------------------------------------------------------ 5. rebalance


def test_preferred_leaders_return_after_restart(cluster: LocalCluster) -> None:
    """Kill the node leading g1, restart it, and see every node lead one group again."""
    t0 = time.monotonic()
    wait_balanced(cluster)
    _figure("rebalance: initial balance (s after ready)", round(time.monotonic() - t0, 2))
    assert preferred(cluster) == {"g0": 1, "g1": 2, "g2": 3}
    victim = cluster.leaders()["g1"]
    assert victim == 2
    cluster.kill(victim)
    wait_new_leader(cluster, "g1", victim, 3 * FAILOVER_BOUND)
    assert not _balanced(cluster, cluster.leaders())
    t0 = time.monotonic()
    cluster.restart(victim)
    cluster.wait_ready(timeout=READY_TIMEOUT)
    wait_balanced(cluster)
    total = time.monotonic() - t0
    _figure("rebalance: restart -> each node leads one group (s)", round(total, 2))
    assert cluster.leaders()["g1"] == victim
    assert_no_unexpected_exits(cluster)
