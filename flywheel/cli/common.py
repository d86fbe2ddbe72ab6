"""Helpers the CLI commands share: one-line errors with meaningful exit codes, JSON output, settings.

Exit codes: 0 done (also "nothing matched"), 1 something it depends on is wrong (unreachable, locked,
refused), 2 the command line itself is wrong.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

import orjson
import typer
from pydantic import ValidationError

from infra.service import ServiceStartError, run
from infra.settings import FlywheelSettings, exposure_problem

EXIT_FAILED = 1
EXIT_USAGE = 2

ADMIN_URL_HELP = "A running Flywheel's admin API (`flywheel up` prints it); env FLYWHEEL_ADMIN_URL."
JSON_HELP = "Print one JSON object instead of tables."


def fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    """Print ``message`` as one line on stderr and exit with ``code``."""
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    raise typer.Exit(code)


def usage(message: str) -> NoReturn:
    fail(message, EXIT_USAGE)


def run_service(main: Coroutine[Any, Any, None]) -> None:
    """Run one service alone (``infra.service.serve``); a service that cannot start is one line, exit 1."""
    try:
        run(main)
    except ServiceStartError as exc:
        fail(str(exc))


def print_json(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n")


def quiet_libraries() -> None:
    """aiokafka logs connection failures with tracebacks; the ops commands report them in one line."""
    for name in ("aiokafka", "kafka"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def load_settings() -> FlywheelSettings:
    quiet_libraries()
    try:
        return FlywheelSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(str(first.get("msg", exc)).removeprefix("Value error, "))


def admin_url(option: str | None) -> str | None:
    return option or os.environ.get("FLYWHEEL_ADMIN_URL") or None


def refuse_exposure(host: str, token: str, setting: str = "FLYWHEEL_ADMIN_TOKEN") -> None:
    """One line and exit 1 when a server would listen beyond loopback with a placeholder or short token."""
    problem = exposure_problem(host, token, setting)
    if problem is not None:
        fail(problem)


def register_ls(group: typer.Typer, command: Callable[..., None]) -> None:
    """``ls`` lists a group's things; ``list`` stays a hidden alias for it (every group, one spelling)."""
    group.command("ls")(command)
    group.command("list", hidden=True)(command)
