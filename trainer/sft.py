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
from trainer.batching import BatchStats, Sample, TrainBatch, sft_samples
from trainer.groups import Group


def select_episodes(episodes: Sequence[EpisodeScored], threshold: float) -> list[EpisodeScored]:
    """Episodes that finished ``ok`` with reward ≥ ``threshold`` and have transitions."""
    return [
        e
        for e in episodes
        if e.status == EpisodeStatus.ok and e.reward is not None and e.reward >= threshold and e.transitions
    ]


def sft_batch(groups: Sequence[Group], threshold: float) -> TrainBatch:
    """SFT mode's batch: every episode of ``groups`` that passes :func:`select_episodes`.

    No advantages, so no group statistic: an all-success group is all targets, not "no signal", and a
    production session trains like any other episode. The loss reads the generated tokens only
    (``response_mask``), each episode weighing like one.
    """
    episodes = [e for g in groups for e in g.episodes()]
    chosen = select_episodes(episodes, threshold)
    samples = episode_samples(chosen)
    stats = BatchStats(groups=len(groups), episodes=len(episodes))
    rewarded = [e for e in episodes if e.reward is not None]
    if rewarded:
        stats.reward_mean = sum(e.reward or 0.0 for e in rewarded) / len(rewarded)
        stats.success_rate = sum(e in chosen for e in rewarded) / len(rewarded)
    with_calls = [e for e in episodes if e.transitions]
    if with_calls:
        stats.transitions_per_episode = sum(len(e.transitions) for e in with_calls) / len(with_calls)
    stats.episodes_trained = len({s.episode_id for s in samples})
    stats.transitions = len(samples)
    stats.skipped["sft_below_threshold"] += len(episodes) - len(chosen)
    for sample in samples:
        stats.samples_by_source[sample.source] += 1
    return TrainBatch(samples=samples, stats=stats, group_ids=[g.group_id for g in groups])


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
                    source=e.source.value,
                    temperature=t.temperature,  # the likelihood of the distribution the agent samples
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
