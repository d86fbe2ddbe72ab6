"""Wiring the exporter: ``build`` is its one constructor; ``flywheel.assembly.build_otel_exporter``
calls it for ``flywheel otel-export`` (a process of its own, through ``flywheel.alone``), and
the export child (``infra.otel.child``) calls it too. ``build_forwarder`` is what a process whose bus is
its own runs instead (the embedded stack, ``flywheel gateway`` on the in-process bus: the consumer there,
the export work in the child; ``infra.otel.forward``). Without ``FLYWHEEL_OTLP_ENDPOINT`` there is
nothing to build.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from infra.bus.base import Bus
from infra.otel.exporter import OtelExporter, make_exporter
from infra.otel.forward import ExportForwarder
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


def build_forwarder(
    settings: OtelSettings, bus: Bus, registry: CollectorRegistry | None = None
) -> ExportForwarder | None:
    """The consumer that hands events to the export child, or None when no endpoint is set."""
    if not settings.otlp_endpoint:
        return None
    return ExportForwarder(bus, settings, registry=registry)
