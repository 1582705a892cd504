"""Queue accounting: each anomaly on its own small history."""

from __future__ import annotations

import json
from typing import Any

from chaos.accounting import ERROR_KINDS, account_queue_history
from chaos.histories import parse_jsonl


class _History:
    """Builds JSON-lines histories one operation at a time (sequential per process)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.clock = 0.0

    def _emit(self, **entry: Any) -> None:
        self.clock += 1.0
        self.lines.append(json.dumps({**entry, "time": self.clock}))

    def append(
        self, p: int, msg: str, result: Any = None, *, q: str = "q", status: str = "ok"
    ) -> None:
        self._emit(process=p, type="invoke", f="append", key=q, value=msg)
        self._emit(
            process=p, type=status, f="append", key=q, value=result if status == "ok" else None
        )

    def read(self, p: int, offset: int, n: int, msgs: list[str], *, q: str = "q") -> None:
        self._emit(process=p, type="invoke", f="read", key=q, value={"offset": offset, "n": n})
        self._emit(process=p, type="ok", f="read", key=q, value=msgs)

    def account(self) -> dict[str, Any]:
        result = account_queue_history(parse_jsonl(self.lines))
        json.dumps(result)  # must be JSON-able
        return result


def _errors(result: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in result["totals"].items() if k in ERROR_KINDS and v}


def test_clean_history_is_valid_and_drained() -> None:
    h = _History()
    h.append(0, "a", {"offset": 0})
    h.append(0, "b", 1)
    h.read(1, 0, 1, ["a"])
    h.read(1, 1, 5, ["b"])
    result = h.account()
    assert result["valid"] and not _errors(result)
    q = result["queues"]["q"]
    assert q["drained"] and q["acknowledged"] == 2 and q["read"] == 2


def test_lost_when_drained_unread_otherwise() -> None:
    h = _History()
    h.append(0, "a", 0)
    h.append(0, "b", 1)
    h.read(1, 0, 5, ["a"])  # the final drain stops after one message
    result = h.account()
    assert result["queues"]["q"]["lost"] == ["b"]
    assert not result["valid"]

    h = _History()
    h.append(0, "a", 0)
    h.append(0, "b", 1)
    h.read(1, 0, 1, ["a"])  # a full batch: the queue was never drained
    result = h.account()
    assert result["valid"]
    assert result["queues"]["q"]["unread"] == 1 and result["queues"]["q"]["lost"] == []


def test_lost_when_its_offset_holds_another_message() -> None:
    h = _History()
    h.append(0, "a", 0)
    h.append(1, "x", status="info")
    h.read(2, 0, 1, ["x"])
    q = h.account()["queues"]["q"]
    assert q["lost"] == ["a"] and q["recovered"] == ["x"]


def test_duplicated_unexpected_failed_and_conflicts() -> None:
    h = _History()
    h.append(0, "a", 0)
    h.append(0, "f", status="fail")
    h.read(1, 0, 3, ["a", "a", "f"])
    h.read(1, 3, 1, ["z"])
    h.read(2, 0, 1, ["b"])
    q = h.account()["queues"]["q"]
    assert q["duplicated"] == {"a": [0, 1]}
    assert q["unexpected"] == ["b", "z"]
    assert q["failed_but_read"] == ["f"]
    assert q["offset_conflicts"] == [{"offset": 0, "messages": ["a", "b"]}]


def test_ack_mismatch_and_conflict() -> None:
    h = _History()
    h.append(0, "a", 0)
    h.append(1, "b", 0)
    h.read(2, 0, 2, ["b", "a"])
    q = h.account()["queues"]["q"]
    assert q["ack_conflicts"] == [{"offset": 0, "messages": ["a", "b"]}]
    assert q["ack_mismatches"] == [{"message": "a", "acked": 0, "read_at": [1]}]


def test_reordered_sends_of_one_producer() -> None:
    h = _History()
    h.append(0, "a", 1)
    h.append(0, "b", 0)
    h.read(1, 0, 2, ["b", "a"])
    q = h.account()["queues"]["q"]
    assert q["reordered"] == [
        {"process": 0, "earlier": "a", "earlier_offset": 1, "later": "b", "later_offset": 0}
    ]
    # different producers may interleave freely
    h = _History()
    h.append(0, "a", 1)
    h.append(1, "b", 0)
    h.read(2, 0, 2, ["b", "a"])
    assert h.account()["valid"]


def test_queues_accounted_separately() -> None:
    h = _History()
    h.append(0, "a", 0, q="q1")
    h.append(0, "a", 0, q="q2")
    h.read(1, 0, 5, ["a"], q="q1")
    result = h.account()
    assert set(result["queues"]) == {"q1", "q2"}
    assert result["totals"]["attempted"] == 2 and result["valid"]
