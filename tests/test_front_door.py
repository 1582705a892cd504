"""The README's promises: `make run`'s showcase works against a fresh `raftmq dev`, and the
Python example in the README runs as written against a live cluster."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from raftmq.localcluster import LocalCluster
from tests.live_cluster import free_port_base
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.live


@pytest.mark.parametrize("secured", [[], ["--tls", "--auth"]], ids=["plain", "tls-auth"])
def test_dev_showcase_produces_and_consumes_every_message(tmp_path, secured):
    """`make run`'s plain start, and the secured one of docs/security.md (TLS on every
    link, logins and ACLs), whose showcase logs in as the generated superuser."""
    proc = subprocess.run(
        [sys.executable, "-m", "raftmq", "dev", "--data", str(tmp_path / "dev"),
         "--port-base", str(free_port_base()), *secured, "--exit-after-showcase"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ready 127.0.0.1:")
    assert "every acknowledged message came back" in " ".join(proc.stderr.split())
    if secured:
        assert (tmp_path / "dev" / "tls" / "ca.pem").is_file()
        assert (tmp_path / "dev" / "admin.password").is_file()
        assert "TLS on every link" in proc.stderr


def test_a_second_showcase_on_the_same_data_finds_every_new_message(tmp_path):
    """`make run` again: `raftmq dev` keeps its data, so the topic holds the earlier run's
    messages too; the showcase still waits for every message it sent, and says how many
    earlier ones it read past (it once stopped after as many messages as it sent, mostly
    old ones, and reported the new ones missing)."""
    def showcase() -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "raftmq", "dev", "--data", str(tmp_path / "dev"),
             "--port-base", str(free_port_base()), "--exit-after-showcase"],
            capture_output=True, text=True, timeout=180, cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return " ".join(proc.stderr.split())

    first = showcase()
    assert "every acknowledged message came back" in first and "earlier runs" not in first
    second = showcase()
    assert "every acknowledged message came back" in second, second[-2000:]
    assert "(and 2,000 of earlier runs)" in second, second[-2000:]


def test_readme_python_example_runs_as_written(tmp_path):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S)
    assert code is not None, "the README lost its Python example"
    with LocalCluster(tmp_path / "c", nodes=3, groups=3) as cluster:
        cluster.wait_ready(timeout=60)
        source = code.group(1).replace('"127.0.0.1:7176"', repr(cluster.namesrv_addr))
        assert repr(cluster.namesrv_addr) in source
        script = tmp_path / "example.py"
        script.write_text(source)
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "customer-7 b'order 1'" in proc.stdout
