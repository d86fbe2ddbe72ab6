"""The bus-or-spool rule: a call is answered only once its event is durable somewhere."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.recording.publishing import Spool
from infra.bus.base import BusUnavailableError
from infra.bus.memory import MemoryBus
from schemas import LLMCallRecorded
from tests.fakes.gateway_harness import ADMIN, GatewayHarness
from tests.fakes.waiting import wait_until

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
            metrics = (await h.client.get("/metrics", headers=ADMIN)).text
            assert "flywheel_gateway_spool_depth 3.0" in metrics
            bus.down = False
            calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=3)
            assert [c.call_seq for c in calls] == [0, 1, 2]
            await wait_until(lambda: h.gateway.recorder.spool_depth == 0, within_s=5, what="an empty spool")
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


class SlowAckBus(MemoryBus):
    """Each publish waits 20 ms for its 'acknowledgement'; records the order and the overlap."""

    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__()
        self.order: list[tuple[str, int]] = []
        self.active = 0
        self.most_at_once = 0
        self.fail_after = fail_after

    async def publish(self, topic: str, event: Any, *, key: str | None = None) -> None:
        if self.fail_after is not None and len(self.order) >= self.fail_after:
            raise BusUnavailableError("broker went away again")
        self.active += 1
        self.most_at_once = max(self.most_at_once, self.active)
        await asyncio.sleep(0.02)
        self.active -= 1
        self.order.append((event.episode_id, event.call_seq))


def _spooled(spool: Spool, episodes: int, calls: int) -> None:
    from schemas import encode

    for seq in range(calls):  # interleaved, as eight agents' calls arrive
        for e in range(episodes):
            call = LLMCallRecorded(episode_id=f"ep{e}", call_seq=seq, call_id=f"c{e}-{seq}", request="{}")
            spool.append("flywheel.episodes", f"ep{e}", encode(call))


async def test_drain_sends_keys_side_by_side_each_in_order(tmp_path):
    from gateway.recording.publishing import Recorder

    bus = SlowAckBus()
    spool = Spool(tmp_path / "s.sqlite")
    _spooled(spool, episodes=8, calls=5)
    sent = await Recorder(bus, spool).drain_once()
    assert sent == 40 and spool.count() == 0 and spool.depth == 0
    for e in range(8):
        assert [s for ep, s in bus.order if ep == f"ep{e}"] == [0, 1, 2, 3, 4]  # each episode in order
    assert bus.most_at_once == 8  # one acknowledgement at a time drained slower than agents refill


async def test_a_failed_drain_keeps_what_was_not_sent(tmp_path):
    from gateway.recording.publishing import Recorder

    bus = SlowAckBus(fail_after=10)
    spool = Spool(tmp_path / "s.sqlite")
    _spooled(spool, episodes=4, calls=5)
    with pytest.raises(BusUnavailableError):
        await Recorder(bus, spool).drain_once()
    assert 0 < len(bus.order) < 20 and spool.count() == 20 - len(bus.order) == spool.depth
    bus.fail_after = None
    await Recorder(bus, spool).drain_once()
    for e in range(4):
        assert [s for ep, s in bus.order if ep == f"ep{e}"] == [0, 1, 2, 3, 4]  # nothing lost, nothing twice
