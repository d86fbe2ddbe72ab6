"""Releases of a LoRA adapter on a live vLLM: both channels live in one vLLM (docs/operating.md,
"Releasing versions").

``FLYWHEEL_RELEASES=gated`` and ``FLYWHEEL_POLICIES=writer,rewriter`` on the embedded stack in front of
the shared vLLM server. The trainer trains the writer adapter and proposes
each version; training rollouts are served by the adapter's latest version (``writer``), production
calls (a tenant key) by the version the release book serves. Promoted, version 1 is loaded into the same
vLLM under its own name (``writer@v1``, ``/v1/load_lora_adapter``) and production is served and recorded
at it while the trainer moves on; rolled back, production is served by the base (the adapter's version
0) on the next call.
"""

from __future__ import annotations

import asyncio
from itertools import repeat
from pathlib import Path

import httpx
import pytest

from flywheel.stack import EmbeddedStack, StackSettings
from gateway.keys import KeyStore
from infra.bus.base import Message
from schemas import EPISODES, AgentKind, AgentRef, EpisodeSource, EpisodeStarted, LLMCallRecorded, Task
from trainer.config import AlgorithmConfig, LoraOptions

pytestmark = pytest.mark.timeout(900)

AGENT = AgentRef(kind=AgentKind.callable, spec="examples.agents_for_tests.two_roles_agent:run")
TOKEN = "releases-vllm-admin-token-0123456789abcdef"


async def test_production_is_served_by_the_promoted_adapter_version_in_the_same_vllm(
    warm: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    from trainer.vllm_sink import VllmAdapterSink

    settings = StackSettings(
        data_dir=tmp_path,
        record_events=False,
        admin_token=TOKEN,
        upstream_timeout_s=300.0,
        concurrency=4,
        policies="writer,rewriter",  # the agent's two roles, each an adapter (vLLM knows no other name)
        releases="gated",
        trainer_release_every=1,
        trainer_mode="sync",
        trainer_batch_groups=1,
        trainer_torch_threads=1,
        trainer_algo=AlgorithmConfig(tis_cap=None),
        trainer_lora=LoraOptions(learning_rate=2e-2),
    )
    _, key = KeyStore(tmp_path / "gateway" / "keys.json").create("acme")
    calls: list[LLMCallRecorded] = []
    production: dict[str, str] = {}  # session → its episode

    async def on_event(msg: Message) -> None:
        if isinstance(msg.event, LLMCallRecorded):
            calls.append(msg.event)
        elif isinstance(msg.event, EpisodeStarted) and msg.event.source is EpisodeSource.production:
            production[msg.event.session_id or ""] = msg.event.episode_id

    async def production_call(client: httpx.AsyncClient, session: str) -> LLMCallRecorded:
        r = await client.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}", "X-Flywheel-Session": session},
            json={
                "model": "writer",
                "messages": [{"role": "user", "content": "What is 3 plus 4?"}],
                "max_tokens": 8,
            },
        )
        assert r.status_code == 200, r.text
        for _ in range(100):
            mine = [c for c in calls if c.episode_id == production.get(session)]
            if mine:
                return mine[-1]
            await asyncio.sleep(0.1)
        pytest.fail(f"no record of {session}'s call")

    admin = {"Authorization": f"Bearer {TOKEN}"}
    task = Task(task_id="two-roles", input={"question": "What is 2 plus 3?", "max_tokens": 8})
    stack = EmbeddedStack(
        settings, model_dir=vllm_model_dir, vllm_url=warm, tasks=repeat(task), agent=AGENT, group_size=4
    )
    try:
        async with stack:
            assert stack.bus is not None and stack.trainer is not None
            await stack.bus.subscribe(EPISODES, "releases-vllm-test", on_event, from_beginning=True)
            async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=300) as client:
                for _ in range(5):  # a group whose rewards are all equal trains nothing: at most 5 steps
                    await asyncio.wait_for(stack.start_training(1), 600)
                    if stack.trainer.status().adapters.get("writer", 0) >= 1:
                        break
                before = await production_call(client, "s-before")
                promoted = await client.post(
                    "/admin/versions/promote",
                    json={"version": 1, "adapter": "writer", "by": "t"},
                    headers=admin,
                )
                assert promoted.status_code == 200, promoted.text
                on_v1 = await production_call(client, "s-promoted")
                listed = {m["id"] for m in (await client.get(warm + "/v1/models")).json()["data"]}
                rolled = await client.post(
                    "/admin/versions/rollback", json={"adapter": "writer", "by": "t"}, headers=admin
                )
                assert rolled.status_code == 200, rolled.text
                after = await production_call(client, "s-rolled-back")
    finally:
        for name in ("writer", "rewriter", "writer@v1"):  # the shared server as it was, for the tests after
            await VllmAdapterSink(warm, name).unload()

    assert (before.adapter, before.adapter_version) == ("writer", 0)  # nothing promoted yet: the base
    assert (on_v1.adapter, on_v1.adapter_version, on_v1.upstream.value) == ("writer", 1, "vllm")
    assert "writer@v1" in listed and "writer" in listed  # both channels in one vLLM
    assert (after.adapter, after.adapter_version) == ("writer", 0)
    training = [c for c in calls if c.episode_id not in production.values() and c.adapter == "writer"]
    assert training and all(c.model == "writer" for c in training)  # rollouts: the adapter's latest
