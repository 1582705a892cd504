"""Node configuration: TOML round trip, strict validation, cluster layouts."""

from __future__ import annotations

import copy
import dataclasses
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from broker.config import (
    ALLOW_MUTATIONS_ENV,
    TX_RECORD_VERSION,
    ConfigError,
    GroupConfig,
    NodeConfig,
    cluster_configs,
    dump_config,
    load_config,
)

SAMPLE = """\
node_id = 1
listen = "127.0.0.1:7101"          # one address for peers and clients
metrics = "127.0.0.1:9101"
data = "/abs/path/n1"
namesrv = ["127.0.0.1:9876"]
fsync = "always"
fsync_interval = 1.0
segment_size = 1073741824
tick_ms = 100
election_ticks = 10
register_interval = 30.0
max_message_bytes = 4194304
retention_hours = 72.0
retention_disk_ratio = 0.90
test_mutations = []
[peers]
1 = "127.0.0.1:7101"
2 = "127.0.0.1:7102"
3 = "127.0.0.1:7103"
[[groups]]
id = "g0"
replicas = [1, 2, 3]
preferred_leader = 1
"""

NO_ENV: dict[str, str] = {}
ALLOW = {ALLOW_MUTATIONS_ENV: "1"}


def base() -> dict[str, Any]:
    return copy.deepcopy(tomllib.loads(SAMPLE))


def roundtrip(cfg: NodeConfig, env: dict[str, str] = NO_ENV) -> NodeConfig:
    return NodeConfig.from_dict(tomllib.loads(dump_config(cfg)), env=env)


# ------------------------------------------------------------------ parsing


def test_sample_parses(tmp_path: Path) -> None:
    path = tmp_path / "n1.toml"
    path.write_text(SAMPLE)
    cfg = load_config(path, env=NO_ENV)
    assert cfg.node_id == 1
    assert cfg.address == cfg.listen == "127.0.0.1:7101"
    assert cfg.metrics == "127.0.0.1:9101"
    assert cfg.data == Path("/abs/path/n1")
    assert cfg.group_dir("g0") == Path("/abs/path/n1/g0")
    assert cfg.namesrv == ("127.0.0.1:9876",)
    assert dict(cfg.peers) == {1: "127.0.0.1:7101", 2: "127.0.0.1:7102", 3: "127.0.0.1:7103"}
    assert cfg.groups == (GroupConfig("g0", (1, 2, 3), 1),)
    assert cfg.hosted_groups == cfg.groups
    assert (cfg.fsync, cfg.segment_size, cfg.retention_disk_ratio) == ("always", 1 << 30, 0.9)


def test_defaults_fill_optional_keys() -> None:
    d = {"node_id": 2, "listen": "0.0.0.0:7102", "data": "/d",
         "peers": {"1": "10.0.0.1:7101", "2": "10.0.0.2:7102"}}
    cfg = NodeConfig.from_dict(d, env=NO_ENV)
    assert cfg.metrics is None and cfg.groups == () and cfg.namesrv == ()
    assert cfg.address == "10.0.0.2:7102"  # what peers dial, not the wildcard listen
    assert (cfg.fsync, cfg.tick_ms, cfg.max_message_bytes) == ("always", 100, 4 << 20)


def test_hosted_groups_are_those_naming_the_node() -> None:
    d = base()
    d["peers"]["4"] = "127.0.0.1:7104"
    d["groups"].append({"id": "g1", "replicas": [2, 3, 4]})
    cfg = NodeConfig.from_dict(d, env=NO_ENV)
    assert [g.id for g in cfg.groups] == ["g0", "g1"]
    assert [g.id for g in cfg.hosted_groups] == ["g0"]


def test_config_is_frozen() -> None:
    cfg = NodeConfig.from_dict(base(), env=NO_ENV)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.node_id = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.peers[9] = "127.0.0.1:1"  # type: ignore[index]


# ------------------------------------------------------------------ round trip


def test_roundtrip_of_sample() -> None:
    cfg = NodeConfig.from_dict(base(), env=NO_ENV)
    assert roundtrip(cfg) == cfg


