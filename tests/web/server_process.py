"""A `raftmq console` (or `raftmq mqtt`) process for tests: started on a free port of
loopback, its address read from the line it prints, stopped at the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["serving"]


@contextmanager
def serving(command: str, namesrv: str, log: Path, *args: str,
            env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `raftmq COMMAND --namesrv NAMESRV --listen 127.0.0.1:0 ARGS...`; yields the
    address it printed (`http://host:port` for the console, `host:port` for mqtt)."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("RAFTMQ_USER", "RAFTMQ_PASSWORD")}
    full_env.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "raftmq", command, "--namesrv", namesrv,
         "--listen", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE, stderr=open(log, "wb"), env=full_env, text=True)
    assert proc.stdout is not None
    found: list[str] = []
    done = threading.Event()

    def read_first() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"(?:console|mqtt): (\S+?)/?\s", line + " ")
            if m:
                found.append(m.group(1))
                break
        done.set()

    threading.Thread(target=read_first, daemon=True).start()
    try:
        if not done.wait(60) or not found:
            raise RuntimeError(f"raftmq {command} did not start; see {log}:\n"
                               f"{log.read_text()[-3000:]}")
        yield found[0]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
