"""`chaos.authcheck` over hand-made histories: each rule holds on a history that keeps it
and counts exactly the violation a history breaking it shows, and unknown outcomes are
given the benefit of the doubt both ways."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaos.authcheck import VIOLATIONS, check_lines, check_records

ALLOW_A = ["alice", "topic", "literal", "sec-a", "publish", "allow"]
DENY_A = ["alice", "topic", "literal", "sec-a", "publish", "deny"]
ALLOW_PREFIX = ["*", "topic", "prefix", "sec-", "subscribe", "allow"]


class H:
    """A history under construction: each call is one operation, invoked and completed
    at the next ticks of a clock."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.t = 0.0

    def op(self, process: str, f: str, key: Any, value: Any, kind: str = "ok",
           result: Any = None) -> H:
        self.t += 1
        self.entries.append({"process": process, "type": "invoke", "f": f, "key": key,
                             "value": value, "time": self.t})
        if kind != "open":
            self.t += 1
            self.entries.append({"process": process, "type": kind, "f": f, "key": key,
                                 "value": result, "time": self.t})
        return self

    def put(self, user: str, pw: str, kind: str = "ok") -> H:
        return self.op("admin", "user-put", user, {"password": pw}, kind)

    def remove(self, user: str, kind: str = "ok") -> H:
        return self.op("admin", "user-remove", user, None, kind)

    def acl(self, f: str, acl: list[str], kind: str = "ok") -> H:
        return self.op("admin", f"acl-{f}", "/".join(acl), acl, kind)

    def login(self, user: str, pw: str, kind: str, *, final: bool = False) -> H:
        return self.op("c1", "login", user, {"node": 1, "password": pw, "final": final}, kind)

    def authz(self, user: str, topic: str, operation: str, kind: str, *,
              final: bool = False) -> H:
        result = {"denied": True} if kind == "denied" else None
        return self.op("c1", "authz", user, {"node": 2, "topic": topic,
                                              "operation": operation, "final": final},
                       "fail" if kind == "denied" else kind, result)

    def final(self, node: int, users: list[str], acls: list[list[str]]) -> H:
        return self.op("final", "sec-final", node, None, "ok", {"users": users, "acls": acls})

    def check(self) -> dict[str, Any]:
        return check_lines(json.dumps(e) for e in self.entries)


def _violations(result: dict[str, Any]) -> dict[str, int]:
    return {k: result[k] for k in VIOLATIONS if result[k]}


def _finals(h: H, users: list[str], acls: list[list[str]], nodes: int = 3) -> H:
    for n in range(1, nodes + 1):
        h.final(n, users, acls)
    return h


def test_a_history_that_keeps_every_rule_is_valid() -> None:
    h = (H().put("alice", "a1").put("bob", "b1").acl("add", ALLOW_A)
         .login("alice", "a1", "ok").login("alice", "zzz", "fail").login("mallory", "m", "fail")
         .authz("alice", "sec-a", "publish", "ok").authz("bob", "sec-a", "publish", "denied")
         .put("alice", "a2").remove("bob").acl("add", DENY_A)
         .login("alice", "a1", "ok")  # a lagging replica may still hold a1
         .authz("alice", "sec-a", "publish", "ok"))  # ... or no deny yet
    _finals(h, ["alice"], [ALLOW_A, DENY_A])
    h.login("alice", "a2", "ok", final=True).login("alice", "a1", "fail", final=True)
    h.login("bob", "b1", "fail", final=True)
    h.authz("alice", "sec-a", "publish", "denied", final=True)
    result = h.check()
    assert result["valid"], result
    assert result["changes"] == {"acl-add": {"ok": 2}, "user-put": {"ok": 3},
                                 "user-remove": {"ok": 1}}
    assert result["logins"]["login"] == {"ok": 2, "fail": 2}
    assert result["authz"]["final publish"] == {"fail": 1}
    assert result["final_nodes"] == ["1", "2", "3"]


@pytest.mark.parametrize(("users", "acls", "lost"), [
    (["alice"], [], 1),  # the acknowledged ACL add is missing
    (["alice", "bob"], [ALLOW_A], 1),  # the acknowledged removal of bob undone
    ([], [ALLOW_A], 1),  # alice's creation lost
    (["alice", "eve"], [ALLOW_A, ALLOW_PREFIX], 2),  # never added at all
])
def test_a_lost_change_is_found_on_the_node_that_lost_it(
    users: list[str], acls: list[list[str]], lost: int
) -> None:
    h = H().put("alice", "a1").put("bob", "b1").acl("add", ALLOW_A).remove("bob")
    h.final(1, ["alice"], [ALLOW_A]).final(2, users, acls)
    result = h.check()
    assert _violations(result) == {"lost_changes": lost, "replicas_disagree": 1}
    assert all(x["node"] == "2" for x in result["examples"]["lost_changes"])