def test_roundtrip_every_field_off_default(tmp_path: Path) -> None:
    d = base()
    d.update(
        metrics=None, data='/odd "path"\\with\tstuff/ünï', namesrv=["a:1", "b.example:2"],
        fsync="interval", fsync_interval=0.25, segment_size=65536, tick_ms=20,
        election_ticks=7, register_interval=2, max_message_bytes=1000,
        retention_hours=0.5, retention_disk_ratio=1, test_mutations=["skip-fsync"],
        snapshot_every_entries=0, consume_queue_chunk=16,
        cluster_secret='a "quoted" secret\\ of ours', frame_timeout=5.5, idle_timeout=60,
        login_timeout=2, login_max_frame=8192, max_unauthenticated_connections=3,
        max_inflight_bytes_per_user=1 << 20, login_failures_before_delay=1, login_delay_max=0.5,
    )
    d["groups"].append({"id": "%RETRY%x|y.z-1_", "replicas": [3]})
    del d["metrics"]
    cfg = NodeConfig.from_dict(d, env=ALLOW)
    text = dump_config(cfg)
    back = roundtrip(cfg, ALLOW)
    assert back == cfg
    assert back.groups[1] == GroupConfig("%RETRY%x|y.z-1_", (3,), None)
    assert "metrics" not in text and "preferred_leader" in text
    path = tmp_path / "n.toml"
    path.write_text(text)
    assert load_config(path, env=ALLOW) == cfg


@pytest.mark.parametrize(("nodes", "groups"), [(3, 3), (1, 2), (5, 7)])
def test_roundtrip_of_cluster_layouts(tmp_path: Path, nodes: int, groups: int) -> None:
    for cfg in cluster_configs(tmp_path, nodes=nodes, groups=groups, replication=min(3, nodes)):
        assert roundtrip(cfg) == cfg


def test_relative_data_dir_is_relative_to_the_file(tmp_path: Path) -> None:
    d = base()
    d["data"] = "store/n1"
    path = tmp_path / "conf" / "n1.toml"
    path.parent.mkdir()
    path.write_text(dump_config(NodeConfig.from_dict(d, env=NO_ENV)))
    assert load_config(path, env=NO_ENV).data == tmp_path / "conf" / "store" / "n1"


# ------------------------------------------------------------------ validation


