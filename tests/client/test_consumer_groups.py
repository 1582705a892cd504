"""Consumer groups against a real cluster: membership that changes mid-stream, heartbeat
expiry, broadcast mode, the blocking push consumer and `poll` across queues.

One cluster serves the module; every test uses a topic and consumer group of its own, so
the tests are independent of each other and of their order. Consumers run with short
heartbeat, rebalance and commit intervals (0.2 s) so membership changes settle quickly;
every wait is for an event (a message, an assignment), bounded only as a safety net.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from raftmq.client import Admin, Message, Producer, PullConsumer, PushConsumer
from raftmq.client.blocking import BlockingProducer, BlockingPushConsumer
from raftmq.client.localoffsets import OffsetsInUseError
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster
from transport.blocking import request
from wire.protocol import Code, Op, RequestError

pytestmark = pytest.mark.live

QUEUES = 6  # spread over the three groups
FAST = {"heartbeat_interval": 0.2, "rebalance_interval": 0.2, "commit_interval": 0.2,
        "long_poll_ms": 200}
BOUND = 60.0  # a safety net for event waits, never a measurement


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("groups")) as c:
        yield c


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def create_topic(cluster: LocalCluster, topic: str) -> None:
    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, QUEUES)


async def send(cluster: LocalCluster, topic: str, bodies: list[bytes]) -> None:
    async with Producer(cluster.namesrv_addr) as producer:
        for body in bodies:
            await producer.send(topic, body)


async def until(predicate: Any, what: str) -> None:
    with anyio.fail_after(BOUND):
        while not predicate():
            await anyio.sleep(0.05)


def bodies(n: int, tag: str = "m") -> list[bytes]:
    return [f"{tag}{i}".encode() for i in range(n)]


def run(main: Any) -> Any:
    return anyio.run(main, backend="trio")


def test_members_joining_and_leaving_mid_stream_share_every_queue(cluster: LocalCluster) -> None:
    topic, group = fresh("join"), fresh("cg")
    first, second, third = bodies(60, "a"), bodies(60, "b"), bodies(60, "c")
    got: dict[str, list[Message]] = {"A": [], "B": []}

    def handler(name: str) -> Any:
        async def handle(msgs: list[Message]) -> bool:
            got[name] += msgs
            return True
        return handle

    def seen() -> set[bytes]:
        return {m.body for ms in got.values() for m in ms}

    async def main() -> None:
        await create_topic(cluster, topic)
        everything = {(topic, q) for q in range(QUEUES)}
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handler("A"),
                                client_id="A", **FAST) as a:
            await until(lambda: set(a.assignment()) == everything, "A owning every queue")
            await send(cluster, topic, first)
            await until(lambda: set(first) <= seen(), "A consuming the first part")
            async with PushConsumer(cluster.namesrv_addr, group, [topic], handler("B"),
                                    client_id="B", **FAST) as b:
                # joined: the queues are split, each owned by exactly one member
                await until(lambda: set(a.assignment()) | set(b.assignment()) == everything
                            and not set(a.assignment()) & set(b.assignment())
                            and a.assignment() and b.assignment(), "A and B sharing")
                await send(cluster, topic, second)
                await until(lambda: set(second) <= seen(), "the second part consumed")
                assert {m.body for m in got["B"]} & set(second), "B consumed nothing"
                assert {m.body for m in got["A"]} & set(second), "A consumed nothing"
            # B left: A takes every queue back and consumes what follows
            await until(lambda: set(a.assignment()) == everything, "A owning every queue again")
            await send(cluster, topic, third)
            await until(lambda: set(third) <= seen(), "the third part consumed")

    run(main)
    assert set(first + second + third) <= seen()


def test_a_member_that_stops_heartbeating_expires_and_its_queues_move(
    cluster: LocalCluster,
) -> None:
    topic, group = fresh("expiry"), fresh("cg")
    everything = {(topic, q) for q in range(QUEUES)}
    got: list[Message] = []

    async def handle(msgs: list[Message]) -> bool:
        got.extend(msgs)
        return True

    def ghost_heartbeat(ttl_ms: int) -> None:
        """A member that heartbeats once and is never heard from again (a crash)."""
        for node in cluster.node_ids:
            request(cluster.node_addr(node), {"op": int(Op.HEARTBEAT), "cg": group,
                                              "client": "ghost", "ttl_ms": ttl_ms})

    def members(node: int) -> list[str]:
        h, _ = request(cluster.node_addr(node), {"op": int(Op.CONSUMERS), "cg": group})
        return list(h["clients"])

    async def main() -> None:
        await create_topic(cluster, topic)
        ghost_heartbeat(60_000)
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handle,
                                client_id="live", **FAST) as c:
            # the ghost counts while its heartbeat lives: "live" gets only its share
            await until(lambda: c.assignment() and set(c.assignment()) != everything,
                        "live sharing with the ghost")
            ghost_heartbeat(500)  # its last word: it expires half a second from now
            await until(lambda: set(c.assignment()) == everything,
                        "the ghost's queues moving to live")
            assert all(members(n) == ["live"] for n in cluster.node_ids)
            await send(cluster, topic, bodies(30))
            await until(lambda: len({m.body for m in got}) == 30, "everything consumed")

    run(main)


def test_broadcast_mode_gives_every_consumer_every_message(cluster: LocalCluster,
                                                           tmp_path: Path) -> None:
    topic, group = fresh("bcast"), fresh("cg")
    want = set(bodies(40))
    got: dict[str, set[bytes]] = {"A": set(), "B": set()}

    def handler(name: str) -> Any:
        async def handle(msgs: list[Message]) -> bool:
            got[name].update(m.body for m in msgs)
            return True
        return handle

    async def main() -> None:
        await create_topic(cluster, topic)
        everything = {(topic, q) for q in range(QUEUES)}
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handler("A"),
                                mode="broadcast", offsets_dir=tmp_path / "A", **FAST) as a, \
                PushConsumer(cluster.namesrv_addr, group, [topic], handler("B"),
                             mode="broadcast", offsets_dir=tmp_path / "B", **FAST) as b:
            await until(lambda: set(a.assignment()) == set(b.assignment()) == everything,
                        "both reading every queue")
            await send(cluster, topic, sorted(want))
            await until(lambda: got["A"] == want and got["B"] == want, "both got everything")

    run(main)


def test_blocking_push_consumer_runs_a_plain_handler_over_every_message(
    cluster: LocalCluster,
) -> None:
    topic, group = fresh("blocking"), fresh("cg")
    want = set(bodies(40))
    got: set[bytes] = set()
    lock = threading.Lock()
    done = threading.Event()
    threads: set[int] = set()

    def handle(msgs: list[Message]) -> bool:  # plain: runs in worker threads, may block
        with lock:
            got.update(m.body for m in msgs)
            threads.add(threading.get_ident())
            if got >= want:
                done.set()
        return True

    run(lambda: create_topic(cluster, topic))
    with BlockingPushConsumer(cluster.namesrv_addr, group, [topic], handle, **FAST) as c, \
            BlockingProducer(cluster.namesrv_addr) as producer:
        for body in sorted(want):
            producer.send(topic, body)
        assert done.wait(BOUND), f"consumed {len(got)} of {len(want)}"
        assert {q for _, q in c.assignment()} == set(range(QUEUES))
        loop_thread = c._call_sync(threading.get_ident)
    # the handler blocked no event loop: it ran in worker threads
    assert threads and loop_thread not in threads and threading.get_ident() not in threads


def test_blocking_send_async_then_flush_waits_for_every_message_in_order(
    cluster: LocalCluster,
) -> None:
    """`BlockingProducer.send_async` hands the message over before it returns: `flush()`
    right after waits for every one (none is still on its way to the producer, to be
    cancelled by `close()`), and one thread's sends to a queue keep their order."""
    topic = fresh("blocking-async")
    want = bodies(60)
    run(lambda: create_topic(cluster, topic))
    with BlockingProducer(cluster.namesrv_addr) as producer:
        futures = [producer.send_async(topic, body, queue=0) for body in want]
        producer.flush()
        assert all(f.done() for f in futures), sum(not f.done() for f in futures)
        offsets = [f.result().offset for f in futures]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(want)

    async def read_back() -> list[bytes]:
        async with PullConsumer(cluster.namesrv_addr, fresh("cg")) as consumer:
            got = await consumer.pull(topic, 0, offset=0, max=len(want) + 1, wait_ms=0)
        return [m.body for m in got.messages]

    assert run(read_back) == want
    with BlockingProducer(cluster.namesrv_addr) as producer, \
            pytest.raises(Exception, match="(?i)unknown|topic"):
        producer.send_async(fresh("no-such-topic"), b"x")


