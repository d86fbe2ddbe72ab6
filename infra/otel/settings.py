"""Settings of the OpenTelemetry export (``FLYWHEEL_OTLP_*``): off unless an endpoint is set."""

from __future__ import annotations

from pydantic import Field

from infra.settings import FlywheelSettings


class OtelSettings(FlywheelSettings):
    otlp_endpoint: str = Field(
        default="",
        description="OTLP/HTTP collector that recorded episodes are exported to as GenAI spans: a base URL "
        "(``/v1/traces`` is appended) or the full traces URL; empty: no export. Headers, timeout and TLS "
        "come from the standard OTEL_EXPORTER_OTLP_* variables",
    )
    otlp_capture_content: bool = Field(
        default=False,
        description="put each call's messages on its span (gen_ai.input.messages, gen_ai.output.messages); "
        "off: only sizes, models, tokens and Flywheel's fields leave the process",
    )
    otlp_service_name: str = Field(
        default="flywheel", max_length=256, description="service.name of the spans"
    )
    otlp_score_wait_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="how long a finished episode's span waits for its score before it is exported without "
        "one (a later score then arrives as an evaluation span under it)",
    )
    otlp_max_queue: int = Field(
        default=8192,
        ge=64,
        le=1_000_000,
        description="spans queued for export; more are dropped (the SDK logs it)",
    )
