"""``EventStore``: where events land and how the rest of Flywheel reads them back.

Two implementations share every query (``_SqlStore``): :class:`ChdbStore` (embedded ClickHouse, one
data directory per process) and :class:`ServerStore` (a ClickHouse server ≥ 24.8 over HTTP through
clickhouse-connect). :func:`open_store` picks one from ``FLYWHEEL_CLICKHOUSE_URL``.

Writes go through ``insert``/``insert_messages`` (one Arrow insert per batch). Reads return typed
models. ``query(sql)`` is the one free-form entry point and it only reads: a lexical check
(:mod:`infra.eventlog.readonly`) and then a connection on which ``readonly`` is set.
Errors: see :mod:`infra.eventlog.errors`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit
from uuid import UUID

import pyarrow as pa
from pydantic import JsonValue, ValidationError

from infra.bus.base import Message
from infra.eventlog import queries
from infra.eventlog.ddl import MIGRATIONS, bootstrap_statements, check_identifier, render
from infra.eventlog.errors import EventLogError, EventLogQueryError, EventLogUnavailableError
from infra.eventlog.lock import chdb_holder, claim_path, release_path
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
from infra.eventlog.readonly import check_read_only
from infra.eventlog.rows import messages_to_arrow, to_arrow
from infra.logging import get_logger
from schemas import AnyEvent, EpisodeScored, LLMCallRecorded

log = get_logger(__name__)

DEFAULT_DATABASE = "flywheel"
_PAGE = 500
Rows = list[tuple[Any, ...]]


@runtime_checkable
class EventStore(Protocol):
    database: str

    def migrate(self) -> list[int]:
        """Apply missing migrations (idempotent); return the versions applied now."""

    def insert(self, events: Sequence[AnyEvent]) -> None: ...

    def insert_messages(self, messages: Sequence[Message]) -> None:
        """Insert bus messages, recording topic, key, partition and offset."""

    def insert_table(self, table: pa.Table) -> None: ...

    def episode_events(self, episode_id: str) -> list[EventRecord]: ...

    def episodes(self, f: EpisodeFilter) -> list[EpisodeSummary]: ...

    def select_scored_episodes(
        self, f: EpisodeFilter, *, latest_per_episode: bool = True
    ) -> Iterator[EpisodeScored]: ...

    def select_calls(self, f: CallFilter) -> Iterator[LLMCallRecorded]: ...

    def stats(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        bucket: Bucket = "hour",
        success_threshold: float = 1.0,
    ) -> list[StatsPoint]: ...

    def counts(self) -> EventCounts: ...

    def query(self, sql: str, *, max_rows: int = 10_000) -> QueryResult: ...

    def close(self) -> None: ...


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


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class _SqlStore:
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
    ) -> list[StatsPoint]:
        columns, _, rows = self._select(
            *queries.stats(self.database, since, until, bucket, success_threshold)
        )
        points = []
        for r in rows:
            d = dict(zip(columns, r, strict=True))
            d["bucket"] = _utc(d["bucket"])
            points.append(StatsPoint.model_validate(d))
        return points

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


def _chdb_param(value: Any) -> str:
    """chdb binds parameters from their text form: render values the way ClickHouse parses them."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if isinstance(value, list | tuple):
        return (
            "[" + ",".join("'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'" for v in value) + "]"
        )
    return str(value)


def _rows(table: pa.Table) -> tuple[list[str], list[str], Rows]:
    columns = table.column_names
    pylists = [col.to_pylist() for col in table.columns]
    return columns, [str(t) for t in table.schema.types], list(zip(*pylists, strict=True))


