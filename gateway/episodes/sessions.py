"""Production sessions: the episodes a tenant's calls open, their end, and the feedback users give.

A production call names its session (``X-Flywheel-Session``, else the body's ``metadata.session_id``,
``metadata.session`` or ``metadata.conversation_id``, else its ``user``: ``gateway.routes._session_of``); the
first call of a session opens its episode (``EpisodeStarted``, source ``production``), later ones extend
it, and ``POST /v1/sessions/{id}/end`` (or the reward service's idle timeout) ends it. A tenant holding
``tenant_max_sessions`` open sessions cannot open another (429, gateway/quotas.py). Feedback
(``POST /v1/feedback``) names a session or one of its calls and becomes a ``RewardReported`` with origin
``feedback``: an open session is scored with it when it ends; an ended one within ``feedback_window_s``
is re-scored (a new ``EpisodeScored``, one ``score_revision`` up); past the window, or when this gateway
no longer remembers when the session ended, the answer is 409 and nothing is published.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gateway.episodes.registry import EpisodeRegistry, EpisodeState
from gateway.errors import ConflictError, NotFoundError, ValidationFailedError
from gateway.metrics import GatewayMetrics
from gateway.protocol import FeedbackRequest
from gateway.quotas import TenantQuotas
from gateway.settings import GatewaySettings
from schemas import (
    AnyEvent,
    EpisodeSource,
    EpisodeStarted,
    EpisodeStatus,
    Mode,
    RewardOrigin,
    RewardReported,
    new_episode_id,
)

Publish = Callable[[AnyEvent], Awaitable[None]]
Finish = Callable[[EpisodeState, EpisodeStatus], Awaitable[None]]


class ProductionSessions:
    """What the gateway's production routes call; it shares the gateway's episode registry and bus."""

    def __init__(
        self,
        settings: GatewaySettings,
        episodes: EpisodeRegistry,
        metrics: GatewayMetrics,
        *,
        producer: str,
        publish: Publish,
        finish: Finish,
        quotas: TenantQuotas | None = None,
    ) -> None:
        self.settings = settings
        self.episodes = episodes
        self.metrics = metrics
        self.producer = producer
        self._publish = publish
        self._finish = finish
        self.quotas = quotas

    async def episode(self, tenant: str, session_id: str | None) -> EpisodeState:
        """The open episode of a tenant's session; opens one (and publishes EpisodeStarted) if needed.
        A call without a session is an episode of its own. A tenant at its session cap gets a 429."""
        session_id = session_id or f"call-{new_episode_id()}"
        state = self.episodes.session(tenant, session_id)
        if state is not None:
            return state
        if self.quotas is not None:
            self.quotas.check_sessions(tenant, self.episodes)
        started = EpisodeStarted(
            producer=self.producer,
            episode_id=new_episode_id(),
            source=EpisodeSource.production,
            mode=Mode.train,
            model=self.settings.model,
            tenant=tenant,
            session_id=session_id,
        )
        state = self.episodes.open(started)
        await self._publish(started)
        self.metrics.open_episodes.set(len(self.episodes))
        return state

    async def end(self, tenant: str, session_id: str) -> str:
        """End a tenant's open session (404 when there is none); returns its episode id."""
        state = self.episodes.session(tenant, session_id)
        if state is None:
            raise NotFoundError(f"no open session {session_id[:256]!r}", code="session_not_found")
        await self._finish(state, EpisodeStatus.ok)
        return state.episode_id

    async def feedback(self, tenant: str, req: FeedbackRequest) -> tuple[RewardReported, bool]:
        """Publish feedback on a session (or one of its calls); returns it and whether the session is
        open. An unknown session or call is 404, one past the feedback window 409 (module docstring)."""
        call_seq: int | None = None
        if req.call_id is not None:
            found = self.episodes.call(req.call_id)
            if found is None or found[1] != tenant:
                raise NotFoundError(f"unknown call {req.call_id!r}", code="call_not_found", param="call_id")
            episode_id, _, call_seq = found
        elif req.session_id is not None:
            maybe = self.episodes.session_episode_id(tenant, req.session_id)
            if maybe is None:
                raise NotFoundError(
                    f"unknown session {req.session_id!r}", code="session_not_found", param="session_id"
                )
            episode_id = maybe
        else:
            raise ValidationFailedError("feedback needs session_id or call_id", param="session_id")
        is_open = self.episodes.get(episode_id) is not None
        if not is_open:
            self._check_window(episode_id)
        event = RewardReported(
            producer=self.producer,
            episode_id=episode_id,
            value=req.score,
            call_seq=call_seq,
            call_id=req.call_id,
            origin=RewardOrigin.feedback,
            message=req.comment,
            rating=req.rating,
            tenant=tenant,
        )
        await self._publish(event)
        return event, is_open

    def _check_window(self, episode_id: str) -> None:
        window = self.settings.feedback_window_s
        ago = self.episodes.ended_s_ago(episode_id)
        if ago is None:
            raise ConflictError(
                f"the session of episode {episode_id} ended and this gateway no longer holds its state, so "
                "the feedback could not be applied to its score; send feedback while the session is open "
                f"or within {window:g}s after it ends",
                code="session_expired",
                episode_id=episode_id,
            )
        if ago > window:
            raise ConflictError(
                f"the session of episode {episode_id} ended {ago:.0f}s ago; feedback is accepted until "
                f"{window:g}s after a session ends (FLYWHEEL_FEEDBACK_WINDOW_S), so it would not change "
                "the session's score",
                code="feedback_window_closed",
                episode_id=episode_id,
            )
