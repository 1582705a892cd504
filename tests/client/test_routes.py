"""Routing book-keeping: route parsing, leader hints, replica probing, placement; and
the blocking wrappers' lifecycle (no server needed for either)."""

from __future__ import annotations

import threading

import pytest

from raftmq.client import connect_admin, connect_producer, connect_pull_consumer
from raftmq.client.admin import place_queues
from raftmq.client.errors import UnavailableError
from raftmq.client.routes import (
    FAILED_TTL,
    HINT_TTL,
    Routes,
    clock,
    electing,
    node_addresses,
    normalize_addresses,
    parse_route,
)
from transport.connection import ConnectionPool, TransportError
from wire.protocol import MAX_MESSAGE_BYTES, Code, Op, RequestError

ROUTE = {
    "total": 3,
    "queues": [[0, "g1", "a:1"], [1, "g2", None], [2, "g1", "a:1"]],
    "replicas": {"g1": ["a:1", "b:1", "c:1"], "g2": ["b:1", "c:1", "d:1"]},
}


def routes_with(route: dict, now: float = 100.0) -> Routes:
    routes = Routes(ConnectionPool(), ["ns1:9876", "ns2:9876"])
    r = parse_route("orders", route, now)
    routes._topics["orders"] = r
    routes.learn_route(r, now)
    return routes


def test_parse_route_and_addresses() -> None:
    r = parse_route("orders", ROUTE, 5.0)
    assert r.total == 3 and r.groups == ["g1", "g2"]
    assert r.group_of(1) == "g2" and r.group_of(7) is None
    assert r.queues[1].leader is None and r.queues[0].leader == "a:1"
    with pytest.raises(RequestError) as info:
        parse_route("orders", {"queues": []})
    assert info.value.code == Code.MALFORMED
    assert normalize_addresses("h1:1, h2:2 h3:3") == ["h1:1", "h2:2", "h3:3"]
    assert normalize_addresses(["h1:1"]) == ["h1:1"]
    for bad in ("", "h1", ["h:0"]):
        with pytest.raises(ValueError):
            normalize_addresses(bad)
    cluster = {"nodes": {1: {"addr": "b:1"}, 2: {"addr": "a:1"}, 3: {"metrics": {}}}}
    assert node_addresses(cluster) == ["a:1", "b:1"]


def test_leader_from_route_and_replica_probing() -> None:
    routes = routes_with(ROUTE)
    assert routes.target("g1") == "a:1"
    # no leader known for g2: its replicas are tried in turn
    assert [routes.target("g2") for _ in range(4)] == ["b:1", "c:1", "d:1", "b:1"]
    assert routes.target("unknown") is None


def test_not_leader_hint_outranks_the_name_servers_for_a_while() -> None:
    routes = routes_with(ROUTE)
    hint = RequestError(Code.NOT_LEADER, "moved", leader="b:1")
    assert routes.on_error("g1", "a:1", hint, now=101.0)
    assert routes.target("g1") == "b:1"
    assert routes.doubted("g1") and not routes._topics["orders"].stale
    # a stale name server still says a:1: the hint wins until it ages out
    routes.learn_route(parse_route("orders", ROUTE, 102.0), 102.0)
    assert routes.target("g1") == "b:1"
    routes.learn_route(parse_route("orders", ROUTE, 101.0 + HINT_TTL + 1), 101.0 + HINT_TTL + 1)
    assert routes.target("g1") == "a:1"


def test_failed_leader_is_not_relearned_at_once() -> None:
    routes = routes_with(ROUTE)
    lost = TransportError("connection to a:1 lost", sent=True)
    assert routes.on_error("g1", "a:1", lost, now=101.0)  # ask another replica at once
    assert routes.leader("g1") is None
    routes.learn_route(parse_route("orders", ROUTE, 102.0), 102.0)
    assert routes.leader("g1") is None  # the name servers may not know yet
    assert routes.target("g1") in ("a:1", "b:1", "c:1")
    routes.learn_route(parse_route("orders", ROUTE, 0), 101.0 + FAILED_TTL + 1)
    assert routes.leader("g1") == "a:1"


