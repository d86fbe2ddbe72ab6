"""``flywheel db migrate``, ``flywheel query "SELECT …"``, ``flywheel recorder`` (and ``episodes ls``).

Exit codes: 0 done; 1 the event log cannot be reached (locked, unreachable, missing); 2 bad input
(a query that writes or does not parse, a malformed filter). Errors print as one line.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TextIO, cast

import structlog
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from flywheel.alone import serve_recorder
from flywheel.cli.common import refuse_exposure, run_service
from infra.eventlog.client import open_reader
from infra.eventlog.ddl import MIGRATIONS
from infra.eventlog.errors import EventLogError, EventLogQueryError, ReadOnlyQueryError
from infra.eventlog.models import EpisodeFilter
from infra.eventlog.readonly import check_read_only
from infra.eventlog.settings import EventLogSettings
from infra.eventlog.store import open_store
from infra.eventlog.timeparse import parse_when
from infra.logging import configure_logging

if TYPE_CHECKING:
    from infra.eventlog.reader import EventLogReader

db_app = typer.Typer(help="The ClickHouse event log: schema migrations.", no_args_is_help=True)

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="FLYWHEEL_ADMIN_URL",
        help="admin API of the running Flywheel process that holds the chdb directory (http://host:port)",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def _fail(exc: BaseException, code: int) -> NoReturn:
    typer.echo(f"{type(exc).__name__}: {exc}", err=True)
    raise typer.Exit(code)


def _settings() -> EventLogSettings:

    try:
        settings = EventLogSettings()
    except ValidationError as exc:
        typer.echo(f"SettingsError: {exc.errors()[0]['msg']}", err=True)
        raise typer.Exit(2) from exc
    configure_logging(settings.log_level, settings.log_json)  # logs go to stderr; stdout stays data
    # Resolve sys.stderr at each write: loggers are cached on first use, and a replaced stderr (tests'
    # CliRunner, a redirected console) may be closed by the time they write.

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _CurrentStderr())))
    return settings


class _CurrentStderr:
    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _reader(url: str | None) -> EventLogReader:

    settings = _settings()
    try:
        return open_reader(
            admin_url=url or settings.admin_url or None,
            admin_token=settings.admin_token.get_secret_value(),
            clickhouse_url=settings.clickhouse_url,
            chdb_path=settings.chdb_path,
            database=settings.clickhouse_database,
        )
    except EventLogError as exc:
        _fail(exc, 1)


def _run_read(url: str | None, action: Any) -> Any:
    """Open a reader, run ``action(reader)``, map errors to exit codes, close."""
    reader = _reader(url)
    try:
        return action(reader)
    except (ReadOnlyQueryError, EventLogQueryError) as exc:
        _fail(exc, 2)
    except EventLogError as exc:
        _fail(exc, 1)
    finally:
        reader.close()


def _print_table(columns: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    table = Table(title=title, show_lines=False)
    for c in columns:
        table.add_column(c, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)


def query_command(
    sql: Annotated[
        str, typer.Argument(help="one read-only statement: SELECT, WITH, SHOW, DESCRIBE, EXPLAIN")
    ],
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    max_rows: Annotated[
        int, typer.Option("--max-rows", min=1, max=1_000_000, help="Return at most this many rows.")
    ] = 10_000,
) -> None:
    """Run a read-only SQL query on the event log (writes are refused, exit 2)."""
    try:
        check_read_only(sql)  # refuse before opening anything
    except ReadOnlyQueryError as exc:
        _fail(exc, 2)
    result = _run_read(url, lambda r: r.query(sql, max_rows=max_rows))
    if as_json:
        typer.echo(result.model_dump_json())
    else:
        _print_table(result.columns, result.rows)
        typer.echo(f"{len(result.rows)} row(s)", err=True)


def migrate_command(as_json: JsonOpt = False) -> None:
    """Apply missing event-log migrations (idempotent)."""
    settings = _settings()
    try:
        store = open_store(
            clickhouse_url=settings.clickhouse_url,
            chdb_path=settings.chdb_path,
            database=settings.clickhouse_database,
            migrate=False,
        )
        try:
            applied = store.migrate()
        finally:
            store.close()
    except EventLogError as exc:
        _fail(exc, 1)
    where = settings.clickhouse_url.split("@")[-1] if settings.clickhouse_url else str(settings.chdb_path)
    latest = MIGRATIONS[-1].version
    if as_json:
        typer.echo(json.dumps({"applied": applied, "version": latest, "where": where}))
    elif applied:
        typer.echo(
            f"applied migration(s) {', '.join(map(str, applied))} to {where}; schema at version {latest}"
        )
    else:
        typer.echo(f"{where}: schema up to date (version {latest})")


def recorder_command(
    port: Annotated[
        int | None, typer.Option("--port", help="admin API port (0: off); default FLYWHEEL_RECORDER_PORT")
    ] = None,
) -> None:
    """Run the recorder alone: every topic → the event log, with the event-log admin API."""
    settings = _settings()
    if port is not None:
        settings = settings.model_copy(update={"recorder_port": port})
    if settings.recorder_port:
        refuse_exposure(settings.recorder_host, settings.admin_token.get_secret_value())
    try:
        run_service(serve_recorder(settings))
    except EventLogError as exc:
        _fail(exc, 1)


def _parse_time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None

    try:
        return parse_when(value)
    except ValueError as exc:
        typer.echo(f"FilterError: {name}: {exc}", err=True)
        raise typer.Exit(2) from exc


def episodes_ls(
    since: Annotated[str | None, typer.Option(help="ISO time or relative: 30m, 6h, 2d")] = None,
    until: Annotated[str | None, typer.Option(help="ISO time or relative: 30m, 6h, 2d")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's episodes.")] = None,
    group: Annotated[str | None, typer.Option("--group", help="group_id")] = None,
    task: Annotated[str | None, typer.Option("--task", help="task_id")] = None,
    source: Annotated[str | None, typer.Option(help="live | production | replay")] = None,
    status: Annotated[str | None, typer.Option(help="ok | error | timeout | cancelled")] = None,
    min_reward: Annotated[float | None, typer.Option("--min-reward", help="Reward at least this.")] = None,
    max_reward: Annotated[float | None, typer.Option("--max-reward", help="Reward at most this.")] = None,
    weight_version: Annotated[
        int | None, typer.Option("--weight-version", help="served entirely by this version")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1_000_000, help="At most this many episodes.")] = 50,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
) -> None:
    """List episodes from the event log, newest first."""
    try:
        f = EpisodeFilter(
            since=_parse_time(since, "--since"),
            until=_parse_time(until, "--until"),
            tenant=tenant,
            group_id=group,
            task_id=task,
            source=source,
            status=status,
            min_reward=min_reward,
            max_reward=max_reward,
            min_weight_version=weight_version,
            max_weight_version=weight_version,
            limit=limit,
        )
    except ValidationError as exc:
        typer.echo(f"FilterError: {exc.errors()[0]['msg']}", err=True)
        raise typer.Exit(2) from exc
    episodes = _run_read(url, lambda r: r.episodes(f))
    if as_json:
        typer.echo(json.dumps([e.model_dump(mode="json") for e in episodes]))
        return
    columns = [
        "episode_id",
        "task",
        "group",
        "tenant",
        "source",
        "status",
        "started",
        "calls",
        "reward",
        "versions",
    ]
    rows = [
        [
            e.episode_id, e.task_id, e.group_id[:12], e.tenant, e.source, e.status,
            e.started_at.strftime("%Y-%m-%d %H:%M:%S"), e.num_calls,
            "" if e.reward is None else f"{e.reward:g}",
            "" if e.min_weight_version is None else f"{e.min_weight_version}-{e.max_weight_version}",
        ]
        for e in episodes
    ]  # fmt: skip
    _print_table(columns, rows)
    typer.echo(f"{len(episodes)} episode(s)", err=True)


def register(app: typer.Typer) -> None:
    db_app.command("migrate")(migrate_command)
    app.add_typer(db_app, name="db")
    app.command("query")(query_command)
    app.command("recorder")(recorder_command)
