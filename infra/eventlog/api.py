"""The event log's admin HTTP API, for CLI reads while a running process holds the chdb directory.

Mounted by whoever owns the store (the embedded stack, ``flywheel recorder``):
``app.include_router(create_eventlog_router(store, admin_token))``. Every route needs
``Authorization: Bearer <FLYWHEEL_ADMIN_TOKEN>``; errors are OpenAI-shaped
(``{"error": {"message", "type", "param", "code"}}``, built by ``infra.http``).

Reads never stop the process from serving: each runs on this router's own reader threads (never on
the event loop, never on the threadpool the host's other routes use), at most ``max_reads`` at a time
(more: 503 ``eventlog_busy`` at once), and is answered 504 ``eventlog_timeout`` when it passes
``deadline_s`` (the store bounds the read itself too, see ``infra.eventlog.store``). Filters are
validated before any query runs (``infra.eventlog.models``: int limits, bounded versions and strings).

    POST /admin/eventlog/query                     {"sql": "...", "max_rows": N} → QueryResult
    POST /admin/eventlog/episodes                  EpisodeFilter → [EpisodeSummary]
    GET  /admin/eventlog/episodes/{id}/events      → [EventRecord]
    GET  /admin/eventlog/stats?since&until&bucket&success_threshold → [StatsPoint]
    GET  /admin/eventlog/counts                    → EventCounts
    POST /admin/eventlog/scored                    {"filter": EpisodeFilter, "latest_per_episode"} → NDJSON EpisodeScored
    POST /admin/eventlog/calls                     CallFilter → NDJSON LLMCallRecorded
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.eventlog.errors import (
    EventLogError,
    EventLogQueryError,
    EventLogTimeoutError,
    ReadOnlyQueryError,
)
from infra.eventlog.models import (
    Bucket,
    CallFilter,
    EpisodeFilter,
    EpisodeSummary,
    EventCounts,
    EventRecord,
    QueryResult,
    StatsPoint,
)
from infra.eventlog.store import EventStore
from infra.http import HttpError, HttpErrorRoute, require_admin, validation_message
from infra.logging import get_logger

log = get_logger(__name__)
PREFIX = "/admin/eventlog"
T = TypeVar("T")
DEADLINE_S = 35.0  # a little over the store's own read bound (READ_TIMEOUT_S), which answers first
MAX_READS = 4


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sql: str = Field(min_length=1, max_length=100_000)
    max_rows: int = Field(default=10_000, ge=1, le=1_000_000, strict=True)


class ScoredRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filter: EpisodeFilter = Field(default_factory=EpisodeFilter)
    latest_per_episode: bool = True


class _EventLogRoute(HttpErrorRoute):
    """Turns this router's errors into OpenAI-shaped bodies without touching the host app's handlers."""

    def translate(self, exc: Exception) -> HttpError | None:
        def bad(message: str, code: str, param: str | None = None) -> HttpError:
            return HttpError(
                message, status_code=400, error_type="invalid_request_error", code=code, param=param
            )

        match exc:
            case HttpError():
                return exc
            case ReadOnlyQueryError():
                return bad(str(exc), "read_only")
            case EventLogQueryError():
                return bad(str(exc), "query_failed")
            case EventLogTimeoutError():
                log.warning("eventlog.read_timeout", error=str(exc))
                return HttpError(str(exc), status_code=504, code="eventlog_timeout")
            case RequestValidationError() | ValidationError():
                message, param = validation_message(exc.errors(), skip=())
                code = "invalid_request" if isinstance(exc, RequestValidationError) else "invalid_filter"
                return bad(message, code, param)
            case EventLogError():
                log.warning("eventlog.api_error", error=str(exc))
                return HttpError(str(exc), status_code=503, code="eventlog_unavailable")
        return None


class Readers:
    """Where this router's reads run: ``max_reads`` threads of its own, each read with a deadline."""

    def __init__(self, max_reads: int = MAX_READS, deadline_s: float = DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self._threads = ThreadPoolExecutor(max_reads, thread_name_prefix="eventlog-read")
        self._free = max_reads

    async def run(self, fn: Callable[[], T]) -> T:
        if self._free <= 0:
            raise HttpError(
                "the event log is busy with other reads; retry shortly",
                status_code=503,
                code="eventlog_busy",
                headers={"Retry-After": "1"},
            )
        self._free -= 1
        future = asyncio.get_running_loop().run_in_executor(self._threads, fn)
        try:
            # shield: on timeout the read keeps its thread until the store's own bound stops it,
            # and only then is the slot given back (so abandoned reads cannot pile up).
            return await asyncio.wait_for(asyncio.shield(future), self.deadline_s)
        except TimeoutError:
            raise EventLogTimeoutError(
                f"the event-log read did not finish within {self.deadline_s:g} s"
            ) from None
        finally:
            if future.done():
                self._free += 1
            else:
                future.add_done_callback(self._release)

    def _release(self, _: object) -> None:
        self._free += 1

    def iterate(self, items: Iterator[T]) -> Callable[[], T | None]:
        return lambda: next(items, None)


async def _ndjson(readers: Readers, items: Iterator[BaseModel]) -> StreamingResponse:
    """Stream ``items`` as NDJSON; the first one is fetched here so a failing query is a clean 4xx/5xx."""
    first = await readers.run(readers.iterate(items))

    def lines() -> Iterator[bytes]:
        # Starlette runs this sync iterator in its threadpool; each page the store fetches is bounded.
        if first is None:
            return
        yield first.model_dump_json().encode() + b"\n"
        for item in items:
            yield item.model_dump_json().encode() + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def create_eventlog_router(
    store: EventStore, admin_token: str, *, max_reads: int = MAX_READS, deadline_s: float = DEADLINE_S
) -> APIRouter:
    """Routes under ``/admin/eventlog`` reading ``store``; all of them need ``admin_token``."""
    readers = Readers(max_reads, deadline_s)

    def admin_only(request: Request) -> None:
        require_admin(request, admin_token)

    router = APIRouter(
        prefix=PREFIX, route_class=_EventLogRoute, dependencies=[Depends(admin_only)], tags=["eventlog"]
    )

    @router.post("/query", response_model=QueryResult)
    async def query(body: QueryRequest) -> QueryResult:
        return await readers.run(lambda: store.query(body.sql, max_rows=body.max_rows))

    @router.post("/episodes", response_model=list[EpisodeSummary])
    async def episodes(body: EpisodeFilter) -> list[EpisodeSummary]:
        return await readers.run(lambda: store.episodes(body))

    @router.get("/episodes/{episode_id}/events", response_model=list[EventRecord])
    async def episode_events(episode_id: str) -> list[EventRecord]:
        if not 0 < len(episode_id) <= 64:
            raise HttpError(
                "episode id must be 1-64 characters",
                status_code=400,
                error_type="invalid_request_error",
                code="invalid_episode_id",
                param="episode_id",
            )
        return await readers.run(lambda: store.episode_events(episode_id))

    @router.get("/stats", response_model=list[StatsPoint])
    async def stats(
        since: datetime | None = None,
        until: datetime | None = None,
        bucket: Bucket = "hour",
        success_threshold: float = Query(1.0, ge=-1e12, le=1e12, allow_inf_nan=False),
        policy: str | None = Query(None, min_length=1, max_length=128),
        by_policy: bool = False,
    ) -> list[StatsPoint]:
        return await readers.run(
            lambda: store.stats(since, until, bucket, success_threshold, policy=policy, by_policy=by_policy)
        )

    @router.get("/counts", response_model=EventCounts)
    async def counts() -> EventCounts:
        return await readers.run(store.counts)

    @router.post("/scored")
    async def scored(body: ScoredRequest) -> StreamingResponse:
        items = store.select_scored_episodes(body.filter, latest_per_episode=body.latest_per_episode)
        return await _ndjson(readers, items)

    @router.post("/calls")
    async def calls(body: CallFilter) -> StreamingResponse:
        return await _ndjson(readers, store.select_calls(body))

    return router
