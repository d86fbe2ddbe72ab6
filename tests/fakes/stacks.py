"""The embedded stack in front of the fake model server, for rollout tests: no engine, no trainer, no
event log; on Kafka every part on its own broker connection (``EmbeddedStack``'s ``bus_factory``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from flywheel.stack import EmbeddedStack, StackSettings
from tests.fakes.upstream import FakeUpstreamConfig, fake_upstream


def fake_model_stack(
    tmp_path: Path,
    *,
    kafka: str | None = None,
    topic_prefix: str = "",
    fake: FakeUpstreamConfig | None = None,
    **settings: Any,
) -> EmbeddedStack:
    """An unstarted stack (use ``async with``); ``kafka``: the broker's bootstrap address, else the
    in-process bus. ``settings`` override ``StackSettings`` fields."""
    base: dict[str, Any] = {
        "data_dir": tmp_path,
        "topic_prefix": topic_prefix,
        "run_trainer": False,
        "record_events": False,
    }
    bus_factory = None
    if kafka is not None:
        from infra.bus.kafka import KafkaBus

        base |= {"bus": "kafka", "kafka_bootstrap": kafka}
        bus_factory = partial(KafkaBus, kafka, prefix=topic_prefix, session_timeout_ms=6000)
    return EmbeddedStack(
        StackSettings(**{**base, **settings}),
        upstream=fake_upstream(fake or FakeUpstreamConfig(use_tools=False, keep_requests=False)),
        bus_factory=bus_factory,
    )
