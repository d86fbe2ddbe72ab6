"""``subscribe_batch(on_assigned=...)`` and ``read_partitions``, on both buses (what the reward service's
changelog stands on: reward_service/changelog.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import schemas as s
from infra.bus import Message
from infra.bus.base import Assigned
from infra.bus.partitioner import partition_for
from tests.fakes.waiting import wait_until
from tests.integration.bus.helpers import call_event
from tests.kafka_fixtures import MakeBus

pytestmark = pytest.mark.timeout(60)
ALL = frozenset(range(s.TOPICS[s.EPISODES].partitions))


async def test_each_member_is_told_its_partitions_after_a_rebalance(make_bus: MakeBus, bus_kind: str) -> None:
    told: dict[str, frozenset[int]] = {}

    async def nothing(messages: Sequence[Message]) -> None:
        return None

    def hook(name: str) -> Assigned:
        async def assigned(partitions: frozenset[int]) -> None:
            told[name] = partitions

        return assigned

    first = await make_bus()
    second = first if bus_kind == "memory" else await make_bus()  # one in-process bus is one broker
    await first.subscribe_batch(s.EPISODES, "hooked", nothing, on_assigned=hook("a"))
    await wait_until(lambda: told.get("a") == ALL, within_s=30, what="the first member told all")
    await second.subscribe_batch(s.EPISODES, "hooked", nothing, on_assigned=hook("b"))
    await wait_until(
        lambda: bool(told.get("b")) and told["a"] | told["b"] == ALL and not told["a"] & told["b"],
        within_s=30,
        what="the partitions split between the two members",
    )


async def test_read_partitions_returns_every_record_of_a_partition_in_order(make_bus: MakeBus) -> None:
    bus = await make_bus()
    ep = "e" * 32
    events = [call_event(ep, seq, size=100) for seq in range(5)]
    for event in events:
        await bus.publish(s.REWARD_STATE, event, key=ep)
    p = partition_for(ep, s.TOPICS[s.REWARD_STATE].partitions)
    read = await bus.read_partitions(s.REWARD_STATE, [p, (p + 1) % 16])
    assert [m.event for m in read[p]] == events
    assert read[(p + 1) % 16] == []
