"""The one builder: every entry point constructs its parts here and only chooses which to run, and how.

    flywheel up / the embedded stack   infra/application/stack.py: every part, one process
    flywheel agl-server                infra/application/cli/agl_cmd.py: recorder, engine, gateway
    flywheel gateway                   infra/application/cli/gateway_cmd.py (on ``infra.service.serve``)
    flywheel worker|reward|trainer|    each service's ``app.serve`` on ``infra.service.serve``, with the
      recorder                         service's ``app.build``: the constructor the functions here call
                                       (a service never imports the application layer)

One function per part; each calls the service's own constructor (``<service>/app.py::build``), so a
part is put together in one place whichever entry point runs it:

    build_gateway(settings, bus, upstreams)          gateway.service.Gateway (``app_for`` is its HTTP face)
    build_worker(settings, bus)                      rollout_worker.service.RolloutWorker
    build_reward(settings, bus)                      reward_service.service.RewardService
    await build_recorder(settings, bus)              the recorder and the event log it owns
    build_trainer(settings, bus, backend, sinks)     trainer.service.TrainerService
    start_trainer_backend(settings, model_dir)       the trainer's backend (torch, process, DDP, verl)

The engine a stack serves the policy from, and how weights reach it, are chosen in one place:
:func:`choose_engine` (embedded in this process, ``flywheel engine`` as a child process, a vLLM server,
or an upstream URL nothing loads weights into), :func:`start_engine` starts it, and the
:class:`RunningEngine` gives the gateway's upstream (:meth:`RunningEngine.upstream`) and the trainer's
weight sink (:meth:`RunningEngine.weight_sink`, through ``trainer.app.engine_sink``, the one place an
engine's kind picks its sink). A trainer run alone reads its engine from its settings
(``trainer.app.sinks_from_settings``).

Imports are lazy: a process that runs one part loads only that part's modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gateway.keys import KeyStore
    from gateway.service import Gateway
    from gateway.settings import GatewaySettings
    from gateway.upstream import Upstream
    from infra.application.engine_process import EngineProcess
    from infra.bus.base import Bus
    from infra.eventlog.app import RecorderProcess
    from infra.eventlog.settings import EventLogSettings
    from reward_service.service import RewardService
    from reward_service.settings import RewardSettings
    from rollout_worker.service import RolloutWorker
    from rollout_worker.settings import WorkerSettings
    from trainer.backends.base import Backend
    from trainer.engine.core import InferenceEngine
    from trainer.rollouts import RolloutPlanner
    from trainer.service import LoopConfig, TrainerService
    from trainer.settings import TrainerSettings
    from trainer.weights import WeightSink

TINY_CACHE = Path.home() / ".cache" / "flywheel" / "models" / "up-tiny"
TINY_CORPUS = [f"What is {a} plus {b}? The answer is {a + b}." for a in range(20) for b in range(20)]

EngineKind = Literal["embedded", "process", "vllm", "upstream"]


# ------------------------------------------------------------------------------------------ services
def build_gateway(
    settings: GatewaySettings, bus: Bus, upstreams: Sequence[Upstream], *, keystore: KeyStore | None = None
) -> Gateway:
    """The gateway (``gateway.app.app_for(gateway)`` is its ASGI app)."""
    from gateway.app import build

    return build(settings, bus, upstreams, keystore=keystore)


def build_worker(settings: WorkerSettings, bus: Bus) -> RolloutWorker:
    from rollout_worker.app import build

    return build(settings, bus)


def build_reward(settings: RewardSettings, bus: Bus) -> RewardService:
    from reward_service.app import build

    return build(settings, bus)


async def build_recorder(settings: EventLogSettings, bus: Bus) -> RecorderProcess:
    """The recorder on every topic and the event log it writes (ClickHouse server, or chdb it owns);
    its ``stop`` writes the last batches, then closes the store."""
    from infra.eventlog.app import build

    return await build(settings, bus)


def build_trainer(
    settings: TrainerSettings,
    bus: Bus,
    backend: Backend,
    sinks: Sequence[WeightSink],
    *,
    planner: RolloutPlanner | None = None,
    loop: LoopConfig | None = None,
) -> TrainerService:
    from trainer.app import build

    return build(settings, bus, backend, sinks, planner=planner, loop=loop)


def start_trainer_backend(settings: TrainerSettings, model_dir: Path, *, torch_threads: int = 0) -> Backend:
    """The trainer's backend on ``model_dir`` as its settings say (blocking: it loads the model)."""
    from trainer.app import start_backend

    return start_backend(
        model_dir,
        settings.trainer_algo,
        device=settings.trainer_device,
        torch_threads=torch_threads,
        process=settings.trainer_backend_process,
        dp=settings.trainer_dp,
        kind=settings.trainer_backend,
    )


def tiny_model() -> Path:
    """A toy model (a few MB, built once and cached) for ``--tiny`` and a model-less ``agl-server``."""
    from trainer.models.tiny import build_tiny

    return build_tiny(TINY_CACHE, TINY_CORPUS, vocab_size=384, hidden=64, layers=2)


