"""The refill-gap file: what a restart reads back, and damage refused, not misread."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.refillgap import CorruptRefillGap, load_refill_gap, save_refill_gap


def test_a_saved_gap_reads_back_and_a_missing_file_is_no_gap(tmp_path: Path) -> None:
    path = tmp_path / "refill-gap"
    assert load_refill_gap(path) is None
    save_refill_gap(path, (1, 32))
    assert load_refill_gap(path) == (1, 32)
    save_refill_gap(path, (40, 40))  # the latest gap replaces the file
    assert load_refill_gap(path) == (40, 40)


@pytest.mark.parametrize("gap", [(0, 5), (6, 5)])
def test_a_range_that_names_no_entries_is_refused_and_writes_nothing(
    tmp_path: Path, gap: tuple[int, int]
) -> None:
    path = tmp_path / "refill-gap"
    with pytest.raises(ValueError, match="not a range"):
        save_refill_gap(path, gap)
    assert not path.exists()


def test_a_damaged_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "refill-gap"
    save_refill_gap(path, (1, 32))
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRefillGap, match="CRC"):
        load_refill_gap(path)
    path.write_bytes(b"RMRG")
    with pytest.raises(CorruptRefillGap, match="too short"):
        load_refill_gap(path)
