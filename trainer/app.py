"""The trainer service: wires a bus, a backend, weight sinks and checkpoints into a :class:`TrainerService`.

:func:`build` is its one constructor and :func:`start_backend` its backend's; the weight sinks are
given. ``flywheel.assembly`` calls them for every entry point (``build_trainer``,
``start_trainer_backend``) and chooses the engine and its sink in one place: the embedded stack's
engine, or, for ``flywheel trainer run`` (``flywheel.alone.serve_trainer``), the one at
``FLYWHEEL_TRAINER_ENGINE_URL`` (``flywheel engine``'s ``/load_weights``, or vLLM's ``/collective_rpc``
with ``FLYWHEEL_TRAINER_ENGINE_KIND=vllm``). It consumes ``flywheel.transitions`` as consumer group
``trainer`` and saves checkpoints under ``<data_dir>/trainer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.bus.base import Bus
from trainer.backends.base import Backend
from trainer.backends.process import ProcessBackend
from trainer.backends.torch_backend import load_backend
from trainer.checkpoints import CheckpointStore
from trainer.config import AlgorithmConfig, ModelOptions
from trainer.groups import Intake
from trainer.loop import LoopConfig
from trainer.metrics import TrainerMetrics, make_tracker
from trainer.rollouts import RolloutPlanner
from trainer.service import TrainerService
from trainer.settings import TrainerSettings
from trainer.weights import WeightSink, WeightSync


def start_backend(
    model_dir: Path,
    algo: AlgorithmConfig,
    *,
    device: str = "cpu",
    torch_threads: int = 0,
    process: bool = True,
    dp: int = 1,
    kind: str = "torch",
    model_options: ModelOptions | None = None,
) -> Backend:
    """The training backend: in a child process (the default, see :mod:`trainer.backends.process`) or
    in this one, over ``dp`` data-parallel ranks (:mod:`trainer.backends.ddp`), or verl's
    (:mod:`trainer.backends.verl_backend`); ``close()`` it at the end. ``model_options``: the training
    dtype and gradient checkpointing (:mod:`trainer.backends.precision`)."""
    if kind == "verl":
        from trainer.backends.verl_backend import VerlBackend

        return VerlBackend(model_dir, algo, gpus=dp, device=device, model_options=model_options)
    common: dict[str, Any] = {
        "device": device,
        "torch_threads": torch_threads,
        "model_options": model_options,
    }
    if dp > 1:
        from trainer.backends.ddp import DataParallelProcessBackend

        return DataParallelProcessBackend(model_dir, algo, world=dp, **common)
    if process:
        return ProcessBackend(model_dir, algo, **common)
    return load_backend(model_dir, algo, **common)


def loop_config(settings: TrainerSettings) -> LoopConfig:
    return LoopConfig(
        mode=settings.trainer_mode,
        objective=settings.trainer_objective,
        batch_groups=settings.trainer_batch_groups,
        max_in_flight=settings.trainer_max_in_flight,
        batch_timeout_s=settings.trainer_batch_timeout_s,
        sync_every=settings.trainer_sync_every,
        checkpoint_every=settings.trainer_checkpoint_every,
        release_every=settings.trainer_release_every,
        success_threshold=settings.trainer_success_threshold,
        model=settings.model,
    )


def build(
    settings: TrainerSettings,
    bus: Bus,
    backend: Backend,
    sinks: Sequence[WeightSink],
    *,
    planner: RolloutPlanner | None = None,
    loop: LoopConfig | None = None,
    metrics: TrainerMetrics | None = None,
) -> TrainerService:
    """The trainer for ``settings``; the caller starts the bus and then ``await service.start()``."""
    root = settings.trainer_root
    intake = Intake(
        group_timeout_s=settings.trainer_group_timeout_s,
        partial=settings.trainer_partial_groups,
        min_partial=settings.trainer_min_partial,
        vocab_size=backend.vocab_size,
    )
    weights = WeightSync(
        bus,
        list(sinks),
        model=settings.model,
        expected_gateways=settings.trainer_expected_gateways,
        drain_timeout_s=settings.trainer_drain_timeout_s,
    )
    return TrainerService(
        bus=bus,
        backend=backend,
        weights=weights,
        store=CheckpointStore(root, keep=settings.trainer_keep_checkpoints),
        intake=intake,
        algo=settings.trainer_algo,
        loop=loop or loop_config(settings),
        metrics=metrics,
        tracker=make_tracker(
            settings.trainer_tracker, logdir=root / "tb", config=settings.trainer_algo.model_dump(mode="json")
        ),
        planner=planner,
        base_model=str(settings.trainer_base_model or ""),
    )
