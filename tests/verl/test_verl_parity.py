"""Flywheel's GRPO advantages, PPO-clip/TIS loss and verl batch conversion against the REAL verl 0.9.1.

verl is the reference implementation here: every expected value comes from verl's own functions
(``verl.trainer.ppo.core_algos``, ``rollout_corr_helper``, ``verl.workers.utils.losses.ppo_loss`` and
``padding``), run on the same tensors as Flywheel's (``trainer.advantages``, ``trainer.loss``,
``trainer.backends.verl_convert``). Tolerance 1e-6 (fp32). Known, deliberate differences, each pinned
below: verl's dual clip (``clip_ratio_c``, off in Flywheel: the backend sets it to 1e9) and a group of
one (verl: ``score / (1 + eps)``, Flywheel: 0 — Flywheel never trains such a group).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.advantages import group_advantages
from trainer.backends.torch_backend import TorchBackend, _Rows
from trainer.backends.verl_convert import to_verl_batch
from trainer.batching import Sample
from trainer.config import AlgorithmConfig
from trainer.loss import policy_loss

pytestmark = [pytest.mark.verl, pytest.mark.timeout(300)]
TOL = 1e-6


def _actor(cfg: AlgorithmConfig, mode: str, clip_c: float = 1e9):  # type: ignore[no-untyped-def]
    from verl.workers.config import FSDPActorConfig

    return FSDPActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_mini_batch_size=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=cfg.clip_low,
        clip_ratio_high=cfg.clip_high,
        clip_ratio_c=clip_c,
        loss_agg_mode=mode,
    )


@pytest.mark.parametrize("scale", [True, False])
def test_grpo_advantages_equal_verls(scale: bool) -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rng = np.random.default_rng(0)
    sizes = [2, 3, 5, 8, 4]
    rewards = [list(rng.normal(size=n) * 2 + rng.integers(0, 2, size=n)) for n in sizes]
    rewards.append([1.0, 0.0, 0.0, 1.0])  # the demo's 0/1 rewards
    flat = [r for g in rewards for r in g]
    index = np.array([f"g{i}" for i, g in enumerate(rewards) for _ in g], dtype=object)
    width = 6
    lengths = rng.integers(1, width + 1, size=len(flat))
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.float32)
    token_rewards = torch.zeros(len(flat), width)
    for i, (n, r) in enumerate(zip(lengths, flat, strict=True)):
        token_rewards[i, n - 1] = r  # the outcome reward on the last response token, as verl's reward
    theirs, _ = compute_grpo_outcome_advantage(
        token_rewards, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=scale
    )
    ours = [a for g in rewards for a in group_advantages(g, "grpo", scale_by_std=scale, eps=1e-6)]
    expected = torch.tensor(ours, dtype=torch.float32).unsqueeze(-1) * mask
    torch.testing.assert_close(theirs, expected, atol=TOL, rtol=0)
    # the one deliberate difference: a group of one
    alone, _ = compute_grpo_outcome_advantage(
        torch.tensor([[0.7]]), torch.ones(1, 1), np.array(["solo"], dtype=object)
    )
    assert alone.item() == pytest.approx(0.7 / (1 + 1e-6)) and group_advantages([0.7]) == [0.0]


def _random_tokens(seed: int, rows: int = 6, width: int = 9) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g) * 3
    return {
        "logp": old + (torch.rand(rows, width, generator=g) - 0.5) * 0.8,  # ratios in e^±0.4
        "old": old,
        "behaviour": old + (torch.rand(rows, width, generator=g) - 0.5) * 2.0,  # TIS weights up to e^1
        "adv": torch.randn(rows, 1, generator=g).expand(rows, width).contiguous(),
        "mask": (torch.rand(rows, width, generator=g) > 0.25).float(),
    }


@pytest.mark.parametrize("tis_cap", [2.0, None])
@pytest.mark.parametrize("mode", ["token-sum", "token-mean", "seq-mean-token-mean"])
def test_policy_loss_and_gradient_equal_verls(mode: str, tis_cap: float | None) -> None:
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    cfg = AlgorithmConfig(behaviour_weight="truncated", clip_low=0.2, clip_high=0.28, tis_cap=tis_cap)
    t = _random_tokens(1)
    mask = t["mask"]
    # Flywheel's per-token weights for the same aggregation verl does
    if mode == "token-sum":
        weights = mask
    elif mode == "token-mean":
        weights = mask / mask.sum()
    else:
        per_row = mask.sum(-1, keepdim=True)
        weights = mask / per_row.clamp(min=1) / (per_row > 0).sum()
    ours_lp = t["logp"].clone().requires_grad_(True)
    ours = policy_loss(ours_lp, t["old"], t["behaviour"] * mask, t["adv"], weights, cfg)
    ours.loss.backward()  # type: ignore[no-untyped-call]

    theirs_lp = t["logp"].clone().requires_grad_(True)
    is_weights = None
    if tis_cap is not None:
        is_weights, _ = compute_rollout_correction_weights(t["old"] - t["behaviour"], mask, "token", tis_cap)
    loss, metrics = compute_policy_loss_vanilla(
        t["old"], theirs_lp, t["adv"], mask.bool(), mode, _actor(cfg, mode), is_weights
    )
    loss.backward()
    assert abs(ours.loss.item() - loss.item()) <= TOL, (ours.loss.item(), loss.item())
    assert ours_lp.grad is not None and theirs_lp.grad is not None
    torch.testing.assert_close(ours_lp.grad, theirs_lp.grad, atol=TOL, rtol=0)
    assert ours.clipped_tokens / ours.tokens == pytest.approx(metrics["actor/pg_clipfrac"], abs=TOL)


def test_verls_dual_clip_is_the_one_difference() -> None:
    """With verl's default clip_ratio_c = 3 the losses differ exactly where A < 0 and the ratio > 3."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    cfg = AlgorithmConfig(tis_cap=None)
    old = torch.full((1, 3), -2.0)
    logp = old + torch.tensor([[0.1, 1.5, 1.5]])  # ratios e^0.1, e^1.5 ≈ 4.48, e^1.5
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    ours = policy_loss(logp, old, old, adv, mask, cfg).loss.item()
    dual, _ = compute_policy_loss_vanilla(
        old, logp, adv, mask.bool(), "token-sum", _actor(cfg, "token-sum", 3.0)
    )
    off, _ = compute_policy_loss_vanilla(old, logp, adv, mask.bool(), "token-sum", _actor(cfg, "token-sum"))
    assert off.item() == pytest.approx(ours, abs=TOL)
    assert ours - dual.item() == pytest.approx(np.exp(1.5) - 3.0, abs=1e-5)  # only the third token is capped


