"""Transactions through the SDK and the CLI, over real node processes.

One cluster (three nodes, three groups, check-back after 300 ms) serves the module; each
test uses topics, transactional ids and producer groups of its own, so they pass alone
and in any order. A topic of three queues has queue q in group g{q}, so a transaction
over its queues spans every group and needs the coordinator and its markers. What a
consumer reads is what read-committed delivers: the only isolation there is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import anyio
import pytest

from broker.state.parts.txpart import MAX_TX_MESSAGES
from raftmq.client import (
    Admin,
    CheckRequest,
    HalfHandle,
    Producer,
    ProducerFencedError,
    PullConsumer,
    TransactionAbortedError,
    TransactionError,
    connect_admin,
    connect_producer,
)
from raftmq.commands.tx import main as tx_main
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster
from tests.live_cluster import drain, poll_for
from wire.protocol import Code, RequestError
from wire.requests.transactions import TxAddRequest

pytestmark = pytest.mark.live

T = TypeVar("T")
BACKENDS = ["asyncio", "trio"]
DECIDED_TIMEOUT = 60.0  # a bound on waiting for a check-back, not a measurement


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with live_cluster(tmp_path_factory.mktemp("tx"), groups=3, node_overrides={
            "tx_check_first_ms": 300, "tx_check_interval_ms": 300}) as c:
        yield c


def run(fn: Callable[[], Awaitable[T]], backend: str = "trio") -> T:
    return anyio.run(fn, backend=backend)


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def make_topic(ns: str, queues: int = 3) -> str:
    topic = name("tx")
    async with Admin(ns) as admin:
        await admin.create_topic(topic, queues)  # queue q in g{q}
    return topic


async def read_all(ns: str, topic: str) -> list[bytes]:
    """Every message a new consumer group reads from the start of `topic` now: each queue
    up to its end (prepared data is held out of the queues until decided)."""
    drained = await drain(ns, topic, name("reader"))
    return sorted(m.body for msgs in drained.values() for m in msgs)


# ---------------------------------------------------------------- Kafka's model


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cross_group_commit_shows_everything_and_an_abort_nothing(
        cluster: LocalCluster, backend: str) -> None:
    ns = cluster.namesrv_addr

    async def main() -> tuple[list[bytes], list[bytes], list[bytes]]:
        topic = await make_topic(ns)
        async with Producer(ns, transactional_id=name("tid")) as p:
            tx = await p.begin()
            for q in range(3):
                r = await tx.send(topic, f"c{q}", queue=q)
                assert r.offset == -1 and r.msg_id and r.group == f"g{q}"  # prepared
            await tx.send_batch(topic, [b"c3", b"c4"], queue=0)
            before = await read_all(ns, topic)  # stored, acknowledged, not visible
            await tx.commit()
            committed = await read_all(ns, topic)
            with pytest.raises(RuntimeError, match="boom"):
                async with p.transaction() as tx2:
                    for q in range(3):
                        await tx2.send(topic, f"a{q}", queue=q)
                    raise RuntimeError("boom")  # aborts, then raises as itself
            assert tx2.state == "aborted"
            async with p.transaction() as tx3:  # the producer goes on after an abort
                await tx3.send(topic, b"after", queue=2)
        return before, committed, await read_all(ns, topic)

    before, committed, final = run(main, backend)
    assert before == []
    assert committed == [b"c0", b"c1", b"c2", b"c3", b"c4"]
    assert final == [b"after", b"c0", b"c1", b"c2", b"c3", b"c4"]


def test_commits_that_do_not_wait_for_visibility_run_back_to_back(
        cluster: LocalCluster) -> None:
    """commit(wait_visible=False) returns once decided; the next transactions start while
    the markers of earlier ones still go out (a third waits for the first), and every
    committed message becomes visible, none of the aborted one."""
    ns = cluster.namesrv_addr

    async def main() -> list[bytes]:
        topic = await make_topic(ns)
        async with Producer(ns, transactional_id=name("tid")) as p:
            for k in range(6):
                tx = await p.begin()
                for q in range(3):
                    await tx.send(topic, f"t{k}-{q}", queue=q)
                if k == 3:
                    await tx.abort()
                else:
                    await tx.commit(wait_visible=False)
                    assert tx.state == "committed"
            want = sorted(f"t{k}-{q}".encode() for k in (0, 1, 2, 4, 5) for q in range(3))
            with anyio.fail_after(DECIDED_TIMEOUT):
                while (seen := await read_all(ns, topic)) != want:
                    assert set(seen) <= set(want)  # never a message of the aborted one
                    await anyio.sleep(0.1)
        return seen

    assert len(run(main)) == 15


def test_sends_started_together_add_their_groups_in_one_request(
        cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    adds: list[list[str]] = []

    async def main() -> list[bytes]:
        topic = await make_topic(ns)
        async with Producer(ns, transactional_id=name("tid")) as p:
            owner = p._transactional()
            call = owner.call

            async def spy(request: Any, **kw: Any) -> Any:
                req = request(await owner.coordinator())
                if isinstance(req, TxAddRequest):
                    adds.append(list(req.groups))
                return await call(request, **kw)

            async with p.transaction() as tx:  # learns the topic's route
                await tx.send(topic, b"first", queue=0)
            owner.call = spy  # type: ignore[method-assign]
            async with p.transaction() as tx, anyio.create_task_group() as tg:
                for q in range(3):
                    tg.start_soon(partial(tx.send_batch, topic, [f"b{q}"] * 2, queue=q))
        return await read_all(ns, topic)

    assert run(main) == [b"b0", b"b0", b"b1", b"b1", b"b2", b"b2", b"first"]
    assert adds == [["g0", "g1", "g2"]]


def test_a_second_producer_of_the_id_fences_the_first(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr

    async def main() -> list[bytes]:
        topic = await make_topic(ns)
        tid = name("tid")
        async with Producer(ns, transactional_id=tid) as zombie:
            old = await zombie.begin()
            await old.send(topic, b"zombie", queue=0)
            async with Producer(ns, transactional_id=tid) as p2:
                async with p2.transaction() as tx:  # TX_INIT: a new epoch
                    await tx.send(topic, b"new", queue=1)
                with pytest.raises(ProducerFencedError) as send_err:
                    await old.send(topic, b"zombie-2", queue=1)
                with pytest.raises(ProducerFencedError) as commit_err:
                    await old.commit()
                for err in (send_err.value, commit_err.value):  # raised as itself
                    assert err.__cause__ is not err and err.__context__ is not err
                assert zombie.fenced
                with pytest.raises(ProducerFencedError):
                    await zombie.begin()
                assert not p2.fenced
        return await read_all(ns, topic)

    assert run(main) == [b"new"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_send_offsets_move_the_committed_offsets_only_with_the_commit(
        cluster: LocalCluster, backend: str) -> None:
    """A consume-transform-produce loop: input read in a consumer group, its upper-cased
    output sent and its offsets committed in one transaction."""
    ns = cluster.namesrv_addr
    cg = name("pipe")

    async def main() -> tuple[list[int], list[bytes], list[int], list[bytes]]:
        src, dst = await make_topic(ns), await make_topic(ns)
        async with Producer(ns) as plain:
            for q in range(3):
                await plain.send_batch(src, [f"in-{q}-{i}" for i in range(2)], queue=q)

        async def one_pass(commit: bool) -> None:
            async with PullConsumer(ns, cg, wait_ms=0) as c, \
                    Producer(ns, transactional_id=f"{cg}-tid") as p:
                c.assign(src)
                msgs = await poll_for(c, 6)
                assert len(msgs) == 6
                assert await c.poll(timeout=0.2) == []  # and no more
                tx = await p.begin()
                for m in msgs:
                    await tx.send(dst, m.body.upper(), queue=m.queue)
                await tx.send_offsets(cg, {(src, q): 2 for q in range(3)})
                await (tx.commit() if commit else tx.abort())

        async def committed() -> list[int]:
            async with Admin(ns) as admin:
                return [await admin.committed_offset(cg, src, q) for q in range(3)]

        await one_pass(commit=False)
        after_abort = (await committed(), await read_all(ns, dst))
        await one_pass(commit=True)  # the same input again: the abort consumed nothing
        return (*after_abort, await committed(), await read_all(ns, dst))

    offs_aborted, out_aborted, offs, out = run(main, backend)
    assert offs_aborted == [-1, -1, -1] and out_aborted == []
    assert offs == [2, 2, 2]
    assert out == sorted(f"IN-{q}-{i}".encode() for q in range(3) for i in range(2))


def test_a_committed_offset_query_waits_for_an_undecided_transaction(
        cluster: LocalCluster) -> None:
    """Offsets sent in a transaction are neither the old nor the new ones until it is
    decided: a query made meanwhile answers with the outcome, not before it."""
    ns = cluster.namesrv_addr
    cg = name("pipe")

    async def main() -> tuple[int, int]:
        src = await make_topic(ns, 1)
        async with Producer(ns) as plain:
            await plain.send_batch(src, [b"a", b"b", b"c"], queue=0)
        answer: list[int] = []
        async with Producer(ns, transactional_id=name("tid")) as p, Admin(ns) as admin:
            before = await admin.committed_offset(cg, src, 0)
            tx = await p.begin()
            await tx.send_offsets(cg, {(src, 0): 3})

            async def query() -> None:
                answer.append(await admin.committed_offset(cg, src, 0))

            async with anyio.create_task_group() as tg:
                tg.start_soon(query)
                await anyio.sleep(2.0)  # longer than the plain retries of a request
                assert not answer  # still waiting for the decision
                await tx.commit()
        return before, answer[0]

    assert run(main) == (-1, 3)


def test_misuse_of_a_transaction_is_a_clear_error_and_changes_nothing(
        cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr

    async def main() -> list[bytes]:
        topic = await make_topic(ns)
        async with Producer(ns, transactional_id=name("tid")) as p:
            tx = await p.begin()
            await tx.send(topic, b"one", queue=0)
            with pytest.raises(TransactionError, match="already open"):
                await p.begin()
            await tx.commit()
            with pytest.raises(TransactionError, match="committed") as info:
                await tx.commit()  # twice
            assert info.value.code == Code.TX_DECIDED
            with pytest.raises(TransactionError, match="committed"):
                await tx.abort()
            with pytest.raises(TransactionError, match="committed"):
                await tx.send(topic, b"late", queue=0)
            tx2 = await p.begin()
            await tx2.send(topic, b"two", queue=1)
            await tx2.abort()
            with pytest.raises(TransactionError, match="aborted"):
                await tx2.commit()  # after abort
            with pytest.raises(ValueError):
                await (await p.begin()).send_offsets("cg", {(topic, 0): -1})
        return await read_all(ns, topic)

    assert run(main) == [b"one"]


def test_a_transaction_past_its_timeout_is_aborted(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr

    async def main() -> list[bytes]:
        topic = await make_topic(ns)
        async with Producer(ns, transactional_id=name("tid"),
                            transaction_timeout_ms=300) as p:
            tx = await p.begin()
            await tx.send(topic, b"late", queue=0)
            async with Admin(ns) as admin:  # until the coordinator aborted it
                with anyio.fail_after(DECIDED_TIMEOUT):
                    while not _aborted(await admin.tx_show(tx.tid), tx.n):
                        await anyio.sleep(0.1)
            with pytest.raises(TransactionAbortedError):
                await tx.commit()
            async with p.transaction() as tx2:  # the producer goes on
                await tx2.send(topic, b"next", queue=1)
        return await read_all(ns, topic)

    assert run(main) == [b"next"]


def _aborted(shown: dict[str, list[dict[str, Any]]], n: int) -> bool:
    """Whether the coordinator shows transaction `n` aborted (its reason: timeout)."""
    return (any(r.get("n") == n and r.get("commit") is False for r in shown["done"])
            or any(r.get("n") == n and r.get("state") in ("prepare_abort", "complete_abort")
                   for r in shown["txns"]))


def test_a_transaction_over_its_limits_is_refused_and_shows_nothing(
        cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr

    async def main() -> list[bytes]:
        topic = await make_topic(ns, 1)
        with pytest.raises(TransactionError) as info:
            async with Producer(ns, transactional_id=name("tid"),
                                transaction_timeout_ms=10**9) as p:
                await p.begin()  # over the node's tx_timeout_max_ms
        assert info.value.code == Code.TX_LIMIT
        async with Producer(ns, transactional_id=name("tid")) as p:
            tx = await p.begin()
            with pytest.raises(TransactionError):  # one message too many
                await tx.send_batch(topic, [b"m"] * (MAX_TX_MESSAGES + 1), queue=0)
            with pytest.raises(TransactionAbortedError) as aborted:
                await tx.commit()
            assert isinstance(aborted.value.__cause__, TransactionError)
            assert aborted.value.__cause__.code == Code.TX_LIMIT
            async with p.transaction() as tx2:  # the producer goes on
                await tx2.send(topic, b"fits")
        return await read_all(ns, topic)

    assert run(main) == [b"fits"]


# ---------------------------------------------------------------- RocketMQ's model


@pytest.mark.parametrize("backend", BACKENDS)
def test_send_in_transaction_commits_or_rolls_back_as_the_local_transaction_says(
        cluster: LocalCluster, backend: str) -> None:
    ns = cluster.namesrv_addr

    async def main() -> list[bytes]:
        topic = await make_topic(ns)
        local_db: list[bytes] = []

        def local(msg: Any) -> str:  # plain: runs in a worker thread
            local_db.append(msg.body)
            return "commit" if msg.body.startswith(b"ok") else "rollback"

        async with Producer(ns, producer_group=name("pg")) as p:
            r1 = await p.send_in_transaction(topic, b"ok-1", local_transaction=local)
            r2 = await p.send_in_transaction(topic, b"no-1", local_transaction=local)
            assert (r1.state, r2.state) == ("commit", "rollback")
            assert r1.send.msg_id and r1.send.offset == -1 and r1.txid != r2.txid
            h = await p.prepare(topic, b"explicit", queue=2)
            assert b"explicit" not in await read_all(ns, topic)
            assert await h.commit() is True and not h.repeated
            assert await h.commit() is True and h.repeated  # the same decision again: harmless
            with pytest.raises(TransactionError) as info:
                await h.rollback()  # the other way: refused
            assert info.value.code == Code.TX_DECIDED
            h2 = await p.prepare(topic, b"dropped", queue=1)
            await h2.rollback()
        assert local_db == [b"ok-1", b"no-1"]
        return await read_all(ns, topic)

    assert run(main, backend) == [b"explicit", b"ok-1"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_back_decides_half_messages_their_producer_never_ended(
        cluster: LocalCluster, backend: str) -> None:
    ns = cluster.namesrv_addr
    pg = name("pg")

    async def main() -> tuple[list[bytes], dict[str, Any], list[CheckRequest], str]:
        topic = await make_topic(ns)
        async with Producer(ns, producer_group=pg) as gone:  # prepares, never decides
            keep = await gone.prepare(topic, b"keep", queue=0)
            drop = await gone.prepare(topic, b"drop", queue=1)
            r = await gone.send_in_transaction(topic, b"unsure", queue=2,
                                               local_transaction=lambda m: "unknown")
            assert r.state == "unknown"
        answers = {keep.txid: "commit", drop.txid: "rollback", r.txid: "commit"}
        asked: list[CheckRequest] = []
        strangers: list[CheckRequest] = []

        async def listener(req: CheckRequest) -> str:
            asked.append(req)
            return answers.get(req.txid, "unknown")

        def stranger(req: CheckRequest) -> str:  # another producer group: never asked
            strangers.append(req)
            return "rollback"

        async with Producer(ns, producer_group=name("other"), check_listener=stranger), \
                Producer(ns, producer_group=pg, check_listener=listener), \
                Admin(ns) as admin:
            with anyio.fail_after(DECIDED_TIMEOUT):  # until check-back decided all three
                while any(h["txid"] in answers for h in (await admin.tx_list())["halves"]):
                    await anyio.sleep(0.1)
            shown = await admin.tx_show(drop.txid)
        assert strangers == []
        return await read_all(ns, topic), shown, asked, drop.txid

    bodies, shown, asked, dropped = run(main, backend)
    assert bodies == [b"keep", b"unsure"]
    [decision] = [d for d in shown["decided"] if d["id"] == dropped]
    assert decision["commit"] is False and decision["source"] == "check"
    assert {a.producer_group for a in asked} == {pg}
    assert all(a.topic and a.msg_id for a in asked)


def test_only_the_producer_group_of_a_half_message_may_decide_it(
        cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr

    async def main() -> list[bytes]:
        topic = await make_topic(ns, 1)
        async with Producer(ns, producer_group=name("pg")) as owner, \
                Producer(ns, producer_group=name("pg")) as other:
            h = await owner.prepare(topic, b"mine")
            intruder = HalfHandle(other._half_messages(), h.txid, h.result)
            with pytest.raises(RequestError) as info:
                await intruder.commit()
            assert info.value.code == Code.FORBIDDEN
            await h.commit()
        return await read_all(ns, topic)

    assert run(main) == [b"mine"]


def test_tx_cli_lists_shows_and_decides_half_messages(
        cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    ns = cluster.namesrv_addr
    pg = name("pg")

    async def prepare() -> tuple[str, str, str]:
        topic = await make_topic(ns)
        async with Producer(ns, producer_group=pg) as p:  # no listener: nobody answers
            a = await p.prepare(topic, b"by-operator", queue=0)
            b = await p.prepare(topic, b"dropped-by-operator", queue=1)
        return topic, a.txid, b.txid

    topic, commit_id, rollback_id = run(prepare)

    def cli(*args: str) -> tuple[int, str, str]:
        code = tx_main([*args, "--namesrv", ns])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, _ = cli("list", "--json")
    assert code == 0
    listed = json.loads(out)
    pending = {h["txid"]: h for h in listed["halves"]}
    assert pending[commit_id]["producer_group"] == pg and pending[commit_id]["topic"] == topic
    assert rollback_id in pending and listed["unreadable"] == []
    code, out, _ = cli("list")
    assert code == 0 and commit_id in out and "half messages waiting" in out
    code, out, _ = cli("show", commit_id, "--json")
    assert code == 0 and [h["txid"] for h in json.loads(out)["halves"]] == [commit_id]
    assert cli("commit", commit_id)[0] == 0
    code, out, _ = cli("rollback", rollback_id, "--json")
    assert code == 0 and json.loads(out) == {"txid": rollback_id, "decision": "rollback",
                                             "already": False}
    code, out, _ = cli("commit", commit_id, "--json")  # again: harmless
    assert code == 0 and json.loads(out)["already"] is True
    code, _, err = cli("commit", rollback_id)  # the other way
    assert code == 1 and "TX_DECIDED" in err
    code, _, err = cli("show", "no-such-transaction")
    assert code == 1 and "TX_UNKNOWN" in err
    code, _, err = cli("commit", "no-such-transaction")
    assert code == 1 and "TX_UNKNOWN" in err
    code, out, _ = cli("show", rollback_id, "--json")
    [decision] = [d for d in json.loads(out)["decided"] if d["id"] == rollback_id]
    assert decision["source"] == "operator" and decision["commit"] is False
    # the installed command routes to the same code
    proc = subprocess.run([sys.executable, "-m", "raftmq", "tx", "show", commit_id, "--json",
                           "--namesrv", ns], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    [decision] = [d for d in json.loads(proc.stdout)["decided"] if d["id"] == commit_id]
    assert decision["source"] == "operator" and decision["commit"] is True
    assert run(lambda: read_all(ns, topic)) == [b"by-operator"]


def test_unknown_half_messages_are_clear_errors(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr

    async def main() -> None:
        async with Admin(ns) as admin:
            for decide in (admin.tx_commit, admin.tx_rollback):
                with pytest.raises(TransactionError) as info:
                    await decide(uuid.uuid4().hex)
                assert info.value.code == Code.TX_UNKNOWN

    run(main)



def test_the_blocking_facade_drives_both_models(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    topic = run(lambda: make_topic(ns))
    with connect_producer(ns, transactional_id=name("tid")) as p:
        with p.transaction() as tx:
            tx.send(topic, b"k0", queue=0)
            tx.send_batch(topic, [b"k1", b"k2"], queue=1)
        with pytest.raises(KeyError), p.transaction() as tx:
            tx.send(topic, b"aborted", queue=2)
            raise KeyError("boom")
        assert tx.state == "aborted"
    with connect_producer(ns, producer_group=name("pg"), backend="trio") as hp:
        r = hp.send_in_transaction(topic, b"h0", local_transaction=lambda m: "commit")
        assert r.state == "commit"
        handle = hp.prepare(topic, b"h1", queue=2)
    with connect_admin(ns) as admin:
        assert handle.txid in {h["txid"] for h in admin.tx_list()["halves"]}
        assert [h["txid"] for h in admin.tx_show(handle.txid)["halves"]] == [handle.txid]
        assert admin.tx_rollback(handle.txid) is False
        assert admin.tx_rollback(handle.txid) is True
    assert run(lambda: read_all(ns, topic)) == [b"h0", b"k0", b"k1", b"k2"]