def test_not_leader_without_hint_and_busy() -> None:
    routes = routes_with(ROUTE)
    assert not routes.on_error("g1", "a:1", RequestError(Code.BUSY, "behind"), now=101.0)
    assert routes.leader("g1") == "a:1"  # back-pressure: same leader, back off
    assert not routes.on_error("g1", "a:1", RequestError(Code.NOT_LEADER, "?", leader=None),
                               now=101.0)
    assert routes.leader("g1") is None
    # a hint naming the address that just refused is no hint
    routes2 = routes_with(ROUTE)
    assert not routes2.on_error("g1", "a:1", RequestError(Code.NOT_LEADER, "?", leader="a:1"),
                                now=101.0)


def test_learn_cluster_answer() -> None:
    routes = Routes(ConnectionPool(), "ns:1")
    routes.learn_cluster({
        "nodes": {},
        "groups": {
            "g1": {"leader": 2, "leader_addr": "b:1", "replicas": {1: "a:1", 2: "b:1"}},
            "g2": {"leader": None, "leader_addr": None, "replicas": {1: "a:1", 3: "c:1"}},
        },
    }, now=1.0)
    assert routes.leader("g1") == "b:1"
    assert routes.replicas("g2") == ["a:1", "c:1"]
    assert routes.target("g2") == "a:1"


def test_queue_placement() -> None:
    assert place_queues(4, ["g1", "g2"]) == {"g1": [0, 2], "g2": [1, 3]}
    assert place_queues(5, ["g3", "g1", "g2"]) == {"g3": [0, 3], "g1": [1, 4], "g2": [2]}
    assert place_queues(1, ["g1", "g2"]) == {"g1": [0]}
    for total, groups in ((0, ["g"]), (2, []), (2, ["g", "g"])):
        with pytest.raises(ValueError):
            place_queues(total, groups)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_blocking_wrappers_open_and_close_their_loop_thread(backend: str) -> None:
    threads = threading.active_count()
    with connect_producer("127.0.0.1:1", backend=backend) as producer:
        with pytest.raises(RequestError) as info:
            producer.send("orders", b"x" * (MAX_MESSAGE_BYTES + 1))
        assert info.value.code == Code.MESSAGE_TOO_LARGE
        producer.flush()
    with pytest.raises(RuntimeError):
        producer.send("orders", b"x")
    with connect_pull_consumer("127.0.0.1:1", "cg", backend=backend) as consumer:
        consumer.assign("orders", [0, 1])
        consumer.seek("orders", 1, 5)
        assert consumer.position("orders", 1) == 5
        assert consumer.position("orders", 0) is None
    admin = connect_admin("127.0.0.1:1", backend=backend)
    admin.close()
    admin.close()
    assert threading.active_count() <= threads


def test_hint_to_a_leader_that_just_failed_is_followed_but_counted() -> None:
    routes = routes_with(ROUTE)
    lost = TransportError("no answer", sent=True)
    routes.on_error("g1", "a:1", lost, now=101.0)
    assert routes.leader("g1") is None
    # a follower still believes in a:1: try it again, but not as a free redirect
    stale_hint = RequestError(Code.NOT_LEADER, "not me", leader="a:1")
    assert not routes.on_error("g1", "b:1", stale_hint, now=101.5)
    assert routes.leader("g1") == "a:1"
    # much later the same hint is trusted at once
    assert routes.on_error("g1", "c:1", stale_hint, now=101.5 + FAILED_TTL + 1)


def _termed(leader: str, term: int) -> dict:
    return {**ROUTE, "queues": [[0, "g1", leader], [1, "g2", None], [2, "g1", leader]],
            "terms": {"g1": term, "g2": 1}}


def test_a_newer_term_outranks_a_hint_and_a_recent_failure() -> None:
    routes = routes_with(_termed("a:1", 5))
    # a follower that has not noticed the election names the dead leader a:1 (term 5)
    stale = RequestError(Code.NOT_LEADER, "follower", leader="a:1", term=5)
    routes.on_error("g1", "b:1", stale, now=101.0)
    assert routes.target("g1") == "a:1"
    # the name servers already know c:1 won term 6: newer beats the hint's TTL
    routes.learn_route(parse_route("orders", _termed("c:1", 6), 102.0), 102.0)
    assert routes.target("g1") == "c:1"
    # and an older report never takes it back
    routes.learn_route(parse_route("orders", _termed("a:1", 5), 103.0), 103.0)
    assert routes.target("g1") == "c:1"


def test_a_node_that_failed_in_an_old_term_is_taken_once_it_leads_a_newer_one() -> None:
    routes = routes_with(_termed("a:1", 5))
    # b:1 answered NOT_LEADER (no hint) during the election...
    routes.on_error("g1", "b:1", RequestError(Code.NOT_LEADER, "?", leader=None, term=5),
                    now=101.0)
    # ...and then won term 6: no FAILED_TTL wait
    routes.learn_route(parse_route("orders", _termed("b:1", 6), 101.5), 101.5)
    assert routes.target("g1") == "b:1"