def test_k3_kl_equals_verls_low_var_kl() -> None:
    from verl.trainer.ppo.core_algos import kl_penalty

    t = _random_tokens(2)
    ref = t["old"]
    cfg = AlgorithmConfig(kl_coef=1.0, tis_cap=None)
    zero_adv = torch.zeros_like(ref)
    ours = policy_loss(t["logp"], t["logp"], t["logp"], zero_adv, t["mask"], cfg, ref_logp=ref)
    theirs = (kl_penalty(t["logp"], ref, "low_var_kl") * t["mask"]).sum()
    assert ours.kl_sum == pytest.approx(theirs.item(), abs=1e-5)
    assert ours.loss.item() == pytest.approx(theirs.item(), abs=1e-5)


# ------------------------------------------------------------------------------------ the conversion
def _tiny(vocab: int = 64):  # type: ignore[no-untyped-def]
    from tests.unit.trainer.helpers import tiny_model

    return tiny_model(seed=4, vocab=vocab)


def _samples() -> list[Sample]:
    """Different prompt and response lengths, and a merged trajectory: response = call 1 ‖ tool
    observation (mask 0) ‖ call 2."""
    merged_resp = [11, 12, 13, 30, 31, 32, 14, 15]
    merged_mask = [1, 1, 1, 0, 0, 0, 1, 1]
    return [
        Sample([1, 2, 3, 4, 5], [10, 11], [1, 1], [-1.5, -2.0], 1.0, 0.25, "a"),
        Sample([1, 2], [20, 21, 22, 23], [1, 1, 1, 1], [-0.5, -1.0, -3.0, -2.5], -1.0, 0.125, "b"),
        Sample(
            [6, 7, 8],
            merged_resp,
            merged_mask,
            [-1.0 * m for m in [1.2, 0.7, 2.0, 0.0, 0.0, 0.0, 1.1, 0.4]],
            0.5,
            0.1,
            "c",
        ),
    ]


