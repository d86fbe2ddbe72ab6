"""The trainer service: wires a bus, the model, weight sinks and checkpoints into a :class:`TrainerService`.

:func:`build` is its one constructor and :func:`start_model` its model's: the whole model on its backend
(:func:`start_backend`), or with a policy map one LoRA adapter per policy over the frozen base
(:func:`start_policies`). The weight sinks are given per policy (:data:`Sinks`). ``flywheel.assembly``
calls them for every entry point (``build_trainer``, ``start_trainer_model``) and maps the engine's kind
to the sinks in one place: the embedded stack's engine, or, for ``flywheel trainer run``
(``flywheel.alone.serve_trainer``), the one at ``FLYWHEEL_TRAINER_ENGINE_URL`` (``flywheel engine``'s
``/load_weights``, or vLLM's ``/collective_rpc`` with ``FLYWHEEL_TRAINER_ENGINE_KIND=vllm``). It
consumes ``flywheel.transitions`` as consumer group ``trainer`` and saves checkpoints under
``<data_dir>/trainer``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from infra.bus.base import Bus
from infra.policies import PolicyMap
from trainer.backends.base import Backend
from trainer.backends.process import ProcessBackend
from trainer.backends.torch_backend import load_backend
from trainer.checkpoints import CheckpointStore
from trainer.config import AlgorithmConfig
from trainer.groups import Intake
from trainer.loop import LoopConfig
from trainer.metrics import TrainerMetrics, make_tracker
from trainer.policy import Policy
from trainer.rollouts import RolloutPlanner
from trainer.service import TrainerService
from trainer.settings import TrainerSettings
from trainer.weights import WeightSink, WeightSync

if TYPE_CHECKING:
    from trainer.lora import LoraPolicies

# A policy's weight sinks: ``sinks(None)`` the whole model's, ``sinks(name)`` that LoRA adapter's.
Sinks = Callable[[str | None], Sequence[WeightSink]]


def start_backend(
    model_dir: Path,
    algo: AlgorithmConfig,
    *,
    device: str = "cpu",
    torch_threads: int = 0,
    process: bool = True,
    dp: int = 1,
    kind: str = "torch",
) -> Backend:
    """The training backend: in a child process (the default, see :mod:`trainer.backends.process`) or
    in this one, over ``dp`` data-parallel ranks (:mod:`trainer.backends.ddp`), or verl's
    (:mod:`trainer.backends.verl_backend`); ``close()`` it at the end."""
    if kind == "verl":
        from trainer.backends.verl_backend import VerlBackend

        return VerlBackend(model_dir, algo, gpus=dp, device=device)
    if dp > 1:
        from trainer.backends.ddp import DataParallelProcessBackend

        return DataParallelProcessBackend(
            model_dir, algo, world=dp, device=device, torch_threads=torch_threads
        )
    if process:
        return ProcessBackend(model_dir, algo, device=device, torch_threads=torch_threads)
    return load_backend(model_dir, algo, device=device, torch_threads=torch_threads)


def loop_config(settings: TrainerSettings) -> LoopConfig:
    return LoopConfig(
        mode=settings.trainer_mode,
        objective=settings.trainer_objective,
        batch_groups=settings.trainer_batch_groups,
        max_in_flight=settings.trainer_max_in_flight,
        batch_timeout_s=settings.trainer_batch_timeout_s,
        sync_every=settings.trainer_sync_every,
        checkpoint_every=settings.trainer_checkpoint_every,
        success_threshold=settings.trainer_success_threshold,
        model=settings.model,
    )


def start_policies(settings: TrainerSettings, model_dir: Path, *, torch_threads: int = 0) -> LoraPolicies:
    """The base in ``model_dir`` with one LoRA adapter per policy of ``FLYWHEEL_POLICIES``."""
    from trainer.lora import load_policies  # peft: loaded only for a policy map

    return load_policies(
        model_dir,
        PolicyMap.parse(settings.policies).names,
        settings.trainer_algo,
        settings.trainer_lora,
        device=settings.trainer_device,
        torch_threads=torch_threads,
    )


def start_model(settings: TrainerSettings, model_dir: Path, *, torch_threads: int = 0) -> Backend:
    """What the trainer trains, on ``model_dir`` (blocking: it loads the model): with a policy map one LoRA
    adapter per policy over the frozen base, else the whole model on the backend its settings name;
    ``close()`` it at the end."""
    if settings.policies:
        return start_policies(settings, model_dir, torch_threads=torch_threads)
    return start_backend(
        model_dir,
        settings.trainer_algo,
        device=settings.trainer_device,
        torch_threads=torch_threads,
        process=settings.trainer_backend_process,
        dp=settings.trainer_dp,
        kind=settings.trainer_backend,
    )


def build(
    settings: TrainerSettings,
    bus: Bus,
    model: Backend,
    sinks: Sinks,
    *,
    planner: RolloutPlanner | None = None,
    loop: LoopConfig | None = None,
    metrics: TrainerMetrics | None = None,
) -> TrainerService:
    """The trainer for ``settings`` over ``model`` (:func:`start_model`); the caller starts the bus and
    then ``await service.start()``."""
    root = settings.trainer_root
    store = CheckpointStore(root, keep=settings.trainer_keep_checkpoints)
    return TrainerService(
        bus=bus,
        backend=model,
        policies=_policies(settings, bus, model, sinks, store),
        store=store,
        intake=Intake(
            group_timeout_s=settings.trainer_group_timeout_s,
            partial=settings.trainer_partial_groups,
            min_partial=settings.trainer_min_partial,
            vocab_size=model.vocab_size,
        ),
        algo=settings.trainer_algo,
        loop=loop or loop_config(settings),
        metrics=metrics,
        tracker=make_tracker(
            settings.trainer_tracker, logdir=root / "tb", config=settings.trainer_algo.model_dump(mode="json")
        ),
        planner=planner,
        base_model=str(settings.trainer_base_model or ""),
        lora=settings.trainer_lora if settings.policies else None,
    )


def _policies(
    settings: TrainerSettings, bus: Bus, model: Backend, sinks: Sinks, store: CheckpointStore
) -> list[Policy]:
    """The whole model as the one policy (its checkpoints the trainer's own), or with a policy map each
    LoRA adapter of ``model`` (:func:`start_policies`), its checkpoints under ``policies/<name>``."""

    def sync(adapter: str | None) -> WeightSync:
        return WeightSync(
            bus,
            list(sinks(adapter)),
            model=settings.model,
            adapter=adapter,
            expected_gateways=settings.trainer_expected_gateways,
            drain_timeout_s=settings.trainer_drain_timeout_s,
        )

    if not settings.policies:
        return [Policy(settings.model, model, sync(None), store)]
    adapters = cast("LoraPolicies", model).adapters
    return [
        Policy(name, adapter, sync(name), CheckpointStore(store.root / "policies" / name, keep=store.keep))
        for name, adapter in adapters.items()
    ]
