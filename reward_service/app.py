"""The reward service: a consumer group on ``flywheel.episodes`` publishing ``EpisodeScored``.

``build`` wires it from settings (the bus is given: its caller owns it); ``flywheel.assembly``
calls it for every entry point (the embedded stack, and ``flywheel reward``, which runs it alone through
``flywheel.alone``).
"""

from __future__ import annotations

import httpx

from infra.bus.base import Bus
from reward_service.feedback import FeedbackMapping
from reward_service.judge import Judge
from reward_service.scoring import Scoring
from reward_service.selection import CallSelector
from reward_service.service import RewardService
from reward_service.settings import RewardSettings
from reward_service.state import EpisodeStore


def build(
    settings: RewardSettings, bus: Bus, *, judge_client: httpx.AsyncClient | None = None
) -> RewardService:
    if judge_client is None:
        base = settings.judge_base_url or settings.gateway_url.rstrip("/") + "/v1"
        headers = {}
        if key := settings.judge_api_key.get_secret_value():
            headers["Authorization"] = f"Bearer {key}"
        judge_client = httpx.AsyncClient(base_url=base.rstrip("/") + "/", headers=headers, timeout=60.0)
    scoring = Scoring(
        fill_value=settings.fill_value,
        production_scorer=settings.production_scorer,
        feedback=FeedbackMapping(
            settings.feedback_scale, settings.feedback_stars_max, dict(settings.feedback_ratings)
        ),
        judge=Judge(judge_client, model=settings.judge_model),
        timeout_s=settings.scorer_timeout_s,
    )
    return RewardService(
        bus,
        scoring,
        EpisodeStore(
            settings.journal_path(),
            retain=settings.feedback_retain,
            retain_s=settings.feedback_window_s,
            changelog=settings.changelog(),
        ),
        group=settings.reward_group,
        discount=settings.discount,
        idle_timeout_s=settings.idle_timeout_s,
        abandon_grace_s=settings.abandon_grace_s,
        group_timeout_s=settings.group_timeout_s,
        sweep_interval_s=settings.sweep_interval_s,
        max_batch=settings.max_batch,
        batch_wait_s=settings.reward_batch_wait_s,
        selector=CallSelector.parse(settings.train_models, settings.train_system_match),
    )
