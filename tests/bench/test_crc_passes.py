"""`bench.crc_passes` at a tiny size: one body-CRC pass per entry on each replica."""

from __future__ import annotations

import json

import pytest

from bench import crc_passes


def test_each_replica_checks_an_entry_body_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert crc_passes.main(["--entries", "20", "--body", "1024"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unattributed"] == 0
    assert out["per_entry_leader"] == 1.0  # sealed when proposed
    assert out["per_entry_followers"] == [1.0, 1.0]  # verified once when received
    assert out["per_entry_leader_plus_one_follower"] == 2.0
