"""``flywheel otel-export``: the OpenTelemetry exporter alone, beside a distributed stack (docs/observability.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from flywheel.alone import serve_otel_exporter
from flywheel.cli.common import run_service
from infra.otel.settings import OtelSettings


def otel_export_command(
    endpoint: Annotated[
        str | None, typer.Option("--endpoint", help="OTLP/HTTP receiver; default FLYWHEEL_OTLP_ENDPOINT")
    ] = None,
) -> None:
    """Export recorded episodes as OpenTelemetry GenAI spans (consumer group otel-export) until stopped."""
    settings = OtelSettings()
    if endpoint is not None:
        settings = settings.model_copy(update={"otlp_endpoint": endpoint})
    run_service(serve_otel_exporter(settings))


def register(app: typer.Typer) -> None:
    app.command("otel-export")(otel_export_command)
