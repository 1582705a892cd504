"""A live cluster with logins and ACLs, holding what every console page shows: a topic
with keyed messages, a consumer group's offsets, a half message no producer decided, a
user with no rights; and the console serving it (Starlette over hypercorn's trio worker
in a thread, as `raftmq console` serves it)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette

from raftmq.client import BlockingAdmin, BlockingProducer
from raftmq.localcluster import LocalCluster, free_ports
from raftmq.web.console import routes
from raftmq.web.settings import WebSettings
from tests.secured_cluster import ROOT, secured_cluster
from transport.scram import PASSWORD_ENV, USER_ENV, Credentials

ALICE = Credentials("alice", "alice's password")
TOPIC = "orders"
TRACED_TOPIC = "shipments"  # one message from a traced producer
DECIDED_TOPIC = "payments"  # the half message an action decides: TOPIC's counts stay put
QUEUES = 4
MESSAGES = 20
GROUP = "billing"
PRODUCER_GROUP = "shop"


@dataclass
class Seeded:
    cluster: LocalCluster
    settings: WebSettings
    msg_ids: list[str]
    keys: dict[str, list[str]]  # key -> its messages' ids
    txid: str
    txid_to_decide: str
    extra: dict[str, Any] = field(default_factory=dict)

    def admin(self) -> BlockingAdmin:
        """An SDK admin acting as the superuser: the answer pages are compared with."""
        with as_user(ROOT):
            return BlockingAdmin([self.cluster.namesrv_addr])


@contextmanager
def as_user(creds: Credentials) -> Iterator[None]:
    """RAFTMQ_USER/RAFTMQ_PASSWORD set while SDK clients are made (their pools read it)."""
    before = {k: os.environ.get(k) for k in (USER_ENV, PASSWORD_ENV)}
    os.environ[USER_ENV], os.environ[PASSWORD_ENV] = creds.user, creds.password
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def seeded_cluster(base: Path) -> Iterator[Seeded]:
    with secured_cluster(base / "cluster", groups=2, user=ALICE,
                         topics={TOPIC: QUEUES, DECIDED_TOPIC: 1, TRACED_TOPIC: 1}) as cluster:
        ns = [cluster.namesrv_addr]
        with as_user(ROOT):
            ids: list[str] = []
            by_key: dict[str, list[str]] = {}
            with BlockingProducer(ns) as producer:
                for i in range(MESSAGES):
                    key = f"customer-{i % 5}"
                    sent = producer.send(TOPIC, f"order {i}", key=key)
                    assert sent.msg_id is not None
                    ids.append(sent.msg_id)
                    by_key.setdefault(key, []).append(sent.msg_id)
            with BlockingAdmin(ns) as admin:
                admin.reset_offsets(GROUP, TOPIC, "earliest")
            with BlockingProducer(ns, producer_group=PRODUCER_GROUP) as producer:
                txid = producer.prepare(TOPIC, "a half message nobody decides").txid
                to_decide = producer.prepare(DECIDED_TOPIC, "a half an operator commits").txid
            with BlockingProducer(ns, trace=True) as producer:
                traced = producer.send(TRACED_TOPIC, "a traced shipment").msg_id
        chaos = base / "chaos"
        settings = WebSettings(namesrv=(cluster.namesrv_addr,), chaos_dir=chaos,
                               audit_log=base / "audit.jsonl")
        yield Seeded(cluster, settings, ids, by_key, txid, to_decide, {"traced": traced})


def console_app(settings: WebSettings) -> Starlette:
    return Starlette(routes=routes(settings))


@contextmanager
def served(app: Starlette) -> Iterator[str]:
    """`app` served by hypercorn's trio worker on a free loopback port, in a thread;
    yields its base URL."""
    port = free_ports(1)[0]
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    started = threading.Event()
    stop: list[trio.Event] = []
    token: list[trio.lowlevel.TrioToken] = []

    async def main() -> None:
        stop.append(trio.Event())
        token.append(trio.lowlevel.current_trio_token())
        async with trio.open_nursery() as nursery:
            await nursery.start(_serve, app, config, stop[0])
            started.set()

    async def _serve(app: Starlette, config: Config, until: trio.Event,
                     task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
                     ) -> None:
        await serve(app, config, shutdown_trigger=until.wait, task_status=task_status)

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the console did not start serving")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        trio.from_thread.run_sync(stop[0].set, trio_token=token[0])
        thread.join(30)
