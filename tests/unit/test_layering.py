"""The folders are the layers, read from the code's own imports (``ast``; nothing is imported or run).

    schemas < infra < services (gateway, rollout_worker, reward_service, trainer) < flywheel < examples

- a module imports only from its own layer or the layers below it: no arrow back (``infra`` never
  imports a service, a service never imports ``flywheel``, nothing shipped imports ``examples``);
- the services never import one another: they talk over the bus;
- no import cycle between our modules.

Module-level and function-level imports count alike; imports under ``if TYPE_CHECKING:`` are left out
(they never run). ``infra`` is one layer: everything the services stand on.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "rollout_worker", "reward_service", "trainer")
# each top-level folder's layer: a module may import its own layer and those below it
LAYER = {"schemas": 0, "infra": 1, **dict.fromkeys(SERVICES, 2), "flywheel": 3, "examples": 4}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in LAYER:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name == "TYPE_CHECKING":
                skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The modules of ours that ``name`` imports (``from a.b import c`` is ``a.b.c`` when that is one)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    yield full
                elif base in modules:
                    yield base


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: set(_imports(name, path, modules)) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _top(module: str) -> str:
    return module.split(".")[0]


def _layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Each import that points up a layer, or from one service into another."""
    breaches = []
    for name, targets in graph.items():
        for target in sorted(targets):
            source, dest = _top(name), _top(target)
            if LAYER[dest] > LAYER[source]:
                breaches.append(f"{name} ({source}) imports {target} ({dest}), a layer above it")
            elif source in SERVICES and dest in SERVICES and dest != source:
                breaches.append(f"{name} imports {target}: services talk over the bus")
    return breaches


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_import_points_down_the_layers() -> None:
    assert _layer_breaches(_graph()) == []


def test_the_layer_check_finds_a_breach() -> None:
    graph = {
        "infra.bus.base": {"schemas.events", "trainer.service"},
        "gateway.app": {"flywheel.cli.main", "infra.bus.base", "trainer.service"},
        "flywheel.stack": {"gateway.app", "infra.bus.base", "examples.demo.run"},
        "schemas.events": {"infra.bus.base"},
        "examples.demo.run": {"flywheel.stack", "gateway.app"},
    }
    assert _layer_breaches(graph) == [
        "infra.bus.base (infra) imports trainer.service (trainer), a layer above it",
        "gateway.app (gateway) imports flywheel.cli.main (flywheel), a layer above it",
        "gateway.app imports trainer.service: services talk over the bus",
        "flywheel.stack (flywheel) imports examples.demo.run (examples), a layer above it",
        "schemas.events (schemas) imports infra.bus.base (infra), a layer above it",
    ]


def test_the_wheel_ships_every_package_the_code_imports() -> None:
    """What the wheel carries imports only what it carries (``examples`` stays in the checkout)."""
    shipped = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
            "packages"
        ]
    )
    imported = {
        _top(target) for name, targets in _graph().items() if _top(name) in shipped for target in targets
    }
    assert imported <= shipped, sorted(imported - shipped)
