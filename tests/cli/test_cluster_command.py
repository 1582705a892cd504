"""`raftmq cluster` usage errors: they exit 2 before any request is made."""

from __future__ import annotations

import pytest

from raftmq.commands.cluster import main


def test_no_subcommand_says_what_to_choose(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "replace-replica" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["transfer-leader", "g0"],
    ["transfer-leader", "g0", "two"],
    ["add-replica", "g0", "0"],
    ["remove-replica", "g0", "-1"],
    ["replace-replica", "g0", "1"],
    ["replace-replica", "g0", "1", "2", "--timeout", "soon"],
])
def test_bad_arguments_are_usage_errors(argv: list[str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--namesrv", "127.0.0.1:1"])
    assert exc.value.code == 2
    assert "usage: raftmq cluster" in capsys.readouterr().err
