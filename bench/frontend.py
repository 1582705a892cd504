"""A `raftmq console` (HTTP API) or `raftmq mqtt` process for a benchmark: started on a
free loopback port for the cluster being measured, its address read from the line it
prints, stopped on the way out. A process of its own, as in a deployment: the gateway's
work is not charged to the benchmark's client loop, nor the other way round."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["gateway", "serving"]

START_TIMEOUT = 60.0


@contextmanager
def serving(command: str, namesrv: str, *args: str, env: dict[str, str] | None = None,
            log: Path | None = None) -> Iterator[str]:
    """Run `raftmq COMMAND --namesrv NAMESRV --listen 127.0.0.1:0 ARGS...` with `env` (this
    process's environment by default), its stderr to `log` (a temporary file by default);
    yields the address it printed (`http://host:port` for console, `host:port` for mqtt)."""
    with (log.open("w+b") if log is not None else tempfile.TemporaryFile()) as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raftmq", command, "--namesrv", namesrv,
             "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE, stderr=err,
            env=dict(os.environ) if env is None else env, text=True)
        found: list[str] = []
        done = threading.Event()

        def first_address() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                m = re.search(r"(?:console|mqtt): (\S+?)/?\s", line + " ")
                if m:
                    found.append(m.group(1))
                    break
            done.set()

        threading.Thread(target=first_address, daemon=True).start()
        try:
            if not done.wait(START_TIMEOUT) or not found:
                err.seek(0)
                tail = err.read().decode(errors="replace")[-3000:]
                where = f" (its log: {log})" if log is not None else ""
                raise RuntimeError(f"raftmq {command} did not start{where}:\n{tail}")
            yield found[0]
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def gateway(command: str, given: str | None, namesrv: str) -> Iterator[str]:
    """The gateway a benchmark drives: the address given on its command line, or a
    `raftmq COMMAND` started here for `namesrv`'s cluster."""
    if given:
        yield given
        return
    with serving(command, namesrv) as address:
        yield address
