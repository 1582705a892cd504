"""The users part: SCRAM verifiers as control records (validated before anything changes),
their snapshot section, the verifier's text form, and the node config keys that turn
authentication on."""

from __future__ import annotations

import msgpack
import pytest
import scramp

from broker.config import ConfigError, NodeConfig
from broker.doors.security import make_credential
from broker.state.parts.base import Refused
from broker.state.parts.users import UserDelete, UserPut, Users, format_verifier, parse_verifier
from broker.state.statemachine import BrokerState
from raftlog.types import Entry, EntryType
from wire.protocol import Code


def put(name: str, password: str) -> UserPut:
    c = make_credential(password)
    return UserPut(name, c.salt, c.iterations, c.stored_key, c.server_key)


def apply(state: BrokerState, data: bytes, index: int) -> object:
    return state.apply(Entry(term=1, index=index, type=EntryType.CONTROL, data=data))


def test_users_apply_survive_a_snapshot_and_check_a_scram_login() -> None:
    s = BrokerState("g0")
    apply(s, put("alice", "pw-a").encode(), 1)
    apply(s, put("bob", "pw-b").encode(), 2)
    apply(s, UserDelete("bob").encode(), 3)
    restored = BrokerState.restore("g0", s.snapshot())
    users = restored.part(Users)
    assert users.names() == ["alice"]
    cred = users.credential("alice")
    assert cred is not None
    m = scramp.ScramMechanism("SCRAM-SHA-256")
    server = m.make_server(lambda _n: (cred.salt, cred.stored_key, cred.server_key,
                                       cred.iterations))
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "pw-a")
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    server.set_client_final(client.get_client_final())
    client.set_server_final(server.get_server_final())  # both sides proved themselves


@pytest.mark.parametrize("bad", [
    {"name": "has space"}, {"salt": b"short"}, {"iterations": 1000},
    {"stored_key": b"x" * 31}, {"server_key": "text"},
])
def test_a_bad_user_record_is_refused_and_changes_nothing(bad: dict[str, object]) -> None:
    good = put("alice", "pw").to_map()
    s = BrokerState("g0")
    before = s.snapshot()
    # the raw map: the record type itself would refuse these fields
    result = apply(s, msgpack.packb({"op": "user_put", **good, **bad}, use_bin_type=True), 1)
    assert getattr(result, "code", None) in (Code.MALFORMED, Code.INVALID_NAME)
    assert s.part(Users).names() == []
    assert s.snapshot() != before  # only the applied index moved
    assert BrokerState.restore("g0", s.snapshot()).part(Users).names() == []


def test_the_verifier_text_round_trips_and_bad_text_is_named() -> None:
    c = make_credential("secret")
    assert parse_verifier(format_verifier(c)) == c
    assert "secret" not in format_verifier(c)
    for text in ("", "md5abc", "SCRAM-SHA-256$4096:c2FsdA==$x:y"):
        with pytest.raises(Refused, match="SCRAM-SHA-256 verifier"):
            parse_verifier(text)


BASE = {"node_id": 1, "listen": "127.0.0.1:7101", "data": "d", "peers": {1: "127.0.0.1:7101"}}


def test_security_config_keys_are_checked() -> None:
    v = format_verifier(make_credential("pw"))
    cfg = NodeConfig.from_dict({**BASE, "authenticate": True, "authorize": True,
                                "superusers": ["admin"], "superuser_scram": v,
                                "cluster_secret": "this cluster's own secret"})
    assert cfg.superusers == ("admin",) and cfg.authorize
    # the built-in secret is public: it would key the made-up salts of unknown users
    # (telling them from stored ones) and let anyone read the verifiers as a peer
    with pytest.raises(ConfigError, match="needs a cluster_secret of its own"):
        NodeConfig.from_dict({**BASE, "authenticate": True})
    with pytest.raises(ConfigError, match="needs authenticate"):
        NodeConfig.from_dict({**BASE, "authorize": True})
    with pytest.raises(ConfigError, match="SCRAM-SHA-256 verifier"):
        NodeConfig.from_dict({**BASE, "superusers": ["admin"], "superuser_scram": "pw"})
    with pytest.raises(ConfigError, match="one user in superusers"):
        NodeConfig.from_dict({**BASE, "superusers": ["a", "b"], "superuser_scram": v})
    with pytest.raises(ConfigError, match="user name"):
        NodeConfig.from_dict({**BASE, "superusers": ["no spaces please"]})
