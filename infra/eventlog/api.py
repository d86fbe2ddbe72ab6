"""The event log's admin HTTP API, for CLI reads while a running process holds the chdb directory.

Mounted by whoever owns the store (the embedded stack, ``flywheel recorder``):
``app.include_router(create_eventlog_router(store, admin_token))``. Every route needs
``Authorization: Bearer <FLYWHEEL_ADMIN_TOKEN>``; errors are OpenAI-shaped
(``{"error": {"message", "type", "code"}}``). Store calls block, so routes are plain ``def`` and run
in the threadpool.

    POST /admin/eventlog/query                     {"sql": "...", "max_rows": N} → QueryResult
    POST /admin/eventlog/episodes                  EpisodeFilter → [EpisodeSummary]
    GET  /admin/eventlog/episodes/{id}/events      → [EventRecord]
    GET  /admin/eventlog/stats?since&until&bucket&success_threshold → [StatsPoint]
    GET  /admin/eventlog/counts                    → EventCounts
    POST /admin/eventlog/scored                    {"filter": EpisodeFilter, "latest_per_episode"} → NDJSON EpisodeScored
    POST /admin/eventlog/calls                     CallFilter → NDJSON LLMCallRecorded
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine, Iterator
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.eventlog.errors import EventLogError, EventLogQueryError, ReadOnlyQueryError
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
from infra.logging import get_logger

log = get_logger(__name__)
PREFIX = "/admin/eventlog"


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sql: str = Field(min_length=1, max_length=100_000)
    max_rows: int = Field(default=10_000, ge=1, le=1_000_000)


class ScoredRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filter: EpisodeFilter = Field(default_factory=EpisodeFilter)
    latest_per_episode: bool = True


class ApiError(Exception):
    def __init__(self, status: int, kind: str, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.code, self.message = status, kind, code, message


def _error_response(status: int, kind: str, code: str, message: str) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "code": code, "param": None}}
    )


class _EventLogRoute(APIRoute):
    """Turns this router's errors into OpenAI-shaped bodies without touching the host app's handlers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                return _error_response(exc.status, exc.kind, exc.code, exc.message)
            except ReadOnlyQueryError as exc:
                return _error_response(400, "invalid_request_error", "read_only", str(exc))
            except EventLogQueryError as exc:
                return _error_response(400, "invalid_request_error", "query_failed", str(exc))
            except RequestValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
                where = ".".join(str(p) for p in first.get("loc", ()))
                return _error_response(
                    400, "invalid_request_error", "invalid_request", f"{first['msg']} at {where}"
                )
            except ValidationError as exc:
                return _error_response(
                    400, "invalid_request_error", "invalid_filter", str(exc.errors()[0]["msg"])
                )
            except EventLogError as exc:
                log.warning("eventlog.api_error", error=str(exc))
                return _error_response(503, "server_error", "eventlog_unavailable", str(exc))

        return route


def _ndjson(items: Iterator[BaseModel]) -> StreamingResponse:
    """Stream ``items`` as NDJSON; the first one is fetched here so a failing query is a clean 4xx/5xx."""
    first = next(items, None)

    def lines() -> Iterator[bytes]:
        if first is None:
            return
        yield first.model_dump_json().encode() + b"\n"
        for item in items:
            yield item.model_dump_json().encode() + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def create_eventlog_router(store: EventStore, admin_token: str) -> APIRouter:
    """Routes under ``/admin/eventlog`` reading ``store``; all of them need ``admin_token``."""
    expected = admin_token.encode()

    def require_admin(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if (
            not expected
            or scheme.lower() != "bearer"
            or not hmac.compare_digest(token.strip().encode(), expected)
        ):
            raise ApiError(
                401,
                "authentication_error",
                "invalid_admin_token",
                "admin token required (Authorization: Bearer <FLYWHEEL_ADMIN_TOKEN>)",
            )

    router = APIRouter(
        prefix=PREFIX, route_class=_EventLogRoute, dependencies=[Depends(require_admin)], tags=["eventlog"]
    )

    @router.post("/query", response_model=QueryResult)
    def query(body: QueryRequest) -> QueryResult:
        return store.query(body.sql, max_rows=body.max_rows)

    @router.post("/episodes", response_model=list[EpisodeSummary])
    def episodes(body: EpisodeFilter) -> list[EpisodeSummary]:
        return store.episodes(body)

    @router.get("/episodes/{episode_id}/events", response_model=list[EventRecord])
    def episode_events(episode_id: str) -> list[EventRecord]:
        if not 0 < len(episode_id) <= 64:
            raise ApiError(
                400, "invalid_request_error", "invalid_episode_id", "episode id must be 1-64 characters"
            )
        return store.episode_events(episode_id)

    @router.get("/stats", response_model=list[StatsPoint])
    def stats(
        since: datetime | None = None,
        until: datetime | None = None,
        bucket: Bucket = "hour",
        success_threshold: float = 1.0,
    ) -> list[StatsPoint]:
        return store.stats(since, until, bucket, success_threshold)

    @router.get("/counts", response_model=EventCounts)
    def counts() -> EventCounts:
        return store.counts()

    @router.post("/scored")
    def scored(body: ScoredRequest) -> StreamingResponse:
        return _ndjson(store.select_scored_episodes(body.filter, latest_per_episode=body.latest_per_episode))

    @router.post("/calls")
    def calls(body: CallFilter) -> StreamingResponse:
        return _ndjson(store.select_calls(body))

    return router
