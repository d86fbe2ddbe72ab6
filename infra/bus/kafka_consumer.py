"""One Kafka subscription: a consumer in a group, its consume loop, retries and dead letters.

- ``start`` returns once the group has assigned partitions to this consumer and their positions are
  known, so a ``from_beginning=False`` subscriber sees everything published after ``subscribe``.
- Auto-commit is off. The records of one fetch are handled per partition concurrently (in order
  within a partition); each partition's offset is committed after all its records were handled.
- A handler that raises is retried ``max_retries`` times, then the record goes to the dead-letter
  topic and the partition moves on. A record that does not decode is dead-lettered at once. The
  policy (retries, backoff, finding the poison in a batch) is ``infra.bus.delivery``, shared with
  the in-process bus.
- A revoked partition (another consumer joined the group) is handed over only after the in-flight
  records were handled and committed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaError

from infra.bus.base import BatchHandler, BusError, Handler, Message, new_message
from infra.bus.deadletter import dead_letter, deliver
from infra.bus.delivery import RetryPolicy, deliver_batch, deliver_one
from infra.logging import get_logger
from schemas import DEADLETTER, DeadLetter, EventDecodeError, decode

if TYPE_CHECKING:
    from infra.bus.kafka import KafkaBus

log = get_logger(__name__)

Record: TypeAlias = ConsumerRecord[bytes, bytes]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, sub: KafkaSubscription) -> None:
        self._sub = sub

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        # Finish and commit what is in flight before handing over (bounded: a hung handler must
        # not hold the whole group; the next owner then re-delivers, duplicates carry event_id).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._sub.max_poll_interval_s):
                await self._sub.idle.wait()

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        self._sub.assigned.set()


class KafkaSubscription:
    def __init__(
        self,
        bus: KafkaBus,
        topic: str,
        group: str,
        *,
        handler: Handler | None,
        batch_handler: BatchHandler | None,
        from_beginning: bool,
        max_retries: int,
        max_batch: int,
        max_wait_s: float,
    ) -> None:
        self._bus = bus
        self.topic = topic
        self.group = group
        self._handler = handler
        self._batch_handler = batch_handler
        self._from_beginning = from_beginning
        self._max_retries = max_retries
        self._policy = RetryPolicy(max_retries, bus.retry_backoff_s, max_backoff_s=2.0)
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.idle = asyncio.Event()
        self.idle.set()
        self.assigned = asyncio.Event()
        self.max_poll_interval_s = bus.max_poll_interval_s

    async def start(self) -> None:
        bus = self._bus
        fetch_min_bytes, fetch_max_wait_ms = bus.fetch_params(self.topic)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bus.bootstrap,
            client_id=f"{bus.client_id}-{self.group}",
            group_id=bus.physical(self.group),
            enable_auto_commit=False,
            auto_offset_reset="earliest" if self._from_beginning else "latest",
            max_poll_records=self._max_batch,
            fetch_min_bytes=fetch_min_bytes,
            fetch_max_wait_ms=fetch_max_wait_ms,
            session_timeout_ms=bus.session_timeout_ms,
            heartbeat_interval_ms=max(100, bus.session_timeout_ms // 5),
            max_poll_interval_ms=int(bus.max_poll_interval_s * 1000),
        )
        consumer.subscribe([bus.physical(self.topic)], listener=_Listener(self))
        try:
            await consumer.start()
            async with asyncio.timeout(bus.assignment_timeout_s):
                await self.assigned.wait()
                for tp in consumer.assignment():
                    await consumer.position(tp)  # resolves committed / reset offsets now
        except (KafkaError, OSError, TimeoutError) as exc:
            with contextlib.suppress(Exception):
                await consumer.stop()
            raise BusError(f"cannot join group {self.group} on {self.topic}: {exc!r}") from exc
        self._consumer = consumer
        self._task = asyncio.create_task(self._run(), name=f"kafka:{self.topic}:{self.group}")

    async def stop(self) -> None:
        """Stop consuming; in-flight handlers finish and their offsets are committed."""
        if self._stopping:
            return
        self._stopping = True
        task = self._task
        if task is not None and task is not asyncio.current_task():
            if not self.idle.is_set():
                done, _ = await asyncio.wait({task}, timeout=self._bus.stop_grace_s)
                if not done:
                    log.warning("bus.stop_timeout", topic=self.topic, group=self.group)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._bus.publish_timeout_s):  # bounded: broker may be gone
                    await consumer.stop()
        self._bus.forget(self)

    # the loop -----------------------------------------------------------------------------------------

    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        wait_ms = int(self._max_wait_s * 1000)
        draining = False  # the last batch was full: no wait for the rest of a backlog (see memory_group)
        while not self._stopping:
            fetched: dict[TopicPartition, list[Record]] = {}
            try:
                fetched = await consumer.getmany(timeout_ms=1000, max_records=self._max_batch)
                if self._batch_handler is not None and wait_ms and not draining:
                    fetched = await self._fill(consumer, fetched, wait_ms)
                draining = sum(len(v) for v in fetched.values()) >= self._max_batch
                if not fetched:
                    continue
                self.idle.clear()
                try:
                    if self._batch_handler is not None:
                        await self._handle_batch(fetched)
                    else:
                        # One task per partition (in order within it); one failure cancels the rest.
                        async with asyncio.TaskGroup() as tg:
                            for recs in fetched.values():
                                tg.create_task(self._handle_partition(recs))
                    await self._commit(consumer, fetched)
                finally:
                    self.idle.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The broker went away or a dead letter could not be published: nothing of this
                # fetch was committed, so rewind to its first records and try again.
                log.error("bus.consumer_error", topic=self.topic, group=self.group, error=repr(exc))
                await asyncio.sleep(1.0)
                for tp, recs in fetched.items():
                    if recs and tp in consumer.assignment():
                        consumer.seek(tp, recs[0].offset)

    async def _fill(
        self, consumer: AIOKafkaConsumer, fetched: dict[TopicPartition, list[Record]], wait_ms: int
    ) -> dict[TopicPartition, list[Record]]:
        """Keep fetching for up to ``max_wait_s`` after the first record, until ``max_batch``."""
        count = sum(len(v) for v in fetched.values())
        if not count or count >= self._max_batch:
            return fetched
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while count < self._max_batch and not self._stopping:
            left = int((deadline - loop.time()) * 1000)
            if left <= 0:
                break
            more = await consumer.getmany(timeout_ms=left, max_records=self._max_batch - count)
            for tp, recs in more.items():
                fetched.setdefault(tp, []).extend(recs)
                count += len(recs)
        return fetched

    async def _commit(self, consumer: AIOKafkaConsumer, fetched: dict[TopicPartition, list[Record]]) -> None:
        offsets = {tp: recs[-1].offset + 1 for tp, recs in fetched.items() if recs}
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:
            # A rebalance took the partitions: the next owner re-delivers (duplicates carry event_id).
            log.warning("bus.commit_failed", topic=self.topic, group=self.group, error=repr(exc))

    def _message(self, record: Record) -> Message | str:
        """The decoded message, or the reason it cannot be decoded."""
        key = record.key.decode("utf-8", errors="replace") if record.key is not None else ""
        raw = record.value or b""
        try:
            event = decode(self.topic, raw)
        except EventDecodeError as exc:
            return str(exc)
        # The bytes go along: a consumer that stores events (the recorder) need not encode them again.
        return new_message(event, self.topic, record.partition, record.offset, key, raw)

    async def _handle_partition(self, records: list[Record]) -> None:
        for record in records:
            message = self._message(record)
            if isinstance(message, str):
                await self._dead_letter(record, message, 1)
            else:
                await self._deliver(record, message)

    async def _deliver(self, record: Record, message: Message) -> None:
        async def handle() -> None:
            if self._handler is not None:
                await self._handler(message)
            else:
                assert self._batch_handler is not None
                await self._batch_handler([message])

        async def dead(exc: BaseException, attempts: int) -> None:
            await self._dead_letter(record, exc, attempts, message)

        await deliver_one(handle, self._policy, dead)

    async def _handle_batch(self, fetched: dict[TopicPartition, list[Record]]) -> None:
        batch_handler = self._batch_handler
        assert batch_handler is not None
        good: list[tuple[Record, Message]] = []
        for records in fetched.values():
            for record in records:
                message = self._message(record)
                if isinstance(message, str):
                    await self._dead_letter(record, message, 1)
                else:
                    good.append((record, message))

        async def one_by_one() -> None:  # find the poison ones, each with its own retries
            for record, message in good:
                await self._deliver(record, message)

        if good:
            await deliver_batch(lambda: batch_handler([m for _, m in good]), self._policy, one_by_one)

    async def _dead_letter(
        self, record: Record, error: BaseException | str, attempts: int, message: Message | None = None
    ) -> None:
        key = record.key.decode("utf-8", errors="replace") if record.key is not None else None
        log.warning(
            "bus.dead_letter",
            topic=self.topic,
            partition=record.partition,
            offset=record.offset,
            group=self.group,
            error=str(error)[:500],
            attempts=attempts,
        )
        if self.topic == DEADLETTER:
            return  # never dead-letter a dead letter
        letter = dead_letter(
            topic=self.topic,
            partition=record.partition,
            offset=record.offset,
            key=key,
            group=self.group,
            error=error,
            attempts=attempts,
            raw=record.value or b"",  # the original bytes, whether they decoded or not
        )

        async def publish(letter: DeadLetter) -> None:
            await self._bus.publish(DEADLETTER, letter, key=key or "")

        # Returns once the letter is on the topic or parked in the local file; only then does the
        # caller move on and commit the poison message's offset (infra.bus.deadletter).
        await deliver(letter, publish, self._bus.parking, backoff_s=self._bus.retry_backoff_s)
