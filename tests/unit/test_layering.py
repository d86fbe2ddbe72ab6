"""The import layering, read from the code's own imports (``ast``; nothing is imported or run).

- no import cycle between our modules (module-level and function-level imports alike; imports under
  ``if TYPE_CHECKING:`` are left out, they never run);
- the services (gateway, rollout_worker, reward_service, trainer) never import one another: they talk
  over the bus;
- ``schemas`` imports nothing of ours, nor do ``demo_agents`` (the demo's agents) and ``examples`` (what
  users copy; not shipped, so nothing shipped imports it);
- the ground (``infra`` but ``flywheel``) imports no service and no application module, and
  no service imports the application: the CLI, the embedded stack and the demo sit on top of all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("gateway", "rollout_worker", "reward_service", "trainer")
PACKAGES = (*SERVICES, "schemas", "infra", "demo_agents", "examples")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in PACKAGES:
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


def _layer(module: str) -> str:
    """``service``, ``ground``, ``application``, ``schemas``, ``demo_agents`` or ``examples``."""
    if _top(module) in SERVICES:
        return "service"
    if _top(module) == "infra":
        return "application" if module.split(".")[:2] == ["infra", "application"] else "ground"
    return _top(module)


# what each layer may import besides itself (schemas and the agents are checked on their own below)
ALLOWED = {
    "ground": {"schemas"},
    "service": {"schemas", "ground"},
    "application": {"schemas", "ground", "service", "demo_agents"},
}


def _layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{name} ({_layer(name)}) imports {target} ({_layer(target)})"
        for name, targets in graph.items()
        if _layer(name) in ALLOWED
        for target in targets
        if _layer(target) != _layer(name) and _layer(target) not in ALLOWED[_layer(name)]
    ]


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_ground_and_the_services_never_import_the_application() -> None:
    assert _layer_breaches(_graph()) == []


def test_the_layer_check_finds_a_breach() -> None:
    graph = {
        "infra.bus.base": {"flywheel.stack"},
        "gateway.app": {"flywheel.cli.main", "infra.bus.base"},
        "flywheel.stack": {"gateway.app", "infra.bus.base"},
        "infra.eventlog.store": {"trainer.service"},
    }
    assert _layer_breaches(graph) == [
        "infra.bus.base (ground) imports flywheel.stack (application)",
        "gateway.app (service) imports flywheel.cli.main (application)",
        "infra.eventlog.store (ground) imports trainer.service (service)",
    ]


def test_services_do_not_import_each_other() -> None:
    breaches = [
        f"{name} imports {target}"
        for name, targets in _graph().items()
        for target in targets
        if _top(name) in SERVICES and _top(target) in SERVICES and _top(target) != _top(name)
    ]
    assert breaches == []


def test_schemas_and_agents_import_nothing_of_ours() -> None:
    graph = _graph()
    breaches = [
        f"{name} imports {target}"
        for name, targets in graph.items()
        for target in targets
        if _top(name) in ("schemas", "demo_agents", "examples") and _top(target) != _top(name)
    ]
    assert breaches == []


def test_the_wheel_ships_every_package_the_code_imports() -> None:
    """The demo imports ``demo_agents``: an installed ``flywheel`` must carry it (and nothing imports
    ``examples``, which it does not carry)."""
    import tomllib

    shipped = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
            "packages"
        ]
    )
    imported = {
        _top(target) for name, targets in _graph().items() if _top(name) in shipped for target in targets
    }
    assert imported <= shipped, sorted(imported - shipped)
