"""The recorder, wired: ``build`` puts the configured store (ClickHouse server, or chdb owned by this
process) and the recorder on a bus; ``flywheel.assembly.build_recorder`` calls it for every
entry point (the embedded stack, ``agl-server``, and ``flywheel recorder``, which runs it alone through
``flywheel.alone`` and serves :meth:`RecorderProcess.api` so CLI reads reach the chdb
directory it holds). Its ``stop`` writes and commits the in-flight batches, then closes the store.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI

from infra.body import BodyBound
from infra.bus.base import Bus
from infra.eventlog.api import create_eventlog_router
from infra.eventlog.recorder import ALL_TOPICS, Recorder
from infra.eventlog.settings import EventLogSettings
from infra.eventlog.store import EventStore, open_store
from infra.origin import HostPolicy, OriginGuard
from schemas import tasks_topic

MAX_BODY_BYTES = 1 << 20  # the recorder's API takes queries and filters, never data


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

    def api(self, admin_token: str, *, bound_host: str = "127.0.0.1", allowed_hosts: str = "") -> FastAPI:
        """The event-log admin API of this process: bodies bounded, Host and Origin checked as the
        gateway's admin routes are (``infra/origin.py``)."""
        app = FastAPI(title="Flywheel recorder")
        app.add_middleware(BodyBound, max_bytes=MAX_BODY_BYTES)
        app.add_middleware(OriginGuard, policy=HostPolicy.for_server(bound_host, allowed_hosts))
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
