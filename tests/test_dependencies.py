"""The dependency rules of DESIGN.md, held by reading every import statement.

* `raftlog` imports nothing above it (broker, namesrv, raftmq, chaos, bench).
* The client SDK (`raftmq.client`) reaches into the broker only for the shared wire
  modules: what it imports, and everything those import in turn, stays within
  `broker.protocol`, `broker.records` and `broker.produce_wire`.
* Nothing in the product imports `tests`.

Imports are read with `ast` wherever they appear (module level, inside functions, under
``TYPE_CHECKING``), relative ones resolved, so a lazy import cannot slip past.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("raftlog", "broker", "namesrv", "raftmq", "chaos", "bench", "tests")
ABOVE_RAFTLOG = ("broker", "namesrv", "raftmq", "chaos", "bench", "tests")
CLIENT_MAY_USE = {"broker", "broker.protocol", "broker.records",
                  "broker.produce_wire"}  # pinned: widen on purpose


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


def test_the_client_uses_only_the_shared_wire_modules_of_the_broker() -> None:
    client = {m for m in modules() if m == "raftmq.client" or m.startswith("raftmq.client.")}
    reached = closure(client)
    outside = sorted(reached - client - CLIENT_MAY_USE - {"raftmq"})  # raftmq: the SDK's package
    assert outside == [], f"the client SDK reaches {outside}"


@pytest.mark.parametrize("module", sorted(m for m in modules() if top(m) != "tests"))
def test_the_product_never_imports_tests(module: str) -> None:
    bad = sorted(m for m in imports(module) if top(m) == "tests")
    assert bad == [], f"{module} imports {bad}"
