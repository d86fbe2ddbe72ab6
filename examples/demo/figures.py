"""The trainer's figures in a demo's report: its steps, samples, exclusions and the lag it trained at."""

from __future__ import annotations

from typing import Any

from examples.demo import replaying
from examples.demo.pipeline import StepPoint, TrainingMonitor
from flywheel.stack import EmbeddedStack


def trainer_figures(stack: EmbeddedStack, monitor: TrainingMonitor, *, adapters: bool) -> dict[str, Any]:
    trainer = stack.trainer
    assert trainer is not None
    return {
        # with adapters a point is one adapter's update; a step may update several
        "rl_steps": trainer.step if adapters else len(monitor.points),
        "rl_batches_without_signal": trainer.batches_without_signal,
        "rl_groups_received": len(trainer.intake.consumed),
        "trainer_samples": trainer.status().samples,
        "trainer_skipped": dict(trainer.intake.skipped),
        "trainer_stale_dropped": replaying.stale_counts(trainer),
        "trainer_excluded": trainer.status().excluded,
        # late ratings of sessions the reward service no longer held (FLYWHEEL_FEEDBACK_RETAIN): dead-lettered
        "feedback_unheld": stack.reward.stats.feedback_unheld if stack.reward is not None else 0,
        "lag": lag(monitor.points),
    }


def lag(points: list[StepPoint]) -> dict[str, float]:
    """How many versions behind the trained transitions were: the largest lag any step trained, the mean
    of the steps' mean lags, and the share of steps that trained something 50 or more versions old."""
    maxima = [p.metrics.get("staleness_max", 0.0) for p in points]
    means = [p.metrics.get("staleness_mean", 0.0) for p in points]
    if not points:
        return {"max": 0.0, "mean": 0.0, "steps_with_lag_50": 0.0}
    return {
        "max": max(maxima),
        "mean": round(sum(means) / len(means), 3),
        "steps_with_lag_50": round(sum(1 for m in maxima if m >= 50) / len(maxima), 4),
    }