def _set(path: str, value: Any) -> Any:
    def edit(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = d
        for p in parents:
            target = target[int(p)] if p.isdigit() and isinstance(target, list) else target[p]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value

    return edit


_DELETE = object()

INVALID = [
    ("node_id not in peers", _set("node_id", 7), "node_id 7 is not in peers"),
    ("node_id bool", _set("node_id", True), "node_id must be an integer"),
    ("replica outside peers", _set("groups.0.replicas", [1, 2, 9]), "replicas [9] are not in peers"),
    ("replica twice", _set("groups.0.replicas", [1, 1, 2]), "name a node twice"),
    ("no replicas", _set("groups.0.replicas", []), "at least one node"),
    ("bad group name", _set("groups.0.id", "g 0"), "invalid group name 'g 0'"),
    ("group name too long", _set("groups.0.id", "g" * 128), "invalid group name"),
    ("preferred not a replica", _set("groups.0.preferred_leader", 4), "preferred_leader 4 is not"),
    ("missing group id", _set("groups.0.id", _DELETE), "missing 'id'"),
    ("listen without port", _set("listen", "localhost"), "listen: bad address 'localhost'"),
    ("listen port zero", _set("listen", "127.0.0.1:0"), "listen: bad address"),
    ("peer address", _set("peers.2", "127.0.0.1:99999"), "peers.2: bad address"),
    ("peer key", _set("peers.x", "127.0.0.1:7109"), "peers key 'x'"),
    ("shared peer address", _set("peers.3", "127.0.0.1:7102"), "share the address"),
    ("empty peers", _set("peers", {}), "peers must be a table"),
    ("namesrv address", _set("namesrv", ["nowhere"]), "namesrv entry: bad address"),
    ("namesrv not a list", _set("namesrv", "127.0.0.1:9876"), "namesrv must be a list"),
    ("metrics address", _set("metrics", "9101"), "metrics: bad address"),
    ("fsync policy", _set("fsync", "sometimes"), "fsync must be one of always, interval"),
    ("join not a bool", _set("join", "yes"), "join must be true or false"),
    ("fsync interval", _set("fsync_interval", 0), "fsync_interval must be a positive"),
    ("tick as string", _set("tick_ms", "100"), "tick_ms must be an integer"),
    ("tick as float", _set("tick_ms", 100.0), "tick_ms must be an integer"),
    ("election ticks", _set("election_ticks", 1), "election_ticks must be >= 2"),
    ("tiny segments", _set("segment_size", 100), "segment_size must be >= 1024"),
    ("disk ratio", _set("retention_disk_ratio", 1.5), "retention_disk_ratio must be in (0, 1]"),
    ("snapshot period", _set("snapshot_every_entries", -1), "snapshot_every_entries must be >= 0"),
    ("empty chunks", _set("consume_queue_chunk", 0), "consume_queue_chunk must be >= 1"),
    ("retention nan", _set("retention_hours", float("nan")), "retention_hours must be a positive"),
    ("unknown mutation", _set("test_mutations", ["lose-everything"]), "unknown test mutation"),
    ("typo at top level", _set("fsycn", "always"), "unknown key 'fsycn'; did you mean 'fsync'?"),
    ("typo in group", _set("groups.0.replica", [1]), "in groups[0]: 'replica'; did you mean"),
    ("missing data", _set("data", _DELETE), "missing required key(s): data"),
    ("empty data", _set("data", ""), "data must name a directory"),
    ("short secret", _set("cluster_secret", "hunter2"), "cluster_secret must be at least 16"),
    ("secret not a string", _set("cluster_secret", 1234), "cluster_secret must be a string"),
    ("no frame deadline", _set("frame_timeout", 0), "frame_timeout must be a positive"),
    ("idle deadline inf", _set("idle_timeout", float("inf")), "idle_timeout must be a positive"),
    ("login deadline", _set("login_timeout", -1), "login_timeout must be a positive"),
    ("tiny login frame", _set("login_max_frame", 100), "login_max_frame must be >= 4096"),
    ("no unauthenticated", _set("max_unauthenticated_connections", 0),
     "max_unauthenticated_connections must be >= 1"),
    ("user bytes", _set("max_inflight_bytes_per_user", 10), "max_inflight_bytes_per_user must be"),
    ("free failures", _set("login_failures_before_delay", 0), "login_failures_before_delay must"),
    ("two replicas on one host", _set("hosts", {"1": "a", "2": "a", "3": "b"}),
     "group 'g0' has replicas on nodes 1 and 2, both on host 'a'"),
    ("a node of no host", _set("hosts", {"1": "a", "2": "b"}),
     "hosts names no host for node(s) [3]"),
    ("a host of no node", _set("hosts", {"1": "a", "2": "b", "3": "c", "4": "d"}),
     "hosts: node 4 is not in peers"),
    ("bad host name", _set("hosts", {"1": "a b", "2": "b", "3": "c"}), "hosts.1: a host name"),
    ("empty host name", _set("hosts", {"1": "", "2": "b", "3": "c"}), "hosts.1: a host name"),
    ("host not a string", _set("hosts", {"1": 1, "2": "b", "3": "c"}),
     "hosts.1 must be a string"),
    ("hosts not a table", _set("hosts", ["a"]), "hosts must be a table"),
]


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in INVALID],
                         ids=[c[0] for c in INVALID])
def test_invalid_configs_are_refused_with_a_clear_message(edit: Any, message: str) -> None:
    d = base()
    edit(d)
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_dict(d, env=ALLOW)
    assert message in str(info.value)


def test_tx_record_version_is_the_newest_unless_held_back_for_an_upgrade() -> None:
    assert NodeConfig.from_dict(base(), env=NO_ENV).tx_record_version == TX_RECORD_VERSION
    d = base()
    d["tx_record_version"] = 1
    assert NodeConfig.from_dict(d, env=NO_ENV).tx_record_version == 1
    for bad in (0, TX_RECORD_VERSION + 1, "2"):
        d["tx_record_version"] = bad
        with pytest.raises(ConfigError, match="tx_record_version must be"):
            NodeConfig.from_dict(d, env=NO_ENV)


