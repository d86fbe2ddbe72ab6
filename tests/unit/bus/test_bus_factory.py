"""``make_bus`` picks the bus the settings ask for and applies the topic prefix."""

from __future__ import annotations

from infra.bus import Bus
from infra.bus.factory import make_bus
from infra.bus.kafka import KafkaBus
from infra.bus.memory import MemoryBus
from infra.settings import FlywheelSettings


def test_memory_by_default() -> None:
    bus = make_bus(FlywheelSettings(topic_prefix="t1."))
    assert isinstance(bus, MemoryBus) and isinstance(bus, Bus)
    assert bus.prefix == "t1."


def test_kafka_when_asked() -> None:
    bus = make_bus(FlywheelSettings(bus="kafka", kafka_bootstrap="127.0.0.1:19092", topic_prefix="t2."))
    assert isinstance(bus, KafkaBus) and isinstance(bus, Bus)
    assert bus.bootstrap == "127.0.0.1:19092"
    assert bus.physical("flywheel.episodes") == "t2.flywheel.episodes"
