"""The bus on Apache Kafka (aiokafka).

- One idempotent producer per bus (``enable_idempotence=True`` forces ``acks=all``); ``publish``
  awaits the broker's acknowledgement and raises :class:`BusUnavailableError` when the broker does not
  answer within ``publish_timeout_s`` (the gateway spools on it).
- Physical names are ``prefix + logical`` for topics and consumer groups, so tests and tenants of one
  broker stay apart. Topics are created with ``schemas.TOPICS`` partition counts before first use,
  on ``replication_factor`` brokers (default: as many as the cluster has, at most 3).
- The key decides the partition with Kafka's own murmur2 rule (``infra.bus.partitioner``), so the
  in-process bus and Kafka put a key in the same partition.
- Consuming is the loop both buses share (``infra.bus.consumer``: offsets committed after success,
  retries, dead letters) over this bus's fetch/commit blocks (``infra.bus.kafka_consumer``).

Why aiokafka and not faststream here: faststream's publish path is slower (its middleware and message
wrapping run per message; docs/results/tuning.md); and the subscriber semantics Flywheel needs (wait
for the partition assignment before ``subscribe`` returns, commit exact offsets per partition after
the handler, per-partition concurrency, lag per group) need the consumer object itself, which
faststream keeps internal.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, KafkaTimeoutError

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
from infra.bus.kafka_consumer import KafkaFetcher, read_partitions
from infra.bus.partitioner import partition_for
from infra.logging import get_logger
from schemas import (
    DEADLETTER,
    EPISODES,
    TRANSITIONS,
    AnyEvent,
    DeadLetter,
    TopicSpec,
    encode,
    key_for,
    spec_for,
)

log = get_logger(__name__)

_TOPIC_ALREADY_EXISTS = 36
# Topics that carry a record per LLM call or per episode: their consumers fetch in batches.
BATCHED_FETCH_TOPICS = frozenset({EPISODES, TRANSITIONS})
QUIET_FETCH_MAX_WAIT_MS = 500  # Kafka's default: a quiet topic's record is delivered at once anyway


def _spec(topic: str) -> TopicSpec:
    try:
        return spec_for(topic)
    except KeyError as exc:
        raise BusError(f"unknown topic {topic!r}") from exc


def _known(topic: str) -> bool:
    """A Flywheel topic (so other prefixes' topics on a shared broker are not listed as ours)."""
    try:
        spec_for(topic)
    except KeyError:
        return False
    return True


class KafkaBus:
    """Kafka implementation of :class:`infra.bus.Bus`."""

    def __init__(
        self,
        bootstrap: str,
        *,
        prefix: str = "",
        client_id: str = "flywheel",
        publish_timeout_s: float = 10.0,
        linger_ms: int = 0,
        max_batch_bytes: int = 1024 * 1024,
        retry_backoff_s: float = 0.05,
        session_timeout_ms: int = 10_000,
        assignment_timeout_s: float = 30.0,
        stop_grace_s: float = 10.0,
        max_poll_interval_s: float = 300.0,
        fetch_min_bytes: int = 16 * 1024,
        fetch_max_wait_ms: int = 20,
        batched_fetch_topics: frozenset[str] = BATCHED_FETCH_TOPICS,
        quiet_fetch_max_wait_ms: int = QUIET_FETCH_MAX_WAIT_MS,
        park_path: Path = DEFAULT_PARK_PATH,
        replication_factor: int | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.replication_factor = replication_factor  # None: min(3, brokers in the cluster)
        self.parking = Parking(park_path)  # dead letters the broker would not take (infra.bus.deadletter)
        self.prefix = prefix
        self.client_id = client_id
        self.publish_timeout_s = publish_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self.session_timeout_ms = session_timeout_ms
        self.assignment_timeout_s = assignment_timeout_s
        self.stop_grace_s = stop_grace_s  # how long stop() lets in-flight handlers finish
        # A handler running longer than this loses its partitions (Kafka's max.poll.interval.ms).
        self.max_poll_interval_s = max_poll_interval_s
        # No linger by default: aiokafka keeps one produce request in flight per broker, so while one
        # is out, later sends pile up into the next batch on their own (batching under load costs no
        # wait). A linger only delays every publish of a lightly loaded producer (docs/results/tuning.md).
        self._linger_ms = linger_ms
        # Fetching, per topic (``fetch_params``). On the busy topics (``batched_fetch_topics``) a fetch
        # returns once 16 KiB are there or after 20 ms, not on every new record: a gateway reads back
        # the episodes topic it publishes each call to, and with Kafka's default (1 byte) that was one
        # fetch round per call. The wait is also what an idle consumer costs: a short one keeps an idle
        # gateway and the broker busy with empty fetches (docs/results/tuning.md). On the quiet topics
        # (control, tasks) a fetch returns on the first record and an idle one waits 500 ms at the broker.
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.batched_fetch_topics = batched_fetch_topics
        self.quiet_fetch_max_wait_ms = quiet_fetch_max_wait_ms
        self._max_batch_bytes = max_batch_bytes
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._probe: AIOKafkaConsumer | None = None
        self._partitions: dict[str, int] = {}  # logical topic → partition count (topic ensured)
        self._subscriptions: list[Consumer] = []
        self._topic_lock = asyncio.Lock()
        self._pending: deque[tuple[float, asyncio.Future[Any]]] = deque()  # (deadline, ack)
        self._watchdog: asyncio.Task[None] | None = None
        self._loop_time = time.monotonic  # same clock as the event loop's default

    def physical(self, topic: str) -> str:
        return self.prefix + topic

    def fetch_params(self, topic: str) -> tuple[int, int]:
        """(fetch_min_bytes, fetch_max_wait_ms) of a consumer of the logical ``topic``."""
        if topic in self.batched_fetch_topics:
            return self.fetch_min_bytes, self.fetch_max_wait_ms
        return 1, self.quiet_fetch_max_wait_ms

    # lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._producer is not None:
            return
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            enable_idempotence=True,
            acks="all",
            linger_ms=self._linger_ms,
            max_batch_size=self._max_batch_bytes,
            request_timeout_ms=int(self.publish_timeout_s * 1000),
        )
        try:
            async with asyncio.timeout(self.publish_timeout_s):
                await producer.start()
        except (KafkaError, OSError, TimeoutError) as exc:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise BusUnavailableError(f"Kafka at {self.bootstrap} is unreachable: {exc!r}") from exc
        self._producer = producer

    async def stop(self) -> None:
        for sub in list(self._subscriptions):
            await sub.stop()
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog
        # Bounded: with the broker gone, aiokafka would wait forever to flush or say goodbye.
        producer, self._producer = self._producer, None
        if producer is not None:
            await self._bounded(producer.stop())
        probe, self._probe = self._probe, None
        if probe is not None:
            await self._bounded(probe.stop())
        admin, self._admin = self._admin, None
        if admin is not None:
            await self._bounded(admin.close())

    async def _bounded(self, closing: Coroutine[Any, Any, Any]) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.publish_timeout_s):
                await closing

    async def __aenter__(self) -> KafkaBus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _running_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise BusClosedError("the Kafka bus is not running (call start())")
        return self._producer

    async def _admin_client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(
                bootstrap_servers=self.bootstrap,
                client_id=f"{self.client_id}-admin",
                request_timeout_ms=int(self.publish_timeout_s * 1000),
            )
            try:
                await admin.start()
            except (KafkaError, OSError) as exc:
                with contextlib.suppress(Exception):
                    await admin.close()
                raise BusUnavailableError(f"Kafka at {self.bootstrap} is unreachable: {exc!r}") from exc
            self._admin = admin
        return self._admin

    # topics -------------------------------------------------------------------------------------------

    def _replicas(self) -> int:
        """One copy per broker the producer knows, at most 3 (CreateTopics v3 has no "broker default")."""
        brokers = self._running_producer().client.cluster.brokers()
        return max(1, min(3, len(brokers)))

    async def ensure_topics(self, topics: Sequence[str]) -> None:
        missing = [t for t in dict.fromkeys(topics) if t not in self._partitions]
        if not missing:
            return
        async with self._topic_lock:
            missing = [t for t in missing if t not in self._partitions]
            if not missing:
                return
            specs = {t: _spec(t) for t in missing}
            admin = await self._admin_client()
            replicas = self.replication_factor or self._replicas()
            try:
                response = await admin.create_topics(
                    [
                        NewTopic(
                            self.physical(t), spec.partitions, replicas, topic_configs=dict(spec.configs)
                        )
                        for t, spec in specs.items()
                    ]
                )
            except (KafkaError, OSError) as exc:
                raise BusUnavailableError(f"cannot create topics on {self.bootstrap}: {exc!r}") from exc
            for name, code, *rest in response.topic_errors:
                if code not in (0, _TOPIC_ALREADY_EXISTS):
                    raise BusError(f"cannot create topic {name}: error {code} {rest[0] if rest else ''}")
            producer = self._running_producer()
            for topic, spec in specs.items():
                # Wait until the producer's metadata knows the topic; keep the broker's count.
                try:
                    parts = await producer.partitions_for(self.physical(topic))
                except (KafkaError, OSError) as exc:  # bounded by request_timeout_ms
                    raise BusUnavailableError(
                        f"no metadata for {topic} from {self.bootstrap}: {exc!r}"
                    ) from exc
                self._partitions[topic] = len(parts) or spec.partitions

    async def list_topics(self) -> list[str]:
        admin = await self._admin_client()
        try:
            names = await admin.list_topics()
        except (KafkaError, OSError) as exc:
            raise BusUnavailableError(f"cannot list topics on {self.bootstrap}: {exc!r}") from exc
        n = len(self.prefix)
        return sorted(name[n:] for name in names if name.startswith(self.prefix) and _known(name[n:]))

    async def lag(self, topic: str, group: str) -> int:
        """End offsets minus the group's committed offsets (the log start where it committed none)."""
        admin = await self._admin_client()
        physical = self.physical(topic)
        try:
            probe = await self._probe_consumer()
            if physical not in await probe.topics():
                return 0
            parts = await self._running_producer().partitions_for(physical)
            tps = [TopicPartition(physical, p) for p in sorted(parts)]
            committed = await admin.list_consumer_group_offsets(self.physical(group), partitions=tps)
            ends = await probe.end_offsets(tps)
            starts = await probe.beginning_offsets(tps)
        except (KafkaError, OSError) as exc:
            raise BusUnavailableError(f"cannot read offsets on {self.bootstrap}: {exc!r}") from exc
        total = 0
        for tp in tps:
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else starts[tp]
            total += max(0, ends[tp] - done)
        return total

    async def _probe_consumer(self) -> AIOKafkaConsumer:
        """A group-less consumer used only to read partition metadata and log offsets."""
        if self._probe is None:
            probe = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, client_id=f"{self.client_id}-probe")
            await probe.start()
            self._probe = probe
        return self._probe

    # publishing ---------------------------------------------------------------------------------------

    async def publish(self, topic: str, event: AnyEvent, *, key: str | None = None) -> None:
        if type(event) not in _spec(topic).event_types:
            raise BusError(f"{type(event).__name__} does not belong on topic {topic}")
        await self._send(topic, encode(event), key_for(event) if key is None else key)

    async def publish_raw(self, topic: str, data: bytes, *, key: str) -> None:
        _spec(topic)  # unknown topics are refused here too
        await self._send(topic, bytes(data), key)

    async def _send(self, topic: str, value: bytes, key: str) -> None:
        producer = self._running_producer()
        count = self._partitions.get(topic)
        if count is None:
            await self.ensure_topics([topic])
            count = self._partitions[topic]
        try:
            # send() is bounded by aiokafka itself (metadata and buffer waits use request_timeout_ms);
            # the acknowledgement is bounded by the watchdog below, one timer for all publishes
            # instead of one per publish (a per-call asyncio.timeout cost ~15 % of the publish path).
            ack = await producer.send(
                self.physical(topic), value, key=key.encode(), partition=partition_for(key, count)
            )
            if not ack.done():
                self._pending.append((self._loop_time() + self.publish_timeout_s, ack))
                if self._watchdog is None:
                    self._watchdog = asyncio.create_task(self._watch_acks(), name="kafka-bus-acks")
            await ack
        except (KafkaError, OSError, TimeoutError) as exc:
            raise BusUnavailableError(
                f"Kafka at {self.bootstrap} did not acknowledge a message on {topic}: {exc!r}"
            ) from exc

    async def _watch_acks(self) -> None:
        """Fail acknowledgements still missing after ``publish_timeout_s`` (the broker went away)."""
        pending = self._pending
        while True:
            await asyncio.sleep(min(0.25, self.publish_timeout_s / 4))
            now = self._loop_time()
            while pending and (pending[0][1].done() or pending[0][0] <= now):
                _, ack = pending.popleft()
                if not ack.done():  # aiokafka skips futures that are already done
                    ack.set_exception(KafkaTimeoutError(f"no acknowledgement in {self.publish_timeout_s}s"))

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
        return await self._subscribe(topic, group, Subscriber(handler, None, from_beginning, max_retries))

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
        return await self._subscribe(
            topic,
            group,
            Subscriber(None, handler, from_beginning, max_retries, max_batch, max_wait_s),
            on_assigned,
        )

    async def read_partitions(self, topic: str, partitions: Sequence[int]) -> dict[int, list[Message]]:
        self._running_producer()
        await self.ensure_topics([topic])
        reader = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, client_id=f"{self.client_id}-reader", enable_auto_commit=False
        )
        return await read_partitions(
            reader, topic, self.physical(topic), partitions, self.assignment_timeout_s
        )

    async def _subscribe(
        self, topic: str, group: str, subscriber: Subscriber, on_assigned: Assigned | None = None
    ) -> Consumer:
        self._running_producer()
        await self.ensure_topics([topic, DEADLETTER])
        fetch_min_bytes, fetch_max_wait_ms = self.fetch_params(topic)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self.client_id}-{group}",
            group_id=self.physical(group),
            enable_auto_commit=False,
            auto_offset_reset="earliest" if subscriber.from_beginning else "latest",
            max_poll_records=subscriber.max_batch,
            fetch_min_bytes=fetch_min_bytes,
            fetch_max_wait_ms=fetch_max_wait_ms,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(100, self.session_timeout_ms // 5),
            max_poll_interval_ms=int(self.max_poll_interval_s * 1000),
        )
        fetcher = KafkaFetcher(
            consumer,
            topic,
            self.physical(topic),
            group,
            assignment_timeout_s=self.assignment_timeout_s,
            max_poll_interval_s=self.max_poll_interval_s,
            close_timeout_s=self.publish_timeout_s,
            on_assigned=on_assigned,
        )
        await fetcher.start()
        sub = Consumer(
            fetcher,
            topic,
            group,
            subscriber,
            policy=RetryPolicy(subscriber.max_retries, self.retry_backoff_s, max_backoff_s=2.0),
            stop_grace_s=self.stop_grace_s,
            publish_dead_letter=self._publish_dead_letter,
            parking=self.parking,
            on_stop=self.forget,
        )
        self._subscriptions.append(sub)
        sub.start()
        return sub

    async def _publish_dead_letter(self, letter: DeadLetter, key: str) -> None:
        await self.publish(DEADLETTER, letter, key=key)

    def forget(self, sub: Consumer) -> None:
        with contextlib.suppress(ValueError):
            self._subscriptions.remove(sub)
