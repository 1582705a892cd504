"""Every Python block in docs/*.md runs as written (as its own program) against a live
cluster, and every `sh` block line by line (each `raftmq` command must exit 0), so the
guides cannot drift from the SDK and the CLI.

A block fenced as ```toml NAME is a file the page shows: it is written as NAME where the
page's `sh` blocks run. A `sh` line ending in `&` runs in the background (its output to a
log) until the block's other lines are done, then it is stopped. A `curl` line reaches
the HTTP API of a `raftmq console` served for the cluster (the page's
http://127.0.0.1:7180, where `raftmq dev` serves it, becomes that address), and a Python
block that connects to MQTT at 127.0.0.1:7183 reaches a `raftmq mqtt` gateway of the
cluster the same way."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.localcluster import LocalCluster
from tests.paths import REPO_ROOT as ROOT
from tests.web.server_process import serving
from wire.protocol import DEFAULT_NAMESRV

BLOCKS = [
    pytest.param(code, id=f"{path.name}-{i}")
    for path in sorted((ROOT / "docs").glob("*.md"))
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(), re.S))
]


def _files(text: str) -> dict[str, str]:
    """The ```toml NAME blocks of a page: NAME -> content."""
    return dict(re.findall(r"```toml ([\w.-]+)\n(.*?)```", text, re.S))


SHELL = [
    pytest.param(code, _files(path.read_text()), id=f"{path.name}-sh{i}")
    for path in sorted((ROOT / "docs").glob("*.md"))
    for i, code in enumerate(re.findall(r"```sh\n(.*?)```", path.read_text(), re.S))
]
STOP_WAIT = 15.0  # seconds a background line gets to exit on SIGTERM
HTTP_API = "http://127.0.0.1:7180"  # where the pages' examples find `raftmq dev`'s API
MQTT_AT = '"127.0.0.1", 7183'  # and its MQTT gateway (paho's connect arguments)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("docs"), nodes=3, groups=3, tick_ms=50) as c:
        c.wait_ready(timeout=60)
        yield c


@pytest.fixture(scope="module")
def frontends(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[dict[str, str]]:
    """The HTTP API and the MQTT gateway of the cluster, as the pages' addresses map."""
    logs = tmp_path_factory.mktemp("docs-frontends")
    with serving("console", cluster.namesrv_addr, logs / "console.log") as url, \
            serving("mqtt", cluster.namesrv_addr, logs / "mqtt.log") as mqtt:
        host, _, port = mqtt.rpartition(":")
        yield {HTTP_API: url, MQTT_AT: f'"{host}", {port}'}


def _served(code: str, frontends: dict[str, str]) -> str:
    for page_address, served_address in frontends.items():
        code = code.replace(page_address, served_address)
    return code


def test_the_docs_have_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("path", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_block_is_run_or_written(path: Path) -> None:
    """A block of any other kind would be shown to readers and tested by nobody."""
    fences = re.findall(r"^```(.*)$", path.read_text(), re.M)
    openings = fences[0::2]
    assert len(fences) % 2 == 0 and fences[1::2] == [""] * len(openings), fences
    for info in openings:
        assert info in ("python", "sh") or re.fullmatch(r"toml [\w.-]+", info), info


@pytest.mark.live
@pytest.mark.parametrize("code", BLOCKS)
def test_doc_example_runs(cluster: LocalCluster, code: str, tmp_path: Path,
                          request: pytest.FixtureRequest) -> None:
    assert repr(DEFAULT_NAMESRV).replace("'", '"') in code, "examples use the default address"
    if MQTT_AT in code or HTTP_API in code:
        code = _served(code, request.getfixturevalue("frontends"))
    script = tmp_path / "example.py"
    script.write_text(code.replace(f'"{DEFAULT_NAMESRV}"', repr(cluster.namesrv_addr)))
    # a Spark example starts a JVM: minutes on a 2-core machine running other tests
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End a background line: its own process group (it was started as one), by id."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_WAIT)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.mark.live
@pytest.mark.parametrize(("code", "files"), SHELL)
def test_doc_commands_run(
    cluster: LocalCluster, code: str, files: dict[str, str], tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if HTTP_API in code:
        code = _served(code, request.getfixturevalue("frontends"))
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTMQ_NAMESRV", "NAMESRV_ADDR")}
    env["NAMESRV_ADDR"] = cluster.namesrv_addr
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    background: list[subprocess.Popen[bytes]] = []
    try:
        for i, line in enumerate(code.splitlines()):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            assert "raftmq " in line or line.startswith("curl "), line
            if line.rstrip().endswith("&"):
                with (tmp_path / f"background-{i}.log").open("wb") as log:
                    background.append(subprocess.Popen(
                        ["bash", "-c", line.rstrip()[:-1]], stdout=log, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, cwd=tmp_path, env=env, start_new_session=True))
                continue
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True,
                                  text=True, timeout=120, cwd=tmp_path, env=env)
            assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
        for proc in background:  # each kept running until the block was done
            assert proc.poll() is None, (proc.args, proc.returncode)
    finally:
        for proc in reversed(background):
            _stop(proc)
