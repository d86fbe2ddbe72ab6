"""Step metrics: one dict per step, fanned out to the log, Prometheus, and an optional tracker.

Trackers are null objects when disabled (nanochat's ``DummyWandb``): the loop always calls
``tracker.log(step, metrics)`` and never checks whether one is configured.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from infra.logging import get_logger

log = get_logger(__name__)


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class NullTracker:
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        return None

    def close(self) -> None:
        return None


class TensorBoardTracker:
    """Needs the ``tensorboard`` package (not a dependency); :func:`make_tracker` falls back to null."""

    def __init__(self, logdir: Path) -> None:
        # here, not at the top: an optional package, imported only when this tracker is chosen
        from torch.utils.tensorboard import SummaryWriter

        self._writer: Any = SummaryWriter(log_dir=str(logdir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)

    def close(self) -> None:
        self._writer.close()


class WandbTracker:
    """Needs the ``wandb`` package (not a dependency); :func:`make_tracker` falls back to null."""

    def __init__(self, project: str, config: Mapping[str, Any]) -> None:
        import wandb  # here, not at the top: an optional package, imported only when chosen

        self._run: Any = wandb.init(project=project, config=dict(config))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def make_tracker(
    kind: str, *, logdir: Path, project: str = "flywheel", config: Mapping[str, Any] = {}
) -> Tracker:
    """``none`` | ``tensorboard`` | ``wandb``; a tracker whose package is missing is logged and nulled."""
    try:
        if kind == "tensorboard":
            return TensorBoardTracker(logdir)
        if kind == "wandb":
            return WandbTracker(project, config)
    except ImportError as exc:
        log.warning("tracker_unavailable", tracker=kind, error=str(exc))
    return NullTracker()


class TrainerMetrics:
    """Prometheus series for the trainer, in their own registry (the app exposes it)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}
        self.steps = Counter("flywheel_trainer_steps", "training steps taken", registry=self.registry)
        self.skipped = Counter(
            "flywheel_trainer_skipped_events",
            "episodes skipped, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.groups_dropped = Counter(
            "flywheel_trainer_groups_dropped", "groups dropped, by reason", ["reason"], registry=self.registry
        )
        self.weight_updates = Counter(
            "flywheel_trainer_weight_updates",
            "weight updates, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.version = Gauge(
            "flywheel_trainer_version", "weight version the trainer holds", registry=self.registry
        )
        self.serving_version = Gauge(
            "flywheel_trainer_serving_version", "last activated weight version", registry=self.registry
        )
        self.paused = Gauge(
            "flywheel_trainer_paused", "1 while paused by an operator", registry=self.registry
        )

    def observe_step(self, metrics: Mapping[str, float]) -> None:
        self.steps.inc()
        for name, value in metrics.items():
            gauge = self._gauges.get(name)
            if gauge is None:
                safe = "".join(c if c.isalnum() else "_" for c in name)
                gauge = Gauge(f"flywheel_trainer_step_{safe}", f"last step's {name}", registry=self.registry)
                self._gauges[name] = gauge
            gauge.set(value)
