"""Pause/resume around weight updates (docs/architecture.md, "The weight-update protocol") and the served weight version.

``Admission`` gates every call: while paused a new call waits (up to ``hold_s``, then
:class:`PausedError` → 503 + Retry-After); calls already admitted finish. ``pause()`` returns once no
call is in flight (or ``drain_timeout_s`` passed: reported, not waited on forever), with what it waited
for: the calls in flight when it began and those still in flight when it returned. ``resume()`` stamps
the version that serves from then on.

``ControlTopic`` is what the gateway does with ``flywheel.control``: it pauses and resumes admission
(the whole model's, or one adapter's) and says so (``InferenceDrained`` / ``InferenceResumed``),
activates prompt versions, and on start learns each adapter's version from the topic's history.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import PausedError
from gateway.metrics import GatewayMetrics
from gateway.prompts import PromptStore
from gateway.settings import GatewaySettings
from infra.bus.base import Bus, Message
from infra.logging import get_logger
from schemas import (
    CONTROL,
    AnyEvent,
    InferenceDrained,
    InferenceResumed,
    PromptVersionActivated,
    PromptVersionRequested,
    WeightsActivated,
    WeightUpdateFailed,
    WeightUpdateRequested,
)
from schemas.control import RELEASE_EVENTS

if TYPE_CHECKING:
    from gateway.releases import ReleaseRouter

log = get_logger("gateway")


@dataclass(frozen=True, slots=True)
class DrainResult:
    version: int
    waited_ms: float
    timed_out: bool
    in_flight: int  # calls in flight when the pause began: what it waited for
    still_in_flight: int  # those not finished when it returned (past its deadline)


class Admission:
    def __init__(self, *, weight_version: int = 0, hold_s: float = 30.0) -> None:
        self.weight_version = weight_version
        self.hold_s = hold_s
        self.in_flight = 0
        self.paused = False
        self.pending_version: int | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def enter(self) -> int:
        """Admit one call; returns the weight version that serves it."""
        if self.paused:
            try:
                await asyncio.wait_for(self._resumed.wait(), self.hold_s)
            except TimeoutError:
                raise PausedError(
                    "inference is paused for a weight update; retry shortly",
                    code="paused",
                    retry_after_s=max(1.0, self.hold_s / 2),
                ) from None
        self.in_flight += 1
        self._idle.clear()
        return self.weight_version

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    async def pause(self, version: int | None, drain_timeout_s: float) -> DrainResult:
        """Stop admitting and wait for in-flight calls to finish (at most ``drain_timeout_s``)."""
        self.paused = True
        self.pending_version = version
        self._resumed.clear()
        start = time.perf_counter()
        in_flight = self.in_flight
        timed_out = False
        try:
            await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
        except TimeoutError:
            timed_out = True
        return DrainResult(
            version if version is not None else self.weight_version,
            (time.perf_counter() - start) * 1000,
            timed_out,
            in_flight,
            self.in_flight,
        )

    def resume(self, version: int | None = None) -> int:
        """Admit again; ``version`` (when given) serves new calls from now on."""
        if version is not None:
            self.weight_version = version
        self.paused = False
        self.pending_version = None
        self._resumed.set()
        return self.weight_version


async def read_to_end(bus: Bus, topic: str, group: str, timeout_s: float) -> bool:
    """Until ``group`` has no lag on ``topic``, at most ``timeout_s``; False when time ran out.

    A bus that cannot say its lag (down) is asked again until the deadline.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        try:
            if await bus.lag(topic, group) == 0:
                return True
        except Exception as exc:  # the bus could not tell: try again until the deadline
            log.debug("lag unknown", topic=topic, error=type(exc).__name__)
        await asyncio.sleep(0.05)
    return False


