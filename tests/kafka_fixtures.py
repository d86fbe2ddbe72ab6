"""Fixtures for bus tests, on the in-process bus and on the live broker.

- ``kafka_bootstrap`` (session): ``FLYWHEEL_KAFKA_BOOTSTRAP`` or ``127.0.0.1:9092``, checked once.
  Unreachable: the kafka-marked tests fail when ``CI=true`` and are skipped otherwise.
- ``topic_prefix``: a fresh prefix per test, so tests sharing a broker never see each other's events.
- ``bus_kind``: ``"memory"`` and ``"kafka"`` (marked ``kafka``); ``bus``: a started bus of that kind;
  ``make_bus``: an async factory of more buses of the same kind and prefix (restarts, second process).
  Reuse them in any suite with ``@pytest.mark.parametrize("bus_kind", ...)`` or by requesting ``bus``.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from infra.bus.base import Bus

MakeBus = Callable[..., Awaitable[Bus]]


def _reachable(bootstrap: str, timeout: float = 3.0) -> str | None:
    """None when a TCP connection to the first bootstrap server succeeds, else the reason."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return None
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    bootstrap = os.environ.get("FLYWHEEL_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    reason = _reachable(bootstrap)
    if reason is not None:
        message = f"Kafka broker at {bootstrap} is unreachable ({reason})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; with CI=true this is a failure", pytrace=False)
        pytest.skip(message + "; start one with `flywheel kafka start`")
    return bootstrap


@pytest.fixture(autouse=True)
def _kafka_gate(request: pytest.FixtureRequest) -> None:
    """Every kafka-marked test needs the broker: skip or fail it here, before it starts."""
    if request.node.get_closest_marker("kafka") is not None:
        request.getfixturevalue("kafka_bootstrap")


@pytest.fixture
def topic_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}."


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
def bus_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
async def make_bus(
    request: pytest.FixtureRequest, bus_kind: str, topic_prefix: str
) -> AsyncIterator[MakeBus]:
    """``await make_bus(**kwargs)``: a started bus of ``bus_kind``; all are stopped after the test."""
    started: list[Bus] = []

    async def factory(**kwargs: object) -> Bus:
        bus: Bus
        if bus_kind == "kafka":
            from infra.bus.kafka import KafkaBus

            bootstrap = request.getfixturevalue("kafka_bootstrap")
            bus = KafkaBus(bootstrap, prefix=topic_prefix, **kwargs)  # type: ignore[arg-type]
        else:
            from infra.bus.memory import MemoryBus

            bus = MemoryBus(prefix=topic_prefix, **kwargs)  # type: ignore[arg-type]
        await bus.start()
        started.append(bus)
        return bus

    yield factory
    for bus in reversed(started):
        await bus.stop()


@pytest.fixture
async def bus(make_bus: MakeBus) -> Bus:
    return await make_bus()
