"""Advantage math, cross-checked against verl's GRPO formula (re-implemented here, verl not imported)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.advantages import group_advantages, has_variance


def verl_grpo_reference(rewards: list[float], index: list[str], eps: float = 1e-6) -> list[float]:
    """verl 0.9.1's ``core_algos.compute_grpo_outcome_advantage``: per uid, (score - mean) / (std + eps),
    with torch.std (unbiased); a uid with one sample gets mean 0 and std 1."""
    scores = torch.tensor(rewards)
    out = scores.clone()
    for uid in set(index):
        idx = [i for i, u in enumerate(index) if u == uid]
        group = scores[idx]
        if len(idx) == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = group.mean(), group.std()
        out[idx] = (group - mean) / (std + eps)
    return out.tolist()


@pytest.mark.timeout(10)
def test_grpo_matches_verl_formula() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.2, 0.9, 0.3]
    index = ["a"] * 4 + ["b"] * 4
    expected = verl_grpo_reference(rewards, index)
    ours = group_advantages(rewards[:4], "grpo") + group_advantages(rewards[4:], "grpo")
    assert ours == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.timeout(10)
def test_mean_and_rloo() -> None:
    r = [1.0, 0.0, 0.0, 0.0]
    assert group_advantages(r, "mean") == pytest.approx([0.75, -0.25, -0.25, -0.25])
    # RLOO: r_i - mean of the others
    assert group_advantages(r, "rloo") == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # RLOO equals n/(n-1) times the mean-baseline advantage
    assert group_advantages(r, "rloo") == pytest.approx([x * 4 / 3 for x in group_advantages(r, "mean")])
    assert group_advantages(r, "grpo", scale_by_std=False) == group_advantages(r, "mean")


@pytest.mark.timeout(10)
def test_zero_variance_and_singletons() -> None:
    assert not has_variance([1.0, 1.0, 1.0])
    assert not has_variance([0.5])
    assert has_variance([0.0, 1.0])
    assert group_advantages([1.0, 1.0], "grpo") == [0.0, 0.0]
    assert group_advantages([3.0], "rloo") == [0.0]
    advs = group_advantages([0.0, 1.0], "grpo")
    assert sum(advs) == pytest.approx(0.0)
    assert advs[1] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6))
