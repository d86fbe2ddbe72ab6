"""The weight-update protocol (docs/architecture.md, flow 4) and the sinks that load weights into inference.

One update, as :meth:`WeightSync.update` runs it::

    publish WeightUpdateRequested(version=v)         gateways stop admitting, let in-flight calls end
    wait InferenceDrained(v) from every gateway      known = gateways seen on control ∪ expected count;
                                                     after drain_timeout_s the missing are reported
    sink.load(update) for every sink                 in-process engine, HTTP engine, vLLM, ...
    publish WeightsActivated(v)                      gateways resume and stamp v on new calls
    -- or, when a sink fails --
    publish WeightUpdateFailed(v, serving_version)   gateways resume on the old version

Sync mode splits the protocol in two: :meth:`WeightSync.drain` before training (inference waits while
the trainer trains) and :meth:`WeightSync.activate` after. A :class:`WeightSink` is the seam to an
inference server; a new server kind (verl's checkpoint engine, SGLang's ``update_weights_from_disk``)
is one more class with ``needs_path`` and ``load`` (vLLM's: :class:`trainer.vllm_sink.VllmSink`).

Exceptions:
    WeightLoadError     a sink could not load the weights (the update fails; the old version serves)
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from infra.bus.base import Bus
from infra.logging import get_logger
from schemas import (
    CONTROL,
    InferenceDrained,
    InferenceResumed,
    WeightsActivated,
    WeightUpdateFailed,
    WeightUpdateRequested,
)

log = get_logger(__name__)


class WeightLoadError(RuntimeError):
    def __init__(self, sink: str, version: int, reason: str) -> None:
        super().__init__(f"sink {sink} could not load version {version}: {reason}")
        self.sink = sink
        self.version = version
        self.reason = reason


@dataclass
class WeightUpdate:
    """What a sink may read: the version, the tensors in memory, and/or a file a server can load."""

    version: int
    state_dict: Callable[[], Mapping[str, Any]]
    path: Path | None = None


class WeightSink(Protocol):
    name: str
    needs_path: bool  # True: the service exports a file before calling load

    async def load(self, update: WeightUpdate) -> None:
        """Make ``update.version`` the served weights, or raise :class:`WeightLoadError`."""


LoadFn = Callable[[Mapping[str, Any] | Path, int], Awaitable[Any] | Any]


class InProcessSink:
    """The embedded engine in this process: ``load_weights(state_dict, version)`` (sync or async)."""

    needs_path = False

    def __init__(self, load_weights: LoadFn, name: str = "in-process") -> None:
        self._load = load_weights
        self.name = name

    async def load(self, update: WeightUpdate) -> None:
        try:
            result = self._load(update.state_dict(), update.version)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # any failure of the engine is a failed load, reported upstream
            raise WeightLoadError(self.name, update.version, f"{type(exc).__name__}: {exc}") from exc


class HttpSink:
    """An engine behind HTTP: ``POST {url}/load_weights {"path": ..., "version": ...}``.

    ``flywheel engine`` serves this route; the trainer saves a checkpoint first and hands its path over,
    so trainer and engine need a shared filesystem (or the same host).

    The client keeps its connection between updates, and the engine's server (uvicorn) closes one idle
    for 5 s: an update that picked the connection as the server closed it failed with ``ReadError``
    (seen once in 64 updates of a SQL demo run). So the client drops idle connections after
    ``keepalive_s`` (under the server's 5 s), and a load that failed before any response came back is
    sent once more: loading a version is idempotent (the same file, the same version label).
    """

    needs_path = True

    def __init__(
        self,
        url: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 120.0,
        route: str = "/load_weights",
        token: str | None = None,
        keepalive_s: float = 2.0,
    ) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.name = f"http:{self.url}"
        self._client = client
        self._own: httpx.AsyncClient | None = None  # made on the first load, kept until aclose()
        self._timeout = timeout_s
        self._route = route
        self._keepalive_s = keepalive_s

    def body(self, update: WeightUpdate) -> dict[str, Any]:
        return {"path": str(update.path), "version": update.version}

    async def load(self, update: WeightUpdate) -> None:
        if update.path is None:
            raise WeightLoadError(self.name, update.version, "no checkpoint path to hand over")
        client = self._client
        if client is None:
            # One client for every update: a new one builds an SSL context (CPU on the trainer's event
            # loop: docs/results/tuning.md) and a new connection each time.
            client = self._own = self._own or httpx.AsyncClient(
                timeout=self._timeout, limits=httpx.Limits(keepalive_expiry=self._keepalive_s)
            )
        for attempt in (1, 2):
            try:
                resp = await client.post(
                    self.url + self._route,
                    json=self.body(update),
                    headers=self._headers,
                    timeout=self._timeout,
                )
                break
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
                if attempt == 2:  # the connection was dropped under the request twice: not a stale one
                    raise WeightLoadError(self.name, update.version, f"{type(exc).__name__}: {exc}") from exc
                log.warning(
                    "weight_load_retry", sink=self.name, version=update.version, error=type(exc).__name__
                )
            except httpx.HTTPError as exc:
                raise WeightLoadError(self.name, update.version, f"{type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise WeightLoadError(self.name, update.version, f"HTTP {resp.status_code}: {resp.text[:500]}")

    async def aclose(self) -> None:
        """Close the client this sink made (a client passed in belongs to the caller)."""
        own, self._own = self._own, None
        if own is not None:
            await own.aclose()


class InProcessAdapterSink:
    """A LoRA adapter into the embedded engine in this process: ``load_adapter(name, path, version)``."""

    needs_path = True

    def __init__(
        self, load_adapter: Callable[[str, Path, int], Awaitable[Any]], adapter: str, name: str = "in-process"
    ) -> None:
        self._load = load_adapter
        self.adapter = adapter
        self.name = f"{name}:{adapter}"

    async def load(self, update: WeightUpdate) -> None:
        if update.path is None:
            raise WeightLoadError(self.name, update.version, "no adapter directory to load")
        try:
            await self._load(self.adapter, update.path, update.version)
        except Exception as exc:  # any failure of the engine is a failed load, reported upstream
            raise WeightLoadError(self.name, update.version, f"{type(exc).__name__}: {exc}") from exc


class HttpAdapterSink(HttpSink):
    """A LoRA adapter into ``flywheel engine``: ``POST {url}/load_adapter {"name", "path", "version"}``."""

    def __init__(self, url: str, adapter: str, **kw: Any) -> None:
        super().__init__(url, route="/load_adapter", **kw)
        self.adapter = adapter
        self.name = f"http:{self.url}:{adapter}"

    def body(self, update: WeightUpdate) -> dict[str, Any]:
        return {"name": self.adapter, "path": str(update.path), "version": update.version}


@dataclass
class UpdateResult:
    version: int
    activated: bool
    serving_version: int
    drained: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # gateways that did not drain in time
    drain_ms: float = 0.0
    load_ms: float = 0.0
    total_ms: float = 0.0
    error: str | None = None


class WeightSync:
    """Runs the protocol on the bus. Feed it control events with :meth:`observe`."""

    def __init__(
        self,
        bus: Bus,
        sinks: list[WeightSink],
        *,
        model: str = "policy",
        expected_gateways: int = 1,
        drain_timeout_s: float = 30.0,
        serving_version: int = 0,
        producer: str = "trainer",
        adapter: str | None = None,
    ) -> None:
        self.bus = bus
        self.sinks = sinks
        self.model = model
        # a LoRA adapter's updates (infra/policies.py): gateways drain only that adapter's calls
        self.adapter = adapter
        self.expected_gateways = expected_gateways
        self.drain_timeout_s = drain_timeout_s
        self.serving_version = serving_version
        self.producer = producer
        self.known_gateways: set[str] = set()
        self._drained: dict[int, dict[str, InferenceDrained]] = {}
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()
        self._draining: int | None = None

    @property
    def needs_path(self) -> bool:
        return any(s.needs_path for s in self.sinks)

    async def aclose(self) -> None:
        """Release what the sinks hold (HTTP clients); sinks without ``aclose`` hold nothing."""
        for sink in self.sinks:
            close = getattr(sink, "aclose", None)
            if close is not None:
                await close()

    @property
    def needs_tensors(self) -> bool:
        """Whether a sink reads ``WeightUpdate.state_dict`` (in-process engines); path sinks do not."""
        return any(not s.needs_path for s in self.sinks)

    async def observe(self, event: InferenceDrained | InferenceResumed) -> None:
        if event.model != self.model or event.adapter != self.adapter:
            return
        self.known_gateways.add(event.gateway_id)
        if isinstance(event, InferenceDrained):
            self._drained.setdefault(event.version, {})[event.gateway_id] = event
        self._changed.set()

    def _all_drained(self, version: int) -> bool:
        got = self._drained.get(version, {})
        return len(got) >= self.expected_gateways and self.known_gateways.issubset(got)

    async def drain(
        self, version: int, checkpoint_path: Path | None = None
    ) -> tuple[list[str], list[str], float]:
        """Publish the request and wait for every gateway (bounded). Returns (drained, missing, ms)."""
        t0 = time.perf_counter()
        self._draining = version
        await self.bus.publish(
            CONTROL,
            WeightUpdateRequested(
                model=self.model,
                version=version,
                checkpoint_path=str(checkpoint_path) if checkpoint_path else None,
                drain_timeout_s=self.drain_timeout_s,
                producer=self.producer,
                adapter=self.adapter,
            ),
        )
        # the gateways' own drain is bounded by drain_timeout_s; allow the event a little travel time
        deadline = time.monotonic() + self.drain_timeout_s + min(2.0, 0.5 + self.drain_timeout_s / 2)
        while not self._all_drained(version):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                break
        got = self._drained.get(version, {})
        missing = sorted(self.known_gateways - set(got))
        if len(got) < self.expected_gateways and not missing:
            missing = [f"<{self.expected_gateways - len(got)} unknown>"]
        if missing:
            log.warning(
                "gateways_not_drained", version=version, missing=missing, timeout_s=self.drain_timeout_s
            )
        return sorted(got), missing, (time.perf_counter() - t0) * 1000

    async def activate(self, update: WeightUpdate) -> tuple[bool, str | None, float]:
        """Load into every sink, then publish WeightsActivated (or WeightUpdateFailed)."""
        t0 = time.perf_counter()
        error: str | None = None
        for sink in self.sinks:
            try:
                await sink.load(update)
            except WeightLoadError as exc:
                error = str(exc)
                break
        ms = (time.perf_counter() - t0) * 1000
        self._drained.pop(update.version, None)
        self._draining = None
        path = str(update.path) if update.path else None
        if error is None:
            self.serving_version = update.version
            await self.bus.publish(
                CONTROL,
                WeightsActivated(
                    model=self.model,
                    version=update.version,
                    checkpoint_path=path,
                    producer=self.producer,
                    adapter=self.adapter,
                ),
            )
            return True, None, ms
        log.error("weight_update_failed", version=update.version, serving=self.serving_version, error=error)
        await self.bus.publish(
            CONTROL,
            WeightUpdateFailed(
                model=self.model,
                version=update.version,
                serving_version=self.serving_version,
                error=error[:4000],
                producer=self.producer,
                adapter=self.adapter,
            ),
        )
        return False, error, ms

    async def abort(self, version: int, error: str) -> None:
        """Give up on ``version`` after a drain: gateways resume on the version that serves."""
        self._drained.pop(version, None)
        self._draining = None
        await self.bus.publish(
            CONTROL,
            WeightUpdateFailed(
                model=self.model,
                version=version,
                serving_version=self.serving_version,
                error=error[:4000],
                producer=self.producer,
                adapter=self.adapter,
            ),
        )

    async def update(self, update: WeightUpdate) -> UpdateResult:
        """The whole protocol for one version (async mode)."""
        async with self._lock:
            t0 = time.perf_counter()
            drained, missing, drain_ms = await self.drain(update.version, update.path)
            ok, error, load_ms = await self.activate(update)
            return UpdateResult(
                version=update.version,
                activated=ok,
                serving_version=self.serving_version,
                drained=drained,
                missing=missing,
                drain_ms=drain_ms,
                load_ms=load_ms,
                total_ms=(time.perf_counter() - t0) * 1000,
                error=error,
            )


class PipelinedUpdates:
    """Async mode's updates: the protocol for version v runs while the next batch is collected and trained.

    At most one update is outstanding (:meth:`submit` waits for the previous one), so serving lags training
    by at most one more version. ``last`` is the last update that finished, what a step reports.
    """

    def __init__(self, weights: WeightSync, on_done: Callable[[UpdateResult], None]) -> None:
        self.weights = weights
        self.on_done = on_done
        self.last = UpdateResult(version=0, activated=True, serving_version=0)
        self._task: asyncio.Task[None] | None = None

    async def submit(self, update: WeightUpdate) -> None:
        await self.finish()
        self._task = asyncio.create_task(self._run(update))

    async def finish(self) -> None:
        """Wait for the outstanding update, if any."""
        task, self._task = self._task, None
        if task is not None:
            await task

    async def _run(self, update: WeightUpdate) -> None:
        self.last = await self.weights.update(update)
        self.on_done(self.last)
