"""Wiring the exporter: ``build`` is its one constructor; ``infra.application.assembly.build_otel_exporter``
calls it for the embedded stack and for ``flywheel otel-export`` (a process of its own, through
``infra.application.alone``). Without ``FLYWHEEL_OTLP_ENDPOINT`` there is nothing to build.
"""

from __future__ import annotations

from infra.bus.base import Bus
from infra.otel.exporter import OtelExporter, make_exporter
from infra.otel.settings import OtelSettings


def build(settings: OtelSettings, bus: Bus) -> OtelExporter | None:
    """The exporter the settings ask for, or None when no endpoint is set."""
    if not settings.otlp_endpoint:
        return None
    return make_exporter(
        bus,
        settings.otlp_endpoint,
        service_name=settings.otlp_service_name,
        capture_content=settings.otlp_capture_content,
        score_wait_s=settings.otlp_score_wait_s,
        max_queue=settings.otlp_max_queue,
    )
