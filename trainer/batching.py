"""From groups of scored episodes to a training batch: advantages, staleness, per-token weights.

Per-episode normalisation (docs/architecture.md, "Credit assignment"): every response token of an episode gets the
weight ``1 / (episodes_in_batch × response_tokens_of_episode)``, so the loss is a token mean within an
episode and a plain mean across episodes — an episode with five calls weighs as much as one with one.
Staleness: by default (``AlgorithmConfig.stale_policy = "weight"``) a transition trains whatever its lag —
the behaviour correction in :mod:`trainer.loss` (tapered weights; M2PO's mask when set) is what makes
stale data safe;
``"drop"`` and ``"downweight"`` apply a lag bound here instead. Whatever a batch leaves out is counted per
reason (``BatchStats.skipped``): ``excluded_<reason>`` in the step's figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from schemas import EpisodeScored, EpisodeSource, EpisodeStatus
from trainer.advantages import group_advantages, group_scale, has_variance
from trainer.baselines import ProductionBaselines
from trainer.config import AlgorithmConfig
from trainer.credit import has_excess, token_advantages, token_rewards
from trainer.groups import Group, is_production_session


@dataclass(frozen=True, slots=True)
class Sample:
    """One transition as the backend trains on it."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    behaviour_logprobs: list[float]
    advantage: float
    token_weight: float  # multiplies every response token's loss (normalisation × staleness)
    episode_id: str
    weight_version: int = 0
    source: str = "live"  # EpisodeSource value: what ``samples`` per source counts
    # per response token, when they differ from ``advantage`` (per-call rewards, discount; trainer.credit)
    token_advantages: list[float] | None = None
    # PPO: per response token, the reward GAE reads (on each call's last generated token; trainer.credit)
    token_rewards: list[float] | None = None
    # the temperature its behaviour logprobs were sampled at: the backend divides the logits by it
    temperature: float = 1.0

    @property
    def response_tokens(self) -> int:
        return sum(self.response_mask)

    def token_rows(self, pad: int) -> tuple[list[float], list[float], list[float]]:
        """Per response token, then ``pad`` zeros: loss weight, advantage, behaviour logprob (masked)."""
        after = [0.0] * pad
        mask = self.response_mask
        return (
            [m * self.token_weight for m in mask] + after,
            (self.token_advantages or [self.advantage] * len(self.response_ids)) + after,
            [lp * m for lp, m in zip(self.behaviour_logprobs, mask, strict=True)] + after,
        )


@dataclass
class BatchStats:
    groups: int = 0
    groups_zero_variance: int = 0
    groups_partial: int = 0
    episodes: int = 0
    episodes_trained: int = 0
    transitions: int = 0
    reward_mean: float = 0.0
    success_rate: float = 0.0
    transitions_per_episode: float = 0.0
    staleness_mean: float = 0.0
    staleness_max: int = 0
    replay_episodes: int = 0
    production_episodes: int = 0  # rewarded production sessions in the batch (trained or not)
    # the weight versions that sampled the trained transitions (a replay's are the recorded run's)
    behaviour_version_min: int = 0
    behaviour_version_mean: float = 0.0
    behaviour_version_max: int = 0
    # the trained episodes' advantages: mean |A| and the share above zero
    advantage_abs_mean: float = 0.0
    advantage_positive: float = 0.0
    skipped: Counter[str] = field(default_factory=Counter)
    samples_by_source: Counter[str] = field(default_factory=Counter)

    def as_metrics(self) -> dict[str, float]:
        return {
            "groups": float(self.groups),
            "groups_zero_variance": float(self.groups_zero_variance),
            "groups_partial": float(self.groups_partial),
            "episodes": float(self.episodes),
            "episodes_trained": float(self.episodes_trained),
            "transitions": float(self.transitions),
            "reward": self.reward_mean,
            "success": self.success_rate,
            "transitions_per_episode": self.transitions_per_episode,
            "staleness_mean": self.staleness_mean,
            "staleness_max": float(self.staleness_max),
            "replay_episodes": float(self.replay_episodes),
            "production_episodes": float(self.production_episodes),
            "behaviour_version_min": float(self.behaviour_version_min),
            "behaviour_version_mean": self.behaviour_version_mean,
            "behaviour_version_max": float(self.behaviour_version_max),
            "advantage_abs_mean": self.advantage_abs_mean,
            "advantage_positive": self.advantage_positive,
            **{f"samples_{src.value}": float(self.samples_by_source[src.value]) for src in EpisodeSource},
            **{f"excluded_{reason}": float(n) for reason, n in sorted(self.skipped.items()) if n},
        }


