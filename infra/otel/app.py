"""Wiring the exporter: ``build`` for a process of its own (``run_exporter``, through ``infra.service``)
and ``start_exporter`` for the embedded stack. Both need ``FLYWHEEL_OTLP_ENDPOINT``.
"""

from __future__ import annotations

import asyncio

from infra import service
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


def _required(settings: OtelSettings, bus: Bus) -> OtelExporter:
    exporter = build(settings, bus)
    if exporter is None:
        raise service.ServiceStartError("otel-export: set FLYWHEEL_OTLP_ENDPOINT (the OTLP/HTTP collector)")
    return exporter


async def run_exporter(settings: OtelSettings, stop: asyncio.Event | None = None) -> None:
    """Run the exporter alone until ``stop`` is set (or a signal arrives)."""
    await service.serve(settings, lambda bus: _required(settings, bus), name="otel-export", stop=stop)


async def start_exporter(settings: OtelSettings, bus: Bus) -> OtelExporter:
    """Build and start the exporter (the embedded stack's one line); FLYWHEEL_OTLP_ENDPOINT must be set."""
    exporter = _required(settings, bus)
    await exporter.start()
    return exporter
