"""Credit assignment: per-call rewards and the discount reach the per-token advantages (issue 15)."""

from __future__ import annotations

import pytest
import torch

from reward_service.transitions import assemble
from schemas import EpisodeScored, Transition
from tests.unit.reward.calls import call
from trainer.backends.torch_backend import TorchBackend
from trainer.batching import TrainBatch, build_batch
from trainer.config import AlgorithmConfig
from trainer.credit import token_rewards
from trainer.groups import Group

from .helpers import tiny_model

EP = "e" * 32


def _two_calls(call_rewards: dict[int, float], *, merged: bool = False) -> list[Transition]:
    """Two calls of one episode, as the reward service assembles them (episode reward 1.0)."""
    c0 = call(EP, 0, [1, 2, 3], [10, 11])
    prompt1 = [1, 2, 3, 10, 11, 50] if merged else [7, 8]
    c1 = call(EP, 1, prompt1, [12, 13])
    return assemble([c0, c1], reward=1.0, call_rewards=call_rewards).transitions


def _group(gid: str, transitions: list[Transition]) -> Group:
    good = EpisodeScored(
        episode_id=f"{gid}-good", group_id=gid, group_size=2, reward=1.0, transitions=transitions
    )
    # the partner failed; its single call shares no tokens with the others
    bad_t = assemble([call(EP, 0, [20, 21], [22, 23])], reward=0.0).transitions
    bad = EpisodeScored(episode_id=f"{gid}-bad", group_id=gid, group_size=2, reward=0.0, transitions=bad_t)
    return Group(gid, 2, 0.0, {good.episode_id: good, bad.episode_id: bad})


def _advantages(batch: TrainBatch, episode_id: str) -> list[list[float]]:
    return [s.token_rows(0)[1] for s in batch.samples if s.episode_id == episode_id]


def _trained(batch: TrainBatch) -> dict[str, torch.Tensor]:
    backend = TorchBackend(tiny_model(0), AlgorithmConfig(m2_threshold=None, learning_rate=1e-2))
    backend.train_step(batch)
    return {k: v.detach().clone() for k, v in backend.model.state_dict().items()}


@pytest.mark.timeout(60)
def test_per_call_rewards_change_the_per_token_advantages_and_the_update() -> None:
    """Regression: episode reward 1.0, transition rewards [1, 1] vs [-5, 1] trained identically."""
    plain, punished = _two_calls({}), _two_calls({0: -6.0})
    assert [t.reward for t in plain] == [1.0, 1.0]
    assert [t.reward for t in punished] == [-5.0, 1.0]
    cfg = AlgorithmConfig(m2_threshold=None)
    a = build_batch([_group("g", plain)], cfg, 0)
    b = build_batch([_group("g", punished)], cfg, 0)
    adv_a, adv_b = _advantages(a, "g-good"), _advantages(b, "g-good")
    assert adv_a != adv_b
    # GRPO over rewards 1, 0: mean 0.5, std 0.707; call 0's return -5 is far below the baseline
    assert adv_a[0] == pytest.approx([0.5 / (0.5**0.5 + 1e-6)] * 2, rel=1e-5)
    assert adv_b[0] == pytest.approx([(-5 - 0.5) / (0.5**0.5 + 1e-6)] * 2, rel=1e-5)
    assert adv_b[1] == adv_a[1]  # the last call's return is the episode reward in both
    wa, wb = _trained(a), _trained(b)
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.timeout(30)
def test_merged_trajectory_gets_per_segment_advantages() -> None:
    [t] = _two_calls({0: -6.0}, merged=True)
    assert t.response_ids == [10, 11, 50, 12, 13] and t.response_mask == [1, 1, 0, 1, 1]
    assert t.segment_starts == [0, 3] and t.segment_returns == [-5.0, 1.0]
    batch = build_batch([_group("g", [t])], AlgorithmConfig(), 0)
    [adv] = _advantages(batch, "g-good")
    scale = 0.5**0.5 + 1e-6
    assert adv == pytest.approx([-5.5 / scale] * 3 + [0.5 / scale] * 2, rel=1e-5)
    # observation token 50 carries no loss weight
    [weights] = [s.token_rows(0)[0] for s in batch.samples if s.episode_id == "g-good"]
    assert weights[2] == 0.0 and all(w > 0 for i, w in enumerate(weights) if i != 2)
    # PPO rewards: G[0] - G[1] on call 0's last generated token, G[1] on the last one; they sum to G[0]
    assert token_rewards(t) == [0.0, -6.0, 0.0, 0.0, 1.0]


@pytest.mark.timeout(30)
def test_without_per_call_rewards_and_discount_nothing_changes() -> None:
    [t] = _two_calls({}, merged=True)
    batch = build_batch([_group("g", [t])], AlgorithmConfig(), 0)
    assert all(s.token_advantages is None for s in batch.samples)
    [adv] = _advantages(batch, "g-good")
    assert adv == pytest.approx([0.5 / (0.5**0.5 + 1e-6)] * 5)
    # the discount alone reaches them: γ = 0.5 halves call 0's return
    c0 = call(EP, 0, [1, 2, 3], [10, 11])
    c1 = call(EP, 1, [7, 8], [12, 13])
    discounted = assemble([c0, c1], reward=1.0, discount=0.5).transitions
    assert [x.reward for x in discounted] == [0.5, 1.0]
    batch = build_batch([_group("g", discounted)], AlgorithmConfig(), 0)
    first, last = _advantages(batch, "g-good")
    assert first[0] < last[0]


@pytest.mark.timeout(30)
def test_equal_episode_rewards_with_different_per_call_returns_still_train() -> None:
    g = Group(
        "g",
        2,
        0.0,
        {
            "a": EpisodeScored(
                episode_id="a", group_id="g", group_size=2, reward=1.0, transitions=_two_calls({})
            ),
            "b": EpisodeScored(
                episode_id="b", group_id="g", group_size=2, reward=1.0, transitions=_two_calls({0: -6.0})
            ),
        },
    )
    batch = build_batch([g], AlgorithmConfig(), 0)
    assert batch.stats.groups_zero_variance == 0 and batch.samples
    assert min(min(s.token_rows(0)[1]) for s in batch.samples) == pytest.approx(-6.0)
