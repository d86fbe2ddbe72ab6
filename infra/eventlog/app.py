"""``flywheel recorder``: the recorder alone, for the distributed run.

Wires the configured bus (Kafka or in-process), the configured store (ClickHouse server, or chdb owned
by this process) and the recorder, and runs them with ``infra.service.serve``; serves the event log's
admin API so CLI reads reach the chdb directory this process holds. Stops cleanly on SIGINT/SIGTERM:
in-flight batches are written and committed first, then the store is closed.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI

from infra import service
from infra.bus.base import Bus
from infra.eventlog.recorder import ALL_TOPICS, Recorder
from infra.eventlog.settings import EventLogSettings
from infra.eventlog.store import EventStore, open_store
from schemas import tasks_topic


class RecorderProcess:
    """The recorder and the store it owns: ``stop`` commits the last batches, then closes the store."""

    def __init__(self, recorder: Recorder, store: EventStore) -> None:
        self.recorder = recorder
        self.store = store

    async def start(self) -> None:
        await self.recorder.start()

    async def stop(self) -> None:
        try:
            await self.recorder.stop()
        finally:
            await asyncio.to_thread(self.store.close)

    def api(self, admin_token: str) -> FastAPI:
        from infra.eventlog.api import create_eventlog_router

        app = FastAPI(title="Flywheel recorder")
        app.include_router(create_eventlog_router(self.store, admin_token))
        stats = self.recorder.stats

        @app.get("/healthz")
        def healthz() -> dict[str, object]:
            return {"ok": True, "events": stats.events, "last_error": stats.last_error}

        return app


async def build(settings: EventLogSettings, bus: Bus) -> RecorderProcess:
    store = await asyncio.to_thread(
        open_store,
        clickhouse_url=settings.clickhouse_url,
        chdb_path=settings.chdb_path,
        database=settings.clickhouse_database,
    )
    recorder = Recorder(
        bus,
        store,
        topics=[*ALL_TOPICS, *(tasks_topic(pool) for pool in settings.recorder_task_pools)],
        max_batch=settings.recorder_max_batch,
        max_wait_s=settings.recorder_max_wait_s,
    )
    return RecorderProcess(recorder, store)


async def run_recorder(settings: EventLogSettings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or a signal arrives)."""
    http = None
    if settings.recorder_port:
        token = settings.admin_token.get_secret_value()
        http = service.Http(
            lambda process: process.api(token), host=settings.recorder_host, port=settings.recorder_port
        )
    await service.serve(settings, lambda bus: build(settings, bus), name="recorder", http=http, stop=stop)
