"""The `raftmq` command. Each subcommand lives with the package that owns it; this module
only routes, so `raftmq --help` is the one map of everything a user can run."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

__all__ = ["main"]


def _demo(argv: list[str]) -> int:
    from raftlog.demo import main as demo_main

    return demo_main(argv)


def _sim(argv: list[str]) -> int:
    from raftlog.sim.__main__ import main as sim_main

    return sim_main(argv, prog="raftmq sim")


def _chaos(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: raftmq chaos check DIR | --history FILE [--json] [--timeout S]\n"
              "       raftmq chaos check --model M [--format F] FILE [--json] [--timeout S]\n"
              "       raftmq chaos run --out DIR [--nodes 3|5] [--groups G] [--time S]\n"
              "                        [--nemesis LIST|all|none] [--seed N] [--mutation NAME]\n"
              "                        [--cluster CONFIG]\n"
              "       raftmq chaos agent --listen HOST:PORT -- NODE COMMAND...\n"
              "exit codes: 0 valid, 1 invalid, 2 unknown (checker out of time), 3 bad input")
        return 0 if argv else 2
    from chaos.agent import agent_main
    from chaos.cli import check_main, run_main

    subcommands = {"check": check_main, "run": run_main, "agent": agent_main}
    if argv[0] not in subcommands:
        print(f"raftmq chaos: unknown command {argv[0]!r} (known: check, run, agent)",
              file=sys.stderr)
        return 2
    return subcommands[argv[0]](argv[1:])


def _node(argv: list[str]) -> int:
    from broker.node import main as node_main

    return node_main(argv)


def _host(argv: list[str]) -> int:
    from raftmq.host import main as host_main

    return host_main(argv)


def _layout(argv: list[str]) -> int:
    from raftmq.layout import main as layout_main

    return layout_main(argv)


def _namesrv(argv: list[str]) -> int:
    from namesrv.__main__ import main as namesrv_main

    return namesrv_main(argv)


def _dev(argv: list[str]) -> int:
    from raftmq.dev import main as dev_main

    return dev_main(argv)


def _topic(argv: list[str]) -> int:
    from raftmq.commands.topic import main as topic_main

    return topic_main(argv)


def _send(argv: list[str]) -> int:
    from raftmq.commands.send import main as send_main

    return send_main(argv)


def _group(argv: list[str]) -> int:
    from raftmq.commands.group import main as group_main

    return group_main(argv)


def _lag(argv: list[str]) -> int:
    from raftmq.commands.lag import main as lag_main

    return lag_main(argv)


def _message(argv: list[str]) -> int:
    from raftmq.commands.message import main as message_main

    return message_main(argv)


def _trace(argv: list[str]) -> int:
    from raftmq.commands.trace import main as trace_main

    return trace_main(argv)


def _consume(argv: list[str]) -> int:
    from raftmq.commands.consume import main as consume_main

    return consume_main(argv)


def _tx(argv: list[str]) -> int:
    from raftmq.commands.tx import main as tx_main

    return tx_main(argv)


def _dlq(argv: list[str]) -> int:
    from raftmq.commands.dlq import main as dlq_main

    return dlq_main(argv)


def _status(argv: list[str]) -> int:
    from raftmq.commands.status import main as status_main

    return status_main(argv)


def _cluster(argv: list[str]) -> int:
    from raftmq.commands.cluster import main as cluster_main

    return cluster_main(argv)


def _user(argv: list[str]) -> int:
    from raftmq.commands.user import main as user_main

    return user_main(argv)


def _acl(argv: list[str]) -> int:
    from raftmq.commands.acl import main as acl_main

    return acl_main(argv)


def _bench(argv: list[str]) -> int:
    from raftmq.commands.bench import main as bench_main

    return bench_main(argv)


def _console(argv: list[str]) -> int:
    from raftmq.web.server import main as console_main

    return console_main(argv)


def _mqtt(argv: list[str]) -> int:
    from raftmq.mqtt.gateway import main as mqtt_main

    return mqtt_main(argv)


def _audit(argv: list[str]) -> int:
    from raftmq.spark.audit import main as audit_main

    return audit_main(argv)


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "dev": (_dev, "start a name server and three nodes on loopback; prints `ready ADDR`"),
    "node": (_node, "run one node (replicas of several Raft groups): --config node.toml"),
    "host": (_host, "run one machine's shards (several nodes) as one service: --config ..."),
    "layout": (_layout, "write the node configs of hosts with shards, one folder per host"),
    "namesrv": (_namesrv, "run a name server (routes: which group leads which queues)"),
    "topic": (_topic, "create, list, describe, update and delete topics"),
    "send": (_send, "send a message (`send --topic T TEXT`) or a load (`--count N --size B`)"),
    "consume": (_consume, "consume a topic in a consumer group, committing offsets"),
    "lag": (_lag, "how far a consumer group is behind, per queue"),
    "user": (_user, "users clients log in as (SCRAM-SHA-256): add, remove, list, verifier"),
    "acl": (_acl, "who may publish, subscribe or administer what: add, remove, list"),
    "group": (_group, "consumer groups: list, describe, reset-offsets, delete"),
    "message": (_message, "look a message up by id (`message get ID`) or by key"),
    "trace": (_trace, "the life of one traced message: sent, stored, delivered, acked"),
    "tx": (_tx, "transactions: list, show; commit or roll back a half message"),
    "dlq": (_dlq, "dead letters of a simple consumer group: list, show, resend, purge"),
    "status": (_status, "groups, leaders, terms, indexes, lag and node liveness"),
    "cluster": (_cluster, "group replicas: status, transfer-leader, add/remove/replace-replica"),
    "bench": (_bench, "benchmarks: `bench produce|e2e|consume|topics|failover|txn`"),
    "demo": (_demo, "run a local 3-replica Raft group on real CommitLogs and show failover"),
    "sim": (_sim, "deterministic simulation of the Raft core (seeds, faults, mutations)"),
    "chaos": (_chaos, "fault-injection runs (`chaos run`) and history checks (`chaos check`)"),
    "console": (_console, "serve the HTTP API (/api/v1) and the web console: --listen HOST:PORT"),
    "mqtt": (_mqtt, "an MQTT 3.1.1 gateway to the cluster: --listen HOST:PORT"),
    "audit": (_audit, "reconcile a chaos history with a full read of the cluster, on Spark"),
}


def _global_options(argv: list[str]) -> list[str] | None:
    """Take the options that come before the command into the environment, where the
    client's connections read them: `--tls-ca FILE` (every connection is TLS trusting
    that CA; RAFTMQ_TLS_CA), `--user NAME` and `--password-file FILE` (log in with
    SCRAM-SHA-256; RAFTMQ_USER, RAFTMQ_PASSWORD). None when one is malformed."""
    from transport.scram import PASSWORD_ENV, USER_ENV
    from transport.tls import CA_ENV

    while argv and argv[0].startswith(("--tls-ca", "--user", "--password-file")):
        opt, eq, value = argv[0].partition("=")
        if opt not in ("--tls-ca", "--user", "--password-file"):
            break
        if not eq:
            if len(argv) < 2:
                print(f"raftmq: {opt} needs a value", file=sys.stderr)
                return None
            value, argv = argv[1], argv[1:]
        argv = argv[1:]
        if opt == "--user":
            os.environ[USER_ENV] = value
            continue
        if not os.path.isfile(value):
            print(f"raftmq: {opt}: file {value!r} does not exist", file=sys.stderr)
            return None
        if opt == "--tls-ca":
            os.environ[CA_ENV] = value
        else:
            with open(value, encoding="utf-8") as f:
                os.environ[PASSWORD_ENV] = f.read().rstrip("\n")
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rest = _global_options(argv)
    if rest is None:
        return 2
    argv = rest
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: raftmq [--tls-ca FILE] [--user NAME [--password-file FILE]] COMMAND [ARGS]"
              "\n\ncommands:")
        for name, (_, summary) in COMMANDS.items():
            print(f"  {name:<8} {summary}")
        return 0 if argv else 2
    entry = COMMANDS.get(argv[0])
    if entry is None:
        print(f"raftmq: unknown command {argv[0]!r}; try `raftmq --help`", file=sys.stderr)
        return 2
    return entry[0](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
