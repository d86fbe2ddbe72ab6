"""The in-process bus's log and consumer groups (the bus itself is ``infra.bus.memory``).

A ``Topic`` holds ``Partition`` logs. A ``Group`` holds the committed offsets of one consumer group on
one topic and its members. A ``Member`` is one subscriber's fetcher (``infra.bus.consumer.Fetcher``,
under the consumer loop both buses share): it fetches the records of the partitions the group gives
it (partition ``p`` goes to member ``p mod n``, but not while another member still holds it in a block
it has not committed: a rebalance waits for the block in flight, as on Kafka) and commits each record
as soon as it is acknowledged, which makes room for publishers waiting on a full backlog. A member
given an ``on_assigned`` hook awaits it, between blocks, when its partitions change, once the new ones
are out of every other member's block (as Kafka hands them over).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextvars import ContextVar

from infra.bus.base import Assigned, Message
from infra.bus.consumer import Block, Entry, Undecodable
from schemas import AnyEvent, TopicSpec

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


def _wake(futures: set[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)
    futures.clear()


class Group:
    def __init__(self, topic: Topic, name: str, batch: bool, from_beginning: bool, max_backlog: int) -> None:
        self.topic = topic
        self.name = name
        self.batch = batch
        self.max_backlog = max_backlog
        parts = topic.partitions
        self.committed = [p.base if from_beginning else p.end for p in parts]
        self.members: list[Member] = []
        self.space: list[list[asyncio.Future[None]]] = [[] for _ in parts]
        self.claimed: set[int] = set()  # partitions in a member's uncommitted block
        self.rebalanced: set[asyncio.Future[None]] = set()

    # membership ---------------------------------------------------------------------------------------

    def join(self, member: Member) -> None:
        self.members.append(member)
        if len(self.members) == 1:
            self.topic.active.append(self)
        _wake(self.rebalanced)

    def leave(self, member: Member) -> None:
        if member not in self.members:
            return
        self.members.remove(member)
        _wake(self.rebalanced)
        if not self.members:
            self.topic.active.remove(self)
            for p in range(len(self.space)):
                self.release_space(p, force=True)

    def owned(self, member: Member) -> frozenset[int]:
        """The partitions the group gives ``member`` (whether or not another still has them in a block)."""
        if member not in self.members:
            return frozenset()
        n, i = len(self.members), self.members.index(member)
        return frozenset(p for p in range(len(self.topic.partitions)) if p % n == i)

    def assigned(self, member: Member) -> list[int]:
        n = len(self.members)
        if member not in self.members:
            return []
        i = self.members.index(member)
        return [p for p in range(len(self.topic.partitions)) if p % n == i and p not in self.claimed]

    # offsets and backpressure -------------------------------------------------------------------------

    def backlog(self, p: int) -> int:
        part = self.topic.partitions[p]
        return part.end - max(self.committed[p], part.base)

    def release_space(self, p: int, force: bool = False) -> None:
        waiters = self.space[p]
        if waiters and (force or self.backlog(p) <= self.max_backlog // 2):
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
            waiters.clear()

    def commit(self, p: int, offset: int) -> None:
        if offset + 1 > self.committed[p]:
            self.committed[p] = offset + 1
        if self.space[p]:
            self.release_space(p)


class Member:
    """One subscriber's fetcher in a group (``infra.bus.consumer.Fetcher``)."""

    def __init__(self, group: Group, on_assigned: Assigned | None = None) -> None:
        self._group = group
        self._on_assigned = on_assigned
        self._told: frozenset[int] | None = None  # the partitions on_assigned was last told
        self._next: dict[int, int] = {}  # partition of the block in flight → next offset to fetch
        # Each acknowledged record is committed at once (one call per record: the hot path).
        self.ack: Callable[[int, int], None] = group.commit
        self.idle = asyncio.Event()
        self.idle.set()

    async def fetch(self, max_records: int, timeout_s: float) -> Block:
        IN_CONSUMER.set(True)  # the consumer loop's task: its handlers' publishes skip backpressure
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        block: Block = {}
        while True:
            if self._on_assigned is not None and not self._next:  # between blocks only
                await self._tell_assignment(self._on_assigned)
            self._take(block, max_records)
            if block or self not in self._group.members:
                return block
            left = deadline - loop.time()
            if left <= 0:
                return block
            await self._wait_data(left)

    async def _tell_assignment(self, hook: Assigned) -> None:
        group = self._group
        mine = group.owned(self)
        if mine == self._told or (mine - (self._told or frozenset())) & group.claimed:
            return  # unchanged, or a new partition is still in another member's block
        self._told = mine
        await hook(mine)

    def _take(self, block: Block, room: int) -> None:
        """Add the available records of this member's partitions to ``block`` (claiming them)."""
        group = self._group
        topic = group.topic.name
        for p in list(self._next) + group.assigned(self):
            if room <= 0:
                return
            part = group.topic.partitions[p]
            start = max(self._next.get(p, group.committed[p]), part.base)
            stop = min(part.end, start + room)
            if stop <= start:
                continue
            if p not in self._next:
                group.claimed.add(p)
            self._next[p] = stop
            room -= stop - start
            entries: list[Entry] = block.setdefault(p, [])
            b, keys, items = part.base, part.keys, part.items
            for o in range(start, stop):
                item = items[o - b]
                if isinstance(item, Bad):
                    entries.append(Undecodable(p, o, keys[o - b], item.raw, item.error))
                else:
                    entries.append(_tuple_new(Message, (item, topic, p, o, keys[o - b], None)))

    async def _wait_data(self, wait_s: float) -> None:
        group = self._group
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        parts = [group.topic.partitions[p] for p in list(self._next) + group.assigned(self)]
        for part in parts:
            part.waiters.add(fut)
        group.rebalanced.add(fut)
        try:
            await asyncio.wait({fut}, timeout=wait_s)
        finally:
            for part in parts:
                part.waiters.discard(fut)
            group.rebalanced.discard(fut)
            fut.cancel()

    async def commit(self) -> None:
        self._release()

    async def rewind(self) -> None:
        self._release()  # acknowledged records are committed already; the rest is fetched again

    async def close(self) -> None:
        self._release()
        self._group.leave(self)

    def _release(self) -> None:
        """Give the block's partitions back (another member may be waiting for one)."""
        if self._next:
            self._group.claimed.difference_update(self._next)
            self._next.clear()
            if len(self._group.members) > 1:
                _wake(self._group.rebalanced)
