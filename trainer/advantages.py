"""Group-relative advantages: one number per episode, computed from the rewards of its group.

Every transition of an episode inherits the episode's advantage (LightningRL credit assignment,
docs/architecture.md, "Credit assignment"); per-call rewards and the discount add a per-call term on top (:mod:`trainer.credit`). A group whose rewards are all equal carries no signal under any of these estimators; the
caller counts it and skips it rather than training on zeros. See :mod:`trainer.config` for citations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

AdvantageKind = Literal["grpo", "rloo", "mean"]


def has_variance(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    return len(rewards) >= 2 and (max(rewards) - min(rewards)) > tol


def group_scale(
    rewards: Sequence[float], kind: AdvantageKind = "grpo", *, scale_by_std: bool = True, eps: float = 1e-6
) -> float:
    """What :func:`group_advantages` divides the centred rewards by (1 when it does not scale)."""
    n = len(rewards)
    if kind != "grpo" or not scale_by_std or n < 2:
        return 1.0
    mean = sum(rewards) / n
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1)) + eps


def group_advantages(
    rewards: Sequence[float],
    kind: AdvantageKind = "grpo",
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> list[float]:
    """Advantages for one group's episode rewards (same order).

    ``grpo``: ``(r - mean) / (std + eps)`` with the unbiased std when ``scale_by_std`` (verl's
    ``compute_grpo_outcome_advantage``), else ``r - mean``. ``rloo``: ``r_i - mean_{j != i} r_j``.
    ``mean``: ``r - mean``. A group of one gets advantage 0.
    """
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    mean = sum(rewards) / n
    if kind == "rloo":
        total = sum(rewards)
        return [r - (total - r) / (n - 1) for r in rewards]
    centred = [r - mean for r in rewards]
    if kind == "grpo" and scale_by_std:
        std = math.sqrt(sum(c * c for c in centred) / (n - 1))
        return [c / (std + eps) for c in centred]
    return centred
