"""``flywheel version``."""

from __future__ import annotations

from importlib.metadata import version

import typer


def version_command() -> None:
    """Print Flywheel's version."""
    typer.echo(version("flywheel"))


def register(app: typer.Typer) -> None:
    app.command("version")(version_command)