def test_poll_returns_messages_from_every_assigned_queue_that_has_some(
    cluster: LocalCluster,
) -> None:
    topic, group = fresh("fair"), fresh("cg")

    async def main() -> set[int]:
        await create_topic(cluster, topic)
        async with Producer(cluster.namesrv_addr) as producer:
            for q in range(QUEUES):
                for i in range(5):
                    await producer.send(topic, f"{q}-{i}".encode(), queue=q)
        async with PullConsumer(cluster.namesrv_addr, group) as consumer:
            consumer.assign(topic)
            for q in range(QUEUES):  # every queue's first position known: no lookups left
                await consumer.pull(topic, q, max=1, wait_ms=0)
            got = await consumer.poll(timeout=5.0)
        return {m.queue for m in got}

    assert run(main) == set(range(QUEUES))


def test_a_message_the_handler_keeps_failing_is_passed_only_once_on_give_up_completed(
        cluster: LocalCluster) -> None:
    """With local retries, an async `on_give_up` is awaited to its end before the offset
    passes the message; without one (or when it raises) the message is tried again, never
    skipped."""
    topic, group = fresh("giveup"), fresh("cg-giveup")
    parked: list[bytes] = []
    calls: dict[bytes, int] = {}

    async def handler(msgs: list[Message]) -> bool:
        for m in msgs:
            calls[m.body] = calls.get(m.body, 0) + 1
        return msgs[0].body != b"poison"

    async def park(msgs: list[Message]) -> None:
        await anyio.sleep(0.3)  # a real forward awaits a send
        parked.extend(m.body for m in msgs)

    failing_once = {"left": 1}

    async def flaky_park(msgs: list[Message]) -> None:
        if failing_once["left"]:
            failing_once["left"] -= 1
            raise RuntimeError("cannot park right now")
        await park(msgs)

    async def offsets(cg: str) -> dict[int, int]:
        async with Admin(cluster.namesrv_addr) as admin:
            rows = (await admin.group_offsets(cg)).get(cg, {})
        return {q: o for (t, q), o in rows.items() if t == topic}

    async def main() -> None:
        await create_topic(cluster, topic)
        async with Producer(cluster.namesrv_addr) as producer:
            poison = await producer.send(topic, b"poison", key="k")
            await producer.send(topic, b"fine", key="k")  # same queue, after it
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handler,
                                max_reconsume_times=1, reconsume_delay=0.05,
                                on_give_up=flaky_park, retry="local", **FAST) as consumer:
            await until(lambda: parked == [b"poison"], "poison parked")
            await consumer.commit_now()
        assert calls[b"poison"] >= 3  # tried, retried, retried again after the failed park
        assert (await offsets(group)).get(poison.queue) == poison.offset + 2

        # no on_give_up: tried again and again, the committed offset stays at the message
        group2 = fresh("cg-nogiveup")
        calls.clear()
        async with PushConsumer(cluster.namesrv_addr, group2, [topic], handler,
                                max_reconsume_times=1, reconsume_delay=0.05,
                                retry="local", **FAST) as consumer:
            await until(lambda: calls.get(b"poison", 0) >= 3, "poison retried past the max")
            await consumer.commit_now()
        assert (await offsets(group2)).get(poison.queue, 0) <= poison.offset

    anyio.run(main)