@dataclass
class TrainBatch:
    samples: list[Sample]
    stats: BatchStats
    group_ids: list[str]
    production: list[EpisodeScored] = field(default_factory=list)  # rewarded; they update the baseline

    @property
    def response_tokens(self) -> int:
        return sum(s.response_tokens for s in self.samples)


def _is_success(e: EpisodeScored, threshold: float) -> bool:
    return e.status == EpisodeStatus.ok and e.reward is not None and e.reward >= threshold


def _fresh(
    episode: EpisodeScored, cfg: AlgorithmConfig, current_version: int, stats: BatchStats, lags: list[int]
) -> list[tuple[int, float, int]]:
    """The transitions of ``episode`` that train: (index, staleness factor, lag); all of them under
    ``stale_policy = "weight"``."""
    kept: list[tuple[int, float, int]] = []
    for i, t in enumerate(episode.transitions):
        lag = max(0, current_version - t.weight_version)
        lags.append(lag)
        factor = 1.0
        if lag > cfg.max_staleness and cfg.stale_policy != "weight":
            if cfg.stale_policy == "drop":
                stats.skipped["stale_transition"] += 1
                continue
            factor = cfg.stale_decay ** (lag - cfg.max_staleness)
        kept.append((i, factor, lag))
    if not kept and episode.transitions:
        stats.skipped["stale_episode"] += 1
    return kept


def is_production(group: Group) -> bool:
    """A production session, live or replayed (:func:`~trainer.groups.is_production_session`)."""
    return any(is_production_session(e) for e in group.episodes())


# (episode, advantage, scale, [(transition, staleness factor, lag)])
_Chosen = tuple[EpisodeScored, float, float, list[tuple[int, float, int]]]


