"""The participant's verdict on prepared data no marker came for (`orphan_verdict`),
from its coordinator's TX_STATUS answer, and when it asks again (`orphan_retry`): pure,
so every case is checked here."""

from __future__ import annotations

from typing import Any

import pytest

from broker.duties.transactions import ORPHAN_RETRY_MAX_MS, orphan_retry, orphan_verdict

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


@pytest.mark.parametrize("data, st", [
    ((2, 6), status(2, 5, "complete_commit")),  # its TX_ADD never applied
    ((2, 6), status(2, 5, "ongoing")),
    ((2, 7), status(2, 5, "complete_abort")),
])
def test_a_hanging_transaction_is_aborted_once_stale(data: tuple[int, int],
                                                     st: dict[str, Any]) -> None:
    """Issue 25 #2: data of a transaction its coordinator never started (its TX_ADD
    never applied, the producer gone) waited for ever, pinning the log. Prepared longer
    ago than the longest transaction timeout, it is aborted at the coordinator's epoch."""
    assert orphan_verdict(*data, st) is None  # not yet: its TX_ADD may still come
    assert orphan_verdict(*data, st, stale=True) == (False, 2)


def test_stale_changes_nothing_the_coordinator_answers() -> None:
    assert orphan_verdict(2, 5, status(2, 5, "complete_commit"), stale=True) == (True, 2)
    assert orphan_verdict(2, 5, status(2, 5, "ongoing"), stale=True) is None  # its timeout
    assert orphan_verdict(2, 5, status(2, 6, "ongoing", [[2, 5, "prepare_commit"]]),
                          stale=True) is None


def test_an_unresolved_orphan_is_asked_about_less_and_less_often() -> None:
    """Issue 25 #2/#6: every prepared transaction older than `tx_orphan_ms` asked its
    coordinator at every tick (5 Hz) for as long as it lasted. The delay between asks
    doubles, from 1 s to ORPHAN_RETRY_MAX_MS."""
    wait, now, delays = None, 0, []
    for _ in range(9):
        wait = orphan_retry(wait, now)
        delays.append(wait[1])
        assert wait[0] == now + wait[1]
        now = wait[0]
    assert delays == [1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]
    assert ORPHAN_RETRY_MAX_MS == 60_000