def test_duplicate_group_ids() -> None:
    d = base()
    d["groups"].append({"id": "g0", "replicas": [2]})
    with pytest.raises(ConfigError, match=r"group id\(s\) \['g0'\] are defined more than once"):
        NodeConfig.from_dict(d, env=NO_ENV)


def test_load_config_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(SAMPLE.replace('fsync = "always"', 'fsync = "never"'))
    with pytest.raises(ConfigError, match=r"bad\.toml: fsync must be one of"):
        load_config(bad, env=NO_ENV)
    broken = tmp_path / "broken.toml"
    broken.write_text("node_id = \n")
    with pytest.raises(ConfigError, match=r"broken\.toml: not valid TOML"):
        load_config(broken)
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read"):
        load_config(tmp_path / "missing.toml")


# ------------------------------------------------------------------ mutations


def test_mutations_are_refused_without_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    d = base()
    d["test_mutations"] = ["ack-before-commit"]
    with pytest.raises(ConfigError, match=f"unless the environment has {ALLOW_MUTATIONS_ENV}=1"):
        NodeConfig.from_dict(d, env=NO_ENV)
    with pytest.raises(ConfigError):
        NodeConfig.from_dict(d, env={ALLOW_MUTATIONS_ENV: "yes"})
    monkeypatch.delenv(ALLOW_MUTATIONS_ENV, raising=False)
    with pytest.raises(ConfigError):
        NodeConfig.from_dict(d)  # the process environment is the default


def test_mutations_are_accepted_with_the_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    d = base()
    d["test_mutations"] = ["ack-before-commit", "skip-fsync"]
    assert NodeConfig.from_dict(d, env=ALLOW).test_mutations == ("ack-before-commit", "skip-fsync")
    monkeypatch.setenv(ALLOW_MUTATIONS_ENV, "1")
    assert NodeConfig.from_dict(d).test_mutations == ("ack-before-commit", "skip-fsync")


# ------------------------------------------------------------------ cluster layouts


def test_three_by_three_has_one_preferred_leader_per_node(tmp_path: Path) -> None:
    configs = cluster_configs(tmp_path, env=NO_ENV)
    assert [c.node_id for c in configs] == [1, 2, 3]
    for c in configs:
        assert c.groups == configs[0].groups  # every node sees the same layout
        assert c.hosted_groups == c.groups
        assert c.data == tmp_path / f"n{c.node_id}"
        assert c.listen == f"127.0.0.1:{7100 + c.node_id}"
        assert c.metrics == f"127.0.0.1:{7200 + c.node_id}"
        assert c.namesrv == ("127.0.0.1:7176",)
        assert dict(c.peers) == {i: f"127.0.0.1:{7100 + i}" for i in (1, 2, 3)}
    groups = configs[0].groups
    assert [g.id for g in groups] == ["g0", "g1", "g2"]
    assert all(g.replicas == (1, 2, 3) for g in groups)
    assert sorted(g.preferred_leader or 0 for g in groups) == [1, 2, 3]


def test_larger_clusters_wrap_replicas_and_spread_leaders(tmp_path: Path) -> None:
    configs = cluster_configs(tmp_path, nodes=5, groups=10, env=NO_ENV)
    groups = configs[0].groups
    for k, g in enumerate(groups):
        start = k % 5
        assert set(g.replicas) == {(start + j) % 5 + 1 for j in range(3)}
        assert g.preferred_leader == start + 1
    assert Counter(g.preferred_leader for g in groups) == {n: 2 for n in range(1, 6)}
    assert Counter(n for g in groups for n in g.replicas) == {n: 6 for n in range(1, 6)}
    assert [len(c.hosted_groups) for c in configs] == [6] * 5


