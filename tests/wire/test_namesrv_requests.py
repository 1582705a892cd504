"""The name server's typed requests and answers (`wire.requests.namesrv`): ROUTE, CLUSTER
and REGISTER with its group entries, logins and body of topic tables; what each decodes
to, what a malformed one is answered, and the round trip the name server, the node's
registrar and the SDK rely on."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wire.protocol import Code, RequestError
from wire.requests import (
    TYPES,
    ClusterAnswer,
    ClusterRequest,
    FrozenMap,
    RegisterAnswer,
    RegisterAuth,
    RegisterGroup,
    RegisterRequest,
    RegisterTable,
    RouteAnswer,
    RouteRequest,
    TopicShape,
    shapes_of,
)
from wire.requests.namesrv import MAX_USERS

names = st.from_regex(r"[A-Za-z0-9_%|.-]{1,20}", fullmatch=True)
ids = st.integers(0, 1 << 40)
addrs = st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["127.0.0.1", "n1", "::1"]),
                  st.integers(1, 65535))


@st.composite
def shapes(draw: Any) -> TopicShape:
    queues = draw(st.integers(1, 64))
    hosted = draw(st.lists(st.integers(0, queues - 1), max_size=4))
    return TopicShape(queues, tuple(hosted), tuple(draw(st.lists(names, max_size=4))))


@st.composite
def groups(draw: Any) -> RegisterGroup:
    tv = draw(st.none() | ids)
    topics: tuple[tuple[str, int, tuple[int, ...]], ...] = ()
    if tv is None:
        topics = tuple((n, s.queues, s.hosted) for s in draw(st.lists(shapes(), max_size=3))
                       for n in s.names[:1])
    return RegisterGroup(
        role=draw(st.sampled_from(["leader", "follower", "candidate"])), term=draw(ids),
        leader=draw(st.none() | ids), replicas=FrozenMap(draw(st.dictionaries(ids, addrs))),
        commit=draw(ids), applied=draw(ids), tv=tv,
        base=None if tv is None else draw(st.none() | ids), topics=topics)


auths = st.builds(
    lambda at, users, key, over: RegisterAuth(at=at, users=tuple(users), salt_key=key,
                                              over=over),
    st.integers(-1, 1 << 40),
    st.lists(st.tuples(names, st.binary(min_size=1, max_size=40), st.integers(1, 1 << 20),
                       st.binary(min_size=32, max_size=32),
                       st.binary(min_size=32, max_size=32)), max_size=3),
    st.binary(min_size=32, max_size=32), st.booleans())


@given(ids, addrs, st.none() | addrs, st.none() | st.integers(-(1 << 62), 1 << 62),
       st.dictionaries(names, groups(), max_size=3), st.none() | auths)
def test_a_registration_survives_the_wire(node: int, addr: str, metrics: str | None,
                                          inc: int | None, gs: dict[str, RegisterGroup],
                                          auth: RegisterAuth | None) -> None:
    req = RegisterRequest(node=node, addr=addr, metrics=metrics, inc=inc,
                          groups=FrozenMap(gs), auth=auth)
    header = req.header()
    assert RegisterRequest.decode(header) == req
    # and through msgpack, as it travels
    assert RegisterRequest.decode(msgpack.unpackb(msgpack.packb(header), raw=False,
                                                  strict_map_key=False)) == req


@given(st.dictionaries(names, st.tuples(st.lists(shapes(), max_size=3),
                                        st.lists(names, max_size=3)), max_size=3))
def test_a_registrations_topic_tables_survive_the_body(tables: dict[str, Any]) -> None:
    gs = {gid: RegisterGroup(role="leader", term=1, tv=2, base=1) for gid in tables}
    req = RegisterRequest(node=1, addr="a:1", groups=gs)
    sent = {gid: RegisterTable(set=tuple(s), dels=tuple(d)) for gid, (s, d) in tables.items()}
    assert req.decode_body(RegisterRequest.encode_body(sent)) == sent


def test_the_body_holds_a_table_for_every_versioned_group_and_none_for_inline_ones() -> None:
    req = RegisterRequest(node=1, addr="a:1", groups={
        "v": RegisterGroup(role="leader", term=1, tv=3),
        "i": RegisterGroup(role="leader", term=1, topics=(("t", 2, (0, 1)),))})
    assert req.decode_body(b"") == {"v": RegisterTable()}
    assert RegisterRequest.encode_body({}) == b""
    table = {"v": RegisterTable(set=shapes_of({"a": _Topic(4, (0, 3)), "b": _Topic(4, (0, 3))}))}
    assert req.decode_body(RegisterRequest.encode_body(table)) == table
    assert table["v"].set == (TopicShape(4, (0, 3), ("a", "b")),)


class _Topic:
    def __init__(self, queues: int, hosted: tuple[int, ...]) -> None:
        self.queues, self.hosted = queues, hosted


def test_defaults_are_left_out_and_filled_in() -> None:
    assert RegisterRequest(node=1, addr="a:1").header() == {"node": 1, "addr": "a:1"}
    assert RegisterRequest.decode({"node": 1, "addr": "a:1", "metrics": None, "inc": None,
                                   "auth": None}) == RegisterRequest(node=1, addr="a:1")
    assert RegisterAnswer().header() == {}
    assert RegisterAnswer.decode({"resend": ["g0"]}).resend == ("g0",)
    assert ClusterRequest().header() == {} and ClusterRequest.decode({}).topics is True
    assert ClusterRequest(topics=False).header() == {"topics": False}
    assert RouteRequest.decode({"topic": "not a topic name!"}).topic == "not a topic name!"
    route = RouteAnswer.decode({"total": 2})
    assert (route.queues, route.replicas, route.terms) == ((), None, None)


def test_a_route_answer_survives_the_wire() -> None:
    route = RouteAnswer(total=3, queues=((0, "g1", "a:1"), (2, "g2", None)),
                        replicas={"g1": ["a:1", "b:1"], "g2": ["c:1"]}, terms={"g1": 4})
    assert route.header()["queues"] == [[0, "g1", "a:1"], [2, "g2", None]]
    assert RouteAnswer.decode(route.header()) == route
    cluster = ClusterAnswer(nodes={1: {"addr": "a:1", "metrics": None, "age": 0.5}},
                            groups={"g1": {"leader": 1, "topic_count": 2}})
    assert ClusterAnswer.decode(cluster.header()) == cluster


def test_the_cluster_body_lists_topics_by_shape() -> None:
    listing = {"g1": [[4, [0, 3], ["a", "b"]]], "g2": []}
    assert ClusterAnswer.decode_body(ClusterAnswer.encode_body(listing)) == {
        "g1": (TopicShape(4, (0, 3), ("a", "b")),), "g2": ()}
    assert ClusterAnswer.decode_body(b"") == {}
    for bad in (b"\xc1", msgpack.packb([1]), msgpack.packb({"g1": [[0, [], ["a"]]]}),
                msgpack.packb({"g1": [[2, [2], ["a"]]]}), msgpack.packb({1: []})):
        with pytest.raises(RequestError) as caught:
            ClusterAnswer.decode_body(bad)
        assert caught.value.code == Code.MALFORMED


GOOD = {"node": 1, "addr": "127.0.0.1:7001",
        "groups": {"g0": {"role": "leader", "term": 3, "replicas": {1: "127.0.0.1:7001"}}}}
USER = ["ann", b"salt", 4096, b"s" * 32, b"S" * 32]
AUTH = {"at": 1, "users": [USER], "salt_key": b"k" * 32}


def _group(**patch: Any) -> dict[str, Any]:
    return {**GOOD, "groups": {"g0": {**GOOD["groups"]["g0"], **patch}}}  # type: ignore[dict-item]


@pytest.mark.parametrize(("kind", "header", "code", "says"), [
    (RouteRequest, {}, Code.MALFORMED, "missing field 'topic'"),
    (RouteRequest, {"topic": 7}, Code.MALFORMED, "'topic'"),
    (RouteAnswer, {"queues": []}, Code.MALFORMED, "'total'"),
    (RouteAnswer, {"total": 1, "queues": [[0, "g"]]}, Code.MALFORMED, "queues"),
    (RouteAnswer, {"total": 1, "queues": [[0, 1, None]]}, Code.MALFORMED, "queues"),
    (RouteAnswer, {"total": 1, "replicas": {"g": "a:1"}}, Code.MALFORMED, "replicas"),
    (RouteAnswer, {"total": 1, "terms": {"g": "4"}}, Code.MALFORMED, "terms"),
    (ClusterRequest, {"topics": 1}, Code.MALFORMED, "'topics'"),
    (ClusterRequest, {"topics": None}, Code.MALFORMED, "'topics'"),
    (ClusterAnswer, {"nodes": {}}, Code.MALFORMED, "'groups'"),
    (ClusterAnswer, {"nodes": [], "groups": {}}, Code.MALFORMED, "'nodes'"),
    (RegisterAnswer, {"resend": "g0"}, Code.MALFORMED, "'resend'"),
    (RegisterAnswer, {"resend": [1]}, Code.MALFORMED, "resend"),
    (RegisterRequest, {"addr": "a:1"}, Code.MALFORMED, "'node'"),
    (RegisterRequest, {**GOOD, "node": "1"}, Code.MALFORMED, "'node'"),
    (RegisterRequest, {**GOOD, "node": True}, Code.MALFORMED, "'node'"),
    (RegisterRequest, {**GOOD, "node": -1}, Code.MALFORMED, "node"),
    (RegisterRequest, {**GOOD, "addr": "localhost"}, Code.MALFORMED, "addr"),
    (RegisterRequest, {**GOOD, "addr": None}, Code.MALFORMED, "'addr'"),
    (RegisterRequest, {**GOOD, "metrics": 5}, Code.MALFORMED, "'metrics'"),
    (RegisterRequest, {**GOOD, "metrics": "h:0"}, Code.MALFORMED, "metrics"),
    (RegisterRequest, {**GOOD, "inc": 1.5}, Code.MALFORMED, "'inc'"),
    (RegisterRequest, {**GOOD, "groups": []}, Code.MALFORMED, "'groups'"),
    (RegisterRequest, {**GOOD, "groups": None}, Code.MALFORMED, "'groups'"),
    (RegisterRequest, {**GOOD, "groups": {"": {}}}, Code.MALFORMED, "group ids"),
    (RegisterRequest, {**GOOD, "groups": {"g0": []}}, Code.MALFORMED, "group 'g0'"),
    (RegisterRequest, _group(role=None), Code.MALFORMED, "group 'g0' role"),
    (RegisterRequest, _group(term="3"), Code.MALFORMED, "group 'g0' term"),
    (RegisterRequest, _group(term=None), Code.MALFORMED, "group 'g0' term"),
    (RegisterRequest, _group(leader=-1), Code.MALFORMED, "group 'g0' leader"),
    (RegisterRequest, _group(commit=True), Code.MALFORMED, "group 'g0' commit"),
    (RegisterRequest, _group(applied=-2), Code.MALFORMED, "group 'g0' applied"),
    (RegisterRequest, _group(replicas={"one": "a:1"}), Code.MALFORMED, "replica node id"),
    (RegisterRequest, _group(replicas={1: "a"}), Code.MALFORMED, "replica 1 address"),
    (RegisterRequest, _group(replicas=[]), Code.MALFORMED, "group 'g0' replicas"),
    (RegisterRequest, _group(tv="1"), Code.MALFORMED, "group 'g0' tv"),
    (RegisterRequest, _group(tv=1, base=-1), Code.MALFORMED, "group 'g0' base"),
    (RegisterRequest, _group(topics=[]), Code.MALFORMED, "group 'g0' topics"),
    (RegisterRequest, _group(topics={1: {}}), Code.MALFORMED, "topic names"),
    (RegisterRequest, _group(topics={"t": {"queues": 0, "hosted": []}}), Code.MALFORMED,
     "topic 't' queues"),
    (RegisterRequest, _group(topics={"t": {"queues": 2, "hosted": [2]}}), Code.MALFORMED,
     "hosts queue 2 of only 2"),
    (RegisterRequest, _group(topics={"t": {"queues": 2, "hosted": 0}}), Code.MALFORMED,
     "hosted"),
    (RegisterRequest, {**GOOD, "auth": []}, Code.MALFORMED, "'auth'"),
    (RegisterRequest, {**GOOD, "auth": {**AUTH, "users": "ann"}}, Code.MALFORMED,
     "auth users"),
    (RegisterRequest, {**GOOD, "auth": {**AUTH, "users": [USER] * (MAX_USERS + 1)}},
     Code.MALFORMED, "auth users"),
    (RegisterRequest, {**GOOD, "auth": {**AUTH, "users": [USER[:4]]}}, Code.MALFORMED,
     "auth user"),
    (RegisterRequest, {**GOOD, "auth": {**AUTH, "users": [["", *USER[1:]]]}},
     Code.MALFORMED, "auth user"),
    (RegisterRequest, {**GOOD, "auth": {**AUTH, "users": [[*USER[:1], b"", *USER[2:]]]}},
     Code.MALFORMED, "salt"),
    (RegisterRequest, {**GOOD, "auth": {**AUTH, "users": [[*USER[:2], 0, *USER[3:]]]}},
     Code.MALFORMED, "iterations"),
    (RegisterRequest, {**GOOD, "auth": {**AUTH, "users": [[*USER[:3], b"s", USER[4]]]}},
     Code.MALFORMED, "StoredKey"),
    (RegisterRequest, {**GOOD, "auth": {**AUTH, "salt_key": b"short"}}, Code.MALFORMED,
     "salt_key"),
    (RegisterRequest, {**GOOD, "auth": {**AUTH, "at": -2}}, Code.MALFORMED, "auth at"),
])
def test_a_malformed_header_is_refused_naming_what_is_wrong(
        kind: Any, header: dict[str, Any], code: Code, says: str) -> None:
    with pytest.raises(RequestError) as caught:
        kind.decode(header)
    assert caught.value.code == code and says in caught.value.message


def test_what_a_group_entry_and_a_login_list_leave_to_their_readers() -> None:
    """A base without a version means nothing, and `over` is true only when it is true:
    both as the name server has always read them."""
    req = RegisterRequest.decode(_group(base="x", topics={"t": {"queues": 2, "hosted": [1]}}))
    assert req.groups["g0"].base is None and req.groups["g0"].topics == (("t", 2, (1,)),)
    req = RegisterRequest.decode({**GOOD, "auth": {**AUTH, "over": 1}})
    assert req.auth is not None and req.auth.over is False
    assert req.auth.users == (tuple(USER),)
    assert RegisterRequest.decode(_group(tv=5, topics="ignored")).groups["g0"].topics == ()


VERSIONED = {**GOOD, "groups": {"g0": {"role": "leader", "term": 1, "tv": 2},
                                "g1": {"role": "leader", "term": 1, "tv": 2, "base": 1},
                                "i": {"role": "leader", "term": 1}}}


@pytest.mark.parametrize(("body", "says"), [
    (b"\xc1", "undecodable REGISTER body"),
    ([], "REGISTER body must be a map"),
    ({"g9": {"set": []}}, "group 'g9' not in the header"),
    ({"g0": []}, "REGISTER body group 'g0'"),
    ({"i": {"set": []}}, "group 'i' has a table in the body but no version"),
    ({"g0": {"set": {}}}, "group 'g0' set must be a list"),
    ({"g0": {"set": [[4, [0]]]}}, "group 'g0' set entries"),
    ({"g0": {"set": [[4, [0], "t"]]}}, "group 'g0' set names"),
    ({"g0": {"set": [[4, [0], ["t", 5]]]}}, "group 'g0' topic names must be strings"),
    ({"g0": {"set": [[2, [2], ["t"]]]}}, "hosts queue 2 of only 2"),
    ({"g0": {"set": [[True, [0], ["t"]]]}}, "group 'g0' topic 't' queues"),
    ({"g1": {"del": "t"}}, "group 'g1' del"),
    ({"g1": {"del": [1]}}, "group 'g1' del"),
    ({"g0": {"set": [], "del": ["t"]}}, "group 'g0' deletes topics from a whole table"),
])
def test_a_malformed_body_is_refused_naming_what_is_wrong(body: Any, says: str) -> None:
    req = RegisterRequest.decode(VERSIONED)
    raw = body if isinstance(body, bytes) else msgpack.packb(body)
    with pytest.raises(RequestError) as caught:
        req.decode_body(raw)
    assert caught.value.code == Code.MALFORMED and says in caught.value.message


def test_the_name_servers_ops_are_typed() -> None:
    from wire.protocol import Op

    assert TYPES[Op.ROUTE] == (RouteRequest, RouteAnswer)
    assert TYPES[Op.CLUSTER] == (ClusterRequest, ClusterAnswer)
    assert TYPES[Op.REGISTER] == (RegisterRequest, RegisterAnswer)
