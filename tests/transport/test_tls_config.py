"""TLS configuration: a node config names its certificate, key and CA together, relative
paths are beside the file, and a missing or mismatched file is a clear error naming it
before anything starts; clients take their CA from `--tls-ca` or RAFTMQ_TLS_CA."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from broker.config import ConfigError, NodeConfig, load_config
from raftmq.cli import _global_options
from transport.tls import CA_ENV, TlsConfigError, client_context, context_from_env

BASE = 'node_id = 1\nlisten = "127.0.0.1:7101"\ndata = "d"\n[peers]\n1 = "127.0.0.1:7101"\n'
SECRET = 'cluster_secret = "the long random secret of this test"\n'


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def pki(ca: trustme.CA, d: Path) -> None:
    leaf = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(d / "n1.pem"))
    leaf.private_key_pem.write_to_path(str(d / "n1.key"))


def write(d: Path, extra: str) -> Path:
    p = d / "n1.toml"
    p.write_text(extra + BASE)
    return p


def test_relative_tls_files_are_beside_the_config(tmp_path: Path, ca: trustme.CA) -> None:
    pki(ca, tmp_path)
    cfg = load_config(write(tmp_path, SECRET + 'tls_cert = "n1.pem"\ntls_key = "n1.key"\n'
                                      'tls_ca = "ca.pem"\n'))
    assert cfg.tls and cfg.tls_ca == str(tmp_path / "ca.pem")


def test_tls_keys_come_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tls_cert, tls_key and tls_ca together"):
        NodeConfig.from_dict({"node_id": 1, "listen": "127.0.0.1:7101", "data": "d",
                              "peers": {1: "127.0.0.1:7101"}, "tls_cert": "n1.pem"})


def test_a_tls_cluster_needs_its_own_secret(tmp_path: Path, ca: trustme.CA) -> None:
    """The built-in cluster secret is public: with TLS on, a config without its own is
    refused, saying so."""
    pki(ca, tmp_path)
    for extra in ("", 'cluster_secret = "raftmq-dev-cluster-secret"\n'):
        with pytest.raises(ConfigError, match="a TLS cluster needs its own cluster_secret"):
            load_config(write(tmp_path, extra + 'tls_cert = "n1.pem"\ntls_key = "n1.key"\n'
                                                'tls_ca = "ca.pem"\n'))


@pytest.mark.parametrize("broken, match", [
    ("missing-cert", "certificate file .* does not exist"),
    ("missing-ca", "CA file .* does not exist"),
    ("wrong-key", "do not load as a PEM pair"),
    ("not-pem-ca", "no usable PEM"),
])
def test_an_unusable_tls_file_is_named_at_load(tmp_path: Path, ca: trustme.CA, broken: str,
                                               match: str) -> None:
    pki(ca, tmp_path)
    if broken == "missing-cert":
        (tmp_path / "n1.pem").unlink()
    elif broken == "missing-ca":
        (tmp_path / "ca.pem").unlink()
    elif broken == "wrong-key":
        ca.issue_cert("other").private_key_pem.write_to_path(str(tmp_path / "n1.key"))
    else:
        (tmp_path / "ca.pem").write_text("not a certificate\n")
    p = write(tmp_path, SECRET + 'tls_cert = "n1.pem"\ntls_key = "n1.key"\ntls_ca = "ca.pem"\n')
    with pytest.raises(ConfigError, match=match) as info:
        load_config(p)
    assert str(p) in str(info.value)


def test_clients_read_the_ca_from_the_environment(tmp_path: Path, ca: trustme.CA) -> None:
    assert context_from_env({}) is None
    pki(ca, tmp_path)
    ctx = context_from_env({CA_ENV: str(tmp_path / "ca.pem")})
    assert ctx is not None and ctx.check_hostname
    with pytest.raises(TlsConfigError, match="does not exist"):
        context_from_env({CA_ENV: str(tmp_path / "nope.pem")})
    with pytest.raises(TlsConfigError, match="both a cert and a key"):
        client_context(str(tmp_path / "ca.pem"), cert=str(tmp_path / "n1.pem"))


def test_the_cli_takes_tls_ca_before_the_command(tmp_path: Path, ca: trustme.CA,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pki(ca, tmp_path)
    monkeypatch.setenv(CA_ENV, "")  # recorded, so what the CLI sets is undone afterwards
    ca_file = str(tmp_path / "ca.pem")
    assert _global_options(["--tls-ca", ca_file, "status", "--json"]) == ["status", "--json"]
    import os

    assert os.environ[CA_ENV] == ca_file
    assert _global_options([f"--tls-ca={ca_file}", "status"]) == ["status"]
    assert _global_options(["--tls-ca", str(tmp_path / "missing.pem"), "status"]) is None
    assert _global_options(["--tls-ca"]) is None
