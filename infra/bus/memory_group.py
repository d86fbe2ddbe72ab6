"""The in-process bus's log and consumer groups (the bus itself is ``infra.bus.memory``).

A ``Topic`` holds ``Partition`` logs; a ``Group`` holds the committed offsets of one consumer group
on one topic and runs its consumers: one task per partition for single-message subscribers (so one
handler per partition is in flight), one task per member for batch subscribers. ``Member`` is the
subscription handle a subscriber gets back.
"""

from __future__ import annotations

import asyncio
import contextlib
from contextvars import ContextVar
from typing import TYPE_CHECKING

from infra.bus.base import BatchHandler, Handler, Message
from infra.bus.delivery import deliver_batch, deliver_one
from infra.logging import get_logger
from schemas import AnyEvent, TopicSpec

if TYPE_CHECKING:
    from infra.bus.memory import MemoryBus

log = get_logger(__name__)

# True inside the bus's own consumer tasks: publishes from handlers skip backpressure (why: the
# docstring of infra.bus.memory).
IN_CONSUMER: ContextVar[bool] = ContextVar("flywheel_memory_bus_consumer", default=False)

_tuple_new = tuple.__new__  # builds a ``Message`` without its ``__new__`` frame (one per delivery)


class Bad:
    """A raw message that did not decode, kept in the log where the event would be."""

    __slots__ = ("error", "raw")

    def __init__(self, raw: bytes, error: str) -> None:
        self.raw = raw
        self.error = error


# The log of a partition is two parallel lists (keys, items): no per-record container object, which
# keeps allocations (and the garbage collector's work) off the hot path.
Item = AnyEvent | Bad


class Partition:
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


class Topic:
    def __init__(self, spec: TopicSpec, retain: int) -> None:
        self.name = spec.name
        self.spec = spec
        self.partitions = [Partition(i, retain) for i in range(spec.partitions)]
        self.count = spec.partitions
        self.groups: dict[str, Group] = {}
        self.active: list[Group] = []  # groups with at least one subscriber


