"""The recorder: consumer group ``recorder`` on every topic, writing each batch to the event log.

Each batch handler serialises its messages to an Arrow table (in a worker thread), hands the table to
one group-commit writer and waits. The writer inserts everything pending (from all topics) as one
insert, one insert at a time; when it returns, every waiting handler returns and the bus commits their
offsets. So an offset is committed only after its events are in ClickHouse, few large inserts replace
many small ones (ClickHouse wants that), and with two consumers on the busy episodes topic one batch
is serialised while the previous one is inserted (chdb releases the GIL). Duplicates (a retried batch,
a topic replayed from offset 0) are absorbed by the ``events`` table's ``event_id`` key.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from infra.bus.base import Bus, Message, Subscription
from infra.eventlog.rows import messages_to_arrow
from infra.eventlog.store import EventStore
from infra.logging import get_logger
from schemas import CONTROL, DEADLETTER, EPISODES, TASKS, TRANSITIONS

log = get_logger(__name__)

RECORDER_GROUP = "recorder"
# Rows per consumer batch. chdb's insert costs ~16 µs CPU per row in 5k-row inserts and ~10 µs in 20k-row
# ones; the recorder drained 50k call events fastest at 10k (34k/s vs 29k/s at 5k, 29k/s at 20k, where
# serialising one batch while the previous one is inserted overlaps less). Two consumers on the
# episodes topic and the group commit make one insert of up to 2 × 10k rows (~40 MB of Arrow).
MAX_BATCH = 10_000
ALL_TOPICS: tuple[str, ...] = (TASKS, EPISODES, TRANSITIONS, CONTROL, DEADLETTER)


@dataclass
class RecorderStats:
    events: int = 0
    inserts: int = 0
    failed_inserts: int = 0
    last_insert_s: float = 0.0
    last_error: str | None = None
    by_topic: dict[str, int] = field(default_factory=dict)


class GroupCommit:
    """Coalesces concurrent ``submit`` calls into one ``write`` (run in a thread) at a time."""

    def __init__(self, write: Callable[[pa.Table], None], *, max_rows: int, linger_s: float) -> None:
        self._write = write
        self._max_rows = max_rows
        self._linger_s = linger_s
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._topics: dict[str, int] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self.stats = RecorderStats()

    async def submit(self, table: pa.Table, topic: str) -> None:
        """Return once ``table``'s rows are written; raise what the write raised."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self._topics[topic] = self._topics.get(topic, 0) + table.num_rows
        self._waiters.append(fut)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="recorder-writer")
        await fut

    async def _drain(self) -> None:
        while self._pending:
            if self._pending_rows < self._max_rows and self._linger_s > 0:
                await asyncio.sleep(self._linger_s)  # let the other topics' handlers join this insert
            tables, waiters, topics = self._pending, self._waiters, self._topics
            self._pending, self._waiters, self._topics, self._pending_rows = [], [], {}, 0
            batch = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self._write, batch)
            except Exception as exc:
                self.stats.failed_inserts += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("recorder.insert_failed", events=batch.num_rows, error=self.stats.last_error)
                for w in waiters:
                    if not w.done():
                        w.set_exception(exc)
                continue
            self.stats.inserts += 1
            self.stats.events += batch.num_rows
            self.stats.last_insert_s = time.perf_counter() - started
            for topic, n in topics.items():
                self.stats.by_topic[topic] = self.stats.by_topic.get(topic, 0) + n
            for w in waiters:
                if not w.done():
                    w.set_result(None)


class Recorder:
    """Writes every event of ``topics`` to ``store`` as consumer group ``group``."""

    def __init__(
        self,
        bus: Bus,
        store: EventStore,
        *,
        topics: Sequence[str] = ALL_TOPICS,
        group: str = RECORDER_GROUP,
        max_batch: int = MAX_BATCH,
        max_wait_s: float = 0.2,
        linger_s: float = 0.01,
        max_retries: int = 3,
        busy_topic_consumers: int = 2,
    ) -> None:
        self.bus = bus
        self.store = store
        self.topics = tuple(topics)
        self.group = group
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._max_retries = max_retries
        self._busy_consumers = busy_topic_consumers
        self._writer = GroupCommit(store.insert_table, max_rows=max_batch, linger_s=linger_s)
        self._subs: list[Subscription] = []

    @property
    def stats(self) -> RecorderStats:
        return self._writer.stats

    async def start(self) -> None:
        await self.bus.ensure_topics(list(self.topics))
        for topic in self.topics:
            for _ in range(self._busy_consumers if topic == EPISODES else 1):
                sub = await self.bus.subscribe_batch(
                    topic,
                    self.group,
                    self._handle,
                    max_batch=self._max_batch,
                    max_wait_s=self._max_wait_s,
                    from_beginning=True,
                    max_retries=self._max_retries,
                )
                self._subs.append(sub)
        log.info("recorder.started", topics=list(self.topics), group=self.group, database=self.store.database)

    async def _handle(self, messages: Sequence[Message]) -> None:
        if messages:
            table = await asyncio.to_thread(messages_to_arrow, messages)
            await self._writer.submit(table, messages[0].topic)

    async def stop(self) -> None:
        """Stop consuming; batches in flight are written and committed first."""
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.stop()
        log.info("recorder.stopped", events=self.stats.events, inserts=self.stats.inserts)

    async def __aenter__(self) -> Recorder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
