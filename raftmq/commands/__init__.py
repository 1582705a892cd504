"""Client-side subcommands of `raftmq`: one module per command, each with `main(argv) -> int`.

They talk to a running cluster through the SDK in `raftmq.client`; `raftmq.cli` only
routes to them. The helpers here give every command the same `--namesrv` option and the
same way of reporting failures (`raftmq: CODE: message` on stderr, exit 1; usage errors
exit 2), so scripts can rely on one convention.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from broker.protocol import RequestError
from raftmq.client.routes import normalize_addresses
from transport.connection import TransportError

__all__ = [
    "DEFAULT_NAMESRV",
    "add_namesrv_argument",
    "first_request_error",
    "namesrv_addresses",
    "print_json",
    "report_error",
    "run_async",
]

# `raftmq dev` puts its name server at port base 7100 + 76, so a bare command finds it.
DEFAULT_NAMESRV = "127.0.0.1:7176"
EXIT_FAILURE = 1
EXIT_USAGE = 2


def add_namesrv_argument(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get("RAFTMQ_NAMESRV") or DEFAULT_NAMESRV
    parser.add_argument(
        "--namesrv", default=default, metavar="ADDR[,ADDR]",
        help="name server address(es) (default: $RAFTMQ_NAMESRV or %(default)s)",
    )


def namesrv_addresses(parser: argparse.ArgumentParser, value: str) -> list[str]:
    """The parsed `--namesrv` list; a malformed one is a usage error (exit 2)."""
    try:
        return normalize_addresses(value)
    except ValueError as exc:
        parser.error(f"--namesrv: {exc}")  # raises SystemExit(2)


def first_request_error(exc: BaseException) -> RequestError | None:
    """The `RequestError` behind `exc`, looking inside exception groups: a failure in a
    task group reaches the caller wrapped, but the user wants the code and message."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = first_request_error(inner)
            if found is not None:
                return found
    return None


def report_error(prog: str, exc: RequestError, namesrv: list[str] | None = None) -> int:
    """Print one line for a failed request and return the exit status (1)."""
    if isinstance(exc, TransportError) and namesrv and any(a in exc.message for a in namesrv):
        print(
            f"{prog}: cannot reach the name server at {','.join(namesrv)} ({exc.message}); "
            "start a cluster with `raftmq dev` or pass --namesrv / set RAFTMQ_NAMESRV",
            file=sys.stderr,
        )
    else:
        print(f"{prog}: {exc.code.name}: {exc.message}", file=sys.stderr)
    return EXIT_FAILURE


def run_async(fn: Callable[[], Awaitable[int]], namesrv: list[str] | None = None,
              prog: str = "raftmq") -> int:
    """Run a command's coroutine and turn request failures into the CLI's exit codes."""
    try:
        return anyio.run(fn)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # noqa: BLE001 - unwrapped below, re-raised otherwise
        found = first_request_error(exc)
        if found is None:
            raise
        return report_error(prog, found, namesrv)


def print_json(obj: Any) -> None:
    """One JSON document on one line (keys of any type become strings)."""
    print(json.dumps(obj, default=str), flush=True)
