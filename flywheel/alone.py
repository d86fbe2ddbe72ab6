"""One part as a process of its own: ``flywheel gateway|worker|reward|trainer|recorder|otel-export``.

Each function here hands ``infra.service.serve`` the part as :mod:`flywheel.assembly` builds it
(the same builder the embedded stack and ``agl-server`` use), with what running it alone adds: the
topics it needs, its HTTP app, its Prometheus port, the trainer's step loop. A part that cannot start
raises ``infra.service.ServiceStartError`` (one line for the CLI).

    serve_gateway(settings, upstreams)   the gateway behind uvicorn (its own HTTP protocol: header limits);
                                         on the in-process bus with FLYWHEEL_OTLP_ENDPOINT set, the
                                         OpenTelemetry export too (a bus consumer: the bus is this
                                         process's, so its consumer lives here, and hands the events'
                                         bytes to a child process that builds and sends the spans:
                                         infra.otel.forward)
    serve_worker(settings)               a rollout worker (drains its episodes on SIGTERM)
    serve_reward(settings)               the reward service
    serve_recorder(settings)             every topic → the event log, with the event log's admin API
    serve_otel_exporter(settings)        recorded episodes → OTLP GenAI spans
    serve_trainer(settings, max_steps)   the trainer on its backend, loading weights into the engine
                                         its settings name (``assembly.trainer_engine``)
    serve_gates(settings, config)        the gate keeper and the canary's judge (``flywheel/gates.py``)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flywheel import assembly
from infra import service
from infra.logging import get_logger

if TYPE_CHECKING:
    from pathlib import Path

    from gateway.service import Gateway
    from gateway.settings import GatewaySettings
    from gateway.upstream.client import Upstream
    from infra.bus.base import Bus
    from infra.eventlog.settings import EventLogSettings
    from infra.otel.exporter import OtelExporter
    from infra.otel.forward import ExportForwarder
    from infra.otel.settings import OtelSettings
    from infra.settings import FlywheelSettings
    from reward_service.settings import RewardSettings
    from rollout_worker.settings import WorkerSettings
    from trainer.backends.base import Backend
    from trainer.settings import TrainerSettings
    from trainer.weights import WeightSink

log = get_logger(__name__)


@dataclass
class GatewayProcess:
    """What ``flywheel gateway`` runs on its bus: the gateway, and the OpenTelemetry exporter consuming
    its events when there is one.

    The exporter starts first (subscribed before the gateway answers a call) and stops last (it reads
    what the gateway published, then flushes its queue to the collector)."""

    gateway: Gateway
    exporter: ExportForwarder | OtelExporter | None = None

    async def start(self) -> None:
        if self.exporter is not None:
            await self.exporter.start()
        try:
            await self.gateway.start()
        except BaseException:
            if self.exporter is not None:
                await self.exporter.stop()
            raise

    async def stop(self) -> None:
        try:
            await self.gateway.stop()
        finally:
            if self.exporter is not None:
                await self.exporter.stop()


async def serve_gateway(
    settings: GatewaySettings,
    upstreams: Sequence[Upstream],
    *,
    on_started: Callable[[str], None] | None = None,
    otel: OtelSettings | None = None,
) -> None:
    """The gateway alone, against ``upstreams`` and the configured bus, until SIGINT/SIGTERM.

    On the in-process bus with an OTLP endpoint (``otel``, else ``FLYWHEEL_OTLP_*`` from the environment)
    the export's consumer runs here too, reading the gateway's events after it has answered and handing
    their bytes to a child process that builds and sends the spans (``infra.otel.forward``); on Kafka it is a
    process of its own (``flywheel otel-export``: one per stack, it must see every episode and score)."""
    from gateway.app import app_for
    from gateway.limits import GatewayHttpProtocol
    from infra.otel.settings import OtelSettings
    from schemas import CONTROL, DEADLETTER, EPISODES

    if otel is None:
        from pydantic import ValidationError

        try:
            otel = OtelSettings()
        except ValidationError as exc:  # a bad FLYWHEEL_OTLP_* value: one line, not a traceback
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            raise service.ServiceStartError(
                f"gateway: bad OpenTelemetry setting {where}: {first['msg']}"
            ) from exc
    export = bool(otel.otlp_endpoint) and settings.bus == "memory"
    if otel.otlp_endpoint and not export:
        log.info("otel_export.not_in_gateway", bus=settings.bus, run="flywheel otel-export")

    def build(bus: Bus) -> GatewayProcess:
        try:
            gateway = assembly.build_gateway(settings, bus, upstreams)
        except ValueError as exc:  # a configuration it cannot serve (releases without slots): one line
            raise service.ServiceStartError(f"gateway: {exc}") from exc
        if not export:
            return GatewayProcess(gateway)
        # the export work (spans, the SDK, OTLP) in a child process: here only the events' bytes
        return GatewayProcess(gateway, assembly.build_otel_forwarder(otel, bus, gateway.metrics.registry))

    def started(_: GatewayProcess, url: str) -> None:
        if on_started is not None:
            on_started(url)

    await service.serve(
        settings,
        build,
        name="gateway",
        topics=[EPISODES, CONTROL, DEADLETTER],
        http=service.Http(
            lambda process: app_for(process.gateway, lifespan=False),
            host=settings.gateway_host,
            port=settings.gateway_port,
            protocol=GatewayHttpProtocol,  # header limits, OpenAI-format protocol errors (gateway.limits)
        ),
        on_started=started,
    )


async def serve_worker(settings: WorkerSettings) -> None:
    """One rollout worker until SIGINT/SIGTERM (it drains its episodes before it stops)."""
    await service.serve(
        settings,
        lambda bus: assembly.build_worker(settings, bus),
        name="worker",
        metrics_port=settings.metrics_port,
    )


async def serve_reward(settings: RewardSettings) -> None:
    """The reward service until SIGINT/SIGTERM."""
    await service.serve(
        settings,
        lambda bus: assembly.build_reward(settings, bus),
        name="reward",
        metrics_port=settings.metrics_port,
    )


async def serve_recorder(settings: EventLogSettings, stop: asyncio.Event | None = None) -> None:
    """The recorder until ``stop`` is set (or a signal arrives); its admin API serves event-log reads
    (the chdb directory this process holds) on ``recorder_port`` unless that is 0."""
    http = None
    if settings.recorder_port:
        token = settings.admin_token.get_secret_value()
        host, allowed = settings.recorder_host, settings.allowed_hosts
        http = service.Http(
            lambda process: process.api(token, bound_host=host, allowed_hosts=allowed),
            host=host,
            port=settings.recorder_port,
        )
    await service.serve(
        settings, lambda bus: assembly.build_recorder(settings, bus), name="recorder", http=http, stop=stop
    )


async def serve_otel_exporter(settings: OtelSettings, stop: asyncio.Event | None = None) -> None:
    """The OpenTelemetry exporter until ``stop`` is set (or a signal); it needs FLYWHEEL_OTLP_ENDPOINT."""

    def build(bus: Bus) -> OtelExporter:
        exporter = assembly.build_otel_exporter(settings, bus)
        if exporter is None:
            raise service.ServiceStartError(
                "otel-export: set FLYWHEEL_OTLP_ENDPOINT (the OTLP/HTTP collector)"
            )
        return exporter

    await service.serve(settings, build, name="otel-export", stop=stop)


async def serve_gates(settings: FlywheelSettings, config: Path, stop: asyncio.Event | None = None) -> None:
    """The gate keeper until ``stop`` is set (or a signal): every release candidate evaluated through the
    rollout workers, canaries judged; a configuration it cannot use is one line."""
    from flywheel.gates import GateConfig, GateError, GateKeeper

    try:
        gates = GateConfig.load(config)
        gates.suite()
    except (GateError, ValueError) as exc:
        raise service.ServiceStartError(f"gates: {exc}") from exc
    await service.serve(
        settings, lambda bus: GateKeeper(bus, gates, model=settings.model), name="gates", stop=stop
    )


async def serve_trainer(settings: TrainerSettings, max_steps: int | None = None) -> None:
    """The trainer against the configured bus until a signal (or ``max_steps``): its backend on
    ``trainer_base_model``, its weights loaded into the engine its settings name (none: trained only)."""
    if settings.trainer_base_model is None:
        raise SystemExit("FLYWHEEL_TRAINER_BASE_MODEL (or --model) must name a Hugging Face model directory")
    choice = assembly.trainer_engine(settings)
    engine = assembly.RunningEngine(choice) if choice is not None else None
    if settings.policies:  # a LoRA adapter per policy over the frozen base (trainer/policy_service.py)
        await _serve_policies(settings, engine, max_steps)
        return
    from trainer.backends.ddp import start_torchrun_rank, torchrun_world

    backend: Backend
    if torchrun_world() is not None:  # torchrun: rank 0 runs the service, the others follow it
        rank0 = start_torchrun_rank(
            settings.trainer_base_model,
            settings.trainer_algo,
            device=settings.trainer_device,
            torch_threads=settings.trainer_torch_threads,
            model_options=settings.trainer_model_options,
        )
        if rank0 is None:
            return
        backend = rank0
    else:
        backend = assembly.start_trainer_backend(
            settings, settings.trainer_base_model, torch_threads=settings.trainer_torch_threads
        )
    sink = engine.weight_sink() if engine is not None else None
    sinks: list[WeightSink] = [sink] if sink is not None else []
    try:
        await service.serve(
            settings,
            lambda bus: assembly.build_trainer(settings, bus, backend, sinks),
            name="trainer",
            metrics_port=settings.trainer_metrics_port,
            registry=lambda trainer: trainer.metrics.registry,
            until=lambda trainer: trainer.run(max_steps),
            interrupt=lambda trainer: trainer.request_stop(),  # the step in progress finishes first
            on_started=lambda _, __: log.info(
                "trainer_started",
                version=backend.version,
                mode=settings.trainer_mode,
                objective=settings.trainer_objective,
                root=str(settings.trainer_root),
            ),
        )
    finally:
        backend.close()


async def _serve_policies(
    settings: TrainerSettings, engine: assembly.RunningEngine | None, max_steps: int | None
) -> None:
    from trainer.policy_service import start_policies
    from trainer.weights import WeightLoadError

    try:
        sinks: Callable[[str], list[WeightSink]] = (
            engine.adapter_sinks() if engine is not None else lambda _: []
        )
    except ValueError as exc:  # an engine adapters cannot be loaded into
        raise service.ServiceStartError(f"trainer: {exc}") from exc
    policies = start_policies(settings)
    try:
        await service.serve(
            settings,
            lambda bus: assembly.build_policy_trainer(settings, bus, policies, sinks),
            name="trainer",
            metrics_port=settings.trainer_metrics_port,
            registry=lambda trainer: trainer.metrics.registry,
            until=lambda trainer: trainer.run(max_steps),
            interrupt=lambda trainer: trainer.request_stop(),
        )
    except WeightLoadError as exc:  # the engine refused an adapter at start (vLLM without --enable-lora)
        raise service.ServiceStartError(f"trainer: {exc}") from exc
