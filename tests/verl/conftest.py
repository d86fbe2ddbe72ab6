"""The verl parity tests run in the environment with the `verl` extra (infra/scripts/test.sh makes it);
elsewhere they are skipped, and with ``FLYWHEEL_REQUIRE_VERL=1`` a missing verl is a failure."""

from __future__ import annotations

import importlib.util
import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("verl") is not None:
        return
    if os.environ.get("FLYWHEEL_REQUIRE_VERL") == "1":
        raise pytest.UsageError("FLYWHEEL_REQUIRE_VERL=1 but verl is not installed in this environment")
    skip = pytest.mark.skip(reason="verl is not installed here (the `verl` extra has its own environment)")
    for item in items:
        if "verl" in item.keywords:
            item.add_marker(skip)
