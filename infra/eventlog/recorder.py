"""The recorder: consumer group ``recorder`` on every topic, writing each batch to the event log.

Rows go through two stages, each one worker thread wide, which overlap:

1. **build**: a batch handler turns its messages into Arrow tables (``messages_to_arrow``: mostly
   JSON serialisation, under the GIL) chunk by chunk on the recorder's one build thread, and hands
   each chunk to the writer as soon as it is built.
2. **insert**: one group-commit writer inserts everything pending (chunks of every batch and topic)
   as one insert, one insert at a time, on its own thread. chdb releases the GIL while it inserts,
   so the next chunks are built meanwhile; the longer an insert takes, the more chunks the next one
   carries (few large inserts: ClickHouse wants that).

A handler returns only when all its chunks are inserted; then the bus commits its offsets. So an
offset is committed only after its events are in ClickHouse. When a chunk's build or insert fails the
handler raises (after its other chunks settled) and the bus retries the batch. Duplicates (a retried
batch, a topic replayed from offset 0) are absorbed by the ``events`` table's ``event_id`` key.

Why chunks and one build thread: built whole, a batch reaches the writer only after all of it is
built, and two consumers building at once share the GIL and then wait for both inserts, so the stages
barely overlap. Two builds at once gain nothing under one GIL; one build thread, chunked, starts the
first insert early and keeps building while it runs (docs/results/tuning.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from infra.bus.base import Bus, Message, Subscription
from infra.eventlog.rows import messages_to_arrow
from infra.eventlog.store import EventStore
from infra.logging import get_logger
from schemas import AGL, CONTROL, DEADLETTER, EPISODES, TASKS, TRANSITIONS

log = get_logger(__name__)

RECORDER_GROUP = "recorder"
# Rows per consumer batch: an offset commit (and, on Kafka, a fetch) per 10k events; the chunks below
# keep the insert going while the rest of the batch is built, so a large batch no longer delays it.
MAX_BATCH = 10_000
# Rows per build chunk: ~40 ms of building at ~15 µs a row, small enough to start inserting early,
# large enough that the writer's inserts (one or more chunks each) stay in the thousands of rows.
BUILD_CHUNK = 2_500
ALL_TOPICS: tuple[str, ...] = (TASKS, EPISODES, TRANSITIONS, CONTROL, DEADLETTER, AGL)  # AGL: added


@dataclass
class RecorderStats:
    events: int = 0
    inserts: int = 0
    failed_inserts: int = 0
    last_insert_s: float = 0.0
    last_error: str | None = None
    by_topic: dict[str, int] = field(default_factory=dict)


class GroupCommit:
    """Coalesces tables enqueued meanwhile into one ``write`` at a time, run on its own thread."""

    def __init__(
        self, write: Callable[[pa.Table], None], *, max_rows: int, linger_s: float, hold_s: float = 0.5
    ) -> None:
        self._write = write
        self._max_rows = max_rows
        self._linger_s = linger_s
        self._hold_s = hold_s
        self._expected = 0  # chunks announced (``expect``) and not enqueued yet
        self._arrived = asyncio.Event()
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._topics: dict[str, int] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._thread: ThreadPoolExecutor | None = None
        self.stats = RecorderStats()

    def expect(self, chunks: int) -> None:
        """``chunks`` more tables are being built for ``enqueue`` (negative: no longer coming)."""
        self._expected = max(0, self._expected + chunks)
        self._arrived.set()

    def enqueue(self, table: pa.Table, topic: str) -> asyncio.Future[None]:
        """A future that is done once ``table``'s rows are written (or holds what the write raised)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._expected = max(0, self._expected - 1)
        self._arrived.set()
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self._topics[topic] = self._topics.get(topic, 0) + table.num_rows
        self._waiters.append(fut)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="recorder-writer")
        return fut

    async def _gather(self) -> None:
        """Before an insert, wait for more rows: an insert costs ~40 ms plus a few µs per row in chdb.

        Below ``max_rows``, wait while announced chunks are still being built (at most ``hold_s``);
        when none are, linger ``linger_s`` once so the other topics' handlers can join.
        """
        if self._pending_rows >= self._max_rows:
            return
        if not self._expected:
            if self._linger_s > 0:
                await asyncio.sleep(self._linger_s)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._hold_s):
                while self._pending_rows < self._max_rows and self._expected:
                    self._arrived.clear()
                    await self._arrived.wait()

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await self._gather()
            tables, waiters, topics = self._pending, self._waiters, self._topics
            self._pending, self._waiters, self._topics, self._pending_rows = [], [], {}, 0
            batch = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="recorder-insert")
            started = time.perf_counter()
            try:
                await loop.run_in_executor(self._thread, self._write, batch)
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

    def close(self) -> None:
        """Let the insert thread go once idle (a later ``enqueue`` starts another)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=False)


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
        build_chunk: int = BUILD_CHUNK,
        max_wait_s: float = 0.2,
        linger_s: float = 0.01,
        max_retries: int = 3,
        busy_topic_consumers: int = 2,
    ) -> None:
        if build_chunk < 1:
            raise ValueError("build_chunk must be ≥ 1")
        self.bus = bus
        self.store = store
        self.topics = tuple(topics)
        self.group = group
        self._max_batch = max_batch
        self._chunk = build_chunk
        self._max_wait_s = max_wait_s
        self._max_retries = max_retries
        self._busy_consumers = busy_topic_consumers
        self._writer = GroupCommit(store.insert_table, max_rows=max_batch, linger_s=linger_s)
        self._build: ThreadPoolExecutor | None = None
        self._subs: list[Subscription] = []

    @property
    def stats(self) -> RecorderStats:
        return self._writer.stats

    async def start(self) -> None:
        if self._build is None:
            self._build = ThreadPoolExecutor(1, thread_name_prefix="recorder-build")
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
        if not messages:
            return
        loop = asyncio.get_running_loop()
        topic = messages[0].topic
        written: list[asyncio.Future[None]] = []
        chunks = range(0, len(messages), self._chunk)
        self._writer.expect(len(chunks))
        try:
            for i in chunks:
                table = await loop.run_in_executor(
                    self._build, messages_to_arrow, messages[i : i + self._chunk]
                )
                written.append(self._writer.enqueue(table, topic))
        finally:
            self._writer.expect(len(written) - len(chunks))  # chunks a failed build never handed over
            # Return (or raise) only once every chunk handed to the writer has settled.
            outcomes = await asyncio.gather(*written, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def stop(self) -> None:
        """Stop consuming; batches in flight are written and committed first."""
        subs, self._subs = self._subs, []
        for sub in subs:
            await sub.stop()
        build, self._build = self._build, None
        if build is not None:
            build.shutdown(wait=False)
        self._writer.close()
        log.info("recorder.stopped", events=self.stats.events, inserts=self.stats.inserts)

    async def __aenter__(self) -> Recorder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
