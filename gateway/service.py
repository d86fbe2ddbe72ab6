"""The gateway as one object with a start/stop lifecycle: what the routes and the bus handlers call.

``Gateway(settings, bus, upstreams, keystore=...)`` owns the episode registry, the recorder (bus +
spool), admission control and the call service. ``start()`` subscribes to ``flywheel.control``
(pause/resume around weight updates) and starts the spool drainer. How it learns which training
episodes exist depends on ``FLYWHEEL_EPISODE_KEY``:

- with the key, workers sign their episode URLs (infra/tickets.py) and the gateway admits a call on
  the ticket alone; it reads nothing of ``flywheel.episodes``, so its cost does not grow with other
  gateways' traffic, and it keeps ``call_seq`` across restarts in its own journal (gateway/episodes/seqs.py);
- without it, it subscribes to ``flywheel.episodes`` (opens/closes episodes, and numbers calls after
  every recorded one; per-replica consumer group ``gateway.<gateway_id>``) and serves once it has read
  the topic to its end.

Production sessions and their feedback are ``Gateway.sessions`` (gateway/episodes/sessions.py). Idle
production sessions are closed by one owner, the reward service (it sees every gateway's calls of a
session); the gateway forgets a session when that ``EpisodeFinished`` arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from gateway.control import Admission, ControlTopic, DrainResult, read_to_end
from gateway.episodes.registry import EpisodeRegistry, EpisodeState
from gateway.episodes.seqs import SeqJournal
from gateway.episodes.sessions import ProductionSessions
from gateway.errors import NotFoundError, ServiceUnavailableError
from gateway.keys import KeyStore
from gateway.metrics import GatewayMetrics
from gateway.prompts import PromptStore
from gateway.protocol import FinishEpisodeRequest, OpenEpisodeRequest, RewardRequest
from gateway.protocols.response_store import ResponseStore
from gateway.quotas import TenantQuotas
from gateway.recording.publishing import Recorder, Spool
from gateway.releases import build_release_router
from gateway.serving import CallService
from gateway.settings import GatewaySettings
from gateway.upstream.client import Upstream
from gateway.upstream.model_names import build_model_names
from gateway.upstream.routing import RoutedPool, build_pool
from infra.bus.base import Bus, Message, Subscription
from infra.logging import get_logger
from infra.policies import PolicyMap
from infra.tickets import EpisodeTicket, TicketError, episode_id_of
from schemas import (
    CONTROL,
    EPISODES,
    AnyEvent,
    EpisodeFinished,
    EpisodeSource,
    EpisodeStarted,
    EpisodeStatus,
    EventDecodeError,
    LLMCallRecorded,
    Mode,
    PromptVersionRequested,
    RewardOrigin,
    RewardReported,
    Task,
    decode_any,
    new_episode_id,
)

log = get_logger("gateway")


class Gateway:
    def __init__(
        self,
        settings: GatewaySettings,
        bus: Bus,
        upstreams: Sequence[Upstream],
        *,
        keystore: KeyStore | None = None,
        keep_calls_episodes: int = 256,
        release_slots: Sequence[Upstream] = (),
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.id = settings.gateway_id
        self.keystore = keystore
        self.metrics = GatewayMetrics()
        self.quotas = TenantQuotas(settings, self.metrics)  # per tenant: sessions, bytes, calls, tokens
        for upstream in upstreams:  # the policy's servers: their tokenizer is the one configured
            upstream.tokenizer = upstream.tokenizer or settings.tokenizer_fingerprint or None
        self.pool = build_pool(
            upstreams,
            settings.gateway_model_routes,
            kind=settings.upstream_kind,
            api_key=settings.upstream_api_key,
            timeout_s=settings.upstream_timeout_s,
            retries=settings.upstream_retries,
            backoff_s=settings.upstream_backoff_s,
        )
        self.episodes = EpisodeRegistry(max_episodes=settings.max_episodes, wait_s=settings.episode_wait_s)
        self.tickets = settings.ticket_key()
        self.admission = Admission(
            weight_version=settings.initial_weight_version, hold_s=settings.pause_hold_s
        )
        # one spool per data dir, not per process: a restarted gateway drains what its predecessor spooled
        spool_path = settings.data_dir / "gateway" / "spool.sqlite"
        self.recorder = Recorder(bus, Spool(spool_path))
        self.prompts = PromptStore(settings.data_dir / "gateway" / "prompt.json")
        self.releases = build_release_router(settings, release_slots)
        self.calls = CallService(
            pool=self.pool,
            episodes=self.episodes,
            recorder=self.recorder,
            admission=self.admission,
            metrics=self.metrics,
            producer=f"gateway:{self.id}",
            on_recorded=self.quotas.charging(self._remember_call),
            prompts=self.prompts,
            tokens_in=settings.tokens_in,
            policies=PolicyMap.parse(settings.policies),
            releases=self.releases,
            model_names=build_model_names(settings, self.pool),
        )
        # what a Responses API previous_response_id resolves to, bounded per tenant too
        self.responses = ResponseStore(
            per_tenant_bytes=settings.tenant_response_store_bytes, on_evicted=self.quotas.evicted
        )
        self.sessions = ProductionSessions(
            settings,
            self.episodes,
            self.metrics,
            producer=f"gateway:{self.id}",
            publish=self.publish,
            finish=self._finish,
            quotas=self.quotas,
        )
        self._recent: OrderedDict[str, list[LLMCallRecorded]] = OrderedDict()
        self._keep_calls_episodes = keep_calls_episodes
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.started = False
        # cleared by start() until the episodes topic was read to its end (a gateway that is never
        # started, as in unit tests, serves at once)
        self.caught_up = asyncio.Event()
        self.caught_up.set()
        # parts of a larger process still starting (the embedded stack): /readyz answers 503 until empty
        self.starting: set[str] = set()
        self.control = ControlTopic(
            settings,
            bus,
            admission=self.admission,
            admission_for=self.calls.admission_for,
            metrics=self.metrics,
            prompts=self.prompts,
            publish=self.publish,
            starting=self.starting,
            releases=self.releases,
        )

    # ------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.started:
            return
        if self.tickets is not None:
            journal = SeqJournal(self.settings.data_dir / "gateway" / "seqs.sqlite")
            await asyncio.to_thread(self.episodes.use_journal, journal)
        await asyncio.to_thread(self._calls_in_spool)
        self.recorder.start()
        group = f"gateway.{self.id}"
        if self.tickets is None:  # episodes learnt from the topic: read it, and to its end first
            self._subs.append(
                await self.bus.subscribe(
                    EPISODES,
                    group,
                    self._on_episode_event,
                    from_beginning=self.settings.episodes_from_beginning,
                )
            )
            self.starting.add("catching-up")
            self.caught_up.clear()
            await self._catch_up(group)  # bounded (catch_up_timeout_s); quick on a topic read to its end
        self._subs.append(
            await self.bus.subscribe(
                CONTROL, f"{group}.control", self.control.on_control, from_beginning=False
            )
        )
        if self.calls.policies:
            await self.control.learn_adapter_versions(group)
        if self.releases is not None:
            await self.control.learn_releases(group)
        # Everything alive now (modules, pydantic schemas, the app) lives as long as the process: move it
        # out of the cyclic GC's reach, so a full collection does not walk it in the middle of calls
        # (those pauses were the gateway's p99). Reference counting still frees what is dropped.
        gc.collect()
        gc.freeze()
        self._tasks.append(asyncio.create_task(self._forget_abandoned(), name="gateway-episode-sweeper"))
        self.started = True
        log.info("gateway started", gateway_id=self.id, upstreams=[u.url for u in self.pool.upstreams])

    def _calls_in_spool(self) -> None:
        """Calls a predecessor spooled and the bus has not seen yet also number their episodes."""
        for topic, data in self.recorder.spool.all_rows():
            if topic != EPISODES:
                continue
            try:
                event = decode_any(data)
            except EventDecodeError:
                continue
            if isinstance(event, LLMCallRecorded):
                self.episodes.saw_call(event.episode_id, event.call_seq)

    async def _catch_up(self, group: str) -> None:
        """Serve calls only once ``flywheel.episodes`` has been read up to its end: every call recorded
        before this process started has then numbered its episode (``EpisodeRegistry.saw_call``).

        Bounded by ``catch_up_timeout_s``: a bus that cannot say its lag (down) does not keep the
        gateway from serving; an episode it could not learn about is unknown to it anyway (404).
        """
        try:
            if not await read_to_end(self.bus, EPISODES, group, self.settings.catch_up_timeout_s):
                log.warning("serving before the episodes topic was read to its end", group=group)
        finally:
            self.starting.discard("catching-up")
            self.caught_up.set()

    async def wait_caught_up(self) -> None:
        """Until :meth:`_catch_up` is done; a call that waits longer than that is a 503."""
        try:
            async with asyncio.timeout(self.settings.catch_up_timeout_s + 1.0):
                await self.caught_up.wait()
        except TimeoutError:
            raise ServiceUnavailableError(
                "the gateway is still reading the episodes topic", code="catching_up"
            ) from None

    async def _forget_abandoned(self) -> None:
        """Forget abandoned episodes (gateway/episodes/registry.py), a tenth of the idle timeout at a time."""
        every = min(30.0, self.settings.idle_timeout_s / 10)
        while True:
            await asyncio.sleep(every)
            self.forget_abandoned()

    def forget_abandoned(self) -> int:
        """Forget the open episodes that are abandoned now; logs each and counts them by source."""
        gone = self.episodes.expire(self.settings.idle_timeout_s)
        for state in gone:
            self.metrics.forgotten_episodes.labels(state.source.value).inc()
            log.info(
                "episode forgotten",
                episode_id=state.episode_id,
                source=state.source.value,
                calls=state.calls,
                why="ticket expired" if state.expires_at is not None else "idle",
            )
        if gone:
            self.metrics.open_episodes.set(len(self.episodes))
        return len(gone)

    async def stop(self) -> None:
        self.started = False
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for sub in self._subs:
            await sub.stop()
        self._subs.clear()
        await self.recorder.stop()
        await self.pool.aclose()
        if self.releases is not None:
            await self.releases.aclose()  # the slots it connected to itself
        self.recorder.spool.close()
        if self.episodes.journal is not None:
            self.episodes.journal.close()
            self.episodes.journal = None

    # ------------------------------------------------------------------------------ bus input
    async def _on_episode_event(self, msg: Message) -> None:
        event = msg.event
        if isinstance(event, EpisodeStarted):
            self.episodes.open(event)
        elif isinstance(event, EpisodeFinished):
            self.episodes.finish(event.episode_id)
        elif isinstance(event, LLMCallRecorded):
            self.episodes.saw_call(event.episode_id, event.call_seq)  # a restarted or other gateway's
            if event.producer != self.calls.producer:
                self._remember_call(event)  # our own calls were remembered when they were recorded
        self.metrics.open_episodes.set(len(self.episodes))

    def _remember_call(self, event: LLMCallRecorded) -> None:
        calls = self._recent.get(event.episode_id)
        if calls is None:
            calls = self._recent[event.episode_id] = []
            while len(self._recent) > self._keep_calls_episodes:
                self._recent.popitem(last=False)
        if len(calls) < 1024 and all(c.event_id != event.event_id for c in calls[-8:]):
            calls.append(event)

    # -------------------------------------------------------------------------- publishing
    async def publish(self, event: AnyEvent) -> None:
        await self.recorder.record(event)

    # ------------------------------------------------------------- pause/resume (gateway/control.py)
    async def pause(self, version: int | None, drain_timeout_s: float | None = None) -> DrainResult:
        return await self.control.pause(version, drain_timeout_s)

    async def resume(self, version: int | None = None) -> int:
        return await self.control.resume(version)

    async def activate_prompt(self, event: PromptVersionRequested) -> None:
        await self.control.activate_prompt(event)

    # ------------------------------------------------------------------------------ episodes
    async def training_episode(self, segment: str) -> EpisodeState:
        """The open training episode an episode URL's path segment names: a ticket, or a plain id."""
        if self.tickets is None:
            return await self.episodes.training(segment)
        try:
            ticket = self.tickets.read(segment)
        except TicketError as exc:
            episode_id = episode_id_of(segment)
            raise NotFoundError(str(exc), code="episode_not_found", episode_id=episode_id[:64]) from None
        if ticket is not None:
            return self.episodes.admit(ticket)
        # A plain id is served only when this gateway opened the episode itself (it reads no topic).
        try:
            return await self.episodes.training(segment, wait=False)
        except NotFoundError as exc:
            exc.message += (
                "; this gateway admits workers' episodes by signed URL, so the worker needs the same "
                "FLYWHEEL_EPISODE_KEY"
            )
            raise

    def episode_segment(self, state: EpisodeState) -> str:
        """The path segment of an episode opened here: signed when this gateway has the key."""
        if self.tickets is None:
            return state.episode_id
        expires = time.time() + self.settings.opened_episode_ttl_s
        return self.tickets.sign(EpisodeTicket(state.episode_id, state.group_id, expires))

    async def open_training(self, req: OpenEpisodeRequest) -> EpisodeState:
        started = EpisodeStarted(
            producer=f"gateway:{self.id}",
            episode_id=req.episode_id or new_episode_id(),
            source=EpisodeSource.live,
            mode=Mode(req.mode),
            model=req.model or self.settings.model,
            task=Task(task_id=req.task_id) if req.task_id else None,
            group_id=req.group_id,
        )
        await self.publish(started)
        state = self.episodes.open(started)
        self.metrics.open_episodes.set(len(self.episodes))
        return state

    async def finish_episode(self, episode_id: str, req: FinishEpisodeRequest) -> None:
        state = self.episodes.get(episode_id)
        if state is None:
            raise NotFoundError(f"episode {episode_id[:64]!r} is not open", code="episode_not_found")
        await self._finish(
            state, EpisodeStatus(req.status), output=req.output, error=req.error, reward=req.reward
        )

    async def _finish(
        self,
        state: EpisodeState,
        status: EpisodeStatus,
        *,
        output: Any = None,
        error: str | None = None,
        reward: float | None = None,
    ) -> None:
        await self.publish(
            EpisodeFinished(
                producer=f"gateway:{self.id}",
                episode_id=state.episode_id,
                status=status,
                output=output,
                error=error,
                reported_reward=reward,
                num_calls=state.calls,
                task_id=state.task_id,
                group_id=state.group_id,
                attempt=state.attempt,
                source=state.source,
                tenant=state.tenant,
            )
        )
        self.episodes.finish(state.episode_id)
        self.metrics.open_episodes.set(len(self.episodes))

    async def report_reward(self, state: EpisodeState, req: RewardRequest) -> RewardReported:
        event = RewardReported(
            producer=f"gateway:{self.id}",
            episode_id=state.episode_id,
            value=req.value,
            call_seq=req.call_index,
            origin=RewardOrigin.agent,
            message=req.message,
            tenant=state.tenant,
        )
        await self.publish(event)
        return event

    # ------------------------------------------------------------------------------- queries
    def recent_calls(self, episode_id: str) -> list[LLMCallRecorded]:
        return sorted(self._recent.get(episode_id, []), key=lambda e: e.call_seq)

    def describe_episode(self, episode_id: str) -> dict[str, Any]:
        state = self.episodes.get(episode_id)
        calls = self.recent_calls(episode_id)
        if state is None and not calls:
            raise NotFoundError(f"unknown episode {episode_id[:64]!r}", code="episode_not_found")
        return {
            "episode": state.summary() if state else {"episode_id": episode_id, "finished": True},
            "open": state is not None,
            "calls": [c.model_dump(mode="json") for c in calls],
        }

    def state(self) -> dict[str, Any]:
        return {
            "gateway_id": self.id,
            "paused": self.admission.paused,
            "pending_version": self.admission.pending_version,
            "weight_version": self.admission.weight_version,
            "in_flight": self.admission.in_flight,
            "open_episodes": len(self.episodes),
            # how it learns training episodes: signed URLs (FLYWHEEL_EPISODE_KEY), or flywheel.episodes
            "episode_admission": "ticket" if self.tickets is not None else "topic",
            "spool_depth": self.recorder.spool_depth,
            "prefix_mismatches": self.episodes.prefix_mismatches,
            **self.prompts.state(),
            "upstreams": [{"url": u.url, "kind": u.kind.value} for u in self.pool.upstreams],
            "model_routes": {
                model: [{"url": u.url, "kind": u.kind.value} for u in pool.upstreams]
                for model, pool in (self.pool.routes if isinstance(self.pool, RoutedPool) else {}).items()
            },
        }
