"""The consumer loop both buses share, over a fetcher double: acknowledgements, commits, rewinds, stop."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

import schemas as s
from infra.bus import Message
from infra.bus.base import new_message
from infra.bus.consumer import Block, Consumer, Subscriber, Undecodable
from infra.bus.deadletter import Parking
from infra.bus.delivery import RetryPolicy
from tests.fakes.waiting import wait_until
from tests.integration.bus.helpers import call_event

pytestmark = pytest.mark.timeout(20)


class ListFetcher:
    """Hands out queued blocks once each; remembers acks, commits and rewinds."""

    def __init__(self, blocks: list[Block]) -> None:
        self.blocks = blocks
        self.idle = asyncio.Event()
        self.idle.set()
        self.acked: list[tuple[int, int]] = []
        self.commits = 0
        self.rewinds = 0
        self.closed = False

    async def fetch(self, max_records: int, timeout_s: float) -> Block:
        if self.blocks:
            return self.blocks.pop(0)
        await asyncio.sleep(min(timeout_s, 0.01))
        return {}

    def ack(self, partition: int, offset: int) -> None:
        self.acked.append((partition, offset))

    async def commit(self) -> None:
        self.commits += 1

    async def rewind(self) -> None:
        self.rewinds += 1

    async def close(self) -> None:
        self.closed = True


def _message(partition: int, offset: int) -> Message:
    return new_message(call_event(uuid.uuid4().hex, offset, size=10), s.EPISODES, partition, offset, "k")


def _consumer(
    fetcher: ListFetcher, subscriber: Subscriber, letters: list[s.DeadLetter], tmp: Path
) -> Consumer:
    async def publish(letter: s.DeadLetter, key: str) -> None:
        letters.append(letter)

    return Consumer(
        fetcher,
        s.EPISODES,
        "g",
        subscriber,
        policy=RetryPolicy(subscriber.max_retries, 0.001),
        stop_grace_s=1.0,
        publish_dead_letter=publish,
        parking=Parking(tmp / "parked.jsonl"),
        poll_s=0.01,
    )


async def test_each_record_is_acknowledged_in_order_and_the_block_committed_once(tmp_path: Path) -> None:
    block: Block = {0: [_message(0, 0), _message(0, 1)], 1: [Undecodable(1, 5, "k", b"{", "not json")]}
    fetcher = ListFetcher([block])
    seen: list[tuple[int, int]] = []
    letters: list[s.DeadLetter] = []

    async def handler(m: Message) -> None:
        seen.append((m.partition, m.offset))

    consumer = _consumer(fetcher, Subscriber(handler, None, True, 0), letters, tmp_path)
    consumer.start()
    await wait_until(lambda: fetcher.commits == 1, what="the block committed")
    await consumer.stop()
    assert seen == [(0, 0), (0, 1)]
    assert sorted(fetcher.acked) == [(0, 0), (0, 1), (1, 5)]
    assert [(d.partition, d.offset, d.error_type) for d in letters] == [(1, 5, "EventDecodeError")]
    assert fetcher.closed


async def test_a_failing_batch_finds_its_poison_and_acks_each_partitions_last_record(tmp_path: Path) -> None:
    fetcher = ListFetcher([{0: [_message(0, 0), _message(0, 1)], 2: [_message(2, 7)]}])
    handled: list[int] = []
    letters: list[s.DeadLetter] = []

    async def batch(messages: object) -> None:
        assert isinstance(messages, list)
        if any(m.offset == 1 for m in messages):
            raise ValueError("poison")
        handled.extend(m.offset for m in messages)

    consumer = _consumer(fetcher, Subscriber(None, batch, True, 1, 10, 0.0), letters, tmp_path)
    consumer.start()
    await wait_until(lambda: fetcher.commits == 1, what="the batch committed")
    await consumer.stop()
    assert sorted(handled) == [0, 7]
    assert [(d.offset, d.error_type, d.attempts) for d in letters] == [(1, "ValueError", 2)]
    assert sorted(fetcher.acked) == [(0, 1), (2, 7)]


async def test_stop_finishes_the_record_in_flight_and_leaves_the_rest(tmp_path: Path) -> None:
    fetcher = ListFetcher([{0: [_message(0, 0), _message(0, 1), _message(0, 2)]}])
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(m: Message) -> None:
        started.set()
        await release.wait()

    consumer = _consumer(fetcher, Subscriber(slow, None, True, 0), [], tmp_path)
    consumer.start()
    await asyncio.wait_for(started.wait(), 5)
    stopping = asyncio.create_task(consumer.stop())
    await asyncio.sleep(0.05)
    assert not stopping.done(), "stop() waits for the handler in flight"
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert fetcher.acked == [(0, 0)] and fetcher.commits == 1 and fetcher.rewinds == 0


def test_bad_subscriber_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Subscriber(None, None, True, 0, max_batch=0)
    with pytest.raises(ValueError, match="max_retries"):
        Subscriber(None, None, True, -1)
