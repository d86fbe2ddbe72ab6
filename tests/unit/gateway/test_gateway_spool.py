"""The bus-or-spool rule: a call is answered only once its event is durable somewhere."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.publishing import Spool
from infra.bus.base import BusUnavailableError
from infra.bus.memory import MemoryBus
from schemas import LLMCallRecorded
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = pytest.mark.timeout(30)
MSGS = [{"role": "user", "content": "hi"}]


class FlakyBus(MemoryBus):
    """A MemoryBus whose publishes of call events fail while ``down`` (a broker outage)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def publish(self, topic: str, event: Any, *, key: str | None = None) -> None:
        if self.down and isinstance(event, LLMCallRecorded):
            raise BusUnavailableError("broker unreachable")
        await super().publish(topic, event, key=key)


async def test_outage_spools_then_drains_in_order(tmp_path):
    bus = FlakyBus()
    await bus.start()
    try:
        async with GatewayHarness(tmp_path, bus=bus) as h:
            h.gateway.recorder.retry_s = 0.02
            ep = await h.open_episode()
            url = f"/episodes/{ep}/v1/chat/completions"
            bus.down = True
            for _ in range(3):
                assert (await h.client.post(url, json={"messages": MSGS})).status_code == 200
            assert h.gateway.recorder.spool_depth == 3 and not h.events.of(LLMCallRecorded)
            metrics = (await h.client.get("/metrics")).text
            assert "flywheel_gateway_spool_depth 3.0" in metrics
            bus.down = False
            calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=3)
            assert [c.call_seq for c in calls] == [0, 1, 2]
            await asyncio.wait_for(_until(lambda: h.gateway.recorder.spool_depth == 0), 5)
    finally:
        await bus.stop()


async def test_spool_survives_restart(tmp_path):
    spool = Spool(tmp_path / "s.sqlite")
    spool.append("flywheel.episodes", "k", b"{}")
    spool.close()
    again = Spool(tmp_path / "s.sqlite")
    assert again.depth == 1 and again.peek()[0][3] == b"{}"
    again.close()


async def test_neither_bus_nor_spool_means_503(tmp_path):
    bus = FlakyBus()
    await bus.start()
    try:
        async with GatewayHarness(tmp_path, bus=bus) as h:
            ep = await h.open_episode()
            bus.down = True
            h.gateway.recorder.spool.close()  # the disk is gone too
            r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS})
            assert r.status_code == 503 and r.json()["error"]["code"] == "recording_failed"
            async with h.client.stream(
                "POST", f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS, "stream": True}
            ) as resp:
                lines = [ln async for ln in resp.aiter_lines() if ln.startswith("data: ")]
            assert "[DONE]" not in lines[-1] and "recording_failed" in lines[-1]
            assert not any('"finish_reason":"stop"' in ln for ln in lines)  # the final chunk was held back
            await asyncio.sleep(0)
    finally:
        await bus.stop()


async def _until(cond) -> None:
    while not cond():  # noqa: ASYNC110 - the spool row is deleted right after the bus acknowledged it
        await asyncio.sleep(0.002)


async def test_a_stuck_consumer_spools_calls_instead_of_holding_them(tmp_path):
    """The recorder sets no timer of its own: the bus's bounded publish is what ends the wait."""
    bus = MemoryBus(max_backlog=1, publish_timeout_s=0.2, stop_grace_s=0.2)
    await bus.start()
    stuck = asyncio.Event()

    async def never_returns(msg: Any) -> None:
        await stuck.wait()

    try:
        async with GatewayHarness(tmp_path, bus=bus) as h:
            ep = await h.open_episode()
            await bus.subscribe("flywheel.episodes", "stuck-consumer", never_returns, from_beginning=False)
            url = f"/episodes/{ep}/v1/chat/completions"
            codes = [(await h.client.post(url, json={"messages": MSGS})).status_code for _ in range(2)]
            assert codes == [200, 200]
            assert h.gateway.recorder.spool_depth >= 1  # the second call found the backlog full
            stuck.set()
    finally:
        stuck.set()
        await bus.stop()