def test_an_older_hint_than_known_redirects_to_the_known_leader() -> None:
    routes = routes_with(_termed("c:1", 6))
    old = RequestError(Code.NOT_LEADER, "lagging", leader="a:1", term=5)
    assert routes.on_error("g1", "b:1", old, now=101.0)  # retry at once...
    assert routes.target("g1") == "c:1"  # ...at the leader of the newer term


def test_a_newer_term_hint_is_followed_at_once_even_to_an_address_that_failed() -> None:
    routes = routes_with(_termed("a:1", 5))
    # during the election b:1 knew no leader (so it counts as failed just now)...
    routes.on_error("g1", "b:1", RequestError(Code.NOT_LEADER, "?", leader=None, term=5),
                    now=101.0)
    # ...then c:1 says b:1 won term 6: a free redirect, not a counted attempt
    won = RequestError(Code.NOT_LEADER, "follower", leader="b:1", term=6)
    assert routes.on_error("g1", "c:1", won, now=101.2)
    assert routes.target("g1") == "b:1"


def test_a_failed_leader_connection_asks_another_replica_at_once_unless_all_failed() -> None:
    routes = routes_with(ROUTE)
    lost = TransportError("connection to a:1 lost", sent=True)
    assert routes.on_error("g1", "a:1", lost, now=101.0)
    assert routes.target("g1") == "b:1"
    # b:1 refuses the connection too: it was not the leader, so that one is counted
    assert not routes.on_error("g1", "b:1", TransportError("refused", sent=False), now=101.1)
    # back-pressure from a live leader is never a reason to go elsewhere
    routes2 = routes_with(ROUTE)
    assert not routes2.on_error("g1", "a:1", RequestError(Code.PROPOSAL_DROPPED, "moving"),
                                now=101.0)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_backoff_wakes_when_the_group_learns_a_new_leader(anyio_backend: str) -> None:
    import anyio

    routes = routes_with(_termed("a:1", 5))
    woke: list[float] = []

    async def backoff() -> None:
        start = anyio.current_time()
        await routes.wait_backoff("g1", 30.0)
        woke.append(anyio.current_time() - start)

    async with anyio.create_task_group() as tg:
        tg.start_soon(backoff)
        await anyio.sleep(0.01)
        # the same leader again is no news: the backoff goes on
        routes.learn_route(parse_route("orders", _termed("a:1", 5), 101.0), 101.0)
        await anyio.sleep(0.01)
        assert not woke
        routes.learn_route(parse_route("orders", _termed("c:1", 6), 102.0), 102.0)
        with anyio.fail_after(1.0):
            while not woke:
                await anyio.sleep(0.001)
    assert woke[0] < 1.0


def test_a_failure_doubts_its_group_s_leader_and_leaves_every_route_usable() -> None:
    """A leader change moves no queue: the routes stay (sends go on without a ROUTE per
    topic); the group is asked of the name servers once (`refresh_leaders`)."""
    routes = routes_with(ROUTE)
    other = {"total": 1, "queues": [[0, "g3", "e:1"]], "replicas": {"g3": ["e:1"]}}
    for i in range(1000):
        routes._topics[f"t{i}"] = parse_route(f"t{i}", other, 100.0)
    routes.on_error("g2", "b:1", TransportError("gone", sent=False), now=101.0)
    assert routes.doubted("g2") and not routes.doubted("g1") and not routes.doubted("g3")
    assert not routes._topics["orders"].stale
    assert all(routes.usable(f"t{i}", lambda *a: None) is not None for i in range(1000))


class _CountingNameServer:
    """A name server that answers CLUSTER with `leaders` and counts each request kind."""

    def __init__(self, leaders: dict[str, str]) -> None:
        self.leaders = leaders
        self.asked: dict[int, int] = {}
        self.release = None

    async def __call__(self, op: Op, header: dict, *args: object, **kw: object) -> object:
        from wire.protocol import Frame

        self.asked[int(op)] = self.asked.get(int(op), 0) + 1
        if self.release is not None:
            await self.release.wait()
        groups = {g: {"leader": 1, "leader_addr": a, "term": 7, "replicas": {1: a}}
                  for g, a in self.leaders.items()}
        return Frame({"code": 0, "nodes": {}, "groups": groups}, b"")


