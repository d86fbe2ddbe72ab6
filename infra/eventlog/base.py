"""What every event store does, written once: the ``EventStore`` protocol and ``SqlStore``.

``EventStore`` is the event log's reads (``infra.eventlog.reader.TrendReader``) with the writes and
the schema. ``SqlStore`` implements every write and query on four primitives (select, read-only
select, command, Arrow insert) that the chdb and server stores provide (:mod:`infra.eventlog.store`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

import orjson
import pyarrow as pa
from pydantic import JsonValue, ValidationError

from infra.bus.base import Message
from infra.eventlog import queries, trends
from infra.eventlog.ddl import MIGRATIONS, bootstrap_statements, render
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
from infra.eventlog.reader import TrendReader
from infra.eventlog.readonly import check_read_only
from infra.eventlog.rows import messages_to_arrow, to_arrow
from infra.logging import get_logger
from schemas import AnyEvent, EpisodeScored, LLMCallRecorded

log = get_logger(__name__)

DEFAULT_DATABASE = "flywheel"
_PAGE = 500
Rows = list[tuple[Any, ...]]


@runtime_checkable
class EventStore(TrendReader, Protocol):
    """A store: the event log's reads (``infra.eventlog.reader``), its writes and its schema."""

    database: str

    def migrate(self) -> list[int]:
        """Apply missing migrations (idempotent); return the versions applied now."""

    def insert(self, events: Sequence[AnyEvent]) -> None: ...

    def insert_messages(self, messages: Sequence[Message]) -> None:
        """Insert bus messages, recording topic, key, partition and offset."""

    def insert_table(self, table: pa.Table) -> None: ...

    def task_history(
        self, since: datetime | None = None, groups_per_task: int = 4
    ) -> dict[str, list[list[float]]]: ...


def _json_value(value: Any) -> JsonValue:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


