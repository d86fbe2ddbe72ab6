"""Reading the event log from the CLI: open the store directly, or ask the process that holds it.

:func:`open_reader` decides: an explicit ``--url`` / ``FLYWHEEL_ADMIN_URL`` → the running process's
admin API (:class:`HttpEventLogReader`); ``FLYWHEEL_CLICKHOUSE_URL`` → the server; otherwise the chdb
directory, opened here when it is free. When another process holds it and no admin URL is known, the
error says so in one line (:class:`EventLogLockedError`). Either way the caller gets the same reads
(``infra.eventlog.reader.EventLogReader``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from pydantic import BaseModel, TypeAdapter

from infra.eventlog.api import PREFIX
from infra.eventlog.errors import (
    EventLogError,
    EventLogLockedError,
    EventLogQueryError,
    EventLogUnavailableError,
    ReadOnlyQueryError,
)
from infra.eventlog.lock import chdb_holder
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
from infra.eventlog.reader import EventLogReader
from infra.eventlog.store import DEFAULT_DATABASE, open_store
from schemas import EpisodeScored, LLMCallRecorded

_EPISODES = TypeAdapter(list[EpisodeSummary])
_EVENTS = TypeAdapter(list[EventRecord])
_STATS = TypeAdapter(list[StatsPoint])


class HttpEventLogReader(EventLogReader):
    """The event log's reads through a running process's admin API (``create_eventlog_router``)."""

    def __init__(
        self, url: str, admin_token: str, *, timeout_s: float = 60.0, client: httpx.Client | None = None
    ) -> None:
        """``client`` (e.g. a Starlette ``TestClient``) replaces the HTTP client built for ``url``."""
        self.url = url.rstrip("/")
        self._owns_client = client is None
        self._client = client or httpx.Client(base_url=self.url, timeout=timeout_s)
        self._headers = {"Authorization": f"Bearer {admin_token}"}

    def _raise_for(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        try:
            error = response.json()["error"]
            message, code = str(error["message"]), str(error.get("code", ""))
        except Exception:
            message, code = response.text[:300] or response.reason_phrase, ""
        if response.status_code == 401:
            raise EventLogError(
                f"{self.url} refused the admin token; set FLYWHEEL_ADMIN_TOKEN to the token of that process"
            )
        if response.status_code == 404:
            raise EventLogUnavailableError(f"{self.url} serves no event log API ({PREFIX} not found)")
        if code == "read_only":
            raise ReadOnlyQueryError(message)
        if response.status_code == 400:
            raise EventLogQueryError(message)
        raise EventLogUnavailableError(f"{self.url}: {message}")

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, PREFIX + path, headers=self._headers, **kwargs)
        except httpx.HTTPError as exc:
            raise EventLogUnavailableError(
                f"cannot reach the Flywheel admin API at {self.url}: {exc}"
            ) from exc
        self._raise_for(response)
        return response

    def _stream(self, path: str, body: BaseModel | dict[str, Any]) -> Iterator[str]:
        data = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
        try:
            with self._client.stream("POST", PREFIX + path, json=data, headers=self._headers) as response:
                if response.status_code >= 400:
                    response.read()
                    self._raise_for(response)
                for line in response.iter_lines():
                    if line.strip():
                        yield line
        except httpx.HTTPError as exc:
            raise EventLogUnavailableError(
                f"cannot reach the Flywheel admin API at {self.url}: {exc}"
            ) from exc

    def query(self, sql: str, *, max_rows: int = 10_000) -> QueryResult:
        response = self._request("POST", "/query", json={"sql": sql, "max_rows": max_rows})
        return QueryResult.model_validate_json(response.content)

    def episodes(self, f: EpisodeFilter) -> list[EpisodeSummary]:
        return _EPISODES.validate_json(
            self._request("POST", "/episodes", json=f.model_dump(mode="json")).content
        )

    def episode_events(self, episode_id: str) -> list[EventRecord]:
        return _EVENTS.validate_json(self._request("GET", f"/episodes/{episode_id}/events").content)

    def stats(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        bucket: Bucket = "hour",
        success_threshold: float = 1.0,
        *,
        policy: str | None = None,
        by_policy: bool = False,
    ) -> list[StatsPoint]:
        params: dict[str, str] = {"bucket": bucket, "success_threshold": str(success_threshold)}
        if since is not None:
            params["since"] = since.isoformat()
        if until is not None:
            params["until"] = until.isoformat()
        if policy is not None:
            params["policy"] = policy
        if by_policy:
            params["by_policy"] = "true"
        return _STATS.validate_json(self._request("GET", "/stats", params=params).content)

    def counts(self) -> EventCounts:
        return EventCounts.model_validate_json(self._request("GET", "/counts").content)

    def select_scored_episodes(
        self, f: EpisodeFilter, *, latest_per_episode: bool = True
    ) -> Iterator[EpisodeScored]:
        body = {"filter": f.model_dump(mode="json"), "latest_per_episode": latest_per_episode}
        for line in self._stream("/scored", body):
            yield EpisodeScored.model_validate_json(line)

    def select_calls(self, f: CallFilter) -> Iterator[LLMCallRecorded]:
        for line in self._stream("/calls", f):
            yield LLMCallRecorded.model_validate_json(line)

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> HttpEventLogReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def open_reader(
    *,
    admin_url: str | None,
    admin_token: str,
    clickhouse_url: str = "",
    chdb_path: Path,
    database: str = DEFAULT_DATABASE,
) -> EventLogReader:
    """The best way to read the event log from here (see the module docstring)."""
    if admin_url:
        return HttpEventLogReader(admin_url, admin_token)
    if clickhouse_url:
        return open_store(clickhouse_url=clickhouse_url, migrate=False)
    path = chdb_path.resolve()
    holder = chdb_holder(path)
    if holder is not None:
        raise EventLogLockedError(chdb_path, holder.pid)
    if not path.exists():
        raise EventLogUnavailableError(
            f"no event log at {chdb_path} (nothing recorded here yet); run `flywheel db migrate` or pass --url"
        )
    return open_store(chdb_path=path, database=database, migrate=True)