def test_unknown_changes_may_have_happened_or_not() -> None:
    def history(users: list[str], acls: list[list[str]]) -> dict[str, Any]:
        h = (H().put("alice", "a1", "info").acl("add", ALLOW_A).acl("remove", ALLOW_A, "info")
             .put("bob", "b1").remove("bob", "open"))  # never completed: unknown too
        return _finals(h, users, acls).check()

    for users in ([], ["alice"], ["alice", "bob"], ["bob"]):
        for acls in ([], [ALLOW_A]):
            assert history(users, acls)["valid"], (users, acls)


def test_a_failed_change_never_happened() -> None:
    h = H().put("alice", "a1", "fail").acl("add", ALLOW_A, "fail")
    assert _violations(_finals(h, ["alice"], []).check()) == {"lost_changes": 3}
    h = H().put("alice", "a1", "fail").acl("add", ALLOW_A, "fail")
    assert _violations(_finals(h, [], [ALLOW_A]).check()) == {"lost_changes": 3}


def test_an_acknowledged_change_after_an_unknown_one_decides() -> None:
    """An unknown change lands before every later change or never: the last
    acknowledged one decides the final value."""
    h = H().acl("add", ALLOW_A, "info").acl("remove", ALLOW_A)
    assert _violations(_finals(h, [], [ALLOW_A]).check()) == {"lost_changes": 3}
    h = H().acl("remove", ALLOW_A).acl("add", ALLOW_A, "info")
    assert _finals(h, [], [ALLOW_A]).check()["valid"]


def test_logins_with_passwords_never_set_or_for_users_never_added() -> None:
    h = (H().login("alice", "a1", "ok")  # before alice was asked for
         .put("alice", "a1", "info")
         .login("alice", "a1", "ok")  # unknown put: it may have happened
         .login("alice", "guess", "ok")
         .login("mallory", "x", "ok"))
    result = _finals(h, ["alice"], []).check()
    assert _violations(result) == {"login_never_added": 2, "login_bad_password": 1}
    assert {x["user"] for x in result["examples"]["login_never_added"]} == {"alice", "mallory"}


def test_a_removed_user_may_log_in_on_a_lagging_node_but_not_after_the_final_reads() -> None:
    base = H().put("alice", "a1").remove("alice").login("alice", "a1", "ok")
    assert _finals(base, [], []).check()["valid"]
    h = H().put("alice", "a1").put("alice", "a2")
    _finals(h, ["alice"], []).login("alice", "a1", "ok", final=True)
    h.login("alice", "a2", "fail", final=True)
    result = h.check()
    assert _violations(result) == {"login_stale": 1, "login_refused_valid": 1}
    # a final login with a password whose change was unknown is judged kindly both ways
    h = H().put("alice", "a1").put("alice", "a2", "info")
    _finals(h, ["alice"], []).login("alice", "a1", "ok", final=True)
    h.login("alice", "a2", "fail", final=True).login("alice", "a1", "fail", final=True)
    assert h.check()["valid"]


def test_final_probes_are_judged_against_the_state_at_their_time() -> None:
    """The workload settles twice: final logins with the run's last passwords, then new
    passwords for everyone and final logins and probes again. Each is judged against
    the changes asked before it, so the later puts do not make the earlier ones stale,
    and a removed user logging in after the settle is found."""
    h = H().put("alice", "a1").put("bob", "b1").remove("bob")
    _finals(h, ["alice"], [])
    h.login("alice", "a1", "ok", final=True).login("bob", "b1", "fail", final=True)
    h.put("alice", "a2").put("bob", "b2")
    _finals(h, ["alice", "bob"], [])
    h.login("alice", "a2", "ok", final=True).login("alice", "a1", "fail", final=True)
    h.login("bob", "b2", "ok", final=True)
    assert h.check()["valid"]
    h = H().put("bob", "b1").remove("bob")
    _finals(h, [], []).login("bob", "b1", "ok", final=True)  # removed, settled, still in
    h.put("bob", "b2")
    _finals(h, ["bob"], [])
    result = h.check()
    assert _violations(result) == {"login_stale": 1}
    assert result["examples"]["login_stale"][0]["possible"] == ["None"]


def test_an_operation_no_acl_state_allowed_is_found() -> None:
    h = (H().authz("alice", "sec-a", "publish", "ok")  # nothing allows it yet
         .acl("add", ALLOW_PREFIX)
         .authz("alice", "sec-a", "publish", "ok")  # the prefix allows subscribe only
         .authz("alice", "sec-b", "subscribe", "ok")
         .authz("alice", "other", "subscribe", "ok")  # outside the prefix
         .authz("alice", "sec-a", "publish", "denied"))  # denials during a run: fine
    result = _finals(h, [], [ALLOW_PREFIX]).check()
    assert _violations(result) == {"authz_wrongly_allowed": 3}


