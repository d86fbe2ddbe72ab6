"""The in-process bus: Kafka's semantics inside one event loop, for the embedded runtime.

- A topic is a list of partitions; the key decides the partition (murmur2, as Kafka does), so per-key
  order holds. Partition counts come from ``schemas.spec_for``.
- Every consumer group sees every event. Within a group, each partition is worked by one task at a
  time, so one handler per partition is in flight (partitions of one group run concurrently). Several
  subscribers in one group split the partitions between them, as Kafka consumers in a group do.
- Offsets are committed per (group, partition) after the handler returned; a group that subscribes
  again resumes after its last committed offset. A new group starts at the beginning of the retained
  history (``from_beginning=True``) or at the end.
- ``publish`` appends and wakes the consumers; it never runs a handler. It waits (backpressure) while
  an active group's backlog on the target partition is at ``max_backlog``. Publishes made from inside
  a handler of this bus do not wait: a handler publishing to a topic whose consumers wait on that
  handler would otherwise deadlock (the Kafka log is unbounded; this queue is not).
- A handler that raises is retried ``max_retries`` times, then the message goes to
  ``flywheel.deadletter`` and the partition moves on. Raw bytes that do not decode are stored as
  they are and dead-lettered by each group that reaches them, as on Kafka.
- History is bounded: records every group has committed are trimmed down to ``retain`` per partition,
  and no partition keeps much more than ``max_retained`` records (checked every ``retain`` appends);
  a group further behind resumes at the oldest record kept, like ``auto.offset.reset=earliest``.

Events are stored as the frozen, already-validated objects that were published: nothing is
re-serialised on the way through.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from contextvars import ContextVar

from infra.bus.base import BatchHandler, BusClosedError, BusError, Handler, Message
from infra.bus.deadletter import dead_letter
from infra.bus.partitioner import partition_for
from infra.logging import get_logger
from schemas import DEADLETTER, AnyEvent, EventDecodeError, TopicSpec, decode, key_for, spec_for

log = get_logger(__name__)

# True inside the bus's own consumer tasks: publishes from handlers skip backpressure (see docstring).
_IN_CONSUMER: ContextVar[bool] = ContextVar("flywheel_memory_bus_consumer", default=False)


class _Bad:
    """A raw message that did not decode, kept in the log where the event would be."""

    __slots__ = ("error", "raw")

    def __init__(self, raw: bytes, error: str) -> None:
        self.raw = raw
        self.error = error


# The log of a partition is two parallel lists (keys, items): no per-record container object, which
# keeps allocations (and the garbage collector's work) off the hot path.
Item = AnyEvent | _Bad


class _Partition:
    __slots__ = ("base", "index", "items", "keys", "next_trim", "waiters")

    def __init__(self, index: int, retain: int) -> None:
        self.index = index
        self.keys: list[str] = []
        self.items: list[Item] = []
        self.base = 0  # offset of items[0]
        self.waiters: set[asyncio.Future[None]] = set()
        self.next_trim = 2 * retain

    @property
    def end(self) -> int:
        return self.base + len(self.items)

    def notify(self) -> None:
        if self.waiters:
            for fut in self.waiters:
                if not fut.done():
                    fut.set_result(None)
            self.waiters.clear()


class _Topic:
    def __init__(self, spec: TopicSpec, retain: int) -> None:
        self.name = spec.name
        self.spec = spec
        self.partitions = [_Partition(i, retain) for i in range(spec.partitions)]
        self.groups: dict[str, _Group] = {}
        self.active: list[_Group] = []  # groups with at least one subscriber


class _Member:
    """One subscription: a handler (or batch handler) in a group."""

    def __init__(
        self,
        group: _Group,
        handler: Handler | None,
        batch_handler: BatchHandler | None,
        max_retries: int,
        max_batch: int,
        max_wait_s: float,
    ) -> None:
        self._group = group
        self.topic = group.topic.name
        self.group = group.name
        self.handler = handler
        self.batch_handler = batch_handler
        self.max_retries = max_retries
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.task: asyncio.Task[None] | None = None  # batch members own a task
        self.busy = False
        self.inflight = 0
        self.drained: asyncio.Future[None] | None = None  # set when inflight drops to 0 (for leave)

    def done_one(self) -> None:
        self.inflight -= 1
        if not self.inflight and self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    async def stop(self) -> None:
        """Stop consuming; an in-flight handler finishes and its offset is committed."""
        await self._group.leave(self)


MemorySubscription = _Member


async def _stop_task(task: asyncio.Task[None], busy: bool, grace_s: float) -> None:
    """Cancel a consumer task that waits for data; give a busy one ``grace_s`` to finish its message."""
    if task is asyncio.current_task():
        return  # a handler stopping its own subscription: the task returns after this message
    if busy:
        done, _ = await asyncio.wait({task}, timeout=grace_s)
        if not done:
            log.warning("bus.stop_timeout", task=task.get_name(), grace_s=grace_s)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class _Group:
    def __init__(self, bus: MemoryBus, topic: _Topic, name: str, batch: bool, from_beginning: bool) -> None:
        self.bus = bus
        self.topic = topic
        self.name = name
        self.batch = batch
        parts = topic.partitions
        self.committed = [p.base if from_beginning else p.end for p in parts]
        self.members: list[_Member] = []
        self.space: list[list[asyncio.Future[None]]] = [[] for _ in parts]
        self.workers: list[asyncio.Task[None]] = []
        self.busy = [False] * len(parts)
        self.claimed: set[int] = set()  # partitions a batch member is working on
        self.rebalanced: set[asyncio.Future[None]] = set()
        self.generation = 0  # bumped when the group goes idle, so late workers of the last run retire

    # membership ---------------------------------------------------------------------------------------

    def join(self, member: _Member) -> None:
        self.members.append(member)
        if len(self.members) == 1:
            self.topic.active.append(self)
            if not self.batch:
                self.workers = [
                    asyncio.create_task(
                        self._run_partition(p, self.generation), name=f"bus:{self.topic.name}:{self.name}:{p}"
                    )
                    for p in range(len(self.topic.partitions))
                ]
        if self.batch:
            member.task = asyncio.create_task(
                self._run_batch(member), name=f"bus:{self.topic.name}:{self.name}:batch"
            )
        self._wake_rebalanced()

    async def leave(self, member: _Member) -> None:
        if member not in self.members:
            return
        self.members.remove(member)
        self._wake_rebalanced()
        if member.task is not None:
            await _stop_task(member.task, member.busy, self.bus.stop_grace_s)
        if not self.members:
            self.generation += 1
            self.topic.active.remove(self)
            for p in range(len(self.space)):
                self._release_space(p, force=True)
            workers, self.workers = self.workers, []
            for p, task in enumerate(workers):
                await _stop_task(task, self.busy[p], self.bus.stop_grace_s)
        elif member.inflight and asyncio.current_task() is not member.task:
            member.drained = asyncio.get_running_loop().create_future()
            await asyncio.wait({member.drained}, timeout=self.bus.stop_grace_s)

    def _wake_rebalanced(self) -> None:
        for fut in self.rebalanced:
            if not fut.done():
                fut.set_result(None)
        self.rebalanced.clear()

    def _assigned(self, member: _Member) -> list[int]:
        n = len(self.members)
        if member not in self.members:
            return []
        i = self.members.index(member)
        return [p for p in range(len(self.topic.partitions)) if p % n == i and p not in self.claimed]

    # backpressure -------------------------------------------------------------------------------------

    def backlog(self, p: int) -> int:
        part = self.topic.partitions[p]
        return part.end - max(self.committed[p], part.base)

    def _release_space(self, p: int, force: bool = False) -> None:
        waiters = self.space[p]
        if waiters and (force or self.backlog(p) <= self.bus.max_backlog // 2):
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
            waiters.clear()

    def _commit(self, p: int, offset: int) -> None:
        if offset + 1 > self.committed[p]:
            self.committed[p] = offset + 1
        if self.space[p]:
            self._release_space(p)

    # consuming ----------------------------------------------------------------------------------------

    async def _run_partition(self, p: int, generation: int) -> None:
        _IN_CONSUMER.set(True)
        part = self.topic.partitions[p]
        loop = asyncio.get_running_loop()
        members = self.members
        topic = self.topic.name
        while members and generation == self.generation:
            offset = self.committed[p]
            if offset < part.base:
                offset = part.base
            if offset >= part.base + len(part.items):
                fut: asyncio.Future[None] = loop.create_future()
                part.waiters.add(fut)
                await fut
                continue
            member = members[p % len(members)]
            i = offset - part.base
            item, key = part.items[i], part.keys[i]
            self.busy[p] = True
            member.inflight += 1
            try:
                handler = member.handler
                if handler is not None and not isinstance(item, _Bad):
                    try:  # the hot path: one call, no retry bookkeeping
                        await handler(Message(item, topic, p, offset, key))
                    except Exception:
                        await self._deliver(member, p, offset, key, item, first_failed=True)
                else:
                    await self._deliver(member, p, offset, key, item)
                self._commit(p, offset)
            finally:
                self.busy[p] = False
                member.done_one()

    async def _deliver(
        self, member: _Member, p: int, offset: int, key: str, item: Item, first_failed: bool = False
    ) -> None:
        if isinstance(item, _Bad):
            await self.bus.dead_letter(self, p, offset, key, item, item.error, 1)
            return
        message = Message(item, self.topic.name, p, offset, key)
        attempts = 0
        if first_failed:
            attempts = 1
            await asyncio.sleep(self.bus.retry_backoff(1))
        while True:
            attempts += 1
            try:
                if member.handler is not None:
                    await member.handler(message)
                else:
                    assert member.batch_handler is not None
                    await member.batch_handler([message])
                return
            except Exception as exc:
                if attempts > member.max_retries:
                    await self.bus.dead_letter(self, p, offset, key, item, exc, attempts)
                    return
                await asyncio.sleep(self.bus.retry_backoff(attempts))

    async def _run_batch(self, member: _Member) -> None:
        _IN_CONSUMER.set(True)
        loop = asyncio.get_running_loop()
        while member in self.members:
            taken: dict[int, list[tuple[int, str, Item]]] = {}
            try:
                deadline: float | None = None
                while True:
                    self._take(member, taken)
                    count = sum(len(v) for v in taken.values())
                    if count >= member.max_batch:
                        break
                    if count and deadline is None:
                        deadline = loop.time() + member.max_wait_s
                    timeout = None if deadline is None else deadline - loop.time()
                    if timeout is not None and timeout <= 0:
                        break
                    await self._wait_data(member, list(taken) + self._assigned(member), timeout)
                    if member not in self.members:
                        return
                member.busy = True
                member.inflight += 1
                await self._deliver_batch(member, taken)
            finally:
                self.claimed.difference_update(taken)
                if member.busy:
                    member.busy = False
                    member.done_one()

    def _take(self, member: _Member, taken: dict[int, list[tuple[int, str, Item]]]) -> None:
        """Add available records of this member's partitions to ``taken`` (claiming those partitions)."""
        room = member.max_batch - sum(len(v) for v in taken.values())
        for p in list(taken) + self._assigned(member):
            if room <= 0:
                return
            part = self.topic.partitions[p]
            got = taken.get(p)
            start = got[-1][0] + 1 if got else max(self.committed[p], part.base)
            stop = min(part.end, start + room)
            if stop > start:
                if got is None:
                    got = taken[p] = []
                    self.claimed.add(p)
                b = part.base
                got.extend((o, part.keys[o - b], part.items[o - b]) for o in range(start, stop))
                room -= stop - start

    async def _wait_data(self, member: _Member, partitions: list[int], wait_s: float | None) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        parts = [self.topic.partitions[p] for p in partitions]
        for part in parts:
            part.waiters.add(fut)
        self.rebalanced.add(fut)
        try:
            await asyncio.wait({fut}, timeout=wait_s)
        finally:
            for part in parts:
                part.waiters.discard(fut)
            self.rebalanced.discard(fut)
            fut.cancel()

    async def _deliver_batch(self, member: _Member, taken: dict[int, list[tuple[int, str, Item]]]) -> None:
        assert member.batch_handler is not None
        good: list[Message] = []
        for p, entries in taken.items():
            for offset, key, item in entries:
                if isinstance(item, _Bad):
                    await self.bus.dead_letter(self, p, offset, key, item, item.error, 1)
                else:
                    good.append(Message(item, self.topic.name, p, offset, key))
        attempts = 0
        while good:
            attempts += 1
            try:
                await member.batch_handler(good)
                break
            except Exception:
                if attempts > member.max_retries:
                    # Find the poison messages: each one alone, with its own retries.
                    for m in good:
                        await self._deliver(member, m.partition, m.offset, m.key, m.event)
                    break
                await asyncio.sleep(self.bus.retry_backoff(attempts))
        for p, entries in taken.items():
            self._commit(p, entries[-1][0])


