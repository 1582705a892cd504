"""The saved fuzzing corpus, replayed: every input `make fuzz` kept (the ones that reached
new code, and every one that once found a bug, e.g. `commitlog/regression-*`) must still
meet its target's contract: only the documented errors for bad input, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS, seeds

CORPUS = Path(__file__).resolve().parent / "corpus"


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_saved_corpus_replays_cleanly(name: str) -> None:
    files = sorted((CORPUS / name).iterdir()) if (CORPUS / name).is_dir() else []
    target = TARGETS[name]
    for data in seeds(name):
        target(data)
    for f in files:
        target(f.read_bytes())  # a failure names the target; the file is in the trace


def test_the_bugs_fuzzing_found_stay_found() -> None:
    """The inputs that crashed a target before its fix are in the corpus."""
    assert (CORPUS / "commitlog" / "regression-short-middle-segment").is_file()
