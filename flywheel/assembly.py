"""The one builder: every entry point constructs its parts here and only chooses which to run, and how.

    flywheel up / the embedded stack   flywheel/stack.py: every part, one process
    flywheel agl-server                flywheel/cli/agl_cmd.py: recorder, engine, gateway
    flywheel gateway|worker|reward|    flywheel/alone.py: one part as a process of its own, on
      trainer|recorder|otel-export     ``infra.service.serve``
    flywheel engine                    flywheel/cli/engine_cmd.py (:func:`load_engine`)

One function per part; each calls the service's own constructor (``<service>/app.py::build``; a service
never imports the application layer), so a part is put together in one place whichever entry point runs
it:

    build_gateway(settings, bus, upstreams)          gateway.service.Gateway (``app_for`` is its HTTP face)
    build_worker(settings, bus)                      rollout_worker.service.RolloutWorker
    build_reward(settings, bus)                      reward_service.service.RewardService
    await build_recorder(settings, bus)              the recorder and the event log it owns
    build_trainer(settings, bus, backend, sinks)     trainer.service.TrainerService
    build_policy_trainer(settings, bus, ...)         the trainer with a policy map (a LoRA adapter each)
    build_otel_exporter(settings, bus)               infra.otel's exporter (None without an endpoint)
    build_otel_forwarder(settings, bus, registry)    its consumer, the export work in a child process
    start_trainer_backend(settings, model_dir)       the trainer's backend (torch, process, DDP, verl)
    load_engine(model_dir, ...)                      the embedded engine (``flywheel engine``, the stack)

The engine the policy is served from, and how weights reach it, are chosen in one place:
:func:`choose_engine` (embedded in this process, ``flywheel engine`` as a child process, a ``flywheel
engine`` or a vLLM server at a URL, or an upstream URL nothing loads weights into; a trainer run alone
names its engine in its settings, :func:`trainer_engine`), :func:`start_engine` starts it, and the
:class:`RunningEngine` gives the gateway's upstream (:meth:`RunningEngine.upstream`) and the trainer's
weight sinks (:meth:`RunningEngine.weight_sink`, :meth:`RunningEngine.adapter_sinks`): the one place an
engine's kind picks its sink.

Imports are lazy: a process that runs one part loads only that part's modules.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from infra.tokenizer_fingerprint import fingerprint_of

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gateway.keys import KeyStore
    from gateway.service import Gateway
    from gateway.settings import GatewaySettings
    from gateway.upstream.client import Upstream
    from infra.bus.base import Bus
    from infra.engine.core import InferenceEngine
    from infra.engine.process import EngineProcess
    from infra.eventlog.app import RecorderProcess
    from infra.eventlog.settings import EventLogSettings
    from infra.otel.exporter import OtelExporter
    from infra.otel.forward import ExportForwarder
    from infra.otel.settings import OtelSettings
    from reward_service.service import RewardService
    from reward_service.settings import RewardSettings
    from rollout_worker.service import RolloutWorker
    from rollout_worker.settings import WorkerSettings
    from trainer.backends.base import Backend
    from trainer.loop import LoopConfig
    from trainer.lora import LoraPolicies
    from trainer.policy_service import PolicyTrainerService
    from trainer.rollouts import RolloutPlanner
    from trainer.service import TrainerService
    from trainer.settings import TrainerSettings
    from trainer.weights import WeightSink

TINY_CACHE = Path.home() / ".cache" / "flywheel" / "models" / "up-tiny"
TINY_CORPUS = [f"What is {a} plus {b}? The answer is {a + b}." for a in range(20) for b in range(20)]

EngineKind = Literal["embedded", "process", "flywheel", "vllm", "upstream"]


# ------------------------------------------------------------------------------------------ services
def with_tokenizer(settings: GatewaySettings, model_dir: Path | None) -> GatewaySettings:
    """``settings`` with the fingerprint of ``model_dir``'s tokenizer, which the gateway records with every
    call (replay checks it: docs/replay.md); unchanged when one is set or there is no model."""
    if settings.tokenizer_fingerprint or model_dir is None:
        return settings
    return settings.model_copy(update={"tokenizer_fingerprint": fingerprint_of(model_dir)})


def build_gateway(
    settings: GatewaySettings,
    bus: Bus,
    upstreams: Sequence[Upstream],
    *,
    keystore: KeyStore | None = None,
    release_slots: Sequence[Upstream] = (),
) -> Gateway:
    """The gateway (``gateway.app.app_for(gateway)`` is its ASGI app)."""
    from gateway.app import build

    return build(settings, bus, upstreams, keystore=keystore, release_slots=release_slots)


def build_worker(settings: WorkerSettings, bus: Bus) -> RolloutWorker:
    from rollout_worker.app import build

    return build(settings, bus)


def build_otel_forwarder(
    settings: OtelSettings, bus: Bus, registry: CollectorRegistry | None = None
) -> ExportForwarder | None:
    """The OpenTelemetry export of a process whose bus is its own (the embedded stack, ``flywheel gateway``
    on the in-process bus): a consumer handing the events' bytes to a child process that builds and
    sends the spans (``infra.otel.forward``); None without an endpoint."""
    from infra.otel.app import build_forwarder

    return build_forwarder(settings, bus, registry)


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


def build_policy_trainer(
    settings: TrainerSettings,
    bus: Bus,
    policies: LoraPolicies,
    sinks: Callable[[str], Sequence[WeightSink]],
    *,
    planner: RolloutPlanner | None = None,
) -> PolicyTrainerService:
    """The trainer with a policy map: one LoRA adapter per policy over the frozen base (``policies``,
    ``trainer.policy_service.start_policies``), each loaded through ``sinks(adapter)``."""
    from trainer.app import loop_config
    from trainer.policy_service import build_policy_trainer

    return build_policy_trainer(settings, bus, policies, sinks, loop_config(settings), planner=planner)


def build_otel_exporter(settings: OtelSettings, bus: Bus) -> OtelExporter | None:
    """The OpenTelemetry exporter (recorded episodes as OTLP GenAI spans), None without an endpoint."""
    from infra.otel.app import build

    return build(settings, bus)


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
        model_options=settings.trainer_model_options,
    )


def load_engine(
    model_dir: Path,
    *,
    model_name: str | None = None,
    threads: int | None = None,
    max_num_seqs: int = 64,
    max_model_len: int | None = None,
    weight_version: int = 0,
) -> InferenceEngine:
    """The embedded engine on ``model_dir`` (blocking: it loads the model): ``flywheel engine`` serves
    it over HTTP, the stack behind an ASGI transport."""
    from infra.engine.core import InferenceEngine

    return InferenceEngine.from_pretrained(
        model_dir,
        threads=threads,
        model_name=model_name,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        weight_version=weight_version,
    )


def tiny_model() -> Path:
    """A toy model (a few MB, built once and cached) for ``--tiny`` and a model-less ``agl-server``."""
    from trainer.models.tiny import build_tiny

    return build_tiny(TINY_CACHE, TINY_CORPUS, vocab_size=384, hidden=64, layers=2)


# -------------------------------------------------------------------------------------------- engine
@dataclass(frozen=True)
class EngineChoice:
    """What serves the policy: ``embedded`` (this process, behind an ASGI transport), ``process``
    (``flywheel engine`` as a child, loopback HTTP), ``flywheel`` (a running ``flywheel engine`` at
    ``url``), ``vllm`` (a running server at ``url``) or ``upstream`` (any OpenAI-compatible server at
    ``url``; nothing loads weights into it). ``token``: the bearer token of a server's weight loading."""

    kind: EngineKind
    model_dir: Path | None = None
    url: str | None = None
    token: str | None = None


