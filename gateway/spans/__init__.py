"""The agent's own OpenTelemetry spans: OTLP/HTTP decoding and the intake that attaches them to episodes."""
