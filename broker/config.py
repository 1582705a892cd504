"""A node's configuration: one TOML file per node process.

Every node of a cluster gets the same `[peers]` table and the same `[[groups]]` list (the
cluster's layout as first started); at its first start a node hosts the groups whose
`replicas` name its `node_id` (`NodeConfig.hosted_groups`), or none with `join = true`;
from then on `DATA/hosted.json` says what it hosts (`broker.runtime.hosted`), since replicas
move at run time (`raftmq cluster`). Keeping the whole layout in each file lets a node reach the
leader of any group and lets tools check that all files describe one cluster.

Validation is strict on purpose: an unknown key is an error (a typo such as `fsycn` must
not silently fall back to a default), and every problem names its key. Example::

    node_id = 1
    listen = "127.0.0.1:7101"
    metrics = "127.0.0.1:9101"
    data = "/srv/raftmq/n1"
    namesrv = ["127.0.0.1:7176"]
    fsync = "always"
    cluster_secret = "the same long random string on every node"
    [peers]
    1 = "127.0.0.1:7101"
    2 = "127.0.0.1:7102"
    3 = "127.0.0.1:7103"
    [[groups]]
    id = "g0"
    replicas = [1, 2, 3]
    preferred_leader = 1

A machine may run several node processes (*shards*: one Python process uses one core, so a
16-core server runs up to 16). Each shard is a node in every respect (its own id, address,
data and Raft identity; clients reach it directly); the `[hosts]` table says which shards
share a machine, so that no group puts two replicas on one host (a host's failure takes
all its shards at once) and tools can show and stop a host as one::

    [hosts]
    1 = "h1"
    2 = "h1"
    3 = "h2"
    ...

Without `[hosts]` every node is its own host.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from broker.state.cqchunks import CHUNK_RECORDS
from transport.peerauth import DEV_CLUSTER_SECRET
from wire.protocol import (
    MAX_MESSAGE_BYTES,
    RequestError,
    host_name_problem,
    parse_address,
    validate_group_name,
)
from wire.security import read_verifier, user_name_problem

__all__ = [
    "ALLOW_MUTATIONS_ENV",
    "FSYNC_POLICIES",
    "KNOWN_MUTATIONS",
    "METRICS_PORT_OFFSET",
    "NAMESRV_PORT_OFFSET",
    "TX_RECORD_VERSION",
    "ConfigError",
    "GroupConfig",
    "NodeConfig",
    "check_tls",
    "cluster_configs",
    "dump_config",
    "host_layout",
    "host_of",
    "is_loopback",
    "place_groups",
    "load_config",
]

FSYNC_POLICIES = ("always", "interval")
ALLOW_MUTATIONS_ENV = "RAFTMQ_ALLOW_MUTATIONS"
# Deliberate misbehaviour a test can switch on to prove the checks catch it:
# ack-before-commit and skip-fsync break durability; duplicate-batch stores some batches
# twice; skip-read-barrier lets a leader answer reads without confirming it still leads
# (stale reads); crash-before-answer makes the node exit after a write (PRODUCE,
# COMMIT_OFFSET, a topic or group change, a transaction request) whose header asks for it
# ("test_exit": true) is committed and before it is answered, which forces the client to
# retry it (TX_END: once its decision is committed, before any marker goes out).
# Transactions: commit-before-durable-prepare answers a prepared produce before it is
# committed; serve-prepared puts prepared batches in their queues at once (consumers read
# uncommitted and aborted data); no-fencing ignores transactional epochs; forget-epochs
# starts an expired transactional id at epoch 0 again (its old producers' epochs count).
# Security: drop-acl-remove acknowledges every 5th removal of an ACL entry but keeps it.
# Delayed messages: deliver-at-send queues them when stored; volatile-timers loses what is
# pending whenever a leader starts its term (as an index kept in a leader's memory would).
# Simple consumers: ack-later-delivery applies an ack of an older delivery of a message to
# its current one (a stale receipt taken, the message gone from its present holder);
# fifo-ignore-inflight hands out a message group's next message while an earlier one is
# still in flight.
# Ordered consumption: release-before-commit is the consumers' (the chaos workload's
# push consumers, not the nodes): a released queue's lock is let go of before its final
# commit, so its next owner handles again what was handled and not committed yet.
KNOWN_MUTATIONS = frozenset({
    "ack-before-commit", "skip-fsync", "duplicate-batch", "skip-read-barrier",
    "crash-before-answer", "commit-before-durable-prepare", "serve-prepared", "no-fencing",
    "forget-epochs", "drop-acl-remove", "deliver-at-send", "volatile-timers",
    "ack-later-delivery", "fifo-ignore-inflight", "release-before-commit",
})

MAX_DELAY_S = 30 * 24 * 3600.0  # the default longest delay of a delayed message: 30 days

# Port layout of `cluster_configs`: node i listens at base+i, serves metrics at
# base+100+i, and the name server sits at base+76 (7176 for the default base 7100).
NAMESRV_PORT_OFFSET = 76
METRICS_PORT_OFFSET = 100
_MAX_NODES_FOR_LAYOUT = NAMESRV_PORT_OFFSET - 1


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and what is expected."""


