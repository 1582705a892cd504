"""One node process: replicas of several Raft groups behind one address.

A node owns, in one trio nursery:

* a `GroupRuntime` + `BrokerState` per hosted group (Multi-Raft: each group elects on its
  own; a preferred leader per group spreads leaders across nodes, and the core hands
  leadership back to it once it has caught up after a restart). The preferred leader is
  the config's unless one was logged (`broker.state.parts.leadership`), pushed to the core on
  every tick. Which groups are hosted is recorded in `DATA/hosted.json`
  (`broker.runtime.hosted`): a node starts hosting an empty replica when told (HOST_GROUP, from
  `raftmq cluster add-replica`) and closes and deletes one it was removed from
  (DROP_GROUP), each group running in a cancel scope of its own;
* `PeerLinks`: one TCP connection per node pair carrying every group's Raft messages;
* one listener on `listen` for both peers and clients (TLS only when the config names
  `tls_cert`/`tls_key`/`tls_ca`): a connection whose first frame is HELLO becomes a
  peer's only once the peer handshake (`transport.peerauth`, a challenge-response over
  the cluster secret) succeeds, and, with TLS, only if it presented a certificate from
  the cluster CA; a client can never send Raft traffic or read raw entries, and every
  client request passes the guard (`broker.doors.security`: login, ACLs) and the per-node
  limits (`max_connections`, ...);
* the ticker driving every group's logical clock;
* the name-server registrar (`broker.runtime.registrar`: every `register_interval`, and at once
  on a leader change or a topic change);
* the Prometheus endpoint and the gauges behind it;
* the leader-side duties (`broker.duties.registry`: transactions, retention, ...), each
  started for a group once this node leads it and is ready, cancelled when it stops
  leading it.

A group that finds corrupt entries in its CommitLog fetches them from its peer replicas
with READ_RAW requests on their listeners, a range of entries per request (`_fetch_raw`;
see `raftlog.runtime`), over the node's one request connection per peer (`PeerRPC`,
opened with the peer handshake, purpose `rpc`, and shared with the transaction tasks),
which every node serves whatever it is doing, so two nodes repairing from each other
never wait on one another.

With `test_sync_marks` (tests only) every fsync under the data directory is recorded
before the groups open (`raftlog.fsutil.enable_sync_marks`), for simulated power losses.

Cancelling the nursery (SIGINT/SIGTERM) closes every CommitLog cleanly.
"""

from __future__ import annotations

import errno
import functools
import gc as pygc
import logging
import random
import shutil
import signal
import ssl
import sys
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from typing import Any

import trio
from prometheus_client import Counter, Gauge

from broker.config import NodeConfig, load_config
from broker.doors.security import Guard
from broker.doors.service import BrokerService
from broker.doors.transactions import TxService
from broker.duties.registry import DUTIES, LeaderDuties
from broker.duties.transactions import TxTasks
from broker.runtime.admission import ClientAdmission, Ticket
from broker.runtime.groups import GroupRegistry
from broker.runtime.hosted import HostedError, load_hosted, save_hosted
from broker.runtime.metrics import NodeMetrics, serve_metrics
from broker.runtime.peer_rpc import PeerRPC
from broker.runtime.registrar import Registrar
from broker.state.cqchunks import CorruptChunk, FileChunkStore, is_shipped, provide, ship, unship
from broker.state.statemachine import BrokerState, TimerLimits, TopicConfig, chunk_refs
from raftlog.commitlog import CommitLogError
from raftlog.core import RaftConfig
from raftlog.fsutil import CorruptFile, disable_sync_marks, enable_sync_marks
from raftlog.runtime import EntryUnavailable, GroupOptions, GroupRuntime, when_space
from raftlog.types import Message, MsgType, Role
from transport.budget import Budget, BytePool
from transport.framing import Caller, FrameStream, caller_of, serve_frames
from transport.peerauth import DEV_CLUSTER_SECRET, PeerRefused, accept_peer, refuse_peer
from transport.tls import (
    TLS_HANDSHAKE_TIMEOUT,
    PlaintextRefused,
    accept_tls,
    client_context,
    peer_certificate,
    server_context,
)
from wire.protocol import (
    Code,
    Frame,
    Op,
    ProtocolError,
    RequestError,
    error_header,
    frame_limit,
    parse_address,
)
from wire.requests import ReadRawRequest

__all__ = ["Node", "main"]

log = logging.getLogger("raftmq.node")

#: How long a new connection may take to send its first frame before it is closed.
FIRST_FRAME_TIMEOUT = 10.0
#: Peer frames may be this much larger than a client's: the largest entry a client's
#: request makes still fits once re-framed as a Raft append (or a READ_RAW answer). A
#: snapshot larger than a frame travels in chunks (`broker.runtime.peers`).
PEER_FRAME_HEADROOM = 1 << 20
#: How long a READ_RAW may take (the repair's own per-peer timeout is shorter).
READ_RAW_TIMEOUT = 10.0
LISTEN_RETRY_PAUSE = 0.5  # seconds between tries of a port another process holds
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: The deliberate `duplicate-batch` test mutation stores every this-many-th batch a
#: leader accepts twice: often enough that a few seconds of load store several.
DUPLICATE_EVERY = 8


