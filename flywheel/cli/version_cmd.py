"""``flywheel version`` (and ``flywheel --version``, which prints the same)."""

from __future__ import annotations

import json
from importlib.metadata import version
from typing import Annotated

import typer


def version_command(
    as_json: Annotated[bool, typer.Option("--json", help='Print {"version": "..."}.')] = False,
) -> None:
    """Print Flywheel's version."""
    if as_json:
        typer.echo(json.dumps({"version": version("flywheel")}))
        return
    typer.echo(version("flywheel"))


def register(app: typer.Typer) -> None:
    app.command("version")(version_command)
