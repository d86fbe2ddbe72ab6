"""AGL rollouts become Flywheel episodes: the reward service scores them from their reward event.

The agl-server parts (``gateway/agl``) on the gateway's recording machinery and the in-process bus,
the real reward service on the same bus, the fake vLLM-compatible upstream, and an agent that is the
real ``openai`` SDK on AGL's proxy route. The rollout's terminal status finishes the episode, and the
``EpisodeScored`` carries the reward the agent posted and token-exact transitions of its calls.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai

from gateway.agl.journal import Journal
from gateway.agl.proxy import AglProxy, ProxyConfig
from gateway.agl.routes import create_agl_app, tenant_lookup
from gateway.agl.serving import AglService
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.upstream.client import make_upstream
from infra.bus.base import Message
from infra.bus.memory import MemoryBus
from reward_service.app import build
from reward_service.settings import RewardSettings
from schemas import TOPICS, TRANSITIONS, EpisodeScored, UpstreamKind
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream

KEY = "k"


async def test_a_succeeded_rollout_is_scored_from_its_reward_event(tmp_path: Path) -> None:
    bus = MemoryBus()
    await bus.start()
    await bus.ensure_topics(list(TOPICS))
    settings = GatewaySettings(data_dir=tmp_path, gateway_id="agl-test", model="policy-7b")
    fake = FakeUpstreamConfig(use_tools=False)
    upstream = make_upstream(
        "http://fake/v1",
        kind=UpstreamKind.vllm,
        transport=httpx.ASGITransport(app=create_fake_upstream(fake)),
    )
    gateway = Gateway(settings, bus, [upstream])
    await gateway.start()
    journal = Journal(tmp_path / "agl" / "journal.sqlite")
    service = AglService(
        journal=journal,
        publish=gateway.publish,
        episodes=gateway.episodes,
        model_name="policy-7b",
        salt_path=tmp_path / "agl" / "salt",
    )
    # AGL forces its train temperature on the call: recorded, and carried by the transition to the trainer
    proxy = AglProxy(service, gateway, ProxyConfig("policy-7b", train_temperature=0.8), upstream)
    app = create_agl_app(service, proxy, tenant_lookup(KEY))
    reward = build(RewardSettings(data_dir=tmp_path, reward_group="reward-test"), bus)
    await reward.start()
    scored: list[EpisodeScored] = []
    got = asyncio.Event()

    async def on_scored(msg: Message) -> None:
        if isinstance(msg.event, EpisodeScored):
            scored.append(msg.event)
            got.set()

    sub = await bus.subscribe(TRANSITIONS, "agl-reward-test", on_scored, from_beginning=True)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://agl", headers={"x-api-key": KEY}
        ) as c:
            (
                await c.post("/api/rollouts", json=[{"rollout_id": "r1", "input": {"q": "hi"}}])
            ).raise_for_status()
            (await c.patch("/api/rollouts/r1", json={"status": {"state": "running"}})).raise_for_status()
            async with openai.AsyncOpenAI(
                base_url="http://agl/proxy/rollout/r1/attempt/0/mode/train/openai/v1",
                api_key=KEY,
                http_client=httpx.AsyncClient(transport=transport),
            ) as agent:
                messages = [{"role": "user", "content": "What is 6 times 7?"}]
                first = await agent.chat.completions.create(model="x", messages=messages)  # type: ignore[arg-type]
                answer = first.choices[0].message.content or ""
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Sure?"}]
                await agent.chat.completions.create(model="x", messages=messages)  # type: ignore[arg-type]
            event = {"event_type": "reward", "data": {"value": 0.75}}
            (await c.post("/api/rollouts/r1/attempt/0/events", json=event)).raise_for_status()
            (await c.patch("/api/rollouts/r1", json={"status": {"state": "succeeded"}})).raise_for_status()
            await asyncio.wait_for(got.wait(), 20)
    finally:
        await sub.stop()
        await reward.stop()
        await proxy.aclose()
        await gateway.stop()
        journal.close()
        await bus.stop()
    [ep] = scored
    assert ep.episode_id == service.episode_id("default", "r1", "0")
    assert (ep.reward, ep.reward_source, ep.num_calls, ep.task_id) == (0.75, "agent", 2, "r1")
    [t] = ep.transitions  # the second call extends the first: one trajectory, ids from the engine
    assert t.call_seqs == [0, 1] and t.reward == 0.75 and len(t.behaviour_logprobs) == len(t.response_ids)
    assert t.temperature == 0.8
