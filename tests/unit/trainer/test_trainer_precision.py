"""The training dtype and gradient checkpointing (trainer/backends/precision.py) on a tiny random Qwen2.

bf16: the forward's matmuls run in bf16 while the trained parameters stay fp32 and the log-probs fp32,
a LoRA adapter's frozen base is stored in bf16, and a step still moves the policy. Gradient
checkpointing: every decoder layer runs twice per training forward (the recomputation), and the step
is the same step as without it. The settings reach the backend.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.app import start_backend
from trainer.backends.torch_backend import TorchBackend
from trainer.batching import build_batch, sft_samples
from trainer.config import AlgorithmConfig, LoraOptions, ModelOptions
from trainer.groups import Group
from trainer.lora import LoraPolicies
from trainer.settings import TrainerSettings

from .helpers import episode, tiny_model, transition

pytestmark = pytest.mark.timeout(120)  # peft's import on a loaded machine

PROMPT = [1, 2, 3]
GOOD = [10, 11, 12]
BAD = [20, 21, 22]
CFG = AlgorithmConfig(m2_threshold=None, tis_cap=None, learning_rate=5e-3)
BF16 = ModelOptions(dtype="bfloat16")
CHECKPOINTED = ModelOptions(gradient_checkpointing=True)


def _group(gid: str, version: int = 0) -> Group:
    g = Group(gid, 4, 0.0)
    for i, (resp, r) in enumerate([(GOOD, 1.0), (BAD, 0.0), (GOOD, 1.0), (BAD, 0.0)]):
        e = episode(
            gid, i, r, group_size=4, transitions=[transition(PROMPT, resp, reward=r, version=version)]
        )
        g.members[e.episode_id] = e
    return g


def _margin(backend: TorchBackend) -> float:
    good, bad = backend.sequence_logprobs(sft_samples([(PROMPT, GOOD), (PROMPT, BAD)]))
    return good - bad


def _linear_dtypes(model: torch.nn.Module) -> list[torch.dtype]:
    """Records the output dtype of every q_proj forward (a hook on each)."""
    seen: list[torch.dtype] = []
    for name, module in model.named_modules():
        if name.endswith("q_proj"):  # a Linear, or peft's LoRA layer around one
            module.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    return seen


def _layer_calls(model: torch.nn.Module) -> list[int]:
    """Counts the forwards of the first decoder layer's attention (a checkpointed layer runs again in the
    backward; transformers checkpoints the layer's ``forward``, so the layer's own hooks fire once)."""
    calls = [0]
    layer = next(m for n, m in model.named_modules() if n.endswith("layers.0.self_attn"))

    def count(*_: object) -> None:
        calls[0] += 1

    layer.register_forward_pre_hook(count)
    return calls


def test_bf16_runs_the_forward_in_bf16_and_keeps_fp32_weights_and_logprobs() -> None:
    backend = TorchBackend(tiny_model(), CFG, model_options=BF16)
    seen = _linear_dtypes(backend.model)
    before = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    margin = _margin(backend)
    for step in range(10):
        backend.train_step(build_batch([_group(f"g{step}", backend.version)], CFG, backend.version))
    assert seen and set(seen) == {torch.bfloat16}
    assert {p.dtype for p in backend.model.parameters()} == {torch.float32}  # Adam updates fp32 weights
    assert any(not torch.equal(p, before[n]) for n, p in backend.model.named_parameters())
    assert _margin(backend) - margin > 1.0
    rows = backend._microbatches(sft_samples([(PROMPT, GOOD)]))[0]
    assert backend._logprobs(backend.model, rows).dtype == torch.float32


def test_bf16_stores_the_kl_reference_in_bf16() -> None:
    backend = TorchBackend(tiny_model(), CFG.model_copy(update={"kl_coef": 0.1}), model_options=BF16)
    assert backend.reference is not None
    assert {p.dtype for p in backend.reference.parameters()} == {torch.bfloat16}
    metrics = backend.train_step(build_batch([_group("g")], backend.cfg, 0))
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-2)  # the same weights, both in bf16 matmuls


def test_gradient_checkpointing_recomputes_each_layer_and_takes_the_same_step() -> None:
    plain = TorchBackend(tiny_model(seed=3), CFG, share_prompts=False)
    checkpointed = TorchBackend(tiny_model(seed=3), CFG, model_options=CHECKPOINTED)
    assert not checkpointed.share_prompts  # a checkpointed layer keeps no KV cache
    plain_calls, ckpt_calls = _layer_calls(plain.model), _layer_calls(checkpointed.model)
    batch = build_batch([_group("g")], CFG, 0)
    a, b = plain.train_step(batch), checkpointed.train_step(batch)
    assert ckpt_calls[0] == 2 * plain_calls[0] > 0
    assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
    for (name, p), q in zip(plain.model.named_parameters(), checkpointed.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def _backend(kind: str) -> TorchBackend:
    if kind == "full":
        return TorchBackend(tiny_model(seed=5), CFG, share_prompts=False)
    return LoraPolicies(tiny_model(seed=5), ["pol"], CFG, LoraOptions(learning_rate=5e-3)).adapters["pol"]


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_logits_only_where_a_response_token_is_predicted_take_the_same_step(kind: str) -> None:
    """The LM head runs on the positions from the microbatch's shortest prompt on (``logits_to_keep``):
    the same log-probs, loss and update as logits everywhere, full model and LoRA alike."""
    kept, everywhere = _backend(kind), _backend(kind)
    everywhere._keeps_logits[id(everywhere.model)] = False
    widths: list[int] = []
    head = next(m for n, m in kept.model.named_modules() if n.endswith("lm_head"))
    head.register_forward_hook(lambda _m, _i, out: widths.append(out.shape[1]))
    batch = build_batch([_group("g")], CFG, 0)
    rows = kept._microbatches(batch.samples)[0]
    assert rows.first == len(PROMPT) - 1 > 0
    a, b = kept.train_step(batch), everywhere.train_step(batch)
    assert widths and max(widths) == rows.ids.shape[1] - rows.first  # not every position
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    for p, q in zip(kept.model.parameters(), everywhere.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert kept.sequence_logprobs(batch.samples) == pytest.approx(everywhere.sequence_logprobs(batch.samples))


def test_lora_bf16_stores_the_base_in_bf16_and_trains_fp32_adapters() -> None:
    policies = LoraPolicies(
        tiny_model(), ["writer"], CFG, LoraOptions(learning_rate=2e-2), model_options=BF16
    )
    adapter = policies.adapters["writer"]
    seen = _linear_dtypes(policies.model)
    named = dict(policies.model.named_parameters())
    assert {p.dtype for n, p in named.items() if "lora_" not in n} == {torch.bfloat16}
    assert {p.dtype for n, p in named.items() if "lora_" in n} == {torch.float32}
    base = {n: p.detach().clone() for n, p in named.items() if "lora_" not in n}
    margin = _margin(adapter)
    for step in range(10):
        adapter.train_step(build_batch([_group(f"g{step}", adapter.version)], adapter.cfg, adapter.version))
    assert seen and set(seen) == {torch.bfloat16}
    assert _margin(adapter) - margin > 0.5
    assert all(torch.equal(p, base[n]) for n, p in policies.model.named_parameters() if "lora_" not in n)


def test_lora_gradient_checkpointing_recomputes_the_base() -> None:
    policies = LoraPolicies(tiny_model(), ["writer"], CFG, LoraOptions(learning_rate=2e-2))
    checkpointed = LoraPolicies(
        tiny_model(), ["writer"], CFG, LoraOptions(learning_rate=2e-2), model_options=CHECKPOINTED
    )
    plain_calls, ckpt_calls = _layer_calls(policies.model), _layer_calls(checkpointed.model)
    batch = build_batch([_group("g")], CFG, 0)
    a = policies.adapters["writer"].train_step(batch)
    b = checkpointed.adapters["writer"].train_step(batch)
    assert ckpt_calls[0] == 2 * plain_calls[0] > 0
    assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)


def test_settings_reach_the_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert TrainerSettings().trainer_model_options == ModelOptions()
    monkeypatch.setenv("FLYWHEEL_TRAINER_DTYPE", "bfloat16")
    monkeypatch.setenv("FLYWHEEL_TRAINER_GRADIENT_CHECKPOINTING", "true")
    options = TrainerSettings().trainer_model_options
    assert options == ModelOptions(dtype="bfloat16", gradient_checkpointing=True)
    tiny_model().save_pretrained(tmp_path)
    backend = start_backend(tmp_path, CFG, process=False, model_options=options)
    assert isinstance(backend, TorchBackend)
    assert backend.model_options == options and not backend.share_prompts
    monkeypatch.setenv("FLYWHEEL_TRAINER_DTYPE", "float16")
    with pytest.raises(ValueError, match="trainer_dtype"):
        TrainerSettings()
