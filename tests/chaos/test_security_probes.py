"""The security workload's authorization probe records what the guard decided, and only
that (a real node process).

A node that holds no replica of the metadata group cannot check a test user's login: it
answers UNKNOWN_GROUP. The probe used to take any answer but FORBIDDEN, UNAUTHENTICATED or a
transport trouble for "the guard let it through", so such a refused login was recorded as
an allowed publish, and a 60-minute `--workload all` run under the membership nemesis
(which moves the metadata group's replicas) was judged invalid for 7 operations "no ACL
state allowed" (`authz_wrongly_allowed`). The probe now logs in first and records a login
it could not complete as unknown, never as an authorization outcome.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from broker.doors.security import make_credential
from broker.state.parts.users import format_verifier
from chaos.recorder import Recorder
from chaos.secworkload import SecurityWorkload
from raftmq.localcluster import free_ports
from tests.paths import REPO_ROOT as ROOT
from transport.connection import ConnectionPool
from transport.scram import Credentials
from wire.protocol import Op

pytestmark = pytest.mark.live

CONFIG = """\
node_id = 1
listen = "127.0.0.1:{port}"
data = "{data}"
tick_ms = 50
authenticate = true
authorize = true
cluster_secret = "this test cluster's own secret"
superusers = ["root"]
superuser_scram = "{scram}"
[peers]
1 = "127.0.0.1:{port}"
2 = "127.0.0.1:{other}"
[[groups]]
id = "g0"
replicas = [2]
[[groups]]
id = "g1"
replicas = [1]
"""


def test_a_login_the_node_cannot_check_is_not_recorded_as_an_allowed_operation(
        tmp_path: Path) -> None:
    port, other = free_ports(2)
    config = tmp_path / "n1.toml"
    config.write_text(CONFIG.format(port=port, other=other, data=tmp_path / "data",
                                    scram=format_verifier(make_credential("root-pw"))))
    addr = f"127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "raftmq", "node", "--config", str(config)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async def serving() -> None:  # the superuser, checked against the config, gets in
            deadline = time.monotonic() + 30
            while True:
                try:
                    async with ConnectionPool(credentials=Credentials("root", "root-pw")) as p:
                        await p.request(addr, Op.STATUS, {}, timeout=2)
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await trio.sleep(0.2)

        trio.run(serving)
        history = tmp_path / "history.jsonl"
        recorder = Recorder(history)
        workload = SecurityWorkload({1: addr}, "g0", recorder=recorder, rng=random.Random(1))

        async def probe() -> None:
            for operation in ("publish", "subscribe"):
                await workload.authz("p1", "alice", "alice-pw", 1, "other", operation)

        trio.run(probe)
        recorder.close()
    finally:
        proc.kill()
        proc.wait()
    ends = [json.loads(line) for line in history.read_text().splitlines()]
    ends = [e for e in ends if e["type"] != "invoke"]
    assert [e["type"] for e in ends] == ["info", "info"], ends
    assert all("UNKNOWN_GROUP" in e["value"]["error"] or "metadata" in e["value"]["error"]
               for e in ends), ends
