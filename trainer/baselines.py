"""Baselines for production sessions, which come one at a time and have no group of siblings.

A production session (``EpisodeScored.source == production``) is scored as a group of one, so a group
baseline (GRPO, RLOO) gives it advantage 0. Two baselines that do not need a group, chosen with
``AlgorithmConfig.production_baseline`` (see :mod:`trainer.config` for the citations):

``"ema"`` (the default) — REINFORCE with a baseline (Williams 1992): per key (tenant, scorer), an
exponential moving mean ``m`` and variance ``v`` of recent production rewards. The advantage of an
episode with reward ``r`` is ``(r - m) / max(sqrt(v), std_floor)`` (or ``r - m`` without
``production_scale_by_std``) with ``m, v`` as they were *before* this step's rewards, so an episode's
baseline never depends on its own reward. After the step, every reward of the step updates its key::

    d = r - m;   m ← m + α·d;   v ← (1 - α)·(v + α·d²)          (α = 1 - production_ema_decay)

A key seen for the first time has no history: it starts from the mean and (population) variance of
this step's rewards for that key, so a first step with rewards 1, 0, 1 already gets signal; a first
step with a single reward for a new key has none (counted as ``production_no_signal``).

``"batch"`` — REINFORCE++'s global normalisation (Hu 2025, arXiv:2501.03262): the production episodes
of one step are normalised together, ``(r - mean_batch) / (std_batch + eps)``; no history. A step with
fewer than two distinct production rewards has no signal. The EMA state is still updated, so switching
back to ``"ema"`` keeps a warm baseline.

The state is plain JSON (``to_json``/``from_json``) and is saved in the checkpoint's ``meta.json``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas import EpisodeScored
from trainer.config import AlgorithmConfig


def baseline_key(event: EpisodeScored) -> str:
    """``tenant|scorer``: sessions of one tenant scored the same way share a baseline."""
    return f"{event.tenant or ''}|{event.reward_source or ''}"


@dataclass
class RunningStat:
    mean: float
    var: float
    count: int

    def update(self, r: float, alpha: float) -> None:
        d = r - self.mean
        self.mean += alpha * d
        self.var = (1.0 - alpha) * (self.var + alpha * d * d)
        self.count += 1


class ProductionBaselines:
    def __init__(self, stats: dict[str, RunningStat] | None = None) -> None:
        self.stats: dict[str, RunningStat] = dict(stats or {})

    def advantages(
        self, episodes: Sequence[EpisodeScored], cfg: AlgorithmConfig
    ) -> list[tuple[float, float]]:
        """``(advantage, scale)`` per episode (same order; every ``reward`` set); 0 means no signal.

        ``scale`` is what the centred reward was divided by (:mod:`trainer.credit` divides per-call
        terms by it too). Does not change the state: :meth:`update` does, after the step.
        """
        rewards = [float(e.reward or 0.0) for e in episodes]
        if cfg.production_baseline == "batch":
            if len(rewards) < 2 or max(rewards) - min(rewards) <= 1e-9:
                return [(0.0, 1.0)] * len(rewards)
            mean = sum(rewards) / len(rewards)
            std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) + cfg.std_eps
            return [((r - mean) / std, std) for r in rewards]
        by_key: dict[str, list[float]] = defaultdict(list)
        for e, r in zip(episodes, rewards, strict=True):
            by_key[baseline_key(e)].append(r)
        out: list[tuple[float, float]] = []
        for e, r in zip(episodes, rewards, strict=True):
            key = baseline_key(e)
            stat = self.stats.get(key)
            if stat is None:  # cold start: this step's rewards for the key are the only estimate
                same = by_key[key]
                mean = sum(same) / len(same)
                stat = RunningStat(mean, sum((x - mean) ** 2 for x in same) / len(same), 0)
            scale = max(math.sqrt(stat.var), cfg.production_std_floor) if cfg.production_scale_by_std else 1.0
            out.append(((r - stat.mean) / scale, scale))
        return out

    def update(self, episodes: Sequence[EpisodeScored], cfg: AlgorithmConfig) -> None:
        alpha = 1.0 - cfg.production_ema_decay
        by_key: dict[str, list[float]] = defaultdict(list)
        for e in episodes:
            if e.reward is not None:
                by_key[baseline_key(e)].append(float(e.reward))
        for key, rewards in by_key.items():
            stat = self.stats.get(key)
            if stat is None:
                mean = sum(rewards) / len(rewards)
                var = sum((x - mean) ** 2 for x in rewards) / len(rewards)
                self.stats[key] = RunningStat(mean, var, len(rewards))
                continue
            for r in rewards:
                stat.update(r, alpha)

    def to_json(self) -> dict[str, dict[str, float]]:
        return {k: {"mean": s.mean, "var": s.var, "count": float(s.count)} for k, s in self.stats.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ProductionBaselines:
        stats = {
            str(k): RunningStat(float(v["mean"]), float(v["var"]), int(v.get("count", 0)))
            for k, v in (data or {}).items()
        }
        return cls(stats)