def test_one_keys_messages_are_handled_one_at_a_time_in_order_retries_included(
        cluster: LocalCluster) -> None:
    """The push consumer keeps each key's order at its default concurrency: a key's next
    message starts only after the previous one finished, and with local retries a failed
    one holds its place until its redelivery succeeds, while other keys (and keyless
    messages) run beside."""
    topic, group = fresh("keyorder"), fresh("cg-keyorder")
    keys = ["alice", "bob", "carol"]
    per_key = 40
    started: dict[str, list[int]] = {k: [] for k in [*keys, ""]}
    running: dict[str, int] = {k: 0 for k in keys}
    overlaps: list[str] = []
    failed_once: set[int] = set()
    done = anyio.Event()
    handled: set[int] = set()

    async def handler(msgs: list[Message]) -> bool:
        (m,) = msgs
        n = int(m.body)
        key = m.key
        started[key].append(n)
        if key:
            running[key] += 1
            if running[key] > 1:
                overlaps.append(key)
        try:
            await anyio.sleep((n * 7919 % 13) / 1000)  # uneven handling times
            if n % 9 == 4 and n not in failed_once:  # fails once, then succeeds
                failed_once.add(n)
                return False
            handled.add(n)
            if len(handled) == len(keys) * per_key + 20:
                done.set()
            return True
        finally:
            if key:
                running[key] -= 1

    async def main() -> None:
        await create_topic(cluster, topic)
        async with Producer(cluster.namesrv_addr) as producer:
            n = 0
            for i in range(per_key):
                for k in keys:
                    await producer.send(topic, str(n).encode(), key=k)
                    n += 1
                if i % 2:
                    await producer.send(topic, str(10_000 + i).encode())
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handler,
                                reconsume_delay=0.05, retry="local", **FAST):
            with anyio.fail_after(BOUND):
                await done.wait()

    anyio.run(main)
    assert not overlaps
    assert failed_once
    for k in keys:
        seq = started[k]
        # each failed message is started again right after itself, never after a later one
        assert [n for i, n in enumerate(seq) if i == 0 or seq[i - 1] != n] == sorted(set(seq)), k
        assert len(set(seq)) == per_key


