"""The gateway on both buses (in-process and live Kafka): episodes, recorded calls, weight updates."""

from __future__ import annotations

import asyncio

import pytest

from schemas import (
    CONTROL,
    EPISODES,
    EpisodeFinished,
    EpisodeStarted,
    InferenceDrained,
    InferenceResumed,
    LLMCallRecorded,
    WeightsActivated,
    WeightUpdateRequested,
    new_episode_id,
)
from tests.fakes.gateway_harness import GatewayHarness

MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.timeout(90)
async def test_episode_calls_and_weight_update_over_the_bus(bus, tmp_path):
    async with GatewayHarness(tmp_path, bus=bus, episode_wait_s=15.0) as h:
        ep = new_episode_id()
        # the worker's race: EpisodeStarted published, the agent calls at once
        await bus.publish(EPISODES, EpisodeStarted(episode_id=ep))
        url = f"/episodes/{ep}/v1/chat/completions"
        r1 = await h.client.post(url, json={"messages": MSGS})
        assert r1.status_code == 200, r1.text
        history = [*MSGS, r1.json()["choices"][0]["message"], {"role": "user", "content": "again"}]
        assert (await h.client.post(url, json={"messages": history, "stream": True})).status_code == 200
        await bus.publish(EPISODES, EpisodeFinished(episode_id=ep, status="ok"))
        seen = await h.events.wait_for(lambda e: getattr(e, "episode_id", None) == ep, within_s=30, count=4)
        kinds = [type(e).__name__ for e in seen]
        # one partition per episode: the calls sit between start and finish, in order
        assert kinds == ["EpisodeStarted", "LLMCallRecorded", "LLMCallRecorded", "EpisodeFinished"]
        calls = [e for e in seen if isinstance(e, LLMCallRecorded)]
        assert [c.call_seq for c in calls] == [0, 1] and calls[1].extends_previous is True
        assert all(c.token_faithful for c in calls)

        await bus.publish(CONTROL, WeightUpdateRequested(version=5, drain_timeout_s=5))
        (drained,) = await h.events.wait_for(lambda e: isinstance(e, InferenceDrained), within_s=30)
        assert drained.version == 5 and drained.gateway_id == h.gateway.id
        ep2 = await h.open_episode()
        held = asyncio.create_task(
            h.client.post(f"/episodes/{ep2}/v1/chat/completions", json={"messages": MSGS})
        )
        await bus.publish(CONTROL, WeightsActivated(version=5))
        await h.events.wait_for(lambda e: isinstance(e, InferenceResumed), within_s=30)
        assert (await held).status_code == 200
        (late,) = await h.events.wait_for(
            lambda e: isinstance(e, LLMCallRecorded) and e.episode_id == ep2, within_s=30
        )
        assert late.weight_version == 5
