"""The weight-update protocol through the real gateway (docs/architecture.md, flow 4), on the in-process bus.

An in-flight call finishes on the old weights; a call made during the update waits (it is not refused);
``WeightsActivated`` arrives after the engine loaded the new weights; calls after it are stamped with
the new version.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from schemas import CONTROL, InferenceDrained, LLMCallRecorded, WeightsActivated
from tests.fakes.gateway_harness import GatewayHarness
from tests.fakes.upstream import FakeUpstreamConfig
from tests.fakes.waiting import wait_until
from trainer.weights import InProcessSink

from .trainer_harness import Collector, MemoryBus, group_events, make_trainer, publish

BODY = {"model": "policy", "messages": [{"role": "user", "content": "2+2?"}]}


@pytest.mark.timeout(90)
async def test_weight_update_through_the_gateway(tmp_path: Path) -> None:
    config = FakeUpstreamConfig(latency_s=0.8, use_tools=False)
    async with MemoryBus() as bus:
        control = await Collector().attach(bus, CONTROL, group="wp-control")
        async with GatewayHarness(tmp_path / "gw", config=config, bus=bus) as h:
            loads: list[tuple[int, float]] = []

            async def load_weights(weights: Mapping[str, Any] | Path, version: int) -> None:
                await asyncio.sleep(0.3)  # a load takes a while: calls arriving now must wait
                config.weight_version = version
                loads.append((version, time.monotonic()))

            trainer, _ = make_trainer(tmp_path, bus, [InProcessSink(load_weights)], drain_timeout_s=10)
            await trainer.start()
            episode = await h.open_episode()
            url = f"/episodes/{episode}/v1/chat/completions"

            in_flight = asyncio.create_task(h.client.post(url, json=BODY))
            await wait_until(lambda: h.gateway.admission.in_flight > 0)
            await publish(bus, group_events("g1", [1.0, 0.0]))
            step = asyncio.create_task(trainer.run(max_steps=1))
            await wait_until(lambda: h.gateway.admission.paused)
            assert not in_flight.done()
            waiting = asyncio.create_task(h.client.post(url, json=BODY))
            await asyncio.sleep(0.1)
            assert not waiting.done()

            first = await asyncio.wait_for(in_flight, 10)
            assert first.status_code == 200
            await asyncio.wait_for(step, 30)
            second = await asyncio.wait_for(waiting, 10)
            second_done = time.monotonic()
            assert second.status_code == 200

            [drained] = await control.wait_for(lambda e: isinstance(e, InferenceDrained))
            assert drained.version == 1 and drained.gateway_id == "gw-test" and not drained.timed_out
            assert drained.waited_ms > 100  # it waited for the in-flight call
            [activated] = await control.wait_for(lambda e: isinstance(e, WeightsActivated))
            assert activated.version == 1
            assert loads and loads[0][0] == 1 and second_done > loads[0][1]

            calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=2)
            assert [c.weight_version for c in sorted(calls, key=lambda c: c.call_seq)] == [0, 1]
            after = await h.client.post(url, json=BODY)
            assert after.status_code == 200
            calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=3)
            assert max(calls, key=lambda c: c.call_seq).weight_version == 1
            assert trainer.weights.known_gateways == {"gw-test"}
            await trainer.stop()
        await control.stop()