def test_cluster_overrides_ports_and_namesrv(tmp_path: Path) -> None:
    configs = cluster_configs(
        tmp_path, nodes=2, groups=1, replication=2, host="127.0.0.2", port_base=20000,
        namesrv=["127.0.0.9:1", "127.0.0.9:2"], metrics=False, fsync="interval", tick_ms=10,
        env=NO_ENV,
    )
    assert [c.listen for c in configs] == ["127.0.0.2:20001", "127.0.0.2:20002"]
    assert all(c.metrics is None and c.fsync == "interval" and c.tick_ms == 10 for c in configs)
    assert configs[0].namesrv == ("127.0.0.9:1", "127.0.0.9:2")
    explicit = cluster_configs(tmp_path, nodes=2, listen_ports=[4001, 4002],
                               metrics_ports=[5001, 5002], env=NO_ENV, replication=2)
    assert [(c.listen, c.metrics) for c in explicit] == [
        ("127.0.0.1:4001", "127.0.0.1:5001"), ("127.0.0.1:4002", "127.0.0.1:5002")]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fsycn": "always"}, "unknown key 'fsycn'"),
        ({"data": "/x"}, "data differ per node"),
        ({"test_mutations": ["skip-fsync"]}, "refused unless"),
        ({"nodes": 0}, "at least one node"),
        ({"nodes": 2}, "replication must be between 1 and nodes"),
        ({"nodes": 80}, "fits at most 75 nodes"),
        ({"listen_ports": [1, 2]}, "2 ports for 3 nodes"),
    ],
)
def test_cluster_configs_refuses_bad_requests(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        cluster_configs(tmp_path, env=NO_ENV, **kwargs)


# ------------------------------------------------------------------ hosts


def test_hosts_round_trip_and_name_each_node() -> None:
    d = base()
    d["hosts"] = {"1": "rack1-a", "2": "rack1-b", "3": "rack2.a"}
    cfg = NodeConfig.from_dict(d, env=NO_ENV)
    assert cfg.host == "rack1-a" and cfg.host_of(3) == "rack2.a"
    assert roundtrip(cfg) == cfg
    assert "[hosts]" in dump_config(cfg)
    plain = NodeConfig.from_dict(base(), env=NO_ENV)
    assert plain.host_of(2) == "n2" and "[hosts]" not in dump_config(plain)
    assert plain.host_clash(2, [1, 3]) is None


def test_host_clash_names_the_member_sharing_a_host(tmp_path: Path) -> None:
    cfg = cluster_configs(tmp_path, hosts=3, shards=2, groups=6, env=NO_ENV)[0]
    assert cfg.host_clash(2, [1, 3, 5]) == 1  # nodes 1 and 2 are both h1
    assert cfg.host_clash(2, [3, 5]) is None
    assert cfg.host_clash(1, [1, 3, 5]) is None  # itself does not count


@pytest.mark.parametrize(("hosts", "shards", "groups"), [(3, 1, 3), (3, 2, 6), (4, 3, 25),
                                                         (5, 16, 80)])
def test_host_layouts_spread_replicas_and_leaders_over_every_shard(
        tmp_path: Path, hosts: int, shards: int, groups: int) -> None:
    cfgs = cluster_configs(tmp_path, hosts=hosts, shards=shards, groups=groups,
                           listen_ports=list(range(20000, 20000 + hosts * shards)),
                           metrics_ports=list(range(30000, 30000 + hosts * shards)),
                           env=NO_ENV)
    cfg = cfgs[0]
    assert len(cfgs) == hosts * shards
    assert sorted(set(cfg.hosts.values())) == sorted(f"h{k}" for k in range(1, hosts + 1))
    for g in cfg.groups:
        assert len({cfg.host_of(r) for r in g.replicas}) == 3, g
        assert g.preferred_leader in g.replicas
    leads = Counter(g.preferred_leader for g in cfg.groups)
    held = Counter(r for g in cfg.groups for r in g.replicas)
    nodes = hosts * shards
    # as even as the counts allow: no shard leads or holds more than one above another
    assert max(leads.values()) - min(leads[n] for n in range(1, nodes + 1)) <= 1
    assert max(held.values()) - min(held[n] for n in range(1, nodes + 1)) <= 1
    assert all(roundtrip(c) == c for c in cfgs[:2])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hosts": 2, "shards": 2}, "replication 3 needs 3 hosts"),
        ({"hosts": 3, "shards": 0}, "at least one shard"),
        ({"shards": 2}, "shards needs hosts"),
        ({"hosts": 3, "shards": 2, "nodes": 5}, "nodes=5 does not match 3 hosts x 2 shards"),
        ({"hosts": 0}, "at least one host"),
    ],
)
def test_host_layouts_refuse_what_cannot_be_placed(
        tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cluster_configs(tmp_path, env=NO_ENV, **kwargs)
