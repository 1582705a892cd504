"""docs/sdk.md's table of confluent-kafka and RocketMQ calls names ours: every name in
its raftmq column must exist in `raftmq.client`, so the table cannot promise a call that
is not there (or one that was renamed)."""

from __future__ import annotations

import re

import raftmq.client
from tests.paths import REPO_ROOT

SDK_MD = REPO_ROOT / "docs" / "sdk.md"


def raftmq_names() -> list[str]:
    text = SDK_MD.read_text()
    table = text.split("## Coming from confluent-kafka or RocketMQ", 1)[1]
    names: list[str] = []
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("| what") or line.startswith("|---"):
            continue
        cells = re.split(r"(?<!\\)\|", line)
        ours = cells[4]
        for code in re.findall(r"`([^`]+)`", ours):
            names.append(re.split(r"[(=]", code, maxsplit=1)[0])
    return names


def test_the_table_lists_a_good_many_of_our_calls() -> None:
    assert len(raftmq_names()) >= 40


def test_every_name_in_the_raftmq_column_exists() -> None:
    missing = []
    for name in raftmq_names():
        obj: object = raftmq.client
        for part in name.split("."):
            if not hasattr(obj, part):
                missing.append(name)
                break
            obj = getattr(obj, part)
    assert not missing, f"docs/sdk.md names calls raftmq.client lacks: {missing}"
