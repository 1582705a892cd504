"""Every Python block in docs/*.md runs as written (as its own program) against a live
cluster, and every `sh` block line by line (each `raftmq` command must exit 0), so the
guides cannot drift from the SDK and the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.protocol import DEFAULT_NAMESRV
from chaos.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = [
    pytest.param(code, id=f"{path.name}-{i}")
    for path in sorted((ROOT / "docs").glob("*.md"))
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]


SHELL = [
    pytest.param(code, id=f"{path.name}-sh{i}")
    for path in sorted((ROOT / "docs").glob("*.md"))
    for i, code in enumerate(re.findall(r"```sh\n(.*?)```", path.read_text(), re.S))
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("docs"), nodes=3, groups=3, tick_ms=50) as c:
        c.wait_ready(timeout=60)
        yield c


def test_the_docs_have_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.live
@pytest.mark.parametrize("code", BLOCKS)
def test_doc_example_runs(cluster: LocalCluster, code: str, tmp_path: Path) -> None:
    assert repr(DEFAULT_NAMESRV).replace("'", '"') in code, "examples use the default address"
    script = tmp_path / "example.py"
    script.write_text(code.replace(f'"{DEFAULT_NAMESRV}"', repr(cluster.namesrv_addr)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.live
@pytest.mark.parametrize("code", SHELL)
def test_doc_commands_run(cluster: LocalCluster, code: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTMQ_NAMESRV", "NAMESRV_ADDR")}
    env["NAMESRV_ADDR"] = cluster.namesrv_addr
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for line in code.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assert "raftmq " in line, line
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path, env=env)
        assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
