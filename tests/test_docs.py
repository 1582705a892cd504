"""Every Python block in docs/*.md runs as written (as its own program) against a live
cluster, so the guides cannot drift from the SDK."""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("docs"), nodes=3, groups=3, tick_ms=50) as c:
        c.wait_ready(timeout=60)
        yield c


def test_the_docs_have_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("code", BLOCKS)
def test_doc_example_runs(cluster: LocalCluster, code: str, tmp_path: Path) -> None:
    assert repr(DEFAULT_NAMESRV).replace("'", '"') in code, "examples use the default address"
    script = tmp_path / "example.py"
    script.write_text(code.replace(f'"{DEFAULT_NAMESRV}"', repr(cluster.namesrv_addr)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
