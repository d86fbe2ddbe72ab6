"""A replay's validation checkpoints: the served weights, evaluated on validation tasks, the best chosen
and served again (``flywheel demo --source replay``, ``examples/demo/replaying.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file

from trainer.weights import WeightUpdate

if TYPE_CHECKING:
    from examples.demo.pipeline import EvalResult
    from trainer.service import TrainerService


@dataclass(frozen=True)
class Checkpoint:
    """One validation evaluation during the replay, and the weights it evaluated."""

    step: int
    version: int
    groups_replayed: int
    success: float
    calls_per_episode: float
    seconds: float
    weights: Path  # what the engine loads: the warm start's directory, or the trainer's export

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "version": self.version,
            "groups_replayed": self.groups_replayed,
            "success": round(self.success, 4),
            "calls_per_episode": round(self.calls_per_episode, 4),
            "seconds": round(self.seconds, 1),
        }


def choose(points: list[Checkpoint]) -> Checkpoint:
    """The checkpoint with the best validation success; the later one on a tie (more data seen)."""
    return max(reversed(points), key=lambda p: p.success)


async def served(trainer: TrainerService, timeout_s: float = 120.0) -> None:
    """Wait until the engine serves the trainer's newest version (the async update runs after a step)."""
    # The trainer exposes no "version served" event to the demo: poll (cheap) under a deadline.
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if trainer.weights.serving_version >= trainer.backend.version:
            return
        await asyncio.sleep(0.1)


async def serve(trainer: TrainerService, weights: Path) -> int:
    """Serve ``weights`` as the next version through the weight-update protocol; returns the version."""

    def read() -> dict[str, torch.Tensor]:  # a model directory (the warm start) or the trainer's export
        return load_file(str(weights / "model.safetensors" if weights.is_dir() else weights))

    state = await asyncio.to_thread(read)
    if "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    version = trainer.weights.serving_version + 1
    result = await trainer.weights.update(WeightUpdate(version, lambda: state, weights))
    if not result.activated:
        raise RuntimeError(f"could not serve the chosen replay checkpoint {weights} (version {version})")
    return version


@dataclass
class Validation:
    """The replay's validation checkpoints: the served weights (exported past the warm start), evaluated
    on the validation tasks."""

    trainer: TrainerService
    validate: Callable[[], Awaitable[EvalResult]]
    warm_weights: Path
    work_dir: Path
    say: Callable[[str], None]
    seed: int
    points: list[Checkpoint] = field(default_factory=list)

    async def take(self, step: int, groups_replayed: int) -> None:
        trainer = self.trainer
        await served(trainer)
        version = trainer.backend.version
        weights = self.warm_weights
        if version > 0:
            weights = await asyncio.to_thread(
                trainer.backend.export_weights, self.work_dir / f"v{version:06d}"
            )
        result = await self.validate()
        self.points.append(
            Checkpoint(
                step,
                version,
                groups_replayed,
                result.success,
                result.calls_per_episode,
                result.seconds,
                weights,
            )
        )
        self.say(
            f"[seed {self.seed}] validation at step {step} (version {version}, {groups_replayed} groups): "
            f"success {100 * result.success:.1f}%, {result.calls_per_episode:.2f} calls"
        )
