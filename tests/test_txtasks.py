"""The participant's verdict on prepared data no marker came for (`orphan_verdict`),
from its coordinator's TX_STATUS answer: pure, so every case is checked here."""

from __future__ import annotations

from typing import Any

import pytest

from broker.txtasks import orphan_verdict

TOP = (1 << 63) - 1


def status(epoch: int, n: int, state: str, unfinished: list[Any] | None = None) -> dict[str, Any]:
    return {"epoch": epoch, "n": n, "state": state, "participants": [], "timeout_ms": 0,
            "unfinished": unfinished or []}


@pytest.mark.parametrize("data, st, verdict", [
    # the coordinator's own transaction: its outcome once complete, else wait for markers
    ((2, 5), status(2, 5, "complete_commit"), (True, 2)),
    ((2, 5), status(2, 5, "complete_abort"), (False, 2)),
    ((2, 5), status(2, 5, "ongoing"), None),
    ((2, 5), status(2, 5, "prepare_commit"), None),
    # decided, markers still going out while the next one runs: they will come
    ((2, 5), status(2, 6, "ongoing", [[2, 5, "prepare_commit"]]), None),
    # the coordinator moved past it: aborted, fenced at the coordinator's epoch
    ((2, 5), status(3, 0, "empty"), (False, 3)),
    ((2, 5), status(2, 7, "ongoing"), (False, 2)),
    # not started at the coordinator yet (its TX_ADD may still come)
    ((2, 5), status(2, 4, "complete_commit"), None),
    # issue 24 #3: an epoch the coordinator never granted is aborted whatever it is, and
    # the marker's fence is the coordinator's epoch, not the made-up one
    ((TOP, 0), status(2, 5, "ongoing"), (False, 2)),
    ((3, 0), status(2, 5, "complete_commit"), (False, 2)),
    ((0, 0), status(-1, -1, "empty"), (False, 0)),  # an id the coordinator never knew
])
def test_orphan_verdict(data: tuple[int, int], st: dict[str, Any],
                        verdict: tuple[bool, int] | None) -> None:
    assert orphan_verdict(*data, st) == verdict