# -------------------------------------------------------------------------------------------- engine
@dataclass(frozen=True)
class EngineChoice:
    """What serves the policy: ``embedded`` (this process, behind an ASGI transport), ``process``
    (``flywheel engine`` as a child, loopback HTTP), ``vllm`` (a running server at ``url``) or
    ``upstream`` (any OpenAI-compatible server at ``url``; nothing loads weights into it)."""

    kind: EngineKind
    model_dir: Path | None = None
    url: str | None = None


def choose_engine(
    *,
    model_dir: Path | None = None,
    vllm_url: str | None = None,
    upstream_url: str | None = None,
    process: bool = False,
) -> EngineChoice:
    """The one choice of engine for every entry point: a vLLM URL, else an upstream URL, else the
    embedded engine on ``model_dir`` (in a child process with ``process``)."""
    if vllm_url is not None and upstream_url is not None:
        raise ValueError("a vLLM URL or an upstream URL, not both")
    if vllm_url is not None:
        return EngineChoice("vllm", model_dir, vllm_url.rstrip("/"))
    if upstream_url is not None:
        return EngineChoice("upstream", model_dir, upstream_url)
    if model_dir is None:
        raise ValueError("the embedded engine needs a model directory")
    return EngineChoice("process" if process else "embedded", model_dir)


@dataclass
class RunningEngine:
    """The chosen engine, started: its upstream for the gateway and its sink for the trainer."""

    choice: EngineChoice
    engine: InferenceEngine | None = None
    process: EngineProcess | None = None
    _stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def upstream(self, settings: GatewaySettings) -> Upstream:
        """The gateway's upstream in front of this engine (the caller closes its client)."""
        from gateway.upstream import make_upstream
        from schemas import UpstreamKind

        kind = self.choice.kind
        if kind == "upstream":
            return make_upstream(
                self.choice.url or "",
                kind=settings.upstream_kind,
                logprobs_mode=settings.logprobs_mode,
                api_key=settings.upstream_api_key,
                timeout_s=settings.upstream_timeout_s,
            )
        if kind == "vllm":
            return make_upstream(
                f"{self.choice.url}/v1",
                kind=UpstreamKind.vllm,
                logprobs_mode=settings.logprobs_mode,
                timeout_s=settings.upstream_timeout_s,
                request_weight_versions=True,
            )
        if self.process is not None:
            return make_upstream(
                self.process.url + "/v1",
                kind=UpstreamKind.embedded,
                logprobs_mode=settings.logprobs_mode,
                timeout_s=settings.upstream_timeout_s,
            )
        import httpx

        from trainer.engine.app import create_engine_app

        return make_upstream(
            "http://embedded-engine/v1",
            kind=UpstreamKind.embedded,
            logprobs_mode=settings.logprobs_mode,
            timeout_s=settings.upstream_timeout_s,
            transport=httpx.ASGITransport(app=create_engine_app(self._engine)),
        )

    def weight_sink(self) -> WeightSink | None:
        """How the trainer loads a new version into this engine (None: nothing can, an upstream URL)."""
        from trainer.app import engine_sink
        from trainer.weights import InProcessSink

        kind = self.choice.kind
        if kind == "vllm":
            return engine_sink("vllm", self.choice.url or "")
        if kind == "upstream":
            return None
        if self.process is not None:
            return engine_sink("flywheel", self.process.url, token=self.process.admin_token)
        return InProcessSink(self._engine.load_weights, name="embedded-engine")

    def adapter_sinks(self) -> Callable[[str], list[WeightSink]]:
        """Each LoRA adapter's sink (``trainer.policy_service``): the embedded engine or its process."""
        from trainer.policy_service import adapter_sinks

        if self.choice.kind in ("vllm", "upstream"):
            raise ValueError("LoRA policies load into the embedded engine or flywheel engine; not vLLM yet")
        if self.process is not None:
            return adapter_sinks("flywheel", self.process.url, token=self.process.admin_token)
        return adapter_sinks("in-process", self._engine.load_adapter)

    @property
    def _engine(self) -> InferenceEngine:
        if self.engine is None:
            raise RuntimeError("the embedded engine is not started")
        return self.engine

    async def stop(self) -> None:
        while self._stop:
            await self._stop.pop()()


async def start_engine(
    choice: EngineChoice,
    *,
    model_name: str,
    max_num_seqs: int = 64,
    threads: int | None = None,
    log_path: Path | None = None,
) -> RunningEngine:
    """Start the engine ``choice`` names (nothing to start for a URL); ``stop()`` it at the end."""
    running = RunningEngine(choice)
    if choice.kind in ("vllm", "upstream"):
        return running
    if choice.model_dir is None:
        raise ValueError("the embedded engine needs a model directory")
    if choice.kind == "process":
        from infra.application.engine_process import EngineProcess

        proc = await EngineProcess.start(
            choice.model_dir,
            log_path=log_path or Path("engine.log"),
            model_name=model_name,
            max_num_seqs=max_num_seqs,
            threads=threads,
        )
        running.process = proc
        running._stop.append(proc.stop)
        return running
    from trainer.engine.core import InferenceEngine

    engine = await asyncio.to_thread(
        InferenceEngine.from_pretrained,
        choice.model_dir,
        threads=threads,
        model_name=model_name,
        max_num_seqs=max_num_seqs,
    )
    running.engine = engine
    running._stop.append(engine.close)
    return running
