"""`raftmq namesrv` / `python -m namesrv`: run one name server until SIGINT or SIGTERM.

Prints `ready <host:port>` on stdout once listening, so scripts and the chaos harness can
start it on port 0 and learn the real address.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys

import trio

from transport.logs import configure_logging
from transport.tls import TlsConfigError, server_context
from wire.protocol import DEFAULT_NAMESRV, parse_address

from .registry import DEFAULT_EXPIRY
from .server import (
    DEFAULT_FRAME_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BUFFERED,
    DEFAULT_MAX_CONNECTIONS,
    run_until_signalled,
)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="raftmq namesrv",
        description="Run a name server: nodes register their groups here, clients ask for routes.",
    )
    p.add_argument("--listen", default=DEFAULT_NAMESRV, metavar="HOST:PORT",
                   help="address to listen on; port 0 picks a free one (default %(default)s)")
    p.add_argument("--expiry", type=float, default=DEFAULT_EXPIRY, metavar="SECONDS",
                   help="forget a node after this long without a registration (default %(default)s)")
    p.add_argument("--tls-cert", default="", metavar="PEM",
                   help="serve TLS only, with this certificate (and --tls-key, --tls-ca)")
    p.add_argument("--tls-key", default="", metavar="PEM", help="the certificate's key")
    p.add_argument("--tls-ca", default="", metavar="PEM",
                   help="the cluster CA: client certificates offered must chain to it")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                   help="connections served at once; one more closes the least recently "
                        "active idle one (default %(default)s)")
    p.add_argument("--frame-timeout", type=float, default=DEFAULT_FRAME_TIMEOUT,
                   metavar="SECONDS", help="close a connection whose frame is not complete "
                   "this long after its first byte (default %(default)s)")
    p.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT,
                   metavar="SECONDS", help="close a connection idle this long with nothing "
                   "in flight (default %(default)s)")
    p.add_argument("--max-buffered-bytes", type=int, default=DEFAULT_MAX_BUFFERED, metavar="N",
                   help="bytes of large frames (full registrations) read at once over all "
                        "connections; more wait their turn (default %(default)s)")
    p.add_argument("--log-level", default="INFO", metavar="LEVEL",
                   help="DEBUG, INFO, WARNING or ERROR (default %(default)s)")
    return p


def _listen_address(addr: str) -> tuple[str, int]:
    """Like `parse_address`, but port 0 (pick a free port) is allowed for listening."""
    host, sep, port = addr.rpartition(":")
    if sep and host and port == "0":
        return host, 0
    return parse_address(addr)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        host, port = _listen_address(args.listen)
    except ValueError as exc:
        print(f"raftmq namesrv: {exc}", file=sys.stderr)
        return 2
    if not (args.expiry > 0 and math.isfinite(args.expiry)):
        print(f"raftmq namesrv: --expiry must be a positive number, got {args.expiry}",
              file=sys.stderr)
        return 2
    for name in ("frame_timeout", "idle_timeout"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            flag = "--" + name.replace("_", "-")
            print(f"raftmq namesrv: {flag} must be a positive number, got {value}",
                  file=sys.stderr)
            return 2
    if args.max_buffered_bytes < 1:
        print("raftmq namesrv: --max-buffered-bytes must be positive, got "
              f"{args.max_buffered_bytes}", file=sys.stderr)
        return 2
    if args.max_connections < 1:
        print(f"raftmq namesrv: --max-connections must be positive, got {args.max_connections}",
              file=sys.stderr)
        return 2
    tls = (args.tls_cert, args.tls_key, args.tls_ca)
    ssl_context = None
    if any(tls):
        if not all(tls):
            print("raftmq namesrv: TLS needs --tls-cert, --tls-key and --tls-ca together",
                  file=sys.stderr)
            return 2
        try:
            ssl_context = server_context(*tls, what="raftmq namesrv")
        except TlsConfigError as exc:
            print(f"raftmq namesrv: {exc}", file=sys.stderr)
            return 2
    configure_logging("namesrv", args.log_level)

    def ready(addr: str) -> None:
        print(f"ready {addr}", flush=True)

    try:
        trio.run(functools.partial(run_until_signalled, host, port, args.expiry, ready,
                                    ssl_context=ssl_context,
                                    max_connections=args.max_connections,
                                    frame_timeout=args.frame_timeout,
                                    idle_timeout=args.idle_timeout,
                                    max_buffered=args.max_buffered_bytes))
    except OSError as exc:  # typically the address is in use
        print(f"raftmq namesrv: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