class Node:
    def __init__(self, config: NodeConfig, *, ssl_context: ssl.SSLContext | None = None,
                 peer_ssl_context: ssl.SSLContext | None = None) -> None:
        """`ssl_context` (server side) puts TLS on the listener, for clients and peers
        alike; `peer_ssl_context` (client side) is what this node dials its peers with.
        Give both or neither: peers share one listener with clients."""
        if (ssl_context is None) != (peer_ssl_context is None):
            raise ValueError("give both ssl_context and peer_ssl_context, or neither")
        if ssl_context is None and config.tls:  # the config's files (`tls_cert`, ...)
            ssl_context = server_context(config.tls_cert, config.tls_key, config.tls_ca)
            peer_ssl_context = client_context(config.tls_ca, config.tls_cert, config.tls_key)
        self.config = config
        self._ssl = ssl_context
        self._peer_ssl = peer_ssl_context
        self.node_id = config.node_id
        self.addr = config.address
        # where each node is reached; this node's own entry becomes the bound address
        # when it listens on port 0
        self.addresses: dict[int, str] = dict(config.peers)
        self.metrics = NodeMetrics(config.node_id)
        # corrupt CommitLog entries: awaiting a peer's copy, and repaired from one
        self.unrepaired_gauge = Gauge("raftmq_unrepaired_entries",
                                      "Corrupt log entries waiting for a peer's copy",
                                      ["group"], registry=self.metrics.registry)
        self.repaired_counter = Counter("raftmq_entries_repaired",
                                        "Corrupt log entries repaired from a peer's copy",
                                        ["group"], registry=self.metrics.registry)
        self._repaired_seen: dict[str, int] = {}
        # connections turned away, by why: `plaintext` (no TLS on a TLS port), `tls` (a
        # failed handshake: untrusted or expired certificate), `peer_certificate` (a HELLO
        # without a certificate from the cluster CA), `peer_handshake` (a failed HELLO);
        # requests: `auth` (a wrong password), `unauthenticated` (a request before AUTH),
        # `acl` (not allowed; `broker.doors.security`); `connections` (over max_connections)
        self.refused_counter = Counter("raftmq_connections_refused",
                                       "Connections refused before any request was served",
                                       ["reason"], registry=self.metrics.registry)
        self.refill_lost_gauge = Gauge("raftmq_refill_lost_entries",
                                       "Entries the state references that no replica's log "
                                       "held when a refill was abandoned",
                                       ["group"], registry=self.metrics.registry)
        self.max_frame = frame_limit(config.max_message_bytes)
        self.peer_max_frame = self.max_frame + PEER_FRAME_HEADROOM
        from broker.runtime.peers import PeerLinks

        self._secret = config.cluster_secret.encode()
        self.peers = PeerLinks(config.node_id, dict(config.peers), self._deliver,
                               max_frame=self.peer_max_frame,
                               secret=self._secret, on_lost=self._peer_lost,
                               ssl_context=peer_ssl_context)
        self.groups: dict[str, GroupRuntime[BrokerState]] = {}
        self._group_configs = {gc.id: gc for gc in config.groups}
        self.registry = GroupRegistry(self.groups, self.addresses)
        self.states: Mapping[str, BrokerState] = self.registry.states
        mutations = set(config.test_mutations)
        # per group: the sealed ConsumeQueue chunks its snapshots reference, and those a
        # leader shipped with a snapshot, kept until the install stores them
        self.chunk_stores: dict[str, FileChunkStore] = {}
        self._shipped: dict[str, dict[str, bytes]] = {}
        self._mutations = mutations
        self._timer_limits = TimerLimits(config.timer_memory_records,
                                         round(config.timer_spill_horizon_s * 1000))
        hosted = load_hosted(config.data)
        self._hosted_file_missing = hosted is None
        if hosted is None:  # the first start: what the config says (nothing when joining)
            hosted = {} if config.join else {gc.id: gc.replicas for gc in config.hosted_groups}
        self._hosted: dict[str, tuple[int, ...]] = dict(hosted)
        self._group_scopes: dict[str, trio.CancelScope] = {}
        self._group_done: dict[str, trio.Event] = {}
        self._membership_lock = trio.Lock()  # one host/drop at a time on this node
        for gid, voters in sorted(hosted.items()):
            self.groups[gid] = self._new_group(gid, voters)
        self.service = BrokerService(self.registry, self)
        # requests to other nodes as a peer: READ_RAW for repairs, the transaction tasks'
        self.rpc = PeerRPC(config.node_id, self._secret, self.addresses,
                           max_frame=self.peer_max_frame,
                           ssl_context=peer_ssl_context)
        # the leader-side duties of every group this node leads (`broker.duties.registry`)
        self.duties = LeaderDuties(self, DUTIES)
        self.txtasks = self.duties.duty(TxTasks)
        self.service.tx.finisher = self.txtasks
        self.registrar = Registrar(config.namesrv, config.register_interval,
                                   self._registration_view, ssl_context=peer_ssl_context)
        # every request on a served connection passes the guard first (`broker.doors.security`)
        self.guard = Guard(self)
        self._handle = self.guard.wrap(self.service.handle)
        self.ack_before_commit = "ack-before-commit" in mutations
        # prepared (transactional, half) batches answered before they commit
        self.commit_before_durable_prepare = "commit-before-durable-prepare" in mutations
        self.skip_read_barrier = "skip-read-barrier" in mutations
        # a scripted crash between a commit and its answer (tests of retried requests)
        self.crash_before_answer = "crash-before-answer" in mutations
        # `duplicate-batch`: every DUPLICATE_EVERY-th batch this node leads is stored twice
        self.duplicate_every = DUPLICATE_EVERY if "duplicate-batch" in mutations else 0
        self.batches_led = 0
        self._nursery: trio.Nursery | None = None
        cfg = config
        # which client connections are kept (`broker.runtime.admission`), and each one's budget
        self.admission = ClientAdmission(
            max_connections=cfg.max_connections,
            max_unidentified=cfg.max_unauthenticated_connections,
            max_bytes_per_user=cfg.max_inflight_bytes_per_user,
            superusers=frozenset(cfg.superusers), on_refusal=self.count_refusal)
        self.budget = Budget(
            frame_timeout=cfg.frame_timeout, idle_timeout=cfg.idle_timeout,
            login_timeout=cfg.login_timeout if cfg.authenticate else None,
            login_max_frame=cfg.login_max_frame if cfg.authenticate else None)

    @property
    def client_connections(self) -> int:
        """Client connections counted against `max_connections` now."""
        return self.admission.clients

    def _new_group(self, gid: str, voters: tuple[int, ...]) -> GroupRuntime[BrokerState]:
        """The runtime of this node's replica of `gid` (not opened yet); `voters` is the
        membership an empty replica starts with, until the log says otherwise."""
        config = self.config
        store = self.chunk_stores[gid] = FileChunkStore(config.group_dir(gid) / "consumequeue")
        state = BrokerState(gid, max_message_bytes=config.max_message_bytes,
                            chunk_store=store, chunk_records=config.consume_queue_chunk,
                            mutations=self._mutations, timer_limits=self._timer_limits)
        gc = self._group_configs.get(gid)
        options = GroupOptions(
            raft=RaftConfig(
                election_ticks=config.election_ticks,
                heartbeat_ticks=1,
                preferred_leader=gc.preferred_leader if gc is not None else None,
            ),
            segment_size=config.segment_size,
            fsync="interval" if config.fsync == "interval" else "always",
            fsync_interval=config.fsync_interval,
            snapshot_every_entries=config.snapshot_every_entries,
            skip_fsync="skip-fsync" in self._mutations,
        )
        hist = self.metrics.fsync_seconds.labels(gid)
        return GroupRuntime(
            gid, config.node_id, config.group_dir(gid), voters, state,
            self._send, options, rng=random.Random(), on_change=self._on_change,
            on_fsync=hist.observe, restore=functools.partial(self._restore_state, gid),
            fetch_raw=functools.partial(self._fetch_raw, gid),
        )

    # ------------------------------------------------------------------ hosting

    @property
    def hosted(self) -> dict[str, tuple[int, ...]]:
        """The groups this node hosts and the voters each was created with."""
        return dict(self._hosted)

    async def _run_group(self, g: GroupRuntime[BrokerState]) -> None:
        done = self._group_done[g.group_id] = trio.Event()
        try:
            with trio.CancelScope() as scope:
                self._group_scopes[g.group_id] = scope
                await g.run()
        finally:
            done.set()

    async def host_group(self, gid: str, voters: tuple[int, ...]) -> bool:
        """Start hosting an empty replica of `gid` (the leader then catches it up with
        appends or its snapshot) and record it in the hosted list; False when this node
        already hosts it. Leftover data of an earlier replica is deleted first."""
        async with self._membership_lock:
            if gid in self.groups:
                return False
            assert self._nursery is not None
            path = self.config.group_dir(gid)
            await trio.to_thread.run_sync(functools.partial(shutil.rmtree, path,
                                                            ignore_errors=True))
            g = self._new_group(gid, voters)
            await trio.to_thread.run_sync(g.open)  # creates and fsyncs files: off the loop
            hosted = {**self._hosted, gid: voters}
            try:
                await trio.to_thread.run_sync(save_hosted, self.config.data, hosted)
            except OSError:
                g.close_log()  # not hosted: a restart does not find it either
                raise
            self._hosted = hosted
            self.groups[gid] = g
            self._nursery.start_soon(self._run_group, g)
            log.info("hosting a new replica", extra={"fields": {"group": gid,
                                                                "voters": list(voters)}})
            self.registrar.wake()
            return True

    async def drop_group(self, gid: str) -> bool:
        """Stop hosting `gid` (this node was removed from it): close the replica, take it
        off the hosted list, delete its data. False when it was not hosted here."""
        async with self._membership_lock:
            g = self.groups.get(gid)
            if g is None:
                return False
            if g.is_leader:
                raise ValueError(f"node {self.node_id} leads group {gid}")
            if self.node_id in g.membership.voters and g.leader is not None:
                raise ValueError(f"node {self.node_id} still follows node {g.leader} as a "
                                 f"voter of group {gid}")
            del self.groups[gid]
            self.chunk_stores.pop(gid, None)
            self._shipped.pop(gid, None)
            self._hosted.pop(gid, None)
            await trio.to_thread.run_sync(save_hosted, self.config.data, dict(self._hosted))
            scope = self._group_scopes.pop(gid, None)
            if scope is not None:
                scope.cancel()
                await self._group_done.pop(gid).wait()
            await trio.to_thread.run_sync(functools.partial(
                shutil.rmtree, self.config.group_dir(gid), ignore_errors=True))
            log.info("stopped hosting a replica and deleted its data",
                     extra={"fields": {"group": gid}})
            self.registrar.wake()
            return True

    # ------------------------------------------------------------------ wiring

    def peer_addr(self, node: int | None) -> str | None:
        return self.registry.peer_addr(node)

    def _send(self, group: str, m: Message) -> None:
        if m.type == MsgType.SNAPSHOT and (len(m.snapshot) > self.peers.chunk_bytes
                                           or chunk_refs(m.snapshot)):
            assert self._nursery is not None  # groups run in it
            self._nursery.start_soon(self._ship_snapshot, group, m)
            return
        self.peers.send(group, m)

    async def _ship_snapshot(self, group: str, m: Message) -> None:
        """Send a snapshot with the chunks it references (read and checked off the event
        loop): the follower has none of them; one larger than a peer frame goes in
        chunks (`PeerLinks.send_snapshot`). A chunk of ours that is damaged, or gone
        because a newer snapshot replaced this one meanwhile, is never shipped: the
        leader sends its snapshot again later."""
        refs = chunk_refs(m.snapshot)
        if refs:
            try:
                data = await trio.to_thread.run_sync(ship, m.snapshot, refs,
                                                     self.chunk_stores[group])
            except (CorruptChunk, OSError) as exc:
                log.warning("snapshot not sent: a chunk it references is unusable", extra={
                    "fields": {"group": group, "peer": m.dst, "error": str(exc)}})
                return
            m = replace(m, snapshot=data)
        await self.peers.send_snapshot(group, m)

    def _deliver(self, group: str, m: Message) -> None:
        g = self.groups.get(group)
        if g is not None and m.dst == self.node_id and g.is_open:
            if m.type == MsgType.SNAPSHOT and is_shipped(m.snapshot):
                assert self._nursery is not None
                self._nursery.start_soon(self._receive_snapshot, group, m)
                return
            g.step(m)

    async def _receive_snapshot(self, group: str, m: Message) -> None:
        """Check a shipped snapshot's chunks off the event loop and keep them for the
        install (`_restore_state` stores them), then hand the snapshot to the group."""
        try:
            data, chunks = await trio.to_thread.run_sync(unship, m.snapshot, chunk_refs)
        except ValueError as exc:
            log.warning("shipped snapshot dropped", extra={"fields": {
                "group": group, "peer": m.src, "error": str(exc)}})
            return
        self._shipped.setdefault(group, {}).update(chunks)  # until an install takes them
        g = self.groups.get(group)
        if g is not None and g.is_open:
            g.step(replace(m, snapshot=data))

    def count_refusal(self, reason: str) -> None:
        """One more connection or request turned away for `reason` (see refused_counter)."""
        self.refused_counter.labels(reason).inc()

    def _peer_lost(self, peer: int) -> None:
        for g in self.groups.values():
            g.peer_lost(peer)  # a group `peer` led elects a new leader sooner

    def _restore_state(self, group: str, data: bytes) -> BrokerState:
        """A group's state from a snapshot (its file at open, or one a leader sent): the
        group's runtime keeps it, `states` reads it from there. The chunks a leader
        shipped with it are stored durably first (the runtime writes the snapshot file
        after this returns)."""
        store = self.chunk_stores[group]
        shipped = self._shipped.pop(group, None)
        if shipped:
            provide(store, chunk_refs(data), shipped)
        return BrokerState.restore(group, data, max_message_bytes=self.config.max_message_bytes,
                                   chunk_store=store, chunk_records=self.config.consume_queue_chunk,
                                   mutations=self._mutations, timer_limits=self._timer_limits)

    async def _fetch_raw(self, group: str, peer: int, lo: int, hi: int) -> bytes:
        """Entries [lo, hi) of `group` as stored by `peer`, a prefix holding at least `lo`
        (READ_RAW over this node's one request connection to that peer)."""
        try:
            ask = ReadRawRequest(g=group, index=lo, hi=hi)
            frame = await self.rpc.request(peer, {"op": int(Op.READ_RAW), **ask.header()},
                                           timeout=READ_RAW_TIMEOUT)
        except RequestError as exc:
            if exc.code in (Code.UNAVAILABLE, Code.TIMEOUT, Code.CONNECTION_LOST):
                raise  # the peer did not answer: asked last for the rest of the round
            raise EntryUnavailable(f"node {peer}: {exc.message}",
                                   gone=exc.extra.get("gone") is True) from None
        return frame.body

    def _on_change(self, g: GroupRuntime) -> None:
        if g.role == Role.LEADER:
            self.metrics.leader_changes.labels(g.group_id).inc()
        self.duties.leadership_changed()
        self.registrar.wake()

    def spawn(self, work: Awaitable[Any]) -> None:
        """Run `work` in the node's nursery, ignoring its outcome (the deliberate
        `ack-before-commit` mutation answers before its proposal is decided)."""
        assert self._nursery is not None

        async def run() -> None:
            try:
                await work
            except Exception as exc:  # noqa: BLE001 - the outcome is not anyone's to see
                log.info("unacknowledged proposal failed", extra={"fields": {"error": repr(exc)}})

        self._nursery.start_soon(run)

    def topics_changed(self) -> None:
        self.registrar.wake()

    @property
    def tx_service(self) -> TxService:
        """The transaction requests' handlers (what the transaction tasks propose with)."""
        return self.service.tx

    def reachable_peers(self) -> list[int]:
        """The nodes this one has a live Raft link with now."""
        return self.peers.connected_peers()

    # ------------------------------------------------------------------ running

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Open the groups, listen and serve until cancelled. Started with
        `nursery.start`, it returns the address clients and peers dial, with the real
        port when `listen` asked for port 0 (tests need not guess a free port)."""
        if not self.config.test_sync_marks:
            await self._run(task_status)
            return
        # its file lives on the disk it describes: on a full disk, wait as the groups do
        path = await when_space(functools.partial(enable_sync_marks, self.config.data),
                                "while starting the record of fsyncs", "fsyncs recorded")
        log.warning("recording every fsync for simulated power losses (test_sync_marks)",
                    extra={"fields": {"marks": str(path)}})
        try:
            await self._run(task_status)
        finally:
            disable_sync_marks(self.config.data)

    async def _run(self, task_status: trio.TaskStatus[str]) -> None:
        for g in self.groups.values():
            await g.open_when_space()  # a full disk at start: wait for space, not exit
        if self._hosted_file_missing:  # from now on the node hosts what this file says
            save_hosted(self.config.data, self._hosted)
            self._hosted_file_missing = False
        host, port = _listen_address(self.config.listen)
        if self.config.cluster_secret == DEV_CLUSTER_SECRET and host not in _LOOPBACK:
            log.warning("the built-in cluster_secret is used on a non-loopback address: "
                        "anyone who knows it can join as a peer; set cluster_secret",
                        extra={"fields": {"listen": self.config.listen}})
        listeners = await _listen(port, host, "listen", self.config.listen,
                                  self.config.listen_retry_s)
        if port == 0:  # any free port: one listener, and everyone is told its real port
            for extra in listeners[1:]:
                await extra.aclose()
            listeners = listeners[:1]
            self.addr = f"{host}:{listeners[0].socket.getsockname()[1]}"
            self.addresses[self.node_id] = self.addr
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.rpc.run)  # before the groups' repairs use it
            for g in self.groups.values():
                nursery.start_soon(self._run_group, g)
            nursery.start_soon(self.peers.run)
            nursery.start_soon(trio.serve_listeners, self._serve_connection, listeners)
            nursery.start_soon(self._ticker)
            nursery.start_soon(self.registrar.run)
            nursery.start_soon(self._refresh_metrics)
            nursery.start_soon(self.guard.run)  # closes removed users' connections
            await nursery.start(self.duties.run)
            if self.config.metrics:
                mhost, mport = parse_address(self.config.metrics)
                mlisteners = await _listen(mport, mhost, "metrics", self.config.metrics,
                                            self.config.listen_retry_s)
                await nursery.start(serve_metrics, mlisteners, self.metrics)
            log.info("node ready", extra={"fields": {"addr": self.addr,
                                                     "groups": sorted(self.groups)}})
            task_status.started(self.addr)

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        with trio.CancelScope() as scope:  # (cancelled: evicted, see `broker.runtime.admission`)
            ticket = self.admission.arrive(scope)
            try:
                await self._serve_accepted(stream, ticket)
            finally:
                self.admission.leave(ticket)
        if scope.cancelled_caught:
            log.info("closed the oldest connection that had not logged in, for a new one")
            await trio.aclose_forcefully(stream)

    async def _serve_accepted(self, stream: trio.abc.Stream, ticket: Ticket) -> None:
        since = trio.current_time()
        if self._ssl is not None:
            try:
                with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                    stream = await accept_tls(stream, self._ssl)
            except (trio.BrokenResourceError, trio.TooSlowError, PlaintextRefused) as exc:
                plain = isinstance(exc, PlaintextRefused)
                self.refused_counter.labels("plaintext" if plain else "tls").inc()
                log.info("TLS handshake failed", extra={"fields": {"error": repr(exc)}})
                await trio.aclose_forcefully(stream)
                return
        cfg = self.config
        fs = FrameStream(stream, max_frame=self.max_frame)
        if cfg.authenticate:  # the first frame is a HELLO or an AUTH: both small
            fs.decoder.max_frame = min(self.max_frame, cfg.login_max_frame)
        first = None
        first_timeout = FIRST_FRAME_TIMEOUT
        if cfg.authenticate:
            first_timeout = min(first_timeout, cfg.login_timeout)
        try:
            with trio.move_on_after(first_timeout):  # an idle connection holds nothing
                first = await fs.receive()
        except Exception:  # noqa: BLE001 - a broken first frame ends only this connection
            await serve_frames(fs, self._handle)  # answers the protocol error
            return
        if first is None:
            await trio.aclose_forcefully(fs.stream)
            return
        if first.header.get("op") == Op.HELLO:  # peers are not counted: never crowded out
            # (the handshake's frames are small; until it succeeds this is any connection)
            fs.decoder.max_frame = min(self.max_frame, cfg.login_max_frame)
            await self._serve_peer(fs, first, ticket)
            return
        fs.decoder.max_frame = self.max_frame  # (the budget lowers it again until a login)
        caller = caller_of(fs.stream)
        if cfg.authenticate:  # counted once logged in (the guard's AUTH calls `log_in`)
            caller.on_login(functools.partial(self._logged_in, ticket))
        else:
            try:
                self.admission.client(ticket)
            except RequestError as exc:
                with trio.move_on_after(2):
                    try:
                        await fs.send(error_header(0, exc.code, f"node {self.node_id}: "
                                                   f"{exc.message}"))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                await trio.aclose_forcefully(fs.stream)
                return
        await serve_frames(fs, self._handle, first=first, caller=caller,
                           max_inflight=cfg.max_inflight_per_connection,
                           max_pending=cfg.max_pending_bytes_per_connection,
                           max_inflight_bytes=cfg.max_inflight_bytes_per_connection,
                           write_timeout=cfg.slow_client_timeout, budget=self.budget,
                           pool_of=self._pool_of, frame_pool_of=self._pool_of, since=since)

    def _pool_of(self, caller: Caller) -> BytePool | None:
        """The request bytes (bodies running, frames being read) `caller` shares with its
        user's other connections: `max_inflight_bytes_per_user`."""
        return self.admission.pool(caller.principal)

    def _logged_in(self, ticket: Ticket, user: str) -> None:
        """A client connection logged in as `user`: it now counts as that user's, or
        the login is refused with BUSY when the node has no room for it."""
        try:
            self.admission.client(ticket, user)
        except RequestError as exc:
            raise RequestError(exc.code, f"node {self.node_id}: {exc.message}") from None

    async def _serve_peer(self, fs: FrameStream, hello: Frame, ticket: Ticket) -> None:
        """A connection that opened with HELLO: the peer handshake, then the Raft link
        (purpose `raft`) or requests answered as from that peer (`rpc`: READ_RAW). Only a
        completed handshake takes it out of the connections not identified yet, so a
        HELLO that goes no further is bounded and evicted like them."""
        try:
            if self._ssl is not None and peer_certificate(fs.stream) is None:
                # mutual TLS: a node proves it is one with a certificate from the cluster CA
                self.refused_counter.labels("peer_certificate").inc()
                await refuse_peer(fs, "a peer connection must present a certificate signed by "
                                  "the cluster CA (tls_cert/tls_key in its node config)")
                return
            try:
                peer, purpose = await accept_peer(fs, hello, self._secret, self.node_id,
                                                  self.config.peers)
            except (PeerRefused, ProtocolError, trio.BrokenResourceError,
                    trio.ClosedResourceError) as exc:
                self.refused_counter.labels("peer_handshake").inc()
                log.info("peer connection refused", extra={"fields": {"error": str(exc)}})
                return
            self.admission.peer(ticket)
            fs.decoder.max_frame = self.max_frame  # (the Raft link raises it to its own)
            if purpose == "rpc":
                caller = caller_of(fs.stream)
                caller.peer = peer
                await serve_frames(fs, self._handle, caller=caller)
                return
            await self.peers.accept(peer, fs.stream, fs.decoder)
        finally:
            await trio.aclose_forcefully(fs.stream)  # no TLS goodbye owed to a peer gone

    async def _ticker(self) -> None:
        interval = self.config.tick_ms / 1000
        next_at = trio.current_time()
        while True:
            next_at += interval
            await trio.sleep_until(next_at)
            for gid, g in self.groups.items():
                g.set_preferred_leader(self.preferred_leader(gid))
                g.tick()
            now = trio.current_time()
            if now - next_at > 5 * interval:
                next_at = now  # the loop was starved; don't burst-tick to catch up

    def preferred_leader(self, gid: str) -> int | None:
        """Where `gid`'s leadership belongs: the node set through the log
        (`raftmq cluster transfer-leader`), else the one the config names."""
        pref = self.states[gid].preferred_leader
        if pref is None:
            gc = self._group_configs.get(gid)
            pref = gc.preferred_leader if gc is not None else None
        return pref

    def registration(self) -> dict[str, Any]:
        """The REGISTER header the registrar sends now (see `broker.runtime.registrar`)."""
        return self.registrar.registration()

    def _registration_view(
        self,
    ) -> tuple[dict[str, Any], dict[str, tuple[dict[str, Any], dict[str, TopicConfig]]]]:
        groups: dict[str, tuple[dict[str, Any], dict[str, TopicConfig]]] = {}
        for gid, g in self.groups.items():
            st = g.status()
            groups[gid] = ({
                "role": st["role"],
                "leader": st["leader"],
                "term": st["term"],
                "replicas": {n: self.addresses[n] for n in
                             sorted(g.membership.members | {self.node_id})
                             if n in self.addresses},
                "commit": st["commit"],
                "applied": st["applied"],  # that of the table beside it (a name server
                # trusts the table of the member that applied most)
            }, self.states[gid].topics())
        fields: dict[str, Any] = {"node": self.node_id, "addr": self.addr,
                                  "metrics": self.config.metrics, "host": self.config.host}
        auth = self.guard.registration_auth()
        if auth is not None:  # the name servers check logins against these
            fields["auth"] = auth
        return fields, groups

    def users_changed(self) -> None:
        """The users of the metadata group changed: tell the name servers now."""
        self.registrar.wake()

    def status(self, caller: Caller | None = None) -> dict[str, Any]:
        """What STATUS answers: every group's Raft state, queue ranges, committed
        consumer offsets and FIFO message groups in flight; for `caller`, only the topics and consumer groups its ACLs let
        it see (`Guard.visibility`)."""
        see = self.guard.visibility(caller) if caller is not None else None
        groups: dict[str, Any] = {}
        for gid, g in self.groups.items():
            st = g.status()
            state = self.states[gid]
            queues: dict[str, dict[int, list[int]]] = {}
            for name, cfg in state.topics().items():
                if see is None or see("topic", name):
                    queues[name] = {q: list(state.queue_range(name, q)) for q in cfg.hosted}
            offsets: dict[str, dict[str, dict[int, int]]] = {}
            for (cg, topic, q), off in state.consumer_offsets().items():
                if see is None or see("group", cg):
                    offsets.setdefault(cg, {}).setdefault(topic, {})[q] = off
            fifo: dict[str, dict[str, dict[int, list[int]]]] = {}
            for (cg, topic, q), (busy, held) in state.receipts.fifo_summary().items():
                if see is None or (see("group", cg) and see("topic", topic)):
                    fifo.setdefault(cg, {}).setdefault(topic, {})[q] = [busy, held]
            tx_ids, tx_fences = _tx_held(state)
            groups[gid] = {**st, "leader_addr": self.peer_addr(st["leader"]), "queues": queues,
                           "offsets": offsets, "fifo": fifo,
                           "tx_ids": tx_ids, "tx_fences": tx_fences,
                           "delayed_pending": state.timers.pending,
                           "delayed_in_memory": state.timers.in_memory,
                           "delayed_runs": state.timers.runs}
        return {"node": self.node_id, "addr": self.addr, "host": self.config.host,
                "groups": groups, "peers_connected": self.peers.connected_peers()}

    async def _refresh_metrics(self) -> None:
        seen_topics: dict[str, int] = {}
        while True:
            for gid, g in self.groups.items():
                st = g.status()
                self.metrics.set_raft_state(
                    gid, role="pre_candidate" if st["role"] == "pre-candidate" else st["role"],
                    term=st["term"], commit=st["commit"], applied=st["applied"],
                    last=st["last"], durable=st["durable"])
                self.unrepaired_gauge.labels(gid).set(len(st["unrepaired"]))
                gap = st["refill_gap"]
                self.refill_lost_gauge.labels(gid).set(gap[1] - gap[0] + 1 if gap else 0)
                repaired = st["repaired"] - self._repaired_seen.get(gid, 0)
                if repaired > 0:
                    self.repaired_counter.labels(gid).inc(repaired)
                    self._repaired_seen[gid] = st["repaired"]
                state = self.states[gid]
                tx_ids, tx_fences = _tx_held(state)
                self.metrics.tx_ids.labels(gid).set(tx_ids)
                self.metrics.tx_fences.labels(gid).set(tx_fences)
                self.metrics.delayed_pending.labels(gid).set(state.timers.pending)
                self.metrics.delayed_delivered.labels(gid).set(state.timers.delivered)
                ntopics = state.topic_count
                if seen_topics.get(gid, ntopics) != ntopics:
                    self.registrar.wake()
                seen_topics[gid] = ntopics
                if g.is_leader:
                    for (cg, topic, q), off in state.consumer_offsets().items():
                        try:
                            end = state.queue_range(topic, q)[1]
                        except Exception:  # noqa: BLE001 - topic deleted meanwhile
                            continue
                        self.metrics.consumer_lag.labels(gid, cg, topic, str(q)).set(end - off)
            await trio.sleep(1.0)


