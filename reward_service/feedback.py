"""Production feedback → reward, by a configured mapping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from schemas import RewardOrigin, RewardReported

_THUMBS = {-1: 0.0, 0: 0.5, 1: 1.0}


@dataclass(frozen=True, slots=True)
class FeedbackMapping:
    scale: str = "thumbs"  # thumbs: -1/0/+1; stars: 1..stars_max
    stars_max: int = 5
    ratings: dict[str, float] = field(default_factory=dict)  # explicit overrides, rating → reward

    def reward(self, feedback: RewardReported) -> float | None:
        """A value wins over a rating; a rating goes through the overrides, then the scale."""
        if feedback.value is not None:
            return feedback.value
        rating = feedback.rating
        if rating is None:
            return None
        if str(rating) in self.ratings:
            return self.ratings[str(rating)]
        if self.scale == "stars":
            if 1 <= rating <= self.stars_max:
                return (rating - 1) / (self.stars_max - 1)
            return None
        return _THUMBS.get(rating)

    def episode_reward(self, rewards: Sequence[RewardReported]) -> float | None:
        """The last mappable feedback of the episode (None when there is none)."""
        value: float | None = None
        for reward in rewards:
            if reward.origin is RewardOrigin.feedback:
                mapped = self.reward(reward)
                if mapped is not None:
                    value = mapped
        return value
