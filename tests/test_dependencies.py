"""The dependency rules of DESIGN.md, held by reading every import statement.

* `raftlog` imports nothing above it (broker, namesrv, raftmq, chaos, bench).
* The wire (`wire`: frames, codes, the batch format) is the bottom layer of the protocol
  side: it imports no other raftmq package.
* The client SDK (`raftmq.client`) never reaches the broker: what it imports, and
  everything those import in turn, stays within the wire, plus the client side of the
  shared transport (`transport.connection` and the errors it raises, `transport.errors`;
  the client's sides of TLS and SCRAM, `transport.tls` and `transport.scram`, and the
  SCRAM mechanism's name, `wire.security`).
* The transport (`transport`) sits below the broker, the name server and the SDK: of
  them it imports only the frame format, `wire.protocol`, and the SCRAM mechanism's
  name, `wire.security`.
* The `raftmq` package (the SDK, `raftmq dev`, the cluster launcher) never reaches
  `chaos` or `bench`; only the CLI dispatches its `chaos` and `bench` commands to them.
* The CLI's client commands (`raftmq user`, `acl`, `send`, ...) never reach the broker,
  the name server or Raft.
* Nothing in the product imports `tests`.
* The broker, the name server and the transport reach a group's log and Raft core only
  through `GroupRuntime`'s door (`read_committed`, `read_raw`, `log_bounds`, ...): no
  `.log` or `.core` attribute is read anywhere in them.
* The node builds the service, the registrar and retention; none of them imports the
  node (the service states what it uses of its host as a protocol).
* The broker imports nothing of the `raftmq` package but the SQL92 filter compiler,
  `raftmq.filter` (FETCH decides a consumer's filter on the node), and the compiler
  imports nothing first-party outside itself, so the broker reaches no SDK code through
  it. (Importing it runs `raftmq/__init__`, which loads the SDK's modules into a node;
  they import nothing of the broker, so no circle.)
* The broker's layers (`docs/architecture.md`): `broker.state` imports nothing else of
  the broker; `broker.runtime` only the state and the config; the doors and the duties
  only those below them (and the duties the transaction operations of
  `broker.doors.transactions`, pinned); only `broker.node` composes them.

Imports are read with `ast` wherever they appear (module level, inside functions, under
``TYPE_CHECKING``), relative ones resolved, so a lazy import cannot slip past.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT as ROOT

PACKAGES = ("raftlog", "wire", "transport", "broker", "namesrv", "raftmq", "chaos", "bench", "tests")
ABOVE_RAFTLOG = ("wire", "transport", "broker", "namesrv", "raftmq", "chaos", "bench", "tests")
CLIENT_MAY_USE = {  # pinned: widen on purpose
    "wire", "wire.protocol", "wire.records", "wire.produce",
    "wire.requests",  # the typed requests and answers both ends build and decode
    "wire.txn",  # the coordinator hash client and broker must compute alike
    "wire.trace",  # trace records: the node writes them, the SDK reads them
    "transport", "transport.connection", "transport.errors",
    "transport.tls", "transport.scram",  # the client's sides of TLS and SCRAM-SHA-256
    "transport.tlsstream",  # the TLS stream `transport.tls` puts over a trio socket
    "transport.framelink",  # the connection's link on asyncio (frames read in a callback)
    "wire.security",  # the SCRAM mechanism's name, as the node names it
    # the SQL92 filter compiler: selectors compile where the consumer subscribes
    "raftmq.filter", "raftmq.filter.compiler", "raftmq.filter.syntax", "raftmq.filter.values",
}
# what the broker may import of the `raftmq` package (its root comes with any of it)
BROKER_MAY_USE_OF_RAFTMQ = {  # pinned: widen on purpose
    "raftmq", "raftmq.filter", "raftmq.filter.compiler", "raftmq.filter.syntax",
    "raftmq.filter.values",
}
TRANSPORT_MAY_USE = {  # pinned: widen on purpose
    "wire", "wire.protocol",
    "wire.security",  # the SCRAM mechanism both sides name
}


@cache
def modules() -> dict[str, Path]:
    """Every first-party module by dotted name (a package by its ``__init__``)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """First-party modules `source` (the text of `module`) imports, with the packages
    they live in (importing ``a.b.c`` runs ``a`` and ``a.b`` too)."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                stem = here[: len(here) - node.level + 1]
                base = ".".join([*stem, base] if base else stem)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    out: set[str] = set()
    for name in names:
        parts = name.split(".")
        if parts[0] not in PACKAGES:
            continue
        out.update(".".join(parts[:k]) for k in range(1, len(parts) + 1))
    return {m for m in out if m in modules()}


def imports(module: str) -> set[str]:
    path = modules()[module]
    return imports_of(path.read_text(), module, path.name == "__init__.py")


def closure(start: set[str]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for m in imports(todo.pop()) - seen:
            seen.add(m)
            todo.append(m)
    return seen


def top(module: str) -> str:
    return module.partition(".")[0]


def test_the_reader_sees_every_kind_of_import() -> None:
    src = (
        "import broker.node\n"
        "from . import producer\n"
        "from ..cli import main\n"
        "def f():\n"
        "    from tests.live_cluster import x\n"
    )
    found = imports_of(src, "raftmq.client.admin")
    assert {"broker.node", "raftmq.client.producer", "raftmq.cli", "tests.live_cluster"} <= found
    assert {"broker", "raftmq", "tests"} <= found


@pytest.mark.parametrize("module", sorted(m for m in modules() if top(m) == "raftlog"))
def test_raftlog_imports_nothing_above_it(module: str) -> None:
    above = sorted(m for m in imports(module) if top(m) in ABOVE_RAFTLOG)
    assert above == [], f"{module} imports {above}"


@pytest.mark.parametrize("module", sorted(m for m in modules() if top(m) == "wire"))
def test_the_wire_imports_no_other_raftmq_package(module: str) -> None:
    other = sorted(m for m in imports(module) if top(m) != "wire")
    assert other == [], f"{module} imports {other}"


def test_the_client_uses_the_wire_and_never_the_broker() -> None:
    client = {m for m in modules() if m == "raftmq.client" or m.startswith("raftmq.client.")}
    reached = closure(client)
    outside = sorted(m for m in reached - client - CLIENT_MAY_USE - {"raftmq"}  # the SDK's package
                     if not m.startswith("wire.requests."))  # every area's typed requests
    assert outside == [], f"the client SDK reaches {outside}"


# the `raftmq` command and its `bench` subcommand: they dispatch to `chaos` and `bench`
CLI_DISPATCHERS = {"raftmq.cli", "raftmq.__main__", "raftmq.commands.bench"}


@pytest.mark.parametrize(
    "module", sorted(m for m in modules() if top(m) == "raftmq" and m not in CLI_DISPATCHERS))
def test_the_product_package_never_reaches_the_harness_or_the_benchmarks(module: str) -> None:
    """`raftmq dev`, the SDK and the cluster launcher stand on their own; only the CLI's
    `chaos` and `bench` commands dispatch to those packages."""
    reached = sorted(m for m in closure({module}) if top(m) in ("chaos", "bench"))
    assert reached == [], f"{module} reaches {reached}"


@pytest.mark.parametrize("module", sorted(
    m for m in modules() if m.startswith("raftmq.commands.") and m not in CLI_DISPATCHERS))
def test_the_clis_client_commands_never_reach_the_server_side(module: str) -> None:
    """`raftmq user`, `raftmq acl`, `raftmq send`, ... talk to a cluster as clients: user
    names, verifiers and ACL operations come from the wire, not from the broker."""
    reached = sorted(m for m in closure({module}) if top(m) in ("broker", "raftlog", "namesrv"))
    assert reached == [], f"{module} reaches {reached}"


@pytest.mark.parametrize("module", sorted(m for m in modules() if top(m) == "transport"))
def test_the_transport_uses_only_the_frame_format_above_it(module: str) -> None:
    above = sorted(m for m in imports(module) if top(m) != "transport"
                   and m not in TRANSPORT_MAY_USE)
    assert above == [], f"{module} imports {above}"


@pytest.mark.parametrize("module", sorted(m for m in modules() if top(m) == "broker"))
def test_the_broker_uses_of_raftmq_only_the_filter_compiler(module: str) -> None:
    bad = sorted(m for m in imports(module)
                 if top(m) == "raftmq" and m not in BROKER_MAY_USE_OF_RAFTMQ)
    assert bad == [], f"{module} imports {bad}"


@pytest.mark.parametrize("module", sorted(m for m in modules()
                                          if m == "raftmq.filter" or m.startswith("raftmq.filter.")))
def test_the_filter_compiler_imports_nothing_first_party_outside_itself(module: str) -> None:
    bad = sorted(m for m in imports(module) if m not in BROKER_MAY_USE_OF_RAFTMQ)
    assert bad == [], f"{module} imports {bad}"


def test_the_broker_rule_catches_an_sdk_import() -> None:
    found = imports_of("from raftmq.client.reads import fetch\n", "broker.doors.reads")
    assert "raftmq.client.reads" in found
    assert "raftmq.client.reads" not in BROKER_MAY_USE_OF_RAFTMQ


@pytest.mark.parametrize("module", sorted(m for m in modules() if top(m) != "tests"))
def test_the_product_never_imports_tests(module: str) -> None:
    bad = sorted(m for m in imports(module) if top(m) == "tests")
    assert bad == [], f"{module} imports {bad}"


_RUNTIME_INSIDES = frozenset({"log", "core"})


def test_the_door_reader_sees_attribute_reads() -> None:
    src = "def f(g):\n    return g.log.entries(1, 2, 3), g.core.commit, log.info\n"
    found = {n.attr for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute)}
    assert _RUNTIME_INSIDES <= found


@pytest.mark.parametrize("module", sorted(
    m for m in modules() if top(m) in ("broker", "namesrv", "transport")))
def test_the_broker_reads_a_group_only_through_the_runtimes_door(module: str) -> None:
    tree = ast.parse(modules()[module].read_text())
    bad = sorted({f"line {n.lineno}: .{n.attr}" for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr in _RUNTIME_INSIDES})
    assert bad == [], f"{module} reaches into a group runtime: {bad}"


def test_the_node_builds_the_service_and_the_registrar_not_the_other_way() -> None:
    for module in ("broker.doors.service", "broker.runtime.groups", "broker.runtime.registrar", "broker.doors.consumers",
                   "broker.duties.retention"):
        assert "broker.node" not in closure({module}), f"{module} reaches broker.node"


# what each broker layer may import of the broker besides itself and the package roots
BROKER_LAYERS = {
    "broker.state": {"broker.state"},
    "broker.runtime": {"broker.state", "broker.config"},
    "broker.doors": {"broker.state", "broker.runtime", "broker.config"},
    "broker.duties": {"broker.state", "broker.runtime", "broker.config",
                      # pinned: the markers, check-back and status the duties drive are
                      # the transaction operations the doors answer with
                      "broker.doors.transactions", "broker.doors.security"},
}


def _layer(module: str) -> str | None:
    return next((layer for layer in BROKER_LAYERS
                 if module == layer or module.startswith(layer + ".")), None)


@pytest.mark.parametrize("module", sorted(m for m in modules() if _layer(m)))
def test_each_broker_layer_imports_only_the_layers_below_it(module: str) -> None:
    layer = _layer(module)
    assert layer is not None
    allowed = BROKER_LAYERS[layer] | {layer}
    bad = sorted(m for m in imports(module) if top(m) == "broker" and m != "broker"
                 and not any(m == a or m.startswith(a + ".") for a in allowed)
                 and m not in {a.rpartition(".")[0] for a in allowed})
    assert bad == [], f"{module} ({layer}) imports {bad}"


def test_the_layer_rule_catches_an_upward_import() -> None:
    found = imports_of("from broker.doors.service import BrokerService\n",
                       "broker.state.statemachine")
    assert "broker.doors.service" in found
    assert not any(m.startswith("broker.doors") for m in BROKER_LAYERS["broker.state"])


def test_the_broker_is_the_four_layers_the_config_and_the_node() -> None:
    top_level = {m for m in modules() if top(m) == "broker" and m.count(".") == 1}
    assert top_level == {*BROKER_LAYERS, "broker.config", "broker.node"}


def test_a_nodes_configuration_loads_without_the_state_machine() -> None:
    """`raftmq dev` and every tool that reads a node's config load `broker.config`: the
    ConsumeQueue chunk size it defaults comes from the chunk format, not from the parts."""
    reached = sorted(m for m in closure({"broker.config"})
                     if m == "broker.state.statemachine" or m.startswith("broker.state.parts"))
    assert reached == [], f"broker.config reaches {reached}"


def runtime_imports(module: str) -> set[str]:
    """What importing `module` imports at once: module-level statements, not those inside
    functions or under ``if TYPE_CHECKING:``."""
    path = modules()[module]
    tree = ast.parse(path.read_text())
    kept: list[ast.stmt] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
            kept.extend(stmt.orelse)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom, ast.If, ast.Try)):
            kept.append(stmt)
    return imports_of(ast.unparse(ast.Module(body=kept, type_ignores=[])), module,
                      path.name == "__init__.py")


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_at_run_time() -> None:
    """Module-level imports form no circle (a package importing its own submodules, as
    ``__init__`` re-exports do, is not one); circles that exist only for type checking
    are allowed."""
    edges = {m: {d for d in runtime_imports(m) if d != m and not m.startswith(d + ".")}
             for m in modules() if top(m) != "tests"}
    assert import_cycles(edges) == []


# test folders that gather one feature across the layers of a package
FEATURE_FOLDERS = {
    "tests/broker/security": "users, ACLs and authentication: parts, the guard, live nodes",
    "tests/broker/transactions": "both transaction models: parts, doors, duties, live nodes",
    "tests/cli": "the `raftmq` command and `raftmq dev` (raftmq.cli, raftmq.commands)",
    "tests/client": "the SDK (raftmq.client)",
    "tests/fuzz": "the fuzzing targets and their saved corpus",
}


def test_test_folders_mirror_the_packages() -> None:
    """A test of `broker/state/...` is under `tests/broker/state/`; the few folders that
    gather a feature across layers say so above."""
    folders = {p.parent.relative_to(ROOT).as_posix()
               for p in (ROOT / "tests").rglob("test_*.py") if "corpus" not in p.parts}
    strays = sorted(f for f in folders - {"tests"} - set(FEATURE_FOLDERS)
                    if not (ROOT / f.removeprefix("tests/")).is_dir()
                    and not (ROOT / "raftmq" / f.removeprefix("tests/")).is_dir())
    assert strays == [], f"test folders that mirror no package: {strays}"
