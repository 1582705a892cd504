"""A live cluster with logins and ACLs on, as the gateway and console tests need one: the
superuser `ROOT` (from the node config), one more user with the ACL rules given, and the
topics created, all done through the CLI and SDK as an operator would."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from broker.doors.security import make_credential
from broker.state.parts.users import format_verifier
from raftmq.client import connect_admin
from raftmq.commands import acl as acl_cmd
from raftmq.commands import user as user_cmd
from raftmq.localcluster import LocalCluster
from tests.conftest import live_cluster
from transport.scram import PASSWORD_ENV, USER_ENV, Credentials

__all__ = ["ROOT", "secured_cluster"]

ROOT = Credentials("root", "root's long password")


@contextmanager
def secured_cluster(base: Path, *, groups: int, user: Credentials,
                    rules: Sequence[Sequence[str]] = (), topics: dict[str, int] | None = None
                    ) -> Iterator[LocalCluster]:
    """Three nodes and `groups` groups with authentication and authorization on; `user`
    added with each of `rules` (`raftmq acl add` arguments after `--user NAME`), `topics`
    (name -> queues) created by ROOT. The environment is left as it was."""
    keys = {"authenticate": True, "authorize": True, "superusers": [ROOT.user],
            "superuser_scram": format_verifier(make_credential(ROOT.password))}
    with live_cluster(base, nodes=3, groups=groups, node_overrides=keys,
                      credentials=ROOT) as c:
        mp = pytest.MonkeyPatch()
        try:
            mp.setenv(USER_ENV, ROOT.user)
            mp.setenv(PASSWORD_ENV, ROOT.password)
            mp.setenv("RAFTMQ_NEW_PASSWORD", user.password)
            ns = ["--namesrv", c.namesrv_addr]
            assert user_cmd.main(["add", user.user, *ns]) == 0
            for rule in rules:
                assert acl_cmd.main(["add", "--user", user.user, *rule, *ns]) == 0
            if topics:
                with connect_admin(c.namesrv_addr) as admin:
                    for topic, queues in topics.items():
                        admin.create_topic(topic, queues)
        finally:
            mp.undo()
        yield c
