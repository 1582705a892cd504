"""Certificates for a local TLS cluster (`raftmq dev --tls`), made with trustme.

A development CA, and one certificate per node and one for the name server, each valid
for the cluster's host (and `localhost`), written as PEM files into one directory. The
files are reused when present, so a restarted dev cluster keeps its CA and every client
that trusts it. Development only: the CA's key is written beside the certificates and the
certificates are trustme's (valid for years, no revocation).

A node's certificate names it: the subject common name of name `n<i>` is `raftmq-n<i>`,
which is how peers and the name server tell node i's certificate from any other
(`transport.peerauth.certificate_node`); the name server's (`raftmq-namesrv`) names no
node, so it can never act as one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DevPki", "make_dev_pki", "pki_paths"]


@dataclass(frozen=True)
class DevPki:
    """Where the files are: the CA certificate, and (cert, key) per name ("n1", "namesrv")."""

    ca: Path
    pairs: dict[str, tuple[Path, Path]]


def pki_paths(directory: Path, names: list[str]) -> DevPki:
    """Where `make_dev_pki` puts the files (nothing is made)."""
    return DevPki(directory / "ca.pem",
                  {n: (directory / f"{n}.pem", directory / f"{n}.key") for n in names})


def make_dev_pki(directory: str | Path, names: list[str], host: str = "127.0.0.1") -> DevPki:
    """The CA and a certificate for every name in `names`, valid for `host` and localhost;
    made now unless every file is already there. Raises `RuntimeError` when trustme (the
    `tls` extra) is not installed."""
    d = Path(directory)
    pki = pki_paths(d, names)
    files = [pki.ca, *(p for pair in pki.pairs.values() for p in pair)]
    if all(f.exists() for f in files):
        return pki
    try:
        import trustme
    except ImportError:
        raise RuntimeError("making development certificates needs trustme: "
                           "pip install 'raftmq[tls]'") from None
    d.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="raftmq development CA")
    ca.cert_pem.write_to_path(str(pki.ca))
    ca.private_key_pem.write_to_path(str(d / "ca.key"))
    identities = [host] if host == "localhost" else [host, "localhost"]
    for name, (cert, key) in pki.pairs.items():
        leaf = ca.issue_cert(*identities, common_name=f"raftmq-{name}")
        leaf.private_key_pem.write_to_path(str(key))
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        key.chmod(0o600)
    (d / "ca.key").chmod(0o600)
    return pki
