"""The embedded stack's seams for tests and benchmarks: an upstream of the caller's instead of the engine,
a broker instead of the in-process bus, more workers, and the environment a ``flywheel`` process needs to
join it. The rollouts through them run in tests/integration/rollouts/test_rollout_flow.py (both buses)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flywheel.stack import EmbeddedStack, StackSettings
from infra.bus.memory import MemoryBus
from tests.fakes.upstream import FakeUpstreamConfig, fake_upstream

pytestmark = pytest.mark.timeout(30)


def _settings(tmp_path: Path, **kw: Any) -> StackSettings:
    return StackSettings(data_dir=tmp_path, run_trainer=False, record_events=False, **kw)


async def test_what_the_seams_refuse(tmp_path: Path) -> None:
    up = fake_upstream(FakeUpstreamConfig())
    with pytest.raises(ValueError, match="run_trainer=False"):
        EmbeddedStack(StackSettings(data_dir=tmp_path, record_events=False), upstream=up)
    with pytest.raises(ValueError, match="not both"):
        EmbeddedStack(_settings(tmp_path), upstream=up, vllm_url="http://vllm:8000/v1")
    with pytest.raises(ValueError, match="model_dir"):
        EmbeddedStack(_settings(tmp_path))
    with pytest.raises(ValueError, match="a bus_factory connects to a broker"):
        EmbeddedStack(_settings(tmp_path), upstream=up, bus_factory=MemoryBus)
    await up.client.aclose()


async def test_env_joins_a_process_to_the_stack(tmp_path: Path) -> None:
    up = fake_upstream(FakeUpstreamConfig())
    settings = _settings(tmp_path, bus="kafka", kafka_bootstrap="k:9092", topic_prefix="p.")
    stack = EmbeddedStack(settings, upstream=up, bus_factory=MemoryBus)
    env = stack.env()
    key = env.pop("FLYWHEEL_EPISODE_KEY")
    assert len(key) >= 16 and key == stack.settings.episode_key.get_secret_value()  # made up: tickets
    assert env == {
        "FLYWHEEL_BUS": "kafka",
        "FLYWHEEL_KAFKA_BOOTSTRAP": "k:9092",
        "FLYWHEEL_TOPIC_PREFIX": "p.",
        "FLYWHEEL_GATEWAY_URL": "",  # not started
    }
    plain = EmbeddedStack(_settings(tmp_path, make_episode_key=False), upstream=up)
    assert plain.env()["FLYWHEEL_EPISODE_KEY"] == ""
    await up.client.aclose()


async def test_no_engine_and_workers_added_on_the_one_in_process_bus(tmp_path: Path) -> None:
    settings = _settings(tmp_path, run_worker=False, concurrency=2)
    async with EmbeddedStack(settings, upstream=fake_upstream(FakeUpstreamConfig())) as stack:
        assert stack.engine is None and stack.worker is None and stack.gateway_url.startswith("http://")
        a = await stack.add_worker("a")
        b = await stack.add_worker("b", concurrency=5)
        assert stack.workers == [a, b] and stack.worker is a
        assert (a.settings.worker_id, a.settings.concurrency) == ("a", 2)
        assert (b.settings.worker_id, b.settings.concurrency) == ("b", 5)
        assert a.settings.gateway_url == stack.gateway_url
        assert stack.buses == [stack.bus] and a.bus is stack.bus and b.bus is stack.bus