def _tx_held(state: BrokerState) -> tuple[int, int]:
    """What transactional ids cost a group (STATUS and the metrics): the ids it
    coordinates and the fences it keeps, both forgotten after tx_id_expiration_ms idle."""
    return len(state.txcoord.txns), len(state.txpart.fences)


class ListenError(Exception):
    """The node cannot listen where its config says (the port is taken, the address is
    not this host's): a start refused before serving anything."""


async def _listen(port: int, host: str, key: str, addr: str,
                  retry_s: float = 0.0) -> list[trio.SocketListener]:
    """Listeners on `host:port`; a port another process holds is tried again every
    half second for `retry_s` seconds (`listen_retry_s`) before the start is refused."""
    deadline = trio.current_time() + retry_s
    warned = False
    while True:
        try:
            return await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and trio.current_time() < deadline:
                if not warned:
                    log.warning("port held by another process; trying again", extra={
                        "fields": {"addr": addr, "key": key, "retry_s": retry_s}})
                    warned = True
                await trio.sleep(LISTEN_RETRY_PAUSE)
                continue
            raise ListenError(f"cannot listen on {addr} (config key {key!r}): "
                              f"{exc.strerror or exc} -- another process holds the port, "
                              "or the address is not this host's") from exc


def _listen_address(addr: str) -> tuple[str, int]:
    """`parse_address`, except that port 0 (any free port) is allowed for listening."""
    host, sep, port = addr.rpartition(":")
    if sep and host and port == "0":
        return host, 0
    return parse_address(addr)