def choose_engine(
    *,
    model_dir: Path | None = None,
    vllm_url: str | None = None,
    upstream_url: str | None = None,
    flywheel_url: str | None = None,
    token: str | None = None,
    process: bool = False,
) -> EngineChoice:
    """The one choice of engine for every entry point: a vLLM URL, else a ``flywheel engine`` URL, else
    an upstream URL, else the embedded engine on ``model_dir`` (in a child process with ``process``)."""
    if sum(url is not None for url in (vllm_url, upstream_url, flywheel_url)) > 1:
        raise ValueError("one of a vLLM URL, a flywheel engine URL or an upstream URL, not two")
    if vllm_url is not None:
        return EngineChoice("vllm", model_dir, vllm_url.rstrip("/"), token)
    if flywheel_url is not None:
        return EngineChoice("flywheel", model_dir, flywheel_url.rstrip("/"), token)
    if upstream_url is not None:
        return EngineChoice("upstream", model_dir, upstream_url)
    if model_dir is None:
        raise ValueError("the embedded engine needs a model directory")
    return EngineChoice("process" if process else "embedded", model_dir)


def trainer_engine(settings: TrainerSettings) -> EngineChoice | None:
    """The engine a trainer run alone loads its weights into (``FLYWHEEL_TRAINER_ENGINE_URL``,
    ``_KIND``, ``_TOKEN``); None when none is named."""
    url = settings.trainer_engine_url
    if not url:
        return None
    token = settings.trainer_engine_token.get_secret_value() if settings.trainer_engine_token else None
    if settings.trainer_engine_kind == "vllm":
        return choose_engine(vllm_url=url, token=token)
    if settings.trainer_engine_kind == "flywheel":
        return choose_engine(flywheel_url=url, token=token)
    raise ValueError(f"an engine is flywheel or vllm, not {settings.trainer_engine_kind!r}")


