"""How the checkers that read a whole history entry by entry are fed (`chaos.txcheck`,
`chaos.authcheck`): each is an object with ``line(entry, where)`` and ``result()``, so
the run's analysis can feed every checker from its one pass over the history, and
each checker's own ``check_records``/``check_lines``/``check_file`` is the same few
lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from .histories import is_process


class EntryChecker(Protocol):
    def line(self, entry: Any, where: str) -> None:
        """Take one decoded history entry; `where` names it in a problem."""

    def result(self) -> dict[str, Any]:
        """The verdict over everything taken, as a JSON-able dict."""


def entry_head(entry: Any) -> tuple[int | str, Any, Any] | None:
    """(process, type, f) of a history entry a checker reads, or None for one that is no
    process's operation (a checker skips it; `chaos.histories.parse_jsonl` refuses it)."""
    if not isinstance(entry, dict):
        return None
    process = entry.get("process")
    if not is_process(process):
        return None
    return process, entry.get("type"), entry.get("f")


def check_records(checker: EntryChecker, entries: Iterable[Any]) -> dict[str, Any]:
    """`checker`'s verdict over decoded history entries, in history order."""
    for number, entry in enumerate(entries, start=1):
        checker.line(entry, f"entry {number}")
    return checker.result()


def check_lines(checker: EntryChecker, lines: Iterable[str],
                names: Iterable[str] | None = None) -> dict[str, Any]:
    """`checker`'s verdict over the JSON lines of a history; lines that are not JSON are
    skipped (the queue analysis reports them). With `names` (the operations the checker
    reads), a line naming none of them is not decoded, so a long queue history costs a
    substring scan."""
    quoted = None if names is None else tuple(f'"{f}"' for f in sorted(names))
    for number, line in enumerate(lines, start=1):
        entry = _decoded(line, quoted)
        if entry is not None:
            checker.line(entry, f"line {number}")
    return checker.result()


def check_file(checker: EntryChecker, path: str | Path,
               names: Iterable[str] | None = None) -> dict[str, Any]:
    """`check_lines` over a history file, read as it is walked."""
    with Path(path).open(encoding="utf-8") as lines:
        return check_lines(checker, lines, names)


def _decoded(line: str, quoted: tuple[str, ...] | None) -> Any:
    text = line.strip()
    if not text or (quoted is not None and not any(name in text for name in quoted)):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def feed(checkers: Iterable[EntryChecker], numbered: Iterable[tuple[int, Any]]) -> None:
    """Hand each (line number, entry) to every checker."""
    fed = list(checkers)
    for number, entry in numbered:
        where = f"line {number}"
        for checker in fed:
            checker.line(entry, where)
