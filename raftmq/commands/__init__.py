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
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import anyio
from rich.console import Console
from rich.table import Table

from raftmq.client.errors import (
    IncompleteError,
    OutcomeUnknownError,
    TransportError,
    UnavailableError,
    leaves,
)
from raftmq.client.routes import normalize_addresses
from transport.scram import USER_ENV
from wire.protocol import DEFAULT_NAMESRV, NAMESRV_ENV, Code, RequestError

if TYPE_CHECKING:
    from raftmq.client import Admin

__all__ = [
    "DEFAULT_NAMESRV",
    "add_namesrv_argument",
    "cell",
    "table_console",
    "incomplete_exit",
    "login_hint",
    "make_table",
    "run_admin_action",
    "first_request_error",
    "no_action",
    "namesrv_addresses",
    "positive_int",
    "print_json",
    "report_error",
    "run_async",
]

EXIT_FAILURE = 1
EXIT_USAGE = 2


def default_namesrv() -> str:
    """$RAFTMQ_NAMESRV, else $NAMESRV_ADDR (RocketMQ's tools' variable), else the default."""
    for name in NAMESRV_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return DEFAULT_NAMESRV


def add_namesrv_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namesrv", default=default_namesrv(), metavar="ADDR[,ADDR]",
        help=f"name server address(es) (default: ${NAMESRV_ENV[0]}, ${NAMESRV_ENV[1]} or "
             f"{DEFAULT_NAMESRV}; now %(default)s)",
    )


def namesrv_addresses(parser: argparse.ArgumentParser, value: str) -> list[str]:
    """The parsed `--namesrv` list; a malformed one is a usage error (exit 2)."""
    try:
        return normalize_addresses(value)
    except ValueError as exc:
        parser.error(f"--namesrv: {exc}")  # raises SystemExit(2)


def first_request_error(exc: BaseException) -> RequestError | None:
    """The `RequestError` behind `exc`, looking inside exception groups (a benchmark's
    own task groups may still wrap one)."""
    for leaf in leaves(exc):
        if isinstance(leaf, RequestError):
            return leaf
    return None


def report_error(prog: str, exc: RequestError, namesrv: list[str] | None = None) -> int:
    """Print one line for a failed request and return the exit status (1)."""
    if namesrv and (exc.extra.get("name_servers") or (
            isinstance(exc, TransportError) and any(a in exc.message for a in namesrv))):
        print(
            f"{prog}: cannot reach the name server at {','.join(namesrv)} ({exc.message}); "
            "start a cluster with `raftmq dev` or pass --namesrv / set RAFTMQ_NAMESRV",
            file=sys.stderr,
        )
    elif isinstance(exc, OutcomeUnknownError):
        print(f"{prog}: OUTCOME UNKNOWN: {exc.message}. The write MAY HAVE BEEN STORED: "
              "look for it (`raftmq message key`, `raftmq consume`) before sending it again",
              file=sys.stderr)
    elif exc.code == Code.UNAUTHENTICATED:
        print(f"{prog}: UNAUTHENTICATED: {exc.message}; {login_hint()}", file=sys.stderr)
    elif isinstance(exc, UnavailableError):
        print(f"{prog}: UNAVAILABLE: {exc.message} (nothing was written; the group may have "
              "lost its quorum: see `raftmq status`)", file=sys.stderr)
    else:
        print(f"{prog}: {exc.code.name}: {exc.message}", file=sys.stderr)
    return EXIT_FAILURE


def login_hint(command: str = "COMMAND") -> str:
    """How to log in, for a request refused with UNAUTHENTICATED: a cluster whose nodes
    authenticate clients answers nothing else without a login."""
    user = os.environ.get(USER_ENV, "")
    if user:
        return (f"the login as {user!r} was refused: check the user name and password "
                "(--user NAME --password-file FILE, or RAFTMQ_USER and RAFTMQ_PASSWORD)")
    return (f"this cluster needs a login: `raftmq --user NAME --password-file FILE {command}` "
            "(or set RAFTMQ_USER and RAFTMQ_PASSWORD)")


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


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1, so the subcommand itself reports a
    bad value (with its own usage line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def no_action(parser: argparse.ArgumentParser, prog: str, choices: str) -> int:
    """A command with subcommands called without one: its usage, what to choose, and the
    usage-error exit status."""
    parser.print_usage(sys.stderr)
    print(f"{prog}: choose {choices}", file=sys.stderr)
    return EXIT_USAGE


def print_json(obj: Any) -> None:
    """One JSON document on one line (keys of any type become strings)."""
    print(json.dumps(obj, default=str), flush=True)


AdminAction = Callable[[argparse.Namespace, "Admin"], Awaitable[int]]


def run_admin_action(parser: argparse.ArgumentParser, args: argparse.Namespace, prog: str,
                     actions: Mapping[str, AdminAction]) -> int:
    """Run the subcommand `args.action` of a command with subcommands (`raftmq group`,
    `raftmq tx`) with an `Admin` of the cluster, under the CLI's exit codes: usage (2)
    when none is chosen, 1 when a request fails."""
    if args.action is None:
        *rest, last = list(actions)
        return no_action(parser, prog, f"{', '.join(rest)} or {last}" if rest else last)
    namesrv = namesrv_addresses(parser, args.namesrv)
    action = actions[args.action]

    async def run() -> int:
        from raftmq.client import Admin

        async with Admin(namesrv) as admin:
            return await action(args, admin)

    return run_async(run, namesrv)


def incomplete_exit(prog: str, exc: IncompleteError | None) -> int:
    """After printing what was read: say what could not be, and fail (exit 1); 0 when
    everything was read."""
    if exc is None:
        return 0
    print(f"{prog}: INCOMPLETE: {exc.message}; what is shown leaves them out",
          file=sys.stderr)
    return EXIT_FAILURE


def cell(value: object) -> str:
    """A table cell: "-" for nothing, lists joined with commas."""
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(x) for x in value) or "-"
    return str(value)


PIPE_WIDTH = 1000
"""Columns a table may use when printed to a pipe or a file: rich would assume 80 and cut
every column but the ids to a few characters ("ha…"), which no reader can undo."""


def table_console(file: TextIO | None = None) -> Console:
    """Where the commands print tables: a terminal's own width, else (a pipe, a file)
    `PIPE_WIDTH`, so a table is written whole for whoever reads or parses it."""
    out = sys.stdout if file is None else file
    if out.isatty():
        return Console(file=file)
    return Console(file=file, width=PIPE_WIDTH)


def make_table(heads: Sequence[str], rows: Iterable[Sequence[object]], *,
               title: str | None = None, right: Collection[str] = (),
               whole: Collection[str] = ()) -> Table:
    """A table of `rows` (cells as `cell` shows them) under `heads`: the columns named
    in `right` are right-justified (numbers), those in `whole` never cut or wrapped (ids
    that are copied into commands)."""
    lines = [[cell(v) for v in row] for row in rows]
    table = Table(title=title, title_justify="left")
    for i, head in enumerate(heads):
        if head in whole:
            width = max([len(head)] + [len(line[i]) for line in lines])
            table.add_column(head, no_wrap=True, min_width=width)
        else:
            table.add_column(head, justify="right" if head in right else "left")
    for line in lines:
        table.add_row(*line)
    return table