def test_a_broadcast_consumer_goes_on_where_it_stopped_after_a_restart(
        cluster: LocalCluster, tmp_path: Path) -> None:
    """Broadcast offsets live in a local file: a restarted consumer reads only what came
    after its last commit; a second live consumer of the group on the same file is
    refused; a file that is not ours is refused by name and left as it is."""
    topic, group = fresh("bcast-restart"), fresh("cg")
    first, later = set(bodies(20)), {b"later-%d" % i for i in range(10)}
    got: list[bytes] = []

    async def handle(msgs: list[Message]) -> bool:
        got.extend(m.body for m in msgs)
        return True

    def consumer() -> PushConsumer:
        return PushConsumer(cluster.namesrv_addr, group, [topic], handle, mode="broadcast",
                            offsets_dir=tmp_path, **FAST)

    async def main() -> None:
        await create_topic(cluster, topic)
        await send(cluster, topic, sorted(first))
        async with consumer():
            await until(lambda: set(got) == first, "the first messages")
            with pytest.raises(OffsetsInUseError, match=group):
                async with consumer():
                    pass
        got.clear()
        await send(cluster, topic, sorted(later))
        async with consumer():
            await until(lambda: set(got) == later, "the later messages")
            await anyio.sleep(1.0)  # time enough to read anything old again
        assert sorted(got) == sorted(later)  # nothing of the first batch again

    run(main)
    path = tmp_path / f"{group}.json"
    path.write_bytes(b"{not json")
    with pytest.raises(ValueError, match="move it aside"):
        run(lambda: consumer().__aenter__())
    assert path.read_bytes() == b"{not json"


def test_members_learn_of_a_join_and_a_leave_without_waiting_for_their_poll(
        cluster: LocalCluster) -> None:
    """The nodes tell a group's members when its membership changes: with the periodic
    rebalance an hour away, a join and a leave still move the queues at once."""
    topic, group = fresh("notify"), fresh("cg")
    slow = {**FAST, "rebalance_interval": 3600.0}

    async def handle(msgs: list[Message]) -> bool:
        return True

    async def main() -> None:
        await create_topic(cluster, topic)
        everything = {(topic, q) for q in range(QUEUES)}
        async with PushConsumer(cluster.namesrv_addr, group, [topic], handle, **slow) as a:
            await until(lambda: set(a.assignment()) == everything, "a alone reads everything")
            async with PushConsumer(cluster.namesrv_addr, group, [topic], handle,
                                    **slow) as b:
                await until(lambda: len(a.assignment()) == len(b.assignment()) == QUEUES // 2
                            and set(a.assignment()) | set(b.assignment()) == everything,
                            "a gave b half the queues")
            await until(lambda: set(a.assignment()) == everything, "a took them back")

    run(main)


def test_a_pull_consumer_is_a_member_its_group_sees_but_shares_no_queues(
        cluster: LocalCluster) -> None:
    """An offset reset refuses while a pull consumer of the group runs (it would undo
    the reset at its next commit), goes ahead once it closed; a push consumer of the
    same group keeps every queue for itself."""
    topic, group = fresh("pullmember"), fresh("cg")

    async def handle(msgs: list[Message]) -> bool:
        return True

    async def main() -> None:
        await create_topic(cluster, topic)
        async with Admin(cluster.namesrv_addr) as admin:
            async with PullConsumer(cluster.namesrv_addr, group, client_id="puller-1",
                                    heartbeat_interval=0.2) as pull:
                pull.assign(topic)
                await until_async(lambda: admin.consumers(group), "the pull consumer seen")
                assert await admin.consumers(group) == ["puller-1"]
                with pytest.raises(RequestError) as refused:
                    await admin.reset_offsets(group, topic, "latest")
                assert refused.value.code == Code.BUSY and "puller-1" in refused.value.message
                async with PushConsumer(cluster.namesrv_addr, group, [topic], handle,
                                        **FAST) as push:
                    await until(lambda: len(push.assignment()) == QUEUES,
                                "the push consumer reads every queue")
                    assert sorted(await push.clients()) == [push.client_id]
            plan = await admin.reset_offsets(group, topic, "latest")  # it left at once
            assert set(plan) == set(range(QUEUES))

    run(main)


