"""A LoRA adapter per policy (trainer/lora.py) and the embedded engine serving them (infra/engine/adapters.py).

On a tiny random Qwen2 with peft: an adapter's step moves its policy and nothing else (the base and the
other adapter keep their tensors), each adapter has its own Adam state and version, a checkpoint
restores both; what an adapter exports, the engine serves next to the base and next to another adapter
in one batch, with the logprobs peft's own forward gives, and a new version of one adapter changes only
that adapter's requests.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from infra.engine import InferenceEngine, SamplingParams, WeightLoadError
from trainer.batching import build_batch, sft_samples
from trainer.config import AlgorithmConfig, LoraOptions
from trainer.groups import Group
from trainer.lora import LoraPolicies

from .helpers import episode, tiny_model, transition

pytestmark = pytest.mark.timeout(120)  # the first test pays for importing peft on a loaded machine

PROMPT = [1, 2, 3]
GOOD = [10, 11, 12]
BAD = [20, 21, 22]


def _bandit_group(gid: str, version: int) -> Group:
    g = Group(gid, 4, 0.0)
    for i, (resp, r) in enumerate([(GOOD, 1.0), (BAD, 0.0), (GOOD, 1.0), (BAD, 0.0)]):
        e = episode(
            gid, i, r, group_size=4, transitions=[transition(PROMPT, resp, reward=r, version=version)]
        )
        g.members[e.episode_id] = e
    return g


def _policies(options: LoraOptions | None = None) -> LoraPolicies:
    cfg = AlgorithmConfig(m2_threshold=None, tis_cap=None)
    return LoraPolicies(tiny_model(), ["writer", "rewriter"], cfg, options or LoraOptions(learning_rate=2e-2))


def _margin(policies: LoraPolicies, name: str) -> float:
    good, bad = policies.adapters[name].sequence_logprobs(sft_samples([(PROMPT, GOOD), (PROMPT, BAD)]))
    return good - bad


def _base_state(policies: LoraPolicies) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policies.model.named_parameters() if "lora_" not in n}


def test_options_cite_defaults_and_refuse_unknown_modules() -> None:
    opts = LoraOptions()
    assert (opts.rank, opts.alpha, opts.target_modules, opts.dropout) == (8, 16, ("q_proj", "v_proj"), 0.0)
    assert LoraOptions.model_validate({"target_modules": "q_proj, o_proj"}).target_modules == (
        "q_proj",
        "o_proj",
    )
    with pytest.raises(ValueError, match="target_modules"):
        LoraOptions(target_modules=("lm_head",))


def test_a_step_trains_one_adapter_and_nothing_else() -> None:
    policies = _policies()
    writer, rewriter = policies.adapters["writer"], policies.adapters["rewriter"]
    base = _base_state(policies)
    other = {n: p.detach().clone() for n, p in policies.model.named_parameters() if ".rewriter." in n}
    before = _margin(policies, "writer")
    assert before == pytest.approx(_margin(policies, "rewriter"))  # both start as the base (B = 0)
    for step in range(6):
        writer.train_step(
            build_batch([_bandit_group(f"g{step}", writer.version)], writer.cfg, writer.version)
        )
    assert (writer.version, rewriter.version) == (6, 0)
    assert _margin(policies, "writer") - before > 0.5
    assert _margin(policies, "rewriter") == pytest.approx(before, abs=1e-6)
    for n, p in policies.model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), f"the base changed: {n}"
        if n in other:
            assert torch.equal(p, other[n]), f"the other adapter changed: {n}"
    # the optimisers are the adapters' own: writer's holds state, rewriter's none yet
    assert writer.optimizer.state and not rewriter.optimizer.state
    trained = sum(p.numel() for p in writer.params)
    assert trained < sum(p.numel() for p in base.values()) / 5


def test_checkpoint_restores_each_adapter(tmp_path: Path) -> None:
    policies = _policies()
    writer = policies.adapters["writer"]
    for step in range(3):
        writer.train_step(
            build_batch([_bandit_group(f"g{step}", writer.version)], writer.cfg, writer.version)
        )
    writer.save_checkpoint(tmp_path / "w")
    assert {p.name for p in (tmp_path / "w").iterdir()} == {
        "adapter_model.safetensors",
        "adapter_config.json",
        "optimizer.pt",
    }
    margin = _margin(policies, "writer")
    fresh = _policies()
    fresh.adapters["writer"].load_checkpoint(tmp_path / "w", 3)
    assert fresh.adapters["writer"].version == 3
    assert _margin(fresh, "writer") == pytest.approx(margin, abs=1e-5)
    assert fresh.adapters["writer"].optimizer.state  # Adam's moments came back too
    with pytest.raises(Exception, match="cannot load adapter checkpoint"):
        fresh.adapters["rewriter"].load_checkpoint(tmp_path / "missing", 1)


def _engine_and_policies(tmp_path: Path) -> tuple[InferenceEngine, LoraPolicies]:
    """An engine over a copy of the base, and adapters (B made non-zero) over the same base weights."""
    torch.manual_seed(0)
    served = tiny_model()
    policies = LoraPolicies(
        tiny_model(),
        ["writer", "rewriter"],
        AlgorithmConfig(),
        LoraOptions(target_modules=("q_proj", "v_proj", "down_proj")),
    )
    with torch.no_grad():
        for n, p in policies.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    tokenizer = type("Tok", (), {"eos_token_id": None, "decode": lambda self, ids, **_: ""})()
    return InferenceEngine(served, tokenizer, max_model_len=64, eos_token_ids=[]), policies


def _peft_logprobs(policies: LoraPolicies, name: str | None, ids: list[int], prompt_len: int) -> list[float]:
    model = policies.model
    with torch.no_grad():
        if name is None:
            with model.disable_adapter():
                logits = model(torch.tensor([ids])).logits[0]
        else:
            model.set_adapter(name)
            logits = model(torch.tensor([ids])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    return [float(logp[i - 1, ids[i]]) for i in range(prompt_len, len(ids))]


async def test_engine_serves_adapters_side_by_side_with_peft_logprobs(tmp_path: Path) -> None:
    engine, policies = _engine_and_policies(tmp_path)
    try:
        for name in ("writer", "rewriter"):
            path = policies.adapters[name].export_weights(tmp_path / name)
            adapter = await engine.load_adapter(name, path, 1)
            assert adapter.nbytes > 0 and adapter.scaling == pytest.approx(16 / 8)
        assert engine.adapters == {"writer": 1, "rewriter": 1}
        params = SamplingParams(max_tokens=6, seed=7, ignore_eos=True)
        prompt = [5, 6, 7, 8]
        # one batch: the base, both adapters, and a name not loaded (served by the base)
        results = await asyncio.gather(
            engine.complete(prompt, params),
            engine.complete(prompt, params, adapter="writer"),
            engine.complete(prompt, params, adapter="rewriter"),
            engine.complete(prompt, params, adapter="unknown"),
        )
        roles: tuple[str | None, ...] = (None, "writer", "rewriter", None)
        for role, result in zip(roles, results, strict=True):
            choice = result.choices[0]
            want = _peft_logprobs(policies, role, prompt + choice.token_ids, len(prompt))
            assert choice.logprobs == pytest.approx(want, abs=2e-4), role
        base_lp = results[0].choices[0].logprobs
        assert results[1].choices[0].token_ids != results[0].choices[0].token_ids or results[1].choices[
            0
        ].logprobs != pytest.approx(base_lp, abs=1e-3)
        assert engine.adapter_for("writer") == "writer" and engine.adapter_for("policy") is None
    finally:
        await engine.close()


async def test_a_new_version_of_one_adapter_leaves_the_others(tmp_path: Path) -> None:
    engine, policies = _engine_and_policies(tmp_path)
    try:
        for name in ("writer", "rewriter"):
            await engine.load_adapter(name, policies.adapters[name].export_weights(tmp_path / name), 1)
        params = SamplingParams(max_tokens=5, seed=3, ignore_eos=True)
        prompt = [9, 3, 4]
        before = {
            n: (await engine.complete(prompt, params, adapter=n)).choices[0] for n in ("writer", "rewriter")
        }
        with torch.no_grad():
            for n, p in policies.model.named_parameters():
                if "lora_B.writer" in n:
                    p.mul_(-1.0)
        await engine.load_adapter("writer", policies.adapters["writer"].export_weights(tmp_path / "w2"), 2)
        assert engine.adapters == {"writer": 2, "rewriter": 1}
        after = {
            n: (await engine.complete(prompt, params, adapter=n)).choices[0] for n in ("writer", "rewriter")
        }
        assert after["rewriter"].token_ids == before["rewriter"].token_ids
        assert after["rewriter"].logprobs == pytest.approx(before["rewriter"].logprobs, abs=1e-6)
        assert after["writer"].logprobs != pytest.approx(before["writer"].logprobs, abs=1e-3)
        want = _peft_logprobs(policies, "writer", prompt + after["writer"].token_ids, len(prompt))
        assert after["writer"].logprobs == pytest.approx(want, abs=2e-4)
        # a broken adapter is refused and the version that served keeps serving
        bad = tmp_path / "bad"
        bad.mkdir()
        (bad / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}')
        torch_save_foreign(bad / "adapter_model.safetensors")
        with pytest.raises(WeightLoadError, match="adapter writer"):
            await engine.load_adapter("writer", bad, 3)
        assert engine.adapters["writer"] == 2
    finally:
        await engine.close()


def torch_save_foreign(path: Path) -> None:
    from safetensors.torch import save_file

    save_file(
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 7)}, str(path)
    )
