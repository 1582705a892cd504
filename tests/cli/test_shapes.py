"""The shapes the admin commands share (`raftmq group`, `raftmq tx`): their tables, the
INCOMPLETE exit, the usage exit. No cluster needed."""

from __future__ import annotations

import pytest
from rich.console import Console

from raftmq.client import IncompleteError
from raftmq.commands import EXIT_FAILURE, EXIT_USAGE, incomplete_exit, make_table
from raftmq.commands.group import main as group_main
from raftmq.commands.tx import HALF_COLS, _table
from raftmq.commands.tx import main as tx_main


def render(table: object, width: int) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False)
    console.print(table)
    return console.export_text().splitlines()


def test_a_table_shows_nothing_as_a_dash_and_never_cuts_an_id() -> None:
    txid = "0123456789abcdef0123456789abcdef"
    long = "a note much longer than the room left for it " * 2
    lines = render(make_table(("id", "queue", "note"), [(txid, 7, None), ("x", 12, ["a", "b"]),
                                                      ("y", 1, long)],
                              right=("queue",), whole=("id",)), 60)
    assert any(txid in line for line in lines), lines  # narrower than the row: still whole
    text = "\n".join(lines)
    assert "-" in text and "a,b" in text
    # the same through `raftmq tx`'s own column lists
    rows = [{"txid": txid, "g": "g1", "producer_group": long, "queue": 0, "prepared_ms": 0}]
    assert any(txid in line for line in render(_table("halves", rows, HALF_COLS), 60))


def test_numbers_are_right_justified() -> None:
    lines = render(make_table(("topic", "lag"), [("t", 5), ("t", 12345)], right=("lag",)), 40)
    five = next(line for line in lines if " 5 " in line or line.rstrip().endswith("5 │"))
    big = next(line for line in lines if "12345" in line)
    assert five.index("5") == big.index("12345") + 4, lines


def test_an_incomplete_read_fails_after_showing_the_rest(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert incomplete_exit("raftmq tx", None) == 0
    exc = IncompleteError("g2 could not be read", unreadable=["g2"], partial={})
    assert incomplete_exit("raftmq tx", exc) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.startswith("raftmq tx: INCOMPLETE: g2 could not be read;"), err


def test_no_subcommand_is_a_usage_error_naming_the_choices(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert group_main([]) == EXIT_USAGE
    assert "raftmq group: choose list, describe, reset-offsets, delete or locks" in capsys.readouterr().err
    assert tx_main([]) == EXIT_USAGE
    assert "raftmq tx: choose list, show, commit or rollback" in capsys.readouterr().err
