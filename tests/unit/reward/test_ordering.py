"""An episode's calls ordered and numbered whichever gateways served them (reward_service/ordering.py):
by the conversation when gateways reused numbers, exactly as recorded when one gateway numbered them;
kept through the changelog and a retained session; per-call rewards land on the renumbered calls."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from infra.bus.memory import MemoryBus
from reward_service import changelog, ordering
from reward_service.state import EpisodeStore
from schemas import (
    EPISODES,
    TRANSITIONS,
    EpisodeScored,
    EpisodeSource,
    LLMCallRecorded,
    RewardOrigin,
    RewardReported,
)
from tests.unit.reward.calls import call, finished, started
from tests.unit.reward.test_reward_service import service
from tests.unit.worker.collect import Events

pytestmark = pytest.mark.timeout(30)
EP = "e" * 32
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _served(c: LLMCallRecorded, gateway: str, k: int, *, at: int | None = None) -> LLMCallRecorded:
    """``c`` as gateway ``gateway`` recorded it: its own call id, started ``at`` seconds in (default ``k``)."""
    return c.model_copy(
        update={
            "producer": f"gateway:{gateway}",
            "call_id": f"{gateway}-{k}",
            "started_at": T0 + timedelta(seconds=k if at is None else at),
        }
    )


def _conversation(seqs: list[int], gateways: str, *, at: list[int] | None = None) -> list[LLMCallRecorded]:
    """Four calls, each prompt the previous prompt + answer + a new turn, numbered ``seqs`` by ``gateways``."""
    prompt: list[int] = [1, 2, 3]
    out = []
    for k, (seq, gw) in enumerate(zip(seqs, gateways, strict=True)):
        answer = [10 + 2 * k, 11 + 2 * k]
        out.append(_served(call(EP, seq, list(prompt), answer), gw, k, at=None if at is None else at[k]))
        prompt = prompt + answer + [50 + k]
    return out


def _shuffled(calls: list[LLMCallRecorded], seed: int) -> list[LLMCallRecorded]:
    out = list(calls)
    random.Random(seed).shuffle(out)
    return out


@pytest.mark.parametrize(
    ("seqs", "gateways"), [([0, 0, 1, 1], "abab"), ([0, 1, 0, 1], "aabb"), ([0, 1, 2, 0], "aaab")]
)
def test_reused_numbers_are_ordered_by_the_conversation_and_numbered_again(
    seqs: list[int], gateways: str
) -> None:
    calls = _conversation(seqs, gateways, at=[0, 3, 1, 2])  # the gateways' clocks disagree: ids decide
    for seed in range(5):  # whatever order they arrive in
        numbered = ordering.number(ordering.order(_shuffled(calls, seed)))
        assert [c.call_id for c in numbered] == [c.call_id for c in calls]
        assert [c.call_seq for c in numbered] == [0, 1, 2, 3]
    assert ordering.reused(calls) == len(seqs) - len(set(seqs))


def test_one_gateways_numbers_are_the_order_gaps_included() -> None:
    """After a restart a gateway's numbers jump a reserved block (gateway/episodes/seqs.py): kept as they are,
    and a prompt that happens to extend a later call's ids does not reorder them."""
    calls = _conversation([0, 1, 64, 65], "aaaa")
    coincidence = _served(call(EP, 66, [1, 2, 3, 16, 17, 53, 1], [2]), "a", 4)
    later = _served(call(EP, 67, [1, 2], [3]), "a", 5)  # coincidence's prompt extends this one's ids
    everything = [*calls, coincidence, later]
    numbered = ordering.number(ordering.order(_shuffled(everything, 1)))
    assert numbered == everything  # the same events, in call_seq order, numbers untouched


def test_unrelated_calls_of_two_gateways_go_by_when_they_started() -> None:
    """No ids to follow (a text-only upstream): each gateway's own order, then the start time; two
    gateways' numbers say nothing of which call came first."""
    calls = [
        _served(call(EP, seq, None, None), gw, k)
        for k, (seq, gw) in enumerate(zip([0, 1, 0, 1], "aabb", strict=True))
    ]
    assert ordering.order(_shuffled(calls, 3)) == calls


def test_a_cycle_of_coincidences_still_orders_every_call() -> None:
    x = _served(call(EP, 0, [1, 2, 3, 7, 8, 9], [4]), "a", 0)
    y = _served(call(EP, 1, [1], [2]), "a", 1)  # after x on gateway a, but x's prompt extends y's ids
    z = _served(call(EP, 0, [1, 2, 3], [7, 8]), "b", 2)  # z's prompt extends y's, x's extends z's
    first = ordering.order([x, y, z])
    assert sorted(c.call_id for c in first) == ["a-0", "a-1", "b-2"]
    assert ordering.order([z, y, x]) == first


def test_every_call_is_kept_and_survives_the_changelog_and_retention() -> None:
    calls = _conversation([0, 0, 1, 1], "abab")
    store = EpisodeStore(changelog=True)
    store.add(started(EP))
    for c in _shuffled(calls, 2):
        store.add(c)
    store.add(calls[0].model_copy(update={"event_id": "another-event-id"}))  # the same call again: once
    record = store.open[EP]
    assert [c.call_id for c in record.ordered_calls()] == [c.call_id for c in calls]
    assert sorted(record.calls) == [0, 1, 2, 3] and record.reused_seqs == 2
    assert changelog.restore(restored := EpisodeStore(changelog=True), list(store.changes or [])) == 6
    assert restored.open[EP].ordered_calls() == record.ordered_calls()

    prod = EpisodeStore()
    for c in calls:
        prod.add(c.model_copy(update={"source": EpisodeSource.production}))
    prod.close(EP)
    held = prod.retained_record(EP)
    assert held is not None
    assert [(c.call_id, c.call_seq) for c in held[0].ordered_calls()] == [
        (c.call_id, n) for n, c in enumerate(calls)
    ]


async def test_per_call_rewards_land_on_the_calls_in_the_agents_count() -> None:
    """An agent names a call by its own count (``call_index`` 0, 1, ...): the renumbered order."""
    calls = _conversation([0, 0, 1, 1], "abab")
    async with MemoryBus() as bus:
        events = await Events().attach(bus, TRANSITIONS)
        svc = service(bus)
        await svc.start()
        await bus.publish(EPISODES, started(EP))
        for c in _shuffled(calls, 4):
            await bus.publish(EPISODES, c)
        for index, value in enumerate([0.1, 0.2, 0.4, 0.8]):
            await bus.publish(
                EPISODES,
                RewardReported(episode_id=EP, call_seq=index, value=value, origin=RewardOrigin.agent),
            )
        await bus.publish(EPISODES, finished(EP, reward=1.0))
        [scored] = await events.wait_for(EpisodeScored)
        await svc.stop()
        await events.stop()
    assert (scored.num_calls, scored.prefix_mismatches, scored.reward) == (4, 0, 1.0)
    [t] = scored.transitions
    assert t.call_seqs == [0, 1, 2, 3] and sum(t.response_mask) == 8  # every generated token trained on
    assert t.segment_starts is not None and t.segment_returns is not None
    assert [t.response_ids[s] for s in t.segment_starts] == [10, 12, 14, 16]  # call k's answer starts at k
    assert t.segment_returns == pytest.approx([2.5, 2.4, 2.2, 1.8])  # G_k = sum of r[c >= k], 1.0 on the last
    assert svc.stats.renumbered == 1
