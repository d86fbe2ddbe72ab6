"""Supervised fine-tuning: the warm start, and SFT mode (cross-entropy on good episodes).

Rejection-sampling fine-tuning in its plainest form (RAFT, Dong et al. 2023, arXiv:2304.06767; the
"SFT on successes" baseline of most agent-RL papers): keep the episodes whose reward reaches
``sft_reward_threshold`` and maximise the likelihood of their generated tokens (observation tokens stay
masked). Each episode weighs like one, as in the policy loss. The same step warm-starts a model from a
list of ``(prompt_ids, response_ids)`` pairs before RL, so the policy starts imperfect but not random.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from schemas import EpisodeScored, EpisodeStatus
from trainer.backends.base import Backend
from trainer.batching import Sample, sft_samples


def select_episodes(episodes: Sequence[EpisodeScored], threshold: float) -> list[EpisodeScored]:
    """Episodes that finished ``ok`` with reward ≥ ``threshold`` and have transitions."""
    return [
        e
        for e in episodes
        if e.status == EpisodeStatus.ok and e.reward is not None and e.reward >= threshold and e.transitions
    ]


def episode_samples(episodes: Sequence[EpisodeScored]) -> list[Sample]:
    """SFT rows from episodes' transitions, keeping their response masks; one episode weighs like one."""
    out: list[Sample] = []
    n = len(episodes)
    for e in episodes:
        tokens = sum(sum(t.response_mask) for t in e.transitions)
        if tokens == 0:
            continue
        for t in e.transitions:
            out.append(
                Sample(
                    prompt_ids=list(t.prompt_ids),
                    response_ids=list(t.response_ids),
                    response_mask=list(t.response_mask),
                    behaviour_logprobs=list(t.behaviour_logprobs),
                    advantage=0.0,
                    token_weight=1.0 / (n * tokens),
                    episode_id=e.episode_id,
                    weight_version=t.weight_version,
                )
            )
    return out


def warm_start(
    backend: Backend,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    epochs: int = 1,
    batch_size: int = 32,
    seed: int = 0,
) -> list[float]:
    """SFT on ``(prompt_ids, response_ids)`` pairs, shuffled per epoch; returns the loss of each step."""
    rng = random.Random(seed)
    order = list(pairs)
    losses: list[float] = []
    for _ in range(epochs):
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            chunk = order[i : i + batch_size]
            samples = sft_samples(chunk)
            if samples:
                losses.append(backend.sft_step(samples)["sft_loss"])
    return losses