TX_RECORD_VERSION = 2
"""The newest form of the transaction records a leader writes (`tx_record_version`)."""


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """One Raft group of the cluster and the nodes holding its replicas."""

    id: str
    replicas: tuple[int, ...]
    preferred_leader: int | None = None


def _frozen_peers(peers: Mapping[int, str]) -> Mapping[int, str]:
    return MappingProxyType(dict(sorted(peers.items())))


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything one node process needs; build it with `from_dict` or `load_config` so it
    is validated (the constructor itself does not check values)."""

    node_id: int
    listen: str
    data: Path
    peers: Mapping[int, str] = field(hash=False)
    groups: tuple[GroupConfig, ...] = ()
    # node id -> the machine it runs on (`[hosts]`); empty: every node is its own host
    hosts: Mapping[int, str] = field(default_factory=dict, hash=False)
    namesrv: tuple[str, ...] = ()
    metrics: str | None = None
    # The metrics endpoint is plain HTTP without a login (node, group and topic names,
    # Raft state, refusals): it binds to a loopback address unless this says it may be
    # served on another one (behind a firewall, or for a scraper on another host).
    metrics_public: bool = False
    # How long a start keeps trying a listen or metrics port that another process holds
    # (EADDRINUSE) before refusing; 0 refuses at once. A harness restarting nodes on a
    # shared host sets it: a port free a moment ago may be held for a while by a stranger.
    listen_retry_s: float = 0.0
    fsync: str = "always"
    fsync_interval: float = 1.0
    segment_size: int = 1 << 30
    tick_ms: int = 100
    election_ticks: int = 10
    register_interval: float = 30.0
    max_message_bytes: int = MAX_MESSAGE_BYTES
    retention_hours: float = 72.0
    # How far ahead a delayed message may be due (`delay` or `at` in its batch header);
    # one later is refused (pending messages keep their entries from retention meanwhile)
    max_delay_s: float = MAX_DELAY_S
    retention_disk_ratio: float = 0.90
    retention_check_interval: float = 60.0  # seconds between retention policy runs
    snapshot_every_entries: int = 100_000  # a group snapshot per this many applied (0: off)
    # ConsumeQueue records per sealed chunk file snapshots reference (`broker.state.cqchunks`);
    # every replica of a group should use the same; small values are for tests
    consume_queue_chunk: int = CHUNK_RECORDS
    # Delayed messages pending in memory per group before those due further than the
    # horizon ahead spill to files (`broker.state.parts.timers`); every replica of a group
    # must use the same; small values are for tests
    timer_memory_records: int = 262_144
    timer_spill_horizon_s: float = 900.0
    # Peers prove they know it before they may send Raft traffic (`transport.peerauth`);
    # the default suits plain local and test clusters only (a TLS config must set one).
    # It also keys the made-up salts of unknown users (`broker.doors.security`).
    cluster_secret: str = DEV_CLUSTER_SECRET
    # TLS on every link (`transport.tls`): this node's certificate and key, and the
    # cluster CA that signs every node's certificate (PEM files; all three or none). With
    # them the listener speaks TLS only, peers must present a certificate from the CA
    # (mutual TLS), and the node dials its peers and name servers over TLS.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    # Client authentication and authorization (`broker.doors.security`): with `authenticate`
    # every client proves a user's password by SCRAM-SHA-256 before any other request;
    # with `authorize` too, each request needs an ACL allowing it (default deny), except
    # for the `superusers`. `superuser_scram` is a SCRAM verifier (`raftmq user
    # verifier`) a superuser logs in with before any user is stored in the cluster.
    # Limits (`broker.node`): client connections served at once (peers' connections do
    # not count, so a flood of clients cannot starve the Raft links), requests in flight
    # and their request bytes, and answer bytes queued per connection (reading stops,
    # pushing back through TCP),
    # and how long a client may take no answer bytes before it is disconnected.
    max_connections: int = 10_000
    max_inflight_per_connection: int = 1024
    max_pending_bytes_per_connection: int = 1 << 20
    max_inflight_bytes_per_connection: int = 64 << 20
    slow_client_timeout: float = 30.0
    # The time and memory budget of a client connection (`transport.budget`,
    # docs/security.md): a frame must be complete `frame_timeout` seconds after its first
    # byte; a connection with nothing in flight is closed after `idle_timeout`. With
    # `authenticate`, a connection must log in within `login_timeout` of connecting, its
    # frames until then hold at most `login_max_frame` bytes, and at most
    # `max_unauthenticated_connections` connections not (yet) logged in are kept (a new
    # one closes the oldest; they do not count against `max_connections`, so they cannot
    # lock out a login). Request bodies in flight on all the connections of one user
    # (and the large frames they are reading) stop being read at
    # `max_inflight_bytes_per_user`. After `login_failures_before_delay` failed logins
    # in a row from an address (remembered for at most 4096 addresses), each next
    # failure from there is answered later, doubling up to `login_delay_max` seconds
    # (a right password is never delayed).
    frame_timeout: float = 120.0
    idle_timeout: float = 3600.0
    login_timeout: float = 30.0
    login_max_frame: int = 64 << 10
    max_unauthenticated_connections: int = 512
    max_inflight_bytes_per_user: int = 256 << 20
    login_failures_before_delay: int = 3
    login_delay_max: float = 5.0
    authenticate: bool = False
    authorize: bool = False
    superusers: tuple[str, ...] = ()
    superuser_scram: str = ""
    test_mutations: tuple[str, ...] = ()
    # Host no group at the first start (no `hosted.json` in `data` yet), whatever `groups`
    # says: this node's disk was replaced, or it is new; it hosts the groups it is then
    # told to join (`raftmq cluster add-replica` / `replace-replica`).
    join: bool = False
    # Record every fsync in <data>/.sync-marks (`raftlog.fsutil`), so a chaos run can
    # simulate a power loss (`chaos.disk_faults.discard_unsynced`); tests only.
    test_sync_marks: bool = False
    # Transactions (`broker.duties.transactions`): a half message is first checked back with its
    # producer group this long after it was stored, then every `tx_check_interval_ms`,
    # and rolled back after `tx_check_max` checks;
    # a client may ask for a transaction timeout of at most `tx_timeout_max_ms`; prepared
    # data of a Kafka transaction older than `tx_orphan_ms` asks its coordinator whether
    # it was left behind; the leaders look for due work every `tx_tick_ms`. A
    # transactional id idle for `tx_id_expiration_ms` (7 days, Kafka's default) is forgotten.
    tx_check_first_ms: int = 6_000
    tx_check_interval_ms: int = 30_000
    tx_check_max: int = 15
    tx_timeout_max_ms: int = 900_000
    tx_orphan_ms: int = 120_000
    tx_tick_ms: int = 200
    tx_id_expiration_ms: int = 604_800_000
    # The transaction records this node writes when it leads: 2 (the default) lets a
    # `tx_end` apply the decision in the coordinator's own group (`mark_here`) and a
    # `tx_add` complete the previous transaction (`completes`); 1 writes neither, as
    # releases before them did, whose nodes would apply those records differently. A
    # rolling upgrade from such a release runs with 1 until every node is upgraded
    # (docs/operations.md, "Upgrades").
    tx_record_version: int = TX_RECORD_VERSION
    # Orderly consumption (`broker.state.parts.queuelocks`): how long a queue lock holds
    # unrenewed when the client asks for no lease of its own (RocketMQ's 60 s).
    queue_lock_lease_ms: int = 60_000

    def __post_init__(self) -> None:
        # a read-only view, so a "frozen" config cannot be changed through its peers table
        object.__setattr__(self, "peers", _frozen_peers(self.peers))
        object.__setattr__(self, "hosts", MappingProxyType(dict(sorted(self.hosts.items()))))

    def host_of(self, node: int) -> str:
        """The host `node` runs on: its `[hosts]` entry, or its own name `n<id>` when the
        config has no `[hosts]` table (every node its own machine)."""
        return host_of(self.hosts, node)

    @property
    def host(self) -> str:
        """The host this node runs on."""
        return self.host_of(self.node_id)

    def host_clash(self, node: int, members: Iterable[int]) -> int | None:
        """A member of `members` (other than `node`) on the same host as `node`, if any:
        a replica there would share a machine with that one."""
        where = self.host_of(node)
        return next((m for m in sorted(members) if m != node and self.host_of(m) == where),
                    None)

    @property
    def hosted_groups(self) -> tuple[GroupConfig, ...]:
        """The groups this node holds a replica of."""
        return tuple(g for g in self.groups if self.node_id in g.replicas)

    @property
    def metadata_group(self) -> str | None:
        """The group whose log holds cluster metadata (users, ACLs): the lowest group id
        of the config. Every node's file lists the same groups, so all agree on it
        without asking anyone, and it exists from the cluster's first start."""
        return min((g.id for g in self.groups), default=None)

    @property
    def tx_records_v2(self) -> bool:
        """Whether this node, leading, writes the version-2 transaction records: a
        `tx_end` with `mark_here` and a `tx_add` that `completes` (`tx_record_version`)."""
        return self.tx_record_version >= 2

    @property
    def tls(self) -> bool:
        """Whether every link of this node is TLS."""
        return bool(self.tls_cert)

    @property
    def address(self) -> str:
        """The address other nodes and clients dial for this node (its `peers` entry)."""
        return self.peers[self.node_id]

    def group_dir(self, group: str) -> Path:
        """Where this node keeps the data of `group`."""
        return self.data / group

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> NodeConfig:
        """Validate a parsed TOML document (or an equivalent dict) into a config.

        `env` defaults to `os.environ`; it decides whether `test_mutations` and
        `test_sync_marks` are allowed.
        Raises `ConfigError` naming the first offending key.
        """
        return _parse(d, os.environ if env is None else env)


