"""The one bus suite: every test runs on the in-process bus and on the live Kafka broker."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from collections.abc import Sequence

import pytest

import schemas as s
from infra.bus import Bus, Message
from infra.bus.partitioner import partition_for
from tests.fakes.waiting import wait_until
from tests.integration.bus.helpers import call_event

pytestmark = pytest.mark.timeout(60)


def _ep() -> str:
    return uuid.uuid4().hex


def _started(ep: str, task: str = "t") -> s.EpisodeStarted:
    return s.EpisodeStarted(episode_id=ep, group_id=task)


class Collector:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.batches: list[int] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    async def batch(self, messages: Sequence[Message]) -> None:
        self.batches.append(len(messages))
        self.messages.extend(messages)

    async def wait(self, n: int, within_s: float = 20.0) -> None:
        await wait_until(
            lambda: len(self.messages) >= n, within_s, f"{n} messages (have {len(self.messages)})"
        )

    def seqs(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for m in self.messages:
            assert isinstance(m.event, s.LLMCallRecorded)
            out[m.key].append(m.event.call_seq)
        return out


async def _lag_is(bus: Bus, group: str, n: int) -> bool:
    return await bus.lag(s.EPISODES, group) == n


def _dead(dead: Collector) -> list[s.DeadLetter]:
    return [m.event for m in dead.messages if isinstance(m.event, s.DeadLetter)]


async def test_publish_and_consume(bus: Bus) -> None:
    ep = _ep()
    got = Collector()
    await bus.subscribe(s.EPISODES, "g", got)
    events: list[s.AnyEvent] = [
        _started(ep),
        call_event(ep, 0),
        s.EpisodeFinished(episode_id=ep, status=s.EpisodeStatus.ok),
    ]
    for event in events:
        await bus.publish(s.EPISODES, event)
    await got.wait(3)
    assert [m.event for m in got.messages] == events
    assert {m.topic for m in got.messages} == {s.EPISODES}
    assert {m.key for m in got.messages} == {ep}
    assert [m.offset for m in got.messages] == sorted(m.offset for m in got.messages)
    assert s.EPISODES in await bus.list_topics()


async def test_wrong_topic_is_refused(bus: Bus) -> None:
    with pytest.raises(Exception, match="does not belong"):
        await bus.publish(s.TASKS, _started(_ep()))


async def test_per_key_order_and_partitions(bus: Bus) -> None:
    keys = [_ep() for _ in range(12)]
    got = Collector()
    await bus.subscribe(s.EPISODES, "g", got)
    for seq in range(15):
        for key in keys:
            await bus.publish(s.EPISODES, call_event(key, seq, size=300))
    await got.wait(len(keys) * 15)
    assert got.seqs() == {k: list(range(15)) for k in keys}
    n = s.spec_for(s.EPISODES).partitions
    for m in got.messages:
        assert m.partition == partition_for(m.key, n)
    assert len({m.partition for m in got.messages}) > 1


async def test_every_group_sees_every_event(bus: Bus) -> None:
    a, b = Collector(), Collector()
    await bus.subscribe(s.EPISODES, "group-a", a)
    await bus.subscribe(s.EPISODES, "group-b", b)
    keys = [_ep() for _ in range(5)]
    for seq in range(4):
        for key in keys:
            await bus.publish(s.EPISODES, call_event(key, seq, size=300))
    await a.wait(20)
    await b.wait(20)
    assert a.seqs() == b.seqs() == {k: [0, 1, 2, 3] for k in keys}


async def test_offsets_resume_after_restart(bus: Bus) -> None:
    ep = _ep()
    first = Collector()
    sub = await bus.subscribe(s.EPISODES, "resumer", first)
    for seq in range(5):
        await bus.publish(s.EPISODES, call_event(ep, seq, size=300))
    await first.wait(5)
    await sub.stop()
    for seq in range(5, 8):
        await bus.publish(s.EPISODES, call_event(ep, seq, size=300))
    second = Collector()
    await bus.subscribe(s.EPISODES, "resumer", second)
    await second.wait(3)
    assert second.seqs() == {ep: [5, 6, 7]}
    await wait_until(lambda: _lag_is(bus, "resumer", 0), what="lag 0")


async def test_new_group_not_from_beginning_starts_at_end(bus: Bus) -> None:
    old, new = _ep(), _ep()
    await bus.publish(s.EPISODES, call_event(old, 0, size=300))
    got = Collector()
    await bus.subscribe(s.EPISODES, "late", got, from_beginning=False)
    await bus.publish(s.EPISODES, call_event(new, 0, size=300))
    await got.wait(1)
    assert [m.key for m in got.messages] == [new]


async def test_failing_handler_retries_then_dead_letters_and_carries_on(bus: Bus) -> None:
    ep = _ep()
    attempts: dict[int, int] = defaultdict(int)
    got = Collector()

    async def handler(message: Message) -> None:
        assert isinstance(message.event, s.LLMCallRecorded)
        seq = message.event.call_seq
        attempts[seq] += 1
        if seq == 3 or (seq == 5 and attempts[seq] == 1):
            raise RuntimeError(f"boom on {seq}")
        await got(message)

    dead = Collector()
    await bus.subscribe(s.DEADLETTER, "dl-reader", dead)
    await bus.subscribe(s.EPISODES, "fragile", handler, max_retries=2)
    for seq in range(8):
        await bus.publish(s.EPISODES, call_event(ep, seq, size=300))
    await got.wait(7)
    await dead.wait(1)
    assert got.seqs() == {ep: [0, 1, 2, 4, 5, 6, 7]}
    assert attempts[3] == 3 and attempts[5] == 2
    (letter,) = _dead(dead)
    assert letter.original_topic == s.EPISODES
    assert letter.consumer_group == "fragile"
    assert letter.error_type == "RuntimeError" and "boom on 3" in letter.error
    assert letter.attempts == 3 and letter.key == ep
    assert letter.partition == partition_for(ep, s.spec_for(s.EPISODES).partitions)
    assert letter.offset is not None
    assert json.loads(letter.payload)["call_seq"] == 3
    assert dead.messages[0].key == ep


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe not json", "Invalid JSON"),
        (b'{"type": "no_such_event"}', "does not match any of the expected tags"),
        (json.dumps({"type": "episode_started", "task_id": "t"}).encode(), "Field required at"),
        (s.encode(s.RolloutCancelled(task_id="t1", group_id="g1")), "does not match"),
    ],
    ids=["undecodable", "unknown-type", "missing-field", "event-of-another-topic"],
)
async def test_bad_raw_messages_go_to_dead_letter(bus: Bus, raw: bytes, reason: str) -> None:
    ep = _ep()
    dead, got = Collector(), Collector()
    await bus.subscribe(s.DEADLETTER, "dl-reader", dead)
    await bus.subscribe(s.EPISODES, "reader", got)
    await bus.publish(s.EPISODES, call_event(ep, 0, size=300))
    await bus.publish_raw(s.EPISODES, raw, key=ep)
    await bus.publish(s.EPISODES, call_event(ep, 1, size=300))
    await got.wait(2)
    await dead.wait(1)
    assert got.seqs() == {ep: [0, 1]}
    (letter,) = _dead(dead)
    assert letter.error_type == "EventDecodeError"
    assert reason in letter.error, letter.error
    assert letter.original_topic == s.EPISODES and letter.key == ep and letter.consumer_group == "reader"
    assert letter.attempts == 1
    assert letter.payload == raw.decode("utf-8", errors="replace")


async def test_valid_raw_message_is_delivered(bus: Bus) -> None:
    ep = _ep()
    got = Collector()
    await bus.subscribe(s.EPISODES, "reader", got)
    event = _started(ep)
    await bus.publish_raw(s.EPISODES, s.encode(event), key=ep)
    await got.wait(1)
    assert got.messages[0].event == event


async def test_batch_subscriber(bus: Bus) -> None:
    keys = [_ep() for _ in range(6)]
    got = Collector()
    await bus.subscribe_batch(s.EPISODES, "batcher", got.batch, max_batch=16, max_wait_s=0.05)
    for seq in range(10):
        for key in keys:
            await bus.publish(s.EPISODES, call_event(key, seq, size=300))
    await got.wait(60)
    assert got.seqs() == {k: list(range(10)) for k in keys}
    assert max(got.batches) <= 16


async def test_batch_subscriber_gets_the_end_of_a_backlog_without_waiting(bus: Bus) -> None:
    # max_wait_s gathers a trickle; after a full batch the rest of the backlog must come at once.
    ep = _ep()
    for seq in range(15):
        await bus.publish(s.EPISODES, call_event(ep, seq, size=300))
    got = Collector()
    await bus.subscribe_batch(s.EPISODES, "catch-up", got.batch, max_batch=10, max_wait_s=30.0)
    await got.wait(15, within_s=10.0)
    assert got.batches == [10, 5]
    assert got.seqs() == {ep: list(range(15))}


async def test_batch_poison_message_alone_goes_to_dead_letter(bus: Bus) -> None:
    ep = _ep()
    got, dead = Collector(), Collector()

    async def handler(messages: Sequence[Message]) -> None:
        if any(isinstance(m.event, s.LLMCallRecorded) and m.event.call_seq == 2 for m in messages):
            raise ValueError("poison")
        await got.batch(messages)

    await bus.subscribe(s.DEADLETTER, "dl-reader", dead)
    await bus.subscribe_batch(s.EPISODES, "batcher", handler, max_batch=50, max_wait_s=0.2, max_retries=1)
    for seq in range(5):
        await bus.publish(s.EPISODES, call_event(ep, seq, size=300))
    await got.wait(4)
    await dead.wait(1)
    assert got.seqs() == {ep: [0, 1, 3, 4]}
    (letter,) = _dead(dead)
    assert letter.error_type == "ValueError" and json.loads(letter.payload)["call_seq"] == 2


async def test_lag_counts_uncommitted(bus: Bus) -> None:
    ep = _ep()
    release = asyncio.Event()
    got = Collector()

    async def slow(message: Message) -> None:
        await release.wait()
        await got(message)

    await bus.subscribe(s.EPISODES, "slow", slow)
    for seq in range(4):
        await bus.publish(s.EPISODES, call_event(ep, seq, size=300))
    assert await bus.lag(s.EPISODES, "slow") == 4
    release.set()
    await got.wait(4)
    await wait_until(lambda: _lag_is(bus, "slow", 0), what="lag 0")


async def test_subscribers_of_one_group_share_the_work(bus: Bus) -> None:
    a, b = Collector(), Collector()
    await bus.subscribe(s.EPISODES, "workers", a)
    await bus.subscribe(s.EPISODES, "workers", b)
    keys = [_ep() for _ in range(30)]
    for key in keys:
        await bus.publish(s.EPISODES, call_event(key, 0, size=300))
    await wait_until(lambda: len(a.messages) + len(b.messages) >= 30, 30, "30 deliveries")
    delivered = [m.key for m in a.messages + b.messages]
    assert sorted(delivered) == sorted(keys)  # each event once in the group
    assert not {m.partition for m in a.messages} & {m.partition for m in b.messages}


async def test_stop_lets_the_in_flight_handler_finish_and_commits_it(bus: Bus) -> None:
    ep = _ep()
    started, release = asyncio.Event(), asyncio.Event()
    finished: list[int] = []

    async def slow(message: Message) -> None:
        started.set()
        await release.wait()
        assert isinstance(message.event, s.LLMCallRecorded)
        finished.append(message.event.call_seq)

    sub = await bus.subscribe(s.EPISODES, "stopper", slow)
    await bus.publish(s.EPISODES, call_event(ep, 0, size=300))
    await asyncio.wait_for(started.wait(), 20)
    stopping = asyncio.create_task(sub.stop())
    done, _ = await asyncio.wait({stopping}, timeout=0.1)
    assert not done, "stop() must wait for the in-flight handler"
    release.set()
    await asyncio.wait_for(stopping, 20)
    assert finished == [0]
    await wait_until(lambda: _lag_is(bus, "stopper", 0), what="the offset committed")
