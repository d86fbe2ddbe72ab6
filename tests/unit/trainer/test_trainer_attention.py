"""The copy-free grouped-query attention computes what transformers' sdpa computes."""

from __future__ import annotations

import pytest
import torch

from trainer.backends.attention import GQA_SDPA, use_gqa_attention
from trainer.backends.prefix import SharedRows, shared_logprobs
from trainer.backends.torch_backend import TorchBackend
from trainer.config import AlgorithmConfig

from .helpers import tiny_model
from .test_trainer_prefix import _samples


def _logprobs_and_grad(model: torch.nn.Module, rows: SharedRows) -> tuple[torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    logp = shared_logprobs(model, rows)
    (logp * rows.weights).sum().backward()  # type: ignore[no-untyped-call]
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logp.detach(), grad


@pytest.mark.timeout(60)
def test_gqa_attention_matches_sdpa_with_padding_and_a_shared_prompt_cache() -> None:
    model = tiny_model(seed=3)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    clusters = [[s for s in _samples() if s.episode_id.startswith(f"g{g}-")] for g in range(3)]
    rows = SharedRows(clusters, pad_id=0, device=torch.device("cpu"))
    assert int((rows.prefix_attn == 0).sum()) > 0  # prompts of different lengths: the mask matters

    model.set_attn_implementation("sdpa")
    want_logp, want_grad = _logprobs_and_grad(model, rows)
    assert use_gqa_attention(model)
    assert model.config._attn_implementation == GQA_SDPA
    got_logp, got_grad = _logprobs_and_grad(model, rows)

    torch.testing.assert_close(got_logp, want_logp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.timeout(60)
def test_the_torch_backend_switches_cpu_models_and_leaves_other_implementations_alone() -> None:
    model = tiny_model()
    TorchBackend(model, AlgorithmConfig())
    assert model.config._attn_implementation == GQA_SDPA

    eager = tiny_model()
    eager.set_attn_implementation("eager")
    assert not use_gqa_attention(eager)
    assert eager.config._attn_implementation == "eager"