class Member:
    """One subscription: a handler (or batch handler) in a group."""

    def __init__(
        self,
        group: Group,
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


MemorySubscription = Member


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


class Group:
    def __init__(self, bus: MemoryBus, topic: Topic, name: str, batch: bool, from_beginning: bool) -> None:
        self.bus = bus
        self.topic = topic
        self.name = name
        self.batch = batch
        parts = topic.partitions
        self.committed = [p.base if from_beginning else p.end for p in parts]
        self.members: list[Member] = []
        self.space: list[list[asyncio.Future[None]]] = [[] for _ in parts]
        self.workers: list[asyncio.Task[None]] = []
        self.busy = [False] * len(parts)
        self.claimed: set[int] = set()  # partitions a batch member is working on
        self.rebalanced: set[asyncio.Future[None]] = set()
        self.version = 0  # bumped on every join/leave: partition workers re-pick their member
        self.generation = 0  # bumped when the group goes idle, so late workers of the last run retire

    # membership ---------------------------------------------------------------------------------------

    def join(self, member: Member) -> None:
        self.members.append(member)
        self.version += 1
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

    async def leave(self, member: Member) -> None:
        if member not in self.members:
            return
        self.members.remove(member)
        self.version += 1
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

    def _assigned(self, member: Member) -> list[int]:
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
        IN_CONSUMER.set(True)
        part = self.topic.partitions[p]
        loop = asyncio.get_running_loop()
        members = self.members
        committed = self.committed
        topic = self.topic.name
        while members and generation == self.generation:
            offset = max(committed[p], part.base)
            if offset >= part.base + len(part.items):
                fut: asyncio.Future[None] = loop.create_future()
                part.waiters.add(fut)
                await fut
                continue
            member = members[p % len(members)]
            handler = member.handler
            version = self.version
            self.busy[p] = True
            member.inflight += 1
            try:
                # Work through what is there for this member; stop early on a membership change.
                while version == self.version and generation == self.generation:
                    i = offset - part.base
                    if i >= len(part.items):
                        break
                    item, key = part.items[i], part.keys[i]
                    if handler is not None and not isinstance(item, Bad):
                        try:  # the hot path: one call, no retry bookkeeping
                            await handler(_tuple_new(Message, (item, topic, p, offset, key, None)))
                        except Exception:
                            await self._deliver(member, p, offset, key, item, first_failed=True)
                    else:
                        await self._deliver(member, p, offset, key, item)
                    offset += 1
                    committed[p] = offset
                    if self.space[p]:
                        self._release_space(p)
            finally:
                self.busy[p] = False
                member.done_one()

    async def _deliver(
        self, member: Member, p: int, offset: int, key: str, item: Item, first_failed: bool = False
    ) -> None:
        if isinstance(item, Bad):
            await self.bus.dead_letter(self, p, offset, key, item, item.error, 1)
            return
        message = Message(item, self.topic.name, p, offset, key)
        handler, batch_handler = member.handler, member.batch_handler

        async def handle() -> None:
            if handler is not None:
                await handler(message)
            else:
                assert batch_handler is not None
                await batch_handler([message])

        async def dead(exc: BaseException, attempts: int) -> None:
            await self.bus.dead_letter(self, p, offset, key, item, exc, attempts)

        await deliver_one(handle, self.bus.retry_policy(member.max_retries), dead, failed_once=first_failed)

    async def _run_batch(self, member: Member) -> None:
        IN_CONSUMER.set(True)
        loop = asyncio.get_running_loop()
        # After a full batch the member is working through a backlog: the rest of it is delivered at
        # once. Waiting ``max_wait_s`` gathers a trickle into fewer, larger batches; at the end of a
        # backlog it would only delay what is already there.
        draining = False
        while member in self.members:
            taken: dict[int, list[tuple[int, str, Item]]] = {}
            try:
                deadline: float | None = None
                while True:
                    self._take(member, taken)
                    count = sum(len(v) for v in taken.values())
                    if count >= member.max_batch or (count and draining):
                        break
                    draining = draining and count > 0
                    if count and deadline is None:
                        deadline = loop.time() + member.max_wait_s
                    timeout = None if deadline is None else deadline - loop.time()
                    if timeout is not None and timeout <= 0:
                        break
                    await self._wait_data(member, list(taken) + self._assigned(member), timeout)
                    if member not in self.members:
                        return
                draining = count >= member.max_batch
                member.busy = True
                member.inflight += 1
                await self._deliver_batch(member, taken)
            finally:
                self.claimed.difference_update(taken)
                if member.busy:
                    member.busy = False
                    member.done_one()

    def _take(self, member: Member, taken: dict[int, list[tuple[int, str, Item]]]) -> None:
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

    async def _wait_data(self, member: Member, partitions: list[int], wait_s: float | None) -> None:
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

    async def _deliver_batch(self, member: Member, taken: dict[int, list[tuple[int, str, Item]]]) -> None:
        assert member.batch_handler is not None
        good: list[Message] = []
        topic = self.topic.name
        for p, entries in taken.items():
            for offset, key, item in entries:
                if isinstance(item, Bad):
                    await self.bus.dead_letter(self, p, offset, key, item, item.error, 1)
                else:
                    good.append(_tuple_new(Message, (item, topic, p, offset, key, None)))
        batch_handler = member.batch_handler

        async def one_by_one() -> None:  # find the poison messages: each alone, with its own retries
            for m in good:
                await self._deliver(member, m.partition, m.offset, m.key, m.event)

        if good:
            await deliver_batch(
                lambda: batch_handler(good), self.bus.retry_policy(member.max_retries), one_by_one
            )
        for p, entries in taken.items():
            self._commit(p, entries[-1][0])
