"""OpenTelemetry export: recorded episodes as spans following the GenAI semantic conventions.

- :mod:`infra.otel.spans` — events → span data (ids, names, ``gen_ai.*`` and ``flywheel.*`` attributes)
- :mod:`infra.otel.messages` — a call's messages in the conventions' shape, for content capture
- :mod:`infra.otel.exporter` — the ``otel-export`` consumer group: episodes and scores → OTLP/HTTP
- :mod:`infra.otel.forward` — that consumer in a process whose bus is its own: the events' bytes to
  :mod:`infra.otel.child`, a child process running the exporter
- :mod:`infra.otel.settings` — ``FLYWHEEL_OTLP_*``

Contract and tests: docs/observability.md.
"""