@pytest.mark.anyio
async def test_doubted_leaders_are_asked_once_for_every_caller() -> None:
    import anyio

    routes = routes_with(ROUTE)
    ns = _CountingNameServer({"g1": "z:1", "g2": "y:1"})
    ns.release = anyio.Event()
    routes.namesrv_request = ns  # type: ignore[method-assign]
    routes.on_error("g1", "a:1", TransportError("gone", sent=False), now=clock())
    routes.on_error("g2", "b:1", TransportError("gone", sent=False), now=clock())
    async with anyio.create_task_group() as tg:
        for _ in range(50):  # fifty requests waiting on the two groups at once
            tg.start_soon(routes.refresh_leaders)
        await anyio.sleep(0.01)
        ns.release.set()
    assert ns.asked == {int(Op.CLUSTER): 1}
    assert not routes.doubted("g1") and not routes.doubted("g2")
    assert routes.target("g2") == "y:1"
    await routes.refresh_leaders()  # nothing doubted: no request
    routes.on_error("g1", "z:1", TransportError("gone", sent=False), now=clock())
    await routes.refresh_leaders()  # within LEADERS_REFRESH_MIN of the last: none either
    assert ns.asked == {int(Op.CLUSTER): 1} and routes.doubted("g1")


def test_an_old_route_serves_sends_while_one_background_refresh_runs() -> None:
    """Past its refresh period a route still serves (a producer feeding thousands of
    topics must not wait for the name server per send); one refresh is started, and a
    route found wrong is not used at all."""
    from raftmq.client.routes import clock

    routes = routes_with(ROUTE, now=clock())
    spawned: list[tuple] = []
    assert routes.usable("orders", lambda *a: spawned.append(a)) is routes._topics["orders"]
    assert spawned == []  # fresh: nothing to do
    old = parse_route("orders", ROUTE, clock() - routes.refresh_interval - 1)
    routes._topics["orders"] = old
    assert routes.usable("orders", lambda *a: spawned.append(a)) is old
    assert routes.usable("orders", lambda *a: spawned.append(a)) is old
    assert [args[1:] for args in spawned] == [("orders",)]  # one refresh, not one per send
    old.stale = True
    assert routes.usable("orders", lambda *a: spawned.append(a)) is None
    assert routes.usable("unknown", lambda *a: spawned.append(a)) is None


def test_a_leader_not_ready_yet_is_kept_and_retried_after_a_backoff() -> None:
    routes = routes_with(_termed("a:1", 5))
    # c:1 won term 6 a moment ago and still applies what a:1 committed: it names itself
    early = RequestError(Code.NOT_LEADER, "not ready", leader="c:1", term=6, ready=False)
    assert electing(early, clock())  # retried like an election, its attempts spent or not
    assert not routes.on_error("g1", "c:1", early, now=101.0)  # a counted, backed-off try
    assert routes.target("g1") == "c:1"  # ...at the same leader
    assert not routes._topics["orders"].stale  # the route is right: no refresh
    assert "c:1" not in routes._group("g1").failed
    # the name servers' view of the old term does not take it back
    routes.learn_route(parse_route("orders", _termed("a:1", 5), 102.0), 102.0)
    assert routes.target("g1") == "c:1"
    # the same answer without `ready`, naming the node that refused, is no hint at all
    plain = RequestError(Code.NOT_LEADER, "?", leader="c:1", term=6)
    assert not routes.on_error("g1", "c:1", plain, now=103.0)
    assert routes.leader("g1") is None


@pytest.mark.anyio
async def test_a_spent_call_raises_an_error_whose_cause_chain_ends() -> None:
    """`give_up` may hand back the very error it met (an UnavailableError raised below):
    raising it "from" itself made `__cause__` a loop, and code that walks the chain (the
    chaos harness's "surely not written") spun forever on it."""
    routes = routes_with(ROUTE)
    met = UnavailableError("no leader answered (test)")

    async def failing(*_args: object, **_kwargs: object) -> None:
        raise met

    routes.pool.request = failing  # type: ignore[method-assign]

    async def resolve() -> str:
        return "g1"

    with pytest.raises(UnavailableError) as info:
        await routes.call(resolve, Op.FETCH, {}, attempts=1)
    seen, exc = set(), info.value
    while exc is not None:
        assert id(exc) not in seen, "the cause chain loops"
        seen.add(id(exc))
        exc = exc.__cause__
