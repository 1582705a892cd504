"""Hard state: round trip, atomic replacement, corruption detected rather than ignored."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlog.hardstate import (
    CorruptHardState,
    HardStateFile,
    decode_hardstate,
    encode_hardstate,
    load_hardstate,
    save_hardstate,
)
from raftlog.types import HardState, Membership

M3 = Membership(frozenset({1, 2, 3}))
M4 = Membership(frozenset({1, 2, 3}), frozenset({4}))


@pytest.mark.parametrize(
    "hs",
    [
        HardState(),
        HardState(term=1, vote=None),
        HardState(term=7, vote=3, configs=((0, 0, M3),)),
        HardState(term=2**40, vote=2, configs=((0, 0, M3), (17, 5, M4))),
    ],
)
def test_roundtrip(tmp_path: Path, hs: HardState) -> None:
    path = tmp_path / "hardstate"
    save_hardstate(path, hs)
    assert load_hardstate(path) == hs
    assert decode_hardstate(encode_hardstate(hs)) == hs


def test_absent_is_fresh(tmp_path: Path) -> None:
    assert load_hardstate(tmp_path / "nothing") == HardState()


def test_atomic_replace(tmp_path: Path) -> None:
    path = tmp_path / "hardstate"
    a = HardState(term=1, vote=1, configs=((0, 0, M3),))
    b = HardState(term=2, vote=None, configs=((0, 0, M3), (9, 2, M4)))
    save_hardstate(path, a)
    inode = path.stat().st_ino
    save_hardstate(path, b)
    assert load_hardstate(path) == b
    assert path.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hardstate"]
    # a crash mid-save leaves a partial temp file: the saved state is untouched
    (tmp_path / "hardstate.tmp").write_bytes(encode_hardstate(a)[:7])
    assert load_hardstate(path) == b
    save_hardstate(path, a)
    assert load_hardstate(path) == a


def test_every_flipped_byte_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "hardstate"
    hs = HardState(term=5, vote=2, configs=((0, 0, M3), (3, 4, M4)))
    save_hardstate(path, hs)
    good = path.read_bytes()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x01
        path.write_bytes(bytes(bad))
        with pytest.raises(CorruptHardState):
            load_hardstate(path)


@pytest.mark.parametrize("cut", [0, 1, 5, 12, -4, -1])
def test_truncated_file_is_detected(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "hardstate"
    save_hardstate(path, HardState(term=3, vote=1, configs=((0, 0, M3),)))
    data = path.read_bytes()
    path.write_bytes(data[:cut])
    with pytest.raises(CorruptHardState) as info:
        load_hardstate(path)
    assert str(path) in str(info.value)


def test_valid_crc_but_bad_payload(tmp_path: Path) -> None:
    import struct

    import crc32c
    import msgpack

    payload = msgpack.packb({"t": "three", "v": None, "c": []})
    body = struct.pack("<4sHHI", b"RMHS", 1, 0, len(payload)) + payload
    path = tmp_path / "hardstate"
    path.write_bytes(body + struct.pack("<I", crc32c.crc32c(body)))
    with pytest.raises(CorruptHardState, match="bad term"):
        load_hardstate(path)


def test_hardstate_file_skips_unchanged(tmp_path: Path) -> None:
    f = HardStateFile(tmp_path / "hs")
    assert f.load() == HardState()
    hs = HardState(term=4, vote=2)
    f.save(hs)
    mtime = os.stat(f.path).st_mtime_ns
    inode = os.stat(f.path).st_ino
    f.save(HardState(term=4, vote=2))
    assert (os.stat(f.path).st_mtime_ns, os.stat(f.path).st_ino) == (mtime, inode)
    f.save(HardState(term=5, vote=None))
    assert HardStateFile(f.path).load() == HardState(term=5, vote=None)
