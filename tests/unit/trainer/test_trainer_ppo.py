"""PPO with a critic: GAE over generated tokens, a value head that learns, single sessions that train."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from schemas import EpisodeScored, EpisodeSource
from trainer.backends.torch_backend import WEIGHTS_FILE, TorchBackend
from trainer.batching import build_batch, sft_samples
from trainer.config import AlgorithmConfig
from trainer.groups import Group
from trainer.ppo import VALUE_HEAD_FILE, gae

from .helpers import tiny_model, transition

PROMPT = [1, 2, 3]
GOOD = [10, 11, 12]
BAD = [20, 21, 22]
PPO = AlgorithmConfig(m2_threshold=None, algorithm="ppo", learning_rate=5e-3, tis_cap=None)


def _session(i: int, response: list[int], reward: float, version: int = 0) -> Group:
    eid = f"s{i}"
    e = EpisodeScored(
        episode_id=eid,
        group_id=eid,
        source=EpisodeSource.production,
        reward=reward,
        reward_source="feedback",
        transitions=[transition(PROMPT, response, reward=reward, version=version)],
    )
    return Group(eid, 1, 0.0, {eid: e})


@pytest.mark.timeout(10)
def test_gae_runs_over_generated_tokens_only() -> None:
    values = torch.tensor([[0.0, 0.5, 9.0, 0.25]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])  # position 2 is an observation token: skipped
    adv, returns = gae(values, rewards, mask, gamma=1.0, lam=0.5)
    d3 = 1.0 - 0.25
    d1 = 0.0 + 0.25 - 0.5
    d0 = 0.0 + 0.5 - 0.0
    expected = [d0 + 0.5 * (d1 + 0.5 * d3), d1 + 0.5 * d3, 0.0, d3]
    assert adv[0].tolist() == pytest.approx(expected)
    assert returns[0, 3].item() == pytest.approx(1.0)
    # λ = 1, γ = 1: the advantage is the return minus the value (Monte Carlo)
    adv1, _ = gae(values, rewards, mask, gamma=1.0, lam=1.0)
    assert adv1[0, 0].item() == pytest.approx(1.0 - 0.0)


@pytest.mark.timeout(10)
def test_ppo_batches_need_no_group() -> None:
    lone = build_batch([_session(0, GOOD, 1.0)], PPO, 0)
    assert len(lone.samples) == 1
    assert lone.samples[0].token_rewards == [0.0, 0.0, 1.0]
    assert build_batch([_session(0, GOOD, 1.0)], AlgorithmConfig(), 0).samples == []


@pytest.mark.timeout(120)
def test_the_critic_learns_and_single_sessions_move_the_policy(tmp_path: Path) -> None:
    backend = TorchBackend(tiny_model(), PPO)
    good, bad = sft_samples([(PROMPT, GOOD), (PROMPT, BAD)])
    before = backend.sequence_logprobs([good, bad])
    values = []
    for step in range(16):  # one production session per step, liked or not
        liked = step % 2 == 0
        batch = build_batch(
            [_session(step, GOOD if liked else BAD, 1.0 if liked else 0.0, backend.version)],
            PPO,
            backend.version,
        )
        metrics = backend.train_step(batch)
        assert metrics["grad_norm"] > 0 and "value_loss" in metrics
        values.append(metrics["value_mean"])
    after = backend.sequence_logprobs([good, bad])
    assert values[0] == 0.0 and values[-1] > 0.1  # the zero-initialised critic learned the mean reward
    assert after[0] - before[0] > 0 and (after[0] - after[1]) - (before[0] - before[1]) > 1.0
    # checkpoint: the value head beside the weights, not in what the engine loads
    backend.save_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / VALUE_HEAD_FILE).is_file()
    exported = load_file(str(backend.export_weights(tmp_path / "export")))
    assert not any("value" in k for k in exported)
    assert list((tmp_path / "ckpt").glob("*.safetensors")) == [tmp_path / "ckpt" / WEIGHTS_FILE]
    plain = TorchBackend(tiny_model(seed=3), AlgorithmConfig(m2_threshold=None))
    plain.load_checkpoint(tmp_path / "ckpt", 16)  # the policy alone loads (no critic, fresh Adam)
    assert plain.sequence_logprobs([good]) == pytest.approx([after[0]], abs=1e-4)
    resumed = TorchBackend(tiny_model(seed=3), PPO)
    resumed.load_checkpoint(tmp_path / "ckpt", 16)
    assert resumed.value_head is not None and backend.value_head is not None
    assert torch.equal(resumed.value_head.weight, backend.value_head.weight)


@pytest.mark.timeout(60)
def test_several_ppo_epochs_use_the_values_from_before_the_step() -> None:
    cfg = PPO.model_copy(update={"ppo_epochs": 3, "learning_rate": 2e-2, "value_clip": 0.01})
    backend = TorchBackend(tiny_model(), cfg)
    batch = build_batch([_session(0, GOOD, 1.0), _session(1, BAD, 0.0)], cfg, 0)
    metrics = backend.train_step(batch)
    assert metrics["clip_fraction"] > 0 and metrics["value_loss"] > 0 and backend.version == 1
