"""The reward service on the in-process bus: scoring, production sessions, abandonment, restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import JsonValue

from infra.bus.memory import MemoryBus
from reward_service.feedback import FeedbackMapping
from reward_service.judge import Judge
from reward_service.scoring import Scoring
from reward_service.service import RewardService, scored_event_id
from reward_service.state import EpisodeStore
from schemas import (
    EPISODES,
    TRANSITIONS,
    EpisodeFinished,
    EpisodeScored,
    EpisodeSource,
    EpisodeStarted,
    EpisodeStatus,
    RewardOrigin,
    RewardReported,
    ScorerSpec,
)
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream
from tests.unit.reward.calls import call, finished, started
from tests.unit.worker.collect import Events


def service(
    bus: MemoryBus, store: EpisodeStore | None = None, judge_reply: str = "SCORE: 1", **kw: object
) -> RewardService:
    cfg = FakeUpstreamConfig(reply=judge_reply, use_tools=False)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_fake_upstream(cfg)), base_url="http://j/v1/"
    )
    scoring = Scoring(
        fill_value=0.0, production_scorer="none", feedback=FeedbackMapping(), judge=Judge(client)
    )
    return RewardService(bus, scoring, store or EpisodeStore(), sweep_interval_s=0.05, **kw)  # type: ignore[arg-type]


@pytest.fixture
async def env() -> AsyncIterator[tuple[MemoryBus, Events]]:
    async with MemoryBus() as bus:
        events = await Events().attach(bus, TRANSITIONS, EPISODES)
        yield bus, events
        await events.stop()


async def publish_episode(
    bus: MemoryBus,
    ep: str,
    spec: ScorerSpec,
    output: JsonValue = None,
    *,
    idx: int = 0,
    group: str = "g",
    **kw: Any,
) -> None:
    await bus.publish(EPISODES, started(ep, spec, idx=idx, group=group, **kw))
    await bus.publish(EPISODES, call(ep, 0, [1, 2], [3]))
    await bus.publish(EPISODES, call(ep, 1, [1, 2, 3, 9], [4]))
    await bus.publish(EPISODES, finished(ep, output, idx=idx, group=group))


@pytest.mark.timeout(10)
async def test_finished_episode_is_scored_with_transitions(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    svc = service(bus)
    await svc.start()
    ep = "1" * 32
    await publish_episode(bus, ep, ScorerSpec(name="exact"), "42", answer="42", group="grp", size=4, idx=2)
    [scored] = await events.wait_for(EpisodeScored)
    assert scored.event_id == scored_event_id(ep)
    assert (scored.reward, scored.reward_source, scored.group_id, scored.group_size) == (
        1.0,
        "exact",
        "grp",
        4,
    )
    assert scored.sample_index == 2 and scored.num_calls == 2 and scored.unusable_reason is None
    [t] = scored.transitions
    assert t.response_ids == [3, 9, 4] and t.response_mask == [1, 0, 1] and t.reward == 1.0
    await bus.publish(EPISODES, finished(ep, "again"))  # a duplicate finish is not scored twice
    await bus.publish(EPISODES, finished("2" * 32, None))  # no state at all
    [_, lost] = await events.wait_for(EpisodeScored, count=2)
    assert lost.unusable_reason == "state_lost"
    assert len(events.of(EpisodeScored, episode_id=ep)) == 1
    await svc.stop()


@pytest.mark.timeout(10)
async def test_a_scorer_that_raises_is_recorded_not_dropped(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    svc = service(bus)
    await svc.start()
    ep = "3" * 32
    await publish_episode(bus, ep, ScorerSpec(name="function", ref="tests.unit.reward.user_scorers:explodes"))
    [scored] = await events.wait_for(EpisodeScored)
    assert scored.reward is None and "scorer bug" in (scored.score_error or "")
    assert scored.unusable_reason == "score_error" and len(scored.transitions) == 1
    assert svc.stats.score_errors == 1
    await svc.stop()


@pytest.mark.timeout(10)
async def test_no_calls_episode_has_a_reason(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    svc = service(bus)
    await svc.start()
    ep = "4" * 32
    await bus.publish(EPISODES, started(ep))
    await bus.publish(EPISODES, finished(ep, None, 1.0, status=EpisodeStatus.error))
    [scored] = await events.wait_for(EpisodeScored)
    assert (
        scored.unusable_reason == "no_calls" and scored.reward == 1.0 and scored.status is EpisodeStatus.error
    )
    assert svc.stats.unusable == {"no_calls": 1}
    await svc.stop()


@pytest.mark.timeout(10)
async def test_production_session_idle_close_and_feedback(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    svc = service(bus, idle_timeout_s=0.2)
    await svc.start()
    ep, quiet = "5" * 32, "6" * 32
    for e in (ep, quiet):
        await bus.publish(
            EPISODES, EpisodeStarted(episode_id=e, source=EpisodeSource.production, tenant="acme")
        )
        await bus.publish(EPISODES, call(e, 0, [1], [2], source=EpisodeSource.production))
    await bus.publish(
        EPISODES, RewardReported(episode_id=ep, origin=RewardOrigin.feedback, rating=1, tenant="acme")
    )
    scored = await events.wait_for(EpisodeScored, count=2)
    by_ep = {s.episode_id: s for s in scored}
    assert (by_ep[ep].reward, by_ep[ep].reward_source, by_ep[ep].tenant) == (1.0, "feedback", "acme")
    assert by_ep[ep].source is EpisodeSource.production and by_ep[ep].group_id == ep
    assert by_ep[quiet].reward is None and by_ep[quiet].unusable_reason == "unscored"
    closes = events.of(EpisodeFinished)
    assert {c.episode_id for c in closes} == {ep, quiet} and all(c.status is EpisodeStatus.ok for c in closes)
    await svc.stop()


@pytest.mark.timeout(10)
async def test_abandoned_live_episode_is_closed_as_superseded(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    svc = service(bus, abandon_grace_s=0.0)
    await svc.start()
    ep = "7" * 32
    await bus.publish(EPISODES, started(ep, deadline_s=0.1))
    await bus.publish(EPISODES, call(ep, 0, [1], [2]))
    [scored] = await events.wait_for(EpisodeScored)
    assert scored.status is EpisodeStatus.cancelled and scored.superseded
    [fin] = events.of(EpisodeFinished)
    assert fin.superseded and "abandoned" in (fin.error or "")
    await svc.stop()


@pytest.mark.timeout(10)
async def test_an_episode_opened_by_hand_and_never_finished_is_closed_when_idle(
    env: tuple[MemoryBus, Events],
) -> None:
    """An agent that crashed: opened through the admin API (no deadline), a call, then nothing. The
    service closes it after the idle timeout, says why, and holds nothing of it any more."""
    bus, events = env
    svc = service(bus, idle_timeout_s=0.2)
    await svc.start()
    ep = "8" * 32
    await bus.publish(EPISODES, EpisodeStarted(episode_id=ep, source=EpisodeSource.live))
    await bus.publish(EPISODES, call(ep, 0, [1], [2]))
    [scored] = await events.wait_for(EpisodeScored)
    assert scored.status is EpisodeStatus.cancelled and not scored.superseded
    [fin] = events.of(EpisodeFinished)
    assert fin.error is not None and "no EpisodeFinished" in fin.error and "EpisodeStarted" not in fin.error
    assert ep not in svc.store.open and ep in svc.store.done
    await svc.stop()


@pytest.mark.timeout(10)
async def test_judge_ranking_waits_for_the_whole_group(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    svc = service(bus, judge_reply="RANKING: B > A")
    await svc.start()
    spec = ScorerSpec(name="judge", options={"mode": "rank"})
    await publish_episode(bus, "8" * 32, spec, "first", group="rg", size=2, idx=0)
    retried = "a" * 32  # a superseded attempt is scored at once and does not count
    await bus.publish(EPISODES, started(retried, spec, group="rg", size=2, idx=1))
    await bus.publish(EPISODES, finished(retried, None, group="rg", idx=1, superseded=True))
    await events.wait_for(EpisodeScored, episode_id=retried)
    assert not events.of(EpisodeScored, episode_id="8" * 32)
    await publish_episode(bus, "9" * 32, spec, "second", group="rg", size=2, idx=1)
    scored = await events.wait_for(EpisodeScored, count=3)
    by_ep = {s.episode_id: s.reward for s in scored}
    assert by_ep["8" * 32] == 0.0 and by_ep["9" * 32] == 1.0
    await svc.stop()


@pytest.mark.timeout(10)
async def test_state_survives_a_restart(tmp_path: Path) -> None:
    journal = tmp_path / "journal.sqlite"
    ep = "b" * 32
    async with MemoryBus() as bus:
        svc = service(bus, EpisodeStore(journal))
        await svc.start()
        await bus.publish(EPISODES, started(ep, ScorerSpec(name="agent")))
        await bus.publish(EPISODES, call(ep, 0, [1], [2]))
        events = await Events().attach(bus, EPISODES, group="probe")
        await events.wait_for(EpisodeStarted)
        await events.wait_for(type(call(ep, 0, [1], [2])))
        for _ in range(100):  # wait until the service's own group has committed both
            if await bus.lag(EPISODES, "reward-service") == 0:
                break
            await asyncio.sleep(0.02)
        await svc.stop()
        await events.stop()
    async with MemoryBus() as bus:  # a fresh bus: only the journal remembers the episode
        events = await Events().attach(bus, TRANSITIONS)
        svc = service(bus, EpisodeStore(journal))
        await svc.start()
        await bus.publish(EPISODES, call(ep, 1, [1, 2, 5], [6]))
        await bus.publish(EPISODES, finished(ep, None, 0.5))
        [scored] = await events.wait_for(EpisodeScored)
        assert scored.reward == 0.5 and scored.group_id == "g" and scored.num_calls == 2
        assert scored.transitions[0].response_ids == [2, 5, 6]
        await svc.stop()
        await events.stop()
    reopened = EpisodeStore(journal)
    assert reopened.open == {} and ep in reopened.done
    reopened.shutdown()


def test_started_deadline_helper() -> None:
    s = started("c" * 32, deadline_s=5)
    assert s.deadline_at is not None and s.deadline_at > datetime.now(UTC) + timedelta(seconds=4)
