"""The trainer service: wires a bus, a backend, weight sinks and checkpoints into a :class:`TrainerService`.

Run it alone with ``flywheel trainer run`` (or ``python -m trainer.app``): it consumes
``flywheel.transitions`` as consumer group ``trainer``, trains the policy in ``FLYWHEEL_TRAINER_BASE_MODEL``
with the torch backend, saves checkpoints under ``<data_dir>/trainer``, and loads each new version into
the engine at ``FLYWHEEL_TRAINER_ENGINE_URL`` (``flywheel engine``'s ``/load_weights``, or vLLM's
``/collective_rpc`` with ``FLYWHEEL_TRAINER_ENGINE_KIND=vllm``). The embedded stack builds the same
service with :func:`build` (through ``infra.application.assembly.build_trainer``, with the weight sink of the engine
``infra.application.assembly`` chose: an :class:`~trainer.weights.InProcessSink` around the embedded one); alone,
``infra.service.serve`` runs it (signals, metrics, the bus, a graceful stop after the step in progress).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from infra import service
from infra.bus.base import Bus
from infra.logging import configure_logging, get_logger
from trainer.backends.base import Backend
from trainer.backends.process import ProcessBackend
from trainer.backends.torch_backend import load_backend
from trainer.checkpoints import CheckpointStore
from trainer.config import AlgorithmConfig
from trainer.groups import Intake
from trainer.metrics import TrainerMetrics, make_tracker
from trainer.rollouts import RolloutPlanner
from trainer.service import LoopConfig, TrainerService
from trainer.settings import TrainerSettings
from trainer.vllm_sink import VllmSink
from trainer.weights import HttpSink, WeightSink, WeightSync

log = get_logger(__name__)


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


def engine_sink(kind: Literal["flywheel", "vllm"], url: str, *, token: str | None = None) -> WeightSink:
    """The sink that loads weights into an engine behind HTTP: ``flywheel`` (``flywheel engine``'s
    ``/load_weights``) or ``vllm``. The one place an engine's kind picks its sink: ``flywheel trainer``
    (its settings) and the embedded stack (the engine it started) both ask here."""
    if kind == "vllm":
        return VllmSink(url, token=token)
    if kind == "flywheel":
        return HttpSink(url, token=token)
    raise ValueError(f"an engine is flywheel or vllm, not {kind!r}")


def sinks_from_settings(settings: TrainerSettings) -> list[WeightSink]:
    if not settings.trainer_engine_url:
        return []
    token = settings.trainer_engine_token.get_secret_value() if settings.trainer_engine_token else None
    return [engine_sink(settings.trainer_engine_kind, settings.trainer_engine_url, token=token)]


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


async def serve(settings: TrainerSettings, max_steps: int | None = None) -> None:
    """Run the trainer against the configured bus until a signal (or ``max_steps``)."""
    if settings.trainer_base_model is None:
        raise SystemExit("FLYWHEEL_TRAINER_BASE_MODEL (or --model) must name a Hugging Face model directory")
    if settings.policies:  # a LoRA adapter per policy over the frozen base (trainer/policy_service.py)
        await _serve_policies(settings, max_steps)
        return
    from trainer.backends.ddp import start_torchrun_rank, torchrun_world

    backend: Backend
    if torchrun_world() is not None:  # torchrun: rank 0 runs the service, the others follow it
        rank0 = start_torchrun_rank(
            settings.trainer_base_model,
            settings.trainer_algo,
            device=settings.trainer_device,
            torch_threads=settings.trainer_torch_threads,
        )
        if rank0 is None:
            return
        backend = rank0
    else:
        backend = start_backend(
            settings.trainer_base_model,
            settings.trainer_algo,
            device=settings.trainer_device,
            torch_threads=settings.trainer_torch_threads,
            process=settings.trainer_backend_process,
            dp=settings.trainer_dp,
            kind=settings.trainer_backend,
        )
    try:
        await _serve(settings, backend, max_steps)
    finally:
        backend.close()


async def _serve(settings: TrainerSettings, backend: Backend, max_steps: int | None) -> None:
    def started(trainer: TrainerService, _: str) -> None:
        log.info(
            "trainer_started",
            version=backend.version,
            mode=settings.trainer_mode,
            objective=settings.trainer_objective,
            root=str(settings.trainer_root),
        )

    await service.serve(
        settings,
        lambda bus: build(settings, bus, backend, sinks_from_settings(settings)),
        name="trainer",
        metrics_port=settings.trainer_metrics_port,
        registry=lambda trainer: trainer.metrics.registry,
        until=lambda trainer: trainer.run(max_steps),
        interrupt=lambda trainer: trainer.request_stop(),  # the step in progress finishes first
        on_started=started,
    )


async def _serve_policies(settings: TrainerSettings, max_steps: int | None) -> None:
    from trainer.policy_service import adapter_sinks, build_policy_trainer, start_policies

    policies = start_policies(settings)
    token = settings.trainer_engine_token.get_secret_value() if settings.trainer_engine_token else None
    url = settings.trainer_engine_url
    sinks = adapter_sinks(settings.trainer_engine_kind if url else "none", url, token=token)
    await service.serve(
        settings,
        lambda bus: build_policy_trainer(settings, bus, policies, sinks, loop_config(settings)),
        name="trainer",
        metrics_port=settings.trainer_metrics_port,
        registry=lambda trainer: trainer.metrics.registry,
        until=lambda trainer: trainer.run(max_steps),
        interrupt=lambda trainer: trainer.request_stop(),
    )


def main() -> None:
    settings = TrainerSettings()
    configure_logging(settings.log_level, settings.log_json)
    service.run(serve(settings))


if __name__ == "__main__":
    main()
