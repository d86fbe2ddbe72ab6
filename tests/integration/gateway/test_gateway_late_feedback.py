"""Late production feedback through the real gateway and reward service, on both buses.

A production session (the real ``openai`` SDK with a tenant key and ``X-Flywheel-Session``) is ended and
scored; feedback that arrives afterwards re-scores it: a second ``EpisodeScored`` for the same episode,
``score_revision`` 1, with the new reward. Past the feedback window the gateway answers 409.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from infra.bus.base import Bus
from reward_service.app import build
from reward_service.settings import RewardSettings
from schemas import TRANSITIONS, EpisodeFinished, EpisodeScored
from tests.fakes.gateway_harness import Collector, GatewayHarness
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.timeout(90)
MSGS = [{"role": "user", "content": "What is 2+2?"}]


async def test_feedback_after_the_session_ended_rescores_it(
    bus: Bus, bus_kind: str, topic_prefix: str, tmp_path: Path
) -> None:
    async with GatewayHarness(tmp_path, bus=bus, feedback_window_s=600.0) as h:
        # on Kafka the reward service journals (and retains scored sessions) in SQLite
        settings = RewardSettings(
            bus=bus_kind, topic_prefix=topic_prefix, data_dir=tmp_path, feedback_window_s=600.0
        )
        reward = build(settings, bus)
        scored = await Collector().attach(bus, TRANSITIONS, group="late-feedback")
        await reward.start()
        try:
            _, key = h.keystore.create("acme")
            auth = {"Authorization": f"Bearer {key}"}
            client = openai.AsyncOpenAI(
                base_url="http://gateway/v1",
                api_key=key,
                http_client=h.client,
                default_headers={"X-Flywheel-Session": "chat-1"},
                max_retries=0,
            )
            raw = await client.chat.completions.with_raw_response.create(
                model="policy", messages=[{"role": "user", "content": "What is 2+2?"}]
            )
            episode_id = raw.headers["X-Flywheel-Episode"]
            assert raw.parse().choices[0].message.content
            end = await h.client.post("/v1/sessions/chat-1/end", headers=auth)
            assert end.status_code == 200 and end.json()["episode_id"] == episode_id

            def of_episode(e: object) -> bool:
                return isinstance(e, EpisodeScored) and e.episode_id == episode_id

            (first,) = await scored.wait_for(of_episode, within_s=30)
            assert first.score_revision == 0 and first.reward is None and first.unusable_reason == "unscored"

            fb = await h.client.post("/v1/feedback", json={"session_id": "chat-1", "rating": 1}, headers=auth)
            assert fb.status_code == 200, fb.text
            _, second = await scored.wait_for(of_episode, within_s=30, count=2)
            assert fb.json()["rescore"] is True
            assert (second.score_revision, second.reward, second.reward_source) == (1, 1.0, "feedback")
            assert second.event_id != first.event_id and second.unusable_reason is None
            assert second.transitions and all(t.reward == 1.0 for t in second.transitions)
            assert second.transitions[0].prompt_ids == first.transitions[0].prompt_ids

            h.gateway.settings.feedback_window_s = 1e-6  # the window has passed
            late = await h.client.post(
                "/v1/feedback", json={"session_id": "chat-1", "rating": -1}, headers=auth
            )
            assert late.status_code == 409 and late.json()["error"]["code"] == "feedback_window_closed"
        finally:
            await reward.stop()
            await scored.stop()


async def test_an_idle_session_is_closed_by_the_reward_service_and_forgotten_by_the_gateway(
    bus: Bus, bus_kind: str, topic_prefix: str, tmp_path: Path
) -> None:
    """One owner closes idle production sessions: the reward service, which sees every gateway's calls."""
    async with GatewayHarness(tmp_path, bus=bus) as h:
        settings = RewardSettings(
            bus=bus_kind,
            topic_prefix=topic_prefix,
            data_dir=tmp_path,
            idle_timeout_s=0.5,
            sweep_interval_s=0.1,
        )
        reward = build(settings, bus)
        await reward.start()
        try:
            _, key = h.keystore.create("acme")
            headers = {"Authorization": f"Bearer {key}", "X-Flywheel-Session": "idle-1"}
            first = await h.client.post("/v1/chat/completions", json={"messages": MSGS}, headers=headers)
            episode_id = first.headers["X-Flywheel-Episode"]

            def closed(e: object) -> bool:
                return isinstance(e, EpisodeFinished) and e.episode_id == episode_id

            (fin,) = await h.events.wait_for(closed, within_s=20)
            assert fin.num_calls == 1 and fin.producer.startswith("reward")
            # the gateway reads the same EpisodeFinished off the bus and forgets the session
            await wait_until(lambda: h.gateway.episodes.session("acme", "idle-1") is None, what="forgotten")
            again = await h.client.post("/v1/chat/completions", json={"messages": MSGS}, headers=headers)
            assert again.status_code == 200
            assert again.headers["X-Flywheel-Episode"] != episode_id  # the closed session is not reused
        finally:
            await reward.stop()
