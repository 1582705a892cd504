"""The hosted-groups file (`broker.runtime.hosted`) and how a node uses it at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import cluster_configs, dump_config, load_config
from broker.node import Node
from broker.runtime.hosted import HOSTED_FILE, HostedError, load_hosted, save_hosted


def test_no_file_yet_is_none_and_a_saved_list_reads_back(tmp_path: Path) -> None:
    assert load_hosted(tmp_path) is None
    save_hosted(tmp_path / "n1", {"g1": (3, 1, 2), "g0": (1,)})
    assert load_hosted(tmp_path / "n1") == {"g0": (1,), "g1": (1, 2, 3)}
    save_hosted(tmp_path / "n1", {})
    assert load_hosted(tmp_path / "n1") == {}  # hosts nothing: not the same as no file
    assert not (tmp_path / "n1" / (HOSTED_FILE + ".tmp")).exists()


@pytest.mark.parametrize("text", ["", "{", "[]", '{"groups": 3}', '{"groups": {"g0": ["x"]}}',
                                  '{"groups": {"g0": []}}', '{"other": {}}'])
def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / HOSTED_FILE).write_text(text)
    with pytest.raises(HostedError, match=HOSTED_FILE):
        load_hosted(tmp_path)


def _config(tmp_path: Path, **extra: object) -> Path:
    cfg = cluster_configs(tmp_path, nodes=3, groups=3, port_base=21000, **extra)[0]
    path = tmp_path / "n1.toml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_config(cfg))
    return path


def test_the_first_start_hosts_the_config_groups_or_none_when_joining(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path))
    assert sorted(Node(cfg).groups) == ["g0", "g1", "g2"]
    joining = load_config(_config(tmp_path / "j", join=True))
    assert joining.join and Node(joining).groups == {}


def test_the_file_not_the_config_says_what_a_node_hosts(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path))
    save_hosted(cfg.data, {"g1": (1, 2, 3), "g7": (2, 3)})  # added and removed at run time
    node = Node(cfg)
    assert sorted(node.groups) == ["g1", "g7"]
    assert node.groups["g7"].replicas == (2, 3)


@pytest.mark.live
def test_a_node_refuses_to_start_on_an_unreadable_file(tmp_path: Path) -> None:
    path = _config(tmp_path)
    data = load_config(path).data
    data.mkdir(parents=True)
    (data / HOSTED_FILE).write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "raftmq", "node", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert HOSTED_FILE in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in data.iterdir()) == [HOSTED_FILE]  # nothing was created


def test_a_node_hosts_and_drops_groups_and_the_file_follows(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import trio

    import broker.node

    cfg = load_config(_config(tmp_path / "h", join=True))
    node = Node(cfg)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            node._nursery = nursery
            assert await node.host_group("g1", (2, 3))
            assert not await node.host_group("g1", (2, 3))  # hosted already
            assert sorted(node.groups) == ["g1"] and node.groups["g1"].is_open
            assert load_hosted(cfg.data) == {"g1": (2, 3)}
            assert (cfg.data / "g1").is_dir()

            def full(*_: object) -> None:
                raise OSError(28, "No space left on device")

            monkeypatch.setattr(broker.node, "save_hosted", full)
            with pytest.raises(OSError):
                await node.host_group("g2", (1, 2, 3))
            monkeypatch.undo()
            assert sorted(node.groups) == ["g1"]  # not hosted, here or after a restart
            assert load_hosted(cfg.data) == {"g1": (2, 3)}

            assert await node.drop_group("g1")
            assert not await node.drop_group("g1")
            assert node.groups == {} and load_hosted(cfg.data) == {}
            assert not (cfg.data / "g1").exists()
            nursery.cancel_scope.cancel()

    trio.run(main)