@dataclass
class RunningEngine:
    """The chosen engine, started: its upstream for the gateway and its sink for the trainer."""

    choice: EngineChoice
    engine: InferenceEngine | None = None
    process: EngineProcess | None = None
    _stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def upstream(self, settings: GatewaySettings) -> Upstream:
        """The gateway's upstream in front of this engine (the caller closes its client)."""
        from gateway.upstream.client import make_upstream
        from schemas import UpstreamKind

        kind = self.choice.kind
        if kind == "upstream":
            return make_upstream(
                self.choice.url or "",
                kind=settings.upstream_kind,
                logprobs_mode=settings.logprobs_mode,
                api_key=settings.upstream_api_key,
                timeout_s=settings.upstream_timeout_s,
                request_weight_versions=settings.request_weight_versions,
                wire=settings.upstream_client == "wire",
            )
        if kind == "vllm":
            return make_upstream(
                f"{self.choice.url}/v1",
                kind=UpstreamKind.vllm,
                logprobs_mode=settings.logprobs_mode,
                timeout_s=settings.upstream_timeout_s,
                request_weight_versions=True,
            )
        if kind == "flywheel" or self.process is not None:
            return make_upstream(
                (self.process.url if self.process is not None else self.choice.url or "") + "/v1",
                kind=UpstreamKind.embedded,
                logprobs_mode=settings.logprobs_mode,
                timeout_s=settings.upstream_timeout_s,
            )
        import httpx

        from infra.engine.app import create_engine_app

        return make_upstream(
            "http://embedded-engine/v1",
            kind=UpstreamKind.embedded,
            logprobs_mode=settings.logprobs_mode,
            timeout_s=settings.upstream_timeout_s,
            transport=httpx.ASGITransport(app=create_engine_app(self._engine)),
        )

    def _loader(self) -> tuple[str, str, str | None]:
        """The one engine-kind switch: how new weights reach this engine (``vllm``, ``flywheel``: an HTTP
        engine at a URL, ``in-process``, or ``none`` for an upstream URL), where, and with which token."""
        kind = self.choice.kind
        if kind in ("vllm", "flywheel"):
            return kind, self.choice.url or "", self.choice.token
        if kind == "upstream":
            return "none", "", None
        if self.process is not None:
            return "flywheel", self.process.url, self.process.admin_token
        return "in-process", "", None

    def weight_sink(self) -> WeightSink | None:
        """How the trainer loads a new version into this engine (None: nothing can, an upstream URL):
        vLLM's ``/collective_rpc`` (:class:`~trainer.vllm_sink.VllmSink`), ``flywheel engine``'s
        ``/load_weights`` (:class:`~trainer.weights.HttpSink`), or the embedded engine's own method."""
        from trainer.vllm_sink import VllmSink
        from trainer.weights import HttpSink, InProcessSink

        how, url, token = self._loader()
        if how == "vllm":
            return VllmSink(url, token=token)
        if how == "flywheel":
            return HttpSink(url, token=token)
        if how == "in-process":
            return InProcessSink(self._engine.load_weights, name="embedded-engine")
        return None

    def adapter_sinks(self) -> Callable[[str], list[WeightSink]]:
        """Each LoRA adapter's sink (``trainer.policy_service``): the embedded engine, a ``flywheel
        engine`` (its process, or one at a URL) or a vLLM server (``--enable-lora``, runtime loading)."""
        from trainer.vllm_sink import VllmAdapterSink
        from trainer.weights import HttpAdapterSink, InProcessAdapterSink

        how, url, token = self._loader()
        if how == "none":
            raise ValueError("LoRA policies load into the embedded engine, flywheel engine or vLLM")
        load = self._engine.load_adapter if how == "in-process" else None

        def sinks(adapter: str) -> list[WeightSink]:
            if how == "vllm":
                return [VllmAdapterSink(url, adapter, token=token)]
            if how == "flywheel":
                return [HttpAdapterSink(url, adapter, token=token)]
            assert load is not None
            return [InProcessAdapterSink(load, adapter, name="embedded-engine")]

        return sinks

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
    if choice.kind in ("vllm", "flywheel", "upstream"):
        return running
    if choice.model_dir is None:
        raise ValueError("the embedded engine needs a model directory")
    if choice.kind == "process":
        from infra.engine.process import EngineProcess

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
    engine = await asyncio.to_thread(
        load_engine, choice.model_dir, threads=threads, model_name=model_name, max_num_seqs=max_num_seqs
    )
    running.engine = engine
    running._stop.append(engine.close)
    return running