# ------------------------------------------------------------------ parsing


_REQUIRED = ("node_id", "listen", "data", "peers")
_TOP_KEYS = tuple(f.name for f in fields(NodeConfig))
_GROUP_KEYS = ("id", "replicas", "preferred_leader")


def _reject_unknown(d: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    for key in d:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown key {where}{key!r}{hint} (known: {', '.join(known)})")


def _int(value: object, key: str, *, minimum: int | None = None,
         maximum: int | None = None) -> int:
    # bool is an int subclass, but `true` for a port or a size is a mistake
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if maximum is not None and not (minimum or 0) <= value <= maximum:
        raise ConfigError(f"{key} must be {minimum or 0}..{maximum}, got {value}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{key} must be >= {minimum}, got {value}")
    return value


def _float(value: object, key: str, *, positive: bool = True) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    f = float(value)
    if not math.isfinite(f) or (positive and f <= 0):
        raise ConfigError(f"{key} must be a positive finite number, got {value!r}")
    return f


def _not_negative(value: object, key: str) -> float:
    f = _float(value, key, positive=False)
    if f < 0:
        raise ConfigError(f"{key} must not be negative, got {value!r}")
    return f


def _str(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return value


def _address(value: object, key: str) -> str:
    s = _str(value, key)
    try:
        parse_address(s)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None
    return s


def host_of(hosts: Mapping[int, str], node: int) -> str:
    """The host of `node` in a `[hosts]` table: its entry, or its own name `n<id>` when the
    table is empty (every node its own machine)."""
    return hosts.get(node) or f"n{node}"


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, without a port) names this machine only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _secret(value: object) -> str:
    s = _str(value, "cluster_secret")
    if len(s) < 16:
        raise ConfigError(f"cluster_secret must be at least 16 characters, got {len(s)}")
    return s


def _list(value: object, key: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{key} must be a list, got {value!r}")
    return list(value)


def _node_id(value: object, key: str) -> int:
    if isinstance(value, str):  # TOML table keys are always strings
        if not value.isdigit():
            raise ConfigError(f"{key} must be a positive integer node id, got {value!r}")
        value = int(value)
    return _int(value, key, minimum=1)


def _peers(value: object) -> dict[int, str]:
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(f"peers must be a table of node id = \"host:port\", got {value!r}")
    peers: dict[int, str] = {}
    seen: dict[str, int] = {}
    for k, v in value.items():
        nid = _node_id(k, f"peers key {k!r}")
        if nid in peers:
            raise ConfigError(f"peers: node {nid} is listed twice")
        addr = _address(v, f"peers.{nid}")
        if addr in seen:
            raise ConfigError(f"peers: nodes {seen[addr]} and {nid} share the address {addr}")
        peers[nid] = addr
        seen[addr] = nid
    return peers




def _hosts(value: object, peers: Mapping[int, str]) -> dict[int, str]:
    """`[hosts]`: node id -> host name, naming every node of `peers` (a node left out
    would be taken for a machine of its own, which is how two replicas end up on one)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"hosts must be a table of node id = \"host name\", got {value!r}")
    hosts: dict[int, str] = {}
    for k, v in value.items():
        nid = _node_id(k, f"hosts key {k!r}")
        if nid not in peers:
            raise ConfigError(f"hosts: node {nid} is not in peers (known nodes: {sorted(peers)})")
        name = _str(v, f"hosts.{nid}")
        problem = host_name_problem(name)
        if problem is not None:
            raise ConfigError(f"hosts.{nid}: {problem}")
        hosts[nid] = name
    missing = sorted(set(peers) - set(hosts))
    if hosts and missing:
        raise ConfigError(f"hosts names no host for node(s) {missing}: a [hosts] table names "
                          "the host of every node in peers")
    return hosts


def _check_placement(groups: Sequence[GroupConfig], hosts: Mapping[int, str]) -> None:
    """No group with two replicas on one host: a host that fails takes all its shards."""
    for g in groups:
        seen: dict[str, int] = {}
        for r in g.replicas:
            where = host_of(hosts, r)
            if where in seen:
                raise ConfigError(
                    f"group {g.id!r} has replicas on nodes {seen[where]} and {r}, both on host "
                    f"{where!r}: a group keeps at most one replica per host (the host's "
                    "failure would take both); place them on different hosts")
            seen[where] = r


def _group(value: object, index: int, peers: Mapping[int, str]) -> GroupConfig:
    where = f"groups[{index}]"
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table, got {value!r}")
    _reject_unknown(value, _GROUP_KEYS, f"in {where}: ")
    for key in ("id", "replicas"):
        if key not in value:
            raise ConfigError(f"{where} is missing {key!r}")
    try:
        gid = validate_group_name(value["id"])
    except RequestError as exc:
        raise ConfigError(f"{where}.id: {exc.message}") from None
    where = f"group {gid!r}"
    replicas_raw = _list(value["replicas"], f"{where} replicas")
    if not replicas_raw:
        raise ConfigError(f"{where} replicas must name at least one node")
    replicas = tuple(_int(r, f"{where} replica", minimum=1) for r in replicas_raw)
    if len(set(replicas)) != len(replicas):
        raise ConfigError(f"{where} replicas {list(replicas)} name a node twice")
    unknown = [r for r in replicas if r not in peers]
    if unknown:
        raise ConfigError(
            f"{where} replicas {unknown} are not in peers (known nodes: {sorted(peers)})"
        )
    preferred = value.get("preferred_leader")
    if preferred is not None:
        preferred = _int(preferred, f"{where} preferred_leader", minimum=1)
        if preferred not in replicas:
            raise ConfigError(
                f"{where} preferred_leader {preferred} is not one of its replicas {list(replicas)}"
            )
    return GroupConfig(gid, replicas, preferred)


def _bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def _mutations(value: object, env: Mapping[str, str]) -> tuple[str, ...]:
    items = tuple(_str(m, "test_mutations entry") for m in _list(value, "test_mutations"))
    for m in items:
        if m not in KNOWN_MUTATIONS:
            raise ConfigError(
                f"unknown test mutation {m!r} (known: {', '.join(sorted(KNOWN_MUTATIONS))})"
            )
    if items and env.get(ALLOW_MUTATIONS_ENV) != "1":
        raise ConfigError(
            f"test_mutations {list(items)} make the node deliberately unsafe; they are "
            f"refused unless the environment has {ALLOW_MUTATIONS_ENV}=1"
        )
    return items


def _sync_marks(value: object, env: Mapping[str, str]) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"test_sync_marks must be true or false, got {value!r}")
    if value and env.get(ALLOW_MUTATIONS_ENV) != "1":
        raise ConfigError(
            "test_sync_marks is test instrumentation (every fsync is logged for simulated "
            f"power losses); it is refused unless the environment has {ALLOW_MUTATIONS_ENV}=1"
        )
    return value


_TLS_KEYS = ("tls_cert", "tls_key", "tls_ca")


def _tls_files(d: Mapping[str, Any]) -> dict[str, str]:
    """The TLS file keys: all three or none, each a string (checked for use at start)."""
    files = {k: _str(d.get(k, ""), k) for k in _TLS_KEYS}
    given = [k for k in _TLS_KEYS if files[k]]
    if given and len(given) != len(_TLS_KEYS):
        missing = [k for k in _TLS_KEYS if not files[k]]
        raise ConfigError(f"TLS needs tls_cert, tls_key and tls_ca together; {', '.join(given)} "
                          f"given without {', '.join(missing)}")
    return files


def _security(d: Mapping[str, Any]) -> dict[str, Any]:
    authenticate = _bool(d.get("authenticate", False), "authenticate")
    authorize = _bool(d.get("authorize", False), "authorize")
    if authorize and not authenticate:
        raise ConfigError("authorize = true needs authenticate = true (ACLs name users)")
    supers = _list(d.get("superusers", []), "superusers")
    scram = _str(d.get("superuser_scram", ""), "superuser_scram")
    problems = [p for p in map(user_name_problem, supers) if p is not None]
    if problems:
        raise ConfigError(f"superusers/superuser_scram: {problems[0]}")
    names = tuple(supers)
    if scram:
        try:
            read_verifier(scram)
        except ValueError as exc:
            raise ConfigError(f"superusers/superuser_scram: {exc}") from None
    if scram and len(names) != 1:
        raise ConfigError("superuser_scram is the verifier of the one user in superusers; "
                          f"superusers names {len(names)}")
    return {"authenticate": authenticate, "authorize": authorize, "superusers": names,
            "superuser_scram": scram}


def check_tls(cfg: NodeConfig) -> None:
    """Load the TLS files of `cfg` once, so a missing or mismatched file is a clear
    `ConfigError` naming it before the node starts (not a failed handshake later)."""
    if not cfg.tls:
        return
    from transport.tls import TlsConfigError, client_context, server_context

    try:
        server_context(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, what="tls_cert/tls_key/tls_ca")
        client_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key, what="tls_cert/tls_key/tls_ca")
    except TlsConfigError as exc:
        raise ConfigError(str(exc)) from None


def _parse(d: Mapping[str, Any], env: Mapping[str, str]) -> NodeConfig:
    if not isinstance(d, Mapping):
        raise ConfigError(f"a node configuration must be a table, got {type(d).__name__}")
    _reject_unknown(d, _TOP_KEYS, "")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ConfigError(f"missing required key(s): {', '.join(missing)}")

    peers = _peers(d["peers"])
    node_id = _node_id(d["node_id"], "node_id")
    if node_id not in peers:
        raise ConfigError(f"node_id {node_id} is not in peers (known nodes: {sorted(peers)})")
    data = _str(d["data"], "data")
    if not data:
        raise ConfigError("data must name a directory")

    groups = tuple(_group(g, i, peers) for i, g in enumerate(_list(d.get("groups", []), "groups")))
    ids = [g.id for g in groups]
    dup = sorted({g for g in ids if ids.count(g) > 1})
    if dup:
        raise ConfigError(f"group id(s) {dup} are defined more than once")
    hosts = _hosts(d.get("hosts", {}), peers)
    _check_placement(groups, hosts)

    metrics = d.get("metrics")
    fsync = _str(d.get("fsync", "always"), "fsync")
    if fsync not in FSYNC_POLICIES:
        raise ConfigError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {fsync!r}")
    ratio = _float(d.get("retention_disk_ratio", 0.90), "retention_disk_ratio")
    if ratio > 1:
        raise ConfigError(f"retention_disk_ratio must be in (0, 1], got {ratio}")

    metrics_public = _bool(d.get("metrics_public", False), "metrics_public")
    if metrics is not None and not metrics_public and not is_loopback(
            parse_address(_address(metrics, "metrics"))[0]):
        raise ConfigError(f"metrics = {metrics!r} is not a loopback address: the metrics "
                          "endpoint is plain HTTP without a login, so it binds to loopback "
                          "(127.0.0.1, ::1, localhost) unless metrics_public = true says "
                          "it may be served there")
    tls = _tls_files(d)
    security = _security(d)
    secret = _secret(d.get("cluster_secret", DEV_CLUSTER_SECRET))
    if tls["tls_cert"] and secret == DEV_CLUSTER_SECRET:
        # the built-in secret is public: on a TLS cluster it would leave the CA alone
        # standing between any certificate holder and the peers
        raise ConfigError("a TLS cluster needs its own cluster_secret (the same long random "
                          "string on every node); the built-in one is for plain local "
                          "clusters only")
    if security["authenticate"] and secret == DEV_CLUSTER_SECRET:
        # the built-in secret is public: anyone could do the peer handshake and read the
        # users' verifiers (READ_RAW), and tell stored user names from unknown ones by the
        # made-up salts it keys (`broker.doors.security.fake_salt_key`)
        raise ConfigError("authenticate = true needs a cluster_secret of its own (the same "
                          "long random string on every node); the built-in one is public")
    return NodeConfig(
        node_id=node_id,
        listen=_address(d["listen"], "listen"),
        data=Path(data),
        peers=peers,
        groups=groups,
        hosts=hosts,
        namesrv=tuple(
            _address(a, "namesrv entry") for a in _list(d.get("namesrv", []), "namesrv")
        ),
        metrics=None if metrics is None else _address(metrics, "metrics"),
        metrics_public=metrics_public,
        listen_retry_s=_not_negative(d.get("listen_retry_s", 0.0), "listen_retry_s"),
        fsync=fsync,
        fsync_interval=_float(d.get("fsync_interval", 1.0), "fsync_interval"),
        segment_size=_int(d.get("segment_size", 1 << 30), "segment_size", minimum=1024),
        tick_ms=_int(d.get("tick_ms", 100), "tick_ms", minimum=1),
        election_ticks=_int(d.get("election_ticks", 10), "election_ticks", minimum=2),
        register_interval=_float(d.get("register_interval", 30.0), "register_interval"),
        max_message_bytes=_int(
            d.get("max_message_bytes", MAX_MESSAGE_BYTES), "max_message_bytes", minimum=1
        ),
        retention_hours=_float(d.get("retention_hours", 72.0), "retention_hours"),
        max_delay_s=_float(d.get("max_delay_s", MAX_DELAY_S), "max_delay_s"),
        retention_disk_ratio=ratio,
        retention_check_interval=_float(
            d.get("retention_check_interval", 60.0), "retention_check_interval"
        ),
        snapshot_every_entries=_int(
            d.get("snapshot_every_entries", 100_000), "snapshot_every_entries", minimum=0
        ),
        timer_memory_records=_int(d.get("timer_memory_records", 262_144),
                                  "timer_memory_records", minimum=1),
        timer_spill_horizon_s=_float(d.get("timer_spill_horizon_s", 900.0),
                                     "timer_spill_horizon_s"),
        consume_queue_chunk=_int(
            d.get("consume_queue_chunk", CHUNK_RECORDS), "consume_queue_chunk", minimum=1
        ),
        cluster_secret=secret,
        max_connections=_int(d.get("max_connections", 10_000), "max_connections", minimum=1),
        max_inflight_per_connection=_int(d.get("max_inflight_per_connection", 1024),
                                         "max_inflight_per_connection", minimum=1),
        max_pending_bytes_per_connection=_int(d.get("max_pending_bytes_per_connection", 1 << 20),
                                              "max_pending_bytes_per_connection", minimum=1024),
        max_inflight_bytes_per_connection=_int(
            d.get("max_inflight_bytes_per_connection", 64 << 20),
            "max_inflight_bytes_per_connection", minimum=1024),
        slow_client_timeout=_float(d.get("slow_client_timeout", 30.0), "slow_client_timeout"),
        frame_timeout=_float(d.get("frame_timeout", 120.0), "frame_timeout"),
        idle_timeout=_float(d.get("idle_timeout", 3600.0), "idle_timeout"),
        login_timeout=_float(d.get("login_timeout", 30.0), "login_timeout"),
        login_max_frame=_int(d.get("login_max_frame", 64 << 10), "login_max_frame",
                             minimum=4096),
        max_unauthenticated_connections=_int(d.get("max_unauthenticated_connections", 512),
                                             "max_unauthenticated_connections", minimum=1),
        max_inflight_bytes_per_user=_int(d.get("max_inflight_bytes_per_user", 256 << 20),
                                         "max_inflight_bytes_per_user", minimum=1024),
        login_failures_before_delay=_int(d.get("login_failures_before_delay", 3),
                                         "login_failures_before_delay", minimum=1),
        login_delay_max=_float(d.get("login_delay_max", 5.0), "login_delay_max"),
        tls_cert=tls["tls_cert"],
        tls_key=tls["tls_key"],
        tls_ca=tls["tls_ca"],
        authenticate=security["authenticate"],
        authorize=security["authorize"],
        superusers=security["superusers"],
        superuser_scram=security["superuser_scram"],
        test_mutations=_mutations(d.get("test_mutations", []), env),
        test_sync_marks=_sync_marks(d.get("test_sync_marks", False), env),
        join=_bool(d.get("join", False), "join"),
        queue_lock_lease_ms=_int(d.get("queue_lock_lease_ms", 60_000), "queue_lock_lease_ms",
                                 minimum=100),
        **_tx_settings(d),
    )


#: The transaction settings: key -> (default, minimum, maximum or None); all integers
#: (milliseconds but for the check count and the record version).
_TX_SETTINGS = {
    "tx_check_first_ms": (6_000, 1, None),
    "tx_check_interval_ms": (30_000, 1, None),
    "tx_check_max": (15, 1, None),
    "tx_timeout_max_ms": (900_000, 1, None),
    "tx_orphan_ms": (120_000, 1, None),
    "tx_tick_ms": (200, 1, None),
    "tx_id_expiration_ms": (604_800_000, 1, None),
    "tx_record_version": (TX_RECORD_VERSION, 1, TX_RECORD_VERSION),
}


def _tx_settings(d: Mapping[str, Any]) -> dict[str, int]:
    return {key: _int(d.get(key, default), key, minimum=minimum, maximum=maximum)
            for key, (default, minimum, maximum) in _TX_SETTINGS.items()}


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> NodeConfig:
    """Read and validate a node's TOML file.

    A relative `data` directory is taken relative to the file's own directory, so a config
    means the same thing whatever the working directory of the process reading it.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    try:
        cfg = NodeConfig.from_dict(doc, env=env)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
    if not cfg.data.is_absolute():
        cfg = replace(cfg, data=p.resolve().parent / cfg.data)
    here = p.resolve().parent  # relative TLS files, like `data`, are beside the file
    if cfg.tls:
        cfg = replace(cfg, tls_cert=str(here / cfg.tls_cert), tls_key=str(here / cfg.tls_key),
                      tls_ca=str(here / cfg.tls_ca))  # (an absolute path stays as it is)
    try:
        check_tls(cfg)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
    return cfg


# ------------------------------------------------------------------ writing


def _toml_str(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # always has '.' or an exponent, so TOML reads a float back
    if isinstance(v, str | Path):
        return _toml_str(str(v))
    if isinstance(v, tuple | list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def dump_config(cfg: NodeConfig) -> str:
    """The TOML text of `cfg`; `load_config` of it gives back an equal config."""
    lines = [f"node_id = {cfg.node_id}", f"listen = {_toml_value(cfg.listen)}"]
    if cfg.metrics is not None:
        lines.append(f"metrics = {_toml_value(cfg.metrics)}")
    if cfg.metrics_public:
        lines.append("metrics_public = true")
    lines.append(f"data = {_toml_value(cfg.data)}")
    lines.append(f"namesrv = {_toml_value(cfg.namesrv)}")
    skip = {"node_id", "listen", "metrics", "metrics_public", "data", "namesrv", "peers",
            "groups", "hosts"}
    for name in _TOP_KEYS:
        if name not in skip:
            lines.append(f"{name} = {_toml_value(getattr(cfg, name))}")
    lines.append("")
    lines.append("[peers]")
    for nid, addr in sorted(cfg.peers.items()):
        lines.append(f"{nid} = {_toml_value(addr)}")
    if cfg.hosts:
        lines.append("")
        lines.append("[hosts]")
        for nid, name in sorted(cfg.hosts.items()):
            lines.append(f"{nid} = {_toml_value(name)}")
    for g in cfg.groups:
        lines.append("")
        lines.append("[[groups]]")
        lines.append(f"id = {_toml_value(g.id)}")
        lines.append(f"replicas = {_toml_value(g.replicas)}")
        if g.preferred_leader is not None:
            lines.append(f"preferred_leader = {g.preferred_leader}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ clusters


_PER_NODE_KEYS = frozenset({"node_id", "listen", "metrics", "data", "peers", "groups",
                            "hosts"})


def host_layout(hosts: int, shards: int) -> dict[int, str]:
    """Node ids of `hosts` hosts with `shards` shards each: host `h{k}` (1-based) runs
    nodes `(k-1)*shards+1 .. k*shards`."""
    return {(k - 1) * shards + s: f"h{k}" for k in range(1, hosts + 1)
            for s in range(1, shards + 1)}


def place_groups(groups: int, nodes: int, replication: int,
                  hosts: Mapping[int, str]) -> list[dict[str, Any]]:
    """Replicas and preferred leaders of `g0..g{groups-1}`.

    Without hosts (every node its own): group k on `replication` consecutive nodes from
    node `k mod nodes + 1`, which leads it. With hosts: group k's replicas are on
    `replication` consecutive hosts from host `k mod H`, never two on one; its leader goes
    round-robin over every shard of every host (host k mod H, its shard (k div H) mod S),
    and each other replica takes the shard of its host holding the fewest replicas yet,
    so replicas and leaders spread evenly over all the shards.
    """
    placed: list[dict[str, Any]] = []
    if not hosts:
        for k in range(groups):
            first = k % nodes
            replicas = sorted((first + j) % nodes + 1 for j in range(replication))
            placed.append({"id": f"g{k}", "replicas": replicas, "preferred_leader": first + 1})
        return placed
    by_host: dict[str, list[int]] = {}
    for nid, name in sorted(hosts.items()):
        by_host.setdefault(name, []).append(nid)
    names = list(by_host)
    if replication > len(names):
        raise ConfigError(f"replication {replication} needs {replication} hosts (a group keeps "
                          f"at most one replica per host); there are {len(names)}")
    load = dict.fromkeys(hosts, 0)
    for k in range(groups):
        first = k % len(names)
        lead_shards = by_host[names[first]]
        leader = lead_shards[(k // len(names)) % len(lead_shards)]
        replicas = [leader]
        load[leader] += 1
        for j in range(1, replication):
            shards = by_host[names[(first + j) % len(names)]]
            pick = min(shards, key=lambda n: (load[n], n))
            replicas.append(pick)
            load[pick] += 1
        placed.append({"id": f"g{k}", "replicas": sorted(replicas), "preferred_leader": leader})
    return placed


def cluster_configs(
    base_dir: str | os.PathLike[str],
    *,
    nodes: int | None = None,
    groups: int = 3,
    hosts: int | None = None,
    shards: int = 1,
    host: str = "127.0.0.1",
    port_base: int = 7100,
    namesrv: Sequence[str] | None = None,
    replication: int = 3,
    metrics: bool = True,
    listen_ports: Sequence[int] | None = None,
    metrics_ports: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> list[NodeConfig]:
    """Configs for a local cluster of `nodes` nodes (3 by default) and `groups` groups
    `g0..g{groups-1}`.

    Layout: node i (1-based) listens at `port_base+i`, serves metrics at `port_base+100+i`
    and keeps data in `base_dir/n{i}`; the name server defaults to `host:port_base+76`.
    `listen_ports`/`metrics_ports` replace the computed ports (e.g. with free ones).
    Group k is replicated on `replication` consecutive nodes starting at node
    `k mod nodes + 1` (wrapping around), which is also its preferred leader: preferred
    leaders go round-robin over the nodes, so 3 nodes x 3 groups give one per node.
    With `hosts` (H machines of `shards` node processes each; `nodes` is then H x S), the
    configs get a `[hosts]` table (`host_layout`) and groups are placed by host: never two
    replicas on one, leaders over every shard (`place_groups`).
    `overrides` set any other config key (e.g. `fsync="interval"`) on every node.
    """
    if shards < 1:
        raise ConfigError(f"a host runs at least one shard, got shards={shards}")
    if hosts is not None:
        if hosts < 1:
            raise ConfigError(f"a cluster needs at least one host, got {hosts}")
        if nodes is not None and nodes != hosts * shards:
            raise ConfigError(f"nodes={nodes} does not match {hosts} hosts x {shards} shards")
        nodes = hosts * shards
    elif shards != 1:
        raise ConfigError("shards needs hosts (how many machines the shards are spread over)")
    if nodes is None:
        nodes = 3
    if nodes < 1:
        raise ConfigError(f"a cluster needs at least one node, got {nodes}")
    if listen_ports is None and nodes > _MAX_NODES_FOR_LAYOUT:
        raise ConfigError(
            f"the port layout fits at most {_MAX_NODES_FOR_LAYOUT} nodes; pass listen_ports"
        )
    if groups < 0:
        raise ConfigError(f"groups must be >= 0, got {groups}")
    if not 1 <= replication <= nodes:
        raise ConfigError(f"replication must be between 1 and nodes ({nodes}), got {replication}")
    for ports, what in ((listen_ports, "listen_ports"), (metrics_ports, "metrics_ports")):
        if ports is not None and len(ports) != nodes:
            raise ConfigError(f"{what} has {len(ports)} ports for {nodes} nodes")
    bad = sorted(_PER_NODE_KEYS & overrides.keys())
    if bad:
        raise ConfigError(f"{', '.join(bad)} differ per node and cannot be overridden here")

    base = Path(base_dir)
    ids = range(1, nodes + 1)
    lports = list(listen_ports) if listen_ports is not None else [port_base + i for i in ids]
    mports = (
        list(metrics_ports)
        if metrics_ports is not None
        else [port_base + METRICS_PORT_OFFSET + i for i in ids]
    )
    peers = {i: f"{host}:{lports[i - 1]}" for i in ids}
    if namesrv is None:
        namesrv = [f"{host}:{port_base + NAMESRV_PORT_OFFSET}"]
    layout = host_layout(hosts, shards) if hosts is not None else {}
    group_list = place_groups(groups, nodes, replication, layout)

    configs = []
    for i in ids:
        doc: dict[str, Any] = {
            "node_id": i,
            "listen": peers[i],
            "data": str(base / f"n{i}"),
            "namesrv": list(namesrv),
            "peers": peers,
            "groups": group_list,
            **overrides,
        }
        if layout:
            doc["hosts"] = layout
        if metrics:
            doc["metrics"] = f"{host}:{mports[i - 1]}"
        configs.append(NodeConfig.from_dict(doc, env=env))
    return configs