class ChdbStore(_SqlStore):
    """The event log in embedded ClickHouse under ``path`` (one directory per process)."""

    def __init__(self, path: Path, database: str = DEFAULT_DATABASE) -> None:
        import chdb

        self.path = Path(path).resolve()
        self.database = check_identifier(database)
        claim_path(self.path)  # raises EventLogLockedError / EventLogError with one clear line
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._conn = chdb.connect(str(self.path))
            self._ro = chdb.connect(str(self.path))
            self._ro.query("SET readonly = 1")
        except Exception as exc:
            release_path(self.path)
            holder = chdb_holder(self.path)
            if holder is not None:
                raise holder from exc
            raise EventLogUnavailableError(f"cannot open chdb at {self.path}: {exc}") from exc
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._closed = False

    def _run(self, conn: Any, lock: threading.Lock, sql: str, params: dict[str, Any] | None) -> pa.Table:
        if self._closed:
            raise EventLogError(f"the event log at {self.path} is closed")
        bound = {k: _chdb_param(v) for k, v in params.items()} if params else None
        try:
            with lock:
                return conn.query(sql, "ArrowTable", params=bound)
        except Exception as exc:
            raise EventLogQueryError(str(exc).split("Stack trace")[0].strip()) from exc

    def _select(self, sql: str, params: dict[str, Any]) -> tuple[list[str], list[str], Rows]:
        return _rows(self._run(self._conn, self._read_lock, sql, params))

    def _select_readonly(self, sql: str, max_rows: int) -> tuple[list[str], list[str], Rows]:
        table = self._run(self._ro, self._read_lock, sql, None)
        return _rows(table.slice(0, max_rows))

    def _command(self, sql: str) -> None:
        self._run(self._conn, self._write_lock, sql, None)

    def _insert_table(self, table: pa.Table) -> None:
        if self._closed:
            raise EventLogError(f"the event log at {self.path} is closed")
        try:
            with self._write_lock:
                self._conn.query(f"INSERT INTO {self.database}.events SELECT * FROM Python(table)")
        except Exception as exc:
            raise EventLogQueryError(str(exc).split("Stack trace")[0].strip()) from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._write_lock, self._read_lock:
            self._ro.close()
            self._conn.close()
        release_path(self.path)


class ServerStore(_SqlStore):
    """The event log on a ClickHouse server: ``http://user:password@host:8123/database``."""

    def __init__(self, url: str) -> None:
        import clickhouse_connect

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EventLogError(
                f"FLYWHEEL_CLICKHOUSE_URL must look like http://user:pw@host:8123/db, got {parts.scheme}://…"
            )
        self.database = check_identifier(parts.path.strip("/") or DEFAULT_DATABASE)
        self.url_for_humans = f"{parts.scheme}://{parts.hostname}:{parts.port or 8123}/{self.database}"
        try:
            self._client = clickhouse_connect.get_client(
                host=parts.hostname,
                port=parts.port or (8443 if parts.scheme == "https" else 8123),
                username=unquote(parts.username or "default"),
                password=unquote(parts.password or ""),
                secure=parts.scheme == "https",
                connect_timeout=10,
                send_receive_timeout=300,
            )
        except Exception as exc:
            raise EventLogUnavailableError(
                f"cannot reach ClickHouse at {self.url_for_humans}: {exc}"
            ) from exc
        self._lock = threading.Lock()

    def _result(
        self, sql: str, params: dict[str, Any], settings: dict[str, Any]
    ) -> tuple[list[str], list[str], Rows]:
        try:
            with self._lock:
                result = self._client.query(sql, parameters=params or None, settings=settings or None)
        except Exception as exc:
            raise EventLogQueryError(" ".join(str(exc).split())[:2000]) from exc
        types = [t.name for t in result.column_types]
        return list(result.column_names), types, [tuple(r) for r in result.result_rows]

    def _select(self, sql: str, params: dict[str, Any]) -> tuple[list[str], list[str], Rows]:
        return self._result(sql, params, {})

    def _select_readonly(self, sql: str, max_rows: int) -> tuple[list[str], list[str], Rows]:
        # readonly=2 forbids writes but lets the client send its own per-query settings.
        return self._result(
            sql, {}, {"readonly": 2, "max_result_rows": max_rows, "result_overflow_mode": "break"}
        )

    def _command(self, sql: str) -> None:
        try:
            with self._lock:
                self._client.command(sql)
        except Exception as exc:
            raise EventLogQueryError(" ".join(str(exc).split())[:2000]) from exc

    def _insert_table(self, table: pa.Table) -> None:
        try:
            with self._lock:
                self._client.insert_arrow("events", table, database=self.database)
        except Exception as exc:
            raise EventLogQueryError(" ".join(str(exc).split())[:2000]) from exc

    def close(self) -> None:
        self._client.close()


def open_store(
    *,
    clickhouse_url: str = "",
    chdb_path: Path | None = None,
    database: str = DEFAULT_DATABASE,
    migrate: bool = True,
) -> ChdbStore | ServerStore:
    """The configured store: a server when ``clickhouse_url`` is set, else embedded chdb at ``chdb_path``."""
    store: ChdbStore | ServerStore
    if clickhouse_url:
        store = ServerStore(clickhouse_url)
    else:
        if chdb_path is None:
            raise EventLogError("no event log configured: set FLYWHEEL_CLICKHOUSE_URL or a chdb directory")
        store = ChdbStore(chdb_path, database)
    if migrate:
        try:
            store.migrate()
        except Exception:
            store.close()
            raise
    return store
