"""A restarted gateway learns each LoRA adapter's version from the control topic (in-process bus and Kafka).

One gateway with ``FLYWHEEL_POLICIES=writer,rewriter`` sees the writer's update to v4 activated and the
rewriter's update to v3 fail (serving v2), and stops; a new gateway on the same bus and data directory
records its first calls with those versions, not 0, before any further update, and the base's version
stays its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.bus.base import Bus
from schemas import (
    CONTROL,
    InferenceDrained,
    InferenceResumed,
    LLMCallRecorded,
    WeightsActivated,
    WeightUpdateFailed,
    WeightUpdateRequested,
)
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = pytest.mark.timeout(120)
MSGS = [{"role": "user", "content": "hi"}]


async def test_a_restarted_gateway_records_each_adapters_current_version(bus: Bus, tmp_path: Path) -> None:
    settings: dict[str, Any] = {"policies": "writer,rewriter", "episode_wait_s": 15.0, "pause_hold_s": 10}
    async with GatewayHarness(tmp_path, bus=bus, **settings) as first:
        await bus.publish(CONTROL, WeightUpdateRequested(version=4, adapter="writer", drain_timeout_s=5))
        await first.events.wait_for(lambda e: isinstance(e, InferenceDrained), within_s=30)
        await bus.publish(CONTROL, WeightsActivated(version=4, adapter="writer"))
        await bus.publish(CONTROL, WeightUpdateRequested(version=3, adapter="rewriter", drain_timeout_s=5))
        await first.events.wait_for(
            lambda e: isinstance(e, InferenceDrained) and e.adapter == "rewriter", within_s=30
        )
        await bus.publish(
            CONTROL, WeightUpdateFailed(version=3, serving_version=2, adapter="rewriter", error="load failed")
        )
        await first.events.wait_for(
            lambda e: isinstance(e, InferenceResumed) and e.adapter == "rewriter", within_s=30
        )
        assert first.gateway.calls.admission_for("writer").weight_version == 4

    async with GatewayHarness(tmp_path, bus=bus, **settings) as again:
        served = {n: again.gateway.calls.admission_for(n).weight_version for n in ("writer", "rewriter")}
        assert served == {"writer": 4, "rewriter": 2}
        ep = await again.open_episode()
        url = f"/episodes/{ep}/v1/chat/completions"
        for model in ("writer", "rewriter", "checker"):
            r = await again.client.post(url, json={"model": model, "messages": MSGS})
            assert r.status_code == 200, r.text
        calls = await again.events.wait_for(
            lambda e: isinstance(e, LLMCallRecorded) and e.episode_id == ep, within_s=30, count=3
        )
    recorded = sorted((c.model, c.adapter, c.adapter_version, c.weight_version) for c in calls)
    assert recorded == [
        ("checker", None, None, 0),  # no policy: the base, at its own version
        ("rewriter", "rewriter", 2, 0),  # the failed update left v2 serving
        ("writer", "writer", 4, 0),
    ]