class ControlTopic:
    """The gateway's side of ``flywheel.control``: pause/resume around weight updates (the whole model,
    or one adapter's calls only), prompt versions activated, and each adapter's version on start."""

    def __init__(
        self,
        settings: GatewaySettings,
        bus: Bus,
        *,
        admission: Admission,
        admission_for: Callable[[str], Admission],
        metrics: GatewayMetrics,
        prompts: PromptStore,
        publish: Callable[[AnyEvent], Awaitable[None]],
        starting: set[str],
        releases: ReleaseRouter | None = None,
    ) -> None:
        self.settings = settings
        self.releases = releases
        self.bus = bus
        self.id = settings.gateway_id
        self.admission = admission
        self.admission_for = admission_for
        self.metrics = metrics
        self.prompts = prompts
        self.publish = publish
        self.starting = starting  # the gateway's: /readyz answers 503 while it is not empty
        self._pause_lock = asyncio.Lock()
        self._adapters_heard: set[str] = set()  # adapters whose version a live control event set

    async def on_control(self, msg: Message) -> None:
        event = msg.event
        if getattr(event, "model", None) != self.settings.model:
            return
        if isinstance(event, RELEASE_EVENTS):
            if self.releases is not None:
                await self.releases.apply(event)
            return
        if getattr(event, "adapter", None) is not None:  # one adapter's update: only its calls wait
            await self._on_adapter_control(event)
            return
        if isinstance(event, WeightUpdateRequested):
            await self.pause(event.version, event.drain_timeout_s)
        elif isinstance(event, WeightsActivated):
            await self.resume(event.version)
        elif isinstance(event, WeightUpdateFailed):
            await self.resume(event.serving_version)
        elif isinstance(event, PromptVersionRequested):
            await self.activate_prompt(event)

    async def _on_adapter_control(self, event: object) -> None:
        if isinstance(event, WeightUpdateRequested) and event.adapter is not None:
            adm = self.admission_for(event.adapter)
            result = await adm.pause(
                event.version, event.drain_timeout_s or self.settings.pause_drain_timeout_s
            )
            log.info(
                "adapter drained", adapter=event.adapter, version=event.version, waited_ms=result.waited_ms
            )
            await self.publish(
                InferenceDrained(
                    producer=f"gateway:{self.id}",
                    model=self.settings.model,
                    adapter=event.adapter,
                    version=result.version,
                    gateway_id=self.id,
                    waited_ms=result.waited_ms,
                    timed_out=result.timed_out,
                )
            )
        elif isinstance(event, WeightsActivated | WeightUpdateFailed) and event.adapter is not None:
            self._adapters_heard.add(event.adapter)
            adm = self.admission_for(event.adapter)
            was_paused = adm.paused
            version = event.version if isinstance(event, WeightsActivated) else event.serving_version
            served = adm.resume(version)
            if was_paused:
                await self.publish(
                    InferenceResumed(
                        producer=f"gateway:{self.id}",
                        model=self.settings.model,
                        adapter=event.adapter,
                        version=served,
                        gateway_id=self.id,
                    )
                )

    async def activate_prompt(self, event: PromptVersionRequested) -> None:
        """Serve ``event``'s prompt version to new groups (gateway/prompts.py) and say so on the bus."""
        self.prompts.activate(event)
        log.info("prompt version activated", prompt_version=event.prompt_version)
        await self.publish(
            PromptVersionActivated(
                producer=f"gateway:{self.id}",
                model=self.settings.model,
                prompt_version=event.prompt_version,
                gateway_id=self.id,
                request_id=event.event_id,
            )
        )

    async def pause(self, version: int | None, drain_timeout_s: float | None = None) -> DrainResult:
        async with self._pause_lock:
            self.metrics.paused.set(1)
            result = await self.admission.pause(
                version, drain_timeout_s or self.settings.pause_drain_timeout_s
            )
            log.info(
                "drained", version=result.version, waited_ms=result.waited_ms, timed_out=result.timed_out
            )
            await self.publish(
                InferenceDrained(
                    producer=f"gateway:{self.id}",
                    model=self.settings.model,
                    version=result.version,
                    gateway_id=self.id,
                    waited_ms=result.waited_ms,
                    timed_out=result.timed_out,
                )
            )
            return result

    async def resume(self, version: int | None = None) -> int:
        was_paused = self.admission.paused
        served = self.admission.resume(version)
        self.metrics.paused.set(0)
        self.metrics.weight_version.set(served)
        if was_paused:
            await self.publish(
                InferenceResumed(
                    producer=f"gateway:{self.id}",
                    model=self.settings.model,
                    version=served,
                    gateway_id=self.id,
                )
            )
        return served

    async def learn_releases(self, group: str) -> None:
        """Fold the control topic's release events into the book (saved ones are not folded twice), then
        load the served version: a restarted gateway serves production what served before."""
        assert self.releases is not None
        releases = self.releases

        async def on(msg: Message) -> None:
            if isinstance(msg.event, RELEASE_EVENTS) and msg.event.model == self.settings.model:
                releases.book.apply(msg.event)

        history = f"{group}.releases-{uuid.uuid4().hex[:8]}"
        self.starting.add("releases")
        sub = await self.bus.subscribe(CONTROL, history, on, from_beginning=True)
        try:
            if not await read_to_end(self.bus, CONTROL, history, self.settings.catch_up_timeout_s):
                log.warning("serving before the control topic's releases were read to their end")
            for adapter in list(releases.book.releases) or [None]:
                await releases.prepare(adapter)
        finally:
            await sub.stop()
            self.starting.discard("releases")
        log.info("releases learnt", served={r.name: r.served for r in releases.book.releases.values()})

    async def learn_adapter_versions(self, group: str) -> None:
        """Each adapter serves at the version last activated for it on the control topic.

        A gateway that starts while adapters are trained (a restart, a replica added) would otherwise
        stamp their calls with version 0 until each adapter's next update. The control topic is read from
        its beginning to its end by a private consumer group (as ``Gateway._catch_up`` reads the episodes
        topic,
        bounded by ``catch_up_timeout_s``); the last ``WeightsActivated`` of an adapter (or the serving
        version of its last ``WeightUpdateFailed``) sets that adapter's version, unless a live control
        event set it meanwhile (the live subscription is already running).
        """
        found: dict[str, int] = {}

        async def on(msg: Message) -> None:
            event = msg.event
            adapter = getattr(event, "adapter", None)
            if adapter is None or getattr(event, "model", None) != self.settings.model:
                return
            if isinstance(event, WeightsActivated):
                found[adapter] = event.version
            elif isinstance(event, WeightUpdateFailed):
                found[adapter] = event.serving_version

        history = f"{group}.versions-{uuid.uuid4().hex[:8]}"
        self.starting.add("adapter-versions")
        sub = await self.bus.subscribe(CONTROL, history, on, from_beginning=True)
        try:
            if not await read_to_end(self.bus, CONTROL, history, self.settings.catch_up_timeout_s):
                log.warning("serving before the control topic was read to its end", group=history)
        finally:
            await sub.stop()
            self.starting.discard("adapter-versions")
        for adapter, version in found.items():
            if adapter not in self._adapters_heard:
                self.admission_for(adapter).weight_version = version
        if found:
            log.info("adapter versions learnt", versions=found)
