"""The consumer loop of both buses, written once over a backend's small fetch/commit blocks.

A subscription is a :class:`Consumer`: one task that, until it is stopped,

1. fetches a block of records from the partitions its group gave it (``Fetcher.fetch``); a batch
   subscriber keeps fetching for up to ``max_wait_s`` after the first record, unless the last batch
   was full (then it is working through a backlog and the rest is delivered at once);
2. hands the block over: a single-message handler gets the records of each partition in order, the
   partitions of a block concurrently; a batch handler gets the whole block. The delivery policy
   (retries with backoff, the poison message of a batch, dead letters) is ``infra.bus.delivery``;
   a record that does not decode is dead-lettered at once (``infra.bus.deadletter``);
3. acknowledges each record once handled (``Fetcher.ack``) and commits the block (``Fetcher.commit``).
   When handing a block over fails (the broker went away, a dead letter could not be published), the
   block is given back (``Fetcher.rewind``) and fetched again a second later.

``stop`` lets the in-flight record (or batch) finish and commits it, then leaves the group
(``Fetcher.close``). While a block is in flight the fetcher's ``idle`` event is clear: Kafka hands a
revoked partition over only once it is set again.

What differs between the buses is only the :class:`Fetcher`: ``infra.bus.memory_group`` reads the
in-process log, ``infra.bus.kafka_consumer`` an aiokafka consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from infra.bus.base import BatchHandler, Handler, Message, new_message
from infra.bus.deadletter import Parking, dead_letter, deliver
from infra.bus.delivery import RetryPolicy, deliver_batch, deliver_one
from infra.logging import get_logger
from schemas import DEADLETTER, DeadLetter, EventDecodeError, decode

log = get_logger(__name__)


class Undecodable(NamedTuple):
    """A record whose bytes are not an event of its topic, with the reason."""

    partition: int
    offset: int
    key: str
    raw: bytes
    error: str


Entry = Message | Undecodable
Block = dict[int, list[Entry]]
"""Fetched records: partition → its records in offset order."""


def decode_entry(topic: str, partition: int, offset: int, key: str, raw: bytes) -> Entry:
    """The message of a record's bytes (the bytes go along), or why they are not an event."""
    try:
        event = decode(topic, raw)
    except EventDecodeError as exc:
        return Undecodable(partition, offset, key, raw, str(exc))
    return new_message(event, topic, partition, offset, key, raw)


class Fetcher(Protocol):
    """A backend's part of one subscription: where records come from and where offsets go."""

    idle: asyncio.Event

    async def fetch(self, max_records: int, timeout_s: float) -> Block:
        """Up to ``max_records`` records after those fetched since the last commit; ``{}`` after
        ``timeout_s`` without any."""

    def ack(self, partition: int, offset: int) -> None:
        """The record at ``offset`` (and those before it) was handled."""

    async def commit(self) -> None:
        """Make the acknowledged offsets durable and release the block's partitions."""

    async def rewind(self) -> None:
        """Forget the block: its records that were not committed are fetched again."""

    async def close(self) -> None:
        """Leave the group (after the loop ended)."""


