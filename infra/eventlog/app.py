"""``flywheel recorder``: the recorder alone, for the distributed run.

Wires the configured bus (Kafka or in-process), the configured store (ClickHouse server, or chdb owned
by this process) and the recorder; serves the event log's admin API so CLI reads reach the chdb
directory this process holds. Stops cleanly on SIGINT/SIGTERM: in-flight batches are written and
committed first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

from infra.bus.factory import make_bus
from infra.eventlog.recorder import ALL_TOPICS, Recorder
from infra.eventlog.settings import EventLogSettings
from infra.eventlog.store import open_store
from infra.logging import get_logger
from schemas import tasks_topic

log = get_logger(__name__)


async def run_recorder(settings: EventLogSettings, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or a signal arrives)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    store = await asyncio.to_thread(
        open_store,
        clickhouse_url=settings.clickhouse_url,
        chdb_path=settings.chdb_path,
        database=settings.clickhouse_database,
    )
    bus = make_bus(settings)
    server = None
    server_task: asyncio.Task[None] | None = None
    try:
        await bus.start()
        recorder = Recorder(
            bus,
            store,
            topics=[*ALL_TOPICS, *(tasks_topic(pool) for pool in settings.recorder_task_pools)],
            max_batch=settings.recorder_max_batch,
            max_wait_s=settings.recorder_max_wait_s,
        )
        await recorder.start()
        if settings.recorder_port:
            import uvicorn
            from fastapi import FastAPI

            from infra.eventlog.api import create_eventlog_router

            app = FastAPI(title="Flywheel recorder")
            app.include_router(create_eventlog_router(store, settings.admin_token.get_secret_value()))

            @app.get("/healthz")
            def healthz() -> dict[str, object]:
                return {"ok": True, "events": recorder.stats.events, "last_error": recorder.stats.last_error}

            config = uvicorn.Config(
                app,
                host=settings.recorder_host,
                port=settings.recorder_port,
                log_level="warning",
                lifespan="off",
            )
            server = uvicorn.Server(config)
            # serve() would install its own SIGINT/SIGTERM handlers; this process's ``stop`` owns them.
            server_task = asyncio.create_task(server._serve())
            log.info("recorder.api", url=f"http://{settings.recorder_host}:{settings.recorder_port}")
        await stop.wait()
        await recorder.stop()
    finally:
        if server is not None and server_task is not None:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await server_task
        await bus.stop()
        await asyncio.to_thread(store.close)
