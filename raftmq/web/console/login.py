"""Who a console request acts as, and the audit line every action leaves.

The console is a client of the cluster like any SDK user: each request gets an `Admin`
logged in as the user of its HTTP Basic login (or, without one, as the settings' service
login, or as nobody on a cluster without authentication), so the nodes' own logins and
ACLs decide what it may see and do. A refusal for want of a login becomes a 401 asking
the browser for one.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.requests import Request

from raftmq.client import Admin
from raftmq.web.settings import WebSettings
from transport.connection import ConnectionPool
from transport.scram import Credentials

__all__ = ["BadLogin", "admin_for", "audit", "login_of", "user_of"]

log = logging.getLogger("raftmq.web.audit")

NODE_TIMEOUT = 2.0  # a page waits this long for one node: a dead node must not hang it
CALL_TIMEOUT = 8.0


class BadLogin(ValueError):
    """An Authorization header that is not a readable HTTP Basic login."""


def login_of(request: Request) -> Credentials | None:
    """The request's HTTP Basic login, or None without an Authorization header."""
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        raise BadLogin("the console takes HTTP Basic logins only")
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise BadLogin("the Basic login is not base64 of 'user:password'") from None
    if not sep or not user:
        raise BadLogin("the Basic login names no user")
    return Credentials(user, password)


def user_of(request: Request, settings: WebSettings) -> str:
    """The name an action is logged under."""
    creds = login_of(request) or settings.service_credentials
    return creds.user if creds is not None else "anonymous"


@asynccontextmanager
async def admin_for(request: Request, settings: WebSettings) -> AsyncIterator[Admin]:
    """An `Admin` acting as the request's user, for the length of the request."""
    creds = login_of(request) or settings.service_credentials
    # never the console process's own RAFTMQ_USER: a request without a login is anonymous
    async with ConnectionPool(ssl_context=settings.cluster_tls, credentials=creds,
                              env_credentials=False) as pool, \
            Admin(list(settings.namesrv), timeout=NODE_TIMEOUT, call_timeout=CALL_TIMEOUT,
                  pool=pool) as admin:
        yield admin


def audit(request: Request, settings: WebSettings, action: str, detail: dict[str, Any],
          outcome: str) -> None:
    """One JSON line per action taken (or refused): who, what, from where, how it ended;
    appended to `settings.audit_log` when set, and always to the `raftmq.web.audit` log."""
    line = json.dumps({
        "ts": round(time.time(), 3), "user": user_of(request, settings), "action": action,
        "detail": detail, "outcome": outcome,
        "client": request.client.host if request.client else None, "via": "console",
    }, default=str, sort_keys=True)
    log.info("%s", line)
    if settings.audit_log is not None:
        with open(settings.audit_log, "a", encoding="utf-8") as f:
            f.write(line + "\n")
