"""``raftmq chaos check`` exit codes and outputs, called directly and as a module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.cli import check_main

REPO = Path(__file__).resolve().parents[1]


def _write(path: Path, entries: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def _queue_history(second_offset: int) -> list[dict]:
    return [
        {"process": 0, "type": "invoke", "f": "append", "key": "q", "value": "a", "time": 0.0},
        {
            "process": 0,
            "type": "ok",
            "f": "append",
            "key": "q",
            "value": {"offset": 0},
            "time": 1.0,
        },
        {"process": 0, "type": "invoke", "f": "append", "key": "q", "value": "b", "time": 2.0},
        {
            "process": 0,
            "type": "ok",
            "f": "append",
            "key": "q",
            "value": {"offset": second_offset},
            "time": 3.0,
        },
        {
            "process": 1,
            "type": "invoke",
            "f": "read",
            "key": "q",
            "value": {"offset": 0, "n": 5},
            "time": 4.0,
        },
        {"process": 1, "type": "ok", "f": "read", "key": "q", "value": ["a", "b"], "time": 5.0},
    ]


def _hard_register_history(writers: int = 18) -> list[dict]:
    entries = [
        {"process": i, "type": "invoke", "f": "write", "value": i, "time": 0.0}
        for i in range(writers)
    ]
    entries += [
        {"process": 99, "type": "invoke", "f": "read", "time": 1.0},
        {"process": 99, "type": "ok", "f": "read", "value": 12345, "time": 2.0},
    ]
    return entries


def test_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path / "good.jsonl", _queue_history(1))
    bad = _write(tmp_path / "bad.jsonl", _queue_history(5))
    hard = _write(tmp_path / "hard.jsonl", _hard_register_history())
    assert check_main(["--model", "queue-log", "--format", "jsonl", str(good)]) == 0
    assert "linearizable" in capsys.readouterr().out
    assert check_main(["--model", "queue-log", "--format", "jsonl", str(bad)]) == 1
    assert "append('q', 'b') -> 5" in capsys.readouterr().out
    args = ["--model", "cas-register", "--format", "jsonl", str(hard), "--timeout", "0.0001"]
    assert check_main(args) == 2
    capsys.readouterr()
    assert check_main(["--model", "queue-log", "--format", "jsonl", str(tmp_path / "missing")]) == 3
    assert check_main(["--model", "nope", "--format", "jsonl", str(good)]) == 3
    assert check_main(["--help"]) == 0


def test_json_output_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _write(tmp_path / "bad.jsonl", _queue_history(5))
    report = tmp_path / "out.html"
    code = check_main(
        ["--model", "queue-log", "--format", "jsonl", str(bad), "--json", "--report", str(report)]
    )
    assert code == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "not-linearizable"
    assert summary["operations"] == 3 and summary["partitions"] == 1
    assert summary["first_failure"]["key"] == "q"
    assert summary["first_failure"]["operation"]["description"] == "append('q', 'b') -> 5"
    assert summary["accounting"]["queues"]["q"]["ack_mismatches"]
    assert isinstance(summary["elapsed"], float)
    assert "append(&#x27;q&#x27;, &#x27;b&#x27;) -&gt; 5" in report.read_text()


@pytest.mark.live
def test_module_entry_point(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.jsonl", _queue_history(1))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "chaos.cli",
            "--model",
            "queue-log",
            "--format",
            "jsonl",
            str(good),
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "linearizable"