class MemoryBus:
    """In-process implementation of :class:`infra.bus.Bus` (see the module docstring)."""

    def __init__(
        self,
        *,
        prefix: str = "",
        max_backlog: int = 10_000,
        retain: int = 10_000,
        max_retained: int = 200_000,
        retry_backoff_s: float = 0.01,
        stop_grace_s: float = 10.0,
    ) -> None:
        self.prefix = prefix  # one MemoryBus is one namespace; the prefix is kept for parity and logs
        self.max_backlog = max_backlog
        self._retain = retain
        self._max_retained = max(max_retained, retain)
        self._retry_backoff_s = retry_backoff_s
        self.stop_grace_s = stop_grace_s  # how long stop() lets an in-flight handler finish
        self._topics: dict[str, _Topic] = {}
        self._running = False

    # lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._running = True

    async def stop(self) -> None:
        self._running = False
        for topic in list(self._topics.values()):
            for group in list(topic.groups.values()):
                for member in list(group.members):
                    await member.stop()

    async def __aenter__(self) -> MemoryBus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _check_running(self) -> None:
        if not self._running:
            raise BusClosedError("the in-process bus is not running (call start())")

    def _topic(self, name: str) -> _Topic:
        topic = self._topics.get(name)
        if topic is None:
            try:
                spec = spec_for(name)
            except KeyError as exc:
                raise BusError(f"unknown topic {name!r}") from exc
            topic = self._topics[name] = _Topic(spec, self._retain)
        return topic

    def retry_backoff(self, attempt: int) -> float:
        return float(min(self._retry_backoff_s * 2 ** (attempt - 1), 1.0))

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
        await self._append(t, key, event)

    async def publish_raw(self, topic: str, data: bytes, *, key: str) -> None:
        self._check_running()
        t = self._topic(topic)
        try:
            item: Item = decode(topic, data)
        except EventDecodeError as exc:
            item = _Bad(bytes(data), str(exc))
        await self._append(t, key, item)

    async def _append(self, topic: _Topic, key: str, item: Item) -> None:
        p = partition_for(key, len(topic.partitions))
        part = topic.partitions[p]
        if topic.active and not _IN_CONSUMER.get():
            full = part.base + len(part.items) - self.max_backlog
            for group in tuple(topic.active):
                if group.committed[p] > full:
                    continue  # the common case: room in this group's queue
                while group.members and group.backlog(p) >= self.max_backlog:
                    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    group.space[p].append(fut)
                    await fut
        part.keys.append(key)
        part.items.append(item)
        if part.waiters:
            part.notify()
        if len(part.items) >= part.next_trim:
            self._trim(topic, part)

    def _trim(self, topic: _Topic, part: _Partition) -> None:
        p = part.index
        floor = min((g.committed[p] for g in topic.groups.values()), default=part.end)
        cut = max(min(floor, part.end - self._retain), part.end - self._max_retained) - part.base
        if cut > 0:
            del part.keys[:cut]
            del part.items[:cut]
            part.base += cut
        part.next_trim = len(part.items) + self._retain

    async def dead_letter(
        self,
        group: _Group,
        p: int,
        offset: int,
        key: str,
        item: Item,
        error: BaseException | str,
        attempts: int,
    ) -> None:
        topic = group.topic.name
        log.warning(
            "bus.dead_letter",
            topic=topic,
            partition=p,
            offset=offset,
            group=group.name,
            error=str(error)[:500],
            attempts=attempts,
        )
        if topic == DEADLETTER:
            return  # never dead-letter a dead letter
        letter = dead_letter(
            topic=topic,
            partition=p,
            offset=offset,
            key=key,
            group=group.name,
            error=error,
            attempts=attempts,
            event=None if isinstance(item, _Bad) else item,
            raw=item.raw if isinstance(item, _Bad) else None,
        )
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
    ) -> MemorySubscription:
        return self._join(topic, group, handler, None, from_beginning, max_retries, 1, 0.0)

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
    ) -> MemorySubscription:
        return self._join(topic, group, None, handler, from_beginning, max_retries, max_batch, max_wait_s)

    def _join(
        self,
        topic: str,
        group: str,
        handler: Handler | None,
        batch_handler: BatchHandler | None,
        from_beginning: bool,
        max_retries: int,
        max_batch: int,
        max_wait_s: float,
    ) -> _Member:
        self._check_running()
        if max_batch < 1 or max_retries < 0:
            raise ValueError("max_batch must be ≥ 1 and max_retries ≥ 0")
        t = self._topic(topic)
        batch = batch_handler is not None
        g = t.groups.get(group)
        if g is None:
            g = t.groups[group] = _Group(self, t, group, batch, from_beginning)
        elif g.members and g.batch != batch:
            raise BusError(f"group {group!r} on {topic} mixes batch and single-message subscribers")
        g.batch = batch
        member = _Member(g, handler, batch_handler, max_retries, max_batch, max_wait_s)
        g.join(member)
        return member