def test_conversion_shapes_masks_and_padding_through_verls_no_padding_layout() -> None:
    from verl import DataProto
    from verl.workers.utils.padding import left_right_2_no_padding

    samples = _samples()
    batch = to_verl_batch(samples, pad_id=0)
    t = batch.tensors
    assert t["prompts"].shape == (3, 5) and t["responses"].shape == (3, 8)
    assert t["input_ids"].shape == t["attention_mask"].shape == t["position_ids"].shape == (3, 13)
    # left-padded prompts, right-padded responses
    assert t["prompts"][1].tolist() == [0, 0, 0, 1, 2] and t["attention_mask"][1, :5].tolist() == [
        0,
        0,
        0,
        1,
        1,
    ]
    assert t["responses"][0].tolist() == [10, 11, 0, 0, 0, 0, 0, 0]
    # the merged trajectory: observation tokens attended (context) but out of the loss
    assert t["attention_mask"][2, 5:].tolist() == [1] * 8
    assert t["response_mask"][2].tolist() == [1, 1, 1, 0, 0, 0, 1, 1]
    assert t["old_log_probs"][2, 3:6].tolist() == [0.0, 0.0, 0.0]
    assert t["advantages"][2].tolist() == pytest.approx([0.05, 0.05, 0.05, 0, 0, 0, 0.05, 0.05])
    proto = DataProto.from_single_dict(dict(t))
    td = left_right_2_no_padding(proto.to_tensordict())
    offsets = td["input_ids"].offsets().diff().tolist()
    assert offsets == [7, 6, 11]
    values = td["input_ids"].values().tolist()
    start = 0
    for s, n in zip(samples, offsets, strict=True):
        assert values[start : start + n] == s.prompt_ids + s.response_ids
        assert td["position_ids"].values()[start : start + n].tolist() == list(range(n))
        start += n
    with pytest.raises(ValueError, match="prompt"):
        to_verl_batch([Sample([], [1], [1], [-1.0], 1.0, 1.0, "x")], 0)


def test_verls_ppo_loss_on_the_converted_batch_equals_flywheels_training_loss() -> None:
    """The whole path: Flywheel samples → verl batch → verl's no-padding layout → the real tiny Qwen2's
    logprobs → verl's ``ppo_loss`` (token-sum, dual clip off, TIS from ``rollout_is_weights``) equals the
    loss Flywheel's torch backend trains on for the same samples and model."""
    from tensordict import NonTensorData
    from verl import DataProto
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    cfg = AlgorithmConfig(behaviour_weight="truncated", clip_low=0.2, clip_high=0.28, tis_cap=2.0)
    model = _tiny()
    samples = _samples()
    backend = TorchBackend(model, cfg)
    rows = _Rows(samples, pad_id=0, device=torch.device("cpu"))
    with torch.no_grad():
        ours_logp = backend._logprobs(model, rows)
        # π_old: the policy one step earlier, so the ratio is not 1 and clipping can act
        old_full = ours_logp + 0.3 * torch.sin(torch.arange(ours_logp.numel()).view_as(ours_logp).float())
    ours = policy_loss(ours_logp, old_full, rows.behaviour, rows.adv, rows.weights, cfg)

    batch = to_verl_batch(samples, pad_id=0)
    proto = DataProto.from_single_dict(dict(batch.tensors))
    td = left_right_2_no_padding(proto.to_tensordict())
    # the real model on verl's unpadded sequences: logprob of each next token, packed as verl packs them
    packed = []
    for seq in td["input_ids"].unbind():
        with torch.no_grad():
            logits = model(input_ids=seq.unsqueeze(0)).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, seq[1:].unsqueeze(-1)).squeeze(-1)
        packed.append(torch.cat([lp, torch.zeros(1)]))
    nested = torch.nested.nested_tensor_from_jagged(torch.cat(packed), offsets=td["input_ids"].offsets())
    theirs_logp = no_padding_2_padding(nested, td)
    # Flywheel's rows are aligned to the whole sequence; verl's to the response: pick the response slots
    starts = [len(s.prompt_ids) - 1 for s in samples]
    width = theirs_logp.shape[1]

    def pick(x: torch.Tensor) -> torch.Tensor:
        rows = [
            torch.nn.functional.pad(x[i, st : st + len(s.response_ids)], (0, width - len(s.response_ids)))
            for i, (s, st) in enumerate(zip(samples, starts, strict=True))
        ]
        return torch.stack(rows)

    mask = batch.tensors["response_mask"].float()
    torch.testing.assert_close(theirs_logp * mask, pick(ours_logp) * mask, atol=1e-5, rtol=0)

    old = pick(old_full) * mask
    is_weights, _ = compute_rollout_correction_weights(
        old - batch.tensors["rollout_log_probs"], mask, "token", 2.0
    )
    proto.batch["old_log_probs"] = old
    proto.batch["rollout_is_weights"] = is_weights
    td = left_right_2_no_padding(proto.to_tensordict())
    tu.assign_non_tensor(td, dp_size=NonTensorData(1), batch_num_tokens=NonTensorData(None))
    tu.assign_non_tensor(td, global_batch_size=NonTensorData(None))
    loss, _ = ppo_loss(_actor(cfg, "token-sum"), {"log_probs": nested}, td)
    assert abs(float(loss) - ours.loss.item()) <= TOL, (float(loss), ours.loss.item())
