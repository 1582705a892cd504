"""`raftmq user add|remove|list|verifier`: the users clients authenticate as (SCRAM-SHA-256).

`add` computes the user's SCRAM verifier here (a fresh random salt, 4096 PBKDF2
iterations) and sends only that: the password never leaves this process. The verifier is
logged in the cluster's metadata group (the lowest group id), so every node agrees.
`verifier` prints the verifier in the text form a node config's `superuser_scram` takes,
for the first superuser. Passwords come from `--password-file`, else $RAFTMQ_NEW_PASSWORD,
else a prompt. These commands need a superuser's login (`raftmq --user NAME ...`).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
from typing import Any

from raftmq.client.routes import LEADER_WAIT, backoff_delay
from transport.blocking import request
from wire.protocol import Code, Op, RequestError
from wire.requests.base import WireType
from wire.requests.namesrv import ClusterRequest
from wire.requests.security import (
    UserDeleteAnswer,
    UserDeleteRequest,
    UserListAnswer,
    UserListRequest,
    UserPutAnswer,
    UserPutRequest,
)
from wire.security import format_verifier, make_credential, user_name_problem

from . import add_namesrv_argument, namesrv_addresses, print_json

__all__ = ["main", "metadata_call", "metadata_request"]

PROG = "raftmq user"
NEW_PASSWORD_ENV = "RAFTMQ_NEW_PASSWORD"
_HOPS = 5
# what an election or a hand-over looks like here; nothing was written
_ELECTING = frozenset({Code.NOT_LEADER, Code.PROPOSAL_DROPPED, Code.UNAVAILABLE})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Users clients log in as (SCRAM-SHA-256).")
    sub = p.add_subparsers(dest="action")
    for name, what in (("add", "create a user or change its password"),
                       ("remove", "delete a user"), ("list", "list the users"),
                       ("verifier", "print a SCRAM verifier for a node's superuser_scram")):
        sp = sub.add_parser(name, help=what)
        if name in ("add", "remove", "verifier"):
            sp.add_argument("name", help="user name")
        if name in ("add", "verifier"):
            sp.add_argument("--password-file", metavar="FILE",
                            help=f"read the password from FILE (else ${NEW_PASSWORD_ENV}, "
                                 "else a prompt)")
        if name != "verifier":
            sp.add_argument("--json", action="store_true", help="print JSON")
            add_namesrv_argument(sp)
    return p


def _password(args: argparse.Namespace) -> str:
    if args.password_file:
        with open(args.password_file, encoding="utf-8") as f:
            pw = f.read().rstrip("\n")
    else:
        pw = os.environ.get(NEW_PASSWORD_ENV) or getpass.getpass(f"password for {args.name}: ")
    if not pw:
        raise ValueError("the password is empty")
    return pw


def metadata_call(namesrv: list[str], req: WireType) -> dict[str, Any]:
    """`metadata_request` of a typed request: the answer's header."""
    return metadata_request(namesrv, {"op": int(req.OP), **req.header()})


def metadata_request(namesrv: list[str], header: dict[str, Any]) -> dict[str, Any]:
    """Send `header` to the leader of the cluster's metadata group (the lowest group id,
    found through the name server), following NOT_LEADER hints.

    While the group elects or hands leadership over (NOT_LEADER with nobody to follow,
    PROPOSAL_DROPPED, no leader known, the leader's port closed: nothing was written) it
    asks again for up to `LEADER_WAIT` seconds, as the SDK's clients do, rather than
    failing an operator's command a moment after a leader died."""
    deadline = time.monotonic() + LEADER_WAIT
    attempt = 0
    while True:
        gid, addr = _metadata_leader(namesrv)
        try:
            for _ in range(_HOPS):
                if not addr:
                    raise RequestError(Code.UNAVAILABLE,
                                       f"metadata group {gid} has no known leader")
                try:
                    return request(addr, header)[0]
                except RequestError as exc:
                    if (exc.code != Code.NOT_LEADER or not exc.extra.get("leader")
                            or exc.extra.get("ready") is False):  # not ready: back off
                        raise
                    addr = exc.extra["leader"]
            raise RequestError(Code.UNAVAILABLE, f"metadata group {gid}: leadership keeps "
                               "moving")
        except RequestError as exc:
            if exc.code not in _ELECTING or time.monotonic() >= deadline:
                raise
        except ConnectionRefusedError:  # a leader that just died: nothing was sent
            if time.monotonic() >= deadline:
                raise
        attempt += 1
        time.sleep(backoff_delay(attempt))


def _metadata_leader(namesrv: list[str]) -> tuple[str, str | None]:
    """The metadata group's id and its leader's address as the name server knows it."""
    info: dict[str, Any] | None = None
    for ns in namesrv:
        try:
            info, _ = request(ns, {"op": int(Op.CLUSTER), **ClusterRequest(topics=False).header()})
            break
        except OSError:
            continue
    if info is None:
        raise RequestError(Code.UNAVAILABLE, f"no name server answered at {','.join(namesrv)}")
    groups = info.get("groups") or {}
    if not groups:
        raise RequestError(Code.UNAVAILABLE, "the name server knows no groups yet")
    gid = min(groups)
    return gid, groups[gid].get("leader_addr")


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action is None:
        parser.print_help()
        return 2
    try:
        problem = user_name_problem(args.name) if args.action in (
            "add", "remove", "verifier") else None
        if problem is not None:
            print(f"{PROG}: {problem}", file=sys.stderr)
            return 2
        if args.action == "verifier":
            print(format_verifier(make_credential(_password(args))))
            return 0
        namesrv = namesrv_addresses(parser, args.namesrv)
        if args.action == "add":
            c = make_credential(_password(args))
            UserPutAnswer.decode(metadata_call(namesrv, UserPutRequest.of(args.name, c)))
            result: dict[str, Any] = {"user": args.name, "stored": True}
        elif args.action == "remove":
            out = metadata_call(namesrv, UserDeleteRequest(user=args.name))
            result = {"user": args.name, "deleted": UserDeleteAnswer.decode(out).deleted}
        else:
            out = metadata_call(namesrv, UserListRequest())
            result = {"users": list(UserListAnswer.decode(out).users)}
    except (ValueError, OSError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except RequestError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json(result)
    elif "users" in result:
        for name in result["users"]:
            print(name)
    elif args.action == "remove" and not result["deleted"]:
        print(f"no user {args.name!r}")
    return 0
