"""The shape of the product code, read from its syntax trees (nothing is imported or run).

A module that grows past 450 lines holds two ideas; a function past 100 lines (nested functions count
inside the one that defines them) is a pipeline that should read as steps; an import inside a function
hides a dependency from the reader of the module's top. The product is what the wheel ships: the
contracts, the ground, the services and the application (not examples/ nor tests/).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("schemas", "infra", "gateway", "rollout_worker", "reward_service", "trainer", "flywheel")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 100
MAX_FUNCTION_IMPORTS = 100

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _product_files() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def long_functions(tree: ast.AST, limit: int) -> list[tuple[str, int]]:
    """Outermost functions (and methods) longer than ``limit`` lines, with their length."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, FUNCTIONS):
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    out.append((child.name, length))
            else:
                visit(child)

    visit(tree)
    return out


def function_level_imports(tree: ast.AST) -> int:
    """Import statements that stand inside a function body (at any depth)."""

    def count(node: ast.AST, inside: bool) -> int:
        n = 0
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, ast.Import | ast.ImportFrom):
                n += 1
            n += count(child, inside or isinstance(child, FUNCTIONS))
        return n

    return count(tree, False)


def test_no_product_module_is_over_450_lines() -> None:
    big = {
        str(p.relative_to(ROOT)): n
        for p in _product_files()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not big, big


def test_no_product_function_is_over_100_lines() -> None:
    long = [
        f"{p.relative_to(ROOT)}:{name} ({n} lines)"
        for p in _product_files()
        for name, n in long_functions(ast.parse(p.read_text(encoding="utf-8")), MAX_FUNCTION_LINES)
    ]
    assert not long, long


def test_the_product_imports_at_module_tops() -> None:
    per_file = {
        str(p.relative_to(ROOT)): n
        for p in _product_files()
        if (n := function_level_imports(ast.parse(p.read_text(encoding="utf-8"))))
    }
    total = sum(per_file.values())
    assert total < MAX_FUNCTION_IMPORTS, sorted(per_file.items(), key=lambda kv: -kv[1])[:15]


def test_the_checks_can_fail() -> None:
    source = (
        "def outer():\n"
        "    import os\n"
        "    def inner():\n"
        "        from sys import path\n"
        + "    x = 1\n" * 120
        + "class C:\n    def m(self):\n        import re\n"
    )
    tree = ast.parse(source)
    assert function_level_imports(tree) == 3
    assert long_functions(tree, MAX_FUNCTION_LINES) == [("outer", 124)]
