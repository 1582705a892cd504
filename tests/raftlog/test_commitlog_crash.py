"""Kill -9 a process that appends and syncs; every index it called durable must survive.

Run as ``python -m tests.raftlog.test_commitlog_crash <dir>`` the module is the writer: it
reopens the log (so each kill also lands in the middle of a recovery now and then),
appends batches of entries whose content is a function of their index, calls `sync()`
after each batch and prints the durable index. The test SIGKILLs it after a random
delay, reopens the log itself and checks it.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftlog.commitlog import CommitLog
from raftlog.types import Entry, EntryType
from tests.paths import REPO_ROOT as ROOT

pytestmark = pytest.mark.live

SEG = 1 << 20


def entry_for(index: int) -> Entry:
    """The one possible content of entry `index` (term grows every 500 entries)."""
    size = (index * 7919) % 6000
    seed = hashlib.blake2b(index.to_bytes(8, "little"), digest_size=32).digest()
    return Entry(index, 1 + index // 500, EntryType(index % 4), (seed * (size // 32 + 1))[:size])


def writer(path: str) -> None:
    rng = random.Random(os.getpid())
    log = CommitLog.open(path, segment_size=SEG)
    print(f"open {log.last_index()}", flush=True)
    i = log.last_index() + 1
    while True:
        n = rng.randint(1, 40)
        log.append([entry_for(j) for j in range(i, i + n)])
        i += n
        print(log.sync(), flush=True)


def test_sigkill_during_appends(tmp_path: Path) -> None:
    path = tmp_path / "group"
    rng = random.Random(1234)
    # kills land 20-200 ms into the append loop; two more land during interpreter start
    # or recovery
    delays: list[float | None] = [0.02 + 0.18 * k / 11 for k in range(12)]
    rng.shuffle(delays)
    delays[3:3] = [None]
    delays[9:9] = [None]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    progressed = 0
    for delay in delays:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.raftlog.test_commitlog_crash", str(path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        head = b""
        if delay is None:
            time.sleep(rng.uniform(0.01, 0.15))
        else:
            head = proc.stdout.readline()  # recovery done, the loop starts
            assert head.startswith(b"open "), proc.stderr.read() if proc.stderr else b""
            time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate(timeout=10)
        out = head + rest
        assert proc.returncode == -signal.SIGKILL, err.decode()
        lines = out.decode().splitlines()
        # a line cut by the kill is not a claim
        complete = lines if out.endswith(b"\n") else lines[:-1]
        durable = max((int(x) for x in complete if x.isdigit()), default=0)
        progressed += durable > 0

        with CommitLog.open(path, segment_size=SEG) as log:
            last = log.last_index()
            assert last >= durable, f"lost durable entries: {last} < {durable}"
            assert log.first_index() == 1
            # a contiguous prefix with exactly the bytes that were written
            i = 1
            while i <= last:
                got = log.entries(i, last + 1, 4 << 20)
                assert got == [entry_for(j) for j in range(i, i + len(got))]
                i += len(got)
            assert log.verify() == []
            # and the log keeps going
            log.append([entry_for(last + 1), entry_for(last + 2)])
            assert log.sync() == last + 2
    assert progressed >= 10


if __name__ == "__main__":
    writer(sys.argv[1])
