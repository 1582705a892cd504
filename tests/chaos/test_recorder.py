"""The history recorder writes lines the checker's parsers read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.histories import parse_faults, parse_jsonl
from chaos.recorder import Recorder


def test_recorded_history_parses_back(tmp_path: Path) -> None:
    ticks = iter(range(100))
    path = tmp_path / "history.jsonl"
    with Recorder(path, clock=lambda: float(next(ticks))) as rec:
        rec.invoke(0, "append", "t/0", "m-1")
        rec.fault_start("kill", {"nodes": [2]})
        rec.complete(0, "ok", "append", "t/0", {"offset": 0})
        rec.invoke(1, "read", "t/0", {"offset": 0, "n": 4})
        rec.complete(1, "ok", "read", "t/0", ["m-1"])
        rec.fault_end("kill")
        rec.invoke(0, "append", "t/0", "m-2")  # never completed: unknown
        with pytest.raises(ValueError, match="completion type"):
            rec.complete(0, "maybe", "append", "t/0")
    records = parse_jsonl(path)
    assert [(r.f, r.status, r.call, r.return_) for r in records] == [
        ("append", "ok", 0.0, 2.0),
        ("read", "ok", 3.0, 4.0),
        ("append", "info", 6.0, float("inf")),
    ]
    assert [(f.f, f.start, f.end) for f in parse_faults(path)] == [("kill", 1.0, 5.0)]
    assert rec.counts == {("kill", "fault"): 1, ("append", "ok"): 1, ("read", "ok"): 1}
