"""The reward service's changelog (reward_service/changelog.py): restore, forget, and a partition moving
between two instances of one group on the in-process bus (the live-broker test:
tests/integration/reward/test_reward_state_moves.py)."""

from __future__ import annotations

import asyncio

import pytest

from infra.bus.memory import MemoryBus
from reward_service import changelog
from reward_service.service import scored_event_id
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
)
from tests.fakes.waiting import wait_until
from tests.unit.reward.calls import call, finished, started
from tests.unit.reward.test_reward_service import service
from tests.unit.worker.collect import Events

pytestmark = pytest.mark.timeout(30)
PROD = EpisodeSource.production


def _scored(ep: str, revision: int = 0) -> EpisodeScored:
    return EpisodeScored(
        event_id=scored_event_id(ep, revision),
        episode_id=ep,
        group_id=ep,
        score_revision=revision,
        source=PROD,
    )


def test_restore_rebuilds_open_done_and_retained_episodes() -> None:
    live, prod, gone = "a" * 32, "b" * 32, "c" * 32
    first = EpisodeStore(changelog=True)
    first.add(started(live))
    first.add(call(live, 0, [1], [2]))
    second_call = call(live, 1, [1, 2, 3], [4])
    first.add(second_call)
    first.add(second_call)  # a redelivery: queued once
    first.add(EpisodeStarted(episode_id=prod, source=PROD))
    first.add(call(prod, 0, [5], [6], source=PROD))
    first.add(EpisodeFinished(episode_id=prod, status=EpisodeStatus.ok, source=PROD))
    first.note(changelog.marker(_scored(prod)))
    first.close(prod)
    held = first.retained_record(prod)
    assert held is not None
    feedback = RewardReported(episode_id=prod, origin=RewardOrigin.feedback, rating=1)
    assert held[0].add(feedback)
    first.note(feedback)
    first.note(changelog.marker(_scored(prod, 1)))
    first.keep(held[0], revision=1)
    first.add(started(gone))
    first.add(finished(gone))
    first.note(changelog.marker(_scored(gone)))
    first.close(gone)
    assert first.changes is not None and len(first.changes) == 12

    second = EpisodeStore(changelog=True)
    assert changelog.restore(second, first.changes + first.changes) == 12  # a retried batch: once
    assert second.changes == []  # a restore queues nothing
    assert sorted(second.open) == [live]
    assert [c.call_seq for c in second.open[live].ordered_calls()] == [0, 1]
    assert set(second.done) == {prod, gone}
    restored = second.retained_record(prod)
    assert restored is not None and restored[1] == 1
    assert [r.rating for r in restored[0].rewards] == [1]
    assert second.add(second_call) is not None and second.changes == []  # seen: not queued


def test_forget_drops_only_the_lost_partitions() -> None:
    store = EpisodeStore(changelog=True)
    episodes = [f"{i:032x}" for i in range(40)]
    for ep in episodes:
        store.add(started(ep))
    lost = {changelog.partition_of(episodes[0]), changelog.partition_of(episodes[1])}
    dropped = changelog.forget(store, lost)
    assert dropped == sum(changelog.partition_of(ep) in lost for ep in episodes) >= 1
    assert all(changelog.partition_of(ep) not in lost for ep in store.open)


def test_the_changelog_replaces_the_journal(tmp_path: object) -> None:
    from pathlib import Path

    with pytest.raises(ValueError, match="replaces the journal"):
        EpisodeStore(Path(str(tmp_path)) / "j.sqlite", changelog=True)


async def test_a_partition_moved_mid_episode_is_scored_from_all_its_calls() -> None:
    # Two instances of one group on the in-process bus (which keeps the whole changelog when ``retain``
    # is large): B joins after A has seen half of every episode's calls.
    episodes = [f"{i:032x}" for i in range(16)]
    async with MemoryBus(retain=100_000) as bus:
        events = await Events().attach(bus, TRANSITIONS)
        a = service(bus, EpisodeStore(changelog=True))
        await a.start()
        for ep in episodes:
            await bus.publish(EPISODES, started(ep, group=ep))
            for seq in range(2):
                await bus.publish(EPISODES, call(ep, seq, list(range(1, 2 + 2 * seq)), [9]))
        await wait_until(lambda: sum(len(r.calls) for r in a.store.open.values()) == 32, within_s=10)
        b = service(bus, EpisodeStore(changelog=True))
        await b.start()
        await wait_until(lambda: bool(b.owned) and a.owned is not None and len(a.owned) < 16, within_s=10)
        for ep in episodes:
            for seq in range(2, 4):
                await bus.publish(EPISODES, call(ep, seq, list(range(1, 2 + 2 * seq)), [9]))
            await bus.publish(EPISODES, finished(ep, reward=1.0, group=ep))
        scored = await events.wait(lambda e: isinstance(e, EpisodeScored), count=16)
        await asyncio.sleep(0.2)
        assert sorted(e.episode_id for e in events.of(EpisodeScored)) == episodes  # each once
        assert {e.num_calls for e in scored} == {4}
        assert a.stats.scored > 0 and b.stats.scored > 0 and b.stats.restored > 0
        assert a.stats.forgotten > 0  # A dropped the episodes of the partitions it lost
        await b.stop()
        await a.stop()
        await events.stop()