# The fsync of every group runs in a worker thread; when it returns, the thread needs the
# GIL back to report, and a busy event loop would keep it waiting for the whole default
# switch interval (5 ms): that wait was most of the p99 of "fsync" under load.
GIL_SWITCH_INTERVAL = 0.0005


DAMAGED_DATA_EXIT = 3
"""Exit status of a node that refused to start on damaged files (`_refusal`)."""

_DAMAGED_ADVICE = (
    "The node does not serve from files it cannot trust; nothing was changed. Put the "
    "damaged file back from a backup and start the node again, or start it on an empty "
    "data directory with join = true and re-create its replicas from their peers "
    "(raftmq cluster replace-replica GROUP N N; docs/operations.md, Replacing a node)."
)


def _found(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The error of one of `kinds` inside `exc`, an error that ended the node, if any."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _found(inner, kinds)
            if found is not None:
                return found
    return None


def _refusal(exc: BaseException) -> str:
    return f"raftmq node: refusing to start: {exc}\n{_DAMAGED_ADVICE}"


async def _run_until_signalled(node: Node, started: list[str]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            addr = await nursery.start(node.run)
            started.append(addr)
            # What opening the groups built lives as long as the node: the collector
            # need not walk it again on every full collection.
            pygc.collect()
            pygc.freeze()
            print(f"ready {addr}", flush=True)
            async for _sig in signals:
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str]) -> int:
    import argparse

    from broker.config import ConfigError
    from transport.logs import configure_logging

    p = argparse.ArgumentParser(prog="raftmq node", description="run one raftmq node")
    p.add_argument("--config", required=True, help="node TOML file")
    p.add_argument("--log-level", default="INFO", metavar="LEVEL",
                   help="DEBUG, INFO, WARNING or ERROR (default %(default)s)")
    args = p.parse_args(argv)
    try:
        config = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"raftmq node: {exc}", file=sys.stderr)
        return 2
    configure_logging(f"n{config.node_id}", args.log_level)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    try:
        node = Node(config)
    except HostedError as exc:
        print(f"raftmq node: {exc}", file=sys.stderr)
        return 2
    started: list[str] = []
    try:
        trio.run(_run_until_signalled, node, started)
    except BaseException as exc:
        if started:
            raise
        listen = _found(exc, (ListenError,))
        if listen is not None:
            print(f"raftmq node: {listen}", file=sys.stderr)
            return 2
        damaged = _found(exc, (CorruptFile, CommitLogError))
        if damaged is None:
            raise
        log.error("refusing to start on damaged files", exc_info=damaged)
        print(_refusal(damaged), file=sys.stderr)
        return DAMAGED_DATA_EXIT
    return 0