PublishDeadLetter = Callable[[DeadLetter, str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Subscriber:
    """What ``Bus.subscribe`` (a handler) or ``Bus.subscribe_batch`` (a batch handler) asked for."""

    handler: Handler | None
    batch_handler: BatchHandler | None
    from_beginning: bool
    max_retries: int
    max_batch: int = 500  # a single-message subscriber's fetch
    max_wait_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_retries < 0:
            raise ValueError("max_batch must be ≥ 1 and max_retries ≥ 0")


class Consumer:
    """One subscription: the loop of the module docstring over ``fetcher``."""

    def __init__(
        self,
        fetcher: Fetcher,
        topic: str,
        group: str,
        subscriber: Subscriber,
        *,
        policy: RetryPolicy,
        stop_grace_s: float,
        publish_dead_letter: PublishDeadLetter,
        parking: Parking,
        poll_s: float = 1.0,
        on_stop: Callable[[Consumer], None] | None = None,
    ) -> None:
        self.topic = topic
        self.group = group
        self._fetcher = fetcher
        self._handler = subscriber.handler
        self._batch_handler = subscriber.batch_handler
        self._policy = policy
        self._max_batch = subscriber.max_batch
        self._max_wait_s = subscriber.max_wait_s
        self._stop_grace_s = stop_grace_s  # how long stop() lets an in-flight block finish
        self._publish_dead_letter = publish_dead_letter
        self._parking = parking
        self._poll_s = poll_s  # how often an idle loop looks whether it was stopped
        self._on_stop = on_stop  # the bus forgets a stopped subscription
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"bus:{self.topic}:{self.group}")

    async def stop(self) -> None:
        """Stop consuming; the in-flight handler finishes and its offset is committed."""
        if self._stopping:
            return
        self._stopping = True
        task = self._task
        if task is not None and task is not asyncio.current_task():
            if not self._fetcher.idle.is_set():
                done, _ = await asyncio.wait({task}, timeout=self._stop_grace_s)
                if not done:
                    log.warning("bus.stop_timeout", topic=self.topic, group=self.group)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._fetcher.close()
        if self._on_stop is not None:
            self._on_stop(self)

    # the loop -----------------------------------------------------------------------------------------

    async def _run(self) -> None:
        fetcher = self._fetcher
        batch = self._batch_handler is not None
        draining = False  # the last batch was full: no wait for the rest of a backlog
        while not self._stopping:
            try:
                block = await fetcher.fetch(self._max_batch, self._poll_s)
                if batch and self._max_wait_s and not draining:
                    block = await self._fill(block)
                count = sum(map(len, block.values()))
                draining = count >= self._max_batch
                if not count:
                    continue
                fetcher.idle.clear()
                try:
                    await self._hand_over(block)
                    await fetcher.commit()
                finally:
                    fetcher.idle.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Nothing after the last acknowledged record was handled: fetch the block again.
                log.error("bus.consumer_error", topic=self.topic, group=self.group, error=repr(exc))
                await asyncio.sleep(1.0)
                await fetcher.rewind()

    async def _fill(self, block: Block) -> Block:
        """Keep fetching for up to ``max_wait_s`` after the first record, until ``max_batch``."""
        count = sum(map(len, block.values()))
        if not count or count >= self._max_batch:
            return block
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_wait_s
        while count < self._max_batch and not self._stopping:
            left = deadline - loop.time()
            if left <= 0:
                break
            for p, entries in (await self._fetcher.fetch(self._max_batch - count, left)).items():
                block.setdefault(p, []).extend(entries)
                count += len(entries)
        return block

    async def _hand_over(self, block: Block) -> None:
        if self._batch_handler is not None:
            await self._handle_batch(self._batch_handler, block)
            for p, entries in block.items():
                self._fetcher.ack(p, entries[-1].offset)
        elif len(block) == 1:
            for entries in block.values():
                await self._handle_partition(entries)
        else:
            # One task per partition (in order within it); one failure cancels the rest.
            async with asyncio.TaskGroup() as tg:
                for entries in block.values():
                    tg.create_task(self._handle_partition(entries))

    async def _handle_partition(self, entries: list[Entry]) -> None:
        handler = self._handler
        assert handler is not None
        ack = self._fetcher.ack
        for entry in entries:
            if self._stopping:
                return  # the rest is fetched again, by this group's next owner of the partition
            if isinstance(entry, Undecodable):
                await self._dead_letter(entry, entry.error, 1)
            else:
                try:  # the hot path: one call, no retry bookkeeping
                    await handler(entry)
                except Exception:
                    await self._deliver(entry, failed_once=True)
            ack(entry.partition, entry.offset)

    async def _handle_batch(self, batch_handler: BatchHandler, block: Block) -> None:
        good: list[Message] = []
        for entries in block.values():
            for entry in entries:
                if isinstance(entry, Undecodable):
                    await self._dead_letter(entry, entry.error, 1)
                else:
                    good.append(entry)

        async def one_by_one() -> None:  # find the poison messages: each alone, with its own retries
            for message in good:
                await self._deliver(message)

        if good:
            await deliver_batch(lambda: batch_handler(good), self._policy, one_by_one)

    async def _deliver(self, message: Message, *, failed_once: bool = False) -> None:
        handler, batch_handler = self._handler, self._batch_handler

        async def handle() -> None:
            if handler is not None:
                await handler(message)
            else:
                assert batch_handler is not None
                await batch_handler([message])

        async def dead(exc: BaseException, attempts: int) -> None:
            await self._dead_letter(message, exc, attempts)

        await deliver_one(handle, self._policy, dead, failed_once=failed_once)

    async def _dead_letter(self, entry: Entry, error: BaseException | str, attempts: int) -> None:
        log.warning(
            "bus.dead_letter",
            topic=self.topic,
            partition=entry.partition,
            offset=entry.offset,
            group=self.group,
            error=str(error)[:500],
            attempts=attempts,
        )
        if self.topic == DEADLETTER:
            return  # never dead-letter a dead letter
        raw = entry.raw  # the original bytes where the bus kept them, else the event is encoded again
        letter = dead_letter(
            topic=self.topic,
            partition=entry.partition,
            offset=entry.offset,
            key=entry.key or None,
            group=self.group,
            error=error,
            attempts=attempts,
            event=entry.event if raw is None and isinstance(entry, Message) else None,
            raw=raw,
        )
        key = entry.key

        async def publish(letter: DeadLetter) -> None:
            await self._publish_dead_letter(letter, key)

        # Returns once the letter is on the topic or parked in the local file; only then is the poison
        # message acknowledged (infra.bus.deadletter).
        await deliver(letter, publish, self._parking, backoff_s=self._policy.backoff_s)