def build_batch(
    groups: Sequence[Group],
    cfg: AlgorithmConfig,
    current_version: int,
    *,
    success_threshold: float = 1.0,
    baselines: ProductionBaselines | None = None,
) -> TrainBatch:
    """Advantages per group (production sessions: per baseline), staleness per transition, weights.

    Production sessions (groups of one from :meth:`~trainer.groups.Intake.take_production`) get their
    advantage from ``baselines`` (:mod:`trainer.baselines`) instead of a group; their truncated
    importance weights and staleness bound are the same as every other episode's.
    """
    stats = BatchStats(groups=len(groups))
    episodes_all = [e for g in groups for e in g.episodes()]
    rewarded = [e for e in episodes_all if e.reward is not None]
    stats.episodes = len(episodes_all)
    if rewarded:
        stats.reward_mean = sum(e.reward or 0.0 for e in rewarded) / len(rewarded)
        stats.success_rate = sum(_is_success(e, success_threshold) for e in rewarded) / len(rewarded)
    with_calls = [e for e in episodes_all if e.transitions]
    if with_calls:
        stats.transitions_per_episode = sum(len(e.transitions) for e in with_calls) / len(with_calls)

    chosen: list[_Chosen] = []
    lags: list[int] = []
    production: list[EpisodeScored] = []
    ppo = cfg.algorithm == "ppo"
    for group in groups:
        if is_production(group):
            production.extend(group.episodes())
            continue
        stats.groups_partial += int(group.expired)
        members = [e for e in group.episodes() if e.reward is not None]
        rewards = [float(e.reward or 0.0) for e in members]
        if ppo:  # the critic is the baseline: every rewarded episode trains, no group statistic
            pairs = [(0.0, 1.0)] * len(members)
        elif has_variance(rewards):
            advs = group_advantages(rewards, cfg.advantage, scale_by_std=cfg.scale_by_std, eps=cfg.std_eps)
            scale = group_scale(rewards, cfg.advantage, scale_by_std=cfg.scale_by_std, eps=cfg.std_eps)
            pairs = [(a, scale) for a in advs]
        elif any(has_excess(t, r) for e, r in zip(members, rewards, strict=True) for t in e.transitions):
            pairs = [(0.0, 1.0)] * len(members)  # equal episode rewards, but per-call returns differ
        else:
            stats.groups_zero_variance += 1
            stats.skipped["no_signal"] += len(members)
            continue
        for episode, (adv, scale) in zip(members, pairs, strict=True):
            kept = _fresh(episode, cfg, current_version, stats, lags)
            if kept:
                chosen.append((episode, adv, scale, kept))

    stats.skipped["no_reward"] += sum(1 for e in production if e.reward is None)
    production = [e for e in production if e.reward is not None]
    stats.production_episodes = len(production)
    if production:
        prod_advs = (
            [(0.0, 1.0)] * len(production)
            if ppo
            else (baselines or ProductionBaselines()).advantages(production, cfg)
        )
        for episode, (adv, scale) in zip(production, prod_advs, strict=True):
            reward = float(episode.reward or 0.0)
            if not ppo and abs(adv) <= 1e-9 and not any(has_excess(t, reward) for t in episode.transitions):
                stats.skipped["production_no_signal"] += 1
                continue
            kept = _fresh(episode, cfg, current_version, stats, lags)
            if kept:
                chosen.append((episode, adv, scale, kept))

    samples = _samples(chosen, ppo, stats)
    n_eps = len(chosen)
    stats.episodes_trained = n_eps
    stats.transitions = len(samples)
    if samples:
        versions = [s.weight_version for s in samples]
        stats.behaviour_version_min, stats.behaviour_version_max = min(versions), max(versions)
        stats.behaviour_version_mean = sum(versions) / len(versions)
    if chosen:
        stats.advantage_abs_mean = sum(abs(adv) for _, adv, _, _ in chosen) / n_eps
        stats.advantage_positive = sum(1 for _, adv, _, _ in chosen if adv > 0) / n_eps
    if lags:
        stats.staleness_mean = sum(lags) / len(lags)
        stats.staleness_max = max(lags)
    return TrainBatch(
        samples=samples, stats=stats, group_ids=[g.group_id for g in groups], production=production
    )


def _samples(chosen: Sequence[_Chosen], ppo: bool, stats: BatchStats) -> list[Sample]:
    """One sample per kept transition, each episode weighing ``1 / len(chosen)`` over its tokens."""
    samples: list[Sample] = []
    n_eps = len(chosen)
    for episode, adv, scale, kept in chosen:
        stats.replay_episodes += int(episode.source == EpisodeSource.replay)
        tokens = sum(sum(episode.transitions[i].response_mask) for i, _, _ in kept)
        reward = float(episode.reward or 0.0)
        for i, factor, _ in kept:
            t = episode.transitions[i]
            samples.append(
                Sample(
                    prompt_ids=list(t.prompt_ids),
                    response_ids=list(t.response_ids),
                    response_mask=list(t.response_mask),
                    behaviour_logprobs=list(t.behaviour_logprobs),
                    advantage=adv,
                    token_weight=factor / (n_eps * tokens),
                    episode_id=episode.episode_id,
                    weight_version=t.weight_version,
                    source=episode.source.value,
                    token_advantages=None if ppo else token_advantages(t, adv, reward, scale),
                    token_rewards=token_rewards(t) if ppo else None,
                    temperature=t.temperature,
                )
            )
            stats.samples_by_source[episode.source.value] += 1
    return samples


def sft_samples(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> list[Sample]:
    """SFT rows from (prompt_ids, response_ids) pairs, each pair weighing like one episode."""
    n = len(pairs)
    return [
        Sample(
            prompt_ids=list(p),
            response_ids=list(r),
            response_mask=[1] * len(r),
            behaviour_logprobs=[0.0] * len(r),
            advantage=0.0,
            token_weight=1.0 / (n * max(1, len(r))),
            episode_id=f"sft-{i}",
        )
        for i, (p, r) in enumerate(pairs)
        if len(r) > 0
    ]
