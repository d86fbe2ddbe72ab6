"""The embedded stack: every Flywheel service in one process, wired through the in-process bus (or Kafka).

    stack = EmbeddedStack(StackSettings(data_dir=...), model_dir=path)
    await stack.start()          # bus, event log, engine, gateway (loopback HTTP), worker, reward, trainer
    stack.gateway_url            # agents reach the gateway here: {gateway_url}/episodes/{id}/v1
    stack.start_training()       # the trainer's loop as a background task (optional)
    await stack.stop()

Two seams put other parts under the same wiring (tests, benchmarks): ``upstream=`` serves from an
upstream the caller built (a fake model server, an engine app of its own, behind
``make_upstream(..., transport=httpx.ASGITransport(app=...))``) instead of starting the engine, and
``bus_factory=`` runs the stack on a broker, each part on a connection of its own as separate processes
would be (on Kafka: its own consumer-group members). ``add_worker`` starts more workers; ``env()`` is
what a ``flywheel`` process needs to join the stack; releases' parts are in ``releases_embedded.py``.
This is the one place (with ``flywheel/cli``) that imports services; they never import each other and
talk only through the bus, exactly as in the distributed runtime:

    worker ──RolloutRequested── flywheel.tasks ◄── trainer (its RolloutPlanner) / ``submit``
    agent ──HTTP──► gateway ──ASGI──► embedded engine            (no network hop to the engine)
                            └─HTTP──► ``flywheel engine`` child  (``engine_process=True``)
    gateway ──LLMCallRecorded──► flywheel.episodes ◄── worker (EpisodeStarted/Finished)
    reward service: flywheel.episodes → EpisodeScored → flywheel.transitions → trainer
    trainer ⇄ gateway: WeightUpdateRequested / InferenceDrained / WeightsActivated on flywheel.control,
                       weights loaded into the engine in-process (``InProcessSink``), or into the
                       child through ``POST /load_weights`` with a checkpoint path (``HttpSink``)
    recorder: every topic → chdb (``<data_dir>/chdb``), readable at ``{gateway_url}/admin/eventlog/...``

The gateway is served by uvicorn on a loopback port because agents (callables, subprocesses) speak
real HTTP through the ``openai`` client; the engine sits behind an ``httpx.ASGITransport``. Exceptions:
``StackError`` when a part cannot start (the parts started so far are stopped again).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from flywheel.releases_embedded import start_release_parts, start_release_slots
from flywheel.stack_settings import StackSettings as StackSettings  # re-exported
from infra.bus.base import Bus
from infra.logging import get_logger
from schemas import TOPICS, AgentRef, Task

if TYPE_CHECKING:
    from fastapi import FastAPI

    from flywheel.assembly import RunningEngine
    from flywheel.gates import GateKeeper
    from gateway.server import GatewayServer
    from gateway.upstream.client import Upstream
    from infra.engine.core import InferenceEngine
    from infra.engine.process import EngineProcess
    from infra.eventlog.recorder import Recorder
    from infra.eventlog.store import ChdbStore, ServerStore
    from reward_service.service import RewardService
    from rollout_worker.service import RolloutWorker
    from trainer.rollouts import RolloutPlanner
    from trainer.service import TrainerService

log = get_logger(__name__)

BusFactory = Callable[[], Bus]  # a new, unstarted connection to the broker the stack runs on


class StackError(RuntimeError):
    pass


class EmbeddedStack:
    """All services in this process. ``model_dir`` is a Hugging Face model directory (the policy)."""

    def __init__(
        self,
        settings: StackSettings,
        *,
        model_dir: Path | None = None,
        tasks: Iterator[Task] | None = None,
        agent: AgentRef | None = None,
        group_size: int = 8,
        deadline_s: float = 120.0,
        vllm_url: str | None = None,
        curriculum_revisit: float | None = None,
        upstream: Upstream | None = None,
        bus_factory: BusFactory | None = None,
    ) -> None:
        """``vllm_url``: serve from that vLLM server (dev mode) instead of starting the embedded engine;
        the trainer then loads each version into it with :class:`trainer.vllm_sink.VllmSink` (with a policy
        map, each adapter's with :class:`trainer.vllm_sink.VllmAdapterSink`: the server needs
        ``--enable-lora``).
        ``curriculum_revisit``: the trainer's requests go through a :class:`trainer.curriculum.SignalCurriculum`
        (revisit probability), seeded with the event log's per-task history.
        ``upstream``: serve from it instead (no engine, no ``model_dir`` needed; nothing loads weights into
        it, so no trainer either); the stack closes its client when it stops.
        ``bus_factory``: every part gets a connection of its own from it (the stack's own, for callers, is
        :attr:`bus`); ``settings.bus`` must name that broker (``"kafka"``: :meth:`env` and the reward
        service's journal read it). None: one in-process ``MemoryBus`` for all."""
        if (tasks is None) != (agent is None):
            raise ValueError(
                "give both tasks and agent (the trainer then requests its own rollouts) or neither"
            )
        if upstream is not None and vllm_url is not None:
            raise ValueError("give an upstream or a vllm_url, not both")
        if upstream is not None and settings.run_trainer:
            raise ValueError(
                "the trainer cannot load weights into an upstream of the caller's: run_trainer=False"
            )
        if upstream is None and model_dir is None:
            raise ValueError("model_dir is needed: the engine serves it and the trainer trains it")
        if bus_factory is not None and settings.bus == "memory":
            raise ValueError("a bus_factory connects to a broker: set settings.bus to it ('kafka')")
        if settings.make_episode_key and not settings.episode_key.get_secret_value():
            # one process, one key: its worker signs episode URLs and its gateway admits them on the
            # ticket alone, without consuming every recorded call (infra/tickets.py)
            settings = settings.replace(episode_key=SecretStr(secrets.token_urlsafe(32)))
        self.settings = settings
        self.model_dir = model_dir
        self._tasks = tasks
        self._agent = agent
        self._group_size = group_size
        self._deadline_s = deadline_s
        self._curriculum_revisit = curriculum_revisit
        self.vllm_url = vllm_url.rstrip("/").removesuffix("/v1") if vllm_url else None
        self.upstream = upstream
        self._bus_factory = bus_factory
        self.bus: Bus | None = None  # the stack's own connection (all parts' on the in-process bus)
        self.buses: list[Bus] = []  # every connection the stack opened, its own first
        self.store: ChdbStore | ServerStore | None = None
        self.recorder: Recorder | None = None
        self.engine: InferenceEngine | None = None
        self.engine_process: EngineProcess | None = None
        self.running_engine: RunningEngine | None = None  # the engine chosen by flywheel.assembly
        self.gateway_app: FastAPI | None = None
        self.worker: RolloutWorker | None = None  # the first worker
        self.workers: list[RolloutWorker] = []  # with those of add_worker
        self.reward: RewardService | None = None
        self.trainer: TrainerService | None = None
        self.gates: GateKeeper | None = None
        self._server: GatewayServer | None = None
        self._training: asyncio.Task[None] | None = None
        self._stoppers: list[tuple[str, Callable[[], Awaitable[object]]]] = []
        self.gateway_url = ""

    # ------------------------------------------------------------------ lifecycle
    async def start(self, *, ready: bool = True) -> None:
        """Start every part; the gateway's ``/readyz`` answers 503 until all are up, and with
        ``ready=False`` until :meth:`ready` (for a caller that adds routes of its own first)."""
        try:
            await self._start()
            if ready:
                self.ready()
        except Exception as exc:
            await self.stop()
            raise StackError(f"the embedded stack could not start: {type(exc).__name__}: {exc}") from exc

    def ready(self) -> None:
        """Let the gateway's ``/readyz`` answer 200 (see :meth:`start`)."""
        if self.gateway_app is not None:
            self.gateway_app.state.gateway.starting.discard("stack")

    async def _start(self) -> None:
        s = self.settings
        s.data_dir.mkdir(parents=True, exist_ok=True)
        await self._start_bus()
        if s.record_events:
            await self._start_recorder()
        if s.otel.otlp_endpoint:  # recorded episodes as OTLP GenAI spans: a bus consumer like the recorder
            await self._start_otel_exporter()
        if self.upstream is None:  # the engine the stack serves from (none to start for vLLM)
            await self._start_engine()
        await self._start_gateway()
        if s.run_worker:
            await self.add_worker()
        await self._start_reward()
        if s.run_trainer:
            await self._start_trainer()
        self.gates = await start_release_parts(self)  # with release_gates: every candidate evaluated
        log.info(
            "stack_started", gateway=self.gateway_url, data_dir=str(s.data_dir), model=str(self.model_dir)
        )

    async def stop(self) -> None:
        """Stop everything that started, newest first; safe to call twice."""
        if self._training is not None:
            await self.stop_training()
        while self._stoppers:
            name, stop = self._stoppers.pop()
            try:
                await stop()
            except Exception as exc:  # keep stopping the rest
                log.warning("stack_stop_failed", part=name, error=f"{type(exc).__name__}: {exc}")

    async def __aenter__(self) -> EmbeddedStack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ parts
    async def _start_bus(self) -> None:
        from infra.bus.factory import park_path
        from infra.bus.memory import MemoryBus

        bus = (
            self._bus_factory()
            if self._bus_factory is not None
            else MemoryBus(
                prefix=self.settings.topic_prefix,
                publish_timeout_s=self.settings.publish_timeout_s,
                park_path=park_path(self.settings),
            )
        )
        await bus.start()
        self._stoppers.append(("bus", bus.stop))
        self.bus = bus
        self.buses.append(bus)
        await bus.ensure_topics(list(TOPICS))

    async def _connect(self, part: str) -> Bus:
        """``part``'s bus: the stack's, or its own from the ``bus_factory``, stopped after the part."""
        if self._bus_factory is None:
            return self._bus
        bus = self._bus_factory()
        await bus.start()
        self._stoppers.append((f"{part}-bus", bus.stop))
        self.buses.append(bus)
        return bus

    async def _start_recorder(self) -> None:
        from flywheel.assembly import build_recorder

        process = await build_recorder(self.settings.eventlog, await self._connect("recorder"))
        try:
            await process.start()
        except BaseException:
            await asyncio.to_thread(process.store.close)
            raise
        self._stoppers.append(("recorder", process.stop))  # writes the last batches, closes the store
        self.store = process.store  # type: ignore[assignment]
        self.recorder = process.recorder

    async def _start_otel_exporter(self) -> None:
        from flywheel.assembly import build_otel_forwarder

        # this process is the stack's: the spans are built and sent by a child process (infra.otel.forward)
        exporter = build_otel_forwarder(self.settings.otel, await self._connect("otel"))
        if exporter is None:
            raise StackError("the OpenTelemetry exporter needs FLYWHEEL_OTLP_ENDPOINT")
        await exporter.start()
        self._stoppers.append(("otel-export", exporter.stop))

    async def _start_engine(self) -> None:
        from flywheel.assembly import choose_engine, start_engine

        s = self.settings
        running = await start_engine(
            choose_engine(model_dir=self._model_dir, vllm_url=self.vllm_url, process=s.engine_process),
            model_name=s.model,
            max_num_seqs=s.engine_max_num_seqs,
            threads=s.engine_threads or None,
            log_path=s.data_dir / "engine.log",
        )
        self._stoppers.append(("engine", running.stop))
        self.running_engine = running
        self.engine = running.engine
        self.engine_process = running.process

    async def _start_gateway(self) -> None:
        from flywheel.assembly import build_gateway, with_tokenizer
        from gateway.app import app_for
        from gateway.server import GatewayServer

        s = self.settings
        upstream = self.upstream or self._running.upstream(s.gateway)
        gateway = await asyncio.to_thread(with_tokenizer, s.gateway, self.model_dir)
        gateway, slots = await start_release_slots(self, gateway)  # releases=gated: the served version's
        app = app_for(build_gateway(gateway, await self._connect("gateway"), [upstream], release_slots=slots))
        app.state.gateway.starting.add("stack")  # /readyz waits for the worker, reward service, trainer
        if self.store is not None:
            from infra.eventlog.api import create_eventlog_router

            app.include_router(create_eventlog_router(self.store, s.admin_token.get_secret_value()))
        self._stoppers.append(("upstream", upstream.client.aclose))  # closed after the server stopped
        server = GatewayServer(app, host=s.gateway.gateway_host, port=s.gateway.gateway_port)
        self.gateway_url = await server.start()
        self._stoppers.append(("gateway", server.stop))
        self._server = server
        self.gateway_app = app

    async def add_worker(self, worker_id: str | None = None, **overrides: Any) -> RolloutWorker:
        """Start one more rollout worker (the first is started with the stack unless ``run_worker`` is
        off). It has the stack's settings but ``worker_id`` and ``overrides``; with a ``bus_factory``, a
        connection of its own, so it joins the consumer group as a worker process would."""
        from flywheel.assembly import build_worker

        if not self.gateway_url:
            raise StackError("the stack is not started")
        update: dict[str, Any] = {"gateway_url": self.gateway_url, **overrides}
        if worker_id is not None:
            update["worker_id"] = worker_id
        settings = self.settings.worker.model_copy(update=update)
        worker = build_worker(settings, await self._connect(f"worker-{settings.worker_id}"))
        await worker.start()
        self._stoppers.append((f"worker-{settings.worker_id}", worker.stop))
        self.workers.append(worker)
        self.worker = self.worker or worker
        return worker

    async def _start_reward(self) -> None:
        from flywheel.assembly import build_reward

        settings = self.settings.reward.model_copy(update={"gateway_url": self.gateway_url})
        reward = build_reward(settings, await self._connect("reward"))
        await reward.start()
        self._stoppers.append(("reward", reward.stop))
        self.reward = reward

    async def _start_trainer(self) -> None:
        from flywheel.assembly import build_trainer, start_trainer_backend

        s = self.settings
        if s.policies:  # a LoRA adapter per policy over the frozen base (trainer/policy_service.py)
            await self._start_policy_trainer()
            return
        sink = self._running.weight_sink()
        if sink is None:
            raise StackError("the trainer cannot load weights into this engine")
        backend = await asyncio.to_thread(
            start_trainer_backend, s.trainer, self._model_dir, torch_threads=s.engine_threads
        )
        self._stoppers.append(("trainer-backend", lambda: asyncio.to_thread(backend.close)))
        bus = await self._connect("trainer")
        service = build_trainer(s.trainer, bus, backend, [sink], planner=await self._planner(bus))
        await service.start()
        self._stoppers.append(("trainer", service.stop))
        self.trainer = service

    async def _planner(self, bus: Bus) -> RolloutPlanner | None:
        """The trainer's rollout planner when the stack was given tasks and an agent."""
        from trainer.rollouts import RolloutPlanner

        if self._tasks is None or self._agent is None:
            return None
        curriculum = None
        if self._curriculum_revisit is not None:
            from trainer.curriculum import SignalCurriculum

            history = await asyncio.to_thread(self.store.task_history) if self.store is not None else {}
            curriculum = SignalCurriculum(self._tasks, revisit=self._curriculum_revisit, history=history)
        return RolloutPlanner(
            bus,
            self._tasks,
            self._agent,
            group_size=self._group_size,
            model=self.settings.model,
            deadline_s=self._deadline_s,
            curriculum=curriculum,
        )

    async def _start_policy_trainer(self) -> None:
        from flywheel.assembly import build_policy_trainer
        from trainer.policy_service import start_policies
        from trainer.weights import WeightLoadError

        s = self.settings
        try:
            sinks = self._running.adapter_sinks()
        except ValueError as exc:
            raise StackError(str(exc)) from exc
        policies = await asyncio.to_thread(start_policies, s.trainer, self._model_dir)
        bus = await self._connect("trainer")
        service = build_policy_trainer(s.trainer, bus, policies, sinks, planner=await self._planner(bus))
        try:
            await service.start()
        except WeightLoadError as exc:  # the engine refused an adapter (vLLM without --enable-lora)
            raise StackError(str(exc)) from exc
        self._stoppers.append(("trainer", service.stop))
        self.trainer = service

    # ------------------------------------------------------------------ training
    def start_training(self, max_steps: int | None = None) -> asyncio.Task[None]:
        """Run the trainer's loop in the background until ``max_steps`` or :meth:`stop_training`."""
        if self.trainer is None:
            raise StackError("the stack runs no trainer (run_trainer=False)")
        if self._training is not None and not self._training.done():
            raise StackError("training is already running")
        self._training = asyncio.create_task(self.trainer.run(max_steps), name="trainer-loop")
        return self._training

    async def stop_training(self) -> None:
        """Let the step in progress finish, then return (the trainer keeps its subscriptions)."""
        task, self._training = self._training, None
        if task is None or self.trainer is None:
            return
        self.trainer.request_stop()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def cancel_rollouts(self) -> int:
        """Cancel the groups the trainer requested but has not trained on (after training stopped)."""
        if self.trainer is None or self.trainer.planner is None:
            return 0
        hit = 0
        for group_id in list(self.trainer.planner.in_flight):
            hit += sum(worker.rollouts.cancel_group(group_id, None) for worker in self.workers)
            self.trainer.planner.finished(group_id)
        return hit

    # ------------------------------------------------------------------ accessors
    @property
    def _bus(self) -> Bus:
        if self.bus is None:
            raise StackError("the stack is not started")
        return self.bus

    @property
    def _model_dir(self) -> Path:
        if self.model_dir is None:
            raise StackError("the stack has no model_dir")
        return self.model_dir

    @property
    def _running(self) -> RunningEngine:
        if self.running_engine is None:
            raise StackError("the engine is not started")
        return self.running_engine

    def episode_url(self, episode_id: str) -> str:
        """The OpenAI base URL an agent uses for one training episode."""
        return f"{self.gateway_url}/episodes/{episode_id}/v1"

    def env(self) -> dict[str, str]:
        """``FLYWHEEL_*`` variables for a ``flywheel`` process that joins this stack (``flywheel worker``,
        ``flywheel tasks submit``): its bus, its gateway and the episode key its gateway admits."""
        s = self.settings
        out = {
            "FLYWHEEL_BUS": s.bus,
            "FLYWHEEL_TOPIC_PREFIX": s.topic_prefix,
            "FLYWHEEL_GATEWAY_URL": self.gateway_url,
            "FLYWHEEL_EPISODE_KEY": s.episode_key.get_secret_value(),
        }
        if s.bus == "kafka":
            out["FLYWHEEL_KAFKA_BOOTSTRAP"] = s.kafka_bootstrap
        return out