def test_deny_wins_in_every_state_the_history_allows() -> None:
    # the deny came first and stayed: no state allowed publishing
    h = H().acl("add", DENY_A).acl("add", ALLOW_A).authz("alice", "sec-a", "publish", "ok")
    assert _violations(_finals(h, [], [ALLOW_A, DENY_A]).check()) == {
        "authz_wrongly_allowed": 1}
    # the allow came first: a lagging replica may be between the two
    h = H().acl("add", ALLOW_A).acl("add", DENY_A).authz("alice", "sec-a", "publish", "ok")
    assert _finals(h, [], [ALLOW_A, DENY_A]).check()["valid"]
    # an unknown add of the deny: a state without it existed
    h = H().acl("add", DENY_A, "info").acl("add", ALLOW_A).authz("alice", "sec-a", "publish", "ok")
    assert _finals(h, [], [ALLOW_A]).check()["valid"]


def test_final_probes_are_judged_against_the_final_state() -> None:
    h = _finals(H().acl("add", ALLOW_A), [], [ALLOW_A])
    h.authz("alice", "sec-a", "publish", "denied", final=True)  # an acknowledged allow lost
    h.authz("bob", "sec-a", "publish", "ok", final=True)  # bob was never allowed
    h.authz("alice", "sec-a", "publish", "fail", final=True)  # login failed: no outcome
    result = h.check()
    assert _violations(result) == {"authz_wrongly_denied": 1, "authz_wrongly_allowed": 1}
    h = _finals(H().acl("add", ALLOW_A).acl("remove", ALLOW_A, "info"), [], [])
    h.authz("alice", "sec-a", "publish", "denied", final=True)
    h.authz("alice", "sec-a", "publish", "ok", final=True)
    assert h.check()["valid"]


def test_no_final_read_is_a_problem_and_malformed_records_are_named() -> None:
    result = H().put("alice", "a1").check()
    assert not result["valid"]
    assert "no node's users and ACLs were read after the final heal" in result["problems"]
    result = check_records([
        {"process": 1, "type": "invoke", "f": "acl-add", "key": "x", "value": ["a"], "time": 1},
        {"process": 2, "type": "invoke", "f": "user-put", "key": 5, "value": {}, "time": 1},
        "not an object",
        {"process": 3, "type": "invoke", "f": "append", "key": "q/0", "value": "m", "time": 2},
    ])
    assert result["malformed"] == 2 and not result["valid"]


def test_other_workloads_records_are_skipped() -> None:
    lines = [json.dumps({"process": 1, "type": "invoke", "f": "append", "key": "q/0",
                         "value": "p1-0", "time": 1.0}),
             json.dumps({"process": 1, "type": "ok", "f": "append", "key": "q/0",
                         "value": {"offset": 0}, "time": 2.0}), "not json"]
    result = check_lines(lines)
    assert result["valid"] and result["changes"] == {} and result["final_nodes"] == []


def test_an_attack_that_got_through_and_a_node_over_its_memory_bound_are_violations() -> None:
    """What `chaos.attackers` records: an attack the node stopped (ok) or could not be
    judged (info, or never completed) is no violation; one that got through (fail) is,
    and so is a node whose resident memory went over the stated bound."""
    from chaos.attackers import MEMORY_BOUND_MIB

    h = H()
    h.op("attacker", "attack", "half-frame", {"node": 1}, "ok", {"held": "closed"})
    h.op("attacker", "attack", "idle-flood", {"node": 2}, "info", {"error": "down"})
    h.op("attacker-memory", "node-memory", 1, None, "ok", {"rss_mib": 100.0})
    h.op("attacker-memory", "node-memory", 1, None, "ok", {"rss_mib": 150.0})
    h.op("attacker", "attack", "forged-fence", {"node": 3}, "open")
    r = h.check()
    assert r["valid"], r["problems"]
    assert r["attacks_got_through"] == 0 and r["memory_over_bound"] == 0
    assert r["attacks"] == {"forged-fence": {"info": 1}, "half-frame": {"ok": 1},
                            "idle-flood": {"info": 1}}
    assert r["rss_mib_max"] == {"1": 150.0}

    h = H()
    h.op("attacker", "attack", "forged-fence", {"node": 3}, "fail",
         {"through": "answered OK"})
    h.op("attacker-memory", "node-memory", 2, None, "ok", {"rss_mib": MEMORY_BOUND_MIB + 1})
    r = h.check()
    assert not r["valid"]
    assert r["attacks_got_through"] == 1 and r["memory_over_bound"] == 1
    assert set(r["problems"]) == {"attacks_got_through: 1", "memory_over_bound: 1"}
