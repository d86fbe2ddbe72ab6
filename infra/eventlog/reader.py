"""The event log's reads, declared once: ``EventLogReader``, and ``TrendReader`` with the trends.

Two ways to read it, one surface: the stores (``infra.eventlog.base.SqlStore``: embedded chdb and a
ClickHouse server) and the admin API of the process that holds the store
(``infra.eventlog.client.HttpEventLogReader``). The CLI takes whichever ``open_reader`` finds; the web
view (``flywheel.ui``) reads a store, which also answers the training trends (the admin API does not
serve those).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Protocol

from infra.eventlog.models import (
    Bucket,
    CallFilter,
    EpisodeFilter,
    EpisodeSummary,
    EventCounts,
    EventRecord,
    QueryResult,
    StatsPoint,
    TenantFeedback,
    TrainerStepPoint,
    VersionPoint,
)
from schemas import EpisodeScored, LLMCallRecorded


class EventLogReader(Protocol):
    """What any reader of the event log can ask, through a store or through the admin API."""

    def query(self, sql: str, *, max_rows: int = 10_000) -> QueryResult:
        """One read-only statement (``infra.eventlog.readonly``), at most ``max_rows`` rows."""
        ...

    def episodes(self, f: EpisodeFilter) -> list[EpisodeSummary]: ...

    def episode_events(self, episode_id: str) -> list[EventRecord]: ...

    def stats(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        bucket: Bucket = "hour",
        success_threshold: float = 1.0,
        *,
        policy: str | None = None,
        by_policy: bool = False,
    ) -> list[StatsPoint]: ...

    def counts(self) -> EventCounts: ...

    def select_scored_episodes(
        self, f: EpisodeFilter, *, latest_per_episode: bool = True
    ) -> Iterator[EpisodeScored]: ...

    def select_calls(self, f: CallFilter) -> Iterator[LLMCallRecorded]: ...

    def close(self) -> None: ...


class TrendReader(EventLogReader, Protocol):
    """The reads and the training trends the web view charts (``infra.eventlog.trends``)."""

    def trainer_steps(self, since: datetime | None = None, limit: int = 2000) -> list[TrainerStepPoint]: ...

    def by_version(
        self, since: datetime | None = None, success_threshold: float = 1.0
    ) -> list[VersionPoint]: ...

    def tenant_feedback(
        self, since: datetime | None = None, success_threshold: float = 1.0
    ) -> list[TenantFeedback]: ...
