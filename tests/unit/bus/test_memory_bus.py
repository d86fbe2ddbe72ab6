"""What only the in-process bus has: bounded queues (backpressure), history trimming, group splits."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

import schemas as s
from infra.bus import BusClosedError, BusError, BusUnavailableError, Message
from infra.bus.memory import MemoryBus
from tests.fakes.waiting import wait_until
from tests.integration.bus.helpers import call_event

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
async def small_bus() -> AsyncIterator[MemoryBus]:
    bus = MemoryBus(max_backlog=4, retain=8, max_retained=32, stop_grace_s=1.0)
    await bus.start()
    yield bus
    await bus.stop()


def _ev(key: str, seq: int) -> s.LLMCallRecorded:
    return call_event(key, seq, size=200)


async def test_publish_waits_while_a_group_backlog_is_full(small_bus: MemoryBus) -> None:
    key = uuid.uuid4().hex
    release = asyncio.Event()
    seen: list[int] = []

    async def blocked(message: Message) -> None:
        await release.wait()
        assert isinstance(message.event, s.LLMCallRecorded)
        seen.append(message.event.call_seq)

    await small_bus.subscribe(s.EPISODES, "slow", blocked)
    for seq in range(4):
        await small_bus.publish(s.EPISODES, _ev(key, seq))
    fifth = asyncio.create_task(small_bus.publish(s.EPISODES, _ev(key, 4)))
    done, _ = await asyncio.wait({fifth}, timeout=0.3)
    assert not done, "publish must wait while the group's partition backlog is full"
    release.set()
    await asyncio.wait_for(fifth, 5)
    await wait_until(lambda: len(seen) == 5, what="all five handled")
    assert seen == [0, 1, 2, 3, 4]


async def test_publish_into_a_stuck_backlog_fails_after_the_publish_timeout() -> None:
    """Publishes are bounded (the Bus contract): callers such as the gateway set no timer of their own."""
    bus = MemoryBus(max_backlog=2, stop_grace_s=0.2, publish_timeout_s=0.2)
    await bus.start()
    key = uuid.uuid4().hex
    stuck = asyncio.Event()

    async def never_returns(message: Message) -> None:
        await stuck.wait()

    try:
        await bus.subscribe(s.EPISODES, "stuck", never_returns)
        for seq in range(2):
            await bus.publish(s.EPISODES, _ev(key, seq))
        started = asyncio.get_running_loop().time()
        with pytest.raises(BusUnavailableError, match="backlog stayed at 2 messages"):
            await bus.publish(s.EPISODES, _ev(key, 2))
        assert 0.15 < asyncio.get_running_loop().time() - started < 2.0
    finally:
        stuck.set()
        await bus.stop()


async def test_handler_publishing_to_its_own_full_topic_does_not_deadlock(small_bus: MemoryBus) -> None:
    key = uuid.uuid4().hex
    handled: list[int] = []

    async def echo(message: Message) -> None:
        assert isinstance(message.event, s.LLMCallRecorded)
        seq = message.event.call_seq
        handled.append(seq)
        if seq < 20:  # each message publishes the next one onto the same (full) partition
            for extra in range(3):
                await small_bus.publish(s.EPISODES, _ev(key, 100 + seq * 3 + extra))
            await small_bus.publish(s.EPISODES, _ev(key, seq + 1))

    await small_bus.subscribe(s.EPISODES, "echo", echo)
    await small_bus.publish(s.EPISODES, _ev(key, 0))
    await wait_until(lambda: 20 in handled, within_s=10, what="the chain to reach 20")


async def test_stopped_group_does_not_hold_publishers(small_bus: MemoryBus) -> None:
    key = uuid.uuid4().hex
    sub = await small_bus.subscribe(s.EPISODES, "gone", _noop)
    await sub.stop()
    for seq in range(50):  # far beyond max_backlog: nobody is consuming, nobody is waited for
        await small_bus.publish(s.EPISODES, _ev(key, seq))
    assert await small_bus.lag(s.EPISODES, "gone") <= 32 + 8  # bounded by max_retained (+ retain slack)


async def test_history_is_trimmed_and_a_late_group_sees_the_retained_tail(small_bus: MemoryBus) -> None:
    key = uuid.uuid4().hex
    for seq in range(40):
        await small_bus.publish(s.EPISODES, _ev(key, seq))
    seen: list[int] = []

    async def collect(message: Message) -> None:
        assert isinstance(message.event, s.LLMCallRecorded)
        seen.append(message.event.call_seq)

    await small_bus.subscribe(s.EPISODES, "late", collect)
    await wait_until(lambda: bool(seen) and seen[-1] == 39, what="the newest message")
    assert seen == list(range(seen[0], 40)) and len(seen) <= 32


async def test_two_subscribers_of_one_group_split_partitions() -> None:
    async with MemoryBus() as bus:
        a: list[Message] = []
        b: list[Message] = []

        async def to_a(m: Message) -> None:
            a.append(m)

        async def to_b(m: Message) -> None:
            b.append(m)

        await bus.subscribe(s.EPISODES, "workers", to_a)
        sub_b = await bus.subscribe(s.EPISODES, "workers", to_b)
        keys = [uuid.uuid4().hex for _ in range(40)]
        for key in keys:
            await bus.publish(s.EPISODES, _ev(key, 0))
        await wait_until(lambda: len(a) + len(b) == 40, what="40 deliveries")
        assert a and b
        assert not {m.partition for m in a} & {m.partition for m in b}
        await sub_b.stop()
        for key in keys:
            await bus.publish(s.EPISODES, _ev(key, 1))
        await wait_until(lambda: len(a) + len(b) == 80, what="80 deliveries")
        assert sum(1 for m in a if isinstance(m.event, s.LLMCallRecorded) and m.event.call_seq == 1) == 40


async def test_stop_lets_the_in_flight_handler_finish_and_commit() -> None:
    async with MemoryBus() as bus:
        key = uuid.uuid4().hex
        started, release = asyncio.Event(), asyncio.Event()
        finished: list[int] = []

        async def slow(m: Message) -> None:
            started.set()
            await release.wait()
            assert isinstance(m.event, s.LLMCallRecorded)
            finished.append(m.event.call_seq)

        sub = await bus.subscribe(s.EPISODES, "g", slow)
        await bus.publish(s.EPISODES, _ev(key, 0))
        await asyncio.wait_for(started.wait(), 5)
        stopping = asyncio.create_task(sub.stop())
        await asyncio.sleep(0)
        release.set()
        await asyncio.wait_for(stopping, 5)
        assert finished == [0]
        assert await bus.lag(s.EPISODES, "g") == 0


async def test_closed_bus_and_bad_arguments() -> None:
    bus = MemoryBus()
    with pytest.raises(BusClosedError):
        await bus.publish(s.EPISODES, _ev("k", 0))
    await bus.start()
    with pytest.raises(BusError, match="unknown topic"):
        await bus.subscribe("nope", "g", _noop)
    with pytest.raises(BusError, match="mixes batch"):
        await bus.subscribe(s.EPISODES, "g", _noop)
        await bus.subscribe_batch(s.EPISODES, "g", _noop_batch)
    await bus.stop()


async def test_named_task_pools_have_the_tasks_partitions() -> None:
    async with MemoryBus() as bus:
        await bus.ensure_topics([s.tasks_topic("gpu")])
        assert await bus.list_topics() == ["flywheel.tasks.gpu"]


async def _noop(message: Message) -> None:
    return None


async def _noop_batch(messages: object) -> None:
    return None


def test_message_is_immutable() -> None:
    message = Message(_ev(uuid.uuid4().hex, 0), s.EPISODES, 3, 7, "k")
    assert (message.partition, message.offset, message.key, message.raw) == (3, 7, "k", None)
    with pytest.raises(AttributeError):
        message.offset = 8  # type: ignore[misc]


async def test_the_default_history_is_small_whatever_was_published() -> None:
    """A retained call event is kilobytes of objects: by default a partition keeps at most 2 × 32 of
    those every group has handled, however many were published (memory flat under steady traffic)."""
    async with MemoryBus() as bus:
        handled: list[int] = []

        async def handle(message: Message) -> None:
            handled.append(1)

        await bus.subscribe(s.EPISODES, "reader", handle)
        key = uuid.uuid4().hex  # one key: one partition
        published: list[int] = []
        for seq in range(1_000):
            await bus.publish(s.EPISODES, _ev(key, seq))
            published.append(seq)
            if seq % 10 == 9:  # steady traffic: the reader keeps up
                await wait_until(lambda: len(handled) == len(published), what="every message handled")
        kept = sum(len(p.items) for p in bus._topics[s.EPISODES].partitions)
        assert kept <= 2 * 32
