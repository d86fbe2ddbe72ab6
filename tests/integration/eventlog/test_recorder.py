"""The recorder end to end: every topic of a real bus → chdb, commits after inserts, replay dedups."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import schemas as s
from infra.bus.base import Bus
from infra.eventlog.models import EpisodeFilter
from infra.eventlog.recorder import Recorder
from infra.eventlog.store import ChdbStore
from tests.fakes.waiting import wait_until
from tests.fixtures.events import sample_events
from tests.integration.eventlog.helpers import history
from tests.kafka_fixtures import MakeBus

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def chdb_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbStore]:
    st = ChdbStore(tmp_path_factory.mktemp("recorder") / "chdb", database="rec_default")
    try:
        yield st
    finally:
        st.close()


_DB_SEQ = iter(range(1000))


@pytest.fixture
def store(chdb_store: ChdbStore) -> Iterator[ChdbStore]:
    """The module's chdb, with a fresh database for this test."""
    st = ChdbStore(chdb_store.path, database=f"rec_{next(_DB_SEQ)}")
    st.migrate()
    yield st
    st.close()


async def publish_all(bus: Bus, events: list[s.AnyEvent]) -> None:
    for event in events:
        await bus.publish(s.topic_for(event), event)


async def test_recorder_writes_every_topic_and_replay_changes_nothing(
    make_bus: MakeBus, store: ChdbStore
) -> None:
    bus = await make_bus()
    events = [*history(), *sample_events()]
    recorder = Recorder(bus, store, max_wait_s=0.05)
    await recorder.start()
    try:
        await publish_all(bus, events)
        await wait_until(lambda: recorder.stats.events >= len(events), within_s=30, what="the inserts")
    finally:
        await recorder.stop()
    counts = store.counts()
    assert counts.total == len(events)
    topics = dict(store.query(f"SELECT topic, count() FROM {store.database}.events GROUP BY topic").rows)  # type: ignore[arg-type]
    assert set(topics) == {s.TASKS, s.EPISODES, s.TRANSITIONS, s.CONTROL, s.DEADLETTER, s.AGL}
    offsets = store.query(f"SELECT min(bus_offset), min(bus_partition) FROM {store.database}.events").rows
    assert offsets[0][0] == 0 and offsets[0][1] >= 0  # partition and offset recorded
    episodes = store.episodes(EpisodeFilter())

    # Replay every topic from offset 0: a new group reads it all again; nothing changes.
    replay = Recorder(bus, store, group="recorder-replay", max_wait_s=0.05)
    await replay.start()
    try:
        await wait_until(lambda: replay.stats.events >= len(events), within_s=30, what="the inserts")
    finally:
        await replay.stop()
    assert store.query(f"SELECT count() FROM {store.database}.events").rows[0][0] >= len(events)
    assert store.counts() == counts
    assert store.episodes(EpisodeFilter()) == episodes
    assert store.query(f"SELECT count() FROM {store.database}.events FINAL").rows == [[len(events)]]


@pytest.mark.parametrize("bus_kind", ["memory"])  # commit semantics on Kafka: the bus suite's job
async def test_recorder_resumes_after_its_committed_offsets(make_bus: MakeBus, store: ChdbStore) -> None:
    bus = await make_bus()
    first, second = history()[:10], history()[10:]
    recorder = Recorder(bus, store, max_wait_s=0.05)
    await recorder.start()
    await publish_all(bus, first)
    await wait_until(lambda: recorder.stats.events >= len(first), within_s=30, what="the inserts")
    await recorder.stop()
    await publish_all(bus, second)  # while no recorder runs
    again = Recorder(bus, store, max_wait_s=0.05)
    await again.start()
    try:
        await wait_until(lambda: again.stats.events >= len(second), within_s=30, what="the inserts")
    finally:
        await again.stop()
    assert again.stats.events == len(second)  # resumed after the commits, nothing read twice
    assert store.counts().total == len(first) + len(second)


class _FailingStore:
    """Wraps a store; the first ``failures`` inserts raise."""

    def __init__(self, inner: ChdbStore, failures: int) -> None:
        self.inner = inner
        self.database = inner.database
        self.failures = failures

    def insert_table(self, table) -> None:  # type: ignore[no-untyped-def]
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("disk full (simulated)")
        self.inner.insert_table(table)


async def test_failed_insert_is_retried_not_committed(store: ChdbStore) -> None:
    from infra.bus.memory import MemoryBus

    async with MemoryBus(retry_backoff_s=0.01) as bus:
        flaky = _FailingStore(store, failures=1)
        recorder = Recorder(bus, flaky, max_wait_s=0.05)  # type: ignore[arg-type]
        await recorder.start()
        try:
            events = history()[:6]
            await publish_all(bus, events)
            await wait_until(lambda: recorder.stats.events >= len(events), within_s=30, what="the inserts")
        finally:
            await recorder.stop()
        assert recorder.stats.failed_inserts == 1 and recorder.stats.last_error is not None
        assert store.counts().total == len(events)
        assert await bus.lag(s.EPISODES, "recorder") == 0
        assert await bus.lag(s.DEADLETTER, "recorder") == 0


async def test_chunked_batches_are_coalesced_and_committed_after_insert(store: ChdbStore) -> None:
    """A batch built in chunks of 2 lands whole, in few inserts, before its offsets are committed."""
    from infra.bus.memory import MemoryBus

    async with MemoryBus() as bus:
        events = [e for e in history() if s.topic_for(e) == s.EPISODES][:9]
        await publish_all(bus, events)
        inserted: list[int] = []
        lag_at_insert: list[int] = []
        loop = asyncio.get_running_loop()

        class _Spy:
            database = store.database

            def insert_table(self, table) -> None:  # type: ignore[no-untyped-def]
                fut = asyncio.run_coroutine_threadsafe(bus.lag(s.EPISODES, "recorder"), loop)
                lag_at_insert.append(fut.result(timeout=5))
                inserted.append(table.num_rows)
                store.insert_table(table)

        recorder = Recorder(
            bus,
            _Spy(),
            topics=[s.EPISODES],
            max_batch=100,
            build_chunk=2,
            busy_topic_consumers=1,  # type: ignore[arg-type]
        )
        await recorder.start()
        try:
            await wait_until(lambda: recorder.stats.events >= len(events), within_s=30, what="the inserts")
        finally:
            await recorder.stop()
        assert sum(inserted) == len(events) and len(inserted) < 5  # 5 chunks, coalesced
        assert lag_at_insert[0] == len(events)  # nothing committed before the rows were in
        assert await bus.lag(s.EPISODES, "recorder") == 0
        assert store.counts().total == len(events)
