"""Shared-prompt microbatches give the same logprobs, loss and gradient as full rows."""

from __future__ import annotations

import random

import pytest
import torch

from trainer.backends.prefix import SharedRows, split_by_prompt
from trainer.backends.torch_backend import TorchBackend
from trainer.batching import BatchStats, Sample, TrainBatch
from trainer.config import AlgorithmConfig

from .helpers import tiny_model


def _samples() -> list[Sample]:
    """Three groups with prompts of different lengths, ragged responses and masks, plus loners."""
    rng = random.Random(0)
    out: list[Sample] = []
    for g, prompt_len in enumerate((5, 9, 7)):
        prompt = [rng.randrange(4, 60) for _ in range(prompt_len)]
        for i in range(4):
            n = rng.randrange(2, 7)
            mask = [1] * n if i % 2 else [1, 0] + [1] * (n - 2)
            out.append(
                Sample(
                    list(prompt),
                    [rng.randrange(4, 60) for _ in range(n)],
                    mask,
                    [rng.uniform(-3.0, -0.5) for _ in range(n)],
                    rng.choice([-1.0, 0.5, 1.0]),
                    0.05,
                    f"g{g}-{i}",
                )
            )
    out.append(Sample([7, 8, 9], [10, 11], [1, 1], [-1.0, -1.0], 1.0, 0.1, "alone"))
    out += [Sample([5], [6, 7], [1, 1], [-1.0, -2.0], a, 0.1, f"short{a}") for a in (1.0, -1.0)]
    return out


def _step(share: bool, cfg: AlgorithmConfig) -> tuple[dict[str, float], torch.Tensor]:
    backend = TorchBackend(tiny_model(seed=5), cfg, share_prompts=share)
    plan = backend._plan(_samples())
    assert any(isinstance(mb, SharedRows) for mb in plan) == share
    backend.optimizer.step = lambda *a, **k: None  # type: ignore[method-assign]
    metrics = backend.train_step(TrainBatch(_samples(), BatchStats(), []))
    grad = torch.cat([p.grad.flatten() for p in backend.model.parameters() if p.grad is not None])
    return metrics, grad


def test_split_keeps_loners_and_one_token_prompts_out() -> None:
    clusters, rest = split_by_prompt(_samples())
    assert sorted(len(c) for c in clusters) == [4, 4, 4]
    assert sorted(s.episode_id for s in rest) == ["alone", "short-1.0", "short1.0"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "cfg",
    [
        AlgorithmConfig(m2_threshold=None, max_grad_norm=1e9),
        AlgorithmConfig(m2_threshold=None, max_grad_norm=1e9, ppo_epochs=2, kl_coef=0.1, token_budget=40),
    ],
    ids=["one-epoch", "epochs-kl-small-budget"],
)
def test_shared_prompts_give_the_same_loss_and_gradient(cfg: AlgorithmConfig) -> None:
    full, full_grad = _step(False, cfg)
    shared, shared_grad = _step(True, cfg)
    assert shared["loss"] == pytest.approx(full["loss"], abs=1e-6)
    assert shared["response_tokens"] == full["response_tokens"]
    assert shared["kl"] == pytest.approx(full["kl"], abs=1e-6)
    assert torch.allclose(shared_grad, full_grad, atol=1e-6, rtol=1e-4)
    assert full_grad.abs().max() > 1e-4  # the comparison is not between two zero gradients


@pytest.mark.timeout(60)
def test_shared_rows_logprobs_match_full_rows() -> None:
    backend = TorchBackend(tiny_model(seed=2), AlgorithmConfig(), share_prompts=True)
    samples = _samples()[:8]
    clusters, _ = split_by_prompt(samples)
    rows = SharedRows(clusters, backend.pad_id, backend.device)
    with torch.no_grad():
        shared = backend._logprobs(backend.model, rows)
        expected = backend.sequence_logprobs(samples)
    got = [float((shared[r] * (rows.weights[r] != 0).float()).sum()) for r in range(len(samples))]
    # sequence_logprobs sums over the response mask; weights are mask × token_weight (0.05 > 0)
    assert got == pytest.approx(expected, abs=1e-5)
