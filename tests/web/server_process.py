"""A `raftmq console` (or `raftmq mqtt`) process for tests: the benchmarks' own starter
(`bench.frontend.serving`), with its stderr kept in the test's log file and without the
test process's RAFTMQ_USER/RAFTMQ_PASSWORD, so a gateway never logs in as the test does."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.frontend import serving as serving_process

__all__ = ["serving"]


@contextmanager
def serving(command: str, namesrv: str, log: Path, *args: str,
            env: dict[str, str] | None = None) -> Iterator[str]:
    """`raftmq COMMAND` serving `namesrv`'s cluster; yields the address it printed."""
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("RAFTMQ_USER", "RAFTMQ_PASSWORD")}
    full_env.update(env or {})
    with serving_process(command, namesrv, *args, env=full_env, log=log) as address:
        yield address