def test_a_closed_pull_consumer_is_gone_from_its_group_at_once(cluster: LocalCluster) -> None:
    """Closing sends a leaving heartbeat; no periodic beat may follow it (one that did
    would make the consumer a member again, and an offset reset would refuse until its
    ttl ran out). Beats every 5 ms keep one in flight at almost every close."""
    topic, group = fresh("pullleave"), fresh("cg")

    async def main() -> None:
        await create_topic(cluster, topic)
        async with Admin(cluster.namesrv_addr) as admin:
            for i in range(8):
                async with PullConsumer(cluster.namesrv_addr, group, client_id=f"p{i}",
                                        heartbeat_interval=0.005) as pull:
                    pull.assign(topic)
                    await until_async(lambda: admin.consumers(group), "the consumer seen")
                    await anyio.sleep(0.05 * (i % 3))
                assert await admin.consumers(group) == [], f"close {i}"

    run(main)


async def until_async(get: Any, what: str) -> None:
    with anyio.fail_after(BOUND):
        while not await get():
            await anyio.sleep(0.05)


def test_subscribed_pull_consumers_share_a_groups_queues_and_hand_them_over(
        cluster: LocalCluster) -> None:
    """Kafka's `subscribe` for the pull consumer: two subscribed pull consumers and a
    push consumer of one group split the queues between them (disjoint, every queue
    once); each message is read by one member only; when one member leaves, the others
    take its queues over at a poll, `on_revoke` running before the queues go (and
    committing there) and `on_assign` after they come; assign and subscribe exclude
    each other."""
    topic, group = fresh("pullsub"), fresh("cg")
    calls: list[tuple[str, str, list[tuple[str, int]]]] = []
    got: dict[str, list[bytes]] = {"A": [], "B": [], "P": []}

    def consumer(name: str) -> PullConsumer:
        c = PullConsumer(cluster.namesrv_addr, group, client_id=f"{name}-{group}",
                         heartbeat_interval=0.2, rebalance_interval=0.2, wait_ms=100)

        async def on_revoke(qs: list[tuple[str, int]]) -> None:
            calls.append((name, "revoke", qs))
            await c.commit_all()

        def on_assign(qs: list[tuple[str, int]]) -> None:  # plain: run in a thread
            calls.append((name, "assign", qs))

        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return c

    async def handle(msgs: list[Message]) -> bool:
        got["P"] += [m.body for m in msgs]
        return True

    async def main() -> None:
        await create_topic(cluster, topic)
        a, b = consumer("A"), consumer("B")
        with pytest.raises(ValueError, match="subscribed"):
            a.assign(topic)
        async with a, b, PushConsumer(cluster.namesrv_addr, group, [topic], handle,
                                      **FAST) as push:
            async def shares() -> list[set[tuple[str, int]]]:
                await a.poll(0)
                await b.poll(0)
                return [set(await a.assignment()), set(await b.assignment()),
                        set(push.assignment())]

            async def split() -> bool:
                sa, sb, sp = await shares()
                return (len(sa) + len(sb) + len(sp) == QUEUES and not (sa & sb)
                        and not (sa & sp) and not (sb & sp) and all((sa, sb, sp)))

            await until_async(split, "the queues split three ways")
            await send(cluster, topic, bodies(60))
            with anyio.fail_after(BOUND):
                while len(got["A"]) + len(got["B"]) + len(got["P"]) < 60:
                    got["A"] += [m.body for m in await a.poll(0.2)]
                    got["B"] += [m.body for m in await b.poll(0.2)]
            await a.commit_all()
            await b.commit_all()
            everything = got["A"] + got["B"] + got["P"]
            assert sorted(everything) == sorted(bodies(60))  # each read by one member
            b_had = set(await b.assignment())
            await b.unsubscribe()  # gives its share up: on_revoke, then it is no member
            assert calls[-1] == ("B", "revoke", sorted(b_had))

            async def a_took_over() -> bool:
                await a.poll(0)
                return set(await a.assignment()) | set(push.assignment()) == {
                    (topic, q) for q in range(QUEUES)}

            await until_async(a_took_over, "A and the push consumer take B's queues")
            after = calls[calls.index(("B", "revoke", sorted(b_had))) + 1:]
            assert any(who == "A" and what == "assign" for who, what, _ in after)  # 2 -> 3
            await send(cluster, topic, bodies(30, "late"))
            late: list[bytes] = []
            with anyio.fail_after(BOUND):
                while len(late) + sum(b.startswith(b"late") for b in got["P"]) < 30:
                    late += [m.body for m in await a.poll(0.2)]
            assert not any(x.startswith(b"late") for x in got["B"])

    run(main)
