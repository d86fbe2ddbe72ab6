"""Feedback after a production session was scored: a new revision, deduplicated, durable, or dead-lettered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from infra.bus.memory import MemoryBus
from reward_service.state import EpisodeStore
from schemas import (
    DEADLETTER,
    EPISODES,
    TRANSITIONS,
    DeadLetter,
    EpisodeFinished,
    EpisodeScored,
    EpisodeSource,
    EpisodeStarted,
    EpisodeStatus,
    RewardOrigin,
    RewardReported,
)
from tests.unit.reward.calls import call
from tests.unit.reward.test_reward_service import service
from tests.unit.worker.collect import Events

pytestmark = pytest.mark.timeout(20)
PROD = EpisodeSource.production


@pytest.fixture
async def env() -> AsyncIterator[tuple[MemoryBus, Events]]:
    async with MemoryBus() as bus:
        events = await Events().attach(bus, TRANSITIONS, DEADLETTER)
        yield bus, events
        await events.stop()


async def _session(bus: MemoryBus, ep: str, *, rating: int | None = None) -> None:
    await bus.publish(EPISODES, EpisodeStarted(episode_id=ep, source=PROD, tenant="acme"))
    await bus.publish(EPISODES, call(ep, 0, [1, 2], [3, 4], source=PROD))
    if rating is not None:
        await bus.publish(EPISODES, _feedback(ep, rating))
    await bus.publish(EPISODES, EpisodeFinished(episode_id=ep, status=EpisodeStatus.ok, source=PROD))


def _feedback(ep: str, rating: int, event_id: str | None = None) -> RewardReported:
    extra = {"event_id": event_id} if event_id else {}
    return RewardReported(episode_id=ep, origin=RewardOrigin.feedback, rating=rating, tenant="acme", **extra)


async def test_feedback_after_scoring_publishes_a_new_revision_once(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    svc = service(bus)
    await svc.start()
    ep = "a" * 32
    await _session(bus, ep)
    [first] = await events.wait_for(EpisodeScored)
    assert first.reward is None and first.unusable_reason == "unscored" and first.score_revision == 0
    late = _feedback(ep, 1, event_id="f" * 32)
    await bus.publish(EPISODES, late)
    [_, second] = await events.wait_for(EpisodeScored, count=2)
    assert (second.score_revision, second.reward, second.reward_source) == (1, 1.0, "feedback")
    assert second.event_id != first.event_id and second.unusable_reason is None
    assert [t.prompt_ids + t.response_ids for t in second.transitions] == [[1, 2, 3, 4]]
    assert all(t.reward == 1.0 for t in second.transitions)
    await bus.publish(EPISODES, late)  # redelivered: already applied
    await bus.publish(EPISODES, _feedback(ep, 1))  # the same reward again: nothing to re-score
    await bus.publish(EPISODES, _feedback(ep, -1))
    [*_, third] = await events.wait_for(EpisodeScored, count=3)
    assert (third.score_revision, third.reward) == (2, 0.0)
    assert len(events.of(EpisodeScored)) == 3
    assert (svc.stats.rescored, svc.stats.feedback_unchanged, svc.stats.scored) == (2, 1, 1)
    await svc.stop()


async def test_a_rescore_is_durable_and_its_event_id_deterministic(tmp_path: Path) -> None:
    journal, ep = tmp_path / "journal.sqlite", "b" * 32
    async with MemoryBus() as bus:
        events = await Events().attach(bus, TRANSITIONS)
        svc = service(bus, EpisodeStore(journal))
        await svc.start()
        await _session(bus, ep, rating=-1)
        [first] = await events.wait_for(EpisodeScored)
        assert first.reward == 0.0
        await svc.stop()
        await events.stop()
    late = _feedback(ep, 1)
    seen: list[EpisodeScored] = []
    for _ in range(2):  # a restart, then the same feedback redelivered to a fresh store on the journal
        async with MemoryBus() as bus:
            events = await Events().attach(bus, TRANSITIONS)
            svc = service(bus, EpisodeStore(journal))
            await svc.start()
            await bus.publish(EPISODES, late)
            if not seen:
                seen += await events.wait_for(EpisodeScored)
            else:  # already applied and made durable: no new revision
                await bus.publish(EPISODES, _feedback(ep, -1))
                seen += await events.wait_for(EpisodeScored)
            await svc.stop()
            await events.stop()
    assert [(s.score_revision, s.reward) for s in seen] == [(1, 1.0), (2, 0.0)]
    assert len({s.event_id for s in seen} | {first.event_id}) == 3


async def test_feedback_for_a_session_no_longer_held_is_dead_lettered(env: tuple[MemoryBus, Events]) -> None:
    bus, events = env
    svc = service(bus, EpisodeStore(retain=1))
    await svc.start()
    old, new = "c" * 32, "d" * 32
    await _session(bus, old)
    await _session(bus, new)  # retain=1: the older session is evicted
    await events.wait_for(EpisodeScored, count=2)
    await bus.publish(EPISODES, _feedback(old, 1))
    [dead] = await events.wait_for(DeadLetter)
    assert dead.key == old and dead.error_type == "FeedbackNotHeld" and "no longer holds" in dead.error
    assert svc.stats.feedback_unheld == 1
    await bus.publish(EPISODES, _feedback(new, 1))  # the one still held is re-scored
    [rescored] = await events.wait_for(EpisodeScored, score_revision=1)
    assert rescored.episode_id == new
    await svc.stop()


def test_retention_is_bounded_by_age_and_count(tmp_path: Path) -> None:
    store = EpisodeStore(tmp_path / "j.sqlite", retain=2, retain_s=3600)
    for i in range(3):
        ep = f"{i}" * 32
        store.add(EpisodeStarted(episode_id=ep, source=PROD))
        store.add(call(ep, 0, [1], [2], source=PROD))
        store.close(ep)
    store.add(EpisodeStarted(episode_id="9" * 32))  # a live episode is not retained
    store.close("9" * 32)
    assert list(store.retained) == ["1" * 32, "2" * 32]
    held = store.retained_record("2" * 32)
    assert held is not None and held[1] == 0 and held[0].calls[0].request == ""  # text not kept
    store.flush()
    store.retain_s = 0.0
    assert store.retained_record("2" * 32) is None and not store.retained
    store.shutdown()
