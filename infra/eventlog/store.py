"""``EventStore``: where events land and how the rest of Flywheel reads them back.

Two implementations share every query (:class:`infra.eventlog.base.SqlStore`): :class:`ChdbStore`
(embedded ClickHouse, one data directory per process) and :class:`ServerStore` (a ClickHouse server
≥ 24.8 over HTTP through clickhouse-connect). :func:`open_store` picks one from ``FLYWHEEL_CLICKHOUSE_URL``.

Writes go through ``insert``/``insert_messages`` (one Arrow insert per batch). Reads return typed
models.

One chdb session discipline: every chdb call, reads and writes, runs on one dedicated thread
(:class:`ChdbSession`), one at a time, in arrival order, and each caller waits at most its deadline.
Why: two calls inside chdb at once deadlocked the whole process (reproduced: three readers and the
recorder's inserts froze it within seconds; ``faulthandler`` showed a read inside ``Connection.query``
holding the GIL while it waited for chdb's connection lock, and the insert that held that lock
waiting for the GIL to read its ``Python(table)`` Arrow table). With one call in chdb at a time
there is no second lock to wait for. A read is also bounded inside the engine
(``max_execution_time``), so one that its caller gave up on stops by itself and holds nothing. ``query(sql)`` is the one free-form entry point and it only reads: a lexical check
(:mod:`infra.eventlog.readonly`) and then a connection on which ``readonly`` is set.
Errors: see :mod:`infra.eventlog.errors`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from infra.eventlog.base import DEFAULT_DATABASE, EventStore, Rows, SqlStore
from infra.eventlog.ddl import check_identifier
from infra.eventlog.errors import (
    EventLogError,
    EventLogQueryError,
    EventLogTimeoutError,
    EventLogUnavailableError,
)
from infra.eventlog.lock import chdb_holder, claim_path, release_path

__all__ = ["DEFAULT_DATABASE", "ChdbSession", "ChdbStore", "EventStore", "ServerStore", "open_store"]

T = TypeVar("T")
# A read's budget, in the engine and for its caller: long enough for a full scan of a large log on a
# small machine, short enough that nobody waits on a stuck read for minutes.
READ_TIMEOUT_S = 30.0
# A write waits at most this long for its turn (behind reads, each bounded by READ_TIMEOUT_S) and its
# insert; past it the recorder's batch fails and the bus retries it (nothing is committed before).
WRITE_TIMEOUT_S = 120.0
# The embedded engine's memory, set when it starts (server settings, passed on the first connection).
# chdb's defaults are a server's: 5 GiB each for the mark, primary-index and index-mark caches, which
# fill as the log's parts are read and never shrink. An event log on one machine needs a few MiB of
# each; a read past them is slower, not wrong. The uncompressed cache stays off (its default), and
# merges run on two background threads (background_pool_size), so no more than two parts' merges hold
# memory at once. docs/memory.md gives the figures.
CHDB_LIMITS = {
    "mark_cache_size": 64 << 20,
    "primary_index_cache_size": 64 << 20,
    "index_mark_cache_size": 16 << 20,
    "vector_similarity_index_cache_size": 16 << 20,
    "uncompressed_cache_size": 0,
    "index_uncompressed_cache_size": 0,
    "compiled_expression_cache_size": 16 << 20,
    "query_condition_cache_size": 16 << 20,
    "background_pool_size": 2,
}


class ChdbSession:
    """One thread that runs every chdb call, in arrival order; callers wait with a deadline.

    A call whose caller gave up before it started is cancelled; one already running finishes (chdb
    calls cannot be interrupted from Python) and its result is dropped.
    """

    def __init__(self, name: str = "chdb") -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=name)

    def call(self, fn: Callable[[], T], timeout_s: float, what: str) -> T:
        future: Future[T] = self._thread.submit(fn)
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            future.cancel()
            raise EventLogTimeoutError(f"{what} did not finish within {timeout_s:g} s") from None

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)


_ESCAPES = str.maketrans({"\\": "\\\\", "'": "\\'", "\t": "\\t", "\n": "\\n"})


def _escaped(text: str) -> str:
    """``text`` with ClickHouse's escapes: a backslash, quote, tab or newline then parses as itself."""
    return text.translate(_ESCAPES)


