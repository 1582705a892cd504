"""bench.snapshot: both columns are measured and describe the same state."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import snapshot


def _in_git() -> bool:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.skipif(not _in_git(), reason="needs a git checkout to load a revision")
@pytest.mark.live
def test_before_and_after_hold_the_same_messages(tmp_path: Path) -> None:
    r = snapshot.run(messages=2_500, batch=1000, body=10, queues=3, repeat=1, before="HEAD",
                     workdir=str(tmp_path))
    assert r["before_rev"] == r["after_rev"]
    before, after = r["before"], r["after"]
    # the same code at the same revision: the same bytes
    assert before["snapshot_bytes"] == after["snapshot_bytes"]
    # no queue has sealed a chunk yet: its ConsumeQueue records (28 bytes) are inline
    assert 28 <= after["bytes_per_message"] < 29 and after["chunk_file_bytes"] == 0
    assert set(after) == {"build_s", "snapshot_bytes", "bytes_per_message", "detach_s",
                          "serialise_s", "snapshot_s", "first_snapshot_s", "chunk_file_bytes",
                          "restore_s", "section_bytes"}
    # the ConsumeQueue records are the queues part's section, and nearly all of it
    assert after["section_bytes"]["queues"] > 0.99 * after["snapshot_bytes"]
    assert list(tmp_path.iterdir()) == []  # the chunk files went with the run


@pytest.mark.skipif(not _in_git(), reason="needs a git checkout to load a revision")
@pytest.mark.live
def test_sealed_chunks_leave_the_snapshot_for_files(tmp_path: Path) -> None:
    r = snapshot.run(messages=20_000, batch=100, body=10, queues=2, repeat=1, before=None,
                     workdir=str(tmp_path), chunk_records=1000)
    after = r["after"]
    assert after["chunk_file_bytes"] == 20 * (1000 * 28 + 1)  # every record (and no key)
    assert after["snapshot_bytes"] < 2 * 2 * 1000 * 28 // 10  # only refs and open tails


def test_bad_sizes_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        snapshot.main(["--messages", "0"])
    assert "--messages" in capsys.readouterr().err
