"""The in-process bus: Kafka's semantics inside one event loop, for the embedded runtime.

- A topic is a list of partitions; the key decides the partition (murmur2, as Kafka does), so per-key
  order holds. Partition counts come from ``schemas.spec_for``.
- Every consumer group sees every event. Within a group, each partition is worked by one subscriber at
  a time, so one handler per partition is in flight (the partitions of a fetched block run
  concurrently). Several subscribers in one group split the partitions between them, as Kafka
  consumers in a group do; the consuming itself is the loop both buses share (``infra.bus.consumer``).
- Offsets are committed per (group, partition) after the handler returned; a group that subscribes
  again resumes after its last committed offset. A new group starts at the beginning of the retained
  history (``from_beginning=True``) or at the end.
- ``publish`` appends and wakes the consumers; it never runs a handler. It waits (backpressure) while
  an active group's backlog on the target partition is at ``max_backlog``. Publishes made from inside
  a handler of this bus do not wait: a handler publishing to a topic whose consumers wait on that
  handler would otherwise deadlock (the Kafka log is unbounded; this queue is not).
- A handler that raises is retried ``max_retries`` times, then the message goes to
  ``flywheel.deadletter`` and the partition moves on (the consumer loop of ``infra.bus.consumer``,
  shared with Kafka). Raw bytes that do not decode are stored as they are and dead-lettered by each
  group that reaches them, as on Kafka.
- History is bounded: records every group has committed are trimmed down to ``retain`` per partition,
  and no partition keeps much more than ``max_retained`` records (checked every ``retain`` appends);
  a group further behind resumes at the oldest record kept, like ``auto.offset.reset=earliest``.
  ``retain`` is small by default (32): Kafka's log is on disk, this one is in memory, and a retained
  call event is ~10 KB of objects, so 10,000 per partition (the old default) was 16 × 10,000 calls on
  ``flywheel.episodes`` before the first trim — a process that grew for hours before it levelled off.
  A group joining later (the ops routes on ``flywheel.control``) needs the latest records, not all.

Events are stored as the frozen, already-validated objects that were published: nothing is
re-serialised on the way through. While a bus runs, the process's garbage collector follows
``infra.bus.gc_policy`` (the log's objects are tenured instead of being walked again and again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from infra.bus import gc_policy
from infra.bus.base import (
    Assigned,
    BatchHandler,
    BusClosedError,
    BusError,
    BusUnavailableError,
    Handler,
    Message,
)
from infra.bus.consumer import Consumer, Subscriber
from infra.bus.deadletter import DEFAULT_PARK_PATH, Parking
from infra.bus.delivery import RetryPolicy
from infra.bus.memory_group import IN_CONSUMER, Bad, Group, Item, Member, Partition, Topic
from infra.bus.partitioner import partition_for
from schemas import DEADLETTER, AnyEvent, DeadLetter, EventDecodeError, decode, key_for, spec_for

__all__ = ["MemoryBus"]


class MemoryBus:
    """In-process implementation of :class:`infra.bus.Bus` (see the module docstring)."""

    def __init__(
        self,
        *,
        prefix: str = "",
        max_backlog: int = 10_000,
        retain: int = 32,
        max_retained: int = 200_000,
        retry_backoff_s: float = 0.01,
        stop_grace_s: float = 10.0,
        publish_timeout_s: float = 10.0,
        park_path: Path = DEFAULT_PARK_PATH,
    ) -> None:
        self.prefix = prefix  # one MemoryBus is one namespace; the prefix is kept for parity and logs
        self.max_backlog = max_backlog
        self._retain = retain
        self._max_retained = max(max_retained, retain)
        self._retry_backoff_s = retry_backoff_s
        self.stop_grace_s = stop_grace_s  # how long stop() lets an in-flight handler finish
        self.publish_timeout_s = publish_timeout_s  # how long a publish waits for backlog room
        self._topics: dict[str, Topic] = {}
        self._subscriptions: set[Consumer] = set()
        self._running = False
        self._gc = gc_policy.POLICY  # process-wide: see infra.bus.gc_policy
        self.parking = Parking(park_path)  # dead letters the bus could not take (infra.bus.deadletter)

    # lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        if not self._running:
            self._running = True
            self._gc.acquire()

    async def stop(self) -> None:
        if self._running:
            self._gc.release()
        self._running = False
        for sub in list(self._subscriptions):
            await sub.stop()

    async def __aenter__(self) -> MemoryBus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _check_running(self) -> None:
        if not self._running:
            raise BusClosedError("the in-process bus is not running (call start())")

    def _topic(self, name: str) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            try:
                spec = spec_for(name)
            except KeyError as exc:
                raise BusError(f"unknown topic {name!r}") from exc
            topic = self._topics[name] = Topic(spec, self._retain)
        return topic

    def retry_policy(self, max_retries: int) -> RetryPolicy:
        return RetryPolicy(max_retries, self._retry_backoff_s, max_backoff_s=1.0)

    # topics -------------------------------------------------------------------------------------------

    async def ensure_topics(self, topics: Sequence[str]) -> None:
        for name in topics:
            self._topic(name)

    async def list_topics(self) -> list[str]:
        return sorted(self._topics)

    async def lag(self, topic: str, group: str) -> int:
        """Messages of ``topic`` that ``group`` has not committed (all retained ones for an unknown group)."""
        t = self._topics.get(topic)
        if t is None:
            return 0
        g = t.groups.get(group)
        if g is None:
            return sum(len(p.items) for p in t.partitions)
        return sum(g.backlog(p) for p in range(len(t.partitions)))

    # publishing ---------------------------------------------------------------------------------------

    async def publish(self, topic: str, event: AnyEvent, *, key: str | None = None) -> None:
        if not self._running:
            self._check_running()
        t = self._topics.get(topic) or self._topic(topic)
        if type(event) not in t.spec.event_types:
            raise BusError(f"{type(event).__name__} does not belong on topic {topic}")
        if key is None:
            key = key_for(event)
        # ``_append`` inlined: one coroutine per publish instead of two (the hot path).
        p = partition_for(key, t.count)
        if t.active and not IN_CONSUMER.get() and self._full(t, p):
            await self._wait_for_room(t, p)
        self._put(t, p, key, event)

    async def publish_raw(self, topic: str, data: bytes, *, key: str) -> None:
        self._check_running()
        t = self._topic(topic)
        try:
            item: Item = decode(topic, data)
        except EventDecodeError as exc:
            item = Bad(bytes(data), str(exc))
        await self._append(t, key, item)

    async def _append(self, topic: Topic, key: str, item: Item) -> None:
        p = partition_for(key, topic.count)
        if topic.active and not IN_CONSUMER.get() and self._full(topic, p):
            await self._wait_for_room(topic, p)
        self._put(topic, p, key, item)

    def _full(self, topic: Topic, p: int) -> bool:
        """Whether some active group's backlog on partition ``p`` is at ``max_backlog`` (rare)."""
        part = topic.partitions[p]
        full = part.base + len(part.items) - self.max_backlog
        for group in topic.active:  # noqa: SIM110 (any() builds a generator on every publish)
            if group.committed[p] <= full:
                return True
        return False

    def _put(self, topic: Topic, p: int, key: str, item: Item) -> None:
        part = topic.partitions[p]
        part.keys.append(key)
        part.items.append(item)
        if part.waiters:
            part.notify()
        if len(part.items) >= part.next_trim:
            self._trim(topic, part)
        self._gc.appended()

    async def _wait_for_room(self, topic: Topic, p: int) -> None:
        """Backpressure: wait until every active group's backlog on partition ``p`` has room.

        Bounded like a broker's acknowledgement: after ``publish_timeout_s`` the publish fails with
        :class:`BusUnavailableError` (a consumer that stopped making progress), so callers need no timer
        of their own around :meth:`publish`.
        """
        try:
            async with asyncio.timeout(self.publish_timeout_s):
                for group in tuple(topic.active):
                    while group.members and group.backlog(p) >= self.max_backlog:
                        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                        group.space[p].append(fut)
                        await fut
        except TimeoutError:
            raise BusUnavailableError(
                f"{topic.spec.name}[{p}]: a consumer group's backlog stayed at {self.max_backlog} messages"
                f" for {self.publish_timeout_s}s"
            ) from None

    def _trim(self, topic: Topic, part: Partition) -> None:
        p = part.index
        floor = min((g.committed[p] for g in topic.groups.values()), default=part.end)
        cut = max(min(floor, part.end - self._retain), part.end - self._max_retained) - part.base
        if cut > 0:
            del part.keys[:cut]
            del part.items[:cut]
            part.base += cut
        part.next_trim = len(part.items) + self._retain

    async def _publish_dead_letter(self, letter: DeadLetter, key: str) -> None:
        await self._append(self._topic(DEADLETTER), key, letter)

    # subscribing --------------------------------------------------------------------------------------

    async def subscribe(
        self,
        topic: str,
        group: str,
        handler: Handler,
        *,
        from_beginning: bool = True,
        max_retries: int = 2,
    ) -> Consumer:
        return self._join(topic, group, Subscriber(handler, None, from_beginning, max_retries))

    async def subscribe_batch(
        self,
        topic: str,
        group: str,
        handler: BatchHandler,
        *,
        max_batch: int = 500,
        max_wait_s: float = 0.2,
        from_beginning: bool = True,
        max_retries: int = 2,
        on_assigned: Assigned | None = None,
    ) -> Consumer:
        return self._join(
            topic,
            group,
            Subscriber(None, handler, from_beginning, max_retries, max_batch, max_wait_s),
            on_assigned,
        )

    async def read_partitions(self, topic: str, partitions: Sequence[int]) -> dict[int, list[Message]]:
        """The records still retained: a topic no group reads keeps only its last ``retain`` per partition."""
        t = self._topic(topic)
        out: dict[int, list[Message]] = {}
        for p in partitions:
            part = t.partitions[p]
            out[p] = [
                Message(item, topic, p, part.base + i, part.keys[i])
                for i, item in enumerate(part.items)
                if not isinstance(item, Bad)
            ]
        return out

    def _join(
        self, topic: str, group: str, subscriber: Subscriber, on_assigned: Assigned | None = None
    ) -> Consumer:
        self._check_running()
        t = self._topic(topic)
        batch = subscriber.batch_handler is not None
        g = t.groups.get(group)
        if g is None:
            g = t.groups[group] = Group(t, group, batch, subscriber.from_beginning, self.max_backlog)
        elif g.members and g.batch != batch:
            raise BusError(f"group {group!r} on {topic} mixes batch and single-message subscribers")
        g.batch = batch
        member = Member(g, on_assigned)
        g.join(member)
        sub = Consumer(
            member,
            topic,
            group,
            subscriber,
            policy=self.retry_policy(subscriber.max_retries),
            stop_grace_s=self.stop_grace_s,
            publish_dead_letter=self._publish_dead_letter,
            parking=self.parking,
            on_stop=self._subscriptions.discard,
        )
        self._subscriptions.add(sub)
        sub.start()
        return sub