def _chdb_param(value: Any) -> str:
    """chdb binds parameters from their text form: render values the way ClickHouse parses them.

    A scalar is read in the Escaped (TSV) format, so its backslashes, tabs and newlines are escaped
    (a raw ``\\`` was an escape sequence: ``a\\b`` bound as ``a<backspace>``, a lone ``\\`` refused);
    an array's strings are quoted literals, escaped the same way.
    """
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    if isinstance(value, list | tuple):
        return "[" + ",".join(f"'{_escaped(str(v))}'" for v in value) + "]"
    return _escaped(str(value))


def _rows(table: pa.Table) -> tuple[list[str], list[str], Rows]:
    columns = table.column_names
    pylists = [col.to_pylist() for col in table.columns]
    return columns, [str(t) for t in table.schema.types], list(zip(*pylists, strict=True))


class ChdbStore(SqlStore):
    """The event log in embedded ClickHouse under ``path`` (one directory per process).

    Every chdb call goes through one :class:`ChdbSession` (see the module docstring for why).
    """

    def __init__(
        self,
        path: Path,
        database: str = DEFAULT_DATABASE,
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
    ) -> None:
        self.path = Path(path).resolve()
        self.database = check_identifier(database)
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        claim_path(self.path)  # raises EventLogLockedError / EventLogError with one clear line
        self._session = ChdbSession()
        try:
            self._conn, self._ro = self._session.call(self._open, WRITE_TIMEOUT_S, "opening chdb")
        except Exception as exc:
            self._session.close()
            release_path(self.path)
            holder = chdb_holder(self.path)
            if holder is not None:
                raise holder from exc
            raise EventLogUnavailableError(f"cannot open chdb at {self.path}: {exc}") from exc
        self._closed = False

    def _open(self) -> tuple[Any, Any]:
        import chdb

        self.path.mkdir(parents=True, exist_ok=True)
        limits = "&".join(f"{k}={v}" for k, v in CHDB_LIMITS.items())
        conn = chdb.connect(f"{self.path}?{limits}")  # the first connection starts the engine
        ro = chdb.connect(str(self.path))
        # Bound what a free-form query may cost, then lock the connection to reads for good
        # (readonly=1 also forbids changing settings back, per query or per session).
        ro.query(f"SET max_execution_time = {max(1, int(self.read_timeout_s))}")
        ro.query("SET max_memory_usage = 4000000000")
        ro.query("SET readonly = 1")
        return conn, ro

    def _run(self, conn: Any, sql: str, params: dict[str, Any] | None, *, write: bool) -> pa.Table:
        if self._closed:
            raise EventLogError(f"the event log at {self.path} is closed")
        bound = {k: _chdb_param(v) for k, v in params.items()} if params else None

        def run() -> pa.Table:
            try:
                return conn.query(sql, "ArrowTable", params=bound)
            except Exception as exc:
                raise EventLogQueryError(str(exc).split("Stack trace")[0].strip()) from exc

        timeout = self.write_timeout_s if write else self.read_timeout_s
        return self._session.call(run, timeout, "the event-log write" if write else "the event-log read")

    def _select(self, sql: str, params: dict[str, Any]) -> tuple[list[str], list[str], Rows]:
        # The engine stops a read at its deadline too, so a read its caller gave up on frees the session.
        sql = f"{sql.rstrip()} SETTINGS max_execution_time = {max(1, int(self.read_timeout_s))}"
        return _rows(self._run(self._conn, sql, params, write=False))

    def _select_readonly(self, sql: str, max_rows: int) -> tuple[list[str], list[str], Rows]:
        table = self._run(self._ro, sql, None, write=False)
        return _rows(table.slice(0, max_rows))

    def _command(self, sql: str) -> None:
        self._run(self._conn, sql, None, write=True)

    def _insert_table(self, table: pa.Table) -> None:
        # Named columns: a later migration that adds a column does not shift positions.
        columns = ", ".join(table.column_names)
        sql = f"INSERT INTO {self.database}.events ({columns}) SELECT * FROM Python(table)"
        if self._closed:
            raise EventLogError(f"the event log at {self.path} is closed")

        def run() -> None:
            # chdb's Python() table function finds ``table`` among this frame's locals.
            local = table  # noqa: F841
            try:
                self._conn.query(sql.replace("Python(table)", "Python(local)"))
            except Exception as exc:
                raise EventLogQueryError(str(exc).split("Stack trace")[0].strip()) from exc

        self._session.call(run, self.write_timeout_s, "the event-log insert")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def shut() -> None:
            self._ro.close()
            self._conn.close()

        try:
            self._session.call(shut, self.write_timeout_s, "closing chdb")
        finally:
            self._session.close()
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