def _numbers(raw: str | bytes | None) -> dict[str, float]:
    """The numeric members of a JSON object (a step's metrics or samples); anything else is dropped."""
    data = orjson.loads(raw or "{}")
    if not isinstance(data, dict):
        return {}
    return {
        str(k): float(v) for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class SqlStore(EventStore):
    """Every query, written once; subclasses provide the four primitives below."""

    database: str

    def _select(self, sql: str, params: dict[str, Any]) -> tuple[list[str], list[str], Rows]:
        raise NotImplementedError

    def _select_readonly(self, sql: str, max_rows: int) -> tuple[list[str], list[str], Rows]:
        raise NotImplementedError

    def _command(self, sql: str) -> None:
        raise NotImplementedError

    def _insert_table(self, table: pa.Table) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # ---------------------------------------------------------------------------------- schema

    def migrate(self) -> list[int]:
        db = self.database
        for statement in bootstrap_statements(db):
            self._command(statement)
        _, _, rows = self._select(f"SELECT DISTINCT version FROM {db}.schema_migrations", {})
        done = {int(r[0]) for r in rows}
        applied = []
        for migration in MIGRATIONS:
            if migration.version in done:
                continue
            for statement in migration.statements:
                self._command(render(statement, db))
            self._command(
                f"INSERT INTO {db}.schema_migrations (version, name) "
                f"VALUES ({migration.version}, '{migration.name.replace(chr(39), '')}')"
            )
            applied.append(migration.version)
            log.info("eventlog.migrated", database=db, version=migration.version, name=migration.name)
        return applied

    # ---------------------------------------------------------------------------------- writes

    def insert(self, events: Sequence[AnyEvent]) -> None:
        if events:
            self._insert_table(to_arrow(events))

    def insert_messages(self, messages: Sequence[Message]) -> None:
        if messages:
            self._insert_table(messages_to_arrow(messages))

    def insert_table(self, table: pa.Table) -> None:
        """Insert rows already built by :func:`infra.eventlog.rows.to_arrow` (the recorder's path)."""
        if table.num_rows:
            self._insert_table(table)

    # ----------------------------------------------------------------------------------- reads

    def episode_events(self, episode_id: str) -> list[EventRecord]:
        _, _, rows = self._select(*queries.episode_events(self.database, episode_id))
        return [
            EventRecord(
                event_id=r[0],
                type=r[1],
                topic=r[2],
                emitted_at=_utc(r[3]),
                call_seq=None if r[4] < 0 else r[4],
                weight_version=None if r[5] < 0 else r[5],
                reward=r[6],
                status=r[7],
                payload=r[8],
            )
            for r in rows
        ]

    def episodes(self, f: EpisodeFilter) -> list[EpisodeSummary]:
        columns, _, rows = self._select(*queries.episodes(self.database, f))
        out = []
        for r in rows:
            d = dict(zip(columns, r, strict=True))
            d["started_at"], d["last_event_at"] = _utc(d["started_at"]), _utc(d["last_event_at"])
            d["scored"] = bool(d["scored"])
            out.append(EpisodeSummary.model_validate(d))
        return out

    def select_scored_episodes(
        self, f: EpisodeFilter, *, latest_per_episode: bool = True
    ) -> Iterator[EpisodeScored]:
        """Matching ``EpisodeScored`` events oldest first, paged; ``f.limit`` caps the total.

        With ``latest_per_episode`` an episode scored more than once (rescored, replayed) yields
        only its latest score. Rows that no longer validate are logged and skipped.
        """
        after: tuple[datetime, str] | None = None
        remaining = f.limit
        while remaining > 0:
            page = min(_PAGE, remaining)
            sql, params = queries.scored_page(self.database, f, after, page, latest_per_episode)
            _, _, rows = self._select(sql, params)
            for emitted_at, event_id, payload in rows:
                after = (_utc(emitted_at), event_id)
                try:
                    yield EpisodeScored.model_validate_json(payload)
                except ValidationError as exc:
                    log.warning("eventlog.undecodable", event_id=event_id, error=str(exc).splitlines()[0])
            remaining -= len(rows)
            if len(rows) < page:
                return

    def select_calls(self, f: CallFilter) -> Iterator[LLMCallRecorded]:
        """Matching ``LLMCallRecorded`` events by episode then ``call_seq``, paged."""
        after: tuple[str, int, str] | None = None
        remaining = f.limit if f.limit is not None else 1 << 62
        while remaining > 0:
            page = min(_PAGE, remaining)
            _, _, rows = self._select(*queries.calls_page(self.database, f, after, page))
            for episode_id, call_seq, event_id, payload in rows:
                after = (episode_id, call_seq, event_id)
                try:
                    yield LLMCallRecorded.model_validate_json(payload)
                except ValidationError as exc:
                    log.warning("eventlog.undecodable", event_id=event_id, error=str(exc).splitlines()[0])
            remaining -= len(rows)
            if len(rows) < page:
                return

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
        columns, _, rows = self._select(
            *queries.stats(
                self.database, since, until, bucket, success_threshold, policy=policy, by_policy=by_policy
            )
        )
        points = []
        for r in rows:
            d = dict(zip(columns, r, strict=True))
            d["bucket"] = _utc(d["bucket"])
            points.append(StatsPoint.model_validate(d))
        return points

    def trainer_steps(self, since: datetime | None = None, limit: int = 2000) -> list[TrainerStepPoint]:
        """The latest ``limit`` trainer steps, oldest first, with the figures each reported."""
        _, _, rows = self._select(*trends.trainer_steps(self.database, since, limit))
        return [
            TrainerStepPoint(
                step=step,
                version=max(version, 0),
                at=_utc(at),
                adapter=adapter,
                metrics=_numbers(metrics),
                samples={k: int(v) for k, v in _numbers(samples).items()},
            )
            for step, version, at, adapter, metrics, samples in rows
        ]

    def by_version(self, since: datetime | None = None, success_threshold: float = 1.0) -> list[VersionPoint]:
        """Scored episodes per serving weight version (see ``trends.by_version``)."""
        columns, _, rows = self._select(*trends.by_version(self.database, since, success_threshold))
        return [VersionPoint.model_validate(dict(zip(columns, r, strict=True))) for r in rows]

    def tenant_feedback(
        self, since: datetime | None = None, success_threshold: float = 1.0
    ) -> list[TenantFeedback]:
        """Production sessions per tenant and the share with user feedback."""
        columns, _, rows = self._select(*trends.tenant_feedback(self.database, since, success_threshold))
        return [TenantFeedback.model_validate(dict(zip(columns, r, strict=True))) for r in rows]

    def task_history(
        self, since: datetime | None = None, groups_per_task: int = 4
    ) -> dict[str, list[list[float]]]:
        """Per training task, its last groups' rewards, oldest first (see ``queries.task_history``)."""
        _, _, rows = self._select(*queries.task_history(self.database, since, groups_per_task))
        return {str(task): [[float(r) for r in group] for group in groups] for task, groups in rows}

    def counts(self) -> EventCounts:
        _, _, rows = self._select(*queries.counts(self.database))
        by_type = {str(t): int(n) for t, n in rows}
        return EventCounts(total=sum(by_type.values()), by_type=by_type)

    def query(self, sql: str, *, max_rows: int = 10_000) -> QueryResult:
        statement = check_read_only(sql)
        columns, types, rows = self._select_readonly(statement, max_rows)
        return QueryResult(
            columns=columns, types=types, rows=[[_json_value(v) for v in row] for row in rows[:max_rows]]
        )
