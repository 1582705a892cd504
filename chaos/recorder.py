"""Writes a chaos run's history as JSON lines while the run goes on.

Every line is written and flushed as it happens, so a run that dies part-way still leaves
a history that `chaos.histories.parse_jsonl` reads (operations left open count as
unknown). Times are `time.monotonic()` seconds, one clock for workload and nemesis, since
both run in the harness process. The format is described in `chaos.histories`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

from .histories import NEMESIS

__all__ = ["Recorder"]

_TYPES = ("ok", "fail", "info")


class Recorder:
    """Appends invoke/ok/fail/info lines to a history file (one writer per file).

    Not thread-safe: call it from the harness's event loop only (trio tasks interleave
    at awaits, never inside a call).
    """

    def __init__(self, path: str | Path, *, clock: Any = time.monotonic) -> None:
        self.path = Path(path)
        self._clock = clock
        self._out: IO[str] = self.path.open("a", encoding="utf-8")
        self.counts: dict[tuple[str, str], int] = {}

    def _write(self, entry: dict[str, Any]) -> float:
        at = self._clock()
        entry["time"] = at
        self._out.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._out.flush()
        return at

    def invoke(self, process: int | str, f: str, key: Any, value: Any) -> float:
        """Record that `process` starts operation `f`; returns the time written."""
        return self._write({"process": process, "type": "invoke", "f": f, "key": key, "value": value})

    def complete(self, process: int | str, kind: str, f: str, key: Any, value: Any = None) -> float:
        """Record the outcome of `process`'s open operation: `kind` is ok, fail or info."""
        if kind not in _TYPES:
            raise ValueError(f"completion type must be one of {_TYPES}, got {kind!r}")
        self.counts[(f, kind)] = self.counts.get((f, kind), 0) + 1
        return self._write({"process": process, "type": kind, "f": f, "key": key, "value": value})

    def attempt(self, process: int | str, f: str, key: Any, value: Any) -> float:
        """Record that a request of `process`'s open operation (same `f`, `key` and
        invoke `value`) is about to be sent: it may take effect, once more."""
        self.counts[(f, "attempt")] = self.counts.get((f, "attempt"), 0) + 1
        return self._write({"process": process, "type": "attempt", "f": f, "key": key,
                            "value": value})

    def forward(self, entry: dict[str, Any]) -> None:
        """Write a line another process recorded (`chaos.pipeline`'s worker), at the time
        it gave (same machine, same monotonic clock); without one, now."""
        kind, f = str(entry.get("type")), str(entry.get("f"))
        if kind in _TYPES:
            self.counts[(f, kind)] = self.counts.get((f, kind), 0) + 1
        if not isinstance(entry.get("time"), (int, float)):
            self._write(dict(entry))
            return
        self._out.write(json.dumps(entry, separators=(",", ":")) + "\n")
        self._out.flush()

    def fault_start(self, f: str, value: Any = None) -> float:
        """A nemesis fault begins (closed by `fault_end` with the same `f`)."""
        self.counts[(f, "fault")] = self.counts.get((f, "fault"), 0) + 1
        return self._write({"process": NEMESIS, "type": "invoke", "f": f, "value": value})

    def fault_end(self, f: str, value: Any = None) -> float:
        """The earliest open fault named `f` is healed; `value` (if given) replaces its details."""
        entry: dict[str, Any] = {"process": NEMESIS, "type": "info", "f": f}
        if value is not None:
            entry["value"] = value
        return self._write(entry)

    def close(self) -> None:
        self._out.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
