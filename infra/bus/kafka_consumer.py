"""The Kafka side of a subscription: one aiokafka consumer in a group, as fetch/commit blocks.

The loop over these blocks (handing records over, retries, dead letters, stop) is
``infra.bus.consumer``, shared with the in-process bus. What is Kafka's own:

- ``start`` returns once the group has assigned partitions to this consumer and their positions are
  known, so a ``from_beginning=False`` subscriber sees everything published after ``subscribe``.
- Auto-commit is off: ``commit`` sends the offsets after the records acknowledged by the loop.
  A commit a rebalance refused is logged; the partition's next owner re-delivers (events carry
  ``event_id`` for deduplication).
- ``rewind`` seeks the partitions of a failed block back to its first records.
- A revoked partition (another consumer joined the group) is handed over only once the block in
  flight was handled and committed (the loop sets ``idle``), bounded by ``max_poll_interval_s``.
- After each rebalance the partitions this consumer now holds are logged (``bus.partitions_assigned``)
  and the subscriber's ``on_assigned`` hook is awaited with them (a stateful consumer restores their
  state there; an error is logged, not raised).
- ``read_partitions`` reads partitions from their start to their end without a group (a restore).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError

from infra.bus.base import Assigned, BusError, BusUnavailableError, Message
from infra.bus.consumer import Block, Undecodable, decode_entry
from infra.logging import get_logger

log = get_logger(__name__)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, fetcher: KafkaFetcher) -> None:
        self._fetcher = fetcher

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        # Finish and commit what is in flight before handing over (bounded: a hung handler must
        # not hold the whole group; the next owner then re-delivers, duplicates carry event_id).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._fetcher.max_poll_interval_s):
                await self._fetcher.idle.wait()

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        self._fetcher.assigned.set()
        partitions = sorted(tp.partition for tp in assigned)
        log.debug(
            "bus.partitions_assigned",
            topic=self._fetcher.topic,
            group=self._fetcher.group,
            partitions=partitions,
        )
        hook = self._fetcher.on_assigned
        if hook is not None:
            try:
                await hook(frozenset(tp.partition for tp in assigned))
            except Exception as exc:  # the subscriber restores lazily; a rebalance must not die here
                log.error("bus.on_assigned_failed", topic=self._fetcher.topic, error=repr(exc))


class KafkaFetcher:
    """``infra.bus.consumer.Fetcher`` over ``consumer`` (built by the bus, not started yet)."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        topic: str,
        physical: str,
        group: str,
        *,
        assignment_timeout_s: float,
        max_poll_interval_s: float,
        close_timeout_s: float,
        on_assigned: Assigned | None = None,
    ) -> None:
        self._consumer = consumer
        self.on_assigned = on_assigned
        self.topic = topic
        self._physical = physical
        self.group = group
        self._assignment_timeout_s = assignment_timeout_s
        self.max_poll_interval_s = max_poll_interval_s
        self._close_timeout_s = close_timeout_s
        self.idle = asyncio.Event()
        self.idle.set()
        self.assigned = asyncio.Event()
        self._first: dict[int, int] = {}  # partition → first offset of the block in flight
        self._acked: dict[int, int] = {}  # partition → last offset acknowledged, not committed yet

    async def start(self) -> None:
        consumer = self._consumer
        consumer.subscribe([self._physical], listener=_Listener(self))
        try:
            await consumer.start()
            async with asyncio.timeout(self._assignment_timeout_s):
                await self.assigned.wait()
                for tp in consumer.assignment():
                    await consumer.position(tp)  # resolves committed / reset offsets now
        except (KafkaError, OSError, TimeoutError) as exc:
            with contextlib.suppress(Exception):
                await consumer.stop()
            raise BusError(f"cannot join group {self.group} on {self.topic}: {exc!r}") from exc

    async def fetch(self, max_records: int, timeout_s: float) -> Block:
        fetched = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        block: Block = {}
        topic = self.topic
        for tp, records in fetched.items():
            if not records:
                continue
            p = tp.partition
            self._first.setdefault(p, records[0].offset)
            # The bytes go along: a consumer that stores events (the recorder) need not encode them again.
            block[p] = [
                decode_entry(
                    topic,
                    p,
                    r.offset,
                    r.key.decode("utf-8", errors="replace") if r.key is not None else "",
                    r.value or b"",
                )
                for r in records
            ]
        return block

    def ack(self, partition: int, offset: int) -> None:
        self._acked[partition] = offset

    async def commit(self) -> None:
        offsets = {TopicPartition(self._physical, p): o + 1 for p, o in self._acked.items()}
        self._acked.clear()
        self._first.clear()
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except KafkaError as exc:
            # A rebalance took the partitions: the next owner re-delivers (duplicates carry event_id).
            log.warning("bus.commit_failed", topic=self.topic, group=self.group, error=repr(exc))

    async def rewind(self) -> None:
        consumer = self._consumer
        assignment = consumer.assignment()
        for p, offset in self._first.items():
            tp = TopicPartition(self._physical, p)
            if tp in assignment:
                consumer.seek(tp, offset)
        self._first.clear()
        self._acked.clear()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._close_timeout_s):  # bounded: the broker may be gone
                await self._consumer.stop()


async def read_partitions(
    consumer: AIOKafkaConsumer, topic: str, physical: str, partitions: Sequence[int], timeout_s: float
) -> dict[int, list[Message]]:
    """``Bus.read_partitions`` with ``consumer``, a group-less consumer built (not started) by the bus."""
    out: dict[int, list[Message]] = {p: [] for p in partitions}
    if not partitions:
        return out
    try:
        async with asyncio.timeout(timeout_s):
            await consumer.start()
            tps = [TopicPartition(physical, p) for p in partitions]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            left = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
            while left:
                fetched = await consumer.getmany(*left, timeout_ms=500)
                for tp, records in fetched.items():
                    for r in records:
                        if r.offset >= ends[tp]:
                            continue
                        key = r.key.decode("utf-8", errors="replace") if r.key is not None else ""
                        entry = decode_entry(topic, tp.partition, r.offset, key, r.value or b"")
                        if isinstance(entry, Undecodable):
                            log.warning(
                                "bus.read_undecodable", topic=topic, offset=r.offset, error=entry.error
                            )
                        else:
                            out[tp.partition].append(entry)
                left = {tp for tp in left if await consumer.position(tp) < ends[tp]}
    except (KafkaError, OSError, TimeoutError) as exc:
        raise BusUnavailableError(f"cannot read {topic} partitions {list(partitions)}: {exc!r}") from exc
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout_s):
                await consumer.stop()
    return out
