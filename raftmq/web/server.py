"""Serving the web application: hypercorn's trio worker inside a trio nursery, and the
`raftmq console` command that starts it.

hypercorn runs the ASGI application on trio, the event loop the nodes use; the SDK the
application calls runs on it through anyio. TLS (`--tls-cert`/`--tls-key`) is
hypercorn's; use it wherever the API is reached beyond loopback, since HTTP Basic sends
the password with every request.
"""

from __future__ import annotations

import argparse
import functools
import logging
import ssl
import sys
from pathlib import Path

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from transport.scram import Credentials

from .app import build_app
from .settings import WebSettings

__all__ = ["main", "serve"]


async def serve(settings: WebSettings, host: str, port: int, *,
                certfile: str | None = None, keyfile: str | None = None,
                task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the application until cancelled; reports the URL it listens at once bound
    (`port` 0 picks a free one)."""
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("raftmq.web.server")
    if certfile is not None:
        config.certfile = certfile
        config.keyfile = keyfile
    app = build_app(settings)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(hypercorn_serve, app, config)  # type: ignore[arg-type]
        url = binds[0] if binds else f"http://{host}:{port}"
        task_status.started(url)


def _parser() -> argparse.ArgumentParser:
    from raftmq.commands import add_namesrv_argument

    p = argparse.ArgumentParser(
        prog="raftmq console",
        description="Serve the HTTP API (/api/v1) and the web console for a cluster.")
    add_namesrv_argument(p)
    p.add_argument("--listen", default="127.0.0.1:7180", metavar="HOST:PORT",
                   help="where to listen (default %(default)s; port 0: any free one)")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", metavar="FILE", help="... and this private key")
    p.add_argument("--service-user", metavar="NAME",
                   help="the login requests without one act as (default: none, which a "
                        "cluster with authentication refuses)")
    p.add_argument("--service-password-file", metavar="FILE",
                   help="the service user's password")
    p.add_argument("--audit-log", metavar="FILE", type=Path,
                   help="append one JSON line per state-changing request here")
    p.add_argument("--chaos-dir", metavar="DIR", type=Path,
                   help="where the console finds chaos run reports")
    return p


def listen_address(value: str) -> tuple[str, int]:
    """HOST:PORT to listen at; port 0 asks for any free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"bad address {value!r}: expected host:port")
    return host.strip("[]"), int(port)


def settings_from_args(args: argparse.Namespace, namesrv: list[str]) -> WebSettings:
    from transport.tls import context_from_env

    service = None
    if args.service_user:
        password = ""
        if args.service_password_file:
            password = Path(args.service_password_file).read_text().rstrip("\n")
        service = Credentials(args.service_user, password)
    tls: ssl.SSLContext | None = context_from_env()
    return WebSettings(tuple(namesrv), cluster_tls=tls, service_credentials=service,
                       chaos_dir=args.chaos_dir, audit_log=args.audit_log)


def main(argv: list[str]) -> int:
    from raftmq.commands import namesrv_addresses

    parser = _parser()
    args = parser.parse_args(argv)
    namesrv = namesrv_addresses(parser, args.namesrv)
    try:
        host, port = listen_address(args.listen)
    except ValueError as exc:
        parser.error(f"--listen: {exc}")
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    try:
        settings = settings_from_args(args, namesrv)
    except OSError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(
                serve, settings, host, port, certfile=args.tls_cert, keyfile=args.tls_key))
            print(f"console: {url}/  api: {url}/api/v1/  (namesrv {','.join(namesrv)})",
                  flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
