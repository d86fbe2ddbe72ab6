"""``EventStore``: where events land and how the rest of Flywheel reads them back.

Two implementations share every query (:class:`infra.eventlog.base.SqlStore`): :class:`ChdbStore`
(embedded ClickHouse, one data directory per process) and :class:`ServerStore` (a ClickHouse server
≥ 24.8 over HTTP through clickhouse-connect). :func:`open_store` picks one from ``FLYWHEEL_CLICKHOUSE_URL``.

Writes go through ``insert``/``insert_messages`` (one Arrow insert per batch). Reads return typed
models. ``query(sql)`` is the one free-form entry point and it only reads: a lexical check
(:mod:`infra.eventlog.readonly`) and then a connection on which ``readonly`` is set.
Errors: see :mod:`infra.eventlog.errors`.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from infra.eventlog.base import DEFAULT_DATABASE, EventStore, Rows, SqlStore
from infra.eventlog.ddl import check_identifier
from infra.eventlog.errors import EventLogError, EventLogQueryError, EventLogUnavailableError
from infra.eventlog.lock import chdb_holder, claim_path, release_path

__all__ = ["DEFAULT_DATABASE", "ChdbStore", "EventStore", "ServerStore", "open_store"]


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


class ChdbStore(SqlStore):
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
            # Bound what a free-form query may cost, then lock the connection to reads for good
            # (readonly=1 also forbids changing settings back, per query or per session).
            self._ro.query("SET max_execution_time = 120")
            self._ro.query("SET max_memory_usage = 4000000000")
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
        # Named columns: a later migration that adds a column does not shift positions.
        columns = ", ".join(table.column_names)
        if self._closed:
            raise EventLogError(f"the event log at {self.path} is closed")
        try:
            with self._write_lock:
                self._conn.query(
                    f"INSERT INTO {self.database}.events ({columns}) SELECT * FROM Python(table)"
                )
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


class ServerStore(SqlStore):
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
