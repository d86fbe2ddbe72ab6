"""``--backend verl`` end to end on the CPU: the embedded stack (gateway, embedded engine, worker, reward
service, trainer) with verl's FSDP engine as the trainer's backend (:mod:`trainer.backends.verl_cpu`).

A callable agent asks the tiny model one question per episode through the gateway and reports reward 1
for an even number of completion tokens, 0 for odd; groups of four give GRPO something to rank. The
trainer takes two steps with verl on the recorded token ids and behaviour logprobs, each version goes
live in the engine, and the first checkpoint's weights differ from the base model's. The verl
environment has no ``openai`` package, so the agent speaks HTTP with httpx.
"""

from __future__ import annotations

import asyncio
from itertools import repeat
from pathlib import Path
from typing import Any

import httpx
import pytest

from flywheel.stack import EmbeddedStack, StackSettings
from schemas import AgentKind, AgentRef, ScorerSpec, Task
from trainer.config import AlgorithmConfig

pytestmark = [pytest.mark.verl, pytest.mark.timeout(600)]
AGENT = AgentRef(kind=AgentKind.callable, spec=f"{__name__}:run")


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(
        base_url=llm.base_url, headers={"Authorization": f"Bearer {llm.api_key}"}
    ) as c:
        r = await c.post(
            "chat/completions",
            json={
                "model": llm.model,
                "messages": [{"role": "user", "content": "what is 2 + 3?"}],
                "max_tokens": 8,
                "temperature": 1.0,
            },
            timeout=120.0,
        )
        r.raise_for_status()
        tokens = r.json()["usage"]["completion_tokens"]
    return {"output": tokens, "reward": float(tokens % 2 == 0)}


async def test_the_stack_trains_with_verl_on_the_cpu(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from trainer.models.tiny import build_tiny

    corpus = [f"what is {a} + {b}? the answer is {a + b}." for a in range(12) for b in range(12)]
    model = await asyncio.to_thread(
        build_tiny, tmp_path / "model", corpus, vocab_size=300, hidden=64, layers=2
    )
    settings = StackSettings(
        data_dir=tmp_path / "data",
        record_events=False,
        gateway_port=0,
        trainer_backend="verl",
        trainer_device="cpu",
        trainer_backend_process=False,
        trainer_batch_groups=1,
        trainer_max_in_flight=1,
        trainer_checkpoint_every=1,
        trainer_torch_threads=1,
        trainer_algo=AlgorithmConfig(learning_rate=1e-3),
    )
    task = Task(task_id="even", input={}, scorer=ScorerSpec(name="agent"))
    async with EmbeddedStack(
        settings, model_dir=model, tasks=repeat(task), agent=AGENT, group_size=4
    ) as stack:
        assert stack.trainer is not None
        assert type(stack.trainer.backend).__name__ == "VerlBackend"  # verl's engine, not the torch backend
        await asyncio.wait_for(stack.start_training(2), 500)
        status = stack.trainer.status()
    assert status.version == 2, status
    assert status.samples["live"] >= 4, status
    checkpoint = tmp_path / "data" / "trainer" / "checkpoints" / "v000001"
    base = load_file(str(model / "model.safetensors"))
    trained = load_file(str(next(checkpoint.rglob("*.safetensors"))))
    moved = [k for k in base if k in trained and not base[k].float().equal(trained[k].float())]
    assert moved, "verl's step changed no weight"
