"""On the live broker: two reward services in one consumer group, a rebalance mid-episode.

Instance A consumes the first half of every episode's calls (and scores a few production sessions);
instance B then joins the group and takes about half of the partitions of ``flywheel.episodes``. Every
episode must be scored once (after deduplication by ``event_id``) from all its calls, and late feedback
for a production session A scored must be re-scored by whichever instance holds it now: the state
follows the partitions through ``flywheel.reward-state`` (reward_service/changelog.py).
"""

from __future__ import annotations

import pytest

from infra.bus.kafka import KafkaBus
from reward_service.service import RewardService
from reward_service.state import EpisodeStore
from schemas import (
    DEADLETTER,
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

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]
PROD = EpisodeSource.production
GROUP = "reward-scale"
CALLS = 6  # per live episode: 3 before B joins, 3 after


def _bus(bootstrap: str, prefix: str, name: str) -> KafkaBus:
    return KafkaBus(bootstrap, prefix=prefix, client_id=name, session_timeout_ms=6_000)


def _service(bus: KafkaBus, changelog: bool) -> RewardService:
    return service(bus, EpisodeStore(changelog=changelog), group=GROUP, batch_wait_s=0.02)  # type: ignore[arg-type]


async def _calls(bus: KafkaBus, ep: str, seqs: range) -> None:
    for seq in seqs:
        await bus.publish(EPISODES, call(ep, seq, list(range(1, 2 + 2 * seq)), [9]))


async def run_rebalance_mid_episode(
    bootstrap: str, prefix: str, *, changelog: bool, stop_a: bool = False
) -> None:
    live = [f"{i:030x}li" for i in range(24)]
    prod = [f"{i:030x}pr" for i in range(12)]
    async with (
        _bus(bootstrap, prefix, "pub") as pub,
        _bus(bootstrap, prefix, "a") as bus_a,
        _bus(bootstrap, prefix, "b") as bus_b,
    ):
        events = await Events().attach(pub, TRANSITIONS, DEADLETTER)
        a = _service(bus_a, changelog)
        await a.start()
        for ep in prod:  # scored by A, retained for late feedback
            await pub.publish(EPISODES, EpisodeStarted(episode_id=ep, source=PROD))
            await pub.publish(EPISODES, call(ep, 0, [1, 2], [3], source=PROD))
            await pub.publish(EPISODES, EpisodeFinished(episode_id=ep, status=EpisodeStatus.ok, source=PROD))
        for ep in live:
            await pub.publish(EPISODES, started(ep, group=ep))
            await _calls(pub, ep, range(CALLS // 2))
        await events.wait(lambda e: isinstance(e, EpisodeScored), count=len(prod), within_s=60)
        await wait_until(lambda: len(a.store.open) == len(live), within_s=60, what="A saw every episode")

        b = _service(bus_b, changelog)
        await b.start()  # the group rebalances: B takes about half of the 16 partitions
        if stop_a:  # and then all of them, with the state A had
            await a.stop()
            await wait_until(
                lambda: b.owned is not None and len(b.owned) == 16, within_s=60, what="B holds all"
            )
        for ep in live:
            await _calls(pub, ep, range(CALLS // 2, CALLS))
            await pub.publish(EPISODES, finished(ep, reward=1.0, group=ep))
        for ep in prod:
            await pub.publish(EPISODES, RewardReported(episode_id=ep, origin=RewardOrigin.feedback, rating=1))
        firsts = await events.wait(
            lambda e: isinstance(e, EpisodeScored) and e.score_revision == 0,
            count=len(live) + len(prod),
            within_s=90,
        )
        assert sorted({e.episode_id for e in firsts}) == sorted(live + prod)  # each once after dedup
        assert len({e.event_id for e in firsts}) == len(live) + len(prod)
        for e in firsts:  # every copy, duplicates included, saw every call
            if e.episode_id in live:
                assert (e.num_calls, len(e.transitions)) == (CALLS, CALLS), f"{e.episode_id} scored from part"
        rescored = await events.wait(
            lambda e: isinstance(e, EpisodeScored) and e.score_revision == 1, count=len(prod), within_s=60
        )
        assert sorted({e.episode_id for e in rescored}) == sorted(prod)  # re-scored wherever it went
        assert {e.reward for e in rescored} == {1.0}
        assert b.stats.scored > 0 and b.stats.rescored > 0  # B did take partitions and their state
        if stop_a:
            assert (b.stats.scored, b.stats.rescored) == (len(live), len(prod))
        await b.stop()
        if not stop_a:
            await a.stop()
        await events.stop()


async def test_two_reward_services_score_each_episode_once_from_all_its_calls_across_a_rebalance(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    await run_rebalance_mid_episode(kafka_bootstrap, topic_prefix, changelog=True)


async def test_an_instance_that_leaves_mid_episode_hands_its_state_over(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    await run_rebalance_mid_episode(kafka_bootstrap, topic_prefix, changelog=True, stop_a=True)
