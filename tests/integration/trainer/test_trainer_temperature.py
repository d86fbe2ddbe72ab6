"""The trainer's logprobs are the engine's at the call's temperature: importance ratios of 1 on the same weights.

End to end on the real embedded engine (tiny model): calls through the gateway at T = 0.7 and 1.3 →
``LLMCallRecorded.temperature`` → ``assemble`` → ``Transition.temperature`` → ``build_batch`` →
``Sample.temperature`` → the torch backend's rows (shared-prompt ``SharedRows`` and plain ``_Rows``),
its PPO pass with values and its KL reference. The engine's behaviour logprobs are those of
softmax(logits / T) (processed logprobs); the trainer's must be of the same distribution. With the
temperature dropped (every sample at 1) the same check fails, which is what it guards.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from reward_service.transitions import assemble
from schemas import EpisodeScored, LLMCallRecorded, UpstreamKind
from tests.fakes.gateway_harness import GatewayHarness
from trainer.backends.prefix import SharedRows
from trainer.backends.torch_backend import TorchBackend, _Rows, load_backend
from trainer.batching import Sample, TrainBatch, build_batch
from trainer.config import AlgorithmConfig
from trainer.groups import Group

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

ASK = {"max_tokens": 24, "ignore_eos": True, "seed": 7}


async def _recorded_calls(tiny_dir: Path, tmp_path: Path) -> list[LLMCallRecorded]:
    """One episode's calls: at 0.7, a follow-up to it at 0.7, its prompt again (n = 2) at 0.7, one at 1.3."""
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app

    engine = InferenceEngine.from_pretrained(tiny_dir, max_model_len=256)
    try:
        async with GatewayHarness(
            tmp_path, upstream_app=create_engine_app(engine), kind=UpstreamKind.embedded
        ) as h:
            ep = await h.open_episode()

            async def ask(messages: list[Any], temperature: float, n: int = 1) -> dict[str, Any]:
                body = {**ASK, "messages": messages, "temperature": temperature, "n": n}
                r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                message: dict[str, Any] = r.json()["choices"][0]["message"]
                return message

            first = [{"role": "user", "content": "What is 3+7?"}]
            reply = await ask(first, 0.7)
            await ask(
                [*first, reply, {"role": "user", "content": "And 6+7?"}], 0.7
            )  # the conversation goes on
            await ask(first, 0.7, n=2)  # the first prompt again: three samples share it
            await ask([{"role": "user", "content": "What is 9+9?"}], 1.3)
            calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), within_s=60, count=4)
    finally:
        await engine.close()
    return sorted(calls, key=lambda c: c.call_seq)


def _batch(calls: list[LLMCallRecorded]) -> TrainBatch:
    """The batch the trainer builds from the episode (twice, rewards 1 and 0, so the group has signal)."""
    transitions = assemble(calls, reward=1.0).transitions
    episodes = [
        EpisodeScored(
            episode_id=f"e{i}",
            group_id="g",
            group_size=2,
            reward=reward,
            transitions=transitions,
            num_calls=3,
        )
        for i, reward in enumerate((1.0, 0.0))
    ]
    group = Group("g", 2, 0.0, {e.episode_id: e for e in episodes})
    return build_batch([group], AlgorithmConfig(), 0)


def _worst_delta(backend: TorchBackend, samples: list[Sample], model: torch.nn.Module) -> float:
    """max |trainer − engine| over every generated token, through the backend's own microbatch plan."""
    worst = 0.0
    with torch.no_grad():
        for rows in backend._plan(samples):
            logp = backend._logprobs(model, rows)
            mask = rows.weights > 0
            worst = max(worst, float((logp - rows.behaviour)[mask].abs().max()))
    return worst


async def test_the_trainer_recomputes_the_engines_logprobs_at_each_calls_temperature(
    tiny_dir: Path, tmp_path: Path
) -> None:
    calls = await _recorded_calls(tiny_dir, tmp_path)
    assert [c.temperature for c in calls] == [0.7, 0.7, 0.7, 1.3]
    batch = _batch(calls)
    samples = batch.samples  # each transition twice (two episodes)
    by_call = {t.call_seqs[0]: t.temperature for t in assemble(calls, reward=1.0).transitions}
    assert by_call[0] == by_call[2] == 0.7 and by_call[3] == 1.3 and by_call.get(1, 0.7) == 0.7  # 1: merged?
    assert {s.temperature for s in samples} == {0.7, 1.3}

    backend = load_backend(tiny_dir, AlgorithmConfig(kl_coef=0.05, tis_cap=1.001))
    assert backend.reference is not None
    for shared in (True, False):  # every prompt here is shared (each transition is in both episodes)
        backend.share_prompts = shared
        rows = SharedRows if shared else _Rows
        assert all(isinstance(r, rows) for r in backend._plan(samples))
        assert _worst_delta(backend, samples, backend.model) < 1e-4
        assert _worst_delta(backend, samples, backend.reference) < 1e-4  # the KL reference, same T
        # the temperature is what makes them agree: at T = 1 the ratios are far from 1
        at_one = [dataclasses.replace(s, temperature=1.0) for s in samples]
        assert _worst_delta(backend, at_one, backend.model) > 0.05

    # train_step's own truncated importance weights: none above 1.001 (π_old / μ = 1), KL 0 before the step
    metrics = backend.train_step(batch)
    assert metrics["tis_capped_fraction"] == 0.0 and metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["tis_mean"] == pytest.approx(1.0, abs=1e-4)


async def test_the_ppo_pass_with_values_divides_by_the_temperature_too(
    tiny_dir: Path, tmp_path: Path
) -> None:
    samples = _batch(await _recorded_calls(tiny_dir, tmp_path)).samples
    backend = load_backend(tiny_dir, AlgorithmConfig(algorithm="ppo"))
    with torch.no_grad():
        for rows in backend._plan(samples):
            assert isinstance(rows, _Rows)  # PPO has no shared-prompt rows
            logp, _ = backend._logprobs_values(rows)
            mask = rows.weights > 0
            assert float((logp - rows.behaviour)[mask].abs().max()) < 1e-4
