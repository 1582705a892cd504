"""What the web application needs to know to reach the cluster, shared by the API and the
console so that both act on the same cluster in the same way."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from transport.scram import Credentials

__all__ = ["WebSettings"]


@dataclass(frozen=True)
class WebSettings:
    """The cluster the web application serves, and where its side files are.

    `namesrv`: name server addresses the application's clients start from.
    `cluster_tls`: the context its connections to nodes use (None: plain, or RAFTMQ_TLS_CA).
    `service_credentials`: the login used for requests that carry none when the cluster
    has no authentication (None: requests without a login act as nobody in particular,
    which a cluster with authentication refuses).
    `chaos_dir`: where the console looks for chaos run reports (None: the page says so).
    `audit_log`: the file every action taken through the console or the API is appended
    to as one JSON line (None: the standard logger only).
    `max_body_bytes`: the largest request body the API reads (a larger one is a 413 and
    changes nothing): room for a maximal message in base64 and a batch's JSON.
    """

    namesrv: tuple[str, ...]
    cluster_tls: ssl.SSLContext | None = None
    service_credentials: Credentials | None = field(default=None, repr=False)
    chaos_dir: Path | None = None
    audit_log: Path | None = None
    max_body_bytes: int = 8 << 20
