"""``make_bus``: the bus the settings ask for (in-process by default, Kafka with ``FLYWHEEL_BUS=kafka``)."""

from __future__ import annotations

from pathlib import Path

from infra.bus.base import Bus
from infra.bus.kafka import KafkaBus
from infra.bus.memory import MemoryBus
from infra.settings import FlywheelSettings


def make_bus(settings: FlywheelSettings) -> Bus:
    """A bus (not started) for ``settings.bus``, with ``settings.topic_prefix`` applied."""
    if settings.bus == "kafka":
        return KafkaBus(
            settings.kafka_bootstrap,
            prefix=settings.topic_prefix,
            fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
            publish_timeout_s=settings.publish_timeout_s,
            park_path=park_path(settings),
        )
    return MemoryBus(
        prefix=settings.topic_prefix,
        publish_timeout_s=settings.publish_timeout_s,
        park_path=park_path(settings),
    )


def park_path(settings: FlywheelSettings) -> Path:
    """Where dead letters the bus would not take are parked (``infra.bus.deadletter``)."""
    return settings.data_dir / "deadletter-parked.jsonl"
